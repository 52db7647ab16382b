/* norm.c - the public entry points of the plain norms: validate every argument
 * once (nothing is written on error, see validate.h), bring the weight and
 * bias to the compute type, run the chosen kernel set over the rows, and
 * reduce the backward's dweight/dbias partial sums in a fixed order (work.h). */
#include <stdint.h>
#include <string.h>

#include "api/entry.h"
#include "numerics/dtype.h"
#include "numerics/rescue.h"
#include "numerics/rowmath.h"

rmsnorm_status rmsnorm_default_eps(rmsnorm_dtype dtype, double *eps) {
  if (!eps) return RMSNORM_ERROR_NULL_POINTER;
  if (!rn_dtype_valid(dtype)) return RMSNORM_ERROR_BAD_DTYPE;
  /* torch: torch.finfo(opmath type).eps, the opmath type of half/bf16 being float */
  *eps = dtype == RMSNORM_F64 ? 0x1p-52 : 0x1p-23;
  return RMSNORM_OK;
}

rmsnorm_status rmsnorm_config_init_size(rmsnorm_config *cfg, size_t size, rmsnorm_dtype dtype) {
  double eps;
  if (!cfg) return RMSNORM_ERROR_NULL_POINTER;
  if (size < RN_CONFIG_SIZE_V1 || size > RN_CONFIG_MAX) return RMSNORM_ERROR_BAD_CONFIG;
  rmsnorm_status st = rmsnorm_default_eps(dtype, &eps);
  if (st != RMSNORM_OK) return st;
  /* the library's own struct, written up to the caller's size; the bytes of
   * a newer caller's fields stay zero, their defaults */
  rmsnorm_config c;
  memset(&c, 0, sizeof c);
  c.size = size;
  c.dtype = dtype;
  c.param_dtype = dtype;
  c.eps = eps;
  c.partial = 1.0;
  c.flags = 0;
  memset(cfg, 0, size);
  memcpy(cfg, &c, size < sizeof c ? size : sizeof c);
  return RMSNORM_OK;
}

rmsnorm_status rmsnorm_partial_count(double partial, size_t d, size_t *k) {
  if (!k) return RMSNORM_ERROR_NULL_POINTER;
  if (d == 0) return RMSNORM_ERROR_BAD_SIZE;
  if (!(partial > 0 && partial <= 1)) return RMSNORM_ERROR_BAD_PARTIAL;
  *k = rn_partial_k(partial, d);
  return RMSNORM_OK;
}

/* ---- long rows split across threads --------------------------------------- */

/* With fewer rows than threads, rows at least this long are split: the
 * caller's thread computes a row's statistics in the spec's order, then the
 * threads write disjoint column ranges from them (the same bits as unsplit). */
#define SPLIT_ROW_BYTES ((size_t)256 << 10)

static int split_rows(const rmsnorm_context *ctx, size_t rows, size_t d, size_t es) {
  /* the row's length first: a decode-sized call reads no thread count */
  return d * es >= SPLIT_ROW_BYTES && rows < (size_t)rn_context_threads(ctx);
}

/* Column range of task t of n: multiples of 64 elements, the last to d. */
static size_t split_cols(size_t d, int t, int n) {
  return t == n ? d : rn_split_begin(d, t, n) & ~(size_t)63;
}

typedef struct cols_job {
  const rn_kernel_set *k;
  rmsnorm_dtype dt;
  const rn_forward_args *fa;
  const rn_backward_args *ba;
  size_t row, d;
  double coef[4];
  void *dw_part, *db_part;
} cols_job;

static void cols_task(void *p, int t, int n) {
  const cols_job *j = p;
  size_t j0 = split_cols(j->d, t, n), j1 = split_cols(j->d, t + 1, n);
  if (j->fa)
    j->k->row_cols[j->dt](j->fa, j->row, j0, j1, j->coef);
  else
    j->k->grad_cols[j->dt](j->ba, j->row, j0, j1, j->coef, j->dw_part, j->db_part);
}

