/* shard.c - RMSNorm over a hidden dimension split into column shards: the
 * split steps of include/rmsnorm.h ("Sharded hidden dimension"). Per-row
 * partial sums of a shard come from the kernel sets (shard_sums, in the
 * blocked order of the whole row); the forward and backward are finished from
 * the summed statistics by the library's own column kernels (row_cols,
 * grad_cols) and gradient reduction (work.h). Rows whose r or backward
 * coefficient leave the compute type's range are finished in double here. */
#include <math.h>
#include <string.h>

#include "api/entry.h"
#include "api/shard.h"
#include "numerics/dtype.h"
#include "numerics/rowmath.h"

/* The skeleton's first steps for a shard: the context, then the shard checks
 * (api/shard.h: config, the shard's place, its strides), which fill *sh. */
static rmsnorm_status shard_begin(rn_entry *e, rmsnorm_context *ctx, const rmsnorm_config **cfgp,
                                  rn_shard *sh, size_t rows, size_t d_global, size_t offset,
                                  size_t width, const size_t *lds, size_t nld) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_status st = rn_shard_check(cfgp, &e->cfg, sh, rows, d_global, offset, width, lds, nld);
  if (st == RMSNORM_OK) rn_entry_set(e, ctx);
  return st;
}

/* ---- per-row coefficients ------------------------------------------------ */

/* A row's r in double from its statistic s = sum_{j<k} x_j^2, as the
 * unsharded kernels form it (rowmath.h). A NaN s (a NaN in the statistic's
 * columns) gives NaN, an infinite one (an infinity there) r = 1/sqrt(inf) =
 * 0: the rule of rmsnorm_forward (docs/numerics.md, "Non-finite inputs").
 * fp64 data is the exception: its s is also infinite when the squares of
 * finite values left double's range (|x| above about 1e154), which no r can
 * be formed from, and the two cannot be told apart: an infinite s gives NaN. */
