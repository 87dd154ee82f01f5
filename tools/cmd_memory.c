/* cmd_memory.c: `troupe memory --deepspeed_config FILE [train's model flags] [--world-size N]
 * [--budget SIZE]`: the memory per rank that `troupe train` with the same flags would take, by
 * kind, predicted from the config and the model's dimensions before anything is allocated
 * (tr_engine_memory_predict, the estimator tr_engine_create checks against the machine), then
 * the total for every ZeRO stage and optimizer offload, and which fit the budget. DeepSpeed's
 * estimate_zero2/zero3_model_states_mem_needs, for every stage and for what Troupe does.
 *
 * The model flags are `troupe train`'s (train_args.c): a train command line can be checked as
 * it is (the run's own flags, --steps, --train-data ..., are accepted and ignored). A GPT-2's
 * shapes come from its dimensions (or an llm.c file's header, --load-llmc), never from a built
 * model, so a model larger than this machine can be predicted on it.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "commands.h"
#include "train.h"

static const char usage[] =
    "usage: troupe memory --deepspeed_config FILE [--model gpt2|mlp] [model flags]\n"
    "                     [--world-size N] [--budget SIZE]\n"
    "\n"
    "Predicts the memory per rank that `troupe train` with the same config and flags would\n"
    "take, before anything is allocated: parameters, gradients, optimizer states (or with\n"
    "offload nvme the swap buffers), communication buffers, batches, bf16 copies and\n"
    "activations, as the engine allocates them (docs/engine.md, Memory per rank). Then the\n"
    "total for every ZeRO stage (0-3) and offload_optimizer device (none, cpu, nvme), at\n"
    "stage 3 also with offload_param (+p:cpu, nvme+p:nvme, the config's own pair), and which\n"
    "fit the budget. The figures are rank 0's (the largest ZeRO partition). What this build\n"
    "does differently from the config (offload_param on one rank, a pipeline's stages, what\n"
    "stage 3 refuses) is said below the figures.\n"
    "\n"
    "  --world-size N   the ranks the config is resolved for (default 1)\n"
    "  --budget SIZE    memory per rank, e.g. 4GiB, 512MiB, 24GB (units B, KiB, MiB, GiB,\n"
    "                   TiB, KB, MB, GB, TB); default: this machine's available memory\n"
    "                   (MemAvailable, or the cgroup's limit) shared by the N ranks\n"
    "\n"
    "Model flags, as `troupe train` takes them (its other flags are accepted and ignored):\n"
    "--model, --vocab, --context, --channels, --layers, --heads, --widths, --load-llmc (the\n"
    "dimensions from the file's header), --seq-len. The micro-batch is the config's\n"
    "train_micro_batch_size_per_gpu.\n"
    "Exit status: 0 the config fits the budget, 1 it does not, 2 a bad flag or config.\n";

typedef struct mem_opts {
    int world;
    const char *budget_text; /* NULL: the machine's */
    uint64_t budget;
    int help;
} mem_opts_t;

/* --- flags ------------------------------------------------------------------------------ */

/* "512MiB", "4 GiB", "1.5GB", "1000": a positive size in bytes. One line on stderr says what
 * is wrong. */
static int parse_size(const char *v, uint64_t *out)
{
    static const struct {
        const char *unit;
        double bytes;
    } units[] = {{"", 1},          {"B", 1},
                 {"KiB", 1024.0},  {"MiB", 1048576.0},
                 {"GiB", 1 << 30}, {"TiB", 1099511627776.0},
                 {"KB", 1e3},      {"MB", 1e6},
                 {"GB", 1e9},      {"TB", 1e12}};
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    while (*end == ' ')
        end++;
    for (size_t i = 0; end != v && !errno && isfinite(x) && i < sizeof(units) / sizeof(units[0]);
         i++) {
        if (strcasecmp(end, units[i].unit)) continue;
        double bytes = x * units[i].bytes;
        if (bytes >= 1 && bytes < 1.8e19) {
            *out = (uint64_t)bytes;
            return 0;
        }
        break;
    }
    fprintf(stderr,
            "troupe memory: --budget '%s': expected a positive size such as 512MiB, 4GiB or "
            "24GB (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)\n",
            v);
    return -1;
}

/* The value of an own flag at argv[i] ("--flag V" or "--flag=V"), or NULL after saying why. */
static const char *flag_value(int argc, char **argv, int *i, const char *name)
{
    const char *a = argv[*i], *eq = strchr(a, '=');
    if (eq) return eq + 1;
    if (*i + 1 >= argc) {
        fprintf(stderr, "troupe memory: %s: expected a value after it\n", name);
        return NULL;
    }
    return argv[++*i];
}

