/* cmd_train.c: `troupe train` — trains a GPT-2 on llm.c token shards, or an MLP on a built-in
 * task, with Troupe's engine and a DeepSpeed config. It reads top to bottom as the run does:
 * load the config, build the model (from scratch or an llm.c checkpoint), create the engine,
 * resume, then step until --steps, saving and validating on the way; at the end (or after
 * SIGINT, which finishes the step) save, validate, export, sample and print a summary.
 *
 * Nothing is lost to a path, a validation or a failed save: every output path is checked
 * before the model is built (train_outputs.c), the checkpoint and the llm.c export are written
 * before a failing validation (mid-run or at the end) ends the run with status 1, and a save
 * that fails (a full disk) is reported while training goes on (the engine has removed its
 * half-written tag; latest names the last good one): the next saves and the one at the end
 * are still made, and the summary is printed.
 *
 * The engine writes DeepSpeed's Train/Samples/... scalars to the config's csv_monitor and
 * tensorboard outputs; troupe train adds Eval/Samples/val_loss (step = samples trained).
 * Exit status: 0 done, 1 the engine, a validation or the last save failed (its explanation is
 * printed), 2 a bad flag, file or config (named), also a checkpoint that --resume cannot load. */
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "train.h"

typedef struct run {
    train_opts_t o;
    tr_config_t *cfg;
    tr_engine_t *eng;
    mlp_task_t task_train, task_val;
    train_savedir_t sd;
    tr_csv_monitor_t *csv;
    tr_tb_writer_t *tb;
    int tty, is_gpt2;
    double t0, loop_t0, compute_ms;
    uint64_t first_step, tokens;
    float first_loss, last_loss, val_loss;
    int have_val, val_failed;
    double params;         /* the model's parameters, once built */
    uint64_t saved_step;   /* the step of the last checkpoint written or loaded; -1: none */
    char writing[64];      /* the tag being written in the background ("" if none) */
    uint64_t writing_step; /* its step */
    int saves_failed;      /* saves that failed (each reported when it did) */
    int last_save_failed;  /* the last save failed: the run exits 1 */
    double paused_ms;      /* how long its save call held the training loop */
    int midline;           /* a terminal's progress line is waiting to be rewritten */
} run_t;

/* Ends a terminal's progress line before another line is printed. */
static void endline(run_t *r)
{
    if (r->midline) putchar('\n');
    r->midline = 0;
}

/* --- setting up ------------------------------------------------------------------------- */

static int load_config(run_t *r)
{
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    int rc = tr_config_load(r->o.config, 0, &r->cfg, &d); /* the launcher's world size */
    for (size_t i = 0; i < d.count; i++)
        fprintf(stderr, "%s\n", d.items[i].text);
    if (rc < 0 && d.count == 0)
        fprintf(stderr, "troupe train: --deepspeed_config %s: %s\n", r->o.config, tr_strerror(rc));
    tr_config_diag_close(&d);
    return rc;
}

/* A dims flag that disagrees with the checkpoint's value is an error naming both. */
static int dims_agree(const char *file, const char *flag, int given, const char *field, int has)
{
    if (given == 0 || given == has) return 0;
    fprintf(stderr,
            "troupe train: %s %d conflicts with %s's %s %d (the file's dims are used; "
            "drop the flag)\n",
            flag, given, file, field, has);
    return -1;
}

static int gpt2_from_file(run_t *r, tr_model_t **model)
{
    const train_opts_t *o = &r->o;
    tr_gpt2_config_t g;
    char why[512];
    if (tr_llmc_gpt2_read_config(o->load_llmc, &g, why, sizeof(why)) < 0) {
        fprintf(stderr, "troupe train: --load-llmc: %s\n", why);
        return -1;
    }
    if (dims_agree(o->load_llmc, "--vocab", o->vocab, "vocab_size", g.vocab_size) ||
        dims_agree(o->load_llmc, "--context", o->context, "max_seq_len", g.max_seq_len) ||
        dims_agree(o->load_llmc, "--channels", o->channels, "channels", g.channels) ||
        dims_agree(o->load_llmc, "--layers", o->layers, "num_layers", g.num_layers) ||
        dims_agree(o->load_llmc, "--heads", o->heads, "num_heads", g.num_heads))
        return -1;
    if (tr_llmc_gpt2_load(o->load_llmc, model, why, sizeof(why)) < 0) {
        fprintf(stderr, "troupe train: --load-llmc: %s\n", why);
        return -1;
    }
    return 0;
}