static double row_r(double s, const rn_shard *sh, const rmsnorm_config *cfg) {
  if (isinf(s) && rn_acc_is_f64(cfg->dtype)) return NAN;
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
static void sums_rows(const void *job, size_t row_begin, size_t row_end, int task) {
  const sums_job *j = job;
  (void)task;
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

rmsnorm_status rmsnorm_shard_stats(rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows,
                                   size_t d_global, size_t offset, size_t width, const void *x,
                                   size_t ldx, double *partial) {
  rn_entry e;
  rn_shard sh;
  rmsnorm_status st =
      shard_begin(&e, ctx, &cfg, &sh, rows, d_global, offset, width, RN_LDS(ldx));
  if (st != RMSNORM_OK || rows == 0) return st;
  if (!partial || (width && !x)) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = e.es;
  rn_buffers b = {.in = {rn_shard_matrix(x, rows, &sh, ldx, es)},
                  .out = {rn_vector(partial, rows, sizeof(double))}};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;
  if (sh.k_local == 0) { /* no column of the statistic here */
    for (size_t i = 0; i < rows; i++) partial[i] = 0;
    return RMSNORM_OK;
  }
  if ((st = rn_entry_lock_params(&e)) != RMSNORM_OK) return st;
  sums_job j = {e.kernels, cfg, &sh,
                {0, offset, sh.k_local, x, ldx, NULL, 0, NULL, NULL, partial}, NULL, NULL};
  rn_run_rows(ctx, rn_split_for(ctx, rows, rows * sh.k_local * es, rows), rows, sums_rows, &j);
  return rn_entry_unlock(&e, RMSNORM_OK);
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

static void fwd_rows(const void *job, size_t r0, size_t r1, int task) {
  const fwd_job *j = job;
  (void)task;
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
  rn_entry e;
  rn_shard sh;
  rmsnorm_status st =
      shard_begin(&e, ctx, &cfg, &sh, rows, d_global, offset, width, RN_LDS(ldx, ldy));
  if (st != RMSNORM_OK || rows == 0) return st;
  if (!stats || (width && (!x || !y))) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = e.es;
  rn_buffers b = {.in = {rn_inplace(rn_shard_matrix(x, rows, &sh, ldx, es)),
                         rn_vector(stats, rows, sizeof(double))},
                  .out = {rn_shard_matrix(y, rows, &sh, ldy, es), rn_vector(rstd, rows, e.as)},
                  .weight = weight, .bias = bias, .nparam = width};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;
  if ((st = check_stats(stats, rows)) != RMSNORM_OK) return st;

  if ((st = rn_entry_lock_params(&e)) != RMSNORM_OK) return st;
  fwd_job j = {e.kernels, cfg, &sh, rn_entry_forward_args(&e, RN_RMSNORM, width, x, ldx, y, ldy),
               stats, rstd};
  j.a.k = sh.k_local;
  j.a.stream = rn_stream_ok(y != x, y, es, rows * width * es);
  rn_run_rows(ctx, rn_split_for(ctx, rows, rows * width * 2 * es, rows), rows, fwd_rows, &j);
  return rn_entry_unlock(&e, RMSNORM_OK);
}

/* ---- backward ----------------------------------------------------------- */

rmsnorm_status rmsnorm_shard_backward_dots(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                           size_t rows, size_t d_global, size_t offset,
                                           size_t width, const void *x, size_t ldx,
                                           const void *dy, size_t lddy, const void *weight,
                                           const double *stats, double *partial) {
  rn_entry e;
  rn_shard sh;
  rmsnorm_status st =
      shard_begin(&e, ctx, &cfg, &sh, rows, d_global, offset, width, RN_LDS(ldx, lddy));
  if (st != RMSNORM_OK || rows == 0) return st;
  if (!stats || !partial || (width && (!x || !dy))) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = e.es, as = e.as;
  rn_buffers b = {.in = {rn_shard_matrix(x, rows, &sh, ldx, es),
                         rn_shard_matrix(dy, rows, &sh, lddy, es),
                         rn_vector(stats, rows, sizeof(double))},
                  .out = {rn_vector(partial, rows, sizeof(double))},
                  .weight = weight, .nparam = width};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;
  if ((st = check_stats(stats, rows)) != RMSNORM_OK) return st;
  if (width == 0) {
    for (size_t i = 0; i < rows; i++) partial[i] = 0;
    return RMSNORM_OK;
  }
  /* scratch: [weight copy][r of every row] */
  if (rows > (SIZE_MAX - e.wcopy) / as) return RMSNORM_ERROR_OUT_OF_MEMORY;
  rn_entry_lock(&e);
  char *r = rn_entry_scratch(&e, rows * as);
  if (!r) return rn_entry_unlock(&e, RMSNORM_ERROR_OUT_OF_MEMORY);
  sums_job j = {e.kernels, cfg, &sh,
                {1, offset, width, x, ldx, dy, lddy, e.weight, r, partial}, stats, r};
  rn_run_rows(ctx, rn_split_for(ctx, rows, rows * width * 2 * es, rows), rows, sums_rows, &j);
  return rn_entry_unlock(&e, RMSNORM_OK);
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
  rn_entry e;
  rn_shard sh;
  rmsnorm_status st =
      shard_begin(&e, ctx, &cfg, &sh, rows, d_global, offset, width, RN_LDS(ldx, lddy, lddx));
  if (st != RMSNORM_OK) return st;
  if (dweight && !weight) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  if (!stats || !dots || (width && (!x || !dy || !dx))) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = e.es;
  rn_buffers b = {.in = {rn_inplace(rn_shard_matrix(x, rows, &sh, ldx, es)),
                         rn_inplace(rn_shard_matrix(dy, rows, &sh, lddy, es)),
                         rn_vector(stats, rows, sizeof(double)),
                         rn_vector(dots, rows, sizeof(double))},
                  .out = {rn_shard_matrix(dx, rows, &sh, lddx, es),
                          rn_shard_param(dweight, &sh, e.ps), rn_shard_param(dbias, &sh, e.ps)},
                  .weight = weight, .nparam = width};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;
  if ((st = check_stats(stats, rows)) != RMSNORM_OK) return st;
  if (width == 0) return RMSNORM_OK;

  /* scratch: [weight copy][the reduction's partials and totals] */
  rn_entry_lock(&e); /* the plan takes the task count from the context */
  rn_grad_plan plan;
  char *sums = rn_entry_grad_scratch(&e, &plan, rows, RN_BACKWARD_CHUNK_ROWS, width, dweight,
                                     dbias,
                                     rn_entry_backward_split(&e, rows, rows * width * 3 * es), 0);
  if (!sums) return rn_entry_unlock(&e, RMSNORM_ERROR_OUT_OF_MEMORY);
  bwd_job j = {e.kernels, cfg, &sh, {0}, stats, dots};
  rn_entry_backward_args(&j.a, &e, RN_RMSNORM, width, x, ldx, dy, lddy, dx, lddx);
  j.a.k = sh.k_local;
  j.a.stream = rn_stream_ok(dx != dy && dx != x, dx, es, rows * width * es);
  rn_grad_run(ctx, &plan, sums, bwd_chunk, &j);
  return rn_entry_unlock(&e, RMSNORM_OK);
}
