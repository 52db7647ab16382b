/* quant_avx2.h - the vector vocabulary of fused_simd.inc for AVX2, on top of
 * simd_avx2.h: abs/max/divide, and int8 / fp8 e4m3 codes computed with the
 * integer steps of quant.h (so the codes equal the reference's). */
#ifndef RMSNORM_QUANT_AVX2_H
#define RMSNORM_QUANT_AVX2_H

#include <string.h>

#include "simd_avx2.h"

typedef __m256i vi; /* VF_W int32 codes */

static inline vf vf_abs(vf v) {
  return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}
static inline vd vd_abs(vd v) {
  return _mm256_and_pd(v, _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffll)));
}
/* max(a, b), b when a is NaN (vmaxps returns its second source then) */
static inline vf vf_max_keep(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vd vd_max_keep(vd a, vd b) { return _mm256_max_pd(a, b); }
static inline float vf_hmax(vf v) {
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_max_ss(a, _mm_shuffle_ps(a, a, 1)));
}
static inline double vd_hmax(vd v) {
  __m128d a = _mm_max_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_max_sd(a, _mm_unpackhi_pd(a, a)));
}
static inline vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
/* doubles rounded to float, in the low VD_W lanes */
static inline vf vd_to_vf(vd v) {
  return _mm256_insertf128_ps(_mm256_setzero_ps(), _mm256_cvtpd_ps(v), 0);
}

/* int8 codes: NaN -> 0, clamp to [-128, 127], round to nearest even */
static inline vi vf_i8_codes(vf t) {
  t = _mm256_and_ps(t, _mm256_cmp_ps(t, t, _CMP_ORD_Q));
  t = _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));
  return _mm256_cvtps_epi32(t);
}
static inline vi vd_i8_codes(vd t) {
  t = _mm256_and_pd(t, _mm256_cmp_pd(t, t, _CMP_ORD_Q));
  t = _mm256_min_pd(_mm256_max_pd(t, _mm256_set1_pd(-128.0)), _mm256_set1_pd(127.0));
  return _mm256_inserti128_si256(_mm256_setzero_si256(), _mm256_cvtpd_epi32(t), 0);
}

/* e4m3 codes, as rn_e4m3_code, in the steps of quant_avx512.h's (the
 * rounding by a float addition, M formed on the integer bits, a NaN made
 * 0x7f by an unsigned min); checked equal to the former form on all 2^32
 * floats. */
static inline vi e4m3_codes_of(vf t, int sat, int nan) {
  vf a = vf_abs(t);
  if (sat) a = _mm256_min_ps(_mm256_set1_ps(448.0f), a);
  __m256i ea = _mm256_and_si256(_mm256_castps_si256(a), _mm256_set1_epi32(0x7f800000));
  __m256i mb = _mm256_max_epi32(_mm256_add_epi32(ea, _mm256_set1_epi32(20 << 23)),
                                _mm256_set1_epi32(141 << 23));
  __m256i k = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(a, _mm256_castsi256_ps(mb))), mb);
  __m256i c = _mm256_add_epi32(
      k, _mm256_sub_epi32(_mm256_srli_epi32(mb, 20), _mm256_set1_epi32(1128)));
  if (nan) c = _mm256_min_epu32(c, _mm256_set1_epi32(0x7f));
  __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(_mm256_castps_si256(t), 31), 7); /* 0x80 */
  return _mm256_or_si256(c, sign);
}
static inline vi vf_e4m3_codes(vf t) { return e4m3_codes_of(t, 1, 1); }
/* The same for a t free of NaN (the NaN step left out), and for one also
 * within |t| < 464, whose codes round to at most 448 (the 448 clamp left
 * out too): t = y (1/s) for a block's own dynamic scale s = amax / 448. */
static inline vi vf_e4m3_codes_finite(vf t) { return e4m3_codes_of(t, 1, 0); }
static inline vi vf_e4m3_codes_bounded(vf t) { return e4m3_codes_of(t, 0, 0); }
static inline vi vd_e4m3_codes(vd t) { return vf_e4m3_codes(vd_to_vf(t)); }