/* Parameters of the model the flags describe, as the model files count them (a GPT-2's
 * vocabulary padded to a multiple of 128, as tr_model_gpt2_create pads it). */
static double flag_params(const train_opts_t *o, const tr_gpt2_config_t *g)
{
    double n = 0;
    if (!g) {
        for (int i = 1; i < o->n_widths; i++)
            n += (double)o->widths[i - 1] * o->widths[i] + o->widths[i];
        return n;
    }
    double C = g->channels, L = g->num_layers, Vp = (g->vocab_size + 127) / 128 * 128;
    return Vp * C + g->max_seq_len * C + L * (12 * C * C + 13 * C) + 2 * C;
}

/* Out of memory (or, under ulimit -v, out of address space for a thread's stack): what was
 * being made (`what`, which may already end with rc's text) and how large, so the limit can
 * be judged. */
static void say_no_memory(const run_t *r, const char *what, int rc, const tr_gpt2_config_t *g)
{
    double n = r->params ? r->params : flag_params(&r->o, g);
    const char *reason = tr_strerror(rc);
    size_t wl = strlen(what), rl = strlen(reason);
    int has_reason = wl >= rl && !strcmp(what + wl - rl, reason);
    fprintf(stderr, "troupe train: %s%s%s (", what, has_reason ? "" : ": ",
            has_reason ? "" : reason);
    if (rc == TR_EAGAIN) {
        struct rlimit st;
        double mib = getrlimit(RLIMIT_STACK, &st) == 0 && st.rlim_cur != RLIM_INFINITY
                         ? (double)st.rlim_cur / (1 << 20)
                         : 2.0;
        fprintf(stderr,
                "a thread could not be started: each reserves a %.0f MiB stack "
                "(ulimit -s) of address space; ",
                mib);
    }
    fprintf(stderr,
            "the model has %.0f parameters: %.1f MiB each for weights, gradients and "
            "each optimizer moment, plus activations; raise the memory limit or shrink the "
            "model)\n",
            n, n * 4 / (1 << 20));
}

static int build_model(run_t *r, tr_model_t **model)
{
    const train_opts_t *o = &r->o;
    char why[512] = "";
    int rc;
    tr_gpt2_config_t g;
    train_gpt2_config(o, &g);
    if (!r->is_gpt2)
        rc = tr_model_mlp_create(model, o->widths, o->n_widths, why, sizeof(why));
    else if (o->load_llmc)
        return gpt2_from_file(r, model);
    else
        rc = tr_model_gpt2_create(model, &g, why, sizeof(why));
    if (rc == TR_ENOMEM && !why[0])
        say_no_memory(r, "creating the model", rc, r->is_gpt2 ? &g : NULL);
    else if (rc < 0)
        fprintf(stderr, "troupe train: %s: %s\n", r->is_gpt2 ? "gpt2 dims" : "--widths",
                why[0] ? why : tr_strerror(rc));
    return rc;
}

static int glob_matches(const char *flag, const char *pattern)
{
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    size_t n = rc == 0 ? g.gl_pathc : 0;
    if (rc == 0) globfree(&g);
    if (n == 0) fprintf(stderr, "troupe train: %s: no file matches '%s'\n", flag, pattern);
    return n ? 0 : -1;
}

static int seq_len(const run_t *r, tr_model_t *model)
{
    if (!r->is_gpt2) return 1;
    int ctx = tr_model_gpt2_config(model)->max_seq_len;
    if (r->o.seq_len > ctx) {
        fprintf(stderr, "troupe train: --seq-len %d: longer than the model's context (%d)\n",
                r->o.seq_len, ctx);
        return -1;
    }
    return r->o.seq_len ? r->o.seq_len : ctx;
}

