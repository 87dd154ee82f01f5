/* Troupe models: a model is a list of layers over three contiguous buffers.
 *
 * A layer (tr_layer_t) declares its parameter tensors (a size table: name and shape of each),
 * how many activation floats it keeps for a batch of B sequences of T positions, and a
 * forward and a backward function. A model (tr_model_t) owns a list of layers and carves
 * three buffers from their size tables: parameters and gradients (layer after layer, so each
 * layer owns one contiguous range, which is what a gradient bucket or a pipeline stage
 * needs), and activations (each layer's region starts with its output, (B, T, out_dim)).
 * Layer i reads layer i-1's output; the first layer reads the batch (token ids or floats);
 * the last layer is a loss layer whose forward returns the mean loss. Backward runs layer by
 * layer, last to first, and a callback hears as soon as each layer's gradient range is final.
 *
 * Letters used in shapes: B batch, T time, C channels, V vocabulary, Vp padded vocabulary,
 * L layers, NH heads, OC output channels.
 * Users add layers by filling a tr_layer_t (tr_layer_init, tr_layer_add_param) with their
 * own tr_layer_ops_t. All math is fp32 on the CPU for now; buffers carry a device.
 * Threads: every function here may be called from any thread, but a model is used by one
 * thread at a time; its kernels spread over the kernels' thread pool (and set OpenBLAS to one
 * thread per call, see kernels/cpu/linear.c).
 */
#ifndef TR_INCLUDE_TROUPE_MODEL_H
#define TR_INCLUDE_TROUPE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "troupe/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TR_PARAM_MAX_DIMS   4
#define TR_LAYER_MAX_PARAMS 16
#define TR_LAYER_NAME_MAX   32
/* Targets equal to this are skipped by the loss (PyTorch's default ignore_index). */
#define TR_IGNORE_INDEX (-100)

/* One parameter tensor of a layer: an entry of the size table. */
typedef struct {
    char name[TR_LAYER_NAME_MAX];
    int ndim;
    int64_t shape[TR_PARAM_MAX_DIMS];
    size_t numel;
    size_t offset; /* floats from the start of the layer's parameter range */
    int no_decay; /* 1: the optimizer applies no weight decay to this tensor */
} tr_param_info_t;

typedef struct tr_layer tr_layer_t;

/* What a layer's forward/backward sees. The model fills everything; layers write only out,
 * acts, din, grads, scratch and loss. */
typedef struct {
    int B, T;
    const int *tokens;   /* (B, T) token ids of the batch, or NULL */
    const int *targets;  /* (B, T) targets of the batch, or NULL (forward without loss) */
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
    float loss;        /* loss layers: forward sets the mean loss */
    float loss_scale;  /* loss layers: backward multiplies d(mean loss) by this (1 = plain) */
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
    /* fills the layer's parameters for training from scratch; rng is a splitmix64 state */
    void (*init)(tr_layer_t *layer, float *params, uint64_t *rng);
    /* frees state; may be NULL */
    void (*destroy)(tr_layer_t *layer);
} tr_layer_ops_t;

struct tr_layer {
    const tr_layer_ops_t *ops;
    char name[TR_LAYER_NAME_MAX];
    int in_dim;  /* floats per position read (0: the layer reads token ids) */
    int out_dim; /* floats per position written (1 for a loss layer: the losses) */
    int is_loss;
    int n_params;
    tr_param_info_t params[TR_LAYER_MAX_PARAMS];
    size_t param_count;  /* floats in the layer's range (the sum of the table) */
    size_t param_offset; /* set by the model: the range's start in the model's buffer */
    void *state;         /* the layer's own configuration */
};

/* Sets up a layer with no parameters yet. TR_EINVAL for a NULL ops or an over-long name. */
int tr_layer_init(tr_layer_t *layer, const tr_layer_ops_t *ops, const char *name, int in_dim,
                  int out_dim, void *state);

/* Appends a parameter tensor to the layer's size table. TR_EINVAL for a bad shape, TR_ENOSPC
 * past TR_LAYER_MAX_PARAMS. */
int tr_layer_add_param(tr_layer_t *layer, const char *name, int ndim, const int64_t *shape);

/* The layer's parameter named name, or NULL. */
const tr_param_info_t *tr_layer_find_param(const tr_layer_t *layer, const char *name);

