/* Troupe models: a model is a list of layers over three contiguous buffers.
 *
 * A layer (tr_layer_t) declares its parameter tensors (a size table: name and shape of each),
 * how many activation floats it keeps for a batch of B sequences of T positions, and a
 * forward and a backward function. A model (tr_model_t) owns a list of layers and carves
 * three buffers from their size tables: parameters and gradients (layer after layer, so each
 * layer owns one contiguous range, which is what a gradient bucket or a pipeline stage
 * needs), and activations (each layer's region starts with its output, (B, T, out_dim)).
 * Layer i reads layer i-1's output; the first layer reads the batch (token ids or floats);
 * the last layer is a loss layer whose forward returns the mean loss, from integer targets
 * (class ids, e.g. cross-entropy) or float targets (y_dim floats per position, e.g. MSE), as
 * the layer declares (tr_layer_set_loss). Backward runs layer by layer, last to first, and a
 * callback hears as soon as each layer's gradient range is final.
 *
 * Letters used in shapes: B batch, T time, C channels, V vocabulary, Vp padded vocabulary,
 * L layers, NH heads, OC output channels.
 * Users add layers by filling a tr_layer_t (tr_layer_init, tr_layer_add_param) with their
 * own tr_layer_ops_t; docs/custom-layers.md is the guide. Math is fp32 on the CPU, but for the
 * linear layers' products in bf16 mixed precision (tr_model_set_bf16);
 * buffers carry a device.
 *
 * Ownership, in one place: a layer given to tr_model_create belongs to the model from that
 * call on, also when the call fails; the model frees it (ops->destroy, then free()) in
 * tr_model_destroy. So a user's tr_layer_t must come from malloc/calloc, and its state is
 * freed by its ops->destroy. The array of layer pointers stays the caller's.
 * Threads: every function here may be called from any thread, but a model is used by one
 * thread at a time; its kernels spread over the kernels' thread pool (and set OpenBLAS to one
 * thread per call, see kernels/cpu/linear.c).
 */
#ifndef TR_INCLUDE_TROUPE_MODEL_H
#define TR_INCLUDE_TROUPE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "troupe/blas.h"
#include "troupe/rng.h"
#include "troupe/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TR_PARAM_MAX_DIMS   4
#define TR_LAYER_MAX_PARAMS 16
#define TR_LAYER_NAME_MAX   32
/* Targets equal to this are skipped by the loss (PyTorch's default ignore_index). */
#define TR_IGNORE_INDEX (-100)

/* What targets a layer reads (tr_layer_t.targets): none (every layer but the loss), integer
 * class ids (B, T), or y_dim floats per position (B, T, y_dim). */
enum { TR_TARGETS_NONE = 0, TR_TARGETS_INT = 1, TR_TARGETS_FLOAT = 2 };

/* One parameter tensor of a layer: an entry of the size table. */
typedef struct {
    char name[TR_LAYER_NAME_MAX];
    int ndim;
    int64_t shape[TR_PARAM_MAX_DIMS];
    size_t numel;
    size_t offset; /* floats from the start of the layer's parameter range */
    int no_decay;  /* 1: the optimizer applies no weight decay to this tensor */
} tr_param_info_t;

typedef struct tr_layer tr_layer_t;

/* What a layer's forward/backward sees. The model fills everything; layers write only out,
 * acts, din, grads, scratch and loss. */
