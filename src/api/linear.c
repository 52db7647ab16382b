/* linear.c - the public entry points of RMSNorm + linear layer with the
 * gain folded into the weights (W' = diag(g) W): fold, forward and backward.
 * The row statistics come from the kernel sets, the GEMMs from the BLAS
 * (blas.c); rows the GEMM cannot be trusted with are recomputed here. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "api/entry.h"
#include "numerics/dtype.h"
#include "numerics/rescue.h"
#include "numerics/rowmath.h"
#include "runtime/blas.h"

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
  rn_entry e; /* no context: nothing to lock */
  rmsnorm_status st = rn_entry_config(&e, &cfg, RN_RMSNORM, RMSNORM_FLAG_ACCUMULATE);
  if (st != RMSNORM_OK) return st;
  if (d == 0 || n == 0) return RMSNORM_ERROR_BAD_SIZE;
  size_t as = e.as;
  if ((st = rn_check_matrix(d, n, ldw, as)) != RMSNORM_OK ||
      (st = rn_check_matrix(d, n, ldwf, as)) != RMSNORM_OK)
    return st;
  if (!w || !w_folded) return RMSNORM_ERROR_NULL_POINTER;
  rn_buffers b = {.in = {rn_inplace(rn_matrix(w, d, n, ldw, as)), rn_vector(weight, d, e.ps)},
                  .out = {rn_matrix(w_folded, d, n, ldwf, as)}};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;
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

/* The norm of x's rows as the statistics pass and the rescue path see it:
 * no weight, no bias (the gain is in W'), r of each row into r (acc). */
static rn_forward_args lin_stats_args(const rn_entry *e, size_t d, const void *x, size_t ldx,
                                      void *r) {
  rn_forward_args a = rn_entry_forward_args(e, RN_RMSNORM, d, x, ldx, NULL, 0);
  a.w = NULL;
  a.b = NULL;
  a.rstd = r;
  return a;
}

/* The row statistics pass of the linear ops. */
typedef struct lin_stats_job {
  rn_rstd_fn kernel;
  const rn_forward_args *args; /* r of x's rows into args->rstd (acc) */
  char *row_scratch;           /* (ntasks, RN_QUANT_SCRATCH(d)) for rescued rows */
} lin_stats_job;

static void lin_stats_rows(const void *p, size_t r0, size_t r1, int task) {
  const lin_stats_job *job = p;
  job->kernel(job->args, r0, r1, job->row_scratch + (size_t)task * RN_QUANT_SCRATCH(job->args->d));
}

/* r of every row of x into stats->rstd, with the kernel set's statistics:
 * the same r as rmsnorm_forward's. row_scratch: ntasks * RN_QUANT_SCRATCH(d);
 * lock held. */
static void lin_stats(const rn_entry *e, const rn_forward_args *stats, size_t rows,
                      char *row_scratch, rn_split sp) {
  lin_stats_job job = {e->kernels->rstd[e->cfg.dtype], stats, row_scratch};
  rn_run_rows(e->ctx, sp, rows, lin_stats_rows, &job);
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
 * factor r / 2^s lies in [1, 2). A row whose statistic meets a NaN (r NaN)
 * or an infinity (r = 0, and xhat NaN at the infinity) has every
 * z_k = sum_j xhat_j W'_jk NaN: it is written so (docs/numerics.md,
 * "Non-finite inputs"). */