static int is_flag(const char *a, const char *name)
{
    size_t n = strlen(name);
    return !strncmp(a, name, n) && (a[n] == '\0' || a[n] == '=');
}

/* Takes this command's own flags out of argv (the rest, argv[0] first, go to train's parser
 * in rest/n_rest). */
static int parse_own(int argc, char **argv, mem_opts_t *m, char **rest, int *n_rest)
{
    *m = (mem_opts_t){.world = 1};
    *n_rest = 0;
    rest[(*n_rest)++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            m->help = 1;
        } else if (is_flag(a, "--world-size")) {
            if (!(v = flag_value(argc, argv, &i, "--world-size"))) return -1;
            char *end;
            errno = 0;
            long w = strtol(v, &end, 10);
            if (errno || end == v || *end || w < 1 || w > 1 << 20) {
                fprintf(stderr,
                        "troupe memory: --world-size: expected an integer from 1 to %d, got "
                        "'%s'\n",
                        1 << 20, v);
                return -1;
            }
            m->world = (int)w;
        } else if (is_flag(a, "--budget")) {
            if (!(v = flag_value(argc, argv, &i, "--budget")) || parse_size(v, &m->budget) < 0)
                return -1;
            m->budget_text = v;
        } else {
            rest[(*n_rest)++] = argv[i];
        }
    }
    return 0;
}

/* --- the model and the config ----------------------------------------------------------- */

/* The config for the world size; its errors (and warnings) on stderr. */
static tr_config_t *load_config(const char *path, int world)
{
    tr_config_t *cfg = NULL;
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    int rc = tr_config_load(path, world, &cfg, &d);
    for (size_t i = 0; i < d.count; i++)
        fprintf(stderr, "%s\n", d.items[i].text);
    if (rc < 0 && !d.count) fprintf(stderr, "troupe memory: %s: %s\n", path, tr_strerror(rc));
    tr_config_diag_close(&d);
    return rc < 0 ? NULL : cfg;
}

/* The shapes `troupe train` would build for the flags, at the config's micro-batch. */
static int describe_model(const train_opts_t *o, int B, tr_memory_model_t *m, int *T)
{
    char why[512] = "";
    int rc;
    if (strcmp(o->model, "gpt2")) {
        *T = 1;
        rc = tr_memory_model_mlp(m, o->widths, o->n_widths, B, 1, why, sizeof(why));
        if (rc < 0) fprintf(stderr, "troupe memory: --widths: %s\n", why);
        return rc;
    }
    tr_gpt2_config_t g;
    train_gpt2_config(o, &g);
    if (o->load_llmc && (rc = tr_llmc_gpt2_read_config(o->load_llmc, &g, why, sizeof(why))) < 0) {
        fprintf(stderr, "troupe memory: --load-llmc %s: %s\n", o->load_llmc, why);
        return rc;
    }
    if (o->seq_len > g.max_seq_len) {
        fprintf(stderr, "troupe memory: --seq-len %d: longer than the model's context (%d)\n",
                o->seq_len, g.max_seq_len);
        return TR_EINVAL;
    }
    *T = o->seq_len ? o->seq_len : g.max_seq_len;
    rc = tr_memory_model_gpt2(m, &g, B, *T, why, sizeof(why));
    if (rc < 0) fprintf(stderr, "troupe memory: gpt2 dims: %s\n", why);
    return rc;
}

/* --- printing --------------------------------------------------------------------------- */

static const char *size_text(uint64_t bytes, char *buf, size_t len)
{
    if (bytes >= (1ull << 30))
        snprintf(buf, len, "%.2f GiB", (double)bytes / (1 << 30));
    else if (bytes >= (1ull << 20))
        snprintf(buf, len, "%.1f MiB", (double)bytes / (1 << 20));
    else if (bytes >= 1024)
        snprintf(buf, len, "%.1f KiB", (double)bytes / 1024);
    else
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    return buf;
}

