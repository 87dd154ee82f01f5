/* troupe launch: runs a program on the ranks a DeepSpeed hostfile describes, through mpirun.
 *
 * The hostfile is DeepSpeed's: one `hostname slots=N` per line, `#` comments, blank lines.
 * --include / --exclude take DeepSpeed's syntax (`worker-0@worker-1:0,2`: hosts separated by
 * `@`, each with an optional list of its slots), --num_nodes keeps the first N hosts and
 * --num_gpus (DeepSpeed's name; here: ranks per host) the first N slots of each. Without a
 * hostfile (none given and no /job/hostfile) the job is local: one host, `localhost`, with
 * --num_gpus slots (default: the online cores). The ranks then run under
 * `mpirun -np <total> --host h1:n1,h2:n2 ...`, with --oversubscribe when asked and
 * --allow-run-as-root only when running as root; `troupe launch ... train ...` runs this same
 * troupe's `train` on every rank. --dry-run prints the mpirun command instead of running it.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"

#define MAX_HOSTS 256
#define MAX_SLOTS 1024

typedef struct host {
    char name[128];
    int slots;
    bool keep[MAX_SLOTS]; /* which slots take part */
} host_t;

typedef struct launch {
    const char *hostfile, *include, *exclude;
    int num_nodes, num_gpus, oversubscribe, dry_run;
    host_t hosts[MAX_HOSTS];
    int n_hosts;
} launch_t;

static const char usage[] =
    "usage: troupe launch [--hostfile FILE] [--include SPEC | --exclude SPEC]\n"
    "                     [--num_nodes N] [--num_gpus N] [--oversubscribe] [--dry-run]\n"
    "                     [--] (COMMAND [ARGS] | PROGRAM [ARGS])\n"
    "\n"
    "Runs one rank per slot of a DeepSpeed hostfile (`worker-1 slots=4`) under mpirun.\n"
    "  --hostfile FILE   the hosts (default /job/hostfile; without one, this host only)\n"
    "  --include SPEC    only these hosts/slots: host[:slot,slot][@host...]\n"
    "  --exclude SPEC    all but these hosts/slots (same syntax; not with --include)\n"
    "  --num_nodes N     the first N hosts\n"
    "  --num_gpus N      the first N slots of each host (ranks per host; locally: the cores)\n"
    "  --oversubscribe   allow more ranks than a host has cores\n"
    "  --dry-run         print the mpirun command, run nothing\n"
    "COMMAND is a troupe command (train, config, ...), run by this troupe on every rank.\n"
    "Exit status: the job's; 2 for a bad flag or hostfile.\n";

static int bad(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "troupe launch: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return 2;
}

/* --- the hostfile ---------------------------------------------------------------------- */

static host_t *find(launch_t *l, const char *name)
{
    for (int i = 0; i < l->n_hosts; i++)
        if (!strcmp(l->hosts[i].name, name)) return &l->hosts[i];
    return NULL;
}

static int add_host(launch_t *l, const char *name, int slots, const char *where)
{
    if (find(l, name)) return bad("%s: host '%s' is listed twice", where, name);
    if (l->n_hosts == MAX_HOSTS || strlen(name) >= sizeof(l->hosts[0].name) || slots < 1 ||
        slots > MAX_SLOTS)
        return bad("%s: host '%s': too many hosts, a name too long, or slots outside 1..1024",
                   where, name);
    host_t *h = &l->hosts[l->n_hosts++];
    snprintf(h->name, sizeof(h->name), "%s", name);
    h->slots = slots;
    for (int s = 0; s < slots; s++)
        h->keep[s] = true;
    return 0;
}

/* One `hostname slots=N` line (comments and blank lines are skipped by the caller). */
static int parse_line(launch_t *l, char *line, const char *path, int lineno)
{
    char name[256], where[600];
    int slots = 0, used = 0;
    snprintf(where, sizeof(where), "%s:%d", path, lineno);
    if (sscanf(line, " %255s slots=%d %n", name, &slots, &used) != 2 || line[used] != '\0')
        return bad("%s: expected `hostname slots=N`, got \"%s\"", where, line);
    return add_host(l, name, slots, where);
}

static int read_hostfile(launch_t *l, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return bad("--hostfile %s: %s", path, strerror(errno));
    char line[1024];
    int rc = 0, lineno = 0;
    while (rc == 0 && fgets(line, sizeof(line), f)) {
        lineno++;
        line[strcspn(line, "#\r\n")] = '\0';
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p) rc = parse_line(l, p, path, lineno);
    }
    fclose(f);
    if (rc == 0 && l->n_hosts == 0) rc = bad("--hostfile %s: no hosts in it%s", path, "");
    return rc;
}

/* --- --include / --exclude -------------------------------------------------------------- */

/* Applies one SPEC: with include, everything not named is dropped first. */
static int apply_filter(launch_t *l, const char *spec, bool include)
{
    const char *flag = include ? "--include" : "--exclude";
    if (include)
        for (int i = 0; i < l->n_hosts; i++)
            memset(l->hosts[i].keep, 0, sizeof(l->hosts[i].keep));
    char buf[2048];
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *save = NULL, *item = strtok_r(buf, "@", &save); item;
         item = strtok_r(NULL, "@", &save)) {
        char *slots = strchr(item, ':');
        if (slots) *slots++ = '\0';
        host_t *h = find(l, item);
        if (!h) return bad("%s: host '%s' is not in the hostfile", flag, item);
        if (!slots) {
            for (int s = 0; s < h->slots; s++)
                h->keep[s] = include;
            continue;
        }
        for (char *s2 = NULL, *t = strtok_r(slots, ",", &s2); t; t = strtok_r(NULL, ",", &s2)) {
            char *end;
            long s = strtol(t, &end, 10);
            if (*end || s < 0 || s >= h->slots)
                return bad("%s: slot '%s' is not one of the host's", flag, t);
            h->keep[s] = include;
        }
    }
    return 0;
}