static int create_engine(run_t *r, tr_model_t *model, int T)
{
    const train_opts_t *o = &r->o;
    tr_engine_opts_t eo = {.config = r->cfg,
                           .model = model,
                           .seq_len = T,
                           .seed = o->seed,
                           .init_params = !o->load_llmc,
                           .handle_signals = 1,
                           .trace_dir = o->trace_dir};
    if (r->is_gpt2) {
        eo.train.shards = o->train_data;
        eo.val.shards = o->val_data;
    } else {
        int in = o->widths[0], classes = o->widths[o->n_widths - 1];
        r->task_train = (mlp_task_t){in, classes, 0};
        r->task_val = (mlp_task_t){in, classes, TRAIN_VAL_OFFSET};
        eo.train = (tr_dataset_t){.batch = train_mlp_batch, .user = &r->task_train, .x_dim = in};
        eo.val = (tr_dataset_t){.batch = train_mlp_batch, .user = &r->task_val, .x_dim = in};
    }
    char err[1024] = "";
    r->params = (double)tr_model_num_params(model);
    int rc = tr_engine_create(&r->eng, &eo, err, sizeof(err));
    if (rc == 0 && tr_engine_rank(r->eng) > 0 && !freopen("/dev/null", "w", stdout))
        rc = TR_EIO; /* only rank 0 reports (as DeepSpeed does); errors still show everywhere */
    if (rc == TR_ENOMEM || rc == TR_EAGAIN)
        say_no_memory(r, err[0] ? err : "creating the engine", rc, NULL);
    else if (rc < 0)
        fprintf(stderr, "troupe train: %s\n", err[0] ? err : tr_strerror(rc));
    return rc;
}

static int open_monitors(run_t *r)
{
    const tr_config_monitor_t *c = &r->cfg->csv_monitor, *t = &r->cfg->tensorboard;
    int rc = 0;
    if (c->enabled && (rc = tr_csv_monitor_create(c->output_path, c->job_name, &r->csv)) < 0)
        fprintf(stderr, "troupe train: csv_monitor.output_path %s: %s\n", c->output_path,
                tr_strerror(rc));
    if (rc == 0 && t->enabled &&
        (rc = tr_tb_writer_create(t->output_path, t->job_name, &r->tb)) < 0)
        fprintf(stderr, "troupe train: tensorboard.output_path %s: %s\n", t->output_path,
                tr_strerror(rc));
    return rc;
}

/* 0, 2 for bad input, 1 when memory runs out (already explained). */
static int setup(run_t *r)
{
    const train_opts_t *o = &r->o;
    r->is_gpt2 = !strcmp(o->model, "gpt2");
    if (load_config(r) < 0 || train_outputs_check(o, &r->sd) < 0) return 2;
    if (r->is_gpt2 && (glob_matches("--train-data", o->train_data) < 0 ||
                       (o->val_data && glob_matches("--val-data", o->val_data) < 0)))
        return 2;
    tr_model_t *model;
    int rc = build_model(r, &model);
    if (rc < 0) return rc == TR_ENOMEM ? 1 : 2;
    int T = seq_len(r, model);
    if (T < 0) {
        tr_model_destroy(model);
        return 2;
    }
    rc = create_engine(r, model, T);
    if (rc == TR_ENOMEM || rc == TR_EAGAIN) return 1;
    if (rc < 0 || open_monitors(r) < 0) return 2;
    return 0;
}

/* --resume: the checkpoint `latest` names; none yet is not an error (a first run). A
 * checkpoint that cannot be loaded (missing, corrupt, another model's, a tag mixing saves) is
 * a bad file: status 2, the engine's message names it. Running out of memory is status 1. */
