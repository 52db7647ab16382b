/* simd_avx2.h - the vector vocabulary of the shared SIMD bodies
 * (instantiate.inc) for AVX2 + FMA + F16C: 8 floats or 4 doubles a vector.
 * AVX2 has no masked 16-bit moves, so tails go through a small zero-filled
 * buffer. */
#ifndef RMSNORM_SIMD_AVX2_H
#define RMSNORM_SIMD_AVX2_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/tail_buffer.h"

#define VF_W 8
#define VD_W 4

/* The forward's plain output loop two vectors an iteration (store_simd.inc):
 * one fp32 vector an iteration left a third of its instructions to the loop
 * (bench/RESULTS.md, 2026-12-07) */
#if defined(__clang__)
#define RN_SPAN_UNROLL_FORWARD _Pragma("unroll 2")
#else
#define RN_SPAN_UNROLL_FORWARD _Pragma("GCC unroll 2")
#endif

typedef __m256 vf;
typedef __m256d vd;

/* The arithmetic of a compute type's vector V of scalars S, by the suffix of
 * its intrinsics (ps: float, pd: double): V_zero, V_set1, V_add, V_sub,
 * V_mul, V_fma (a * b + c) and V_fnma (c - a * b), the last two rounded once. */
#define V_ARITH(V, S, sfx)                                                         \
  static inline V V##_zero(void) { return _mm256_setzero_##sfx(); }                \
  static inline V V##_set1(S a) { return _mm256_set1_##sfx(a); }                   \
  static inline V V##_add(V a, V b) { return _mm256_add_##sfx(a, b); }             \
  static inline V V##_sub(V a, V b) { return _mm256_sub_##sfx(a, b); }             \
  static inline V V##_mul(V a, V b) { return _mm256_mul_##sfx(a, b); }             \
  static inline V V##_fma(V a, V b, V c) { return _mm256_fmadd_##sfx(a, b, c); }   \
  static inline V V##_fnma(V a, V b, V c) { return _mm256_fnmadd_##sfx(a, b, c); }

/* ---- float compute ---- */
V_ARITH(vf, float, ps)
static inline __m256i lanes_below(size_t n, int count) {
  __m256i iota = count == 8 ? _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
                            : _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), iota);
}
static inline vf vf_zero_from(vf v, size_t n) {
  return _mm256_and_ps(v, _mm256_castsi256_ps(lanes_below(n, 8)));
}

/* the two halves of a float vector, widened to double (exact) */
static inline __m256d vf_cvt_lo(vf v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
static inline __m256d vf_cvt_hi(vf v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }

static inline vf vf_load_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline void vf_store_f32(float *p, vf v) { _mm256_storeu_ps(p, v); }
V_BUFFERED_TAILS(vf, f32, float, VF_W)
static inline void vf_stream_f32(float *p, vf v) { _mm256_stream_ps(p, v); }

/* A 16-bit storage type's accessors, from its load of 8 values widened to a
 * float vector, its widening of 8 values in a register and its narrowing:
 * load, load of the first n, store, store of the first n, streaming store,
 * and the round trip (the value the stored bits hold). */
#define VF_HALF_ACCESSORS(T, load, widen, narrow)                                  \
  static inline vf vf_load_##T(const uint16_t *p) { return load(p); }              \
  static inline void vf_store_##T(uint16_t *p, vf v) {                             \
    _mm_storeu_si128((__m128i *)(void *)p, narrow(v));                             \
  }                                                                                \
  V_BUFFERED_TAILS(vf, T, uint16_t, VF_W)                                          \
  static inline void vf_stream_##T(uint16_t *p, vf v) {                            \
    _mm_stream_si128((__m128i *)(void *)p, narrow(v));                             \
  }                                                                                \
  static inline vf vf_round_##T(vf v) { return widen(narrow(v)); }

