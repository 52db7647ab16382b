/* entry.h - the skeleton every public entry point runs, so that each states
 * only what differs: check the config and sizes -> describe its buffers ->
 * check their overlaps -> size the parameter copies -> lock -> scratch ->
 * plan -> run -> unlock. Nothing here writes user memory before the lock. */
#ifndef RMSNORM_ENTRY_H
#define RMSNORM_ENTRY_H

#include <stddef.h>

#include "api/qlayout.h"
#include "kernels/kernels.h"
#include "numerics/validate.h"
#include "runtime/context.h"
#include "runtime/work.h"
#include "rmsnorm.h"

/* One call of an entry point. An entry point's steps, in this order (the
 * order of the status codes a bad call gets):
 *   rn_entry_begin       the context, the config, d > 0
 *   rn_entry_matrices    the strides of its rows x d matrices
 *   ...                  its own size and argument checks; rows == 0 returns
 *   rn_entry_check       its buffers (rn_buffers): overlaps, parameter copies
 *   rn_entry_lock        from here every return is rn_entry_unlock(&e, status)
 *   ...                  its plan (thread split, gradient plan: they need the lock)
 *   rn_entry_scratch     the parameters in the compute type, and its own scratch
 *   ...                  its run
 *   rn_entry_unlock
 * An entry point with no plan and no scratch of its own takes the lock and
 * the parameters in one step, rn_entry_lock_params, or where rn_entry_unlocked
 * says so no lock at all. */
typedef struct rn_entry {
  rmsnorm_context *ctx;
  rmsnorm_config cfg;     /* the caller's config, read and checked: used from then on */
  size_t es, ps, as;      /* bytes of a data element, a parameter, the compute type */
  const void *weight;     /* the weight and bias: the caller's until rn_entry_scratch, */
  const void *bias;       /*   then in the compute type (aligned, 1 + g folded in) */
  size_t nparam;          /* elements of each */
  size_t wcopy, bcopy;    /* bytes of their copies at the start of scratch (0: none) */
  const rn_kernel_set *kernels; /* the context's kernel set (lock held) */
  int weight_direct;      /* rn_entry_weight_direct chose it: the forward kernel reads */
  const void *weight_data; /*   the caller's weight itself (weight is then NULL) */
} rn_entry;

/* The context (NULL: RMSNORM_ERROR_NULL_POINTER), the config (rn_check_config:
 * `refused` are flags the op does not take; *cfgp is pointed at e->cfg) and
 * d > 0. */
rmsnorm_status rn_entry_begin(rn_entry *e, rmsnorm_context *ctx, const rmsnorm_config **cfgp,
                              rn_norm norm, unsigned refused, size_t d);
/* rn_entry_begin for an operation that also takes the flags `own` of its
 * family (validate.h: RN_ROPE_FLAGS), which every other one refuses. */
rmsnorm_status rn_entry_begin_own(rn_entry *e, rmsnorm_context *ctx,
                                  const rmsnorm_config **cfgp, rn_norm norm, unsigned refused,
                                  unsigned own, size_t d);
/* The config alone, for the entry points without a context. */
rmsnorm_status rn_entry_config(rn_entry *e, const rmsnorm_config **cfgp, rn_norm norm,
                               unsigned refused);
/* e->ctx and the element sizes, where the config was read into e->cfg by
 * other means (the shard checks of api/shard.h). */
void rn_entry_set(rn_entry *e, rmsnorm_context *ctx);

/* The rows x d matrices of the data dtype with the given strides, in order
 * (rn_check_matrix): rn_entry_matrices(&e, rows, d, RN_LDS(ldx, ldy)). */
#define RN_LDS(...) (const size_t[]){__VA_ARGS__}, sizeof((size_t[]){__VA_ARGS__}) / sizeof(size_t)
rmsnorm_status rn_entry_matrices(const rn_entry *e, size_t rows, size_t d, const size_t *lds,
                                 size_t n);

#define RN_BUFFERS_IN 5
#define RN_BUFFERS_OUT 4

/* The buffers of a call by role. Every output must be disjoint from every
 * other buffer on the bytes the call touches (interleaved views are fine),
 * except one in-place view: out[0] may be exactly (same start, same strides
 * where used) the inputs marked with rn_inplace. Unused slots stay zero (a
 * NULL span is no buffer). */
typedef struct rn_buffers {
  rn_span in[RN_BUFFERS_IN];   /* read only */
  rn_span out[RN_BUFFERS_OUT]; /* written (an updated buffer is an output) */
  /* The parameters: inputs of nparam elements of the parameter dtype, which
   * rn_entry_scratch brings to the compute type (work.h). */
  const void *weight, *bias;
  size_t nparam;
} rn_buffers;

