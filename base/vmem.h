/* vmem.h: large buffers whose pages the kernel commits only when they are first written, and
 * whose ranges can be given back while the buffer stays mapped. The model keeps its parameters
 * and gradients in them: at ZeRO 2 a gradient bucket that has been reduced into its owner's
 * partition is released, so a rank holds the gradient only for the buckets in flight (and a
 * pipeline stage never commits the pages of another stage's layers). */
#ifndef TR_BASE_VMEM_H
#define TR_BASE_VMEM_H

#include <stddef.h>

/* bytes of zeroed, page-aligned memory (at least one page), or NULL (errno set). Only what is
 * written costs memory. Free with tr__vmem_free and the same size. Any thread. */
void *tr__vmem_alloc(size_t bytes);
void tr__vmem_free(void *p, size_t bytes);

/* Zeroes [p, p + bytes), which must lie in one tr__vmem_alloc buffer, and hands the pages
 * wholly inside it back to the kernel (they read as zeros and cost nothing until written
 * again); the parts of the first and last page outside them are zeroed in place. No thread may
 * touch the range meanwhile; the rest of the buffer may be in use. */
void tr__vmem_release(void *p, size_t bytes);

#endif
