/* Troupe: a C11 actor runtime for deep-learning training. The umbrella header. */
#ifndef TR_INCLUDE_TROUPE_H
#define TR_INCLUDE_TROUPE_H

#include "troupe/blas.h"
#include "troupe/buffer.h"
#include "troupe/config.h"
#include "troupe/error.h"
#include "troupe/types.h"
#include "troupe/io.h"
#include "troupe/aio.h"
#include "troupe/log.h"
#include "troupe/model.h"
#include "troupe/monitor.h"
#include "troupe/rng.h"
#include "troupe/msg.h"
#include "troupe/engine.h"
#include "troupe/pipeline.h"
#include "troupe/runtime.h"
#include "troupe/trace.h"

#endif