/* the low byte of each code, in order, in the low 8 bytes: per 128-bit lane
 * its four codes' low bytes to the lane's first dword, then the two dwords
 * together */
static inline __m128i vi_low_bytes(vi c) {
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                        -1, -1, -1, -1);
  __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(c, pick),
                                          _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
  return _mm256_castsi256_si128(b);
}
/* the low byte of the first n codes to p */
static inline void vi_store_bytes(void *p, vi c, size_t n) {
  uint64_t bytes = (uint64_t)_mm_cvtsi128_si64(vi_low_bytes(c));
  memcpy(p, &bytes, n);
}
/* the low byte of the first n codes (n = 8 or 4) to p, non-temporally; p is
 * aligned to n */
static inline void vi_stream_bytes(void *p, vi c, size_t n) {
  __m128i b = vi_low_bytes(c);
  if (n == 8)
    _mm_stream_si64((long long *)p, _mm_cvtsi128_si64(b));
  else
    _mm_stream_si32((int *)p, _mm_cvtsi128_si32(b));
}

/* the low bytes of 2 x n codes (c0's, then c1's) to p, non-temporally; p is
 * aligned to 2n. n = 8 (float codes): packed with saturation, which leaves
 * them as they are (uns: codes in [0, 255], else in [-128, 127]), and
 * stored at once; else as two vi_stream_bytes. */
static inline void vi_stream_bytes2(void *p, vi c0, vi c1, size_t n, int uns) {
  if (n != 8) {
    vi_stream_bytes(p, c0, n);
    vi_stream_bytes((char *)p + n, c1, n);
    return;
  }
  /* per 128-bit lane: words c0[0..3] c1[0..3] | c0[4..7] c1[4..7], then bytes */
  __m256i h = uns ? _mm256_packus_epi32(c0, c1) : _mm256_packs_epi32(c0, c1);
  __m256i b = uns ? _mm256_packus_epi16(h, h) : _mm256_packs_epi16(h, h);
  /* dwords 0, 4, 1, 5: c0[0..3] c0[4..7] c1[0..3] c1[4..7] */
  b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
  _mm_stream_si128((__m128i *)p, _mm256_castsi256_si128(b));
}

/* the low bytes of 4 x VF_W codes (c0's, c1's, c2's, c3's) to p, one
 * 32-byte store (non-temporal when `stream`, p then aligned to 32); packed
 * as in vi_stream_bytes2, per 128-bit lane c0 c1 c2 c3's dwords, then put
 * back in order */
static inline void vi_store_bytes4(void *p, vi c0, vi c1, vi c2, vi c3, int uns, int stream) {
  __m256i h0 = uns ? _mm256_packus_epi32(c0, c1) : _mm256_packs_epi32(c0, c1);
  __m256i h1 = uns ? _mm256_packus_epi32(c2, c3) : _mm256_packs_epi32(c2, c3);
  __m256i b = uns ? _mm256_packus_epi16(h0, h1) : _mm256_packs_epi16(h0, h1);
  b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  if (stream)
    _mm256_stream_si256((__m256i *)p, b);
  else
    _mm256_storeu_si256((__m256i *)p, b);
}

/* ---- the block encoders' extra words (blocks_simd.inc), float only ---- */

/* roundf of each lane, ties away from zero: trunc(t + copysign(0.5 - 2^-25,
 * t)) (the sum rounds a tie up to the next integer and nothing else: equal
 * to roundf on every float below 2^23); t holds no NaN (the block encoders
 * never see one) */
static inline vi vf_round_away_i32(vf t) {
  vf step = _mm256_or_ps(_mm256_and_ps(t, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(0.49999997f));
  return _mm256_cvttps_epi32(_mm256_add_ps(t, step));
}
/* each lane rounded to the nearest integer, ties to even (no NaN, within
 * int32) */
static inline vi vf_cvt_i32(vf t) { return _mm256_cvtps_epi32(t); }
/* bit i set where lane i of a equals lane i of b */
static inline unsigned vf_eq_mask(vf a, vf b) {
  return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ));
}

/* the low bytes of 32 codes (c[0]'s to c[3]'s) to p, one 32-byte store;
 * uns as vi_store_bytes4 */