static inline __m128i f32_to_f16(vf v) {
  return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline vf f16_widen(__m128i h) { return _mm256_cvtph_ps(h); }
static inline vf f16_load(const uint16_t *p) {
  return f16_widen(_mm_loadu_si128((const __m128i *)(const void *)p));
}
VF_HALF_ACCESSORS(f16, f16_load, f16_widen, f32_to_f16)
/* Two vectors, 16 outputs (a's, then b's), in one 32-byte store: half the
 * loop's bookkeeping per output (p aligned to 32 bytes when streamed). */
#define VF_F16_PAIRS 1
static inline __m256i f32x2_to_f16(vf a, vf b) { return _mm256_set_m128i(f32_to_f16(b), f32_to_f16(a)); }
static inline void vf_store2_f16(uint16_t *p, vf a, vf b) {
  _mm256_storeu_si256((__m256i *)(void *)p, f32x2_to_f16(a, b));
}
static inline void vf_stream2_f16(uint16_t *p, vf a, vf b) {
  _mm256_stream_si256((__m256i *)(void *)p, f32x2_to_f16(a, b));
}

/* bf16 -> fp32 puts the 16 bits at the top of a 32-bit lane, zeros below.
 * From a register: zero extension, then a shift. From memory: the 8 values
 * loaded into both 128-bit halves (a broadcast load, which takes no vector
 * pipe), then one byte shuffle moves values 0-3 into the low half's lanes
 * and 4-7 into the high half's: one vector operation where the other takes
 * two, in loops that run out of vector pipes before loads. */
static inline vf bf16_widen(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline vf bf16_load(const uint16_t *p) {
  const __m256i spread = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,
                                          -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
  __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
  return _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(h), spread));
}
/* fp32 -> bf16 rounds to nearest even on the dropped 16 bits; a NaN keeps its
 * top 16 bits, made quiet (convert.h). The rounding, its result in the low
 * 16 bits of each lane: */
static inline __m256i bf16_rne_low(vf v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
}
/* r with v's NaN lanes replaced by their quiet top halves */
static inline __m256i bf16_quiet_nans(vf v, __m256i r) {
  __m256i q = _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(r, q, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
/* NaN lanes are rare, and one compare finds them in one vector or two: the
 * blend goes behind a branch (three operations a vector, of the eleven that
 * one vector's conversion took with it). */
static inline __m128i f32_to_bf16(vf v) {
  __m256i r = bf16_rne_low(v);
  __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  if (__builtin_expect(!_mm256_testz_ps(nan, nan), 0)) r = bf16_quiet_nans(v, r);
  /* 8 x 32 -> 8 x 16: pack within lanes, then gather the two low halves */
  __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}
VF_HALF_ACCESSORS(bf16, bf16_load, bf16_widen, f32_to_bf16)
#define VF_BF16_PAIRS 1
/* Two vectors, 16 outputs (a's, then b's): one NaN test and one pack for
 * both. */
static inline __m256i f32x2_to_bf16(vf a, vf b) {
  __m256i ra = bf16_rne_low(a), rb = bf16_rne_low(b);
  __m256 nan = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
  if (__builtin_expect(!_mm256_testz_ps(nan, nan), 0))
    ra = bf16_quiet_nans(a, ra), rb = bf16_quiet_nans(b, rb);
  /* packed: a0-3 b0-3 | a4-7 b4-7; the quadword permute puts a before b */
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(ra, rb), 0xd8);
}
static inline void vf_store2_bf16(uint16_t *p, vf a, vf b) {
  _mm256_storeu_si256((__m256i *)(void *)p, f32x2_to_bf16(a, b));
}
/* p aligned to 32 bytes */
static inline void vf_stream2_bf16(uint16_t *p, vf a, vf b) {
  _mm256_stream_si256((__m256i *)(void *)p, f32x2_to_bf16(a, b));
}

/* bf16 16 at a time in even/odd order (VF_BF16_EVEN_ODD): a 32-byte load
 * holds values 2i and 2i+1 in 32-bit lane i, so the even-indexed values are
 * the lanes shifted up and the odd ones the lanes masked, and 16 rounded
 * outputs go back into those lanes by one blend. The byte shuffles of the
 * widening, the pack and the permute of the narrowing leave the loop (the
 * bf16 forward on AVX2 is bound by its count of vector operations), but the
 * parameters must come in the same order: vf_even_odd reorders them. */
#define VF_BF16_EVEN_ODD 1
static inline void vf_load_even_odd_bf16(const uint16_t *p, vf *even, vf *odd) {
  __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)p);
  *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}
/* the even-indexed and the odd-indexed values of a's then b's 16 */
static inline void vf_even_odd(vf a, vf b, vf *even, vf *odd) {
  /* per 128-bit lane a0 a2 b0 b2 | a4 a6 b4 b6, then quadwords 0 2 1 3 */
  *even = _mm256_castpd_ps(
      _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
  *odd = _mm256_castpd_ps(
      _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
}
/* bf16_rne_low's sum u + 0x7fff + lsb, its lsb found by a compare (-1
 * where it is 0), not by a shift: the shifts share two of the four vector
 * pipes with the shuffles */
static inline __m256i bf16_rne_sum(vf v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i even = _mm256_cmpeq_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x10000)),
                                    _mm256_setzero_si256());
  return _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x8000)), even);
}
/* the 16 values of even/odd order rounded to bf16, in order; may_nan 0
 * when no lane can be NaN (the caller knows), which spares the test */