typedef struct {
    int B, T;
    const int *tokens;   /* (B, T) token ids of the batch, or NULL */
    const int *targets;  /* (B, T) integer targets of the batch, or NULL (forward without
                          * loss, or a model whose loss layer reads float targets) */
    const float *y;      /* (B, T, y_dim) float targets of the batch, or NULL (forward without
                          * loss, or a model whose loss layer reads integer targets) */
    int y_dim;           /* floats per position of y (the loss layer's y_dim), 0 without y */
    int training;        /* 1: a training forward/backward; 0: evaluation (tr_model_set_training).
                          * Layers that act differently (dropout) read it; backward may run in
                          * either mode */
    const float *in;     /* (B, T, in_dim): previous layer's output, or the batch's floats */
    float *acts;         /* this layer's activation region, act_size floats */
    float *out;          /* == acts: (B, T, out_dim) */
    float *params;       /* this layer's parameter range */
    float *grads;        /* this layer's gradient range (backward accumulates into it) */
    float *model_params; /* the whole model's buffers, for tied parameters */
    float *model_grads;
    const float *dout; /* backward: (B, T, out_dim) gradient of out; NULL for a loss layer */
    float *din;        /* backward: (B, T, in_dim), zeroed by the model; accumulate into it.
                        * NULL when the input is the batch (nothing needs its gradient) */
    float *scratch;    /* backward: scratch_size floats, contents undefined */
    float *stash;      /* a split backward (backward_input, backward_weight): stash_size
                        * floats kept for this micro-batch from the first part to the second */
    float loss;        /* loss layers: forward sets the mean loss */
    float loss_scale;  /* loss layers: backward multiplies d(mean loss) by this (1 = plain) */
    /* bf16 mixed precision (tr_model_set_bf16), else NULL: bf16 copies (the top halves of
     * fp32, rounded to nearest even) of this layer's parameter range and of the whole model's,
     * made from the fp32 parameters before the pass. A layer's matrix products may read them
     * (the built-in linear layers do); everything else stays fp32. */
    const uint16_t *params_bf16;
    const uint16_t *model_params_bf16;
} tr_layer_ctx_t;

typedef struct {
    const char *kind;
    /* floats of activations kept between forward and backward, output first */
    size_t (*act_size)(const tr_layer_t *layer, int B, int T);
    /* floats of temporary memory backward needs (0 if none) */
    size_t (*scratch_size)(const tr_layer_t *layer, int B, int T);
    /* 0 or a negative TR_E* code (a bad token id, a bad target) */
    int (*forward)(tr_layer_t *layer, tr_layer_ctx_t *ctx);
    int (*backward)(tr_layer_t *layer, tr_layer_ctx_t *ctx);
    /* fills the layer's parameters for training from scratch (may be NULL: they stay 0);
     * draw from rng with troupe/rng.h (tr_rng_uniform, tr_rng_normal, tr_rng_fill_*) */
    void (*init)(tr_layer_t *layer, float *params, uint64_t *rng);
    /* frees state; may be NULL */
    void (*destroy)(tr_layer_t *layer);
    /* Optional: backward split in two parts, for the zb pipeline schedule (NULL: not split;
     * zb then runs the whole backward as its input-gradient part). backward_input computes
     * din only (as backward, the parameter gradients untouched) and leaves in ctx->stash
     * (stash_size floats) what backward_weight needs to accumulate the parameter gradients
     * later, from the stash and the activations, which the micro-batch keeps until then.
     * Together they must add what backward adds. */
    size_t (*stash_size)(const tr_layer_t *layer, int B, int T);
    int (*backward_input)(tr_layer_t *layer, tr_layer_ctx_t *ctx);
    int (*backward_weight)(tr_layer_t *layer, tr_layer_ctx_t *ctx);
} tr_layer_ops_t;

struct tr_layer {
    const tr_layer_ops_t *ops;
    char name[TR_LAYER_NAME_MAX];
    int in_dim;  /* floats per position read (0: the layer reads token ids) */
    int out_dim; /* floats per position written (1 for a loss layer: the losses) */
    int is_loss; /* read-only: set by tr_layer_set_loss */
    int targets; /* read-only: TR_TARGETS_* the layer reads, set by tr_layer_set_loss */
    int y_dim;   /* read-only: floats per position of its float targets (TR_TARGETS_FLOAT) */
    int classes; /* TR_TARGETS_INT: targets are 0..classes-1 or ignore_index (0: unchecked) */
    int ignore_index;
    int n_params;
    tr_param_info_t params[TR_LAYER_MAX_PARAMS];
    size_t param_count;  /* floats in the layer's range (the sum of the table) */
    size_t param_offset; /* set by the model: the range's start in the model's buffer */
    void *state;         /* the layer's own configuration */
    /* A tensor of another layer this one reads through ctx->model_params and accumulates into
     * through ctx->model_grads (GPT-2's head: the embedding's wte), declared with
     * tr_layer_tie_param; set by the model: its range in the model's buffers (count 0: none) */
    int tie_layer;
    char tie_param[TR_LAYER_NAME_MAX];
    size_t tie_offset, tie_count;
};