/* Empties b, whose slots the caller then fills: the decode-sized entries'
 * form of `rn_buffers b = {...}`, which zeroes all nine spans (650 bytes by
 * `rep stos` under GCC, about 6% of a one-row forward at d = 128 on Zen 4).
 * An empty slot needs only its pointer and its in-place mark: nothing else
 * of it is read. */
static inline void rn_buffers_empty(rn_buffers *b) {
  for (int i = 0; i < RN_BUFFERS_IN; i++) b->in[i].p = NULL, b->in[i].inplace = 0;
  for (int i = 0; i < RN_BUFFERS_OUT; i++) b->out[i].p = NULL, b->out[i].inplace = 0;
  b->weight = b->bias = NULL;
  b->nparam = 0;
}

/* An input that out[0] may be exactly. */
static inline rn_span rn_inplace(rn_span s) {
  s.inplace = 1;
  return s;
}

/* The overlap rule over b, its parameters of ps bytes an element:
 * RMSNORM_OK or RMSNORM_ERROR_OVERLAP. */
rmsnorm_status rn_check_buffers(const rn_buffers *b, size_t ps);
/* rn_check_buffers, then sizes the parameter copies. */
rmsnorm_status rn_entry_check(rn_entry *e, const rn_buffers *b);

/* Locks the context (context.h: the entry point that locks it unlocks it, on
 * every path) and reads its kernel set. */
void rn_entry_lock(rn_entry *e);
/* Whether a forward of `rows` rows of d (after rn_entry_check) lets its
 * kernel read an fp16/bf16 weight of the data's dtype as it is, instead of
 * a copy in the compute type made at every call: for a few rows that copy
 * costs as much as the rows (a pass over d values each way). With f32 (the
 * plain forward's kernels), an fp32 weight under RMSNORM_FLAG_WEIGHT_OFFSET
 * too, whose 1 + g the copy would hold. Taken by rn_entry_scratch where the
 * kernel set can (weight_in_data); the kernel adds the same 0 or 1 to each
 * value that the copy would, so the bits are the copy's. Up to
 * RN_DIRECT_WEIGHT_ROWS rows, in cache (no streamed stores, no column split:
 * RN_DIRECT_WEIGHT_BYTES of output), no bias. */
#define RN_DIRECT_WEIGHT_ROWS 3
#define RN_DIRECT_WEIGHT_BYTES ((size_t)64 << 10)
void rn_entry_weight_direct(rn_entry *e, size_t rows, size_t d, int f32);
/* Whether the call may run at once, without the context's lock (after
 * rn_entry_check and, where taken, rn_entry_weight_direct): its parameters
 * need no copy (the caller's as they are, or the weight read in place) and
 * one_task (its split keeps the work on the caller's thread), so it uses
 * neither scratch nor workers. It then reads the kernel set alone (sets
 * e->kernels, and the weight as rn_entry_scratch would), and the caller runs
 * the same functions as under the lock, without taking it or unlocking. */
int rn_entry_unlocked(rn_entry *e, int one_task);
/* rn_entry_scratch's two steps, for memory of the caller's own (a plan's):
 * the bytes of the parameter copies (the weight read in place where
 * rn_entry_weight_direct chose it and e->kernels can: none for it), then
 * the parameters converted into s (64-byte aligned, that many bytes), which
 * returns the memory after them. */
size_t rn_entry_params_bytes(rn_entry *e);
char *rn_entry_params_into(rn_entry *e, char *s);
/* rn_entry_lock, then rn_entry_scratch for the parameters alone. @return
 * RMSNORM_OK with the lock held, or RMSNORM_ERROR_OUT_OF_MEMORY with it
 * released. */
rmsnorm_status rn_entry_lock_params(rn_entry *e);
/* Scratch for the parameter copies and `bytes` more (64-byte aligned), the
 * parameters converted into it (e->weight, e->bias); lock held. @return the
 * `bytes` region, or NULL when out of memory (the lock is still held: return
 * rn_entry_unlock(e, RMSNORM_ERROR_OUT_OF_MEMORY)). */
char *rn_entry_scratch(rn_entry *e, size_t bytes);
/* The split (rn_split_for) of a backward over `rows` rows and `bytes` of
 * traffic whose reduction chunks rows by RN_BACKWARD_CHUNK_ROWS: at most
 * one task a chunk. */
rn_split rn_entry_backward_split(const rn_entry *e, size_t rows, size_t bytes);
/* A backward's dweight/dbias reduction (work.h): the plan over `units` in
 * chunks of chunk_units with the threads and tasks of `split`, then scratch
 * (rn_entry_scratch) of the plan's bytes and task_bytes for each of its
 * tasks; lock held. @return the plan's region, the tasks' regions after it,
 * or NULL when out of memory (the lock still held). */
char *rn_entry_grad_scratch(rn_entry *e, rn_grad_plan *plan, size_t units, size_t chunk_units,
                            size_t d, void *dweight, void *dbias, rn_split split,
                            size_t task_bytes);
