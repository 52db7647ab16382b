/* fused.c - the public entry points of the transformer-block fusions:
 * residual add + RMSNorm (forward, backward), RMSNorm with int8/fp8 output,
 * QK-norm over [tokens, heads, head_dim], and RMSNorm + linear with the gain
 * folded into the weights. Each validates everything once (nothing written on
 * error), then drives the kernel set's row kernels over the context's
 * threads; the per-element work is in the kernels (ref/fused_ref.inc is the
 * spec), the GEMMs in the BLAS (blas.c). */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "runtime/blas.h"
#include "runtime/context.h"
#include "numerics/dtype.h"
#include "kernels/kernels.h"
#include "numerics/rescue.h"
#include "numerics/rowmath.h"
#include "numerics/validate.h"
#include "runtime/work.h"

#define NONE ((size_t)-1) /* no in-place view in rn_check_overlaps */

/* Shape checks shared by the row-wise entry points: config (minus `refused`
 * flags; read into *cfg_local, which the caller uses from then on), d > 0,
 * and each rows x d matrix's stride and extent. */
static rmsnorm_status check_rows(rmsnorm_context *ctx, const rmsnorm_config **cfg,
                                 rmsnorm_config *cfg_local, unsigned refused, size_t rows,
                                 size_t d, const size_t *lds, size_t nld) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_status st = rn_check_config(*cfg, cfg_local, RN_RMSNORM, refused);
  if (st != RMSNORM_OK) return st;
  *cfg = cfg_local;
  if (d == 0) return RMSNORM_ERROR_BAD_SIZE;
  for (size_t i = 0; i < nld; i++)
    if ((st = rn_check_matrix(rows, d, lds[i], rn_dtype_size(cfg_local->dtype))) != RMSNORM_OK)
      return st;
  return RMSNORM_OK;
}

/* Rows per block of the fused loops: about 32 KiB of one operand, so a block
 * written by one kernel is still in L1/L2 when the next reads it. */
static size_t block_rows(size_t d, size_t es) {
  size_t b = ((size_t)32 << 10) / (d * es);
  return b < 1 ? 1 : b;
}

/* ======================= residual add + RMSNorm ======================== */

typedef struct add_fwd_job {
  const rn_kernel_set *ks;
  rn_add_args add;     /* h = h + u */
  rn_forward_args fwd; /* y = RMSNorm(h) */
  size_t rows, block;
} add_fwd_job;

/* Each block of rows: the add writes h' (kept in cache), the forward reads
 * it back for its statistics and output. One trip to memory per operand. */
static void add_fwd_task(void *p, int t, int n) {
  const add_fwd_job *job = p;
  rmsnorm_dtype dt = job->add.dtype;
  size_t r1 = rn_split_begin(job->rows, t + 1, n);
  for (size_t r = rn_split_begin(job->rows, t, n); r < r1; r += job->block) {
    size_t e = r + job->block < r1 ? r + job->block : r1;
    job->ks->add[dt](&job->add, r, e);
    job->ks->forward[dt](&job->fwd, r, e);
  }
}

rmsnorm_status rmsnorm_add_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows,
                                   size_t d, void *h, size_t ldh, const void *u, size_t ldu,
                                   const void *weight, const void *bias, void *y, size_t ldy,
                                   void *rstd) {
  const size_t lds[3] = {ldh, ldu, ldy};
  rmsnorm_config cfg_local;
  rmsnorm_status st =
      check_rows(ctx, &cfg, &cfg_local, RMSNORM_FLAG_ACCUMULATE, rows, d, lds, 3);
  if (st != RMSNORM_OK || rows == 0) return st;
  if (!h || !u || !y) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  /* h is an output: it must not meet anything; y may be exactly u */
  rn_span s[6] = {rn_matrix_span(h, rows, d, ldh, es, 1), rn_matrix_span(u, rows, d, ldu, es, 0),
                  rn_matrix_span(y, rows, d, ldy, es, 1), rn_vector_span(weight, d, ps, 0),
                  rn_vector_span(bias, d, ps, 0),      rn_vector_span(rstd, rows, as, 1)};
  if ((st = rn_check_overlaps(s, 6, 2, 1, NONE)) != RMSNORM_OK) return st;

  size_t wcopy = rn_param_needs_copy(cfg, weight, 1) ? rn_align64(d * as) : 0;
  size_t bcopy = rn_param_needs_copy(cfg, bias, 0) ? rn_align64(d * as) : 0;
  rn_context_lock(ctx);
  char *scratch = rn_context_scratch(ctx, wcopy + bcopy);
  if (!scratch) return RMSNORM_ERROR_OUT_OF_MEMORY;
  add_fwd_job job;
  job.ks = rn_context_kernels(ctx);
  job.add = (rn_add_args){cfg->dtype, d, h, ldh, u, ldu, h, ldh};
  job.fwd = (rn_forward_args){RN_RMSNORM, cfg->dtype, d, rn_partial_k(cfg->partial, d),
                              h, ldh, y, ldy,
                              rn_param_as_acc(cfg, weight, 1, d, scratch),
                              rn_param_as_acc(cfg, bias, 0, d, scratch + wcopy),
                              cfg->eps, cfg->flags, NULL, rstd,
                              /* streamed, but not as DRAM-sized (2): the add has
                               * just brought the block's h into the caches */
                              rn_stream_ok(y != u, y, es, rows * d * es) != 0};
  job.rows = rows;
  job.block = block_rows(d, es);
  rn_run_tasks(ctx, rn_split_for(ctx, rows, rows * d * 4 * es, rows), add_fwd_task, &job);
  rn_context_unlock(ctx);
  return RMSNORM_OK;
}

/* Backward. Forward: h' = h + u, y = RMSNorm(h'), and h' goes on down the
 * residual stream. So dL/dh' = dres + J^T dy with J^T dy = rmsnorm_backward,
 * and h' = h + u gives dL/dh = dL/du = dL/dh'. Per block of rows the norm's
 * dx goes to a per-task buffer (rounded to the dtype, as rmsnorm_backward
 * writes it), then dh = dx + dres; the buffer lets dh be dres or dy. */
typedef struct add_bwd_job {
  const rn_kernel_set *ks;
  rn_backward_args bwd; /* dx of the norm; dx unused when dres is present */
  const void *dres;
  size_t lddres, lddh, block, task_bytes;
  void *dh;
  char *task_scratch; /* (ntasks, block, d) of the dtype */
} add_bwd_job;

