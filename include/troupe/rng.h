/* Troupe's random numbers: the splitmix64 generator that parameter initialisers draw from.
 *
 * A generator is one uint64_t the caller owns; every value, 0 included, is a valid seed, and
 * each draw advances it. tr_model_init_params hands every layer's init the same state in
 * layer order, so a layer that draws from it (with these functions) is deterministic per seed
 * and leaves later layers' draws depending on how many it took. The built-in layers use
 * exactly these functions: tr_rng_fill_uniform (linear), tr_rng_fill_normal (embedding,
 * GPT-2 blocks). The integer draws are the same on every machine; the float ones go through
 * logf/sqrtf/cosf/sinf and are the same wherever libm rounds alike.
 * Threads: any thread; a state is used by one thread at a time.
 */
#ifndef TR_INCLUDE_TROUPE_RNG_H
#define TR_INCLUDE_TROUPE_RNG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The next 64 random bits (splitmix64: state += 0x9e3779b97f4a7c15, then a mix). */
uint64_t tr_rng_next(uint64_t *state);

/* Uniform in [0, 1): the top 24 bits of tr_rng_next over 2^24, so every value is a float. */
float tr_rng_uniform(uint64_t *state);

/* Standard normal (mean 0, std 1) by Box-Muller from two uniforms u1 = 1 - tr_rng_uniform
 * (in (0, 1]) and u2 = tr_rng_uniform: sqrt(-2 ln u1) cos(2 pi u2). Draws two uniforms. */
float tr_rng_normal(uint64_t *state);

/* x[0..n) ~ normal(0, std). Uses both halves of each Box-Muller pair (x[2k] the cos, x[2k+1]
 * the sin of the same two uniforms), so n values take 2 ceil(n / 2) uniforms; x[2k] / std is
 * what the k-th tr_rng_normal from the same state would give (up to rounding of the scale). */
void tr_rng_fill_normal(uint64_t *state, float *x, size_t n, float std);

/* x[0..n) ~ uniform(-bound, bound): (2 tr_rng_uniform - 1) * bound, one uniform each. */
void tr_rng_fill_uniform(uint64_t *state, float *x, size_t n, float bound);

#ifdef __cplusplus
}
#endif
#endif