/* Sets up a layer with no parameters yet (not a loss layer, reads no targets). The layer
 * memory is the caller's until tr_model_create takes it: allocate it with malloc/calloc, since
 * the model free()s it; state becomes the layer's (ops->destroy frees it, if anything must).
 * TR_EINVAL for a NULL layer, ops or name, an over-long name, in_dim < 0 or out_dim < 1; the
 * layer and state are untouched then. Any thread. */
int tr_layer_init(tr_layer_t *layer, const tr_layer_ops_t *ops, const char *name, int in_dim,
                  int out_dim, void *state);

/* Appends a parameter tensor to the layer's size table. Its weight decay follows the GPT-2 /
 * PyTorch recipe: a tensor of ndim >= 2 (a matrix, an embedding) is decayed, one of ndim 1 (a
 * bias, a LayerNorm weight) is not (no_decay = 1); tr_layer_set_param_no_decay changes it.
 * TR_EINVAL for a bad shape or name, TR_ENOSPC past TR_LAYER_MAX_PARAMS. Any thread. */
int tr_layer_add_param(tr_layer_t *layer, const char *name, int ndim, const int64_t *shape);

/* Sets the no_decay flag of the layer's parameter named name (1: the optimizer applies no
 * weight decay to it). Before tr_model_create. TR_EINVAL for a NULL layer or name, or no
 * parameter of that name. Any thread. */
int tr_layer_set_param_no_decay(tr_layer_t *layer, const char *name, int no_decay);

/* Declares that the layer uses parameter `param` of layer `owner` (its index in the model):
 * it reads it through ctx->model_params + layer->tie_offset and accumulates its gradient
 * through ctx->model_grads + tie_offset. A pipeline stage that holds the layer but not its
 * owner keeps that gradient apart and adds it to the owner's at ReduceTiedGrads. Resolved by
 * tr_model_create (TR_EINVAL there when the owner or its parameter is missing). TR_EINVAL for
 * a NULL layer or param, an over-long name, owner < 0. Any thread. */
int tr_layer_tie_param(tr_layer_t *layer, int owner, const char *param);

/* The layer's parameter named name, or NULL. */
const tr_param_info_t *tr_layer_find_param(const tr_layer_t *layer, const char *name);

/* Marks the layer as a loss layer that reads targets of the given kind: TR_TARGETS_INT (class
 * ids; y_dim must be 0) or TR_TARGETS_FLOAT (y_dim >= 1 floats per position). A loss layer's
 * forward sets ctx->loss (the mean) when the targets are there and its backward starts the
 * gradient (dout is NULL). TR_EINVAL for another kind or a y_dim that does not fit it. Any
 * thread. */
int tr_layer_set_loss(tr_layer_t *layer, int targets, int y_dim);

/* ---- built-in layers ---------------------------------------------------------------------
 * Each allocates *out (malloc'ed: give it to tr_model_create, which then owns it); on failure
 * nothing is left allocated and *out is not a layer. TR_EINVAL for a size < 1 or a bad name,
 * TR_ENOMEM. Any thread. Weight decay: matrices decayed, vectors not (tr_layer_add_param). */

/* inp (B, T, C) -> (B, T, OC); weight (OC, C), bias (OC) when with_bias. */
int tr_layer_linear_create(tr_layer_t **out, const char *name, int C, int OC, int with_bias);
/* (B, T, C) -> (B, T, C), elementwise */
int tr_layer_gelu_create(tr_layer_t **out, const char *name, int C);
/* (B, T, C) -> (B, T, C); weight, bias (C) */
int tr_layer_layernorm_create(tr_layer_t **out, const char *name, int C);
/* token ids (B, T) -> (B, T, C); wte (V, C), wpe (maxT, C) when maxT > 0 */
int tr_layer_embedding_create(tr_layer_t **out, const char *name, int V, int maxT, int C);
/* logits (B, T, V) and integer targets (B, T) -> losses (B, T), mean over targets !=
 * ignore_index. A TR_TARGETS_INT loss layer. */