static void add_bwd_chunk(void *p, size_t r0, size_t r1, void *dw_part, void *db_part, int t) {
  const add_bwd_job *job = p;
  const rn_backward_args *a = &job->bwd;
  rn_backward_fn kernel = job->ks->backward[a->dtype];
  if (!job->dres) { /* dh is the norm's dx */
    kernel(a, r0, r1, dw_part, db_part);
    return;
  }
  size_t es = rn_dtype_size(a->dtype), as = rn_acc_size(a->dtype);
  char *buf = job->task_scratch + (size_t)t * job->task_bytes;
  for (size_t r = r0; r < r1; r += job->block) {
    size_t n = r + job->block < r1 ? job->block : r1 - r;
    rn_backward_args b = *a; /* this block's rows, from row 0 */
    b.x = (const char *)a->x + r * a->ldx * es;
    b.dy = (const char *)a->dy + r * a->lddy * es;
    b.dx = buf;
    b.lddx = a->d;
    b.rstd = a->rstd ? (const char *)a->rstd + r * as : NULL;
    b.stream = 0;
    kernel(&b, 0, n, dw_part, db_part);
    rn_add_args add = {a->dtype, a->d, buf, a->d, (const char *)job->dres + r * job->lddres * es,
                       job->lddres, (char *)job->dh + r * job->lddh * es, job->lddh};
    job->ks->add[a->dtype](&add, 0, n);
  }
}

rmsnorm_status rmsnorm_add_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows,
                                    size_t d, const void *h, size_t ldh, const void *dy,
                                    size_t lddy, const void *dres, size_t lddres,
                                    const void *weight, const void *rstd, void *dh, size_t lddh,
                                    void *dweight, void *dbias) {
  const size_t lds[4] = {ldh, lddy, lddh, dres ? lddres : d};
  rmsnorm_config cfg_local;
  rmsnorm_status st = check_rows(ctx, &cfg, &cfg_local, 0, rows, d, lds, 4);
  if (st != RMSNORM_OK) return st;
  if (dweight && !weight) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  if (!h || !dy || !dh) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  rn_span s[8] = {rn_matrix_span(h, rows, d, ldh, es, 0),
                  rn_matrix_span(dy, rows, d, lddy, es, 0),
                  dres ? rn_matrix_span(dres, rows, d, lddres, es, 0) : rn_vector_span(NULL, 0, es, 0),
                  rn_matrix_span(dh, rows, d, lddh, es, 1),
                  rn_vector_span(weight, d, ps, 0),
                  rn_vector_span(rstd, rows, as, 0),
                  rn_vector_span(dweight, d, ps, 1),
                  rn_vector_span(dbias, d, ps, 1)};
  if ((st = rn_check_overlaps(s, 8, 3, 1, 2)) != RMSNORM_OK) return st;

  rn_context_lock(ctx);
  size_t nchunks = (rows + RN_BACKWARD_CHUNK_ROWS - 1) / RN_BACKWARD_CHUNK_ROWS;
  rn_grad_plan plan;
  if (!rn_grad_plan_init(&plan, cfg, rows, RN_BACKWARD_CHUNK_ROWS, d, dweight, dbias,
                         rn_split_for(ctx, rows, rows * d * (dres ? 4 : 3) * es, nchunks))) {
    rn_context_unlock(ctx);
    return RMSNORM_ERROR_OUT_OF_MEMORY;
  }
  int ntasks = plan.ntasks;
  size_t block = block_rows(d, es);
  size_t task_bytes = dres ? rn_align64(block * d * es) : 0;
  size_t wcopy = rn_param_needs_copy(cfg, weight, 1) ? rn_align64(d * as) : 0;
  size_t bytes = wcopy + plan.bytes + (size_t)ntasks * task_bytes;
  char *scratch = rn_context_scratch(ctx, bytes);
  if (!scratch) return RMSNORM_ERROR_OUT_OF_MEMORY;
  add_bwd_job job;
  job.ks = rn_context_kernels(ctx);
  job.bwd = (rn_backward_args){RN_RMSNORM, cfg->dtype, d, rn_partial_k(cfg->partial, d),
                               h, ldh, dy, lddy, dh, lddh,
                               rn_param_as_acc(cfg, weight, 1, d, scratch),
                               cfg->eps, cfg->flags, NULL, rstd,
                               rn_stream_ok(!dres && dh != dy, dh, es, rows * d * es)};
  job.dres = dres;
  job.lddres = lddres;
  job.lddh = lddh;
  job.dh = dh;
  job.block = block;
  job.task_bytes = task_bytes;
  job.task_scratch = scratch + wcopy + plan.bytes;
  rn_grad_run(ctx, &plan, scratch + wcopy, add_bwd_chunk, &job);
  rn_context_unlock(ctx);
  return RMSNORM_OK;
}

/* =========================== quantized output ========================== */

typedef struct quant_job {
  rn_quant_fn kernel;
  rn_quant_args args;
  size_t rows, task_bytes;
  char *task_scratch;
} quant_job;

static void quant_task(void *p, int t, int n) {
  const quant_job *job = p;
  job->kernel(&job->args, rn_split_begin(job->rows, t, n), rn_split_begin(job->rows, t + 1, n),
              job->task_scratch + (size_t)t * job->task_bytes);
}

rmsnorm_status rmsnorm_forward_quant(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                     size_t rows, size_t d, const void *x, size_t ldx,
                                     const void *weight, const void *bias, rmsnorm_qtype qtype,
                                     const float *static_scale, void *q, size_t ldq,
                                     float *scale, void *rstd) {
  const size_t lds[1] = {ldx};
  rmsnorm_config cfg_local;
  rmsnorm_status st =
      check_rows(ctx, &cfg, &cfg_local, RMSNORM_FLAG_ACCUMULATE, rows, d, lds, 1);
  if (st != RMSNORM_OK) return st;
  if ((st = rn_check_matrix(rows, d, ldq, 1)) != RMSNORM_OK) return st;
  if (qtype != RMSNORM_Q_INT8 && qtype != RMSNORM_Q_FP8_E4M3) return RMSNORM_ERROR_BAD_ARGUMENT;
  float s0 = static_scale ? rn_ld_f32(static_scale, 0) : 0.0f;
  if (static_scale && (!(s0 > 0 && s0 <= FLT_MAX) || scale))
    return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  if (!x || !q || (!static_scale && !scale)) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  rn_span s[7] = {rn_matrix_span(x, rows, d, ldx, es, 0),   rn_matrix_span(q, rows, d, ldq, 1, 1),
                  rn_vector_span(weight, d, ps, 0),         rn_vector_span(bias, d, ps, 0),
                  rn_vector_span(static_scale, 1, 4, 0),    rn_vector_span(scale, rows, 4, 1),
                  rn_vector_span(rstd, rows, as, 1)};
  if ((st = rn_check_overlaps(s, 7, NONE, NONE, NONE)) != RMSNORM_OK) return st;

  rn_context_lock(ctx);
  rn_split sp = rn_split_for(ctx, rows, rows * d * (es + 1), rows);
  int ntasks = sp.tasks;
  size_t wcopy = rn_param_needs_copy(cfg, weight, 1) ? rn_align64(d * as) : 0;
  size_t bcopy = rn_param_needs_copy(cfg, bias, 0) ? rn_align64(d * as) : 0;
  size_t task_bytes = RN_QUANT_SCRATCH(d);
  size_t bytes = wcopy + bcopy + (size_t)ntasks * task_bytes;
  char *scratch = rn_context_scratch(ctx, bytes);
  if (!scratch) return RMSNORM_ERROR_OUT_OF_MEMORY;
  quant_job job;
  job.kernel = rn_context_kernels(ctx)->quant[cfg->dtype];
  job.args.f = (rn_forward_args){RN_RMSNORM, cfg->dtype, d, rn_partial_k(cfg->partial, d),
                                 x, ldx, NULL, 0,
                                 rn_param_as_acc(cfg, weight, 1, d, scratch),
                                 rn_param_as_acc(cfg, bias, 0, d, scratch + wcopy),
                                 cfg->eps, cfg->flags, NULL, rstd,
                                 /* rn_stream_ok's tiers on the input's size (bytes:
                                  * no alignment to meet); kernels prefetch from 1,
                                  * repeatedly from 2 (DRAM-sized) */
                                 rn_stream_ok(1, q, 1, rows * d * es)};
  job.args.fp8 = qtype == RMSNORM_Q_FP8_E4M3;
  job.args.q = q;
  job.args.ldq = ldq;
  job.args.scale = scale;
  job.args.static_scale = s0;
  job.rows = rows;
  job.task_bytes = task_bytes;
  job.task_scratch = scratch + wcopy + bcopy;
  rn_run_tasks(ctx, sp, quant_task, &job);
  rn_context_unlock(ctx);
  return RMSNORM_OK;
}

