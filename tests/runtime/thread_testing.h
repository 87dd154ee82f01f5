/* Helpers for the tests that look at the runtime's threads from outside (test_slice,
 * test_spread): finding one by its name. Include after <cmocka.h>. */
#ifndef TR_TESTS_THREAD_TESTING_H
#define TR_TESTS_THREAD_TESTING_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* The tid of the process's thread named name (threads.c names them); there must be exactly
 * one. */
static inline pid_t tid_named(const char *name)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    pid_t tid = 0;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[300], comm[32] = "";
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(comm, sizeof(comm), f)) comm[strcspn(comm, "\n")] = '\0';
        fclose(f);
        if (!strcmp(comm, name)) tid = (pid_t)atoi(e->d_name), found++;
    }
    closedir(d);
    assert_int_equal(found, 1);
    return tid;
}

#endif