static void lin_redo_row(const lin_fwd *f, size_t row, void *zrow) {
  rmsnorm_dtype dt = f->cfg->dtype;
  int f64 = rn_acc_is_f64(dt);
  size_t d = f->stats.d, n = f->n;
  double rs;
  int e;
  rn_rescue_row_r(&f->stats, row, &rs, &e);
  const char *x = (const char *)f->stats.x + row * f->stats.ldx * rn_dtype_size(dt);
  int inf = 0;
  for (size_t j = 0; j < f->stats.k && rs == 0; j++) inf |= isinf(rn_load(x, dt, j)) != 0;
  if (isnan(rs) || inf) {
    for (size_t k = 0; k < n; k++) rn_store(zrow, dt, k, NAN);
    return;
  }
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
  rn_entry e;
  rmsnorm_status st = rn_entry_begin(&e, ctx, &cfg, RN_RMSNORM,
                                     RMSNORM_FLAG_ACCUMULATE | RMSNORM_FLAG_ROUND_BEFORE_WEIGHT, d);
  if (st == RMSNORM_OK) st = rn_entry_matrices(&e, rows, d, RN_LDS(ldx));
  if (st != RMSNORM_OK) return st;
  size_t es = e.es, as = e.as;
  if (n == 0) return RMSNORM_ERROR_BAD_SIZE;
  if ((st = rn_check_matrix(d, n, ldwf, as)) != RMSNORM_OK ||
      (st = rn_check_matrix(rows, n, ldz, es)) != RMSNORM_OK)
    return st;
  if (!fits_int(rows) || !fits_int(d) || !fits_int(n) || !fits_int(ldx) || !fits_int(ldwf) ||
      !fits_int(ldz))
    return RMSNORM_ERROR_BAD_SIZE;
  if (rows == 0) return RMSNORM_OK;
  if (!x || !w_folded || !z) return RMSNORM_ERROR_NULL_POINTER;
  rn_buffers b = {.in = {rn_matrix(x, rows, d, ldx, es), rn_matrix(w_folded, d, n, ldwf, as)},
                  .out = {rn_matrix(z, rows, n, ldz, es), rn_vector(rstd, rows, as)},
                  .bias = bias, .nparam = n};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;

  int f64 = rn_acc_is_f64(cfg->dtype);
  /* fp32/fp64 rows aligned to their type go to the GEMM as they lie; others
   * through scratch, in chunks */
  int direct = es == as && rn_aligned(x, es) && rn_aligned(z, es);
  size_t chunk = direct ? 0 : rows < LIN_CHUNK ? rows : LIN_CHUNK;
  rn_entry_lock(&e);
  rn_split sp = rn_split_for(ctx, rows, rows * d * es, rows);
  /* scratch: bias copy | r (rows) | rescue rows (tasks) | X, Z chunks |
   *          W' copy | one recomputed row (d + n) */
  size_t rbytes = rn_align64(rows * as);
  size_t tbytes = (size_t)sp.tasks * RN_QUANT_SCRATCH(d);
  size_t xbytes = rn_align64(chunk * d * as), zbytes = rn_align64(chunk * n * as);
  size_t wbytes = rn_aligned(w_folded, as) ? 0 : rn_align64(d * n * as);
  size_t fbytes = rn_align64(d * as) + rn_align64(n * as);
  char *r = rn_entry_scratch(&e, rbytes + tbytes + xbytes + zbytes + wbytes + fbytes);
  if (!r) return rn_entry_unlock(&e, RMSNORM_ERROR_OUT_OF_MEMORY);
  char *xc = r + rbytes + tbytes, *zc = xc + xbytes, *wc = zc + zbytes;
  lin_fwd f;
  f.cfg = cfg;
  f.stats = lin_stats_args(&e, d, x, ldx, r);
  f.wf = lin_aligned(w_folded, ldwf, d, n, as, wc);
  f.b = e.bias;
  f.r = r;
  f.n = n;
  f.xs = wc + wbytes;
  f.zs = f.xs + rn_align64(d * as);
  lin_stats(&e, &f.stats, rows, r + rbytes, sp);

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
  return rn_entry_unlock(&e, RMSNORM_OK);
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
    double ri = rn_load_acc(r, f64, r0 + i), rs = 0;
    int usable = rn_saved_r_usable(ri, f64), e = 0;
    if (!usable) rn_rescue_row_r(stats, r0 + i, &rs, &e);
    if (f64) {
      double *xr = (double *)(void *)xc + i * d;
      for (size_t j = 0; j < d; j++) xr[j] = usable ? xr[j] * ri : rn_scaled_mul(xr[j], rs, e);
    } else {
      float *xr = (float *)(void *)xc + i * d, rf = (float)ri;
      for (size_t j = 0; j < d; j++)
        xr[j] = usable ? xr[j] * rf : (float)rn_scaled_mul(xr[j], rs, e);
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
  rn_entry e;
  rmsnorm_status st =
      rn_entry_begin(&e, ctx, &cfg, RN_RMSNORM, RMSNORM_FLAG_ROUND_BEFORE_WEIGHT, d);
  if (st == RMSNORM_OK) st = rn_entry_matrices(&e, rows, d, RN_LDS(ldx, lddx));
  if (st != RMSNORM_OK) return st;
  size_t es = e.es, ps = e.ps, as = e.as;
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
  /* the weight is read as it lies (gain_at), not converted */
  rn_buffers b = {.in = {rn_inplace(rn_matrix(x, rows, d, ldx, es)), rn_vector(weight, d, ps),
                         rn_matrix(w, d, n, ldw, as), rn_matrix(w_folded, d, n, ldwf, as),
                         rn_matrix(dz, rows, n, lddz, es)},
                  .out = {rn_matrix(dx, rows, d, lddx, es), rn_vector(dweight, d, ps),
                          rn_matrix(dw, d, n, lddw, as), rn_vector(dbias, n, ps)}};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;

  int f64 = rn_acc_is_f64(cfg->dtype);
  rmsnorm_dtype adt = f64 ? RMSNORM_F64 : RMSNORM_F32;
  size_t chunk = rows < LIN_CHUNK ? rows : LIN_CHUNK;
  int need_m = dweight || dw;
  if (need_m && n > SIZE_MAX / 16 / d) return RMSNORM_ERROR_OUT_OF_MEMORY;
  rn_entry_lock(&e);
  rn_split sp = rn_split_for(ctx, rows, rows * d * es, rows);
  /* scratch: r (rows) | rescue rows (tasks) | X, G (chunk x d) | dZ (chunk x n)
   *          | M (d x n) | dbias sums (n doubles) | W' copy */
  size_t rbytes = rn_align64(rows * as), tbytes = (size_t)sp.tasks * RN_QUANT_SCRATCH(d);
  size_t xbytes = rn_align64(chunk * d * as), zbytes = rn_align64(chunk * n * as);
  size_t mbytes = need_m ? rn_align64(d * n * as) : 0, sbytes = dbias ? rn_align64(n * 8) : 0;
  size_t wbytes = rn_aligned(w_folded, as) ? 0 : rn_align64(d * n * as);
  char *r = rn_entry_scratch(&e, rbytes + tbytes + 2 * xbytes + zbytes + mbytes + sbytes + wbytes);
  if (!r) return rn_entry_unlock(&e, RMSNORM_ERROR_OUT_OF_MEMORY);
  char *xc = r + rbytes + tbytes, *gc = xc + xbytes, *zc = gc + xbytes;
  char *m = zc + zbytes;
  double *bsum = (double *)(void *)(m + mbytes);
  lin_matrix wf = lin_aligned(w_folded, ldwf, d, n, as, m + mbytes + sbytes);
  if (dbias) memset(bsum, 0, n * sizeof(double));
  rn_forward_args stats = lin_stats_args(&e, d, x, ldx, r);
  lin_stats(&e, &stats, rows, r + rbytes, sp);

  for (size_t r0 = 0; r0 < rows; r0 += chunk) {
    size_t mr = rows - r0 < chunk ? rows - r0 : chunk;
    widen_rows(cfg->dtype, x, ldx, r0, mr, d, xc, d);
    widen_rows(cfg->dtype, dz, lddz, r0, mr, n, zc, n);
    /* G = dZ W'^T: (mr x n)(n x d) */
    rn_gemm(f64, 0, 1, mr, d, n, 1.0, zc, n, wf.p, wf.ld, 0.0, gc, d);
    /* dX = the RMSNorm backward of G with no weight, in place in G */
    rn_backward_args ba = {.norm = RN_RMSNORM, .dtype = adt, .d = d, .k = stats.k,
                           .x = xc, .ldx = d, .dy = gc, .lddy = d, .dx = gc, .lddx = d,
                           .eps = cfg->eps, .flags = cfg->flags, .rstd = r + r0 * as};
    e.kernels->backward[adt](&ba, 0, mr, NULL, NULL);
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
  return rn_entry_unlock(&e, RMSNORM_OK);
}