/* =============================== QK-norm =============================== */

/* A [tokens, heads] grid of rows of hd elements whose rows do not overlap:
 * token-major (heads inside a token) or head-major. A stride that is never
 * used (one head, or one token) is not checked. */
static rmsnorm_status check_grid(size_t tokens, size_t heads, size_t hd, size_t ld_t,
                                 size_t ld_h, size_t es) {
  size_t inner;
  /* token-major: each token's heads are a heads x hd matrix of stride ld_h */
  if (rn_check_matrix(heads, hd, ld_h, es) == RMSNORM_OK &&
      (inner = heads > 1 ? (heads - 1) * ld_h + hd : hd,
       rn_check_matrix(tokens, inner, ld_t, es) == RMSNORM_OK))
    return RMSNORM_OK;
  if (rn_check_matrix(tokens, hd, ld_t, es) == RMSNORM_OK &&
      (inner = tokens > 1 ? (tokens - 1) * ld_t + hd : hd,
       rn_check_matrix(heads, inner, ld_h, es) == RMSNORM_OK))
    return RMSNORM_OK;
  /* an overflow of either layout is a size error, anything else a stride one */
  if ((heads > 1 && ld_h > SIZE_MAX / heads) || (tokens > 1 && ld_t > SIZE_MAX / tokens))
    return RMSNORM_ERROR_BAD_SIZE;
  return RMSNORM_ERROR_BAD_STRIDE;
}

/* One head (MQA/GQA K) never uses its head stride, one token its token
 * stride: such a stride is set so that the rows form one list of stride
 * ld_head (the kernels' fast path). */
static void qk_unused_strides(size_t tokens, size_t heads, size_t *ld_t, size_t *ld_h) {
  if (heads == 1) *ld_h = *ld_t;
  if (tokens == 1) *ld_t = heads * *ld_h;
}

/* The per-buffer strides of a QK-norm call. */
typedef struct qk_strides {
  size_t tokens, heads;
  size_t x_t, y_t, dy_t; /* token strides (elements); y is dx in the backward */
  int flat;              /* every buffer has token stride = heads * head stride:
                            tokens*heads plain rows */
} qk_strides;

typedef struct qk_fwd_job {
  rn_forward_fn kernel;
  rn_forward_args args; /* one token's heads: x/y/rstd re-based per token */
  qk_strides g;
} qk_fwd_job;

static void qk_fwd_task(void *p, int t, int n) {
  const qk_fwd_job *job = p;
  const qk_strides *g = &job->g;
  size_t t0 = rn_split_begin(g->tokens, t, n), t1 = rn_split_begin(g->tokens, t + 1, n);
  if (g->flat) { /* all of this task's rows in one call */
    job->kernel(&job->args, t0 * g->heads, t1 * g->heads);
    return;
  }
  size_t es = rn_dtype_size(job->args.dtype), as = rn_acc_size(job->args.dtype);
  for (size_t tok = t0; tok < t1; tok++) {
    rn_forward_args a = job->args;
    a.x = (const char *)a.x + tok * g->x_t * es;
    a.y = (char *)a.y + tok * g->y_t * es;
    if (a.rstd) a.rstd = (char *)a.rstd + tok * g->heads * as;
    a.stream = 0;
    job->kernel(&a, 0, g->heads);
  }
}

rmsnorm_status rmsnorm_qk_norm_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                       size_t tokens, size_t heads, size_t head_dim,
                                       const void *x, size_t ldx_token, size_t ldx_head,
                                       const void *weight, const void *bias, void *y,
                                       size_t ldy_token, size_t ldy_head, void *rstd) {
  rmsnorm_config cfg_local;
  rmsnorm_status st =
      check_rows(ctx, &cfg, &cfg_local, RMSNORM_FLAG_ACCUMULATE, 0, head_dim, NULL, 0);
  if (st != RMSNORM_OK) return st;
  if (heads == 0 && tokens != 0) return RMSNORM_ERROR_BAD_SIZE;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  if (tokens == 0) return RMSNORM_OK;
  if ((st = check_grid(tokens, heads, head_dim, ldx_token, ldx_head, es)) != RMSNORM_OK ||
      (st = check_grid(tokens, heads, head_dim, ldy_token, ldy_head, es)) != RMSNORM_OK)
    return st;
  if (tokens > SIZE_MAX / heads) return RMSNORM_ERROR_BAD_SIZE;
  size_t rows = tokens * heads;
  if (!x || !y) return RMSNORM_ERROR_NULL_POINTER;
  /* an unused stride takes the value that makes the rows one flat list */
  qk_unused_strides(tokens, heads, &ldx_token, &ldx_head);
  qk_unused_strides(tokens, heads, &ldy_token, &ldy_head);
  rn_span s[5] = {rn_grid_span(x, tokens, ldx_token, heads, ldx_head, head_dim, es, 0),
                  rn_grid_span(y, tokens, ldy_token, heads, ldy_head, head_dim, es, 1),
                  rn_vector_span(weight, head_dim, ps, 0), rn_vector_span(bias, head_dim, ps, 0),
                  rn_vector_span(rstd, rows, as, 1)};
  if ((st = rn_check_overlaps(s, 5, 1, 0, NONE)) != RMSNORM_OK) return st;

  size_t wcopy = rn_param_needs_copy(cfg, weight, 1) ? rn_align64(head_dim * as) : 0;
  size_t bcopy = rn_param_needs_copy(cfg, bias, 0) ? rn_align64(head_dim * as) : 0;
  rn_context_lock(ctx);
  char *scratch = rn_context_scratch(ctx, wcopy + bcopy);
  if (!scratch) return RMSNORM_ERROR_OUT_OF_MEMORY;
  qk_fwd_job job;
  job.kernel = rn_context_kernels(ctx)->forward[cfg->dtype];
  job.g = (qk_strides){tokens, heads, ldx_token, ldy_token, 0,
                       ldx_token == heads * ldx_head && ldy_token == heads * ldy_head};
  job.args = (rn_forward_args){RN_RMSNORM, cfg->dtype, head_dim,
                               rn_partial_k(cfg->partial, head_dim),
                               x, ldx_head, y, ldy_head,
                               rn_param_as_acc(cfg, weight, 1, head_dim, scratch),
                               rn_param_as_acc(cfg, bias, 0, head_dim, scratch + wcopy),
                               cfg->eps, cfg->flags, NULL, rstd,
                               rn_stream_ok(job.g.flat && y != x, y, es, rows * head_dim * es)};
  rn_run_tasks(ctx, rn_split_for(ctx, rows, rows * head_dim * 2 * es, tokens), qk_fwd_task,
               &job);
  rn_context_unlock(ctx);
  return RMSNORM_OK;
}