static int resume(run_t *r)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/latest", r->o.save_dir);
    if (stat(path, &st) < 0) {
        printf("resume: no checkpoint in %s yet (no %s): starting at step 0\n", r->o.save_dir,
               path);
        return 0;
    }
    int rc = tr_engine_load_checkpoint(r->eng, r->o.save_dir, NULL);
    if (rc < 0) {
        fprintf(stderr, "troupe train: --resume %s: %s\n", r->o.save_dir,
                tr_engine_error(r->eng)[0] ? tr_engine_error(r->eng) : tr_strerror(rc));
        return rc == TR_ENOMEM || rc == TR_ESTOPPED || rc == TR_EFAILED ? 1 : 2;
    }
    r->saved_step = tr_engine_global_step(r->eng);
    printf("resume: loaded %s at step %llu\n", r->o.save_dir, (unsigned long long)r->saved_step);
    return 0;
}

/* --- the loop --------------------------------------------------------------------------- */

static void monitor_write(run_t *r, const char *tag, double v, uint64_t samples)
{
    if (r->csv) tr_csv_monitor_write(r->csv, tag, v, samples);
    if (r->tb) tr_tb_writer_scalar(r->tb, tag, (float)v, (int64_t)samples, (double)time(NULL));
}

static void format_eta(double s, char *buf, size_t cap)
{
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else
        snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
}

static void progress(run_t *r, const tr_step_stats_t *st)
{
    uint64_t done = st->global_step - r->first_step, left = (uint64_t)r->o.steps - st->global_step;
    double elapsed = tr__now_s() - r->loop_t0;
    double tps = r->compute_ms > 0 ? r->tokens / r->compute_ms * 1e3 : 0;
    char eta[32];
    format_eta(done ? elapsed / (double)done * (double)left : 0, eta, sizeof(eta));
    long every = r->o.print_every ? r->o.print_every : (long)r->cfg->steps_per_print;
    int due = done == 1 || left == 0 || st->global_step % (uint64_t)(every > 0 ? every : 1) == 0;
    if (r->tty) { /* one line rewritten each step; kept (a newline) every `every` steps */
        printf("\rstep %llu/%ld | loss %.4f | lr %.3g | %.0f tok/s | ETA %s   %s",
               (unsigned long long)st->global_step, r->o.steps, st->loss, st->lr, tps, eta,
               due && left ? "\n" : "");
        r->midline = !(due && left);
        fflush(stdout);
    } else if (due) {
        printf("step %llu/%ld loss %.4f lr %.3g grad_norm %.3f %.0f tok/s ETA %s\n",
               (unsigned long long)st->global_step, r->o.steps, st->loss, st->lr, st->grad_norm,
               tps, eta);
        fflush(stdout);
    }
}

/* 0, or 1 with r->val_failed set after printing why. */
static int validate(run_t *r, uint64_t step, uint64_t samples)
{
    if (tr_engine_eval(r->eng, (int)r->o.val_batches, &r->val_loss) < 0) {
        endline(r);
        fprintf(stderr, "troupe train: validation at step %llu: %s\n", (unsigned long long)step,
                tr_engine_error(r->eng));
        r->val_failed = 1;
        return 1;
    }
    r->have_val = 1;
    endline(r);
    printf("val: step %llu loss %.6f (%ld batches)\n", (unsigned long long)step, r->val_loss,
           r->o.val_batches);
    monitor_write(r, "Eval/Samples/val_loss", r->val_loss, samples);
    return 0;
}

/* A save failed: said (the engine's message names the file and what latest still names; the
 * checkpointer has removed the failed tag's files), counted, and training goes on. */
static void save_failed(run_t *r)
{
    endline(r);
    fprintf(stderr, "troupe train: saving to %s: %s\n", r->o.save_dir, tr_engine_error(r->eng));
    r->saves_failed++;
    r->last_save_failed = 1;
}

/* The save being written in the background, if any, has ended: "saved:" once latest names
 * it (then old tags are pruned), else the error. 0 or 1 (it failed). */
