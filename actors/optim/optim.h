/* optim.h: making the optimizer (optimizer.c, optimizer_setup.c) and the NVMe swapper of its
 * state (swapper.c). On failure a spawn's *state may still be set: free it with the matching
 * _free after the runtime has closed (NULL does nothing). The caller's thread. */
#ifndef TR_ACTORS_OPTIM_OPTIM_H
#define TR_ACTORS_OPTIM_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "actors/engine/plan.h"

typedef struct tr__optim tr__optim_t;
struct tr__swapper;

/* The moment arrays' names and count (0 when the optimizer keeps none), from the config. */
int tr__optimizer_array_names(const tr_config_t *c, const char **names, int max);

/* Only with eng->swaps or the parameters on NVMe. Creates the swapper's state (*state) and
 * actor (*self) and writes every sub-group's zeroed state and (unless `params_later`) this
 * rank's parameter slice from the parameter buffer, so a full disk is found now. *lay gets the
 * layout the optimizer steps in (the engine's plan.swap, read from the first message on),
 * *bytes the memory its buffers take (the rest is on disk). */
int tr__swapper_spawn(const tr__plan_t *eng, struct tr__swapper **state, tr_actor_t *self,
                      bool params_later, tr__swap_layout_t *lay, uint64_t *bytes, char *err,
                      size_t errlen);
/* params_later: the engine's thread, before the actors run, stores the initial parameters
 * [at, at + n) of this rank's slice (from src, indexed from `at`) as the init makes them. */
int tr__swapper_store_params(struct tr__swapper *w, size_t at, size_t n, const float *src,
                             char *err, size_t errlen);
void tr__swapper_free(struct tr__swapper *w);

/* Creates the optimizer's state (*state) and actor (*self); with eng->swaps it steps in
 * eng->swap from its first message on. *state_bytes: its moment arrays in memory;
 * *grad_bytes: the reduced gradient partition it keeps (ZeRO 2). */
int tr__optimizer_spawn(const tr__plan_t *eng, tr__optim_t **state, tr_actor_t *self,
                        uint64_t *state_bytes, uint64_t *grad_bytes, char *err, size_t errlen);
void tr__optimizer_free(tr__optim_t *o);

#endif