int tr_layer_crossentropy_create(tr_layer_t **out, const char *name, int V, int ignore_index);
/* predictions (B, T, dim) and float targets y (B, T, dim) -> losses (B, T) (the mean over dim
 * of (in - y)^2 per position); the loss is the mean of (in - y)^2 over all B T dim floats, as
 * PyTorch's MSELoss(reduction="mean"). A TR_TARGETS_FLOAT loss layer with y_dim = dim. */
int tr_layer_mse_create(tr_layer_t **out, const char *name, int dim);

/* ---- models -------------------------------------------------------------------------------- */

typedef struct tr_model tr_model_t;

/* Called during backward as soon as layer's gradient range [offset, offset + count) of the
 * model's gradient buffer is final. Return nonzero to stop backward (it returns TR_ECANCELED). */
typedef int (*tr_model_grad_cb)(tr_model_t *model, int layer, size_t offset, size_t count,
                                void *arg);

/* A batch: B sequences of T positions; tokens or x (floats, (B, T, in_dim) of layer 0), and
 * the targets the model's loss layer reads (tr_model_targets): integer targets or float y.
 * Without them forward computes no loss and backward is refused; the other kind is refused. */
typedef struct {
    int B, T;
    const int *tokens;  /* (B, T) or NULL */
    const float *x;     /* (B, T, in_dim) or NULL */
    const int *targets; /* (B, T) integer targets, or NULL */
    const float *y;     /* (B, T, y_dim) float targets, or NULL */
    int y_dim;          /* floats per position of y: the loss layer's y_dim */
} tr_batch_t;

/* Builds a model from n layers (made by the create functions above, or by the user with
 * malloc/calloc and tr_layer_init) and allocates parameters and gradients (zeroed).
 * Ownership: every layers[i] becomes the model's in this call, ALSO ON FAILURE (then they are
 * freed here: ops->destroy, then free()); do not touch or free them afterwards. The array
 * itself stays the caller's. Consecutive layers must agree: layer i's in_dim == layer i-1's
 * out_dim; only the last layer may be a loss layer, and a loss layer must be marked with
 * tr_layer_set_loss. TR_EINVAL (with why filled in when why != NULL) otherwise, TR_ENOMEM.
 * The model starts in training mode. Any thread. */
int tr_model_create(tr_model_t **out, tr_layer_t **layers, int n, char *why, size_t why_len);
/* Frees the model and its layers (each: ops->destroy when not NULL, then free()). NULL does
 * nothing. Any thread, not while another call on the model runs. */
void tr_model_destroy(tr_model_t *model);

/* GPT-2 as llm.c builds it. padded_vocab_size 0 = vocab_size rounded up to a multiple of 128. */
typedef struct {
    int max_seq_len;       /* maxT */
    int vocab_size;        /* V */
    int padded_vocab_size; /* Vp */
    int num_layers;        /* L */
    int num_heads;         /* NH */
    int channels;          /* C */
} tr_gpt2_config_t;

/* Layers: "embed" (wte (Vp, C), wpe (maxT, C)), "h0".."h{L-1}" (one transformer block each,
 * parameters in llm.c's per-layer order ln1w ln1b qkvw qkvb attprojw attprojb ln2w ln2b fcw
 * fcb fcprojw fcprojb), "head" (lnfw, lnfb; the output projection is wte, tied). Parameters
 * are zero until tr_model_init_params or a checkpoint load. TR_EINVAL with why on a bad
 * config (C % NH != 0, Vp < V, a size <= 0). */
int tr_model_gpt2_create(tr_model_t **out, const tr_gpt2_config_t *config, char *why,
                         size_t why_len);
/* The config of a model made by tr_model_gpt2_create; NULL for another model. */
const tr_gpt2_config_t *tr_model_gpt2_config(const tr_model_t *model);

/* After a forward: (B, T, Vp) logits when the batch had no targets, probabilities (the
 * softmax over the first V, padding 0) when it had. NULL for another model or before. */
