/* train_outputs.c: the paths `troupe train` writes, checked before anything is built, and the
 * housekeeping of its save dir.
 *
 * Checked at start-up, so that a run is never lost to a path found unusable after training:
 * --save-dir and --trace (made now with their parents, then a probe file created, written and
 * removed in them: /proc/x or a read-only folder is refused, naming errno's text), --export-llmc
 * (not a directory; its folder exists and is writable). A --save-dir that already holds checkpoints
 * (a `latest`, or global_stepN tags) is refused unless the run continues from them (--resume) or
 * replaces them (--overwrite).
 *
 * After each save: with --overwrite, the tags the earlier run left are removed at this run's
 * first save (so a run that fails before saving loses nothing); with --keep-last N only the N
 * newest global_stepN tags stay, and never the one `latest` names. A tag is removed file by
 * file, only the names a checkpoint holds (model_states.trck, optim_states_rank<R>.trck and
 * their *.tmp.<pid> files); a tag holding anything else is kept, with a warning.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train.h"

/* --- checks before the run ---------------------------------------------------------------- */

/* The nearest existing ancestor of dir (dir itself if it exists) into p: 0, or -1 after naming
 * the flag, the path and why (not a directory, or stat's errno). */
static int existing_ancestor(const char *flag, const char *dir, char *p, size_t cap)
{
    if (snprintf(p, cap, "%s", dir) >= (int)cap) {
        fprintf(stderr, "troupe train: %s %s: path longer than %zu bytes\n", flag, dir, cap - 1);
        return -1;
    }
    for (;;) {
        struct stat st;
        if (stat(p, &st) == 0) {
            if (S_ISDIR(st.st_mode)) return 0;
            fprintf(stderr, "troupe train: %s %s: %s is not a directory\n", flag, dir, p);
            return -1;
        }
        if (errno != ENOENT && errno != ENOTDIR) {
            fprintf(stderr, "troupe train: %s %s: %s: %s\n", flag, dir, p, strerror(errno));
            return -1;
        }
        char *slash = strrchr(p, '/');
        while (slash && slash > p && slash[-1] == '/') /* "a//b" */
            slash--;
        if (!slash)
            snprintf(p, cap, ".");
        else if (slash == p)
            p[1] = '\0'; /* "/" */
        else
            *slash = '\0';
    }
}

/* Makes dir with its parents (mkdir -p): 0, or errno. */
static int make_dirs(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof(p), "%s", dir);
    for (char *c = p + 1;; c++) {
        if (*c != '/' && *c) continue;
        char was = *c;
        *c = '\0';
        if (mkdir(p, 0777) < 0 && errno != EEXIST) return errno;
        if (!was) return 0;
        *c = was;
    }
}

/* Creates, writes and removes a probe file in dir: 0, or errno. */
static int probe(const char *dir, char *file, size_t cap)
{
    char host[64] = "";
    gethostname(host, sizeof(host) - 1);
    snprintf(file, cap, "%s/.troupe-probe.%s.%ld", dir, host, (long)getpid());
    int fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return errno;
    int err = write(fd, "t", 1) == 1 ? 0 : errno ? errno : EIO;
    if (close(fd) < 0 && !err) err = errno;
    unlink(file);
    return err;
}

/* Undoes make_dirs: removes dir and its parents up to (not including) the ancestor that
 * existed before (only empty folders: rmdir). */
static void unmake_dirs(const char *dir, const char *existed)
{
    char p[4096];
    snprintf(p, sizeof(p), "%s", dir);
    while (strcmp(p, existed) && rmdir(p) == 0) {
        char *slash = strrchr(p, '/');
        if (!slash || slash == p) return;
        *slash = '\0';
    }
}

/* dir must be a directory this process can create and write files in: it is made now with its
 * missing parents (mkdir -p) and a probe file is created, written and removed in it, so a
 * path that only looks usable (/proc/x, a read-only mount or folder) is refused before the
 * model is built. When the probe fails, the folders made for it are removed again. 0, or -1
 * after naming the flag, the path and errno's text. */
