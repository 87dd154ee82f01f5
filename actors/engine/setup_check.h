/* setup_check.h: the engine's set-up checks (setup_check.c), in the order tr_engine_create
 * calls them. Each fills the engine's fixed part or returns a negative TR_E* code with the
 * explanation in err (errlen bytes). The caller's thread. */
#ifndef TR_ACTORS_ENGINE_SETUP_CHECK_H
#define TR_ACTORS_ENGINE_SETUP_CHECK_H

#include <stddef.h>

#include "troupe/engine.h"

/* This process's rank and the world size: the caller's (o->rank, o->world), or the
 * launcher's environment. */
int tr__setup_ranks(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen);

/* The config: the caller's (resolved for this world size), or loaded from o->config_path with
 * its warnings logged. */
int tr__setup_config(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen);

/* Shapes, batch sizes, ZeRO, pipeline, activation checkpointing, precision and the loss
 * scale, checked against the config, the model and the datasets' widths. */
int tr__setup_shapes(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen);

#endif
