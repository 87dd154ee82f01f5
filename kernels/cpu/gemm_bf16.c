/* gemm_bf16.c: one single-threaded row-major product of bf16 matrices with fp32 accumulation
 * into an fp32 result: C (M, N) = op(A) op(B) + beta C, A and B bf16 (troupe's bf16 mixed
 * precision, kernels/cpu/linear.c).
 *
 * Two ways, the same numbers up to the order of the sums (every product of two bf16 values is
 * exact in fp32, and both accumulate in fp32):
 * - oneDNN's matmul primitive on bf16 memory, on CPUs with AVX512-BF16 (its VDPBF16PS kernels,
 *   about twice fp32's rate at the model's shapes). One primitive per shape, cached per thread
 *   (a primitive's scratchpad is not shared between threads that way), each thread's OpenMP
 *   held to one thread as in gemm.c.
 * - Elsewhere, emulated: the bf16 blocks are widened to fp32 (a shift) into the thread's
 *   arena and multiplied by the fp32 library (tr__sgemm). Measured on Ice Lake (AVX-512, no
 *   BF16), one thread: oneDNN's own bf16 fallback 30 GFLOP/s, fp32 150-165, so widening wins
 *   by far; it costs the widening of B per call, and gains nothing over fp32.
 * TROUPE_BF16_GEMM=onednn or emulated overrides the choice (tests run both).
 * The same cache also holds fp32 primitives (tr__gemm_f32_onednn): attention's many small
 * per-head fp32 products where the linear layers use oneDNN (attention.c).
 */
#include <dlfcn.h>
#include <dnnl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/blas_internal.h"
#include "kernels/cpu/half.h"
#include "troupe/blas.h"

#define CACHE_MAX 64 /* shapes per thread: a model has a few dozen at most */

typedef struct {
    int ta, tb, M, N, K, lda, ldb, ldc;
    float beta;
    int f32; /* A and B fp32 (tr__gemm_f32_onednn), else bf16 */
} shape_t;

typedef struct {
    shape_t s;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
} entry_t;

typedef struct {
    entry_t e[CACHE_MAX];
    int n, next; /* entries used; the one to replace next when full */
    dnnl_stream_t stream;
    float *wide; /* emulated: A's and B's blocks widened to fp32 */
    size_t wide_cap;
} tls_t;

static dnnl_engine_t engine;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static pthread_key_t tls_key;
static _Thread_local tls_t *tls;

static void drop_entry(entry_t *x)
{
    dnnl_primitive_destroy(x->prim);
    dnnl_memory_destroy(x->a);
    dnnl_memory_destroy(x->b);
    dnnl_memory_destroy(x->c);
}

static void tls_free(void *p)
{
    tls_t *t = p;
    for (int i = 0; i < t->n; i++)
        drop_entry(&t->e[i]);
    if (t->stream) dnnl_stream_destroy(t->stream);
    free(t->wide);
    free(t);
}

static void engine_init(void)
{
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) engine = NULL;
    pthread_key_create(&tls_key, tls_free);
}

static tls_t *thread_state(void)
{
    if (tls) return tls;
    pthread_once(&engine_once, engine_init);
    tls = calloc(1, sizeof(*tls));
    if (tls) pthread_setspecific(tls_key, tls);
    return tls;
}

int tr__bf16_backend(void)
{
    static _Atomic int chosen = -1;
    int b = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (b < 0) {
        _Static_assert(TR__BF16_EMULATED == 0 && TR__BF16_ONEDNN == 1, "choice order");
        b = tr__gemm_choice("TROUPE_BF16_GEMM", "emulated", "onednn",
                            tr_bf16_native() ? TR__BF16_ONEDNN : TR__BF16_EMULATED);
        atomic_store_explicit(&chosen, b, memory_order_relaxed);
    }
    return b;
}

int tr_bf16_native(void)
{
    tr__blas_cpu_t cpu;
    tr__blas_cpu(&cpu);
    return cpu.bf16;
}

const char *tr__bf16_backend_name(int backend)
{
    return backend == TR__BF16_ONEDNN ? "oneDNN bf16" : "emulated (bf16 widened to fp32)";
}

/* A memory descriptor of rows x cols at leading dimension ld, transposed when t. */
static dnnl_status_t md_of(dnnl_memory_desc_t *md, int rows, int cols, int ld, int t,
                           dnnl_data_type_t dt)
{
    dnnl_dims_t dims = {rows, cols}, strides = {t ? 1 : ld, t ? ld : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides);
}