const float *tr_model_gpt2_logits(const tr_model_t *model);

/* An MLP classifier: widths[0] inputs, linear (with bias) + GELU between consecutive widths,
 * no GELU after the last linear, then cross-entropy over widths[n-1] classes. n >= 2.
 * Weights are decayed, biases not. */
int tr_model_mlp_create(tr_model_t **out, const int *widths, int n, char *why, size_t why_len);

/* Fills parameters for training from scratch: each layer's init in layer order, all drawing
 * from one tr_rng state seeded with seed (deterministic per seed). */
void tr_model_init_params(tr_model_t *model, uint64_t seed);

/* Fills the parameters of the layers with keep[i] != 0 (keep: one flag per layer) with exactly
 * the values tr_model_init_params(model, seed) gives them, touching no other layer's
 * parameters: a layer before the last kept one that is not kept runs its init into a scratch
 * area (as large as the largest such layer, freed before return) only to advance the random
 * state as the whole init does; the layers after the last kept one do not run. For a pipeline
 * stage that holds only its layers (and the tied tensors they use). TR_ENOMEM for the
 * scratch. The model's thread. */
int tr_model_init_params_layers(tr_model_t *model, uint64_t seed, const unsigned char *keep);
/* tr_model_init_params's values, layer by layer, calling done(arg, i) (if not NULL) once layer
 * i's parameters are written and before the next layer's: a caller that keeps only part of
 * each layer (ZeRO 3's slice) hands the rest back at once, so the whole model is never
 * resident. Makes no bf16 copies: tr_model_params_changed_range makes those of a range. */
void tr_model_init_params_each(tr_model_t *model, uint64_t seed, void (*done)(void *arg, int layer),
                               void *arg);
/* tr_model_params_changed for the floats [offset, offset + count) only (nothing outside bf16
 * mixed precision, or for a range outside the model). */
void tr_model_params_changed_range(tr_model_t *model, size_t offset, size_t count);

/* The targets the model's loss layer reads: TR_TARGETS_INT, TR_TARGETS_FLOAT (then *y_dim,
 * when y_dim != NULL, gets its floats per position; 0 otherwise) or TR_TARGETS_NONE when the
 * last layer is not a loss layer. For checking a dataset against the model. Any thread. */
int tr_model_targets(const tr_model_t *model, int *y_dim);

/* Training (1, the default) or evaluation (0) mode: every later forward/backward hands it to
 * the layers as ctx->training. Set 1 before training micro-batches, 0 before evaluation. */
void tr_model_set_training(tr_model_t *model, int training);

/* bf16 mixed precision, DeepSpeed's "bf16": the parameters, gradients and optimizer stay fp32;
 * the linear layers' matrix products read bf16 copies of the weights and of their inputs and
 * accumulate in fp32 (oneDNN's AVX512-BF16 kernels; on CPUs without AVX512-BF16 the same
 * numbers, emulated in fp32 and no faster). on = 0 turns it off (the default). 0, or TR_ENOMEM
 * (the model unchanged). The copies are made from the parameters now, and again by
 * tr_model_params_changed (and tr_model_init_params): whoever writes the parameters (an
 * optimizer step, a load) calls it afterwards, before the next pass. */
int tr_model_set_bf16(tr_model_t *model, int on);
int tr_model_bf16(const tr_model_t *model);
void tr_model_params_changed(tr_model_t *model);
int tr_model_training(const tr_model_t *model);

/* Forward over all layers; with targets, *loss (may be NULL) gets the mean loss. Allocates
 * activations for (B, T) when they change. TR_EINVAL for a batch that does not fit (T larger
 * than the model's context, missing tokens/x, a bad token or target id, integer targets for a
 * loss layer that reads float ones or the reverse, a y_dim other than the loss layer's),
 * TR_ENOMEM; tr_model_error says why. */
int tr_model_forward(tr_model_t *model, const tr_batch_t *batch, float *loss);

/* Backward over all layers after a forward with targets, last to first, accumulating into
 * the gradients; cb (may be NULL) hears each layer's range as it becomes final. TR_EINVAL
 * when the batch had no targets or the last layer is not a loss layer; tr_model_error says
 * why. */