static void print_kinds(const tr_engine_memory_t *mem, const char *note)
{
    const struct {
        const char *name;
        uint64_t bytes;
    } kinds[] = {
        {"parameters", mem->params},
        {"gradients (the backward's)", mem->grads},
        {"gradients (reduced partition)", mem->grad_partition},
        {"optimizer states", mem->optimizer},
        {"swap buffers", mem->swap},
        {"communication buffers", mem->comm},
        {"batches", mem->batches},
        {"bf16 weight copies", mem->bf16_copies},
        {"activations", mem->activations},
    };
    char b[32];
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        printf("  %-31s %12s  (%llu bytes)\n", kinds[i].name, size_text(kinds[i].bytes, b, 32),
               (unsigned long long)kinds[i].bytes);
    uint64_t total = tr_engine_memory_total(mem);
    printf("  %-31s %12s  (%llu bytes)\n", "total", size_text(total, b, 32),
           (unsigned long long)total);
    if (note[0]) printf("note: %s\n", note);
}

static const char *const device_names[] = {"none", "cpu", "nvme"};

/* The config with another stage and offload device; overlap_comm follows the stage's
 * default (true at 3, as DeepSpeed) unless the file gives it. */
static tr_config_t variant(const tr_config_t *cfg, int stage, int device, int param_device)
{
    tr_config_t v = *cfg;
    v.zero.stage = stage;
    v.zero.offload_optimizer.device = device;
    v.zero.offload_param.device = param_device;
    if (tr_config_origin(cfg, "zero_optimization.overlap_comm") != TR_ORIGIN_GIVEN)
        v.zero.overlap_comm = stage == 3;
    return v;
}

/* Every stage and offload: the per-rank total and whether it fits; returns whether the
 * config's own choice fits. */
static int print_table(const tr_config_t *cfg, const tr_memory_model_t *m, uint64_t budget)
{
    char b[8][32];
    int own_fits = 0, swap_bigger = 0;
    printf("\n%-5s %-11s %12s %12s %12s %12s %12s %12s  %s\n", "stage", "offload", "parameters",
           "gradients", "optimizer", "activations", "other", "total", "fits");
    /* each stage with the optimizer's state in memory, on the CPU or on NVMe; at stage 3 also
     * the parameters offloaded (+p:): to the CPU, and both on NVMe */
    int rows[6][2] = {{TR_OFFLOAD_NONE, TR_OFFLOAD_NONE},
                      {TR_OFFLOAD_CPU, TR_OFFLOAD_NONE},
                      {TR_OFFLOAD_NVME, TR_OFFLOAD_NONE},
                      {TR_OFFLOAD_NONE, TR_OFFLOAD_CPU},
                      {TR_OFFLOAD_NVME, TR_OFFLOAD_NVME}};
    int config_param =
        cfg->zero.stage == 3 && cfg->ranks > 1 ? cfg->zero.offload_param.device : TR_OFFLOAD_NONE;
    int n3 = 5, listed = 0; /* stage 3's rows, and the config's own pair when none of them */
    for (int r = 0; r < n3; r++)
        listed |= rows[r][0] == cfg->zero.offload_optimizer.device && rows[r][1] == config_param;
    if (!listed) {
        rows[n3][0] = cfg->zero.offload_optimizer.device;
        rows[n3++][1] = config_param;
    }
    for (int stage = 0; stage <= 3; stage++)
        for (int r = 0; r < (stage == 3 && cfg->ranks > 1 ? n3 : 3); r++) {
            int dev = rows[r][0], pdev = rows[r][1];
            tr_config_t v = variant(cfg, stage, dev, pdev);
            tr_engine_memory_t e;
            if (tr_engine_memory_predict(&v, m, 0, 1, &e, NULL, 0) < 0) continue;
            uint64_t total = tr_engine_memory_total(&e);
            int own = stage == cfg->zero.stage && dev == cfg->zero.offload_optimizer.device &&
                      pdev == config_param;
            int refused = cfg->pipeline.stages > 1 && stage >= 2; /* DeepSpeed's rule too */
            int fits = total <= budget && !refused;
            if (own) own_fits = fits;
            if (dev == TR_OFFLOAD_NVME && e.swap > e.optimizer) {
                tr_config_t mem_v = variant(cfg, stage, TR_OFFLOAD_NONE, pdev);
                tr_engine_memory_t in_mem;
                tr_engine_memory_predict(&mem_v, m, 0, 1, &in_mem, NULL, 0);
                swap_bigger |= e.swap > in_mem.optimizer;
            }
            char st[8], off[24];
            snprintf(st, sizeof(st), "%d", stage);
            snprintf(off, sizeof(off), "%s%s%s", device_names[dev], pdev ? "+p:" : "",
                     pdev ? device_names[pdev] : "");
            printf("%-5s %-11s %12s %12s %12s %12s %12s %12s  %s%s\n", st, off,
                   size_text(e.params, b[0], 32), size_text(e.grads + e.grad_partition, b[1], 32),
                   size_text(e.optimizer + e.swap, b[2], 32), size_text(e.activations, b[3], 32),
                   size_text(e.comm + e.batches + e.bf16_copies, b[4], 32),
                   size_text(total, b[5], 32),
                   refused ? "refused with a pipeline"
                   : fits  ? "yes"
                           : "no",
                   own ? "  <- the config" : "");
        }
    printf("\noptimizer: the moments in memory, or with nvme the swap buffers they pass through; "
           "other: communication buffers, batches and bf16 copies. Stage 3 keeps each rank's "
           "slice of the parameters, the persistent layers and the fetcher's window; cpu keeps the "
           "moments in host memory as none does (the optimizer runs "
           "on the CPU either way). +p: offload_param (stage 3, 2 ranks or more): cpu keeps the "
           "slice in its own host buffer (the same bytes), nvme on disk (needs the optimizer's "
           "state on nvme too; the swapper's parameter cache counts under optimizer).\n");
    printf("Not counted: a checkpoint save's file images (from the first save on, one more "
           "copy of the parameters on rank 0 and of each rank's moments) and the runtime's own "
           "threads and mailboxes (a few MiB).\n");
    if (cfg->ranks == 1)
        printf("On one rank ZeRO partitions nothing: every stage takes stage 0's memory; "
               "--world-size N shows N ranks.\n");
    if (swap_bigger)
        printf("nvme: here the swap buffers outweigh the moments they replace (buffer_count "
               "slots of one sub-group's moments, sub_group_size %lld elements, each rounded up "
               "to 4 KiB x aio.intra_op_parallelism); a smaller sub_group_size bounds them.\n",
               (long long)cfg->zero.sub_group_size);
    return own_fits;
}

