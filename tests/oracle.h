/* oracle.h - the float64 (here long double: 64-bit mantissa, 15-bit
 * exponent on x86-64) oracle the library is judged against. Written from the
 * textbook formulas, independently of the library's blocked sums and its
 * normalized-form backward: plain sequential sums, unnormalized gradients. */
#ifndef RMSNORM_ORACLE_H
#define RMSNORM_ORACLE_H

#include <math.h>
#include <stddef.h>

#include "numerics/dtype.h"
#include "rmsnorm.h"

typedef long double ld_t;

typedef struct oracle_opts {
  int layernorm;
  size_t k;        /* statistic length (pRMSNorm), d for LayerNorm */
  ld_t eps;
  int eps_outside;
  int round_first; /* round xhat to `dt` before the weight */
  rmsnorm_dtype dt;
} oracle_opts;

static inline ld_t oracle_round(rmsnorm_dtype dt, ld_t v) {
  return (ld_t)rn_round_to(dt, (double)v);
}

/* One row's statistics: mean (0 for RMSNorm) and r. */
static inline void oracle_stats(const ld_t *x, size_t d, const oracle_opts *o, ld_t *mean, ld_t *r) {
  *mean = 0;
  if (o->layernorm) {
    ld_t s = 0, v = 0;
    for (size_t j = 0; j < d; j++) s += x[j];
    *mean = s / d;
    for (size_t j = 0; j < d; j++) v += (x[j] - *mean) * (x[j] - *mean);
    ld_t den = sqrtl(v / d + o->eps);
    *r = den > 0 ? 1 / den : 0;
    return;
  }
  ld_t ss = 0;
  for (size_t j = 0; j < o->k; j++) ss += x[j] * x[j];
  ld_t ms = ss / o->k;
  ld_t den = o->eps_outside ? sqrtl(ms) + o->eps : sqrtl(ms + o->eps);
  *r = den > 0 ? 1 / den : 0;
}

/* y_j = xhat_j * w_j + b_j for one row; w, b may be NULL. */
static inline void oracle_forward_row(const ld_t *x, size_t d, const ld_t *w, const ld_t *b,
                               const oracle_opts *o, ld_t *y, ld_t *mean, ld_t *r) {
  oracle_stats(x, d, o, mean, r);
  for (size_t j = 0; j < d; j++) {
    ld_t h = (x[j] - *mean) * *r;
    if (o->round_first) h = oracle_round(o->dt, h);
    y[j] = h * (w ? w[j] : 1) + (b ? b[j] : 0);
  }
}

/* dx for one row, and adds dy*xhat, dy into dw, db (NULL to skip). */
static inline void oracle_backward_row(const ld_t *x, const ld_t *dy, size_t d, const ld_t *w,
                                const oracle_opts *o, ld_t *dx, ld_t *dw, ld_t *db) {
  ld_t mean, r;
  oracle_stats(x, d, o, &mean, &r);
  ld_t sgy = 0, sgyx = 0, sgyh = 0, ss = 0;
  for (size_t j = 0; j < o->k; j++) ss += x[j] * x[j];
  ld_t rho = sqrtl(ss / o->k);
  for (size_t j = 0; j < d; j++) {
    ld_t gy = dy[j] * (w ? w[j] : 1);
    sgy += gy;
    sgyx += gy * x[j];
    sgyh += gy * (x[j] - mean) * r;
  }
  for (size_t j = 0; j < d; j++) {
    ld_t gy = dy[j] * (w ? w[j] : 1);
    if (o->layernorm) {
      dx[j] = r * (gy - sgy / d - (x[j] - mean) * r * sgyh / d);
    } else if (j >= o->k) {
      dx[j] = r * gy;
    } else if (!o->eps_outside) {
      /* d r / d x_j = -r^3 x_j / k */
      dx[j] = r * gy - r * r * r * x[j] / o->k * sgyx;
    } else {
      /* r = 1/(rho + eps): d r / d x_j = -r^2 x_j / (k rho) */
      dx[j] = r * gy - (rho > 0 ? r * r * x[j] / (o->k * rho) * sgyx : 0);
    }
    if (dw) dw[j] += dy[j] * (x[j] - mean) * r;
    if (db) db[j] += dy[j];
  }
}

#endif