int tr_model_backward(tr_model_t *model, tr_model_grad_cb cb, void *arg);

/* Why the last model call that returned an error failed (which field, layer and value): ""
 * before any error. Valid until the next failing call. */
const char *tr_model_error(const tr_model_t *model);

/* One layer at a time, for executors and pipeline stages (layers [first, last] of a stage):
 * tr_model_layer_forward(i) needs layers < i done on the same batch; tr_model_layer_backward
 * (i) needs layers > i done. tr_model_forward/backward are loops over these. Errors as theirs,
 * with tr_model_error naming the layer (a layer's own failure: its name and the code). */
int tr_model_layer_forward(tr_model_t *model, int layer, const tr_batch_t *batch);
int tr_model_layer_backward(tr_model_t *model, int layer);

/* ---- stages: a model cut for pipeline parallelism ------------------------------------------
 * A stage is layers [first, last] of a model with `slots` activation slots, one per
 * micro-batch in flight (a pipeline schedule's buffers), each for batches of (B, T). A stage's
 * forward reads the previous stage's output (or, for the first stage, the batch) and keeps its
 * activations in the slot until that slot's backward, which reads the gradient of its output
 * (the next stage's din; nothing for the stage ending in the loss) and gives the gradient of
 * its input. Gradients accumulate into the model's buffer (each stage only its own layers'
 * range), except a tied tensor owned outside the stage (tr_layer_tie_param), which the stage
 * keeps apart until tr_model_stage_reduce_tied. Several stages of one model may run at once,
 * each on its own thread; one stage is used by one thread at a time. */

typedef struct tr_model_stage tr_model_stage_t;

/* TR_EINVAL with why (a bad range, slots < 1, B or T < 1), TR_ENOMEM. Any thread. */
int tr_model_stage_create(tr_model_stage_t **out, tr_model_t *model, int first, int last, int slots,
                          int B, int T, char *why, size_t why_len);
void tr_model_stage_destroy(tr_model_stage_t *stage);

/* Floats of the stage's input (B T in_dim of its first layer; 0 when it reads the batch) and
 * of its output (B T out_dim of its last layer). */
size_t tr_model_stage_input_floats(const tr_model_stage_t *stage);
size_t tr_model_stage_output_floats(const tr_model_stage_t *stage);
/* The activation floats the stage holds: its slots' and (checkpointed) its work area's. */
size_t tr_model_stage_activation_floats(const tr_model_stage_t *stage);

/* Forward of one micro-batch into slot: the first stage reads the batch's tokens or x, the
 * stage with the loss its targets (*loss gets the mean); the others read `in` (the previous
 * stage's output, input_floats floats, copied). Errors as tr_model_forward's, with
 * tr_model_stage_error naming the layer. */
int tr_model_stage_forward(tr_model_stage_t *stage, int slot, const tr_batch_t *batch,
                           const float *in, float *loss);
/* Slot's output after its forward (output_floats floats; valid until the slot's next
 * forward). */
const float *tr_model_stage_output(const tr_model_stage_t *stage, int slot);
/* Backward of slot's micro-batch: dout is the gradient of the stage's output (ignored by the
 * stage with the loss); *din (may be NULL) gets the gradient of its input (input_floats
 * floats, valid until the stage's next backward; NULL for the first stage). */
int tr_model_stage_backward(tr_model_stage_t *stage, int slot, const float *dout,
                            const float **din);
/* The backward split in two (the zb schedule's BackwardInput and BackwardWeight): the input
 * part gives *din as tr_model_stage_backward does and leaves each splitting layer's stash in
 * the slot (a layer without backward_input/backward_weight runs its whole backward here); the
 * weight part, later, accumulates those layers' parameter gradients. Together they add what
 * tr_model_stage_backward adds. With activation checkpointing nothing splits (the weights'
 * part would need activations a recompute overwrites). */
int tr_model_stage_backward_input(tr_model_stage_t *stage, int slot, const float *dout,
                                  const float **din);
