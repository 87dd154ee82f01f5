/* engine_internal.h: the engine as engine/'s own files see it (engine.c, setup_check.c): the
 * actors' view (tr__plan_t, plan.h) and what only the assembler holds: the owning pointers,
 * each actor's state (to free at destroy), the memory figures the spawns returned and the
 * caller's side. No actor includes this.
 */
#ifndef TR_ACTORS_ENGINE_ENGINE_INTERNAL_H
#define TR_ACTORS_ENGINE_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "actors/ckpt/ckpt.h"
#include "actors/comm/comm_spawn.h"
#include "actors/data/dataset.h"
#include "actors/data/loader.h"
#include "actors/engine/client.h"
#include "actors/engine/plan.h"
#include "actors/exec/ds_monitor.h"
#include "actors/exec/executor.h"
#include "actors/optim/optim.h"

struct tr_engine {
    /* --- fixed at create, before any message; read-only after (any thread) --- */
    tr__plan_t plan;  /* what the actors see */
    tr_config_t *cfg; /* plan.cfg, owned when own_cfg */
    bool own_cfg;
    tr_model_t *model;         /* plan.model, writable: the executor's; destroyed here */
    tr_engine_memory_t memory; /* assembled from what each spawn made */
    char flight_path[1024];

    /* --- each actor's own state; here only to be freed at destroy, once every actor has
     * stopped (their registered buffers may be read by the others until then; the bucketer,
     * which has none, is freed by the runtime's cleanup hook) --- */
    struct tr__loader *ld;
    struct tr__ckpt_actor *ck;
    struct tr__exec *ex;
    struct tr__comm *cm;
    tr__optim_t *op;
    struct tr__swapper *sw;
    float *param_home; /* offload_param cpu: this rank's partition (plan.buf_param_home) */
    size_t param_home_bytes;
    tr__dataset_t *train, *val; /* the loader's and the executor's */
    struct tr__dsmon *ds;       /* the executor's */

    /* deterministic mode (troupe.runtime.deterministic): a thread runs the runtime's seeded
     * scheduler (tr_runtime_run) for the engine's lifetime */
    pthread_t driver;
    bool driving;
    bool created; /* tr_engine_create succeeded: the actors answer calls */
    int driver_rc;

    /* a call that sends requests is running (enter_call in engine.c): another thread's call
     * meanwhile is refused with TR_EBUSY instead of sharing the reply slot (any thread) */
    atomic_bool in_call;

    /* --- the caller's thread only --- */
    void *stage_in, *stage_targets, *stage_y;
    tr__reply_t last; /* the last successful reply's view */
    char error[1024]; /* the last call's explanation */
};

#endif
