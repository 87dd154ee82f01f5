/* layers.h: the user-written layers of examples/custom_model, and the model made of them.
 *
 * Three layers written against include/troupe/model.h alone, as any embedder would write
 * them (docs/custom-layers.md is the guide): a fully connected layer with a bias, a tanh
 * activation and a mean-squared-error loss over float targets. my_mlp_create stacks them into
 * the 4 -> 32 -> 1 regression MLP that custom_model.c trains and that
 * tests/actors/test_custom_model.c checks against finite differences.
 * Each create function follows the model's ownership rule: *out is calloc'ed, and belongs to
 * the model once given to tr_model_create (which frees it, state included, also on failure);
 * on failure nothing is left allocated. Any thread.
 */
#ifndef MY_LAYERS_H
#define MY_LAYERS_H

#include <troupe.h>

/* in (B, T, C) -> out (B, T, OC) = in W^T + b; W (OC, C), b (OC). init: uniform in
 * +-1/sqrt(C) from the model's rng, as PyTorch's nn.Linear. TR_EINVAL for a size < 1. */
int my_linear_create(tr_layer_t **out, const char *name, int C, int OC);

/* in (B, T, C) -> out (B, T, C) = tanh(in). No parameters. */
int my_tanh_create(tr_layer_t **out, const char *name, int C);

/* predictions (B, T, D) and float targets y (B, T, D) -> losses (B, T): the mean over D of
 * (in - y)^2 per position; the loss is the mean over all B T D. A loss layer reading D floats
 * of target per position (tr_layer_set_loss(TR_TARGETS_FLOAT, D)). */
int my_mse_create(tr_layer_t **out, const char *name, int D);

/* The regression MLP C -> H -> 1: fc0 (my_linear C -> H), tanh0, fc1 (my_linear H -> 1),
 * loss (my_mse over 1 float). Parameters are 0 until tr_model_init_params (or the engine's
 * init_params). TR_EINVAL (with why, when why_len > 0) for a size < 1, TR_ENOMEM. */
int my_mlp_create(tr_model_t **out, int C, int H, char *why, size_t why_len);

#endif