/* ---- forward ------------------------------------------------------------ */

typedef struct forward_job {
  rn_forward_fn kernel;
  const rn_forward_args *args;
} forward_job;

static void forward_rows(const void *p, size_t r0, size_t r1, int task) {
  const forward_job *job = p;
  (void)task;
  job->kernel(job->args, r0, r1);
}

void rn_forward_stream(rn_forward_args *a, size_t rows) {
  size_t es = rn_dtype_size(a->dtype), bytes = rows * a->d * es;
  a->stream = rn_stream_ok(a->y != a->x, a->y, es, bytes);
  a->past_l3 = 2 * bytes >= RN_PAST_L3_BYTES;
}

rn_split rn_forward_split(const rmsnorm_context *ctx, size_t rows, size_t d, size_t es) {
  if (split_rows(ctx, rows, d, es)) return rn_split_for(ctx, 1, d * 2 * es, d / 64);
  return rn_split_for(ctx, rows, rows * d * 2 * es, rows);
}

int rn_forward_direct(const rmsnorm_context *ctx, rn_split split, size_t rows, size_t d,
                      size_t es) {
  return split.tasks == 1 && !split_rows(ctx, rows, d, es);
}

void rn_forward_run(rmsnorm_context *ctx, const rn_kernel_set *k, const rn_forward_args *a,
                    size_t rows, rn_split split) {
  rmsnorm_dtype dt = a->dtype;
  if (split_rows(ctx, rows, a->d, rn_dtype_size(dt))) {
    cols_job job = {k, dt, a, NULL, 0, a->d, {0}, NULL, NULL};
    for (job.row = 0; job.row < rows; job.row++) {
      if (k->row_coef[dt](a, job.row, job.coef))
        rn_run_tasks(ctx, split, cols_task, &job);
      else
        rn_rescue_forward_row(a, job.row);
    }
  } else {
    forward_job job = {k->forward[dt], a};
    rn_run_rows(ctx, split, rows, forward_rows, &job);
  }
}

static rmsnorm_status run_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                  rn_norm norm, size_t rows, size_t d, const void *x,
                                  size_t ldx, const void *weight, const void *bias, void *y,
                                  size_t ldy, void *mean, void *rstd) {
  rn_entry e;
  rmsnorm_status st = rn_entry_begin(&e, ctx, &cfg, norm, 0, d);
  if (st == RMSNORM_OK) st = rn_entry_matrices(&e, rows, d, RN_LDS(ldx, ldy));
  if (st != RMSNORM_OK || rows == 0) return st;
  if (!x || !y) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = e.es;
  rn_buffers b;
  rn_buffers_empty(&b);
  b.in[0] = rn_inplace(rn_matrix(x, rows, d, ldx, es));
  b.out[0] = rn_matrix(y, rows, d, ldy, es);
  b.out[1] = rn_vector(mean, rows, e.as);
  b.out[2] = rn_vector(rstd, rows, e.as);
  b.weight = weight, b.bias = bias, b.nparam = d;
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;
  rn_entry_weight_direct(&e, rows, d, 1);

  rn_split split = rn_forward_split(ctx, rows, d, es);
  int unlocked = rn_entry_unlocked(&e, rn_forward_direct(ctx, split, rows, d, es));
  if (!unlocked && (st = rn_entry_lock_params(&e)) != RMSNORM_OK) return st;
  rn_forward_args a = rn_entry_forward_args(&e, norm, d, x, ldx, y, ldy);
  a.mean = mean;
  a.rstd = rstd;
  rn_forward_stream(&a, rows);
  rn_forward_run(ctx, e.kernels, &a, rows, split);
  return unlocked ? RMSNORM_OK : rn_entry_unlock(&e, RMSNORM_OK);
}

