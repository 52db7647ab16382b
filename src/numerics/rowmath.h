/* rowmath.h - the per-row scalar arithmetic every kernel shares: from a row's
 * lane sums to its statistics (mean, r) and backward coefficients, in double.
 * One copy of this logic keeps all ISAs bit-identical; the kernels only
 * produce the sums and apply the results element-wise. */
#ifndef RMSNORM_ROWMATH_H
#define RMSNORM_ROWMATH_H

#include <float.h>
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"

/* A row sum of squares computed in the storage's compute type cannot be
 * trusted when it overflowed, or when it is so small that squares may have
 * underflowed while eps is too small to hide the loss. Such rows go to the
 * double-precision rescue path (src/numerics/rescue.c).
 *
 * Float sums: every square enters through one FMA, whose rounding in the
 * subnormal range errs by at most 2^-150, so over k terms the sum s is off by
 * at most k * 2^-150 and the mean ms = s/k by at most 2^-150.
 *   - s >= 2^-100: at most k * 2^-50 relative, < 2^-24 for k <= 2^26.
 *   - eps inside the root, 1/sqrt(ms + eps): ms's error is at most
 *     2^-150 / eps of ms + eps, 2^-80 for eps >= 2^-70.
 *   - eps outside, 1/(sqrt(ms) + eps): sqrt moves by at most sqrt(2^-150) =
 *     2^-75, at most 2^-31 of sqrt(ms) + eps for eps >= 2^-44. (A bound of
 *     2^-70 here would let x ~ 1.5 * 2^-75, eps = 2^-70 through with r off by
 *     2.6e-3.)
 * Double sums (fp64 data) alike: errors of 2^-1075 per term; s >= 2^-960,
 * or eps >= 2^-930 inside (2^-145 relative), or eps >= 2^-470 outside
 * (sqrt(2^-1075) / 2^-470 = 2^-67.5). A zero row with a real eps never needs
 * the rescue. */
static inline int rn_sum_untrusted(double s, double eps, int eps_outside, int f64) {
  if (!isfinite(s)) return 1;
  if (f64) return s < 0x1p-960 && eps < (eps_outside ? 0x1p-470 : 0x1p-930);
  return s < 0x1p-100 && eps < (eps_outside ? 0x1p-44 : 0x1p-70);
}

/* 1/den for a statistic's denominator: a zero den (a zero row with eps = 0)
 * gives 0, so the row maps to the bias; otherwise IEEE, so an infinite den
 * (a row holding an infinity) gives 0 and a NaN stays NaN (docs/numerics.md,
 * "Non-finite inputs"). */
static inline double rn_inv_den(double den) { return den == 0 ? 0.0 : 1.0 / den; }

/* RMSNorm r from the sum of squares over k elements (rn_inv_den's zero). */
static inline double rn_rms_r(double sumsq, size_t k, double eps, unsigned flags) {
  double ms = sumsq / (double)k;
  double den = (flags & RMSNORM_FLAG_EPS_OUTSIDE) ? sqrt(ms) + eps : sqrt(ms + eps);
  return rn_inv_den(den);
}

/* LayerNorm rstd from the sum of squared deviations over d elements. */
static inline double rn_ln_rstd(double sumsqdev, size_t d, double eps) {
  return rn_inv_den(sqrt(sumsqdev / (double)d + eps));
}

/* Whether a saved per-row r can be used as is: r outside the normal range of
 * the compute type (0, subnormal, inf, NaN) is recomputed from x instead. */
static inline int rn_saved_r_usable(double r, int f64) {
  return f64 ? (r >= DBL_MIN && r <= DBL_MAX) : (r >= FLT_MIN && r <= FLT_MAX);
}

/* RMSNorm backward coefficient c of dx_j = r * (gy_j - [j<k] xhat_j * c), from
 * B = sum_j gy_j * xhat_j over the whole row and, for eps outside, the sum of
 * squares over the first k elements (see the derivation in ref/norm_ref.inc). */
static inline double rn_rms_backward_c(double B, double sumsq, double r, size_t k,
                                       unsigned flags) {
  if (!(flags & RMSNORM_FLAG_EPS_OUTSIDE)) return B / (double)k;
  double rho = sqrt(sumsq / (double)k);
  return rho == 0 ? 0.0 : B / ((double)k * rho * r);
}

/* Combines a row's double lanes by halving: lane i += lane i + h for
 * h = lanes/2, ..., 1 (the fixed order of every kernel set). */
static inline double rn_halve_lanes(double *acc, size_t lanes) {
  for (size_t h = lanes / 2; h >= 1; h /= 2)
    for (size_t i = 0; i < h; i++) acc[i] += acc[i + h];
  return acc[0];
}

/* pRMSNorm's k for a fraction p in (0, 1] of d: the smallest k in [1, d]
 * whose quotient k/d, rounded to the nearest double, is >= p. That is
 * ceil(p*d) with p standing for every real number that rounds to it: a p
 * written as a decimal P (0.07) whose P*d is an integer K (7 for d = 100)
 * gives K, although the double nearest 0.07 times 100 is 7.0000000000000007
 * whose ceiling is 8; and p = K/d computed in double gives K.
 * Computed exactly: c = ceil(p*d) of the exact product (its rounding error
 * from fma), then c - 1 when (c - 1)/d rounds to p. At most one integer can
 * do so while d < 2^53, since p's rounding interval is narrower than 1/d. */
static inline size_t rn_partial_k(double p, size_t d) {
  if (p >= 1) return d;
  double dd = (double)d, c;
  if (d >= ((size_t)1 << 53)) { /* no such row fits in memory: plain ceil */
    c = ceil(p * dd);
  } else {
    double prod = p * dd, err = fma(p, dd, -prod); /* p*d = prod + err exactly */
    c = ceil(prod);
    if (c == prod && err > 0) c += 1; /* prod is an integer the exact value exceeds */
    if (c >= 2 && (c - 1) / dd >= p) c -= 1;
  }
  if (c < 1) return 1;
  if (c >= dd) return d;
  return (size_t)c;
}

#endif
