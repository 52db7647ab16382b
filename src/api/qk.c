/* qk.c - the public entry points of QK-norm, forward and backward: RMSNorm
 * over each head's rows of a [tokens, heads, head_dim] query or key tensor,
 * token-major or head-major, one weight of head_dim shared by every head. */
#include <stdint.h>

#include "api/entry.h"
#include "api/grid.h"
#include "numerics/dtype.h"
#include "numerics/rowmath.h"

/* The per-buffer strides of a QK-norm call. */
typedef struct qk_strides {
  size_t tokens, heads;
  size_t x_t, y_t, dy_t; /* token strides (elements); y is dx in the backward */
  int flat;              /* every buffer has token stride = heads * head stride:
                            tokens*heads plain rows */
} qk_strides;

/* ---- forward ------------------------------------------------------------ */

typedef struct qk_fwd_job {
  rn_forward_fn kernel;
  rn_forward_args args; /* one token's heads: x/y/rstd re-based per token */
  qk_strides g;
} qk_fwd_job;

static void qk_fwd_tokens(const void *p, size_t t0, size_t t1, int task) {
  const qk_fwd_job *job = p;
  const qk_strides *g = &job->g;
  (void)task;
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
  rn_entry e;
  size_t rows;
  int flat;
  rmsnorm_status st =
      rn_entry_begin(&e, ctx, &cfg, RN_RMSNORM, RMSNORM_FLAG_ACCUMULATE, head_dim);
  if (st != RMSNORM_OK) return st;
  if (tokens == 0 || heads == 0) return RMSNORM_OK; /* no rows: as rmsnorm_forward's */
  size_t *const ld[2][2] = {{&ldx_token, &ldx_head}, {&ldy_token, &ldy_head}};
  if ((st = rn_check_grids(tokens, heads, head_dim, e.es, ld, 2, &rows, &flat)) != RMSNORM_OK)
    return st;
  if (!x || !y) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = e.es;
  rn_buffers b;
  rn_buffers_empty(&b);
  b.in[0] = rn_inplace(rn_grid(x, tokens, ldx_token, heads, ldx_head, head_dim, es));
  b.out[0] = rn_grid(y, tokens, ldy_token, heads, ldy_head, head_dim, es);
  b.out[1] = rn_vector(rstd, rows, e.as);
  b.weight = weight, b.bias = bias, b.nparam = head_dim;
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;

  rn_split split = rn_split_for(ctx, rows, rows * head_dim * 2 * es, tokens);
  int unlocked = rn_entry_unlocked(&e, split.tasks == 1);
  if (!unlocked && (st = rn_entry_lock_params(&e)) != RMSNORM_OK) return st;
  qk_fwd_job job;
  job.kernel = e.kernels->forward[cfg->dtype];
  job.g = (qk_strides){tokens, heads, ldx_token, ldy_token, 0, flat};
  job.args = rn_entry_forward_args(&e, RN_RMSNORM, head_dim, x, ldx_head, y, ldy_head);
  job.args.rstd = rstd;
  job.args.stream = rn_stream_ok(job.g.flat && y != x, y, es, rows * head_dim * es);
  job.args.past_l3 = 2 * rows * head_dim * es >= RN_PAST_L3_BYTES;
  rn_run_rows(ctx, split, tokens, qk_fwd_tokens, &job);
  return unlocked ? RMSNORM_OK : rn_entry_unlock(&e, RMSNORM_OK);
}

/* ---- backward ----------------------------------------------------------- */

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
  rn_entry e;
  size_t rows;
  int flat;
  rmsnorm_status st = rn_entry_begin(&e, ctx, &cfg, RN_RMSNORM, 0, head_dim);
  if (st != RMSNORM_OK) return st;
  if (dweight && !weight) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (tokens == 0 || heads == 0) return RMSNORM_OK; /* no rows: nothing written */
  size_t *const ld[3][2] = {
      {&ldx_token, &ldx_head}, {&lddy_token, &lddy_head}, {&lddx_token, &lddx_head}};
  if ((st = rn_check_grids(tokens, heads, head_dim, e.es, ld, 3, &rows, &flat)) != RMSNORM_OK)
    return st;
  if (!x || !dy || !dx) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = e.es;
  rn_buffers b = {
      .in = {rn_inplace(rn_grid(x, tokens, ldx_token, heads, ldx_head, head_dim, es)),
             rn_inplace(rn_grid(dy, tokens, lddy_token, heads, lddy_head, head_dim, es)),
             rn_vector(rstd, rows, e.as)},
      .out = {rn_grid(dx, tokens, lddx_token, heads, lddx_head, head_dim, es),
              rn_vector(dweight, head_dim, e.ps), rn_vector(dbias, head_dim, e.ps)},
      .weight = weight, .nparam = head_dim};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;

  size_t nchunks, chunk_tokens = rn_token_chunks(tokens, heads, &nchunks);
  rn_entry_lock(&e);
  rn_grad_plan plan;
  char *sums = rn_entry_grad_scratch(&e, &plan, tokens, chunk_tokens, head_dim, dweight, dbias,
                                     rn_split_for(ctx, rows, rows * head_dim * 3 * es, nchunks),
                                     0);
  if (!sums) return rn_entry_unlock(&e, RMSNORM_ERROR_OUT_OF_MEMORY);
  qk_bwd_job job;
  job.kernel = e.kernels->backward[cfg->dtype];
  job.g = (qk_strides){tokens, heads, ldx_token, lddx_token, lddy_token, flat};
  rn_entry_backward_args(&job.args, &e, RN_RMSNORM, head_dim, x, ldx_head, dy, lddy_head, dx,
                         lddx_head);
  job.args.rstd = rstd;
  job.args.stream =
      rn_stream_ok(job.g.flat && dx != dy && dx != x, dx, es, rows * head_dim * es);
  job.args.past_l3 = 3 * rows * head_dim * es >= RN_PAST_L3_BYTES;
  rn_grad_run(ctx, &plan, sums, qk_bwd_chunk, &job);
  return rn_entry_unlock(&e, RMSNORM_OK);
}