/* --num_nodes and --num_gpus; drops hosts left without a slot. Returns the ranks. */
static int select_slots(launch_t *l)
{
    int total = 0, kept_hosts = 0;
    for (int i = 0; i < l->n_hosts; i++) {
        host_t *h = &l->hosts[i];
        int n = 0;
        for (int s = 0; s < h->slots; s++) {
            if (h->keep[s] && l->num_gpus > 0 && n >= l->num_gpus) h->keep[s] = false;
            n += h->keep[s];
        }
        if (n && l->num_nodes > 0 && kept_hosts >= l->num_nodes) n = 0;
        h->slots = n; /* from here: ranks on this host */
        kept_hosts += n > 0;
        total += n;
    }
    return total;
}

/* --- running ----------------------------------------------------------------------------- */

static int is_troupe_command(const char *s)
{
    static const char *const names[] = {"train", "config", "trace", "version", "help"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(s, names[i])) return 1;
    return 0;
}

static int run(launch_t *l, int total, int argc, char **argv)
{
    static char hosts[8192], np[16], self[4096];
    size_t used = 0;
    for (int i = 0; i < l->n_hosts; i++)
        if (l->hosts[i].slots && used < sizeof(hosts))
            used += (size_t)snprintf(hosts + used, sizeof(hosts) - used, "%s%s:%d", used ? "," : "",
                                     l->hosts[i].name, l->hosts[i].slots);
    snprintf(np, sizeof(np), "%d", total);
    char **av = calloc((size_t)argc + 12, sizeof(char *));
    if (!av) return 1;
    int n = 0;
    av[n++] = "mpirun";
    av[n++] = "-np";
    av[n++] = np;
    av[n++] = "--host";
    av[n++] = hosts;
    if (l->oversubscribe) av[n++] = "--oversubscribe";
    if (geteuid() == 0) av[n++] = "--allow-run-as-root";
    if (is_troupe_command(argv[0])) {
        ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
        self[len > 0 ? len : 0] = '\0';
        av[n++] = len > 0 ? self : "troupe";
    }
    for (int i = 0; i < argc; i++)
        av[n++] = argv[i];
    if (l->dry_run) {
        for (int i = 0; i < n; i++)
            printf("%s%s", i ? " " : "", av[i]);
        printf("\n");
        free(av);
        return 0;
    }
    fflush(NULL);
    execvp("mpirun", av);
    fprintf(stderr, "troupe launch: cannot run mpirun: %s (Debian: openmpi-bin)\n",
            strerror(errno));
    free(av);
    return 1;
}

/* Reads flags up to the program; *first gets the index of the program's first argument. */
static int parse_flags(launch_t *l, int argc, char **argv, int *first)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 1;
        }
        if (!strcmp(a, "--oversubscribe"))
            l->oversubscribe = 1;
        else if (!strcmp(a, "--dry-run"))
            l->dry_run = 1;
        else if (i + 1 >= argc)
            return bad("%s needs a value%s", a, "");
        else if (!strcmp(a, "--hostfile"))
            l->hostfile = argv[++i];
        else if (!strcmp(a, "--include"))
            l->include = argv[++i];
        else if (!strcmp(a, "--exclude"))
            l->exclude = argv[++i];
        else if (!strcmp(a, "--num_nodes") || !strcmp(a, "--num_gpus")) {
            char *end;
            long v = strtol(argv[i + 1], &end, 10);
            if (*end || v < 1 || v > 1 << 20)
                return bad("%s: expected a positive integer, got '%s'", a, argv[i + 1]);
            *(a[6] == 'n' ? &l->num_nodes : &l->num_gpus) = (int)v;
            i++;
        } else
            return bad("unknown flag '%s' (see troupe launch --help)%s", a, "");
    }
    if (i >= argc) return bad("no program to run (see troupe launch --help)%s%s", "", "");
    if (l->include && l->exclude)
        return bad("--include and --exclude cannot be combined%s%s", "", "");
    *first = i;
    return 0;
}

int tr_cmd_launch(int argc, char **argv)
{
    static launch_t l;
    memset(&l, 0, sizeof(l));
    int first = 0, rc = parse_flags(&l, argc, argv, &first);
    if (rc) return rc == 1 ? 0 : rc;
    if (!l.hostfile && access("/job/hostfile", R_OK) == 0) l.hostfile = "/job/hostfile";
    if (l.hostfile) {
        rc = read_hostfile(&l, l.hostfile);
    } else {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        rc = add_host(&l, "localhost", l.num_gpus ? l.num_gpus : (int)(cores > 0 ? cores : 1),
                      "this host");
    }
    if (!rc && l.include) rc = apply_filter(&l, l.include, true);
    if (!rc && l.exclude) rc = apply_filter(&l, l.exclude, false);
    if (rc) return rc;
    int total = select_slots(&l);
    if (total == 0) return bad("no slot is left to run on (check --include/--exclude)%s%s", "", "");
    return run(&l, total, argc - first, argv + first);
}
