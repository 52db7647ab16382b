/* simd_avx512.h - the vector vocabulary of the shared SIMD bodies
 * (instantiate.inc) for AVX-512 (F/BW/VL + FMA + F16C): 16 floats or 8 doubles
 * a vector, masked tails. bf16 is rounded with integer ops, or, built with
 * RN_AVX512_BF16 (the kernel set avx512bf16/), with VCVTNEPS2BF16 and a fix-up
 * for the lanes where it differs from the reference (subnormal inputs, which
 * it flushes, and NaN). */
#ifndef RMSNORM_SIMD_AVX512_H
#define RMSNORM_SIMD_AVX512_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define VF_W 16
#define VD_W 8

typedef __m512 vf;
typedef __m512d vd;

static inline __mmask16 m16(size_t n) { return (__mmask16)((1u << n) - 1u); }
static inline __mmask8 m8(size_t n) { return (__mmask8)((1u << n) - 1u); }

/* The arithmetic of a compute type's vector V of scalars S, by the suffix of
 * its intrinsics (ps: float, pd: double): V_zero, V_set1, V_add, V_sub,
 * V_mul, V_fma (a * b + c) and V_fnma (c - a * b), the last two rounded once. */
#define V_ARITH(V, S, sfx)                                                         \
  static inline V V##_zero(void) { return _mm512_setzero_##sfx(); }                \
  static inline V V##_set1(S a) { return _mm512_set1_##sfx(a); }                   \
  static inline V V##_add(V a, V b) { return _mm512_add_##sfx(a, b); }             \
  static inline V V##_sub(V a, V b) { return _mm512_sub_##sfx(a, b); }             \
  static inline V V##_mul(V a, V b) { return _mm512_mul_##sfx(a, b); }             \
  static inline V V##_fma(V a, V b, V c) { return _mm512_fmadd_##sfx(a, b, c); }   \
  static inline V V##_fnma(V a, V b, V c) { return _mm512_fnmadd_##sfx(a, b, c); }

/* ---- float compute ---- */
V_ARITH(vf, float, ps)
static inline vf vf_zero_from(vf v, size_t n) { return _mm512_maskz_mov_ps(m16(n), v); }

/* the two halves of a float vector, widened to double (exact) */
static inline __m512d vf_cvt_lo(vf v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
static inline __m512d vf_cvt_hi(vf v) {
  return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

static inline vf vf_load_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline vf vf_loadn_f32(const float *p, size_t n) { return _mm512_maskz_loadu_ps(m16(n), p); }
static inline void vf_store_f32(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline void vf_storen_f32(float *p, vf v, size_t n) { _mm512_mask_storeu_ps(p, m16(n), v); }
static inline void vf_stream_f32(float *p, vf v) { _mm512_stream_ps(p, v); }

/* A 16-bit storage type's accessors, from its widening to and narrowing from
 * a float vector: load, load of the first n (masked), store, store of the
 * first n, streaming store, and the round trip (the value the stored bits hold). */
#define VF_HALF_ACCESSORS(T, widen, narrow)                                        \
  static inline vf vf_load_##T(const uint16_t *p) {                                \
    return widen(_mm256_loadu_si256((const __m256i *)(const void *)p));            \
  }                                                                                \
  static inline vf vf_loadn_##T(const uint16_t *p, size_t n) {                     \
    return widen(_mm256_maskz_loadu_epi16(m16(n), p));                             \
  }                                                                                \
  static inline void vf_store_##T(uint16_t *p, vf v) {                             \
    _mm256_storeu_si256((__m256i *)(void *)p, narrow(v));                          \
  }                                                                                \
  static inline void vf_storen_##T(uint16_t *p, vf v, size_t n) {                  \
    _mm256_mask_storeu_epi16(p, m16(n), narrow(v));                                \
  }                                                                                \
  static inline void vf_stream_##T(uint16_t *p, vf v) {                            \
    _mm256_stream_si256((__m256i *)(void *)p, narrow(v));                          \
  }                                                                                \
  static inline vf vf_round_##T(vf v) { return widen(narrow(v)); }

static inline __m256i f32_to_f16(vf v) {
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline vf f16_widen(__m256i h) { return _mm512_cvtph_ps(h); }
VF_HALF_ACCESSORS(f16, f16_widen, f32_to_f16)
/* Two vectors, 32 outputs (a's, then b's), in one 64-byte store: half the
 * loop's bookkeeping per output, whole cache lines streamed (p aligned to
 * 64 bytes when streamed). */
#define VF_F16_PAIRS 1
static inline __m512i f32x2_to_f16(vf a, vf b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(f32_to_f16(a)), f32_to_f16(b), 1);
}
static inline void vf_store2_f16(uint16_t *p, vf a, vf b) { _mm512_storeu_si512(p, f32x2_to_f16(a, b)); }
static inline void vf_stream2_f16(uint16_t *p, vf a, vf b) {
  _mm512_stream_si512((void *)p, f32x2_to_f16(a, b));
}

