/* rng.c: splitmix64 and the draws built on it (uniform, Box-Muller normal), for initialisers.
 *
 * The arithmetic is exactly what the built-in layers have always used, so a seed gives the
 * same parameters as before these functions were public (the GPT-2 reference tests hold it).
 */
#include "troupe/rng.h"

#include <math.h>

#define TWO_PI 6.28318530718f

uint64_t tr_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float tr_rng_uniform(uint64_t *state)
{
    return (float)(tr_rng_next(state) >> 40) / 16777216.0f;
}

float tr_rng_normal(uint64_t *state)
{
    float u1 = 1.0f - tr_rng_uniform(state), u2 = tr_rng_uniform(state); // u1 in (0, 1]
    return sqrtf(-2.0f * logf(u1)) * cosf(TWO_PI * u2);
}

void tr_rng_fill_normal(uint64_t *state, float *x, size_t n, float std)
{
    for (size_t i = 0; i < n; i += 2) {
        float u1 = 1.0f - tr_rng_uniform(state), u2 = tr_rng_uniform(state);
        float r = sqrtf(-2.0f * logf(u1)) * std;
        x[i] = r * cosf(TWO_PI * u2);
        if (i + 1 < n) x[i + 1] = r * sinf(TWO_PI * u2);
    }
}

void tr_rng_fill_uniform(uint64_t *state, float *x, size_t n, float bound)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (2.0f * tr_rng_uniform(state) - 1.0f) * bound;
}