/* Rows per block of a fused loop (add + norm, norm + add + norm): about
 * 32 KiB of one operand, so a block written by one kernel is still in L1/L2
 * when the next reads it. */
static inline size_t rn_block_rows(size_t d, size_t es) {
  size_t b = ((size_t)32 << 10) / (d * es);
  return b < 1 ? 1 : b;
}

/* Unlocks the context. @return st. */
rmsnorm_status rn_entry_unlock(rn_entry *e, rmsnorm_status st);

/* Kernel arguments for rows of d with the config's part filled in (dtype, the
 * statistic's columns k, eps, flags, the converted weight and bias) and the
 * rows given; the caller adds the per-row statistics and `stream`. */
rn_forward_args rn_entry_forward_args(const rn_entry *e, rn_norm norm, size_t d,
                                      const void *x, size_t ldx, void *y, size_t ldy);
/* The backward's, every field set at a: returned by value, the struct was
 * built on the stack and copied out in 16-byte loads of fields just stored 8
 * bytes at a time, which the store buffer cannot forward (Zen 4: 30 ns a
 * call). */
void rn_entry_backward_args(rn_backward_args *a, const rn_entry *e, rn_norm norm, size_t d,
                            const void *x, size_t ldx, const void *dy, size_t lddy, void *dx,
                            size_t lddx);

/* ---- the runs a plan (api/plan.c) repeats ------------------------------
 * The one-shot entry points run the same functions, so a plan's results are
 * theirs bit for bit. */

/* The forward's `stream` and `past_l3` for rows of a (its y, x, d, dtype). */
void rn_forward_stream(rn_forward_args *a, size_t rows);
/* The forward's split: rows over threads, or a long row's columns when there
 * are fewer rows than threads (norm.c). */
rn_split rn_forward_split(const rmsnorm_context *ctx, size_t rows, size_t d, size_t es);
/* Whether that split is one task on the caller's thread: the kernel can then
 * be called directly, without the context's lock or pool. */
int rn_forward_direct(const rmsnorm_context *ctx, rn_split split, size_t rows, size_t d,
                      size_t es);
/* The forward over rows [0, rows) of a with split (lock held when it wakes
 * threads; long rows are rescued one by one as rmsnorm_forward does). */
void rn_forward_run(rmsnorm_context *ctx, const rn_kernel_set *k, const rn_forward_args *a,
                    size_t rows, rn_split split);

/* The plain backward (norm.c) after its checks, in the steps a plan takes
 * apart: rn_backward_split (lock held), rn_backward_weight, the reduction's
 * plan and scratch (rn_entry_grad_scratch, or a plan's own), then
 * rn_backward_prepare and rn_backward_run. */
typedef struct rn_backward_job {
  rmsnorm_context *ctx;
  const rn_kernel_set *k;
  rn_backward_args args;
  rn_split cols; /* tasks > 0: fewer rows than threads, each row's columns split so */
} rn_backward_job;
/* The split of its chunks over threads, and in *cols the column split of
 * long rows (tasks 0 where the rows are not split). */
rn_split rn_backward_split(const rn_entry *e, size_t rows, size_t d, rn_split *cols);
/* Chooses the weight read in place where the kernels take it (e->kernels
 * set, after rn_entry_check; before the parameters are converted). */
void rn_backward_weight(rn_entry *e, rn_norm norm, size_t rows, size_t d, rn_split cols,
                        const void *dbias);
/* The kernels' arguments in job, and the flags plan's run reads (the
 * parameters converted: e->weight final). */
void rn_backward_prepare(rn_backward_job *job, rn_grad_plan *plan, const rn_entry *e,
                         rn_norm norm, size_t rows, size_t d, const void *x, size_t ldx,
                         const void *dy, size_t lddy, const void *mean, const void *rstd,
                         void *dx, size_t lddx, void *dweight, rn_split cols);
/* The chunks, then the reduction (lock held where a split wakes threads). */
void rn_backward_run(const rn_grad_plan *plan, void *sums, rn_backward_job *job);
/* Residual add + RMSNorm forward (add.c): add = h + u into h, fwd = RMSNorm
 * of h into y, block by block of rows. */
typedef struct rn_add_forward_job {
  const rn_kernel_set *ks;
  rn_add_args add;     /* h = h + u */
  rn_forward_args fwd; /* y = RMSNorm(h) */
  size_t block;        /* rows per block (rn_block_rows) */
  rn_add_forward_fn fused; /* the set's two-pass kernel where it takes the call, or NULL */
} rn_add_forward_job;
/* The job's stream decision, block and kernel for `rows` rows (ks, add, fwd
 * set). */