typedef struct qk_bwd_job {
  rn_backward_fn kernel;
  rn_backward_args args;
  qk_strides g;
} qk_bwd_job;

/* Tokens [t0, t1): their rows in order, adding into this chunk's partials. */
static void qk_bwd_chunk(void *p, size_t t0, size_t t1, void *dw_part, void *db_part, int t) {
  const qk_bwd_job *job = p;
  const qk_strides *g = &job->g;
  (void)t;
  if (g->flat) {
    job->kernel(&job->args, t0 * g->heads, t1 * g->heads, dw_part, db_part);
    return;
  }
  size_t es = rn_dtype_size(job->args.dtype), as = rn_acc_size(job->args.dtype);
  for (size_t tok = t0; tok < t1; tok++) {
    rn_backward_args a = job->args;
    a.x = (const char *)a.x + tok * g->x_t * es;
    a.dy = (const char *)a.dy + tok * g->dy_t * es;
    a.dx = (char *)a.dx + tok * g->y_t * es;
    if (a.rstd) a.rstd = (const char *)a.rstd + tok * g->heads * as;
    a.stream = 0;
    job->kernel(&a, 0, g->heads, dw_part, db_part);
  }
}

rmsnorm_status rmsnorm_qk_norm_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                        size_t tokens, size_t heads, size_t head_dim,
                                        const void *x, size_t ldx_token, size_t ldx_head,
                                        const void *dy, size_t lddy_token, size_t lddy_head,
                                        const void *weight, const void *rstd, void *dx,
                                        size_t lddx_token, size_t lddx_head, void *dweight,
                                        void *dbias) {
  rmsnorm_config cfg_local;
  rmsnorm_status st = check_rows(ctx, &cfg, &cfg_local, 0, 0, head_dim, NULL, 0);
  if (st != RMSNORM_OK) return st;
  if (heads == 0 && tokens != 0) return RMSNORM_ERROR_BAD_SIZE;
  if (dweight && !weight) return RMSNORM_ERROR_BAD_ARGUMENT;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  if (tokens == 0) return RMSNORM_OK;
  if ((st = check_grid(tokens, heads, head_dim, ldx_token, ldx_head, es)) != RMSNORM_OK ||
      (st = check_grid(tokens, heads, head_dim, lddy_token, lddy_head, es)) != RMSNORM_OK ||
      (st = check_grid(tokens, heads, head_dim, lddx_token, lddx_head, es)) != RMSNORM_OK)
    return st;
  if (tokens > SIZE_MAX / heads) return RMSNORM_ERROR_BAD_SIZE;
  size_t rows = tokens * heads;
  if (!x || !dy || !dx) return RMSNORM_ERROR_NULL_POINTER;
  qk_unused_strides(tokens, heads, &ldx_token, &ldx_head);
  qk_unused_strides(tokens, heads, &lddy_token, &lddy_head);
  qk_unused_strides(tokens, heads, &lddx_token, &lddx_head);
  rn_span s[7] = {rn_grid_span(x, tokens, ldx_token, heads, ldx_head, head_dim, es, 0),
                  rn_grid_span(dy, tokens, lddy_token, heads, lddy_head, head_dim, es, 0),
                  rn_grid_span(dx, tokens, lddx_token, heads, lddx_head, head_dim, es, 1),
                  rn_vector_span(weight, head_dim, ps, 0),
                  rn_vector_span(rstd, rows, as, 0),
                  rn_vector_span(dweight, head_dim, ps, 1),
                  rn_vector_span(dbias, head_dim, ps, 1)};
  if ((st = rn_check_overlaps(s, 7, 2, 1, 0)) != RMSNORM_OK) return st;

  /* chunks of whole tokens, about RN_BACKWARD_CHUNK_ROWS rows each: fixed by
   * the shape alone, so the reduction's order never depends on threads */
  size_t chunk_tokens = (RN_BACKWARD_CHUNK_ROWS + heads - 1) / heads;
  size_t nchunks = (tokens + chunk_tokens - 1) / chunk_tokens;
  size_t wcopy = rn_param_needs_copy(cfg, weight, 1) ? rn_align64(head_dim * as) : 0;
  rn_context_lock(ctx);
  rn_grad_plan plan;
  if (!rn_grad_plan_init(&plan, cfg, tokens, chunk_tokens, head_dim, dweight, dbias,
                         rn_split_for(ctx, rows, rows * head_dim * 3 * es, nchunks))) {
    rn_context_unlock(ctx);
    return RMSNORM_ERROR_OUT_OF_MEMORY;
  }
  char *scratch = rn_context_scratch(ctx, wcopy + plan.bytes);
  if (!scratch) return RMSNORM_ERROR_OUT_OF_MEMORY;
  qk_bwd_job job;
  job.kernel = rn_context_kernels(ctx)->backward[cfg->dtype];
  job.g = (qk_strides){tokens, heads, ldx_token, lddx_token, lddy_token,
                       ldx_token == heads * ldx_head && lddx_token == heads * lddx_head &&
                           lddy_token == heads * lddy_head};
  job.args = (rn_backward_args){RN_RMSNORM, cfg->dtype, head_dim,
                                rn_partial_k(cfg->partial, head_dim),
                                x, ldx_head, dy, lddy_head, dx, lddx_head,
                                rn_param_as_acc(cfg, weight, 1, head_dim, scratch),
                                cfg->eps, cfg->flags, NULL, rstd,
                                rn_stream_ok(job.g.flat && dx != dy && dx != x, dx, es,
                                             rows * head_dim * es)};
  rn_grad_run(ctx, &plan, scratch + wcopy, qk_bwd_chunk, &job);
  rn_context_unlock(ctx);
  return RMSNORM_OK;
}

