/* mpi_half.c: fp16 and bf16 datatypes and reductions for MPI (see mpi_half.h).
 *
 * The combine functions run inside MPI, on whatever thread made the MPI call, over blocks of
 * `len` elements MPI chooses. Each converts a chunk of both operands to fp32 on the stack,
 * combines and converts back, so the loops stay simple enough for the compiler to vectorise.
 */
#include "runtime/comm/mpi_half.h"

#include <pthread.h>

#include "kernels/cpu/half.h"
#include "troupe/error.h"

#define CHUNK 256

typedef float (*to_float_fn)(uint16_t);
typedef uint16_t (*from_float_fn)(float);

/* inout[i] = round(in[i] + inout[i]) for n elements. */
static inline void sum_half(const uint16_t *in, uint16_t *inout, int n, to_float_fn to,
                            from_float_fn from)
{
    float a[CHUNK], b[CHUNK];
    for (int at = 0; at < n; at += CHUNK) {
        int k = n - at < CHUNK ? n - at : CHUNK;
        for (int i = 0; i < k; i++) {
            a[i] = to(in[at + i]);
            b[i] = to(inout[at + i]);
        }
        for (int i = 0; i < k; i++)
            inout[at + i] = from(a[i] + b[i]);
    }
}

/* inout[i] = max(in[i], inout[i]) (NaN in inout stays, as fp32's MPI_MAX: a > b ? a : b). */
static inline void max_half(const uint16_t *in, uint16_t *inout, int n, to_float_fn to)
{
    for (int i = 0; i < n; i++)
        if (to(in[i]) > to(inout[i])) inout[i] = in[i];
}

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    sum_half(in, inout, *len, tr_bf16_to_float, tr_bf16_from_float);
}

static void bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    max_half(in, inout, *len, tr_bf16_to_float);
}

static void fp16_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    sum_half(in, inout, *len, tr_half_to_float, tr_half_from_float);
}

static void fp16_max(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    max_half(in, inout, *len, tr_half_to_float);
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int create_rc;
static MPI_Datatype types[2]; /* fp16, bf16 */
static MPI_Op ops[2][2];      /* [fp16, bf16][SUM, MAX] */

static int make_type(const char *name, MPI_Datatype *t)
{
    if (MPI_Type_contiguous(2, MPI_BYTE, t) != MPI_SUCCESS || MPI_Type_commit(t) != MPI_SUCCESS)
        return TR_ECOMM;
    MPI_Type_set_name(*t, name);
    return 0;
}

static void create(void)
{
    MPI_User_function *fns[2][2] = {{fp16_sum, fp16_max}, {bf16_sum, bf16_max}};
    int rc = make_type("troupe_fp16", &types[0]);
    if (rc == 0) rc = make_type("troupe_bf16", &types[1]);
    for (int t = 0; t < 2 && rc == 0; t++)
        for (int o = 0; o < 2 && rc == 0; o++)
            if (MPI_Op_create(fns[t][o], 1 /* commutative */, &ops[t][o]) != MPI_SUCCESS)
                rc = TR_ECOMM;
    create_rc = rc;
}

int tr_mpi_half_op(tr_dtype_t dt, tr_reduce_op_t op, MPI_Datatype *type, MPI_Op *mpi_op)
{
    if ((dt != TR_DTYPE_F16 && dt != TR_DTYPE_BF16) || (op != TR_REDUCE_SUM && op != TR_REDUCE_MAX))
        return TR_EINVAL;
    pthread_once(&once, create);
    if (create_rc < 0) return create_rc;
    int t = dt == TR_DTYPE_BF16;
    *type = types[t];
    *mpi_op = ops[t][op == TR_REDUCE_MAX];
    return 0;
}