rmsnorm_status rmsnorm_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows,
                               size_t d, const void *x, size_t ldx, const void *weight,
                               const void *bias, void *y, size_t ldy, void *rstd) {
  return run_forward(ctx, cfg, RN_RMSNORM, rows, d, x, ldx, weight, bias, y, ldy, NULL, rstd);
}

rmsnorm_status rmsnorm_layernorm_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                         size_t rows, size_t d, const void *x, size_t ldx,
                                         const void *weight, const void *bias, void *y,
                                         size_t ldy, void *mean, void *rstd) {
  return run_forward(ctx, cfg, RN_LAYERNORM, rows, d, x, ldx, weight, bias, y, ldy, mean, rstd);
}

/* ---- backward ----------------------------------------------------------- */

/* One chunk of rows: its dweight/dbias terms go to its own partial, so the
 * split between tasks cannot change a bit. Split rows run their columns on
 * the pool (this chunk then runs on the caller's thread, alone). */
static void backward_chunk(void *p, size_t r0, size_t r1, void *dw_part, void *db_part,
                           int task) {
  const rn_backward_job *job = p;
  const rn_backward_args *a = &job->args;
  (void)task;
  if (!job->cols.tasks) {
    job->k->backward[a->dtype](a, r0, r1, dw_part, db_part);
    return;
  }
  cols_job cj = {job->k, a->dtype, NULL, a, 0, a->d, {0}, dw_part, db_part};
  for (cj.row = r0; cj.row < r1; cj.row++) {
    if (job->k->grad_coef[a->dtype](a, cj.row, cj.coef))
      rn_run_tasks(job->ctx, job->cols, cols_task, &cj);
    else
      rn_rescue_backward_row(a, cj.row, dw_part, db_part);
  }
}

rn_split rn_backward_split(const rn_entry *e, size_t rows, size_t d, rn_split *cols) {
  size_t es = e->es;
  if (split_rows(e->ctx, rows, d, es)) {
    *cols = rn_split_for(e->ctx, 1, d * 3 * es, d / 64);
    return (rn_split){1, 1, 1};
  }
  *cols = (rn_split){0, 0, 0};
  return rn_entry_backward_split(e, rows, rows * d * 3 * es);
}

/* Whether the kernels may take the call's rows one by one reading a 16-bit
 * weight as it is (rn_backward_args.w_data) and storing dweight themselves:
 * RMSNorm over whole rows, one task, no dbias, a dtype the set takes so
 * (backward_w_data); rn_entry_weight_direct then asks for a few rows in
 * cache and a weight of the data's dtype. That spares a one-row call two
 * passes of d elements besides its own two, the weight's widened copy and
 * the partial's narrowing (bench/RESULTS.md). */
void rn_backward_weight(rn_entry *e, rn_norm norm, size_t rows, size_t d, rn_split cols,
                        const void *dbias) {
  if (!cols.tasks && !dbias && norm == RN_RMSNORM &&
      ((e->kernels->backward_w_data >> e->cfg.dtype) & 1) &&
      rn_partial_k(e->cfg.partial, d) == d)
    rn_entry_weight_direct(e, rows, d, 0);
}

void rn_backward_prepare(rn_backward_job *job, rn_grad_plan *plan, const rn_entry *e,
                         rn_norm norm, size_t rows, size_t d, const void *x, size_t ldx,
                         const void *dy, size_t lddy, const void *mean, const void *rstd,
                         void *dx, size_t lddx, void *dweight, rn_split cols) {
  rn_backward_args *a = &job->args;
  size_t es = e->es;
  job->ctx = e->ctx, job->k = e->kernels, job->cols = cols;
  rn_entry_backward_args(a, e, norm, d, x, ldx, dy, lddy, dx, lddx);
  a->mean = mean;
  a->rstd = rstd;
  /* with the weight read as it is, dweight of its dtype is stored by the
   * kernel (overwritten, at an even address: its vector stores) */
  if (a->w_data && dweight && !(e->cfg.flags & RMSNORM_FLAG_ACCUMULATE) &&
      ((uintptr_t)dweight & 1) == 0)
    a->dw_data = dweight, plan->dw_stored = 1;
  a->stream = rn_stream_ok(dx != dy && dx != x, dx, es, rows * d * es);
  a->past_l3 = 3 * rows * d * es >= RN_PAST_L3_BYTES;
  /* each chunk's kernel call writes its partials from nothing (a row split
   * across threads adds its columns' terms into a zeroed partial) */
  a->parts_fresh = plan->fresh_parts = !cols.tasks;
}

