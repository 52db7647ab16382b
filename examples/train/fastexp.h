/* fastexp.h - exp and tanh for float, branch-free so that loops over them
 * vectorize (at the baseline ISA: no -m flags needed), within about 2 ulp of
 * the true value over float's range. The float model uses them in its
 * softmaxes and GELU; the double model uses libm. */
#ifndef TRAIN_FASTEXP_H
#define TRAIN_FASTEXP_H

#include <stdint.h>
#include <string.h>

/* exp(x) = 2^k e^r with k = nearest(x / ln 2), r = x - k ln 2 (ln 2 in two
 * parts, so r is nearly exact), |r| <= ln2/2, e^r by its Taylor polynomial of
 * degree 7 (truncation below 2e-9 relative). x is first clamped to
 * [-87, 88], so 2^k is a normal float: results below e^-87 come out as
 * e^-87 ~ 1.6e-38 rather than smaller (negligible wherever they are added to
 * something), above e^88 they saturate at e^88 ~ 1.7e38, and NaN stays NaN. */
static inline float fast_expf(float x) {
  float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  if (xc != xc) xc = 0.0f; /* NaN: computed on 0, returned as NaN below */
  /* round to nearest by the 1.5 * 2^23 trick (no libm call, vectorizes) */
  float kf = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = (xc - kf * 0.693145751953125f) - kf * 1.42860682030941723212e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t k = (int32_t)kf;
  uint32_t bits = (uint32_t)(k + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  float y = p * scale;
  return x != x ? x : y;
}

/* tanh(u) = 1 - 2 / (e^{2u} + 1): -1 and 1 at the ends, odd up to rounding;
 * near 0 its absolute error is ~1e-7 (enough for GELU, which adds 1). */
static inline float fast_tanhf(float u) {
  return 1.0f - 2.0f / (fast_expf(2.0f * u) + 1.0f);
}

#endif /* TRAIN_FASTEXP_H */
