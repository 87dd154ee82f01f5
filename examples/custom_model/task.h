/* task.h: the synthetic regression task of examples/custom_model.
 *
 * Sample s of a stream has 4 inputs uniform in [-1, 1), each a pure function of (s, i) (a
 * hash, no state), and the target y = sin(x0) + 0.5 x1 x2 - x3^2. Batch `index` of B T
 * positions holds samples index B T ... index B T + B T - 1 of the stream, so the data are
 * the same in every run and a resumed run sees the batches it would have seen. Any thread.
 */
#ifndef MY_TASK_H
#define MY_TASK_H

#include <stdint.h>

#define MY_TASK_IN 4

/* Where a stream starts: the train and validation streams never overlap. */
#define MY_TASK_TRAIN 0ull
#define MY_TASK_VAL   (1ull << 40)

/* Sample s: x (4 floats) and its target *y. */
void my_task_sample(uint64_t s, float *x, float *y);

/* A tr_batch_cb: user points to the stream's start (a uint64_t: MY_TASK_TRAIN or
 * MY_TASK_VAL). Fills x (B, T, 4) and y (B, T, 1); tokens and targets are unused (NULL).
 * Returns 0. */
int my_task_batch(void *user, uint64_t index, int B, int T, int *tokens, float *x, int *targets,
                  float *y);

#endif
