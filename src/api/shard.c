/* shard.c - RMSNorm over a hidden dimension split into column shards: the
 * split steps of include/rmsnorm.h ("Sharded hidden dimension"). Per-row
 * partial sums of a shard come from the kernel sets (shard_sums, in the
 * blocked order of the whole row); the forward and backward are finished from
 * the summed statistics by the library's own column kernels (row_cols,
 * grad_cols) and gradient reduction (work.h). Rows whose r or backward
 * coefficient leave the compute type's range are finished in double here. */
#include <math.h>
#include <string.h>

#include "runtime/context.h"
#include "numerics/dtype.h"
#include "kernels/kernels.h"
#include "numerics/rowmath.h"
#include "api/shard.h"
#include "runtime/work.h"

/* ---- per-row coefficients ------------------------------------------------ */

/* A row's r in double from its statistic s = sum_{j<k} x_j^2, as the
 * unsharded kernels form it (rowmath.h). A non-finite s (a NaN or Inf in the
 * row) gives NaN, so the whole row's outputs are NaN, as rmsnorm_forward's. */
static double row_r(double s, const rn_shard *sh, const rmsnorm_config *cfg) {
  if (!isfinite(s)) return NAN;
  return rn_rms_r(s, sh->k, cfg->eps, cfg->flags);
}

/* Whether a value can run through the compute type's kernels: r itself (0 is
 * exact; otherwise normal, as a saved rstd must be) or the backward's c. */
static int r_fits(double r, int f64) { return r == 0 || rn_saved_r_usable(r, f64); }
static int c_fits(double c, int f64) { return f64 ? isfinite(c) : fabs(c) <= FLT_MAX; }

/* The r a row's kernels use: the compute type's value where it fits, else the
 * double (the row is then finished in double). */
static double row_r_used(double r, int f64) {
  if (!r_fits(r, f64)) return r;
  return f64 ? r : (double)(float)r;
}

/* Statistics handed in by the caller: a negative sum of squares cannot come
 * from any shards (NaN can: a NaN in the row). */
static rmsnorm_status check_stats(const double *stats, size_t rows) {
  for (size_t i = 0; i < rows; i++)
    if (stats[i] < 0) return RMSNORM_ERROR_BAD_ARGUMENT;
  return RMSNORM_OK;
}

/* ---- partial sums: statistics and backward dots ------------------------- */

typedef struct sums_job {
  const rn_kernel_set *k;
  const rmsnorm_config *cfg;
  const rn_shard *sh;
  rn_shard_args a;
  const double *stats; /* grad: the rows' statistics (for r) */
  void *r;             /* grad: (rows,) acc scratch, r as the kernels use it */
} sums_job;

/* One row's partial sum in double, element by element: for rows the compute
 * type cannot carry. Squares and products of fp32/fp16/bf16 values are exact
 * in double, so this never overflows or underflows for them. */
static double wide_sum(const sums_job *j, size_t row, double r) {
  const rn_shard_args *a = &j->a;
  rmsnorm_dtype dt = j->cfg->dtype;
  int f64 = rn_acc_is_f64(dt);
  size_t es = rn_dtype_size(dt);
  const char *x = (const char *)a->x + row * a->ldx * es;
  double s = 0;
  if (!a->grad) {
    for (size_t t = 0; t < a->n; t++) {
      double v = rn_load(x, dt, t);
      s += v * v;
    }
    return s;
  }
  const char *dy = (const char *)a->dy + row * a->lddy * es;
  for (size_t t = 0; t < a->n; t++) {
    double gy = rn_load(dy, dt, t);
    if (a->w) gy *= rn_load_acc(a->w, f64, t);
    s += gy * (rn_load(x, dt, t) * r);
  }
  return s;
}

/* Rows [row_begin, row_end): the kernel's blocked sums, then the rows they
 * cannot be trusted for recomputed element by element in double. */