void rn_backward_run(const rn_grad_plan *plan, void *sums, rn_backward_job *job) {
  rn_grad_run(job->ctx, plan, sums, backward_chunk, job);
}

static rmsnorm_status run_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                   rn_norm norm, size_t rows, size_t d, const void *x,
                                   size_t ldx, const void *dy, size_t lddy, const void *weight,
                                   const void *mean, const void *rstd, void *dx, size_t lddx,
                                   void *dweight, void *dbias) {
  rn_entry e;
  rmsnorm_status st = rn_entry_begin(&e, ctx, &cfg, norm, 0, d);
  if (st == RMSNORM_OK) st = rn_entry_matrices(&e, rows, d, RN_LDS(ldx, lddy, lddx));
  if (st != RMSNORM_OK) return st;
  if (dweight && !weight) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  if (!x || !dy || !dx) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = e.es;
  rn_buffers b;
  rn_buffers_empty(&b);
  b.in[0] = rn_inplace(rn_matrix(x, rows, d, ldx, es));
  b.in[1] = rn_inplace(rn_matrix(dy, rows, d, lddy, es));
  b.in[2] = rn_vector(mean, rows, e.as);
  b.in[3] = rn_vector(rstd, rows, e.as);
  b.out[0] = rn_matrix(dx, rows, d, lddx, es);
  b.out[1] = rn_vector(dweight, d, e.ps);
  b.out[2] = rn_vector(dbias, d, e.ps);
  b.weight = weight, b.nparam = d;
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;

  /* scratch: [weight copy][the reduction's group sums and chunk partials] */
  rn_entry_lock(&e);
  rn_split cols, split = rn_backward_split(&e, rows, d, &cols);
  rn_backward_weight(&e, norm, rows, d, cols, dbias);
  rn_grad_plan plan;
  char *sums = rn_entry_grad_scratch(&e, &plan, rows, RN_BACKWARD_CHUNK_ROWS, d, dweight, dbias,
                                     split, 0);
  if (!sums) return rn_entry_unlock(&e, RMSNORM_ERROR_OUT_OF_MEMORY);
  rn_backward_job job;
  rn_backward_prepare(&job, &plan, &e, norm, rows, d, x, ldx, dy, lddy, mean, rstd, dx, lddx,
                      dweight, cols);
  rn_backward_run(&plan, sums, &job);
  return rn_entry_unlock(&e, RMSNORM_OK);
}

rmsnorm_status rmsnorm_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows,
                                size_t d, const void *x, size_t ldx, const void *dy,
                                size_t lddy, const void *weight, const void *rstd, void *dx,
                                size_t lddx, void *dweight, void *dbias) {
  return run_backward(ctx, cfg, RN_RMSNORM, rows, d, x, ldx, dy, lddy, weight, NULL, rstd, dx,
                      lddx, dweight, dbias);
}

rmsnorm_status rmsnorm_layernorm_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                          size_t rows, size_t d, const void *x, size_t ldx,
                                          const void *dy, size_t lddy, const void *weight,
                                          const void *mean, const void *rstd, void *dx,
                                          size_t lddx, void *dweight, void *dbias) {
  return run_backward(ctx, cfg, RN_LAYERNORM, rows, d, x, ldx, dy, lddy, weight, mean, rstd, dx,
                      lddx, dweight, dbias);
}
