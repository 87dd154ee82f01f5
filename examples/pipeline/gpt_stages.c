/* gpt_stages.c: the byte-level GPT of `make demo` trained through S pipeline stages by the
 * engine (`"pipeline": {"stages": S}`, DeepSpeed's 1F1B schedule, M micro-batches per step):
 * stage actors in one process, or under `mpirun -np S` one stage per process with activations
 * and gradients crossing over MPI. Public API only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <troupe.h>

#include "gpt_stages.h"

static int train_steps(const gpt_stages_opts_t *o, tr_engine_t *eng)
{
    double first = 0, last = 0, ms = 0;
    bool quiet = tr_engine_rank(eng) != 0;
    for (int step = 0; step < o->steps; step++) {
        tr_step_stats_t st;
        if (tr_engine_train_batch(eng, &st) < 0) {
            fprintf(stderr, "pipeline_demo: step %d: %s\n", step + 1, tr_engine_error(eng));
            return 1;
        }
        if (step == 0) first = st.loss;
        last = st.loss;
        ms += st.step_ms;
        if (!quiet && ((step + 1) % 10 == 0 || step == 0 || step + 1 == o->steps))
            printf("gpt: step %d/%d loss %.4f (%.0f ms through %d stages)\n", step + 1, o->steps,
                   st.loss, st.step_ms, o->stages);
    }
    if (!quiet)
        printf("gpt: trained through %d stages (%s, 1F1B, %d micro-batches per step): loss "
               "%.4f -> %.4f (uniform: ln 256 = 5.55), %.0f ms per step\n",
               o->stages, tr_engine_world(eng) > 1 ? "one rank each" : "actors in one process",
               o->micro_batches, first, last, ms / o->steps);
    return 0;
}

int gpt_stages_train(const gpt_stages_opts_t *o)
{
    char json[1024], why[1024];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d, "
             "\"steps_per_print\": %d, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
             "{\"lr\": %g, \"betas\": [0.9, 0.95], \"weight_decay\": 0.01}}, "
             "\"pipeline\": {\"stages\": %d, \"partition\": \"parameters\"}, "
             "\"troupe\": {\"runtime\": {\"workers\": 1}}}",
             o->B, o->micro_batches, o->steps + 1, (double)o->lr, o->stages);
    tr_config_t *cfg = NULL;
    tr_config_diag_t diag;
    tr_config_diag_init(&diag);
    int rc = tr_config_from_string(json, strlen(json), "pipeline_demo", 0, &cfg, &diag);
    for (size_t i = 0; rc < 0 && i < diag.count; i++)
        fprintf(stderr, "%s\n", diag.items[i].text);
    tr_config_diag_close(&diag);
    if (rc < 0) return 2;
    tr_gpt2_config_t c = {.max_seq_len = o->T,
                          .vocab_size = 256,
                          .padded_vocab_size = 256,
                          .num_layers = o->layers,
                          .num_heads = 4,
                          .channels = o->channels};
    tr_model_t *model = NULL;
    tr_engine_t *eng = NULL;
    if ((rc = tr_model_gpt2_create(&model, &c, why, sizeof(why))) == 0) {
        tr_engine_opts_t eo = {.config = cfg,
                               .model = model,
                               .train = {.shards = o->data},
                               .seq_len = o->T,
                               .seed = 1234,
                               .init_params = 1};
        rc = tr_engine_create(&eng, &eo, why, sizeof(why));
    }
    if (rc < 0) fprintf(stderr, "pipeline_demo: %s\n", why);
    if (rc == 0) rc = train_steps(o, eng);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    return rc < 0 ? 2 : rc;
}