static void sums_rows(const void *job, size_t row_begin, size_t row_end) {
  const sums_job *j = job;
  const rn_shard_args *a = &j->a;
  int f64 = rn_acc_is_f64(j->cfg->dtype);
  if (a->grad) /* r as the kernels see it; 0 for rows finished in double */
    for (size_t row = row_begin; row < row_end; row++) {
      double r = row_r_used(row_r(j->stats[row], j->sh, j->cfg), f64);
      rn_store_acc(j->r, f64, row, r_fits(r, f64) ? r : 0.0);
    }
  j->k->shard_sums[j->cfg->dtype](a, row_begin, row_end);
  for (size_t row = row_begin; row < row_end; row++) {
    double s = a->out[row];
    if (a->grad) {
      double r = row_r_used(row_r(j->stats[row], j->sh, j->cfg), f64);
      if (!r_fits(r, f64) || !isfinite(s)) a->out[row] = wide_sum(j, row, r);
    } else if (!f64 && !(s >= 0x1p-100 && s <= DBL_MAX)) {
      /* float lanes overflowed, or may have lost subnormal squares */
      a->out[row] = wide_sum(j, row, 0);
    }
  }
}

typedef struct rows_job {
  void (*fn)(const void *job, size_t row_begin, size_t row_end);
  const void *job;
  size_t rows;
} rows_job;

static void rows_task(void *p, int t, int n) {
  const rows_job *rj = p;
  rj->fn(rj->job, rn_split_begin(rj->rows, t, n), rn_split_begin(rj->rows, t + 1, n));
}

/* Runs fn over rows in contiguous blocks on the context's pool (lock held);
 * `bytes` is the traffic, for the number of threads worth waking. */
static void run_rows(rmsnorm_context *ctx, size_t rows, size_t bytes,
                     void (*fn)(const void *, size_t, size_t), const void *job) {
  rows_job rj = {fn, job, rows};
  rn_run_tasks(ctx, rn_split_for(ctx, rows, bytes, rows), rows_task, &rj);
}

rmsnorm_status rmsnorm_shard_stats(rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows,
                                   size_t d_global, size_t offset, size_t width, const void *x,
                                   size_t ldx, double *partial) {
  rn_shard sh;
  size_t lds[1] = {ldx};
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_config cfg_copy;
  rmsnorm_status st = rn_shard_check(&cfg, &cfg_copy, &sh, rows, d_global, offset, width, lds, 1);
  if (st != RMSNORM_OK) return st;
  if (rows == 0) return RMSNORM_OK;
  if (!partial || (width && !x)) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = rn_dtype_size(cfg->dtype);
  rn_span s[2] = {rn_shard_span(x, rows, &sh, ldx, es, 0),
                  rn_vector_span(partial, rows, sizeof(double), 1)};
  if ((st = rn_check_overlaps(s, 2, 2, 2, 2)) != RMSNORM_OK) return st;
  if (sh.k_local == 0) { /* no column of the statistic here */
    for (size_t i = 0; i < rows; i++) partial[i] = 0;
    return RMSNORM_OK;
  }
  if (!(rn_context_lock(ctx), rn_context_scratch(ctx, 0))) return RMSNORM_ERROR_OUT_OF_MEMORY;
  sums_job j = {rn_context_kernels(ctx), cfg, &sh,
                {0, offset, sh.k_local, x, ldx, NULL, 0, NULL, NULL, partial}, NULL, NULL};
  run_rows(ctx, rows, rows * sh.k_local * es, sums_rows, &j);
  rn_context_unlock(ctx);
  return RMSNORM_OK;
}

/* ---- forward ------------------------------------------------------------ */

typedef struct fwd_job {
  const rn_kernel_set *k;
  const rmsnorm_config *cfg;
  const rn_shard *sh;
  rn_forward_args a; /* the shard as a rows x width forward (no stats outputs) */
  const double *stats;
  void *rstd;
} fwd_job;

/* y_j = (x_j * r) * w_j + b_j in double, for a row whose r the compute type
 * cannot hold (as src/numerics/rescue.c finishes a row). */
