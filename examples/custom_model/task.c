/* task.c: y = sin(x0) + 0.5 x1 x2 - x3^2 over inputs hashed from the sample number. */
#include "task.h"

#include <math.h>
#include <stddef.h>

/* A 64-bit finaliser (MurmurHash3's): consecutive inputs give unrelated outputs. */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

void my_task_sample(uint64_t s, float *x, float *y)
{
    for (int i = 0; i < MY_TASK_IN; i++) // the top 24 bits: a float in [0, 1), then [-1, 1)
        x[i] = 2.0f * (float)(mix(s * MY_TASK_IN + (uint64_t)i) >> 40) / 16777216.0f - 1.0f;
    *y = sinf(x[0]) + 0.5f * x[1] * x[2] - x[3] * x[3];
}

int my_task_batch(void *user, uint64_t index, int B, int T, int *tokens, float *x, int *targets,
                  float *y)
{
    uint64_t first = *(const uint64_t *)user + index * (uint64_t)B * (uint64_t)T;
    (void)tokens; // a float-input, float-target model
    (void)targets;
    for (size_t n = 0; n < (size_t)B * (size_t)T; n++)
        my_task_sample(first + n, x + n * MY_TASK_IN, y + n);
    return 0;
}