static int dir_usable(const char *flag, const char *dir)
{
    char existed[4096], file[4400];
    if (existing_ancestor(flag, dir, existed, sizeof(existed)) < 0) return -1;
    int err = make_dirs(dir);
    if (err) {
        fprintf(stderr, "troupe train: %s %s: cannot create %s: %s\n", flag, dir, dir,
                strerror(err));
        unmake_dirs(dir, existed);
        return -1;
    }
    if ((err = probe(dir, file, sizeof(file)))) {
        fprintf(stderr, "troupe train: %s %s: cannot write in %s (a probe file %s): %s\n", flag,
                dir, dir, file, strerror(err));
        unmake_dirs(dir, existed);
        return -1;
    }
    return 0;
}

/* The export is written to FILE.tmp in FILE's folder and renamed: the folder must exist. */
static int file_usable(const char *flag, const char *file)
{
    struct stat st;
    if (stat(file, &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "troupe train: %s %s: is a directory; expected a file name\n", flag, file);
        return -1;
    }
    char folder[4096];
    snprintf(folder, sizeof(folder), "%s", file);
    char *slash = strrchr(folder, '/');
    if (!slash)
        snprintf(folder, sizeof(folder), ".");
    else
        slash == folder ? (void)(folder[1] = '\0') : (void)(*slash = '\0');
    const char *why = stat(folder, &st) < 0         ? strerror(errno)
                      : !S_ISDIR(st.st_mode)        ? "not a directory"
                      : access(folder, W_OK | X_OK) ? "not writable"
                                                    : NULL;
    if (why) fprintf(stderr, "troupe train: %s %s: its folder %s: %s\n", flag, file, folder, why);
    return why ? -1 : 0;
}

/* "global_step<digits>": its step in *step. */
static int is_step_tag(const char *name, unsigned long long *step)
{
    const char *d = name + strlen("global_step");
    if (strncmp(name, "global_step", strlen("global_step")) || !*d) return 0;
    for (const char *c = d; *c; c++)
        if (*c < '0' || *c > '9') return 0;
    *step = strtoull(d, NULL, 10);
    return 1;
}

static int tag_dir_exists(const char *dir, const char *tag)
{
    char p[4400];
    struct stat st;
    snprintf(p, sizeof(p), "%s/%s", dir, tag);
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The global_stepN tags of dir (a list to free with free_tags), or NULL with *n = 0. */
static char **list_tags(const char *dir, size_t *n)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    char **tags = NULL;
    size_t cap = 0;
    unsigned long long step;
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_step_tag(e->d_name, &step) || !tag_dir_exists(dir, e->d_name)) continue;
        if (*n == cap) {
            char **grown = realloc(tags, (cap = cap ? 2 * cap : 16) * sizeof(char *));
            if (!grown) break;
            tags = grown;
        }
        if (!(tags[*n] = strdup(e->d_name))) break;
        (*n)++;
    }
    closedir(d);
    return tags;
}

static void free_tags(char **tags, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(tags[i]);
    free(tags);
}

/* The tag <dir>/latest names, into tag (cap bytes); "" when there is none. */
static void read_latest(const char *dir, char *tag, size_t cap)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/latest", dir);
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(tag, 1, cap - 1, f) : 0;
    if (f) fclose(f);
    while (n && (tag[n - 1] == '\n' || tag[n - 1] == ' '))
        n--;
    tag[n] = '\0';
}

/* A save dir holding checkpoints is refused unless --resume or --overwrite says what to do
 * with them; with --overwrite their tags are remembered, to be removed at the first save. */
static int save_dir_state(const train_opts_t *o, train_savedir_t *sd)
{
    char latest[256], p[4200];
    struct stat st;
    snprintf(p, sizeof(p), "%s/latest", o->save_dir);
    int has_latest = stat(p, &st) == 0;
    read_latest(o->save_dir, latest, sizeof(latest));
    size_t n;
    char **tags = list_tags(o->save_dir, &n);
    if (o->resume || (!has_latest && n == 0)) {
        free_tags(tags, n);
        return 0;
    }
    if (!o->overwrite) {
        fprintf(stderr,
                "troupe train: --save-dir %s already holds checkpoints (%s%s%s%zu "
                "global_step tag%s); a new run would overwrite them: add --resume to continue "
                "from them, or --overwrite to replace them\n",
                o->save_dir, has_latest ? "latest names '" : "", has_latest ? latest : "",
                has_latest ? "', " : "", n, n == 1 ? "" : "s");
        free_tags(tags, n);
        return -1;
    }
    sd->old_tags = tags;
    sd->n_old = n;
    printf("overwrite: %s holds %zu tag(s) of an earlier run; they are removed at this run's "
           "first save\n",
           o->save_dir, n);
    return 0;
}