/* --- the command ------------------------------------------------------------------------ */

static int run(const mem_opts_t *mo, const train_opts_t *o)
{
    tr_config_t *cfg = load_config(o->config, mo->world);
    if (!cfg) return 2;
    tr_memory_model_t m;
    int T, B = (int)cfg->train_micro_batch_size_per_gpu;
    if (describe_model(o, B, &m, &T) < 0) {
        tr_config_destroy(cfg);
        return 2;
    }
    tr_engine_memory_t mem;
    char note[1024], where[96], b[32];
    tr_engine_memory_predict(cfg, &m, 0, 1, &mem, note, sizeof(note));
    size_t n = 0;
    for (int i = 0; i < m.n_layers; i++)
        n += m.layers[i].params;
    printf("%s, %s of %zu parameters, micro-batch %d x %d positions, %d rank(s): memory per "
           "rank (rank 0), ZeRO stage %lld, offload_optimizer %s\n",
           cfg->source, o->model, n, B, T, mo->world, (long long)cfg->zero.stage,
           device_names[cfg->zero.offload_optimizer.device]);
    print_kinds(&mem, note);
    uint64_t budget = mo->budget;
    if (mo->budget_text) {
        printf("\nbudget: %s per rank (--budget %s)\n", size_text(budget, b, 32), mo->budget_text);
    } else if (tr_engine_memory_available(&budget, where, sizeof(where)) == 0) {
        budget /= (uint64_t)mo->world;
        printf("\nbudget: %s per rank (this machine's available memory, %s, shared by %d "
               "rank(s))\n",
               size_text(budget, b, 32), where, mo->world);
    } else {
        budget = UINT64_MAX;
        printf("\nbudget: none (this machine does not say what it has; give --budget)\n");
    }
    int fits = print_table(cfg, &m, budget);
    tr_memory_model_close(&m);
    tr_config_destroy(cfg);
    return fits ? 0 : 1;
}

int tr_cmd_memory(int argc, char **argv)
{
    char **rest = calloc((size_t)argc + 1, sizeof(*rest));
    if (!rest) return 2;
    mem_opts_t mo;
    train_opts_t o;
    int n_rest, rc = 2;
    if (parse_own(argc, argv, &mo, rest, &n_rest) == 0) {
        if (mo.help) {
            fputs(usage, stdout);
            rc = 0;
        } else if (train_args_parse_model("troupe memory", n_rest, rest, &o) == 0) {
            rc = run(&mo, &o);
        }
    }
    free(rest);
    return rc;
}
