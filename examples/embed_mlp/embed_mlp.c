/* embed_mlp: a complete C trainer built on Troupe's public API (troupe.h) alone.
 *
 * An MLP learns a synthetic task: 8 inputs uniform in [-1, 1), the class (one of 4) is the
 * quadrant-like sign pattern of two fixed sums. Batches come from a callback. The program
 * trains with the engine-driven loop (tr_engine_train_batch), measures the validation loss,
 * saves a checkpoint, reloads it into a fresh engine and checks that the reloaded model gives
 * the same validation loss, then trains a few more steps the DeepSpeed way (forward,
 * backward, step). Build: cc embed_mlp.c $(pkg-config --cflags --libs troupe).
 *
 *   embed_mlp [CHECKPOINT_DIR]   (default: ./embed_mlp_ckpt)
 */
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include <troupe.h>

#define IN      8
#define CLASSES 4

static const char config_json[] =
    "{\"train_micro_batch_size_per_gpu\": 32, \"gradient_accumulation_steps\": 1,"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
    " \"gradient_clipping\": 1.0}";

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* Sample s: inputs and class. `user` offsets the stream (train 0, validation 1 << 40). */
static int make_batch(void *user, uint64_t index, int B, int T, int *tokens, float *x, int *targets,
                      float *y)
{
    uint64_t base = *(const uint64_t *)user + index * (uint64_t)(B * T);
    /* an MLP classifier reads floats and gives class ids */
    (void)tokens;
    (void)y;
    for (int b = 0; b < B * T; b++) {
        float *xb = x + b * IN, s0 = 0, s1 = 0;
        for (int i = 0; i < IN; i++) {
            xb[i] = (float)(mix((base + (uint64_t)b) * IN + (uint64_t)i + 1) >> 40) / 16777216.f;
            xb[i] = 2 * xb[i] - 1;
            s0 += (i % 2 ? 1.f : -1.f) * xb[i];
            s1 += (i < IN / 2 ? 1.f : -1.f) * xb[i];
        }
        targets[b] = (s0 > 0) * 2 + (s1 > 0);
    }
    return 0;
}

static uint64_t train_offset = 0, val_offset = 1ull << 40;

/* A new engine over a new model; parameters initialised from seed 1 (a load replaces them). */
static tr_engine_t *engine_new(const tr_config_t *cfg)
{
    int widths[] = {IN, 64, CLASSES};
    tr_model_t *model;
    tr_engine_t *eng;
    char err[512];
    if (tr_model_mlp_create(&model, widths, 3, err, sizeof(err)) < 0) {
        fprintf(stderr, "model: %s\n", err);
        return NULL;
    }
    tr_engine_opts_t o = {.config = cfg,
                          .model = model,
                          .seq_len = 1,
                          .seed = 1,
                          .init_params = 1,
                          .train = {.batch = make_batch, .user = &train_offset, .x_dim = IN},
                          .val = {.batch = make_batch, .user = &val_offset, .x_dim = IN}};
    if (tr_engine_create(&eng, &o, err, sizeof(err)) < 0) {
        fprintf(stderr, "engine: %s\n", err);
        return NULL;
    }
    return eng;
}

static int fail(tr_engine_t *eng, const char *what)
{
    fprintf(stderr, "%s: %s\n", what, tr_engine_error(eng));
    tr_engine_destroy(eng);
    return 1;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "embed_mlp_ckpt";
    tr_config_t *cfg;
    tr_config_diag_t diag;
    tr_config_diag_init(&diag);
    int rc = tr_config_from_string(config_json, strlen(config_json), "embed_mlp", 1, &cfg, &diag);
    tr_config_diag_close(&diag);
    tr_engine_t *eng = rc < 0 ? NULL : engine_new(cfg);
    if (!eng) return 1;
    tr_step_stats_t st;
    float val0, val, reloaded;
    if (tr_engine_eval(eng, 8, &val0) < 0) return fail(eng, "eval");
    for (int i = 0; i < 200; i++) {
        if (tr_engine_train_batch(eng, &st) < 0) return fail(eng, "train");
        if ((i + 1) % 50 == 0)
            printf("step %llu: loss %.4f\n", (unsigned long long)st.global_step, st.loss);
    }
    if (tr_engine_eval(eng, 8, &val) < 0 || tr_engine_save_checkpoint(eng, dir, NULL) < 0)
        return fail(eng, "eval/save");
    printf("val loss %.4f -> %.4f; saved %s\n", val0, val, dir);
    tr_engine_destroy(eng);

    eng = engine_new(cfg); /* a fresh engine: load what was saved */
    if (!eng || tr_engine_load_checkpoint(eng, dir, NULL) < 0 ||
        tr_engine_eval(eng, 8, &reloaded) < 0)
        return eng ? fail(eng, "reload") : 1;
    printf("reloaded: val loss %.4f (%s)\n", reloaded, reloaded == val ? "same" : "DIFFERENT");

    float x[32 * IN], loss = 0; /* DeepSpeed style: the trainer owns the loop */
    int targets[32];
    for (uint64_t b = 0; b < 20; b++) {
        make_batch(&train_offset, 1000 + b, 32, 1, NULL, x, targets, NULL);
        tr_engine_batch_t batch = {.x = x, .targets = targets};
        if (tr_engine_forward(eng, &batch, &loss) < 0 || tr_engine_backward(eng) < 0 ||
            tr_engine_step(eng, NULL) < 0)
            return fail(eng, "forward/backward/step");
    }
    printf("DeepSpeed-style: 20 more steps, last loss %.4f\n", loss);
    int ok = reloaded == val && val < 0.5f * val0;
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    return ok ? 0 : 1;
}