int train_outputs_check(const train_opts_t *o, train_savedir_t *sd)
{
    memset(sd, 0, sizeof(*sd));
    if (o->save_dir && (dir_usable("--save-dir", o->save_dir) < 0 || save_dir_state(o, sd) < 0))
        return -1;
    if (o->trace_dir && dir_usable("--trace", o->trace_dir) < 0) return -1;
    if (o->export_llmc && file_usable("--export-llmc", o->export_llmc) < 0) return -1;
    return 0;
}

/* --- after a save ------------------------------------------------------------------------- */

/* A name a checkpoint tag holds: model_states.trck, optim_states_rank<R>.trck, or one of
 * those with a .tmp.<pid> suffix (a write cut short). */
static int is_checkpoint_file(const char *name)
{
    const char *rest = NULL;
    if (!strncmp(name, "model_states.trck", 17))
        rest = name + 17;
    else if (!strncmp(name, "optim_states_rank", 17)) {
        rest = name + 17;
        if (*rest < '0' || *rest > '9') return 0;
        while (*rest >= '0' && *rest <= '9')
            rest++;
        if (strncmp(rest, ".trck", 5)) return 0;
        rest += 5;
    }
    if (!rest) return 0;
    if (!*rest) return 1;
    if (strncmp(rest, ".tmp.", 5) || !rest[5]) return 0;
    for (rest += 5; *rest; rest++)
        if (*rest < '0' || *rest > '9') return 0;
    return 1;
}

/* Removes <dir>/<tag>: its checkpoint files, then the folder. A tag holding other files is
 * kept, with a warning naming one of them. */
static void remove_tag(const char *dir, const char *tag)
{
    char p[4400], f[4700];
    snprintf(p, sizeof(p), "%s/%s", dir, tag);
    DIR *d = opendir(p);
    if (!d) return;
    int kept = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(f, sizeof(f), "%s/%s", p, e->d_name);
        if (is_checkpoint_file(e->d_name) && unlink(f) == 0) continue;
        if (!kept++)
            fprintf(stderr,
                    "troupe train: warning: kept %s: it holds %s, not a checkpoint file "
                    "of troupe's\n",
                    p, e->d_name);
    }
    closedir(d);
    if (!kept && rmdir(p) < 0)
        fprintf(stderr, "troupe train: warning: cannot remove %s: %s\n", p, strerror(errno));
}

static int by_step_desc(const void *a, const void *b)
{
    unsigned long long x = 0, y = 0;
    is_step_tag(*(char *const *)a, &x);
    is_step_tag(*(char *const *)b, &y);
    return x < y ? 1 : x > y ? -1 : 0;
}

/* --keep-last N: the N newest global_stepN tags stay, and the one latest names. */
static void keep_last(const char *dir, long keep)
{
    char latest[256];
    read_latest(dir, latest, sizeof(latest));
    size_t n;
    char **tags = list_tags(dir, &n);
    if (n > 1) qsort(tags, n, sizeof(char *), by_step_desc);
    for (size_t i = (size_t)keep; i < n; i++)
        if (strcmp(tags[i], latest)) {
            remove_tag(dir, tags[i]);
            printf("keep-last %ld: removed %s/%s\n", keep, dir, tags[i]);
        }
    free_tags(tags, n);
}

void train_savedir_saved(const train_opts_t *o, train_savedir_t *sd, const char *saved_tag)
{
    size_t removed = 0;
    for (size_t i = 0; i < sd->n_old; i++)
        if (strcmp(sd->old_tags[i], saved_tag)) {
            remove_tag(o->save_dir, sd->old_tags[i]);
            removed++;
        }
    if (sd->n_old)
        printf("overwrite: removed the earlier run's %zu other tag(s) from %s\n", removed,
               o->save_dir);
    free_tags(sd->old_tags, sd->n_old);
    sd->old_tags = NULL;
    sd->n_old = 0;
    if (o->keep_last) keep_last(o->save_dir, o->keep_last);
}

void train_savedir_close(train_savedir_t *sd)
{
    free_tags(sd->old_tags, sd->n_old);
    memset(sd, 0, sizeof(*sd));
}