int tr_model_stage_backward_weight(tr_model_stage_t *stage, int slot);
/* 1 when some layer of the stage splits its backward (tr_model_stage_backward_input leaves
 * work for tr_model_stage_backward_weight), else 0. */
int tr_model_stage_splits(const tr_model_stage_t *stage);
/* Adds the tied gradients this stage kept apart into the owners' ranges and zeroes them
 * (DeepSpeed's ReduceTiedGrads in one process; no-op without ties). Call when no stage of the
 * model is in backward. */
void tr_model_stage_reduce_tied(tr_model_stage_t *stage);
/* Drops the tied gradients kept apart (a batch that failed). */
void tr_model_stage_zero_tied(tr_model_stage_t *stage);
/* The gradients of tied tensors owned outside the stage, kept apart, indexed as the model's
 * buffer (only the tied ranges hold anything); NULL when the stage has none. For a pipeline
 * across ranks, which reduces them with the owner's stage itself. */
float *tr_model_stage_tied(tr_model_stage_t *stage);
const char *tr_model_stage_error(const tr_model_stage_t *stage);

/* Activation checkpointing (DeepSpeed's pipeline.activation_checkpoint_interval, here for
 * any model): the layers in groups of `layers`; a forward keeps only each group's output, in
 * one work area for the group's activations, and the backward recomputes a group's forward
 * from its kept input before going through it (the last group's activations are still there).
 * The gradients are bitwise the same; the activations take the groups' outputs plus the
 * largest group's (tr_model_num_acts), for a forward of every layer but the last group's
 * again per micro-batch (tr_model_checkpoint_recomputed). 0: off. Takes effect at the next
 * forward (the activations are laid out again); a layer's output (tr_model_output) stays
 * readable until any group is computed again — a backward recomputes them, so read outputs
 * (GPT-2's logits) before it — and a group's last layer's until the next forward. The
 * recompute assumes a layer's forward depends only on its input and parameters (no dropout).
 * TR_EINVAL for layers < 0. */
int tr_model_set_checkpoint_interval(tr_model_t *model, int layers);
/* The activation floats a forward of (B, T) lays out under the current setting. */
size_t tr_model_acts_floats(const tr_model_t *model, int B, int T);
/* The interval set (0: off). Pipeline stages (tr_model_stage_create) use it too, counting
 * groups from each stage's first layer, as DeepSpeed's activation_checkpoint_interval does in
 * a PipelineModule; a stage keeps each group's output per slot and recomputes every group,
 * the last included, in the slot's backward. */
int tr_model_checkpoint_interval(const tr_model_t *model);
/* The layers whose forward a checkpointed backward runs again (0 when off). */
size_t tr_model_checkpoint_recomputed(const tr_model_t *model);

/* Zeroes the gradient buffer. */
void tr_model_zero_grad(tr_model_t *model);

/* Introspection: buffers and the size tables. Pointers stay valid until destroy (acts: until
 * the next forward with a different B or T). The parameter and gradient buffers are mapped
 * whole but cost memory only where they have been written: the engine at ZeRO 2 hands a
 * reduced gradient range's pages back, and a pipeline stage writes only its own layers. */
int tr_model_num_layers(const tr_model_t *model);
tr_layer_t *tr_model_layer(const tr_model_t *model, int i);
float *tr_model_params(const tr_model_t *model);
float *tr_model_grads(const tr_model_t *model);
size_t tr_model_num_params(const tr_model_t *model);
size_t tr_model_num_acts(const tr_model_t *model); /* for the current (B, T); 0 before */
const float *tr_model_output(const tr_model_t *model, int layer); /* layer's (B, T, out_dim) */
tr_device_t tr_model_device(const tr_model_t *model);
/* The (B, T) of the activations (0, 0 before the first forward). */
void tr_model_batch_shape(const tr_model_t *model, int *B, int *T);
/* The mean loss of the last forward with targets (set by the loss layer). */
float tr_model_loss(const tr_model_t *model);

/* Multiplies the loss gradient (default 1; a loss scaler sets it). */
void tr_model_set_loss_scale(tr_model_t *model, float scale);

#ifdef __cplusplus
}
#endif
#endif