static bool make_entry(entry_t *x, const shape_t *s)
{
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t mm;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_data_type_t in = s->f32 ? dnnl_f32 : dnnl_bf16;
    bool ok = md_of(&a, s->M, s->K, s->lda, s->ta, in) == dnnl_success &&
              md_of(&b, s->K, s->N, s->ldb, s->tb, in) == dnnl_success &&
              md_of(&c, s->M, s->N, s->ldc, 0, dnnl_f32) == dnnl_success &&
              dnnl_matmul_desc_init(&mm, &a, &b, NULL, &c) == dnnl_success &&
              dnnl_primitive_attr_create(&attr) == dnnl_success;
    if (ok && s->beta != 0.0f)
        ok = dnnl_post_ops_create(&po) == dnnl_success &&
             dnnl_post_ops_append_sum(po, s->beta) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    ok = ok && dnnl_primitive_desc_create(&pd, &mm, attr, engine, NULL) == dnnl_success &&
         dnnl_primitive_create(&x->prim, pd) == dnnl_success;
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (!ok) return false;
    x->s = *s;
    x->a = x->b = x->c = NULL;
    if (dnnl_memory_create(&x->a, &a, engine, DNNL_MEMORY_NONE) == dnnl_success &&
        dnnl_memory_create(&x->b, &b, engine, DNNL_MEMORY_NONE) == dnnl_success &&
        dnnl_memory_create(&x->c, &c, engine, DNNL_MEMORY_NONE) == dnnl_success)
        return true;
    drop_entry(x); /* destroying NULL handles is a no-op */
    return false;
}

static entry_t *lookup(tls_t *t, const shape_t *s)
{
    for (int i = 0; i < t->n; i++)
        if (!memcmp(&t->e[i].s, s, sizeof(*s))) return &t->e[i];
    entry_t fresh = {0};
    if (!engine || !make_entry(&fresh, s)) return NULL;
    if (t->n < CACHE_MAX) {
        t->e[t->n] = fresh;
        return &t->e[t->n++];
    }
    entry_t *x = &t->e[t->next];
    t->next = (t->next + 1) % CACHE_MAX;
    drop_entry(x);
    *x = fresh;
    return x;
}

static bool run_onednn(tls_t *t, const shape_t *s, const void *A, const void *B, float *C)
{
    tr__onednn_one_thread();
    if (!t->stream && dnnl_stream_create(&t->stream, engine, dnnl_stream_default_flags))
        return false;
    entry_t *x = lookup(t, s);
    if (!x) return false;
    dnnl_memory_set_data_handle(x->a, (void *)A);
    dnnl_memory_set_data_handle(x->b, (void *)B);
    dnnl_memory_set_data_handle(x->c, C);
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, x->a}, {DNNL_ARG_WEIGHTS, x->b}, {DNNL_ARG_DST, x->c}};
    return dnnl_primitive_execute(x->prim, t->stream, 3, args) == dnnl_success &&
           dnnl_stream_wait(t->stream) == dnnl_success;
}

/* rows x cols of a bf16 matrix at leading dimension ld, widened into dst (ld cols). */
static void widen(float *dst, const uint16_t *src, int rows, int cols, int ld)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[(size_t)r * cols + c] = tr_bf16_to_float(src[(size_t)r * ld + c]);
}

static bool run_emulated(tls_t *t, const shape_t *s, const uint16_t *A, const uint16_t *B, float *C)
{
    /* stored shapes: A is (M, K), or (K, M) when transposed; B (K, N), or (N, K) */
    int ar = s->ta ? s->K : s->M, ac = s->ta ? s->M : s->K;
    int br = s->tb ? s->N : s->K, bc = s->tb ? s->K : s->N;
    size_t need = (size_t)ar * ac + (size_t)br * bc;
    if (need > t->wide_cap) {
        float *w = realloc(t->wide, need * sizeof(float));
        if (!w) return false;
        t->wide = w;
        t->wide_cap = need;
    }
    float *a = t->wide, *b = t->wide + (size_t)ar * ac;
    widen(a, A, ar, ac, s->lda);
    widen(b, B, br, bc, s->ldb);
    tr__sgemm(tr__gemm_backend(), s->ta, s->tb, s->M, s->N, s->K, 1.0f, a, ac, b, bc, s->beta, C,
              s->ldc);
    return true;
}

/* Without memory for the widened blocks: the same sums, element by element (slow, correct). */
static void run_naive(const shape_t *s, const uint16_t *A, const uint16_t *B, float *C)
{
    for (int i = 0; i < s->M; i++)
        for (int j = 0; j < s->N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < s->K; k++) {
                uint16_t a = s->ta ? A[(size_t)k * s->lda + i] : A[(size_t)i * s->lda + k];
                uint16_t b = s->tb ? B[(size_t)j * s->ldb + k] : B[(size_t)k * s->ldb + j];
                acc += tr_bf16_to_float(a) * tr_bf16_to_float(b);
            }
            float *c = &C[(size_t)i * s->ldc + j];
            *c = s->beta != 0.0f ? s->beta * *c + acc : acc;
        }
}

void tr__gemm_bf16(int backend, int ta, int tb, int M, int N, int K, const uint16_t *A, int lda,
                   const uint16_t *B, int ldb, float beta, float *C, int ldc)
{
    shape_t s = {ta, tb, M, N, K, lda, ldb, ldc, beta, 0};
    tls_t *t = thread_state();
    /* oneDNN refuses nothing valid: should it fail (no memory), the emulation computes the
     * same numbers, and without memory for that either, the plain loops do */
    if (t && backend == TR__BF16_ONEDNN && run_onednn(t, &s, A, B, C)) return;
    if (t && run_emulated(t, &s, A, B, C)) return;
    run_naive(&s, A, B, C);
}

bool tr__gemm_f32_onednn(int ta, int tb, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc)
{
    shape_t s = {ta, tb, M, N, K, lda, ldb, ldc, beta, 1};
    tls_t *t = thread_state();
    return t && run_onednn(t, &s, A, B, C);
}