static void forward_wide_row(const rn_forward_args *a, size_t row, double r) {
  size_t es = rn_dtype_size(a->dtype);
  int f64 = rn_acc_is_f64(a->dtype);
  const char *x = (const char *)a->x + row * a->ldx * es;
  char *y = (char *)a->y + row * a->ldy * es;
  for (size_t j = 0; j < a->d; j++) {
    double v = rn_load(x, a->dtype, j) * r; /* xhat_j */
    if (a->flags & RMSNORM_FLAG_ROUND_BEFORE_WEIGHT) v = rn_round_to(a->dtype, v);
    if (a->w) v *= rn_load_acc(a->w, f64, j);
    if (a->b) v += rn_load_acc(a->b, f64, j);
    rn_store(y, a->dtype, j, v);
  }
}

static void fwd_fn(const void *job, size_t r0, size_t r1) {
  const fwd_job *j = job;
  int f64 = rn_acc_is_f64(j->cfg->dtype);
  for (size_t row = r0; row < r1; row++) {
    double r = row_r_used(row_r(j->stats[row], j->sh, j->cfg), f64);
    if (j->rstd) rn_store_acc(j->rstd, f64, row, r);
    if (j->sh->width == 0) continue;
    if (r_fits(r, f64)) {
      double coef[2] = {0, r};
      j->k->row_cols[j->cfg->dtype](&j->a, row, 0, j->sh->width, coef);
    } else {
      forward_wide_row(&j->a, row, r);
    }
  }
}

rmsnorm_status rmsnorm_shard_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                     size_t rows, size_t d_global, size_t offset, size_t width,
                                     const void *x, size_t ldx, const void *weight,
                                     const void *bias, const double *stats, void *y, size_t ldy,
                                     void *rstd) {
  rn_shard sh;
  size_t lds[2] = {ldx, ldy};
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_config cfg_copy;
  rmsnorm_status st = rn_shard_check(&cfg, &cfg_copy, &sh, rows, d_global, offset, width, lds, 2);
  if (st != RMSNORM_OK) return st;
  if (rows == 0) return RMSNORM_OK;
  if (!stats || (width && (!x || !y))) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  rn_span s[6] = {rn_shard_span(x, rows, &sh, ldx, es, 0),
                  rn_shard_span(y, rows, &sh, ldy, es, 1),
                  rn_shard_vector(weight, &sh, ps, 0),
                  rn_shard_vector(bias, &sh, ps, 0),
                  rn_vector_span(stats, rows, sizeof(double), 0),
                  rn_vector_span(rstd, rows, as, 1)};
  if ((st = rn_check_overlaps(s, 6, 1, 0, 0)) != RMSNORM_OK) return st;
  if ((st = check_stats(stats, rows)) != RMSNORM_OK) return st;

  size_t wcopy = rn_param_needs_copy(cfg, weight, 1) ? rn_align64(width * as) : 0;
  size_t bcopy = rn_param_needs_copy(cfg, bias, 0) ? rn_align64(width * as) : 0;
  char *scratch = (rn_context_lock(ctx), rn_context_scratch(ctx, wcopy + bcopy));
  if (!scratch) return RMSNORM_ERROR_OUT_OF_MEMORY;
  fwd_job j = {rn_context_kernels(ctx), cfg, &sh,
               {RN_RMSNORM, cfg->dtype, width, sh.k_local, x, ldx, y, ldy,
                rn_param_as_acc(cfg, weight, 1, width, scratch),
                rn_param_as_acc(cfg, bias, 0, width, scratch + wcopy), cfg->eps, cfg->flags,
                NULL, NULL, rn_stream_ok(y != x, y, es, rows * width * es)},
               stats, rstd};
  run_rows(ctx, rows, rows * width * 2 * es, fwd_fn, &j);
  rn_context_unlock(ctx);
  return RMSNORM_OK;
}

/* ---- backward ----------------------------------------------------------- */

