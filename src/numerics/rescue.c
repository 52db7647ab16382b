/* rescue.c - whole-row RMSNorm/LayerNorm in double with power-of-two scaling:
 * x_j = xs_j * 2^e with max|xs| in [1, 2), so neither squares nor sums leave
 * double's range even for fp64 data near its limits. Slow and exact enough;
 * taken only for rows the fast path cannot trust (see rowmath.h). */
#include "numerics/rescue.h"

#include <math.h>

#include "numerics/dtype.h"
#include "numerics/rowmath.h"

/* A row's statistics in the scaled domain: xhat_j = (xs_j - mean_s) * rs. */
typedef struct scaled_stats {
  int e;         /* scale exponent: x = xs * 2^e */
  double mean_s; /* LayerNorm mean of xs; 0 for RMSNorm */
  double rs;     /* r * 2^e; NaN or 0 where the statistic meets a NaN or an Inf */
  double t;      /* RMSNorm: mean of xs^2 over the first k elements */
} scaled_stats;

/* 1/sqrt(v + eps * 2^-2e), or the limit 2^e/sqrt(eps) when the scaled eps
 * overflows (then v is negligible beside it). */
static double scaled_inv_sqrt(double v, double eps, int e) {
  double u = ldexp(eps, -2 * e);
  if (isinf(u)) return ldexp(1.0 / sqrt(eps), e);
  return rn_inv_den(sqrt(v + u));
}

/* The statistics of a row whose statistic's elements hold a NaN or an
 * infinity: what the formula gives in IEEE arithmetic (docs/numerics.md,
 * "Non-finite inputs"), with e = 0. A NaN makes every statistic NaN. With
 * infinities only, RMSNorm's mean square is +inf, so r = 1/sqrt(inf) = 0
 * (eps inside or outside) and xhat_j = x_j * 0: +-0 for a finite x_j, NaN for
 * an infinite one. LayerNorm's mean is +inf, -inf, or NaN when both occur;
 * every x_j - mean is then infinite or NaN, so the variance and rstd are NaN. */
static scaled_stats nonfinite_stats(rn_norm norm, int nan, int pos_inf, int neg_inf) {
  scaled_stats s = {0, 0.0, 0.0, 0.0};
  if (nan || (norm == RN_LAYERNORM && pos_inf && neg_inf)) {
    s.rs = s.mean_s = s.t = NAN;
  } else if (norm == RN_LAYERNORM) {
    s.mean_s = pos_inf ? INFINITY : -INFINITY;
    s.rs = s.t = NAN;
  } else {
    s.t = INFINITY;
  }
  return s;
}

static scaled_stats row_stats(rn_norm norm, const void *x, rmsnorm_dtype dt, size_t d,
                              size_t k, double eps, unsigned flags) {
  scaled_stats s = {0, 0.0, 0.0, 0.0};
  size_t n = norm == RN_LAYERNORM ? d : k;
  double m = 0;
  int nan = 0, pos_inf = 0, neg_inf = 0;
  for (size_t j = 0; j < n; j++) {
    double xj = rn_load(x, dt, j), v = fabs(xj);
    if (v > m) m = v;
    if (!(v <= DBL_MAX)) {
      nan |= v != v;
      pos_inf |= xj > 0;
      neg_inf |= xj < 0;
    }
  }
  if (nan || pos_inf || neg_inf) return nonfinite_stats(norm, nan, pos_inf, neg_inf);
  s.e = m > 0 ? ilogb(m) : 0;
  if (norm == RN_LAYERNORM) {
    double sum = 0, dev = 0;
    for (size_t j = 0; j < d; j++) sum += ldexp(rn_load(x, dt, j), -s.e);
    s.mean_s = sum / (double)d;
    for (size_t j = 0; j < d; j++) {
      double t = ldexp(rn_load(x, dt, j), -s.e) - s.mean_s;
      dev += t * t;
    }
    s.rs = scaled_inv_sqrt(dev / (double)d, eps, s.e);
    return s;
  }
  double sq = 0;
  for (size_t j = 0; j < k; j++) {
    double v = ldexp(rn_load(x, dt, j), -s.e);
    sq += v * v;
  }
  s.t = sq / (double)k;
  if (flags & RMSNORM_FLAG_EPS_OUTSIDE) {
    double u = ldexp(eps, -s.e);
    if (isinf(u)) {
      s.rs = ldexp(1.0 / eps, s.e);
    } else {
      s.rs = rn_inv_den(sqrt(s.t) + u);
    }
  } else {
    s.rs = scaled_inv_sqrt(s.t, eps, s.e);
  }
  return s;
}

/* xhat_j. Elements past k (pRMSNorm) did not set e: v * r is formed so that
 * neither v * 2^-e nor r = rs * 2^-e alone can leave double's range. */
