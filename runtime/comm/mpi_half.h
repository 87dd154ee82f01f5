/* mpi_half: fp16 and bf16 on MPI's wire. MPI 4.1 has neither type, so each is a 2-byte
 * contiguous datatype of our own with commutative user-defined operations: SUM converts both
 * operands to fp32, adds and rounds back to nearest even (kernels/cpu/half.h's rules); MAX picks
 * the larger operand, which needs no rounding. The mpi backend uses these for its reductions,
 * and the bare-MPI benchmark (bench/dp) uses the same ones, so both pay the same combine cost.
 */
#ifndef TR_RUNTIME_COMM_MPI_HALF_H
#define TR_RUNTIME_COMM_MPI_HALF_H

#include <mpi.h>

#include "runtime/comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The datatype of dt (TR_DTYPE_F16 or TR_DTYPE_BF16) and its operation for `op`, created and
 * committed on first use and kept until MPI_Finalize. MPI must be initialised. 0, TR_EINVAL for
 * another dtype or op, TR_ECOMM when MPI refuses to create them. Any thread, serialised with
 * the process's other MPI calls. */
int tr_mpi_half_op(tr_dtype_t dt, tr_reduce_op_t op, MPI_Datatype *type, MPI_Op *mpi_op);

#ifdef __cplusplus
}
#endif

#endif