static inline __m256i f32_even_odd_to_bf16(vf even, vf odd, int may_nan) {
  if (may_nan) {
    __m256 nan = _mm256_cmp_ps(even, odd, _CMP_UNORD_Q);
    if (__builtin_expect(!_mm256_testz_ps(nan, nan), 0)) {
      __m256i e = bf16_quiet_nans(even, bf16_rne_low(even));
      __m256i o = bf16_quiet_nans(odd, bf16_rne_low(odd));
      return _mm256_or_si256(e, _mm256_slli_epi32(o, 16));
    }
  }
  /* 16-bit words 0, 2, .. from the even sums' top halves, 1, 3, .. from the odd */
  return _mm256_blend_epi16(_mm256_srli_epi32(bf16_rne_sum(even), 16), bf16_rne_sum(odd), 0xaa);
}
static inline void vf_store_even_odd_bf16(uint16_t *p, vf even, vf odd, int may_nan) {
  _mm256_storeu_si256((__m256i *)(void *)p, f32_even_odd_to_bf16(even, odd, may_nan));
}
/* p aligned to 32 bytes */
static inline void vf_stream_even_odd_bf16(uint16_t *p, vf even, vf odd, int may_nan) {
  _mm256_stream_si256((__m256i *)(void *)p, f32_even_odd_to_bf16(even, odd, may_nan));
}

/* ---- double compute ---- */
V_ARITH(vd, double, pd)
static inline vd vd_zero_from(vd v, size_t n) {
  return _mm256_and_pd(v, _mm256_castsi256_pd(lanes_below(n, 4)));
}
/* lanes halved within one vector: lane i += lane i + h, h = 2, 1 */
static inline double vd_halve(vd v) {
  __m128d b = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(b, _mm_unpackhi_pd(b, b)));
}
/* vd_halve of VD_W rows at once: lane i of the result is vd_halve(v[i]), by
 * the same additions done across rows (each step adds the halves of two
 * rows' lanes in one vector), then put back in row order. */
static inline vd vd_halve_rows(const vd *v) {
  vd h[2];
  for (int i = 0; i < 2; i++) /* rows 2i, 2i+1: lane j += lane j + 2 */
    h[i] = _mm256_add_pd(_mm256_permute2f128_pd(v[2 * i], v[2 * i + 1], 0x20),
                         _mm256_permute2f128_pd(v[2 * i], v[2 * i + 1], 0x31));
  /* lane 0 += lane 1: rows 0, 2, 1, 3 */
  vd s = _mm256_add_pd(_mm256_unpacklo_pd(h[0], h[1]), _mm256_unpackhi_pd(h[0], h[1]));
  return _mm256_permute4x64_pd(s, _MM_SHUFFLE(3, 1, 2, 0));
}
static inline vd vd_div(vd a, vd b) { return _mm256_div_pd(a, b); }
static inline vd vd_sqrt(vd a) { return _mm256_sqrt_pd(a); }
/* the lanes of v where c > 0, zero elsewhere */
static inline vd vd_where_pos(vd c, vd v) {
  return _mm256_and_pd(v, _mm256_cmp_pd(c, _mm256_setzero_pd(), _CMP_GT_OQ));
}
static inline vd vd_load_f64(const double *p) { return _mm256_loadu_pd(p); }
static inline void vd_store_f64(double *p, vd v) { _mm256_storeu_pd(p, v); }
V_BUFFERED_TAILS(vd, f64, double, VD_W)
static inline void vd_stream_f64(double *p, vd v) { _mm256_stream_pd(p, v); }

static inline void v_store_fence(void) { _mm_sfence(); }
/* a hint: the line holding p will be read soon; into L2 (prefetcht1), not L1,
 * where it would evict the row being worked on. (_mm_prefetch inside an
 * inline function was dropped by GCC 12, hence the builtin.) Always inlined:
 * a call that GCC leaves out of line (past its large-function-growth limit,
 * as in the forward's entry functions) calls a function without side
 * effects, and GCC then deletes the call, prefetch and all. */
static inline __attribute__((always_inline)) void v_prefetch(const void *p) {
  __builtin_prefetch(p, 0, 2);
}
/* prefetches per 32-byte vector from DRAM-sized inputs: four a line
 * (store_simd.inc, V_PREFETCH_REPEAT) */
#define V_PREFETCH_REPEAT 2
/* the backward's, for each of its two inputs (x and dy): eight a line (fp32
 * 4096 x 4096, one thread: 7.6 ms at two a vector, 6.0 at four, as fast as
 * AVX-512's four a line; no faster at six or eight; the forward measured no
 * faster at four) */
#define V_PREFETCH_REPEAT_GRAD 4

#endif