static inline void vi_store_bytes32(void *p, const vi *c, int uns) {
  vi_store_bytes4(p, c[0], c[1], c[2], c[3], uns, 0);
}


/* ---- words for VF_W blocks at once: one lane per block ---- */

static inline vi vi_zero(void) { return _mm256_setzero_si256(); }
static inline vi vi_set1(int a) { return _mm256_set1_epi32(a); }
static inline vi vi_add(vi a, vi b) { return _mm256_add_epi32(a, b); }
static inline vi vi_sub(vi a, vi b) { return _mm256_sub_epi32(a, b); }
static inline vf vi_to_vf(vi c) { return _mm256_cvtepi32_ps(c); }
static inline vi vf_bits(vf v) { return _mm256_castps_si256(v); }
static inline vf vf_from_bits(vi b) { return _mm256_castsi256_ps(b); }
static inline vf vf_min(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline float vf_hmin(vf v) {
  __m128 a = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_min_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_min_ss(a, _mm_shuffle_ps(a, a, 1)));
}
/* the biased exponent of each lane of a >= 0 (0 for subnormals) */
static inline vi vf_exponent(vf a) { return _mm256_srli_epi32(_mm256_castps_si256(a), 23); }
static inline void vi_store_i32(int32_t *p, vi c) { _mm256_storeu_si256((__m256i *)(void *)p, c); }
/* the VF_W values, narrowed to int16 (they fit), to p */
static inline void vi_store_i16(void *p, vi c) {
  __m256i h = _mm256_permute4x64_epi64(_mm256_packs_epi32(c, c), 0x08); /* qwords 0, 2 */
  _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(h));
}
static inline vi vi_and(vi a, vi b) { return _mm256_and_si256(a, b); }
/* e << 23: a float's exponent field (wrapping, as the integer steps want) */
static inline vi vi_shl23(vi e) { return _mm256_slli_epi32(e, 23); }
/* bit i set where lane i of a > lane i of b (signed) */
static inline unsigned vi_gt_mask(vi a, vi b) {
  return (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b)));
}
/* bit i set where lane i of v is outside [lo, hi] */
static inline unsigned vf_outside_mask(vf v, float lo, float hi) {
  vf in = _mm256_and_ps(_mm256_cmp_ps(v, _mm256_set1_ps(lo), _CMP_GE_OQ),
                        _mm256_cmp_ps(v, _mm256_set1_ps(hi), _CMP_LE_OQ));
  return (unsigned)_mm256_movemask_ps(in) ^ 0xffu;
}

/* One reduction tree for eight vectors (op: max of floats, or sum of int32
 * lanes), lane b of the result holding m[b]'s lanes reduced. Level 1 puts
 * m[2k]'s partial results at even places and m[2k+1]'s at odd ones, level 2
 * four vectors' in each 128-bit half, level 3 joins the halves. `pairs` (2
 * or 4, a constant): the pairs m[2k], m[2k+1] that may be nonzero; the
 * steps on the zero ones are left out (they give zero lanes, the same bits). */
static inline __attribute__((always_inline)) __m256 lanes_tree(const __m256 *m, int add_i32,
                                                             int pairs) {
#define RN_OP(a, b)                                                                  \
  (add_i32 ? _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(a), _mm256_castps_si256(b))) \
           : _mm256_max_ps(a, b))
  __m256 p[4], r[2], z = _mm256_setzero_ps();
  for (int k = 0; k < 4; k++)
    p[k] = k >= pairs ? z
                      : RN_OP(_mm256_unpacklo_ps(m[2 * k], m[2 * k + 1]),
                              _mm256_unpackhi_ps(m[2 * k], m[2 * k + 1]));
  for (int k = 0; k < 2; k++)
    r[k] = 2 * k >= pairs ? z
                          : RN_OP(_mm256_shuffle_ps(p[2 * k], p[2 * k + 1], 0x44),
                                  _mm256_shuffle_ps(p[2 * k], p[2 * k + 1], 0xee));
  return RN_OP(_mm256_permute2f128_ps(r[0], r[1], 0x20), _mm256_permute2f128_ps(r[0], r[1], 0x31));