/* ======================= RMSNorm + linear (folded) ====================== */

rmsnorm_status rmsnorm_linear_available(void) {
  return rn_blas_available() ? RMSNORM_OK : RMSNORM_ERROR_NOT_AVAILABLE;
}

/* The gain in the compute type as the forward forms it (1 + g for offset). */
static double gain_at(const rmsnorm_config *cfg, const void *weight, size_t j) {
  if (!weight) return 1.0;
  double g = rn_load(weight, cfg->param_dtype, j);
  int f64 = rn_acc_is_f64(cfg->dtype);
  if (!(cfg->flags & RMSNORM_FLAG_WEIGHT_OFFSET)) return f64 ? g : (double)(float)g;
  return f64 ? 1.0 + g : (double)(1.0f + (float)g);
}

rmsnorm_status rmsnorm_fold_weight(const rmsnorm_config *cfg, size_t d, size_t n,
                                   const void *weight, const void *w, size_t ldw,
                                   void *w_folded, size_t ldwf) {
  rmsnorm_config cfg_local;
  rmsnorm_status st = rn_check_config(cfg, &cfg_local, RN_RMSNORM, RMSNORM_FLAG_ACCUMULATE);
  if (st != RMSNORM_OK) return st;
  cfg = &cfg_local;
  if (d == 0 || n == 0) return RMSNORM_ERROR_BAD_SIZE;
  size_t as = rn_acc_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  if ((st = rn_check_matrix(d, n, ldw, as)) != RMSNORM_OK ||
      (st = rn_check_matrix(d, n, ldwf, as)) != RMSNORM_OK)
    return st;
  if (!w || !w_folded) return RMSNORM_ERROR_NULL_POINTER;
  rn_span s[3] = {rn_matrix_span(w, d, n, ldw, as, 0), rn_matrix_span(w_folded, d, n, ldwf, as, 1),
                  rn_vector_span(weight, d, ps, 0)};
  if ((st = rn_check_overlaps(s, 3, 1, 0, NONE)) != RMSNORM_OK) return st;
  int f64 = rn_acc_is_f64(cfg->dtype);
  for (size_t j = 0; j < d; j++) { /* W and W': any address */
    double g = gain_at(cfg, weight, j);
    if (f64) {
      const char *src = (const char *)w + j * ldw * 8;
      char *dst = (char *)w_folded + j * ldwf * 8;
      for (size_t k = 0; k < n; k++) rn_st_f64(dst, k, g * rn_ld_f64(src, k));
    } else {
      const char *src = (const char *)w + j * ldw * 4;
      char *dst = (char *)w_folded + j * ldwf * 4;
      for (size_t k = 0; k < n; k++) rn_st_f32(dst, k, (float)g * rn_ld_f32(src, k));
    }
  }
  return RMSNORM_OK;
}

/* The row statistics pass of the linear ops. */
typedef struct lin_stats_job {
  rn_rstd_fn kernel;
  rn_forward_args args; /* r of x's rows into args.rstd (acc) */
  size_t rows, d;
  char *row_scratch;    /* (ntasks, RN_QUANT_SCRATCH(d)) for rescued rows */
} lin_stats_job;

static void lin_stats_task(void *p, int t, int n) {
  const lin_stats_job *job = p;
  job->kernel(&job->args, rn_split_begin(job->rows, t, n), rn_split_begin(job->rows, t + 1, n),
              job->row_scratch + (size_t)t * RN_QUANT_SCRATCH(job->d));
}

/* r of every row of x into r (acc), with the kernel set's statistics: the
 * same r as rmsnorm_forward's. row_scratch: ntasks * RN_QUANT_SCRATCH(d). */
static void lin_stats(rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows, size_t d,
                      const void *x, size_t ldx, void *r, char *row_scratch, rn_split sp) {
  lin_stats_job job = {rn_context_kernels(ctx)->rstd[cfg->dtype],
                       {RN_RMSNORM, cfg->dtype, d, rn_partial_k(cfg->partial, d), x, ldx, NULL, 0,
                        NULL, NULL, cfg->eps, cfg->flags, NULL, r, 0},
                       rows, d, row_scratch};
  rn_run_tasks(ctx, sp, lin_stats_task, &job);
}

/* Widens rows [r0, r0+m) x c of src (dtype, ld; any address) into dst (acc,
 * ld_dst; aligned scratch). */
static void widen_rows(rmsnorm_dtype dt, const void *src, size_t ld, size_t r0, size_t m,
                       size_t c, void *dst, size_t ld_dst) {
  size_t es = rn_dtype_size(dt);
  for (size_t i = 0; i < m; i++) {
    const char *s = (const char *)src + (r0 + i) * ld * es;
    if (dt == RMSNORM_F64) {
      memcpy((double *)dst + i * ld_dst, s, c * 8);
    } else if (dt == RMSNORM_F32) {
      memcpy((float *)dst + i * ld_dst, s, c * 4);
    } else {
      float *o = (float *)dst + i * ld_dst;
      for (size_t j = 0; j < c; j++) o[j] = (float)rn_load(s, dt, j);
    }
  }
}

/* Rounds rows of src (acc, ld_src; scratch) to dst (dtype, ld_dst; any
 * address). */
static void narrow_rows(rmsnorm_dtype dt, const void *src, size_t ld_src, size_t m, size_t c,
                        void *dst, size_t ld_dst) {
  int f64 = rn_acc_is_f64(dt);
  for (size_t i = 0; i < m; i++) {
    char *o = (char *)dst + i * ld_dst * rn_dtype_size(dt);
    if (f64) {
      memcpy(o, (const double *)src + i * ld_src, c * 8);
    } else {
      const float *s = (const float *)src + i * ld_src;
      if (dt == RMSNORM_F32)
        memcpy(o, s, c * 4);
      else
        for (size_t j = 0; j < c; j++) rn_store(o, dt, j, s[j]);
    }
  }
}

/* Rows per GEMM chunk where the rows go through scratch: fp16/bf16 data,
 * misaligned fp32/fp64 rows, and the backward. */
#define LIN_CHUNK 256

static int fits_int(size_t v) { return v <= (size_t)INT_MAX; }

/* W' as the GEMMs read it: the caller's matrix, or an aligned copy of it
 * (stride n) when it is not aligned to its element type. */
typedef struct lin_matrix {
  const void *p;
  size_t ld;
} lin_matrix;