static double row_xhat(const scaled_stats *s, rn_norm norm, const void *x, rmsnorm_dtype dt,
                       size_t k, size_t j) {
  double v = rn_load(x, dt, j);
  if (norm == RN_RMSNORM && j >= k) return rn_scaled_mul(v, s->rs, s->e);
  return (ldexp(v, -s->e) - s->mean_s) * s->rs;
}

/* The weight at j in the compute type: w's (the acc copy), or w_offset + g
 * of the caller's weight read in place (w_data, of the data's dtype dt), as
 * the copy would hold it; 1 without either. */
static double weight_at(const void *w, const void *w_data, float w_offset, rmsnorm_dtype dt,
                        int f64, size_t j) {
  if (w) return rn_load_acc(w, f64, j);
  if (w_data) return (double)(w_offset + (float)rn_load(w_data, dt, j));
  return 1.0;
}

void rn_rescue_forward_row(const rn_forward_args *a, size_t row) {
  size_t es = rn_dtype_size(a->dtype);
  int f64 = rn_acc_is_f64(a->dtype);
  const char *x = (const char *)a->x + row * a->ldx * es;
  char *y = (char *)a->y + row * a->ldy * es;
  scaled_stats s = row_stats(a->norm, x, a->dtype, a->d, a->k, a->eps, a->flags);
  for (size_t j = 0; j < a->d; j++) {
    double xhat = row_xhat(&s, a->norm, x, a->dtype, a->k, j);
    if (a->flags & RMSNORM_FLAG_ROUND_BEFORE_WEIGHT) xhat = rn_round_to(a->dtype, xhat);
    double v = xhat;
    v *= weight_at(a->w, a->w_data, a->w_offset, a->dtype, f64, j);
    if (a->b) v += rn_load_acc(a->b, f64, j);
    rn_store(y, a->dtype, j, v);
  }
  if (a->rstd) rn_store_acc(a->rstd, f64, row, ldexp(s.rs, -s.e));
  if (a->mean) rn_store_acc(a->mean, f64, row, ldexp(s.mean_s, s.e));
}

void rn_rescue_row_r(const rn_forward_args *a, size_t row, double *rs, int *e) {
  const char *x = (const char *)a->x + row * a->ldx * rn_dtype_size(a->dtype);
  scaled_stats s = row_stats(RN_RMSNORM, x, a->dtype, a->d, a->k, a->eps, a->flags);
  *rs = s.rs;
  *e = s.e;
}

void rn_rescue_backward_row(const rn_backward_args *a, size_t row, void *dw_part,
                            void *db_part) {
  size_t es = rn_dtype_size(a->dtype);
  int f64 = rn_acc_is_f64(a->dtype);
  const char *x = (const char *)a->x + row * a->ldx * es;
  const char *dy = (const char *)a->dy + row * a->lddy * es;
  char *dx = (char *)a->dx + row * a->lddx * es;
  size_t d = a->d, k = a->k;
  scaled_stats s = row_stats(a->norm, x, a->dtype, d, k, a->eps, a->flags);

  /* A = sum gy_j, B = sum gy_j xhat_j, with gy = dy * w */
  double A = 0, B = 0;
  for (size_t j = 0; j < d; j++) {
    double gy =
        rn_load(dy, a->dtype, j) * weight_at(a->w, a->w_data, a->w_offset, a->dtype, f64, j);
    A += gy;
    B += gy * row_xhat(&s, a->norm, x, a->dtype, k, j);
  }
  double mean_gy = 0, c;
  if (a->norm == RN_LAYERNORM) {
    mean_gy = A / (double)d;
    c = B / (double)d;
  } else if (!(a->flags & RMSNORM_FLAG_EPS_OUTSIDE)) {
    c = B / (double)k;
  } else {
    /* rho * r = sqrt(t) * rs in the scaled domain (NaN for a row holding an
     * infinity: rho = inf, r = 0) */
    c = s.t == 0 ? 0.0 : B / ((double)k * sqrt(s.t) * s.rs);
  }

  /* dx_j = r * (gy_j - mean_gy - [j in stat] xhat_j c), r = rs * 2^-e */
  for (size_t j = 0; j < d; j++) {
    double dyj = rn_load(dy, a->dtype, j);
    double gy = dyj * weight_at(a->w, a->w_data, a->w_offset, a->dtype, f64, j);
    double xhat = row_xhat(&s, a->norm, x, a->dtype, k, j);
    double t = gy - mean_gy;
    if (a->norm == RN_LAYERNORM || j < k) t -= xhat * c;
    rn_store(dx, a->dtype, j, ldexp(s.rs * t, -s.e));
    if (dw_part) rn_store_acc(dw_part, f64, j, rn_load_acc(dw_part, f64, j) + dyj * xhat);
    if (db_part) rn_store_acc(db_part, f64, j, rn_load_acc(db_part, f64, j) + dyj);
  }
}
