/* activation.h - the gates' activations, sigmoid and SiLU, in float and
 * double. e^x is computed here from +, *, and conversions only (no libm
 * call), so the same C code gives the same bits on every ISA and compiler
 * that keeps IEEE semantics (no -ffast-math, -ffp-contract=off), and loops
 * over it vectorize. Products that add go through fmaf/fma, exact on every
 * target: one instruction where the ISA has FMA (the SIMD sets), libm's
 * software fma in the portable reference set (slow, same bits). Accuracy: within 2 ulp of e^x where it is a normal
 * number (float: Cody-Waite reduction to |t| <= ln2/2, then a degree-7
 * Taylor polynomial, whose truncation error 0.35^8/8! is 5e-9 relative;
 * double: degree 13, 4e-17). */
#ifndef RMSNORM_ACTIVATION_H
#define RMSNORM_ACTIVATION_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline double rn_pow2i_f64(int64_t k) {
  uint64_t u = (uint64_t)(k + 1023) << 52;
  double f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* e^x in float, within 2 ulp for x in [-87.3, 88.37]. Below, x is taken
 * as -87.3 (e^x = 1.2e-38, where the exact value is smaller still: a
 * sigmoid of a gate above 87 is 1 either way); from 88.38 on (where 2^k
 * leaves float; e^x overflows exactly from 88.72) the result is infinite,
 * so a sigmoid below -88.38 is 0 instead of at most 3e-39. NaN gives NaN. The integer k is read from
 * the bits of a float holding k + 1.5*2^23 (no float-to-int conversion, so a
 * NaN never meets one). */
static inline float rn_exp_f32(float x) {
  float c = x > 89.0f ? 89.0f : x;
  c = c < -87.3f ? -87.3f : c;
  /* k = round(c / ln2) by the 1.5*2^23 trick; t = c - k ln2 in two parts */
  float big = fmaf(c, 1.44269504088896341f, 12582912.0f);
  float kf = big - 12582912.0f;
  float t = fmaf(-kf, 1.428606765330187e-06f, fmaf(-kf, 0.693145751953125f, c));
  float p = 1.0f / 5040;
  p = fmaf(p, t, 1.0f / 720);
  p = fmaf(p, t, 1.0f / 120);
  p = fmaf(p, t, 1.0f / 24);
  p = fmaf(p, t, 1.0f / 6);
  p = fmaf(p, t, 0.5f);
  p = fmaf(p, t, 1.0f);
  p = fmaf(p, t, 1.0f);
  /* the low bits of big are k + 2^22 (k in [-126, 128]): 2^k = (k + 127) << 23,
   * infinity for k = 128 */
  uint32_t bits;
  memcpy(&bits, &big, sizeof bits);
  uint32_t e2 = ((bits - 0x4B400000u + 127u) & 0xFFu) << 23;
  float scale;
  memcpy(&scale, &e2, sizeof scale);
  float e = p * scale;
  return isnan(x) ? x : e;
}

/* e^x in double: arguments beyond [-745.2, 709.8] clamped, as above. */
static inline double rn_exp_f64(double x) {
  double c = isnan(x) ? 0.0 : x;
  c = c > 709.8 ? 709.8 : c;
  c = c < -745.2 ? -745.2 : c;
  double kf = fma(c, 1.4426950408889634, 6755399441055744.0) - 6755399441055744.0;
  double t = fma(-kf, 1.9082149292705877e-10, fma(-kf, 0.6931471803691238, c));
  static const double inv_fact[14] = {1.0,
                                       1.0,
                                       1.0 / 2,
                                       1.0 / 6,
                                       1.0 / 24,
                                       1.0 / 120,
                                       1.0 / 720,
                                       1.0 / 5040,
                                       1.0 / 40320,
                                       1.0 / 362880,
                                       1.0 / 3628800,
                                       1.0 / 39916800,
                                       1.0 / 479001600,
                                       1.0 / 6227020800.0};
  double p = inv_fact[13];
  for (int i = 12; i >= 0; i--) p = fma(p, t, inv_fact[i]);
  int64_t k = (int64_t)kf, k1 = k / 2;
  double e = p * rn_pow2i_f64(k1) * rn_pow2i_f64(k - k1);
  return isnan(x) ? x : e;
}

/* sigmoid(z) = 1 / (1 + e^-z): 1 for large z, 0 (or a subnormal) for very
 * negative z, NaN for NaN. */
static inline float rn_sigmoid_f32(float z) { return 1.0f / (1.0f + rn_exp_f32(-z)); }
static inline double rn_sigmoid_f64(double z) { return 1.0 / (1.0 + rn_exp_f64(-z)); }

#endif