static int settle(run_t *r)
{
    if (!r->writing[0]) return 0;
    int rc = tr_engine_wait_checkpoint(r->eng);
    if (rc < 0) {
        save_failed(r);
    } else {
        endline(r);
        printf("saved: %s/%s (latest); the save paused training %.1f ms\n", r->o.save_dir,
               r->writing, r->paused_ms);
        r->saved_step = r->writing_step;
        r->last_save_failed = 0;
    }
    if (rc == 0 && tr_engine_rank(r->eng) == 0) /* one rank prunes old tags */
        train_savedir_saved(&r->o, &r->sd, r->writing);
    r->writing[0] = '\0';
    return rc < 0;
}

/* A save: it returns once the state is copied (checkpoint.writer.decoupled), and is settled
 * at the next save or at the end of the run. A failed save is reported and training goes on
 * (the next save, and the one at the end, are still made): 0, or 1 when it failed (so far:
 * a background write is settled later). */
static int save(run_t *r)
{
    settle(r);
    double t0 = tr__now_s();
    if (tr_engine_save_checkpoint(r->eng, r->o.save_dir, NULL) < 0) {
        save_failed(r);
        return 1;
    }
    r->writing_step = tr_engine_global_step(r->eng);
    snprintf(r->writing, sizeof(r->writing), "global_step%llu",
             (unsigned long long)r->writing_step);
    r->paused_ms = (tr__now_s() - t0) * 1e3; /* decoupled false: the whole write */
    return r->cfg->checkpoint.writer_decoupled ? 0 : settle(r);
}

/* After each step: monitors, progress, saving and validation when due, the save first so a
 * failing validation cannot cost it. 0, or 1 (a failed validation, with r->val_failed set:
 * finish() still saves and exports). A failed save does not stop the run. */
static int after_step(run_t *r, const tr_step_stats_t *st)
{
    if (st->global_step == r->first_step + 1)
        r->first_loss = st->loss;
    else { /* the first step pays for warming up; tokens/s leaves it out */
        r->tokens += st->tokens;
        r->compute_ms += st->step_ms;
    }
    r->last_loss = st->loss;
    progress(r, st);
    if (r->o.save_every && st->global_step % (uint64_t)r->o.save_every == 0) save(r);
    if (r->o.val_every && st->global_step % (uint64_t)r->o.val_every == 0)
        return validate(r, st->global_step, st->global_samples);
    return 0;
}

static int train_loop(run_t *r)
{
    r->first_step = tr_engine_global_step(r->eng);
    r->loop_t0 = tr__now_s();
    uint64_t step = r->first_step;
    while (step < (uint64_t)r->o.steps && !tr_engine_stop_requested(r->eng)) {
        tr_step_stats_t st;
        if (tr_engine_train_batch(r->eng, &st) < 0) {
            endline(r);
            fprintf(stderr, "troupe train: %s\n", tr_engine_error(r->eng));
            return 1;
        }
        step = st.global_step;
        if (after_step(r, &st))
            return r->val_failed ? 0 : 1; /* finish() keeps the work, then reports it */
    }
    endline(r);
    return 0;
}

/* --- the end ---------------------------------------------------------------------------- */

static void print_tokens(const run_t *r, const int *tok, int n)
{
    int bytes = tr_model_gpt2_config(tr_engine_model(r->eng))->vocab_size == 256;
    printf("sample (%d tokens%s):\n", n, bytes ? ", bytes as text" : "");
    for (int i = 0; i < n; i++) {
        if (!bytes)
            printf("%d ", tok[i]);
        else
            putchar(tok[i] == '\n' || tok[i] == '\t' || tok[i] >= 32 ? tok[i] : '.');
    }
    printf("\n");
}

static int sample(run_t *r)
{
    int *tok = malloc((size_t)r->o.sample * sizeof(int));
    int rc = !tok ? TR_ENOMEM : tr_engine_gather_params(r->eng); /* ZeRO 3: whole, here */
    if (rc == 0)
        rc = train_sample(tr_engine_model(r->eng), NULL, 0, (int)r->o.sample,
                          r->o.seed ? r->o.seed : 1337, tok);
    if (rc == 0)
        print_tokens(r, tok, (int)r->o.sample);
    else
        fprintf(stderr, "troupe train: --sample: %s\n", tr_strerror(rc));
    free(tok);
    return rc < 0 ? 1 : 0;
}

