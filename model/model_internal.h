/* model_internal: what the model files share that users do not see.
 *
 * A fill helper for initialisers (the random ones are public: troupe/rng.h), the helper that
 * formats a "why" message, and the GPT-2 constructor's hook into the model.
 */
#ifndef TR_MODEL_MODEL_INTERNAL_H
#define TR_MODEL_MODEL_INTERNAL_H

#include <stdint.h>

#include "troupe/model.h"

/* n floats = value. */
void tr__fill(float *x, size_t n, float value);

/* Frees a layer made by a create function (ops->destroy, then the layer). */
void tr__layer_free(tr_layer_t *layer);

/* Makes an embedding layer refuse token ids >= V (its table may have more, padded, rows). */
void tr__layer_embedding_limit(tr_layer_t *layer, int V);

/* The floats of the scratch area and of each boundary-gradient buffer that a forward and
 * backward of layers [first, last] at (B, T) need (at least 1 each): the model's, a stage's. */
void tr__model_pass_floats(const tr_model_t *model, int first, int last, int B, int T,
                           size_t *scratch, size_t *dbuf);

/* The multiplier a loss layer's backward applies (tr_model_set_loss_scale). */
float tr__model_loss_scale(const tr_model_t *model);

/* The bf16 copies of the parameters; NULL when the model computes in fp32 (tr_model_set_bf16). */
const uint16_t *tr__model_params_bf16(const tr_model_t *model);

/* A batch's integer targets (B x T) against the loss layer's classes (a target is one of them
 * or the layer's ignore index): 0, or TR_EINVAL with why naming the value, its batch index and
 * position, and the classes. The whole model and a pipeline's last stage check before the
 * forward. */
int tr__layer_check_targets(const tr_layer_t *loss, const int *targets, int B, int T, char *why,
                            size_t whylen);

/* Records the GPT-2 config on a model tr_model_gpt2_create built. */
void tr__model_set_gpt2(tr_model_t *model, const tr_gpt2_config_t *config);

#endif
