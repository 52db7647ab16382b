/* work.h - what entry points share after validation: the weight and bias in
 * the compute type, splitting work across the context's threads, and the
 * fixed-order reduction of per-chunk dweight/dbias partial sums (results never
 * depend on the thread count). */
#ifndef RMSNORM_WORK_H
#define RMSNORM_WORK_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/context.h"
#include "numerics/dtype.h"
#include "kernels/kernels.h"
#include "runtime/parallel.h"

/* Outputs at least this large are written with non-temporal stores where the
 * kernel set has them: past half of a core's L2 (2 MiB on the Xeons measured),
 * plain stores pay a read for ownership of every line and its write-back.
 * Measured (AVX-512, one thread, rows 4096 fp32, interleaved): streaming was
 * 1.5x faster at 64 rows (1 MiB out) and 2.2-2.7x at 256-512 rows, the
 * backward 1.2-1.9x; at 32 rows (512 KiB) the same. It was 16 MiB, which
 * left the shapes between at a third of the copy limit. */
#define RN_STREAM_BYTES ((size_t)1 << 20)

/* From this many bytes of output (and as many of input) the rows come from
 * DRAM, and the fp32/fp64 kernels prefetch each line several times
 * (V_PREFETCH_REPEAT). Measured on an AMD EPYC VM, fp32, % of the copy: the
 * repeats moved 512x576 (1.2 MB, from L2/L3) 10-20% down; 512x4096 (8 MiB)
 * from -10% to +66% (the backward on two threads), 4096x4096 up 5-25%. */
#define RN_DRAM_BYTES ((size_t)4 << 20)

/* From this many bytes of a call's inputs and outputs its rows come from
 * DRAM even where the last-level cache is large (32 MiB on a Zen 4 CCD),
 * and AVX-512 takes short rows out of their groups (RN_SHORT_ROWS_FROM_DRAM).
 * Measured on the EPYC VM, fp32 rows of 128, one thread: the forward one at
 * a time was 10% slower at 24576 rows (24 MiB), 7% faster at 32768 and 28%
 * at 49152; the backward 19-26% slower at 8192-16384 rows (12-24 MiB),
 * within the noise at 24576-32768 and faster from 49152 (72 MiB). */
#define RN_PAST_L3_BYTES ((size_t)32 << 20)

/* Whether outputs of `bytes` at p (elements of es bytes) are worth streaming
 * past the caches: `free` (the output aliases no input), large, and p aligned
 * to its element size (a streaming store needs a vector-aligned address,
 * which misaligned elements never reach). @return RN_CACHED (0) when not;
 * RN_STREAMED; RN_STREAMED_DRAM from RN_DRAM_BYTES on. */
static inline rn_stream rn_stream_ok(int free, const void *p, size_t es, size_t bytes) {
  if (!free || bytes < RN_STREAM_BYTES || ((uintptr_t)p & (es - 1)) != 0) return RN_CACHED;
  return bytes >= RN_DRAM_BYTES ? RN_STREAMED_DRAM : RN_STREAMED;
}

/* Scratch regions start on 64-byte boundaries. */
static inline size_t rn_align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Task t of n gets units [begin(t), begin(t+1)): contiguous blocks. */
static inline size_t rn_split_begin(size_t units, int t, int n) {
  return units * (size_t)t / (size_t)n;
}

/* Whether a weight (is_weight) or bias p needs a converted copy of d acc
 * elements to reach the kernels (other dtype, the 1 + g offset, or an address
 * not aligned to the acc type: kernels get aligned parameters). */
static inline int rn_param_needs_copy(const rmsnorm_config *cfg, const void *p,
                                      int is_weight) {
  if (!p) return 0;
  return cfg->param_dtype != (rn_acc_is_f64(cfg->dtype) ? RMSNORM_F64 : RMSNORM_F32) ||
         (is_weight && (cfg->flags & RMSNORM_FLAG_WEIGHT_OFFSET)) ||
         !rn_aligned(p, rn_acc_size(cfg->dtype));
}
/* p in the compute type: p itself, or its converted copy written to buf
 * (fp16/bf16 rows by k's widen where the set has one). */
const void *rn_param_as_acc(const rmsnorm_config *cfg, const rn_kernel_set *k, const void *p,
                            int is_weight, size_t d, void *buf);

/* How a call's work is cut: `tasks` pieces (task t of n takes units
 * [rn_split_begin(t), rn_split_begin(t + 1))), run on up to `threads`
 * threads, the caller's included. */
typedef struct rn_split {
  int threads, tasks;
  int most; /* the most threads this call could have had (the context's limit, at most
             * units): what per-thread scratch is sized for, whatever the model chose */
} rn_split;
/* The split of `rows` rows and `bytes` of traffic (read + written) into at
 * most `units` pieces: threads from a cost model of this machine's kind
 * (work.c), only where they are predicted to pay; tasks a few per thread. */
