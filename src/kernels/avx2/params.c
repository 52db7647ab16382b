/* params.c - the parameter rows' conversions between fp16/bf16 and the fp32
 * compute type (runtime/work.c), for the AVX2 and AVX-512 sets: a weight or
 * bias of the data's dtype widened at every one-shot call, and a backward's
 * fp16/bf16 dweight/dbias narrowed from its float sums. A decode-sized call
 * converts d values each way, which the portable loops take several times a
 * row's own work to do. The bits are convert.h's: vcvtph2ps is exact and
 * quiets NaNs as rn_f16_to_f32 does, vcvtps2ph rounds to nearest even as
 * rn_f32_to_f16, and bf16 rounds as rn_f32_to_bf16 (tests/test_convert.c). */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"
#include "numerics/convert.h"

void rn_avx2_widen(rmsnorm_dtype dt, const void *src, size_t n, float offset, float *dst) {
  const unsigned char *p = src; /* any alignment */
  int bf16 = dt == RMSNORM_BF16;
  __m256 off = _mm256_set1_ps(offset);
  size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(p + 2 * j));
    __m256 v = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                    : _mm256_cvtph_ps(h);
    _mm256_storeu_ps(dst + j, _mm256_add_ps(off, v));
  }
  for (; j < n; j++) {
    uint16_t h;
    memcpy(&h, p + 2 * j, 2);
    dst[j] = offset + (bf16 ? rn_bf16_to_f32(h) : rn_f16_to_f32(h));
  }
}

/* 8 floats to bf16 in the low 16 bits of each 32-bit lane, nearest even; a
 * NaN keeps its sign and top payload and is made quiet (rn_f32_to_bf16). */
static inline __m256i bf16_lanes(__m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                   _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(r, q, nan);
}
static inline __m128i bf16_of(__m256 v) {
  __m256i h = bf16_lanes(v);
  return _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

void rn_avx2_narrow(rmsnorm_dtype dt, const float *src, size_t n, void *dst) {
  unsigned char *p = dst; /* any alignment */
  int bf16 = dt == RMSNORM_BF16;
  size_t j = 0;
  /* bf16 16 at a time: one pack and one permute for two vectors (a decode
   * backward narrows d of these a call) */
  for (; bf16 && j + 16 <= n; j += 16) {
    __m256i a = bf16_lanes(_mm256_loadu_ps(src + j)), b = bf16_lanes(_mm256_loadu_ps(src + j + 8));
    __m256i h = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8); /* a0-7, b0-7 */
    _mm256_storeu_si256((__m256i *)(void *)(p + 2 * j), h);
  }
  for (; j + 8 <= n; j += 8) {
    __m256 v = _mm256_loadu_ps(src + j);
    __m128i h = bf16 ? bf16_of(v) : _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i *)(void *)(p + 2 * j), h);
  }
  for (; j < n; j++) {
    uint16_t h = bf16 ? rn_f32_to_bf16(src[j]) : rn_f32_to_f16(src[j]);
    memcpy(p + 2 * j, &h, 2);
  }
}