static inline vf bf16_widen(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
/* u + 0x7fff + lsb, the sum whose top 16 bits are u rounded to nearest even
 * on the dropped 16 bits (convert.h): 0x8000 added, less one where the lsb
 * is 0 */
static inline __m512i bf16_rne_sum(vf v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i r = _mm512_add_epi32(u, _mm512_set1_epi32(0x8000));
  return _mm512_mask_sub_epi32(r, _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x10000)), r,
                               _mm512_set1_epi32(1));
}
/* round to nearest even on the dropped 16 bits; NaN keeps its top bits, made
 * quiet: the spec's integer steps (convert.h) */
static inline __m512i f32_to_bf16_int(vf v) {
  __m512i q =
      _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_mov_epi32(_mm512_srli_epi32(bf16_rne_sum(v), 16),
                               _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), q);
}
#if RN_AVX512_BF16
/* VCVTNEPS2BF16 (AVX512_BF16) rounds to nearest even as the spec does, but
 * reads subnormal inputs as zero; NaN lanes are left to the spec's steps
 * too. A vector with such a lane (rare; one VFPCLASSPS, AVX512DQ, finds it)
 * takes the integer path, so the bits are always the spec's. */
static inline __m256i f32_to_bf16(vf v) {
  /* classes: 0x01 quiet NaN, 0x20 subnormal, 0x80 signaling NaN */
  __mmask16 odd = _mm512_fpclass_ps_mask(v, 0x01 | 0x20 | 0x80);
  if (__builtin_expect(!_kortestz_mask16_u8(odd, odd), 0))
    return _mm512_cvtepi32_epi16(f32_to_bf16_int(v));
  return (__m256i)_mm512_cvtneps_pbh(v);
}
/* Two vectors, 32 outputs (a's, then b's) in one conversion; a lane that
 * needs the fix-up in either sends both through f32_to_bf16. */
#define VF_BF16_PAIRS 1
static inline __m512i f32x2_to_bf16(vf a, vf b) {
  __mmask16 odd_a = _mm512_fpclass_ps_mask(a, 0x01 | 0x20 | 0x80);
  __mmask16 odd_b = _mm512_fpclass_ps_mask(b, 0x01 | 0x20 | 0x80);
  if (__builtin_expect(!_kortestz_mask16_u8(odd_a, odd_b), 0))
    return _mm512_inserti64x4(_mm512_castsi256_si512(f32_to_bf16(a)), f32_to_bf16(b), 1);
  return (__m512i)_mm512_cvtne2ps_pbh(b, a);
}
static inline void vf_store2_bf16(uint16_t *p, vf a, vf b) {
  _mm512_storeu_si512(p, f32x2_to_bf16(a, b));
}
/* p aligned to 64 bytes */
static inline void vf_stream2_bf16(uint16_t *p, vf a, vf b) {
  _mm512_stream_si512((void *)p, f32x2_to_bf16(a, b));
}
#else
/* NaN lanes are rare: one compare finds them in one vector or two, and only
 * then do the lanes take f32_to_bf16_int's NaN fix-up (as simd_avx2.h). */
static inline __m512i f32_to_bf16_low(vf v) {
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  if (__builtin_expect(nan != 0, 0)) return f32_to_bf16_int(v);
  return _mm512_srli_epi32(bf16_rne_sum(v), 16);
}
static inline __m256i f32_to_bf16(vf v) { return _mm512_cvtepi32_epi16(f32_to_bf16_low(v)); }
/* Two vectors, 32 outputs (a's, then b's): one NaN test, one pack and one
 * quadword permute for both. */
#define VF_BF16_PAIRS 1
static inline __m512i f32x2_to_bf16(vf a, vf b) {
  __m512i ra, rb;
  if (__builtin_expect(_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) != 0, 0))
    ra = f32_to_bf16_int(a), rb = f32_to_bf16_int(b);
  else
    ra = _mm512_srli_epi32(bf16_rne_sum(a), 16), rb = _mm512_srli_epi32(bf16_rne_sum(b), 16);
  /* packed per 128-bit lane: a0-3 b0-3 | a4-7 b4-7 | ..; quadwords 0 2 4 6 1 3 5 7 */
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                  _mm512_packus_epi32(ra, rb));
}
static inline void vf_store2_bf16(uint16_t *p, vf a, vf b) {
  _mm512_storeu_si512(p, f32x2_to_bf16(a, b));
}
/* p aligned to 64 bytes */
static inline void vf_stream2_bf16(uint16_t *p, vf a, vf b) {
  _mm512_stream_si512((void *)p, f32x2_to_bf16(a, b));
}
/* bf16 32 at a time in even/odd order (VF_BF16_EVEN_ODD, as simd_avx2.h's):
 * a 64-byte load holds values 2i and 2i+1 in 32-bit lane i, the even ones
 * widened by a shift and the odd ones by a mask; 32 rounded outputs go back
 * into those lanes by one word blend. Widening and narrowing take no
 * shuffle (VPMOVZXWD, VPMOVDW: two of them a pair otherwise), and the weight
 * comes reordered (vf_even_odd). */
