/* The seed of a stress test's random run: the environment variable `name` when it is set (to
 * replay a run whose seed the test printed), else the clock. */
#ifndef TR_TESTS_STRESS_SEED_H
#define TR_TESTS_STRESS_SEED_H

#include <stdint.h>
#include <stdlib.h>

#include "troupe.h"

static inline uint64_t stress_seed(const char *name)
{
    const char *e = getenv(name);
    return e ? strtoull(e, NULL, 10) : (uint64_t)tr_now_ns();
}

#endif
