/* gpt_stages.h: the pipeline demo's GPT training through stage actors (gpt_stages.c). */
#ifndef PIPELINE_GPT_STAGES_H
#define PIPELINE_GPT_STAGES_H

typedef struct gpt_stages_opts {
    const char *data; /* an llm.c token shard (vocab 256: bytes) */
    int stages, micro_batches, steps;
    int layers, channels, B, T;
    float lr;
} gpt_stages_opts_t;

/* Trains and prints the loss; 0, 1 (training failed) or 2 (bad data). */
int gpt_stages_train(const gpt_stages_opts_t *o);

#endif