#define VF_BF16_EVEN_ODD 1
static inline void vf_load_even_odd_bf16(const uint16_t *p, vf *even, vf *odd) {
  __m512i v = _mm512_loadu_si512(p);
  *even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  *odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}
/* the even-indexed and the odd-indexed values of a's then b's 32 */
static inline void vf_even_odd(vf a, vf b, vf *even, vf *odd) {
  const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  *even = _mm512_permutex2var_ps(a, ie, b);
  *odd = _mm512_permutex2var_ps(a, _mm512_add_epi32(ie, _mm512_set1_epi32(1)), b);
}
/* the 32 values of even/odd order rounded to bf16, in order; may_nan 0 when
 * no lane can be NaN (the caller knows), which spares the test */
static inline __m512i f32_even_odd_to_bf16(vf even, vf odd, int may_nan) {
  if (may_nan) {
    __mmask16 nan = _mm512_cmp_ps_mask(even, odd, _CMP_UNORD_Q);
    if (__builtin_expect(nan != 0, 0))
      return _mm512_or_si512(f32_to_bf16_int(even), _mm512_slli_epi32(f32_to_bf16_int(odd), 16));
  }
  /* 16-bit words 0, 2, .. from the even sums' top halves, 1, 3, .. from the odd */
  return _mm512_mask_blend_epi16((__mmask32)0xaaaaaaaau,
                                 _mm512_srli_epi32(bf16_rne_sum(even), 16), bf16_rne_sum(odd));
}
static inline void vf_store_even_odd_bf16(uint16_t *p, vf even, vf odd, int may_nan) {
  _mm512_storeu_si512(p, f32_even_odd_to_bf16(even, odd, may_nan));
}
/* p aligned to 64 bytes */
static inline void vf_stream_even_odd_bf16(uint16_t *p, vf even, vf odd, int may_nan) {
  _mm512_stream_si512((void *)p, f32_even_odd_to_bf16(even, odd, may_nan));
}
#endif
VF_HALF_ACCESSORS(bf16, bf16_widen, f32_to_bf16)

/* ---- double compute ---- */
V_ARITH(vd, double, pd)
static inline vd vd_zero_from(vd v, size_t n) { return _mm512_maskz_mov_pd(m8(n), v); }
/* lanes halved within one vector: lane i += lane i + h, h = 4, 2, 1 */
static inline double vd_halve(vd v) {
  __m256d a = _mm256_add_pd(_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd(v, 1));
  __m128d b = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  return _mm_cvtsd_f64(_mm_add_sd(b, _mm_unpackhi_pd(b, b)));
}
/* vd_halve of VD_W rows at once: lane i of the result is vd_halve(v[i]), by
 * the same additions done across rows (each step adds the halves of two
 * rows' lanes in one vector), then put back in row order. */
static inline vd vd_halve_rows(const vd *v) {
  vd h4[4], h2[2];
  for (int i = 0; i < 4; i++) /* rows 2i, 2i+1: lane j += lane j + 4 */
    h4[i] = _mm512_add_pd(_mm512_shuffle_f64x2(v[2 * i], v[2 * i + 1], 0x44),
                          _mm512_shuffle_f64x2(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 2; i++) /* rows 4i..4i+3: lane j += lane j + 2 */
    h2[i] = _mm512_add_pd(_mm512_shuffle_f64x2(h4[2 * i], h4[2 * i + 1], 0x88),
                          _mm512_shuffle_f64x2(h4[2 * i], h4[2 * i + 1], 0xDD));
  /* lane 0 += lane 1: rows 0, 4, 1, 5, 2, 6, 3, 7 */
  vd s = _mm512_add_pd(_mm512_unpacklo_pd(h2[0], h2[1]), _mm512_unpackhi_pd(h2[0], h2[1]));
  return _mm512_permutexvar_pd(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), s);
}
static inline vd vd_div(vd a, vd b) { return _mm512_div_pd(a, b); }
static inline vd vd_sqrt(vd a) { return _mm512_sqrt_pd(a); }
/* the lanes of v where c > 0, zero elsewhere */
static inline vd vd_where_pos(vd c, vd v) {
  return _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(c, _mm512_setzero_pd(), _CMP_GT_OQ), v);
}
static inline vd vd_load_f64(const double *p) { return _mm512_loadu_pd(p); }
static inline vd vd_loadn_f64(const double *p, size_t n) { return _mm512_maskz_loadu_pd(m8(n), p); }
static inline void vd_store_f64(double *p, vd v) { _mm512_storeu_pd(p, v); }
static inline void vd_storen_f64(double *p, vd v, size_t n) { _mm512_mask_storeu_pd(p, m8(n), v); }
static inline void vd_stream_f64(double *p, vd v) { _mm512_stream_pd(p, v); }

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
/* prefetches per 64-byte vector from DRAM-sized inputs: four a line
 * (store_simd.inc, V_PREFETCH_REPEAT) */
#define V_PREFETCH_REPEAT 4

#endif
