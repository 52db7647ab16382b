/* rmsnorm_mpi.h - librmsnorm_mpi: RMSNorm over a hidden dimension sharded
 * across the ranks of an MPI communicator, on the split steps of rmsnorm.h
 * ("Sharded hidden dimension"). Built when CMake finds an MPI; link with
 * -lrmsnorm_mpi -lrmsnorm and the MPI's C library.
 *
 * Every rank of `comm` holds columns [offset, offset + width) of the same
 * rows x d_global tensor; together the shards cover the columns exactly once
 * (any order of ranks, widths of 0 allowed). Every rank of `comm` makes the
 * same calls in the same order, as for any collective, from a thread that
 * may make MPI calls (the main thread under MPI_THREAD_FUNNELED).
 *
 * Cost: a forward makes one MPI_Allreduce of 32 doubles on `comm`, whatever
 * its arguments: the agreement below (25 doubles) and the sums of the first
 * 7 rows; with more rows, a second MPI_Allreduce of the other rows - 7
 * doubles. A backward the same, plus one MPI_Allreduce of 3 + rows doubles
 * when it recomputes the statistics. d_global never enters the cost.
 *
 * Agreement (always on): the first collective of a call carries every rank's
 * status and what the ranks must share, and every rank draws the same
 * verdict from it, so an error on any rank, or ranks that disagree, give an
 * error on every rank, nothing is written and no rank is left waiting:
 *   - a rank's own argument error (or allocation failure): its status on
 *     that rank; on the others, the failing ranks' status when they all
 *     failed alike, else RMSNORM_ERROR_BAD_ARGUMENT;
 *   - rows or d_global differ, or the shards do not cover [0, d_global)
 *     exactly once (gaps, overlaps): RMSNORM_ERROR_BAD_SIZE;
 *   - dtype or param_dtype differ: RMSNORM_ERROR_BAD_DTYPE;
 *   - eps or partial differ in value (0 and -0 agree), flags differ, a
 *     forward meets a backward, or a backward has stats on some ranks only:
 *     RMSNORM_ERROR_BAD_ARGUMENT.
 * Statuses and dtypes are compared exactly; the sizes, the options and the
 * cover through 64-bit hashes (of rows and d_global; of the call, flags, eps
 * and partial; of the shards' ends), so a disagreement there passes with
 * odds of about 2^-64 per call. Communicators of fewer than 2^20 ranks
 * (larger ones: RMSNORM_ERROR_BAD_SIZE on every rank).
 *
 * Checks (rmsnorm_mpi_set_checks, or the environment variable
 * RMSNORM_MPI_CHECK=1, on any rank): once the agreement passes, every rank's
 * arguments are gathered too (one MPI_Allgather of 8 integers per rank, made
 * by every rank of `comm` when any of them has checks on) and compared
 * exactly. Ranks may set checks differently.
 *
 * Undefined, as for any MPI collective: ranks that pass different
 * communicators, or where some rank skips the call or makes other
 * collectives on `comm` in between; for the backward, `replicas` given on
 * some of its ranks and MPI_COMM_NULL on others.
 *
 * MPI errors: MPI calls use the communicator's error handler (by default
 * MPI_ERRORS_ARE_FATAL aborts the job). With MPI_ERRORS_RETURN, a failed MPI
 * call makes the function return RMSNORM_ERROR_NOT_AVAILABLE; outputs may
 * then be partly written, and the other ranks may wait. So may `stats`,
 * `rstd` and `y` of a rank that runs out of memory for the context's scratch
 * after the sums (that rank alone returns RMSNORM_ERROR_OUT_OF_MEMORY; the
 * others are not left waiting). */
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
 * on). The exact comparison runs on every rank of a communicator when any
 * of its ranks has checks on; the agreement is always made. */
RMSNORM_MPI_API void rmsnorm_mpi_set_checks(int mode);

/* Forward of the shard's columns: y = RMSNorm of the whole rows, restricted
 * to [offset, offset + width) (rmsnorm_shard_stats, the agreement and the
 * sums over comm, rmsnorm_shard_forward). stats (optional, rows doubles):
 * receives each row's summed statistic, for rmsnorm_mpi_backward. rstd
 * (optional) as rmsnorm_forward's. Arguments otherwise as
 * rmsnorm_shard_forward's.
 * @return RMSNORM_OK or an error status (nothing written; an argument error
 * or a disagreement is an error on every rank, see above). */
RMSNORM_MPI_API rmsnorm_status rmsnorm_mpi_forward(rmsnorm_context *ctx,
                                                   const rmsnorm_config *cfg, size_t rows,
                                                   size_t d_global, size_t offset, size_t width,
                                                   const void *x, size_t ldx,
                                                   const void *weight, const void *bias,
                                                   void *y, size_t ldy, double *stats,
                                                   void *rstd, MPI_Comm comm);

/* Backward of the shard's columns: dx, and when non-NULL dweight and dbias of
 * the shard's columns (rmsnorm_shard_backward_dots, the agreement and the
 * sums over comm, rmsnorm_shard_backward). stats: the forward's (rows
 * doubles), or NULL to recompute them (the agreement then rides on their
 * sums, and the dots take one more MPI_Allreduce of 3 + rows doubles).
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
 * replicas agree first, always, before anything is written (one
 * MPI_Allreduce of 25 doubles on `replicas`, and with checks the exact
 * comparison as above): on d_global, offset, width, dtypes, eps, partial,
 * flags and which of dweight and dbias they ask for (rows may differ), and
 * on their columns' verdicts: an error, or a disagreement as above, on any
 * replica is an error on every replica (the ranks of a replica's `comm`
 * whose own replicas agreed go on and return RMSNORM_OK). Each replica's
 * status travels with its sums, so a replica that fails after the agreement
 * (out of memory) makes every replica return an error, dx then written and
 * dweight/dbias not.
 * @return RMSNORM_OK or an error status (nothing written; an argument error
 * or a disagreement is an error on every rank, see above). */
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