rn_split rn_split_for(const rmsnorm_context *ctx, size_t rows, size_t bytes, size_t units);
/* Runs fn over s.tasks tasks on the calling thread and up to s.threads - 1
 * idle workers of the process-wide pool; lock held. */
void rn_run_tasks(rmsnorm_context *ctx, rn_split s, rn_task_fn fn, void *arg);
/* Units [begin, end) (rows, or QK tokens) of task `task`, a contiguous block. */
typedef void (*rn_rows_fn)(const void *arg, size_t begin, size_t end, int task);
/* Runs fn over `units` units cut into s.tasks contiguous blocks (rn_split_begin),
 * as rn_run_tasks; lock held. */
void rn_run_rows(rmsnorm_context *ctx, rn_split s, size_t units, rn_rows_fn fn, const void *arg);

/* Computes units [u0, u1) of a backward (one chunk) and adds its dweight and
 * dbias terms into dw_part/db_part ((d,) acc, zeroed, or NULL). `task` is
 * the index of the running task (for per-task scratch). */
typedef void (*rn_chunk_fn)(void *arg, size_t u0, size_t u1, void *dw_part, void *db_part,
                            int task);

/* The most groups a backward's dweight/dbias reduction keeps (below). */
#define RN_GRAD_GROUPS 64

/* A backward's reduction of dweight/dbias, the same bits for any thread
 * count with scratch bounded by the row length, not the row count:
 *   units (rows, or QK tokens) are cut into chunks of chunk_units, and the
 *   chunks into ngroups = min(nchunks, RN_GRAD_GROUPS) groups of consecutive
 *   chunks, both fixed by the shape alone;
 *   a chunk's terms are summed in the compute type into a (d,) partial (the
 *   kernels' row order), which is then added into its group's (d,) double
 *   sum, chunk after chunk;
 *   the group sums are added in group order, in double.
 * Tasks take whole groups. With at most RN_GRAD_GROUPS chunks (4096 rows of
 * the plain backward) every group is one chunk, summed straight into its
 * group's slot in the compute type, and the order is that of adding the
 * chunks in order; beyond, each task sums a chunk into a partial of its own
 * and adds that into the group's double sum (one task a thread then).
 * Scratch per output: at most RN_GRAD_GROUPS d-vectors of doubles plus one
 * per thread the context allows, whatever the row count. Fill
 * with rn_grad_plan_init (under the context's lock: it takes the task
 * count), size scratch with plan.bytes, then rn_grad_run. */
typedef struct rn_grad_plan {
  const rmsnorm_config *cfg;
  size_t units, chunk_units, nchunks, ngroups, d, acc_size;
  int multi;             /* groups of several chunks (nchunks > RN_GRAD_GROUPS) */
  size_t part_bytes, group_bytes, total_bytes, bytes;
  rn_split split;        /* how the chunks run (tasks <= ngroups) */
  int ntasks;            /* tasks that scratch is sized for (>= split.tasks) */
  void *dweight, *dbias; /* the user's outputs, or NULL */
  const rn_kernel_set *kernels; /* the call's set, for the fp16/bf16 outputs'
                                   conversion (NULL: the portable loop) */
  int fresh_parts;       /* set by the caller after init: its chunk function writes
                            each chunk's partials from nothing (backward kernels
                            with parts_fresh), so they are not zeroed first */
  int dw_stored;         /* set by the caller after init: the one chunk stores
                            dweight itself (backward kernels with dw_data), so
                            it is not reduced */
  rn_split reduce;       /* the reduction's split, where the caller decided it
                            (rn_grad_reduce_split); tasks 0: decided by the run */
} rn_grad_plan;

/* `split`: the threads and tasks wanted (tasks clamped to ngroups). @return
 * 0 when the scratch size would not fit in size_t (out of memory). */
int rn_grad_plan_init(rn_grad_plan *p, const rmsnorm_config *cfg, size_t units,
                      size_t chunk_units, size_t d, void *dweight, void *dbias, rn_split split);
/* The split of p's reduction over d (rn_split_for); lock held. */
rn_split rn_grad_reduce_split(const rmsnorm_context *ctx, const rn_grad_plan *p);
/* Whether p's whole run is one call of its chunk function, fn(arg, 0,
 * units, *dw_part, *db_part, 0), with nothing zeroed before and nothing
 * reduced after (one chunk, fresh_parts, each output its own partial or
 * stored by the kernel): a plan then calls its kernel directly. */
int rn_grad_one_call(const rn_grad_plan *p, void *scratch, void **dw_part, void **db_part);
/* Runs fn over every chunk with p->split, then reduces into dweight
 * and dbias (overwritten, or added to with RMSNORM_FLAG_ACCUMULATE).
 * `scratch` holds p->bytes (64-byte aligned); lock held. */
void rn_grad_run(rmsnorm_context *ctx, const rn_grad_plan *p, void *scratch, rn_chunk_fn fn,
                 void *arg);

#endif
