/* custom_model: a regression MLP made of the user's own layers, trained by Troupe's engine.
 *
 * layers.c writes three layers against include/troupe/model.h (a linear layer, tanh, an MSE
 * loss over float targets) and stacks them into a 4 -> 32 -> 1 MLP; task.c makes the data
 * (y = sin(x0) + 0.5 x1 x2 - x3^2, inputs hashed from the sample number). This program:
 *
 *   1. trains with the engine-driven loop: tr_engine_train_batch draws the micro-batches from
 *      a callback that fills x (B, 1, 4) and y (B, 1, 1);
 *   2. trains on with a loop of its own, DeepSpeed-style: tr_engine_forward on a
 *      tr_engine_batch_t {.x, .y}, tr_engine_backward, tr_engine_step;
 *   3. measures the validation MSE (tr_engine_eval on a second callback) after each phase,
 *      saves a checkpoint, loads it into a fresh engine and checks the MSE is the same.
 *
 * It exits 0 when the validation MSE fell below 30% of the untrained model's and the reload
 * matched. Build: make (pkg-config), or the CMake build's examples/custom_model/custom_model.
 *
 *   custom_model [DS_CONFIG [CHECKPOINT_DIR]]   (defaults: ds_config.json, custom_model_ckpt)
 */
#include <stdio.h>
#include <stdint.h>

#include <troupe.h>

#include "layers.h"
#include "task.h"

#define HIDDEN      32
#define VAL_BATCHES 8

static uint64_t train_stream = MY_TASK_TRAIN, val_stream = MY_TASK_VAL;

/* A new engine over a new model, parameters drawn from seed 1 by each layer's init (a
 * checkpoint load replaces them). NULL after printing why. */
static tr_engine_t *engine_new(const tr_config_t *cfg)
{
    tr_model_t *model;
    tr_engine_t *eng;
    char err[512];
    if (my_mlp_create(&model, MY_TASK_IN, HIDDEN, err, sizeof(err)) < 0) {
        fprintf(stderr, "model: %s\n", err);
        return NULL;
    }
    tr_engine_opts_t o = {
        .config = cfg,
        .model = model,
        .seq_len = 1,
        .seed = 1,
        .init_params = 1,
        /* x_dim: floats of input per position (the first layer's in_dim); y_dim: floats of
         * target (the loss layer's): both checked by tr_engine_create */
        .train = {.batch = my_task_batch, .user = &train_stream, .x_dim = MY_TASK_IN, .y_dim = 1},
        .val = {.batch = my_task_batch, .user = &val_stream, .x_dim = MY_TASK_IN, .y_dim = 1}};
    if (tr_engine_create(&eng, &o, err, sizeof(err)) < 0) { // the model is freed here too
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

/* Phase 1: the engine draws GAS micro-batches per step from the train callback. */
static int train_engine_driven(tr_engine_t *eng, int steps)
{
    tr_step_stats_t st;
    for (int i = 0; i < steps; i++) {
        if (tr_engine_train_batch(eng, &st) < 0) return -1;
        if ((i + 1) % 100 == 0)
            printf("step %llu: train MSE %.4f, lr %.4g, grad norm %.3f\n",
                   (unsigned long long)st.global_step, st.loss, st.lr, st.grad_norm);
    }
    return 0;
}

/* Phase 2: the trainer owns the loop and the data (batches the loader never drew);
 * tr_engine_step steps at every GAS-th micro-batch, as DeepSpeed's engine.step(). */
static int train_deepspeed_style(tr_engine_t *eng, int micro_batches, int B)
{
    float x[64 * MY_TASK_IN], y[64], loss = 0;
    if (B > 64) {
        fprintf(stderr, "micro-batch %d > 64: enlarge x and y\n", B);
        return -1;
    }
    for (int i = 0; i < micro_batches; i++) {
        my_task_batch(&train_stream, 1000000 + (uint64_t)i, B, 1, NULL, x, NULL, y);
        tr_engine_batch_t batch = {.x = x, .y = y}; // (B, 1, 4) inputs, (B, 1, 1) targets
        tr_step_stats_t st;
        if (tr_engine_forward(eng, &batch, &loss) < 0 || tr_engine_backward(eng) < 0 ||
            tr_engine_step(eng, &st) < 0)
            return -1;
        if ((i + 1) % 200 == 0)
            printf("step %llu: train MSE %.4f (own loop)\n", (unsigned long long)st.global_step,
                   loss);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *config_path = argc > 1 ? argv[1] : "ds_config.json";
    const char *dir = argc > 2 ? argv[2] : "custom_model_ckpt";
    tr_config_t *cfg;
    tr_config_diag_t diag;
    tr_config_diag_init(&diag);
    int rc = tr_config_load(config_path, 1, &cfg, &diag);
    for (size_t i = 0; i < diag.count; i++) // errors, and warnings for keys with no effect
        fprintf(stderr, "%s\n", diag.items[i].text);
    tr_config_diag_close(&diag);
    tr_engine_t *eng = rc < 0 ? NULL : engine_new(cfg);
    if (!eng) return 2;
    int B = (int)cfg->train_micro_batch_size_per_gpu;

    float val0, val1, val2, reloaded;
    if (tr_engine_eval(eng, VAL_BATCHES, &val0) < 0) return fail(eng, "eval");
    printf("untrained: val MSE %.4f\n", val0);
    if (train_engine_driven(eng, 300) < 0 || tr_engine_eval(eng, VAL_BATCHES, &val1) < 0)
        return fail(eng, "engine-driven training");
    printf("after tr_engine_train_batch: val MSE %.4f\n", val1);
    if (train_deepspeed_style(eng, 400, B) < 0 || tr_engine_eval(eng, VAL_BATCHES, &val2) < 0)
        return fail(eng, "DeepSpeed-style training");
    printf("after forward/backward/step: val MSE %.4f\n", val2);
    if (tr_engine_save_checkpoint(eng, dir, NULL) < 0) return fail(eng, "save");
    printf("saved %s (step %llu)\n", dir, (unsigned long long)tr_engine_global_step(eng));
    tr_engine_destroy(eng);

    eng = engine_new(cfg); // a fresh engine: load what was saved
    if (!eng) return 1;
    if (tr_engine_load_checkpoint(eng, dir, NULL) < 0 ||
        tr_engine_eval(eng, VAL_BATCHES, &reloaded) < 0)
        return fail(eng, "reload");
    printf("reloaded: val MSE %.4f (%s)\n", reloaded, reloaded == val2 ? "same" : "DIFFERENT");
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    int ok = val2 < 0.3f * val0 && reloaded == val2;
    printf("val MSE %.4f -> %.4f: %s\n", val0, val2, ok ? "ok" : "NOT LEARNED");
    return ok ? 0 : 1;
}