rmsnorm_status rmsnorm_shard_backward_dots(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                           size_t rows, size_t d_global, size_t offset,
                                           size_t width, const void *x, size_t ldx,
                                           const void *dy, size_t lddy, const void *weight,
                                           const double *stats, double *partial) {
  rn_shard sh;
  size_t lds[2] = {ldx, lddy};
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_config cfg_copy;
  rmsnorm_status st = rn_shard_check(&cfg, &cfg_copy, &sh, rows, d_global, offset, width, lds, 2);
  if (st != RMSNORM_OK) return st;
  if (rows == 0) return RMSNORM_OK;
  if (!stats || !partial || (width && (!x || !dy))) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  rn_span s[5] = {rn_shard_span(x, rows, &sh, ldx, es, 0),
                  rn_shard_span(dy, rows, &sh, lddy, es, 0),
                  rn_shard_vector(weight, &sh, ps, 0),
                  rn_vector_span(stats, rows, sizeof(double), 0),
                  rn_vector_span(partial, rows, sizeof(double), 1)};
  if ((st = rn_check_overlaps(s, 5, 5, 5, 5)) != RMSNORM_OK) return st;
  if ((st = check_stats(stats, rows)) != RMSNORM_OK) return st;
  if (width == 0) {
    for (size_t i = 0; i < rows; i++) partial[i] = 0;
    return RMSNORM_OK;
  }
  /* scratch: [weight copy][r of every row] */
  size_t wcopy = rn_param_needs_copy(cfg, weight, 1) ? rn_align64(width * as) : 0;
  if (rows > (SIZE_MAX - wcopy) / as) return RMSNORM_ERROR_OUT_OF_MEMORY;
  char *scratch = (rn_context_lock(ctx), rn_context_scratch(ctx, wcopy + rows * as));
  if (!scratch) return RMSNORM_ERROR_OUT_OF_MEMORY;
  sums_job j = {rn_context_kernels(ctx), cfg, &sh,
                {1, offset, width, x, ldx, dy, lddy,
                 rn_param_as_acc(cfg, weight, 1, width, scratch), scratch + wcopy, partial},
                stats, scratch + wcopy};
  run_rows(ctx, rows, rows * width * 2 * es, sums_rows, &j);
  rn_context_unlock(ctx);
  return RMSNORM_OK;
}

typedef struct bwd_job {
  const rn_kernel_set *k;
  const rmsnorm_config *cfg;
  const rn_shard *sh;
  rn_backward_args a; /* the shard as a rows x width backward */
  const double *stats, *dots;
} bwd_job;

/* dx_j = r (gy_j - [j < k] xhat_j c) in double, and the row's dweight/dbias
 * terms, for a row whose r or c the compute type cannot hold (as
 * src/numerics/rescue.c finishes a row). */
static void backward_wide_row(const rn_backward_args *a, size_t row, double r, double c,
                              void *dw_part, void *db_part) {
  size_t es = rn_dtype_size(a->dtype);
  int f64 = rn_acc_is_f64(a->dtype);
  const char *x = (const char *)a->x + row * a->ldx * es;
  const char *dy = (const char *)a->dy + row * a->lddy * es;
  char *dx = (char *)a->dx + row * a->lddx * es;
  for (size_t j = 0; j < a->d; j++) {
    double dyj = rn_load(dy, a->dtype, j);
    double gy = a->w ? dyj * rn_load_acc(a->w, f64, j) : dyj;
    double xhat = rn_load(x, a->dtype, j) * r;
    double t = j < a->k ? gy - xhat * c : gy;
    rn_store(dx, a->dtype, j, r * t);
    if (dw_part) rn_store_acc(dw_part, f64, j, rn_load_acc(dw_part, f64, j) + dyj * xhat);
    if (db_part) rn_store_acc(db_part, f64, j, rn_load_acc(db_part, f64, j) + dyj);
  }
}

/* One chunk of rows, in row order (rn_grad_run: its dweight/dbias terms go to
 * its own partial). */
