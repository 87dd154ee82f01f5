/* Helpers shared by the runtime's stress tests (test_group, test_outbox): the seed of a run and
 * the hash their checksums of what was handled are made of. Random draws use tr_rng_next. */
#ifndef TR_TESTS_STRESS_TESTING_H
#define TR_TESTS_STRESS_TESTING_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "troupe.h"

/* The seed of test's random run, printed: the environment variable `name` when it is set (to
 * replay a run), else the clock. */
static inline uint64_t stress_seed(const char *test, const char *name)
{
    const char *e = getenv(name);
    uint64_t seed = e ? strtoull(e, NULL, 10) : (uint64_t)tr_now_ns();
    printf("%s: seed %llu (%s=%llu replays the run)\n", test, (unsigned long long)seed, name,
           (unsigned long long)seed);
    return seed;
}

/* A deterministic-mode replay's verdict, printed: the handling-order hashes of one seed's
 * traffic run twice (a, b) and of the next seed's (c). True when the seed replays its order
 * and the next seed gives another. */
static inline int stress_replayed(const char *test, uint64_t seed, uint64_t a, uint64_t b,
                                  uint64_t c)
{
    printf("%s: seed %llu: order %016llx, then %016llx; seed %llu: %016llx\n", test,
           (unsigned long long)seed, (unsigned long long)a, (unsigned long long)b,
           (unsigned long long)(seed + 1), (unsigned long long)c);
    return a == b && a != c;
}

/* A 64-bit mix (MurmurHash3's finaliser, first half): order-sensitive checksums of items. */
static inline uint64_t stress_mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    return x ^ (x >> 33);
}

#endif