static lin_matrix lin_aligned(const void *w, size_t ld, size_t d, size_t n, size_t as,
                              char *copy) {
  lin_matrix m = {w, d > 1 ? ld : n}; /* one row: the BLAS still wants ld >= n */
  if (rn_aligned(w, as)) return m;
  for (size_t j = 0; j < d; j++) memcpy(copy + j * n * as, (const char *)w + j * ld * as, n * as);
  m.p = copy;
  m.ld = n;
  return m;
}

/* What the forward's row finishing needs. */
typedef struct lin_fwd {
  const rmsnorm_config *cfg;
  rn_forward_args stats; /* the norm of x's rows (x, d, k, eps, flags) */
  lin_matrix wf;         /* W' (d x n), aligned */
  const void *b;         /* bias (n,) acc, or NULL */
  const char *r;         /* r of every row (acc) */
  size_t n;
  char *xs, *zs;         /* (d,) and (n,) acc: one row recomputed in scaled form */
} lin_fwd;

/* Row `row` of Z recomputed where the GEMM on unscaled x cannot be trusted:
 * its r outside the compute type's normal range, or a product that left the
 * range (|x| ~ 1e37 makes x W' overflow although RMSNorm(x) W' is modest).
 * The GEMM then runs on x_j * 2^s with 2^s the power of two at or below r,
 * which is xhat_j within a factor of two: it overflows only where
 * RMSNorm(X) W' does. r comes from the rescue path in its scaled form
 * r = rs * 2^-e, so it never leaves double's range either; the remaining
 * factor r / 2^s lies in [1, 2). A row whose statistic meets a NaN/Inf keeps
 * the NaNs the normal pass gave it. */
static void lin_redo_row(const lin_fwd *f, size_t row, void *zrow) {
  rmsnorm_dtype dt = f->cfg->dtype;
  int f64 = rn_acc_is_f64(dt);
  size_t d = f->stats.d, n = f->n;
  double rs;
  int e;
  rn_rescue_row_r(&f->stats, row, &rs, &e);
  if (!isfinite(rs)) return;
  const char *x = (const char *)f->stats.x + row * f->stats.ldx * rn_dtype_size(dt);
  if (rs == 0) { /* a zero row with eps = 0 maps to the bias */
    for (size_t k = 0; k < n; k++) rn_store(zrow, dt, k, f->b ? rn_load_acc(f->b, f64, k) : 0.0);
    return;
  }
  int shift = ilogb(rs) - e; /* 2^shift <= r < 2^(shift+1) */
  for (size_t j = 0; j < d; j++) rn_store_acc(f->xs, f64, j, ldexp(rn_load(x, dt, j), shift));
  rn_gemm(f64, 0, 0, 1, n, d, 1.0, f->xs, d, f->wf.p, f->wf.ld, 0.0, f->zs, n);
  double factor = ldexp(rs, -ilogb(rs)); /* r / 2^shift */
  for (size_t k = 0; k < n; k++) {
    double v = factor * rn_load_acc(f->zs, f64, k);
    if (f->b) v += rn_load_acc(f->b, f64, k);
    rn_store(zrow, dt, k, v);
  }
}

/* Z rows [r0, r0+m): z_k = r * g_k + b_k from the GEMM's g (acc, ld_src),
 * rounded once to the dtype into dst (any address); rows the GEMM could not
 * be trusted with are recomputed (lin_redo_row). */
static void lin_finish_rows(const lin_fwd *f, size_t r0, size_t m, const void *src,
                            size_t ld_src, void *dst, size_t ld_dst) {
  rmsnorm_dtype dt = f->cfg->dtype;
  int f64 = rn_acc_is_f64(dt);
  size_t n = f->n, es = rn_dtype_size(dt);
  for (size_t i = 0; i < m; i++) {
    char *o = (char *)dst + i * ld_dst * es;
    double rd = rn_load_acc(f->r, f64, r0 + i);
    int bad = !rn_saved_r_usable(rd, f64);
    if (f64) {
      const double *s = (const double *)src + i * ld_src, *b = f->b;
      for (size_t k = 0; k < n; k++) {
        double v = b ? rd * s[k] + b[k] : rd * s[k];
        bad |= !(fabs(v) <= DBL_MAX);
        rn_st_f64(o, k, v);
      }
    } else {
      const float *s = (const float *)src + i * ld_src, *b = f->b;
      float ri = (float)rd;
      for (size_t k = 0; k < n; k++) {
        float v = b ? ri * s[k] + b[k] : ri * s[k];
        bad |= !(fabsf(v) <= FLT_MAX);
        if (dt == RMSNORM_F32)
          rn_st_f32(o, k, v);
        else
          rn_store(o, dt, k, v);
      }
    }
    if (bad) lin_redo_row(f, r0 + i, o);
  }
}