static int export_llmc(run_t *r)
{
    char why[512];
    if (tr_engine_gather_params(r->eng) < 0) { /* ZeRO 3: every rank's slices, whole here */
        fprintf(stderr, "troupe train: --export-llmc: %s\n", tr_engine_error(r->eng));
        return 1;
    }
    if (tr_engine_rank(r->eng) != 0) return 0; /* one file: rank 0 writes it */
    if (tr_llmc_gpt2_save(tr_engine_model(r->eng), r->o.export_llmc, why, sizeof(why)) < 0) {
        fprintf(stderr, "troupe train: --export-llmc: %s\n", why);
        return 1;
    }
    printf("exported: %s (llm.c GPT-2 checkpoint)\n", r->o.export_llmc);
    return 0;
}

static void summary(const run_t *r, int stopped)
{
    uint64_t step = tr_engine_global_step(r->eng);
    printf("summary: %s at step %llu",
           r->val_failed ? "validation failed"
           : stopped     ? "stopped (signal)"
                         : "done",
           (unsigned long long)step);
    if (step > r->first_step) printf(", train loss %.4f -> %.4f", r->first_loss, r->last_loss);
    if (r->is_gpt2 && step > r->first_step)
        printf(" (uniform: ln %d = %.2f)",
               tr_model_gpt2_config(tr_engine_model(r->eng))->vocab_size,
               log(tr_model_gpt2_config(tr_engine_model(r->eng))->vocab_size));
    if (r->have_val) printf(", val loss %.6f", r->val_loss);
    if (r->saves_failed)
        printf(", %d checkpoint save(s) failed (%s)", r->saves_failed,
               r->last_save_failed ? "the last one too" : "a later one succeeded");
    if (r->compute_ms > 0) printf(", %.0f tokens/s", r->tokens / r->compute_ms * 1e3);
    printf(", %.1f s\n", tr__now_s() - r->t0);
}

/* The end of a run, also after a failed validation: the checkpoint and the export are written
 * whatever the validation says (they come first, or the run continues past a failure). */
static int finish(run_t *r)
{
    int stopped = tr_engine_stop_requested(r->eng);
    uint64_t step = tr_engine_global_step(r->eng);
    int rc = 0;
    if (r->o.save_dir) { /* the run ends once its last checkpoint is durable, or failed */
        settle(r);
        if (r->saved_step != step) { /* none at this step yet, or it failed: (re)try it */
            save(r);
            settle(r);
        }
        rc |= r->last_save_failed;
    }
    if (!stopped && !r->val_failed &&
        !(r->have_val && r->o.val_every && step % (uint64_t)r->o.val_every == 0))
        rc |= validate(r, step, step * (uint64_t)r->cfg->train_batch_size);
    if (!stopped && r->o.export_llmc) rc |= export_llmc(r);
    if (!rc && !r->val_failed && !stopped && r->o.sample > 0) rc = sample(r);
    if (r->tb) tr_tb_writer_flush(r->tb);
    summary(r, stopped);
    return rc || r->val_failed ? 1 : 0;
}

static void teardown(run_t *r)
{
    tr_engine_destroy(r->eng);
    tr_config_destroy(r->cfg);
    tr_csv_monitor_destroy(r->csv);
    tr_tb_writer_destroy(r->tb);
    train_savedir_close(&r->sd);
}

int tr_cmd_train(int argc, char **argv)
{
    run_t r = {.t0 = tr__now_s(), .tty = isatty(STDOUT_FILENO), .saved_step = UINT64_MAX};
    if (train_args_parse(argc, argv, &r.o) < 0) return 2;
    if (r.o.help) {
        train_usage(stdout);
        return 0;
    }
    int status = setup(&r);
    if (status == 0 && r.o.resume) status = resume(&r);
    if (status == 0) status = train_loop(&r);
    if (status == 0) status = finish(&r);
    teardown(&r);
    return status;
}
