/* agree.h: the ranks of one job agree on their resolved config before the first step. Every
 * rank hashes the part of its resolved config that the ranks compute together (everything but
 * the keys that only say how this process runs: see agree.c) and the hashes are all-gathered;
 * a rank whose config differs is named, with each differing key and both values, on every
 * rank, so a job never trains with, nor saves a checkpoint of, configs that disagree. */
#ifndef TR_RUNTIME_CONFIG_AGREE_H
#define TR_RUNTIME_CONFIG_AGREE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/comm/comm.h"
#include "troupe/config.h"

/* The resolved config without its per-process keys, as compact JSON in schema order: what
 * every rank must hold alike (and what a checkpoint's config hash is of). A malloc'd string
 * the caller frees, or NULL when out of memory. Any thread. */
char *tr__config_shared_json(const tr_config_t *cfg);

/* FNV-1a 64 of text ("" for NULL). */
uint64_t tr__config_hash_text(const char *text);

/* Collective over comm (every rank calls it, with nothing pending on comm, before anything
 * else is started on it): 0 when every rank's shared config is this one's; TR_ECONFIG with err
 * naming every rank whose config differs from rank 0's, each differing key and both values
 * (the same text on every rank); TR_ETIMEDOUT when a rank did not take part within timeout_s;
 * the backend's error otherwise. It works on a group split off comm for the purpose (freed
 * before it returns). The caller's thread. */
int tr__config_agree(const tr_config_t *cfg, tr_comm_t *comm, double timeout_s, char *err,
                     size_t errlen);

#endif