rmsnorm_status rmsnorm_linear_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                      size_t rows, size_t d, size_t n, const void *x,
                                      size_t ldx, const void *w_folded, size_t ldwf,
                                      const void *bias, void *z, size_t ldz, void *rstd) {
  if (!rn_blas_available()) return RMSNORM_ERROR_NOT_AVAILABLE;
  const size_t lds[1] = {ldx};
  rmsnorm_config cfg_local;
  rmsnorm_status st = check_rows(ctx, &cfg, &cfg_local, RMSNORM_FLAG_ACCUMULATE |
                                 RMSNORM_FLAG_ROUND_BEFORE_WEIGHT, rows, d, lds, 1);
  if (st != RMSNORM_OK) return st;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  if (n == 0) return RMSNORM_ERROR_BAD_SIZE;
  if ((st = rn_check_matrix(d, n, ldwf, as)) != RMSNORM_OK ||
      (st = rn_check_matrix(rows, n, ldz, es)) != RMSNORM_OK)
    return st;
  if (!fits_int(rows) || !fits_int(d) || !fits_int(n) || !fits_int(ldx) || !fits_int(ldwf) ||
      !fits_int(ldz))
    return RMSNORM_ERROR_BAD_SIZE;
  if (rows == 0) return RMSNORM_OK;
  if (!x || !w_folded || !z) return RMSNORM_ERROR_NULL_POINTER;
  rn_span s[5] = {rn_matrix_span(x, rows, d, ldx, es, 0),
                  rn_matrix_span(w_folded, d, n, ldwf, as, 0),
                  rn_vector_span(bias, n, ps, 0),
                  rn_matrix_span(z, rows, n, ldz, es, 1),
                  rn_vector_span(rstd, rows, as, 1)};
  if ((st = rn_check_overlaps(s, 5, NONE, NONE, NONE)) != RMSNORM_OK) return st;

  int f64 = rn_acc_is_f64(cfg->dtype);
  /* fp32/fp64 rows aligned to their type go to the GEMM as they lie; others
   * through scratch, in chunks */
  int direct = es == as && rn_aligned(x, es) && rn_aligned(z, es);
  size_t chunk = direct ? 0 : rows < LIN_CHUNK ? rows : LIN_CHUNK;
  rn_context_lock(ctx);
  rn_split sp = rn_split_for(ctx, rows, rows * d * es, rows);
  int ntasks = sp.tasks;
  /* scratch: bias copy | r (rows) | rescue rows (ntasks) | X, Z chunks |
   *          W' copy | one recomputed row (d + n) */
  size_t bcopy = rn_param_needs_copy(cfg, bias, 0) ? rn_align64(n * as) : 0;
  size_t rbytes = rn_align64(rows * as);
  size_t tbytes = (size_t)ntasks * RN_QUANT_SCRATCH(d);
  size_t xbytes = rn_align64(chunk * d * as), zbytes = rn_align64(chunk * n * as);
  size_t wbytes = rn_aligned(w_folded, as) ? 0 : rn_align64(d * n * as);
  size_t fbytes = rn_align64(d * as) + rn_align64(n * as);
  char *scratch =
      rn_context_scratch(ctx, bcopy + rbytes + tbytes + xbytes + zbytes + wbytes + fbytes);
  if (!scratch) return RMSNORM_ERROR_OUT_OF_MEMORY;
  char *r = scratch + bcopy, *xc = r + rbytes + tbytes, *zc = xc + xbytes, *wc = zc + zbytes;
  lin_fwd f;
  f.cfg = cfg;
  f.stats = (rn_forward_args){RN_RMSNORM, cfg->dtype, d, rn_partial_k(cfg->partial, d), x, ldx,
                              NULL, 0, NULL, NULL, cfg->eps, cfg->flags, NULL, r, 0};
  f.wf = lin_aligned(w_folded, ldwf, d, n, as, wc);
  f.b = rn_param_as_acc(cfg, bias, 0, n, scratch);
  f.r = r;
  f.n = n;
  f.xs = wc + wbytes;
  f.zs = f.xs + rn_align64(d * as);
  lin_stats(ctx, cfg, rows, d, x, ldx, r, r + rbytes, sp);

  if (direct) { /* one GEMM straight into z, then the row scale in place */
    /* a matrix of one row uses no stride, but the BLAS checks ld >= columns */
    rn_gemm(f64, 0, 0, rows, n, d, 1.0, x, rows > 1 ? ldx : d, f.wf.p, f.wf.ld, 0.0, z,
            rows > 1 ? ldz : n);
    lin_finish_rows(&f, 0, rows, z, ldz, z, ldz);
  } else { /* chunks widened to the compute type, and rounded back */
    for (size_t r0 = 0; r0 < rows; r0 += chunk) {
      size_t m = rows - r0 < chunk ? rows - r0 : chunk;
      widen_rows(cfg->dtype, x, ldx, r0, m, d, xc, d);
      rn_gemm(f64, 0, 0, m, n, d, 1.0, xc, d, f.wf.p, f.wf.ld, 0.0, zc, n);
      lin_finish_rows(&f, r0, m, zc, n, (char *)z + r0 * ldz * es, ldz);
    }
  }
  if (rstd) memcpy(rstd, r, rows * as);
  rn_context_unlock(ctx);
  return RMSNORM_OK;
}

/* xhat of rows [r0, r0+m) of the chunk xc (acc, stride d) in place, xhat =
 * r x. A row whose r is outside the compute type's normal range (|x| far
 * from 1) takes r in the rescue path's scaled form, r = rs * 2^-e
 * (rn_scaled_mul), which stays in range. */
static void lin_xhat_rows(const rn_forward_args *stats, const char *r, size_t r0, size_t m,
                          char *xc) {
  int f64 = rn_acc_is_f64(stats->dtype);
  size_t d = stats->d;
  for (size_t i = 0; i < m; i++) {
    double ri = rn_load_acc(r, f64, r0 + i);
    if (f64) {
      double *xr = (double *)(void *)xc + i * d;
      if (rn_saved_r_usable(ri, 1)) {
        for (size_t j = 0; j < d; j++) xr[j] *= ri;
        continue;
      }
      double rs;
      int e;
      rn_rescue_row_r(stats, r0 + i, &rs, &e);
      for (size_t j = 0; j < d; j++) xr[j] = rn_scaled_mul(xr[j], rs, e);
    } else {
      float *xr = (float *)(void *)xc + i * d, rf = (float)ri;
      if (rn_saved_r_usable(ri, 0)) {
        for (size_t j = 0; j < d; j++) xr[j] *= rf;
        continue;
      }
      double rs;
      int e;
      rn_rescue_row_r(stats, r0 + i, &rs, &e);
      for (size_t j = 0; j < d; j++) xr[j] = (float)rn_scaled_mul(xr[j], rs, e);
    }
  }
}

/* Backward of Z = diag(r) X W' + 1 bias^T with W' = diag(w) W, matching
 * autograd of the unfused Y = RMSNorm(X; g), Z = Y W + bias:
 *   dbias = sum over rows of dZ.
 *   Unfused: dY = dZ W^T and dW = Y^T dZ = diag(w) Xhat^T dZ, Xhat = diag(r) X.
 *     Let M = Xhat^T dZ (d x n): dW = diag(w) M.
 *   dg_j = sum_i dY_ij xhat_ij (the RMSNorm weight gradient)
 *        = sum_i sum_k dZ_ik W_jk xhat_ij = sum_k W_jk M_jk.
 *   dX: the RMSNorm backward needs gy = dY * w (the gradient at xhat), and
 *     gy_ij = sum_k dZ_ik W_jk w_j = (dZ W'^T)_ij =: G. So dX is the RMSNorm
 *     backward of dy = G with no weight: dx_j = r (G_j - [j<k] xhat_j c),
 *     c = (1/k) sum_j G_j xhat_j (eps outside and partial as in
 *     ref/norm_ref.inc). The backward kernel computes exactly that.
 * Per chunk of rows: G = dZ W'^T (one GEMM), dX from the kernel, then
 * M += Xhat^T dZ (a second GEMM); after all chunks dW, dg from M. */