void rn_add_forward_prepare(rn_add_forward_job *job, size_t rows);
rn_split rn_add_forward_split(const rmsnorm_context *ctx, size_t rows, size_t d, size_t es);
void rn_add_forward_run(rmsnorm_context *ctx, const rn_add_forward_job *job, size_t rows,
                        rn_split split);

/* ---- the fused forwards a plan repeats (sandwich.c, quant.c, gated.c) ----
 * Each runs its rows over tasks (rn_run_rows) with a job of its own. The
 * one-shot call (rn_fused_oneshot) and a plan (reshape: split; setup: check,
 * bytes, memory, prepare; run) take the same steps through the op's table,
 * so a plan's results are the call's bit for bit. */

/* A call's arguments, by role; each op reads its own. */
typedef struct rn_fused_call {
  size_t rows, d;
  const void *x; /* sandwich: a; quantized: x (with the add: h, updated); gated: x */
  size_t ldx;
  void *u;       /* sandwich: h (updated); quantized: u of the add; gated: z */
  size_t ldu;
  void *y;       /* sandwich: x_next; quantized: the codes; gated: y */
  size_t ldy;    /* quantized: ldc, bytes */
  const void *weight, *bias;
  const void *weight_pre; /* sandwich: the second norm's weight (weight is the first's) */
  void *rstd, *rstd_pre;  /* sandwich: rstd_post and rstd_pre */
  void *scales;           /* quantized */
  size_t lds;
  const rmsnorm_quant *quant_arg; /* the caller's descriptors, */
  const rmsnorm_gate *gate_arg;
  rmsnorm_quant quant;            /*   read and checked by the op's check */
  rn_qlayout layout;
  rmsnorm_gate gate;
} rn_fused_call;

/* c: rows x d and no buffers yet. The arguments' fields one by one: a
 * designated initializer zeroes the whole struct (rep stos under GCC, tens
 * of cycles on Zen 4); the descriptors' copies are the op's check's to fill. */
static inline void rn_fused_call_init(rn_fused_call *c, size_t rows, size_t d) {
  c->rows = rows, c->d = d;
  c->x = c->weight = c->bias = c->weight_pre = NULL;
  c->u = c->y = c->rstd = c->rstd_pre = c->scales = NULL;
  c->ldx = c->ldu = c->ldy = c->lds = 0;
  c->quant_arg = NULL;
  c->gate_arg = NULL;
}

/* The function over rows and its argument (in the call's memory). */
typedef struct rn_rows_job {
  rn_rows_fn fn;
  const void *arg;
} rn_rows_job;

typedef struct rn_fused_op {
  /* The split of rows x d of es-byte elements (lock held). */
  rn_split (*split)(const rmsnorm_context *ctx, size_t rows, size_t d, size_t es);
  /* The call's checks after the config and the data strides: its own
   * arguments and, where rows > 0, its pointers and buffers (rn_entry_check). */
  rmsnorm_status (*check)(rn_entry *e, rn_fused_call *c);
  /* The bytes its job needs beyond the parameter copies (e->kernels set;
   * may choose the weight read in place, before the parameters convert). */
  size_t (*bytes)(rn_entry *e, const rn_fused_call *c, rn_split split);
  /* The job in mem (those bytes, 64-byte aligned), the parameters converted. */
  rn_rows_job (*prepare)(const rn_entry *e, const rn_fused_call *c, rn_split split, char *mem);
} rn_fused_op;

extern const rn_fused_op rn_sandwich_forward_op, rn_quantized_op, rn_add_quantized_op,
    rn_gated_forward_op;

/* An op's steps are defined with RN_FUSED_STEP: inlined into its one-shot
 * call (a plan calls them through the table). Out of line they cost a
 * one-row call 75-96 instructions more (the arguments through the call
 * struct and four calls). */
#define RN_FUSED_STEP static inline __attribute__((always_inline))

/* A one-shot call of op after rn_entry_begin and its strides: check, lock,
 * split, the context's scratch, the job, its run, unlock. Inline, and called
 * in the op's own file with its constant table, so that the compiler calls
 * (and inlines) the steps directly. */
static inline rmsnorm_status rn_fused_oneshot(rn_entry *e, const rn_fused_op *op,
                                              rn_fused_call *c) {
  rmsnorm_status st = op->check(e, c);
  if (st != RMSNORM_OK || c->rows == 0) return st;
  rn_entry_lock(e);
  rn_split split = op->split(e->ctx, c->rows, c->d, e->es);
  char *mem = rn_entry_scratch(e, op->bytes(e, c, split));
  if (!mem) return rn_entry_unlock(e, RMSNORM_ERROR_OUT_OF_MEMORY);
  rn_rows_job job = op->prepare(e, c, split, mem);
  rn_run_rows(e->ctx, split, c->rows, job.fn, job.arg);
  return rn_entry_unlock(e, RMSNORM_OK);
}

#endif
