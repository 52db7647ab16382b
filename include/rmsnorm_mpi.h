/* rmsnorm_mpi.h - librmsnorm_mpi: RMSNorm over a hidden dimension sharded
 * across the ranks of an MPI communicator, on the split steps of rmsnorm.h
 * ("Sharded hidden dimension"). Built when CMake finds an MPI; link with
 * -lrmsnorm_mpi -lrmsnorm and the MPI's C library.
 *
 * Every rank of `comm` holds columns [offset, offset + width) of the same
 * rows x d_global tensor; together the shards cover the columns exactly once
 * (any order of ranks, widths of 0 allowed). Each forward and each backward
 * costs one MPI_Allreduce of `rows` doubles (MPI_SUM) on `comm`: rows x 8
 * bytes, whatever d_global. Every rank must call with the same rows, d_global,
 * config and optional arguments, as for any collective, from a thread that may
 * make MPI calls (the main thread under MPI_THREAD_FUNNELED).
 *
 * Checks: with checks on (rmsnorm_mpi_set_checks, or the environment variable
 * RMSNORM_MPI_CHECK=1 on every rank), each call first exchanges a small
 * record (one MPI_Allgather of 16 integers per rank, on `comm` and on
 * `replicas`) and every rank returns an error when any rank's arguments are
 * invalid or the ranks disagree: rows or d_global differ, or the shards do
 * not cover [0, d_global) exactly once (widths not summing to d_global,
 * overlaps, gaps): RMSNORM_ERROR_BAD_SIZE; dtype or param_dtype differ:
 * RMSNORM_ERROR_BAD_DTYPE; eps, partial, flags, the operation, or which
 * optional buffers are given differ: RMSNORM_ERROR_BAD_ARGUMENT; a rank's
 * own argument error: that rank's status, and the lowest such rank's status
 * on the ranks without one. Nothing is
 * written and no rank waits in a collective the others skip. Without checks,
 * an argument error on one rank returns before the collective and the other
 * ranks wait there: use checks while developing.
 *
 * MPI errors: MPI calls use the communicator's error handler (by default
 * MPI_ERRORS_ARE_FATAL aborts the job). With MPI_ERRORS_RETURN, a failed MPI
 * call makes the function return RMSNORM_ERROR_NOT_AVAILABLE; outputs may
 * then be partly written. So may `stats` when a rank runs out of memory for
 * the context's scratch after the sums (that rank alone returns
 * RMSNORM_ERROR_OUT_OF_MEMORY; the others are not left waiting). */
#ifndef RMSNORM_MPI_H
#define RMSNORM_MPI_H

#include <mpi.h>

#include "rmsnorm.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(RMSNORM_STATIC_DEFINE) || !defined(__GNUC__)
#define RMSNORM_MPI_API
#else
#define RMSNORM_MPI_API __attribute__((visibility("default")))
#endif

/* Checks mode for later calls in this process: 1 on, 0 off, -1 (the
 * default) from the environment variable RMSNORM_MPI_CHECK (set and not "0":
 * on). All ranks must use the same mode. */
RMSNORM_MPI_API void rmsnorm_mpi_set_checks(int mode);

/* Forward of the shard's columns: y = RMSNorm of the whole rows, restricted
 * to [offset, offset + width) (rmsnorm_shard_stats, one MPI_Allreduce,
 * rmsnorm_shard_forward). stats (optional, rows doubles): receives each row's
 * summed statistic, for rmsnorm_mpi_backward; NULL allocates a temporary.
 * rstd (optional) as rmsnorm_forward's. Arguments otherwise as
 * rmsnorm_shard_forward's.
 * @return RMSNORM_OK or an error status (nothing written; with checks on, an
 * error on every rank). */
RMSNORM_MPI_API rmsnorm_status rmsnorm_mpi_forward(rmsnorm_context *ctx,
                                                   const rmsnorm_config *cfg, size_t rows,
                                                   size_t d_global, size_t offset, size_t width,
                                                   const void *x, size_t ldx,
                                                   const void *weight, const void *bias,
                                                   void *y, size_t ldy, double *stats,
                                                   void *rstd, MPI_Comm comm);

/* Backward of the shard's columns: dx, and when non-NULL dweight and dbias of
 * the shard's columns (rmsnorm_shard_backward_dots, one MPI_Allreduce,
 * rmsnorm_shard_backward). stats: the forward's (rows doubles), or NULL to
 * recompute them (one more MPI_Allreduce of rows doubles).
 *
 * replicas: MPI_COMM_NULL, or the ranks that hold the same columns of the
 * weight for other rows (data or sequence parallelism; this rank included).
 * dweight and dbias are then summed over all their rows, deterministically:
 * each rank's sums are kept in the compute type (never rounded to a 16-bit
 * param dtype), exchanged with one MPI_Alltoallv, added in double in replica
 * rank order (rank 0 first) by the rank that owns that slice of the columns,
 * and shared with one MPI_Allgatherv. Every replica gets the same bits, for
 * any MPI algorithm; RMSNORM_FLAG_ACCUMULATE adds the total to what each
 * holds. Cost: about 2 x width x 8 bytes per rank (x 2 with dbias). The
 * replicas must agree on offset, width, dtype, flags and which of dweight and
 * dbias they ask for; rows may differ.
 * @return RMSNORM_OK or an error status (nothing written; with checks on, an
 * error on every rank). */
RMSNORM_MPI_API rmsnorm_status rmsnorm_mpi_backward(rmsnorm_context *ctx,
                                                    const rmsnorm_config *cfg, size_t rows,
                                                    size_t d_global, size_t offset, size_t width,
                                                    const void *x, size_t ldx,
                                                    const void *dy, size_t lddy,
                                                    const void *weight, const double *stats,
                                                    void *dx, size_t lddx, void *dweight,
                                                    void *dbias, MPI_Comm comm,
                                                    MPI_Comm replicas);

#ifdef __cplusplus
}
#endif

#endif /* RMSNORM_MPI_H */