rmsnorm_status rmsnorm_linear_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                       size_t rows, size_t d, size_t n, const void *x,
                                       size_t ldx, const void *weight, const void *w,
                                       size_t ldw, const void *w_folded, size_t ldwf,
                                       const void *dz, size_t lddz, void *dx, size_t lddx,
                                       void *dweight, void *dw, size_t lddw, void *dbias) {
  if (!rn_blas_available()) return RMSNORM_ERROR_NOT_AVAILABLE;
  const size_t lds[2] = {ldx, lddx};
  rmsnorm_config cfg_local;
  rmsnorm_status st =
      check_rows(ctx, &cfg, &cfg_local, RMSNORM_FLAG_ROUND_BEFORE_WEIGHT, rows, d, lds, 2);
  if (st != RMSNORM_OK) return st;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  if (n == 0) return RMSNORM_ERROR_BAD_SIZE;
  if ((st = rn_check_matrix(d, n, ldwf, as)) != RMSNORM_OK ||
      (w && (st = rn_check_matrix(d, n, ldw, as)) != RMSNORM_OK) ||
      (dw && (st = rn_check_matrix(d, n, lddw, as)) != RMSNORM_OK) ||
      (st = rn_check_matrix(rows, n, lddz, es)) != RMSNORM_OK)
    return st;
  if (!fits_int(rows) || !fits_int(d) || !fits_int(n) || !fits_int(ldwf) || !fits_int(lddz))
    return RMSNORM_ERROR_BAD_SIZE;
  if (dweight && (!weight || !w)) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  if (!x || !w_folded || !dz || !dx) return RMSNORM_ERROR_NULL_POINTER;
  rn_span s[9] = {rn_matrix_span(x, rows, d, ldx, es, 0),
                   rn_vector_span(weight, d, ps, 0),
                   w ? rn_matrix_span(w, d, n, ldw, as, 0) : rn_vector_span(NULL, 0, 1, 0),
                   rn_matrix_span(w_folded, d, n, ldwf, as, 0),
                   rn_matrix_span(dz, rows, n, lddz, es, 0),
                   rn_matrix_span(dx, rows, d, lddx, es, 1),
                   rn_vector_span(dweight, d, ps, 1),
                   dw ? rn_matrix_span(dw, d, n, lddw, as, 1) : rn_vector_span(NULL, 0, 1, 1),
                   rn_vector_span(dbias, n, ps, 1)};
  if ((st = rn_check_overlaps(s, 9, 5, 0, NONE)) != RMSNORM_OK) return st;

  int f64 = rn_acc_is_f64(cfg->dtype);
  rmsnorm_dtype adt = f64 ? RMSNORM_F64 : RMSNORM_F32;
  size_t chunk = rows < LIN_CHUNK ? rows : LIN_CHUNK;
  int need_m = dweight || dw;
  if (need_m && n > SIZE_MAX / 16 / d) return RMSNORM_ERROR_OUT_OF_MEMORY;
  rn_context_lock(ctx);
  rn_split sp = rn_split_for(ctx, rows, rows * d * es, rows);
  int ntasks = sp.tasks;
  /* scratch: r (rows) | rescue rows (ntasks) | X, G (chunk x d) | dZ (chunk x n)
   *          | M (d x n) | dbias sums (n doubles) | W' copy */
  size_t rbytes = rn_align64(rows * as), tbytes = (size_t)ntasks * RN_QUANT_SCRATCH(d);
  size_t xbytes = rn_align64(chunk * d * as), zbytes = rn_align64(chunk * n * as);
  size_t mbytes = need_m ? rn_align64(d * n * as) : 0, sbytes = dbias ? rn_align64(n * 8) : 0;
  size_t wbytes = rn_aligned(w_folded, as) ? 0 : rn_align64(d * n * as);
  char *scratch =
      rn_context_scratch(ctx, rbytes + tbytes + 2 * xbytes + zbytes + mbytes + sbytes + wbytes);
  if (!scratch) return RMSNORM_ERROR_OUT_OF_MEMORY;
  char *r = scratch, *xc = r + rbytes + tbytes, *gc = xc + xbytes, *zc = gc + xbytes;
  char *m = zc + zbytes;
  double *bsum = (double *)(void *)(m + mbytes);
  lin_matrix wf = lin_aligned(w_folded, ldwf, d, n, as, m + mbytes + sbytes);
  if (dbias) memset(bsum, 0, n * sizeof(double));
  rn_forward_args stats = {RN_RMSNORM, cfg->dtype, d, rn_partial_k(cfg->partial, d), x, ldx,
                           NULL, 0, NULL, NULL, cfg->eps, cfg->flags, NULL, r, 0};
  lin_stats(ctx, cfg, rows, d, x, ldx, r, r + rbytes, sp);

  for (size_t r0 = 0; r0 < rows; r0 += chunk) {
    size_t mr = rows - r0 < chunk ? rows - r0 : chunk;
    widen_rows(cfg->dtype, x, ldx, r0, mr, d, xc, d);
    widen_rows(cfg->dtype, dz, lddz, r0, mr, n, zc, n);
    /* G = dZ W'^T: (mr x n)(n x d) */
    rn_gemm(f64, 0, 1, mr, d, n, 1.0, zc, n, wf.p, wf.ld, 0.0, gc, d);
    /* dX = the RMSNorm backward of G with no weight, in place in G */
    rn_backward_args ba = {RN_RMSNORM, adt, d, stats.k, xc, d, gc, d, gc, d,
                           NULL, cfg->eps, cfg->flags, NULL, r + r0 * as, 0};
    rn_context_kernels(ctx)->backward[adt](&ba, 0, mr, NULL, NULL);
    narrow_rows(cfg->dtype, gc, d, mr, d, (char *)dx + r0 * lddx * es, lddx);
    if (need_m) {
      /* Xhat = diag(r) X in place, then M += Xhat^T dZ: (d x mr)(mr x n) */
      lin_xhat_rows(&stats, r, r0, mr, xc);
      rn_gemm(f64, 1, 0, d, n, mr, 1.0, xc, d, zc, n, r0 ? 1.0 : 0.0, m, n);
    }
    if (dbias)
      for (size_t i = 0; i < mr; i++)
        for (size_t k = 0; k < n; k++) bsum[k] += rn_load_acc(zc, f64, i * n + k);
  }

  int acc = (cfg->flags & RMSNORM_FLAG_ACCUMULATE) != 0;
  for (size_t j = 0; j < d && need_m; j++) {
    double g = gain_at(cfg, weight, j), dg = 0;
    for (size_t k = 0; k < n; k++) {
      double mjk = rn_load_acc(m, f64, j * n + k);
      if (dw) {
        /* dW_jk = w_j M_jk in the compute type */
        double v = f64 ? g * mjk : (double)((float)g * (float)mjk);
        if (acc) v += rn_load_acc(dw, f64, j * lddw + k);
        rn_store_acc(dw, f64, j * lddw + k, v);
      }
      if (dweight) dg += rn_load_acc(w, f64, j * ldw + k) * mjk;
    }
    if (dweight) {
      if (acc) dg += rn_load(dweight, cfg->param_dtype, j);
      rn_store(dweight, cfg->param_dtype, j, dg);
    }
  }
  for (size_t k = 0; k < n && dbias; k++) {
    double v = bsum[k];
    if (acc) v += rn_load(dbias, cfg->param_dtype, k);
    rn_store(dbias, cfg->param_dtype, k, v);
  }
  rn_context_unlock(ctx);
  return RMSNORM_OK;
}