#undef RN_OP
}
/* The tree over the vectors that may be nonzero: m[b] from nb on are zero. */
static inline __m256 lanes_tree_nb(const __m256 *m, int add_i32, int nb) {
  return nb <= 4 ? lanes_tree(m, add_i32, 2) : lanes_tree(m, add_i32, 4);
}
/* lane b = the max of m[b]'s lanes (no NaN); m[b] from nb on are zero */
static inline vf vf_max_lanes(const vf *m, int nb) { return lanes_tree_nb(m, 0, nb); }
/* lane b = the sum of c[b]'s lanes; c[b] from nb on are zero */
static inline vi vi_sum_lanes(const vi *c, int nb) {
  __m256 m[VF_W];
  for (int b = 0; b < VF_W; b++) m[b] = _mm256_castsi256_ps(c[b]);
  return _mm256_castps_si256(lanes_tree_nb(m, 1, nb));
}


/* MXFP4 (blocks_simd.inc): key_j = ceil((bits(|y_j| / d) - bits(0.5)) /
 * 2^21), the quarter-octave of t = |y_j| / d above 0.5, rounded up (t on a
 * quarter boundary keeps its own). bias = ((4 - ex) << 23) + 2^21 - 1 folds
 * d = 2^(ex - 130) into the integer add (exact for normal y; a subnormal y
 * or an underflowing t gives a key below 1, as t <= 0.5 does, for ex >= 6). */
static inline vi vf_mxfp4_keys(vf y, vi bias) {
  __m256i a = _mm256_and_si256(_mm256_castps_si256(y), _mm256_set1_epi32(0x7fffffff));
  return _mm256_srai_epi32(_mm256_add_epi32(a, bias), 21);
}
/* A block's 16 MXFP4 bytes from its keys (k[0..3]) and y (for the signs).
 * The E2M1 magnitude is the count of midpoints 0.5 1.5 2.5 3.5 5 7 10 below
 * t: their keys are 0 6 9 11 13 15 17, so key 1-6 -> 1, 7-9 -> 2, 10-11 -> 3,
 * 12-13 -> 4, 14-15 -> 5, 16-17 -> 6, 18-20 -> 7 (t < 16), below 1 -> 0 (a tie
 * goes to the smaller, the reference's first minimum). Keys and signs go to
 * bytes through saturating packs, whose order puts element j in byte i of a
 * 128-bit lane and element j + 16 in byte i + 8; a shuffle looks keys 0-15
 * up, another keys 16-20 (a negative key gives 0). A negative y of nonzero
 * magnitude adds 8 (its packed bits are 0x80; a positive y's with a nonzero
 * magnitude 0x7f). */
static inline void vi_store_mxfp4(void *p, const vi *k, const vf *y) {
  const __m256i lo = _mm256_setr_epi8(0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5, 0, 1, 1, 1,
                                      1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5);
  const __m256i hi = _mm256_setr_epi8(6, 6, 7, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6, 6, 7, 7,
                                      7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  __m256i kb = _mm256_packs_epi16(_mm256_packs_epi32(k[0], k[1]), _mm256_packs_epi32(k[2], k[3]));
  __m256i sb = _mm256_packs_epi16(
      _mm256_packs_epi32(_mm256_castps_si256(y[0]), _mm256_castps_si256(y[1])),
      _mm256_packs_epi32(_mm256_castps_si256(y[2]), _mm256_castps_si256(y[3])));
  __m256i mag = _mm256_max_epu8(_mm256_shuffle_epi8(lo, kb),
                                _mm256_shuffle_epi8(hi, _mm256_subs_epi8(kb, _mm256_set1_epi8(16))));
  __m256i neg = _mm256_andnot_si256(sb, _mm256_add_epi8(mag, _mm256_set1_epi8(7))); /* bit 3: 8 */
  __m256i c = _mm256_or_si256(mag, _mm256_and_si256(neg, _mm256_set1_epi8(8)));
  /* byte i | byte i + 8 << 4, then the lanes' low 4-byte groups in order */
  c = _mm256_or_si256(c, _mm256_slli_epi64(_mm256_srli_si256(c, 8), 4));
  c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
  _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(c));
}

#endif