static void bwd_chunk(void *p, size_t r0, size_t r1, void *dw_part, void *db_part, int task) {
  const bwd_job *j = p;
  const rmsnorm_config *cfg = j->cfg;
  int f64 = rn_acc_is_f64(cfg->dtype);
  (void)task;
  for (size_t row = r0; row < r1; row++) {
    double r = row_r_used(row_r(j->stats[row], j->sh, cfg), f64);
    double c = rn_rms_backward_c(j->dots[row], j->stats[row], r, j->sh->k, cfg->flags);
    if (r_fits(r, f64) && c_fits(c, f64)) {
      double coef[4] = {0, r, 0, f64 ? c : (double)(float)c};
      j->k->grad_cols[cfg->dtype](&j->a, row, 0, j->sh->width, coef, dw_part, db_part);
    } else {
      backward_wide_row(&j->a, row, r, c, dw_part, db_part);
    }
  }
}

rmsnorm_status rmsnorm_shard_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                      size_t rows, size_t d_global, size_t offset, size_t width,
                                      const void *x, size_t ldx, const void *dy, size_t lddy,
                                      const void *weight, const double *stats,
                                      const double *dots, void *dx, size_t lddx, void *dweight,
                                      void *dbias) {
  rn_shard sh;
  size_t lds[3] = {ldx, lddy, lddx};
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_config cfg_copy;
  rmsnorm_status st = rn_shard_check(&cfg, &cfg_copy, &sh, rows, d_global, offset, width, lds, 3);
  if (st != RMSNORM_OK) return st;
  if (dweight && !weight) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  if (!stats || !dots || (width && (!x || !dy || !dx))) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  rn_span s[8] = {rn_shard_span(x, rows, &sh, ldx, es, 0),
                  rn_shard_span(dy, rows, &sh, lddy, es, 0),
                  rn_shard_span(dx, rows, &sh, lddx, es, 1),
                  rn_shard_vector(weight, &sh, ps, 0),
                  rn_vector_span(stats, rows, sizeof(double), 0),
                  rn_vector_span(dots, rows, sizeof(double), 0),
                  rn_shard_vector(dweight, &sh, ps, 1),
                  rn_shard_vector(dbias, &sh, ps, 1)};
  if ((st = rn_check_overlaps(s, 8, 2, 0, 1)) != RMSNORM_OK) return st;
  if ((st = check_stats(stats, rows)) != RMSNORM_OK) return st;
  if (width == 0) return RMSNORM_OK;

  /* scratch: [weight copy][the reduction's partials and totals] */
  size_t wcopy = rn_param_needs_copy(cfg, weight, 1) ? rn_align64(width * as) : 0;
  size_t nchunks = (rows + RN_BACKWARD_CHUNK_ROWS - 1) / RN_BACKWARD_CHUNK_ROWS;
  rn_context_lock(ctx); /* the plan takes the task count from the context */
  rn_grad_plan plan;
  if (!rn_grad_plan_init(&plan, cfg, rows, RN_BACKWARD_CHUNK_ROWS, width, dweight, dbias,
                         rn_split_for(ctx, rows, rows * width * 3 * es, nchunks))) {
    rn_context_unlock(ctx);
    return RMSNORM_ERROR_OUT_OF_MEMORY;
  }
  char *scratch = rn_context_scratch(ctx, wcopy + plan.bytes);
  if (!scratch) return RMSNORM_ERROR_OUT_OF_MEMORY;
  bwd_job j = {rn_context_kernels(ctx), cfg, &sh,
               {RN_RMSNORM, cfg->dtype, width, sh.k_local, x, ldx, dy, lddy, dx, lddx,
                rn_param_as_acc(cfg, weight, 1, width, scratch), cfg->eps, cfg->flags, NULL,
                NULL, rn_stream_ok(dx != dy && dx != x, dx, es, rows * width * es)},
               stats, dots};
  rn_grad_run(ctx, &plan, scratch + wcopy, bwd_chunk, &j);
  rn_context_unlock(ctx);
  return RMSNORM_OK;
}