/* ---- built-in layers: each allocates a layer the model will own -------------------------- */

/* inp (B, T, C) -> (B, T, OC); weight (OC, C), bias (OC) when with_bias. */
int tr_layer_linear_create(tr_layer_t **out, const char *name, int C, int OC, int with_bias);
/* (B, T, C) -> (B, T, C), elementwise */
int tr_layer_gelu_create(tr_layer_t **out, const char *name, int C);
/* (B, T, C) -> (B, T, C); weight, bias (C) */
int tr_layer_layernorm_create(tr_layer_t **out, const char *name, int C);
/* token ids (B, T) -> (B, T, C); wte (V, C), wpe (maxT, C) when maxT > 0 */
int tr_layer_embedding_create(tr_layer_t **out, const char *name, int V, int maxT, int C);
/* logits (B, T, V) and targets -> losses (B, T), mean over targets != ignore_index */
int tr_layer_crossentropy_create(tr_layer_t **out, const char *name, int V, int ignore_index);

/* ---- models -------------------------------------------------------------------------------- */

typedef struct tr_model tr_model_t;

/* Called during backward as soon as layer's gradient range [offset, offset + count) of the
 * model's gradient buffer is final. Return nonzero to stop backward (it returns TR_ECANCELED). */
typedef int (*tr_model_grad_cb)(tr_model_t *model, int layer, size_t offset, size_t count,
                                void *arg);

/* A batch: B sequences of T positions; tokens or x (floats, (B, T, in_dim) of layer 0). */
typedef struct {
    int B, T;
    const int *tokens;  /* (B, T) or NULL */
    const float *x;     /* (B, T, in_dim) or NULL */
    const int *targets; /* (B, T) or NULL: forward computes no loss, backward is refused */
} tr_batch_t;

/* Builds a model from n layers (made by the create functions above, or by the user with
 * malloc and tr_layer_init) and allocates parameters and gradients (zeroed). The layers
 * always become the model's: on failure they are freed, the array itself stays the caller's.
 * Consecutive layers must agree: layer i's in_dim == layer i-1's out_dim; only the last layer may
 * be a loss layer. TR_EINVAL (with why filled in when why != NULL) otherwise, TR_ENOMEM. Any
 * thread. */
int tr_model_create(tr_model_t **out, tr_layer_t **layers, int n, char *why, size_t why_len);
/* Frees the model and its layers. NULL does nothing. */
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
 * no GELU after the last linear, then cross-entropy over widths[n-1] classes. n >= 2. */
int tr_model_mlp_create(tr_model_t **out, const int *widths, int n, char *why, size_t why_len);

/* Fills parameters for training from scratch (each layer's init; deterministic per seed). */
void tr_model_init_params(tr_model_t *model, uint64_t seed);

/* Forward over all layers; with targets, *loss (may be NULL) gets the mean loss. Allocates
 * activations for (B, T) when they change. TR_EINVAL for a batch that does not fit (T larger
 * than the model's context, missing tokens/x, a bad token or target id), TR_ENOMEM. */
int tr_model_forward(tr_model_t *model, const tr_batch_t *batch, float *loss);

/* Backward over all layers after a forward with targets, last to first, accumulating into
 * the gradients; cb (may be NULL) hears each layer's range as it becomes final. TR_EINVAL
 * when the batch had no targets or the last layer is not a loss layer. */
int tr_model_backward(tr_model_t *model, tr_model_grad_cb cb, void *arg);

/* One layer at a time, for executors and pipeline stages (layers [first, last] of a stage):
 * tr_model_layer_forward(i) needs layers < i done on the same batch; tr_model_layer_backward
 * (i) needs layers > i done. tr_model_forward/backward are loops over these. */
int tr_model_layer_forward(tr_model_t *model, int layer, const tr_batch_t *batch);
int tr_model_layer_backward(tr_model_t *model, int layer);

/* Sets how many threads the CPU kernels use, the caller included (0 = online cores). Takes
 * effect at the next forward or backward; not while one runs. Process-wide. */
void tr_kernels_set_threads(int n);

/* Zeroes the gradient buffer. */
void tr_model_zero_grad(tr_model_t *model);

/* Introspection: buffers and the size tables. Pointers stay valid until destroy (acts: until
 * the next forward with a different B or T). */
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
