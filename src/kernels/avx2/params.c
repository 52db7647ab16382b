/* params.c - the parameter rows' conversions between fp16/bf16 and the fp32
 * compute type (runtime/work.c), for the AVX2 and AVX-512 sets: a weight or
 * bias of the data's dtype widened at every one-shot call, and a backward's
 * fp16/bf16 dweight/dbias narrowed from its float sums, and a quantized
 * call's test that its float weight and bias are finite. A decode-sized call
 * converts d values each way, which the portable loops take several times a
 * row's own work to do. The conversions are the AVX2 set's own
 * (simd_avx2.h), whose bits are convert.h's: vcvtph2ps is exact and quiets
 * NaNs as rn_f16_to_f32 does, vcvtps2ph rounds to nearest even as
 * rn_f32_to_f16, and bf16 rounds as rn_f32_to_bf16 (tests/test_convert.c);
 * an fp32 weight copied (1 + g, or a misaligned one) takes the same add. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd_avx2.h"
#include "kernels/kernels.h"
#include "numerics/convert.h"

void rn_avx2_widen(rmsnorm_dtype dt, const void *src, size_t n, float offset, float *dst) {
  const unsigned char *p = src; /* any alignment */
  int bf16 = dt == RMSNORM_BF16;
  __m256 off = _mm256_set1_ps(offset);
  size_t j = 0;
  if (dt == RMSNORM_F32) { /* offset + g, the portable loop's one add */
    for (; j + 8 <= n; j += 8) {
      __m256 g = _mm256_loadu_ps((const float *)(const void *)(p + 4 * j));
      _mm256_storeu_ps(dst + j, _mm256_add_ps(off, g));
    }
    for (; j < n; j++) {
      float g;
      memcpy(&g, p + 4 * j, 4);
      dst[j] = offset + g;
    }
    return;
  }
  for (; j + 8 <= n; j += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(p + 2 * j));
    __m256 v = bf16 ? bf16_widen(h) : f16_widen(h);
    _mm256_storeu_ps(dst + j, _mm256_add_ps(off, v));
  }
  for (; j < n; j++) {
    uint16_t h;
    memcpy(&h, p + 2 * j, 2);
    dst[j] = offset + (bf16 ? rn_bf16_to_f32(h) : rn_f16_to_f32(h));
  }
}

void rn_avx2_narrow(rmsnorm_dtype dt, const float *src, size_t n, void *dst) {
  unsigned char *p = dst; /* any alignment */
  int bf16 = dt == RMSNORM_BF16;
  size_t j = 0;
  /* bf16 16 at a time: one pack and one permute for two vectors (a decode
   * backward narrows d of these a call) */
  for (; bf16 && j + 16 <= n; j += 16) {
    __m256i h = f32x2_to_bf16(_mm256_loadu_ps(src + j), _mm256_loadu_ps(src + j + 8));
    _mm256_storeu_si256((__m256i *)(void *)(p + 2 * j), h);
  }
  for (; j + 8 <= n; j += 8) {
    __m256 v = _mm256_loadu_ps(src + j);
    __m128i h = bf16 ? f32_to_bf16(v) : f32_to_f16(v);
    _mm_storeu_si128((__m128i *)(void *)(p + 2 * j), h);
  }
  for (; j < n; j++) {
    uint16_t h = bf16 ? rn_f32_to_bf16(src[j]) : rn_f32_to_f16(src[j]);
    memcpy(p + 2 * j, &h, 2);
  }
}

/* No exponent field all ones: the largest masked exponent field of the
 * values, two unsigned maxima a vector (the values' bits alone: no floating
 * point operation, so no flag is raised). */
int rn_avx2_finite(const float *p, size_t n) {
  const __m256i e = _mm256_set1_epi32(0x7f800000);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0;
  size_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(p + j));
    __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(p + j + 8));
    m0 = _mm256_max_epu32(m0, _mm256_and_si256(a, e));
    m1 = _mm256_max_epu32(m1, _mm256_and_si256(b, e));
  }
  for (; j + 8 <= n; j += 8) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(p + j));
    m0 = _mm256_max_epu32(m0, _mm256_and_si256(a, e));
  }
  /* a lane at 0x7f800000 is an infinity or a NaN */
  __m256i bad = _mm256_cmpeq_epi32(_mm256_max_epu32(m0, m1), e);
  int finite = _mm256_testz_si256(bad, bad);
  for (; j < n; j++) finite &= isfinite(p[j]) != 0;
  return finite;
}
