/* optimizer_internal.h: the optimizer actor's state, shared by optimizer.c (its messages: the
 * step, ZeRO's reductions, the NVMe sub-group pipeline, checkpoints) and optimizer_setup.c
 * (its set-up from the config, spawn and free, and its checkpointed scalars). Nothing outside
 * the optimizer includes this. */
#ifndef TR_ACTORS_OPTIM_OPTIMIZER_INTERNAL_H
#define TR_ACTORS_OPTIM_OPTIMIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/engine/plan.h"
#include "actors/optim/optim.h"
#include "base/fifo.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/lamb.h"
#include "kernels/cpu/lion.h"
#include "kernels/cpu/loss_scaler.h"
#include "kernels/cpu/lr_schedule.h"
#include "kernels/cpu/sgd.h"

/* plan.swap_grads: a reduced part at the swapper; its range of the gradient buffer goes back
 * to the executor when the swapper answers. */
struct tr__gput {
    size_t first, covers;
};

/* A run of parameters that share a weight-decay rule (tr_param_info_t.no_decay). */
typedef struct decay_range {
    size_t at, n;
    bool decay;
} decay_range_t;

struct tr__optim {
    const tr__plan_t *eng;
    float *params, *grads; /* the registered buffers, resolved once */
    float *home; /* offload_param cpu: the partition's home (hi - lo floats), where the step
                  * writes the parameters; NULL: they are in `params` */
    uint64_t global_steps, skipped_steps; /* the optimizer's own counters */
    int type;    /* tr_config_optimizer_type_t, as configured (checkpoints record it) */
    int runs_as; /* the kernel that runs it: OneBitAdam runs as Adam, ... */
    tr_adam_opts_t adam;
    bool amsgrad;
    tr_sgd_opts_t sgd;
    tr_lamb_opts_t lamb;
    tr_lion_opts_t lion;
    tr_adam_state_t st;    /* step count and beta powers (Adam, Lamb) */
    float *m, *v;          /* moments; SGD and Lion use m as their momentum buffer */
    float *vmax;           /* AMSGrad's running maximum of v */
    decay_range_t *ranges; /* the parameters in order, cut where no_decay changes */
    int n_ranges;
    bool fp16;
    tr_loss_scaler_t scaler;
    bool has_schedule;
    tr_lr_schedule_opts_t sched;
    int64_t sched_steps; /* scheduler steps taken (DeepSpeed's last_batch_iteration + 1) */
    double base_lr, clip;
    int n_arrays;          /* moment arrays a checkpoint holds: m, then v, in one block */
    size_t lo, hi;         /* the parameters this rank updates (ZeRO 1, 2: its slice; else all) */
    size_t slice;          /* floats per rank's slice (the last may be shorter) */
    bool partitioned;      /* ZeRO 1, 2 on several ranks: slices all-gathered after a step */
    float *gpart;          /* ZeRO 2: the reduced gradients of [lo, hi), summed over micro-steps */
    bool gswap;            /* plan.swap_grads: they go to the swapper's file instead (gpart NULL) */
    double gsumsq;         /* then: the squared norm of the parts sent this step */
    tr__fifo_t gputs;      /* then: parts at the swapper (struct tr__gput), in order */
    int norm_waits;        /* ZeRO 2: the overflow and norm all-reduces still to come back */
    bool overflow_any;     /* ZeRO 2: a rank's partition held Inf or NaN */
    double *lamb_sums;     /* Lamb: per tensor, the sums of p² and u² over this rank's piece */
    uint64_t lamb_sums_id; /* their registry id (partitioned: all-reduced over the ranks) */
    tr_msg_t *held;        /* the STEP_DONE waiting for the comm actor: Lamb's norms, then
                            * ZeRO's all-gather (ask_comm) */
    uint64_t moments_id;   /* the block's registry id */
    size_t locked_bytes;   /* offload_optimizer device cpu with pin_memory: mlock'ed */
    /* NVMe offload (offload_optimizer.device nvme): the moments live in the swapper's file,
     * o->m is NULL, and a step, save or restore runs the sub-group pipeline (swap_run). Between
     * runs the first n_bufs sub-groups are read ahead (RUN_PREFETCH) during the forward and
     * backward; the next run takes them over */
    bool swaps;
    bool swap_step; /* update() left the moments' part of the step to the pipeline */
    float swap_mul; /* its combined unscale-and-clip factor */
    struct swap_run {
        int mode;          /* RUN_STEP, RUN_SAVE, RUN_RESTORE; 0: none */
        size_t next, done; /* sub-groups started, finished */
        float *stage;      /* RUN_SAVE: into this block; RUN_RESTORE: from it (m, v, vmax) */
        tr_msg_t *held;    /* the STEP_DONE or ENGINE_STATE sent when the run ends (a step's
                            * STEP_DONE: once every sub-group is stepped, before the last
                            * write-backs end: they overlap the next forward) */
        size_t stepped;    /* RUN_STEP: sub-groups stepped */
        uint64_t ready;    /* RUN_PREFETCH: the buffers (bit b) whose read is back */
        size_t group_of[TR__MAX_SWAP_BUFS]; /* RUN_PREFETCH: the sub-group each buffer holds */
    } run;
    struct { /* a run asked for while the last one's write-backs go on */
        int mode;
        float *stage;
        tr_msg_t *held;
    } queued;
    float *save_stage; /* a save's copy of the moments, until the next step (registered) */
    uint64_t save_stage_id;
    /* the step being assembled */
    double sumsq;
    size_t covered;
};

/* Registers a CPU buffer the optimizer owns (name, dtype, lifetime: troupe/buffer.h). */
int tr__optimizer_register(tr__optim_t *o, const char *name, void *base, size_t bytes, int dtype,
                           int lifetime, uint64_t *id);

/* The actor's behaviour (optimizer.c), for the spawn (optimizer_setup.c). */
int tr__optimizer_behaviour(tr_ctx_t *ctx, tr_msg_t *msg);

/* The state checkpoints save and restore, as a msgpack map (on the optimizer's thread: it
 * packs into an ENGINE_STATE's bytes, and unpacks from them). */
int tr__optimizer_state_pack(const tr__optim_t *o, void *pk); /* a msgpack_packer * */
int tr__optimizer_state_unpack(tr__optim_t *o, const void *obj, char *err, size_t errlen);

#endif
