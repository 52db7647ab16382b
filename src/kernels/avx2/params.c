/* params.c - fp16 parameter rows widened to the fp32 compute type with F16C
 * (runtime/work.c: rn_param_as_acc), for the AVX2 and AVX-512 sets. A weight
 * or bias of the data's dtype is converted at every one-shot call, and the
 * portable loop's fp16 decoding costs several times a decode row's own work.
 * vcvtph2ps is exact and quiets NaNs as rn_f16_to_f32 does; the offset is
 * one float add, as the portable loop's. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/kernels.h"

void rn_avx2_widen_f16(const void *src, size_t n, float offset, float *dst) {
  const unsigned char *p = src; /* any alignment */
  __m256 off = _mm256_set1_ps(offset);
  size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(p + 2 * j));
    _mm256_storeu_ps(dst + j, _mm256_add_ps(off, _mm256_cvtph_ps(h)));
  }
  if (j < n) {
    uint16_t tail[8] = {0};
    for (size_t i = 0; j + i < n; i++) tail[i] = (uint16_t)(p[2 * (j + i)] | p[2 * (j + i) + 1] << 8);
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(off, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)tail))));
    for (size_t i = 0; j + i < n; i++) dst[j + i] = out[i];
  }
}
