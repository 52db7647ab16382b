/* sandwich_oracle.h - the long double oracle of Gemma 2/3's sandwich norms:
 * h' = h + post(a), x' = pre(h'), both Gemma RMSNorms (y = x r (1 + w)), with
 * plain sequential sums and a backward by the chain rule through r itself. */
#ifndef RMSNORM_SANDWICH_ORACLE_H
#define RMSNORM_SANDWICH_ORACLE_H

#include <math.h>
#include <stddef.h>

typedef long double sw_t;

/* rows up to this long: the row buffers are on the stack */
#define SANDWICH_ORACLE_MAX_D 8192

static inline sw_t sandwich_r(const sw_t *v, size_t d, sw_t eps) {
  sw_t ss = 0;
  for (size_t j = 0; j < d; j++) ss += v[j] * v[j];
  return 1 / sqrtl(ss / d + eps);
}

/* One row: hn = h + post(a), xn = pre(hn). */
static inline void sandwich_forward_row(const sw_t *a, const sw_t *h, const sw_t *w_post,
                                        const sw_t *w_pre, size_t d, sw_t eps, sw_t *hn,
                                        sw_t *xn) {
  sw_t ra = sandwich_r(a, d, eps);
  for (size_t j = 0; j < d; j++) hn[j] = h[j] + a[j] * ra * (1 + w_post[j]);
  sw_t rh = sandwich_r(hn, d, eps);
  for (size_t j = 0; j < d; j++) xn[j] = hn[j] * rh * (1 + w_pre[j]);
}

/* The gradient through one Gemma norm y = v r (1 + w): dv, and dw += . With
 * gy_j = dy_j (1 + w_j): dv_j = gy_j r + (sum_i gy_i v_i) dr/dv_j,
 * dr/dv_j = -r^3 v_j / d. */
static inline void sandwich_norm_grad(const sw_t *v, const sw_t *dy, const sw_t *w, size_t d,
                                      sw_t eps, sw_t *dv, sw_t *dw) {
  sw_t r = sandwich_r(v, d, eps), s = 0;
  for (size_t i = 0; i < d; i++) s += dy[i] * (1 + w[i]) * v[i];
  for (size_t j = 0; j < d; j++) {
    dv[j] = dy[j] * (1 + w[j]) * r - s * r * r * r * v[j] / d;
    if (dw) dw[j] += dy[j] * v[j] * r;
  }
}

/* One row backward from dhn (the residual stream's gradient) and dxn: the
 * total gradient of hn is dhn + pre's; da through post, dh = that total. */
static inline void sandwich_backward_row(const sw_t *a, const sw_t *h, const sw_t *w_post,
                                         const sw_t *w_pre, const sw_t *dhn, const sw_t *dxn,
                                         size_t d, sw_t eps, sw_t *da, sw_t *dh, sw_t *dw_post,
                                         sw_t *dw_pre) {
  sw_t hn[SANDWICH_ORACLE_MAX_D], xn[SANDWICH_ORACLE_MAX_D], g[SANDWICH_ORACLE_MAX_D];
  sandwich_forward_row(a, h, w_post, w_pre, d, eps, hn, xn);
  sandwich_norm_grad(hn, dxn, w_pre, d, eps, g, dw_pre);
  for (size_t j = 0; j < d; j++) dh[j] = g[j] + dhn[j];
  sandwich_norm_grad(a, dh, w_post, d, eps, da, dw_post);
}

#endif
