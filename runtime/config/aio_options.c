/* The config's `aio` section as the aio engine's options: the one mapping that the swapper,
 * the background checkpointer and the tools (troupe nvme-bench, nvme-tune) share, so a key
 * added to the section reaches every user of the engine through this file.
 *
 * The schema (runtime/config/schema.c) has already checked each key's range, and its defaults
 * are tr_aio_options_default's, so the mapping is a copy with the types narrowed. `use_gds`
 * has no engine option: GPUDirect Storage is not an engine this build has.
 */
#include "troupe/aio.h"
#include "troupe/config.h"

void tr_aio_options_from_config(const tr_config_aio_t *c, tr_aio_options_t *o)
{
    o->block_size = (size_t)c->block_size;
    o->queue_depth = (int)c->queue_depth;
    o->intra_op_parallelism = (int)c->intra_op_parallelism;
    o->single_submit = c->single_submit;
    o->overlap_events = c->overlap_events;
}
