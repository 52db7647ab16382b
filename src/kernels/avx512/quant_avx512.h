/* quant_avx512.h - the vector vocabulary of fused_simd.inc for AVX-512, on
 * top of simd_avx512.h: abs/max/divide, and int8 / fp8 e4m3 codes computed
 * with the integer steps of quant.h (so the codes equal the reference's). */
#ifndef RMSNORM_QUANT_AVX512_H
#define RMSNORM_QUANT_AVX512_H

#include "simd_avx512.h"

typedef __m512i vi; /* VF_W int32 codes */

static inline vf vf_abs(vf v) { return _mm512_abs_ps(v); }
static inline vd vd_abs(vd v) { return _mm512_abs_pd(v); }
/* max(a, b), b when a is NaN (vmaxps returns its second source then) */
static inline vf vf_max_keep(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vd vd_max_keep(vd a, vd b) { return _mm512_max_pd(a, b); }
static inline float vf_hmax(vf v) { return _mm512_reduce_max_ps(v); }
static inline double vd_hmax(vd v) { return _mm512_reduce_max_pd(v); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
/* doubles rounded to float, in the low VD_W lanes */
static inline vf vd_to_vf(vd v) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_setzero_pd(),
                                             _mm256_castps_pd(_mm512_cvtpd_ps(v)), 0));
}

/* int8 codes: NaN -> 0 (a fix-up of the NaN classes to +0), clamp to
 * [-128, 127], round to nearest even */
static inline vi vf_i8_codes(vf t) {
  t = _mm512_fixupimm_ps(t, t, _mm512_set1_epi32(0x88), 0);
  t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
  return _mm512_cvtps_epi32(t);
}
static inline vi vd_i8_codes(vd t) {
  t = _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(t, t, _CMP_ORD_Q), t);
  t = _mm512_min_pd(_mm512_max_pd(t, _mm512_set1_pd(-128.0)), _mm512_set1_pd(127.0));
  return _mm512_inserti64x4(_mm512_setzero_si512(), _mm512_cvtpd_epi32(t), 0);
}

/* e4m3 codes, as rn_e4m3_code, the rounding done by a float addition: with
 * a = min(|t|, 448) and e its exponent, M = 2^(max(e, -6) + 20) has its last
 * place where e4m3 has its (2^(e-3); 2^-9 below 2^-6), so a + M rounds a to
 * e4m3 to nearest even, and the last bits of a + M count its steps k above M:
 * the code is k + 8 (max(e, -6) + 6) = bits(a + M) - bits(M) + bits(M)/2^20
 * - 1128. M is formed on the integer bits (2^20 x is 20 << 23 more, 2^14 is
 * 141 << 23), which leaves the FP multiplier to the y and t products. A NaN
 * stays NaN through the MINPS (its second operand), and a + M then gives a
 * code far above 0x7f: an unsigned min makes it 0x7f. Checked equal to the
 * former compare-and-select form on all 2^32 floats. */
static inline vi e4m3_codes_of(vf t, int sat, int nan) {
  vf a = _mm512_abs_ps(t);
  if (sat) a = _mm512_min_ps(_mm512_set1_ps(448.0f), a);
  __m512i ea = _mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7f800000));
  __m512i mb = _mm512_max_epi32(_mm512_add_epi32(ea, _mm512_set1_epi32(20 << 23)),
                                _mm512_set1_epi32(141 << 23));
  __m512i k = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(a, _mm512_castsi512_ps(mb))), mb);
  __m512i c = _mm512_add_epi32(
      k, _mm512_sub_epi32(_mm512_srli_epi32(mb, 20), _mm512_set1_epi32(1128)));
  if (nan) c = _mm512_min_epu32(c, _mm512_set1_epi32(0x7f));
  __m512i sign = _mm512_srli_epi32(_mm512_castps_si512(t), 24); /* its 0x80 bit */
  return _mm512_ternarylogic_epi32(c, sign, _mm512_set1_epi32(0x80), 0xf8); /* c | (sign & 0x80) */
}
static inline vi vf_e4m3_codes(vf t) { return e4m3_codes_of(t, 1, 1); }
/* The same for a t free of NaN (the NaN step left out), and for one also
 * within |t| < 464, whose codes round to at most 448 (the 448 clamp left
 * out too): t = y (1/s) for a block's own dynamic scale s = amax / 448. */
static inline vi vf_e4m3_codes_finite(vf t) { return e4m3_codes_of(t, 1, 0); }
static inline vi vf_e4m3_codes_bounded(vf t) { return e4m3_codes_of(t, 0, 0); }
static inline vi vd_e4m3_codes(vd t) { return vf_e4m3_codes(vd_to_vf(t)); }

/* the low byte of the first n codes to p */
static inline void vi_store_bytes(void *p, vi c, size_t n) {
  _mm_mask_storeu_epi8(p, m16(n), _mm512_cvtepi32_epi8(c));
}
/* the low byte of the first n codes (n = 16, 8 or 4) to p, non-temporally;
 * p is aligned to n */
static inline void vi_stream_bytes(void *p, vi c, size_t n) {
  __m128i b = _mm512_cvtepi32_epi8(c);
  if (n == 16)
    _mm_stream_si128((__m128i *)p, b);
  else if (n == 8)
    _mm_stream_si64((long long *)p, _mm_cvtsi128_si64(b));
  else
    _mm_stream_si32((int *)p, _mm_cvtsi128_si32(b));
}

/* the low bytes of 2 x n codes (c0's, then c1's) to p, non-temporally; p is
 * aligned to 2n (uns: the codes are in [0, 255]; unused here) */
static inline void vi_stream_bytes2(void *p, vi c0, vi c1, size_t n, int uns) {
  (void)uns;
  vi_stream_bytes(p, c0, n);
  vi_stream_bytes((char *)p + n, c1, n);
}

/* the low bytes of 4 x VF_W codes (c0's, c1's, c2's, c3's) to p, one
 * 64-byte store (non-temporal when `stream`, p then aligned to 64). The
 * packs saturate, which leaves the codes as they are (uns: codes in [0, 255],
 * else in [-128, 127]); per 128-bit lane they interleave the four vectors'
 * dwords, which the permutation puts back in order. */
static inline void vi_store_bytes4(void *p, vi c0, vi c1, vi c2, vi c3, int uns, int stream) {
  __m512i h0 = uns ? _mm512_packus_epi32(c0, c1) : _mm512_packs_epi32(c0, c1);
  __m512i h1 = uns ? _mm512_packus_epi32(c2, c3) : _mm512_packs_epi32(c2, c3);
  __m512i b = uns ? _mm512_packus_epi16(h0, h1) : _mm512_packs_epi16(h0, h1);
  b = _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), b);
  if (stream)
    _mm512_stream_si512(p, b);
  else
    _mm512_storeu_si512(p, b);
}

/* ---- the block encoders' extra words (blocks_simd.inc), float only ---- */

/* roundf of each lane, ties away from zero: trunc(t + copysign(0.5 - 2^-25,
 * t)) (the sum rounds a tie up to the next integer and nothing else: equal
 * to roundf on every float below 2^23); t holds no NaN (the block encoders
 * never see one) */
static inline vi vf_round_away_i32(vf t) {
  __m512i h = _mm512_castps_si512(_mm512_set1_ps(0.49999997f));
  vf step = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
      h, _mm512_castps_si512(t), _mm512_set1_epi32((int)0x80000000u), 0xf8)); /* h | sign(t) */
  return _mm512_cvttps_epi32(_mm512_add_ps(t, step));
}
/* each lane rounded to the nearest integer, ties to even (no NaN, within
 * int32) */
static inline vi vf_cvt_i32(vf t) { return _mm512_cvtps_epi32(t); }
/* bit i set where lane i of a equals lane i of b */
static inline unsigned vf_eq_mask(vf a, vf b) {
  return (unsigned)_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
}


/* the low bytes of 32 codes (c[0]'s, c[1]'s) to p, one 32-byte store (the
 * packs saturate, which leaves the codes as they are: uns, codes in
 * [0, 255], else in [-128, 127]; per 128-bit lane they interleave the two
 * vectors' dwords, which the permutation puts back in order) */
static inline void vi_store_bytes32(void *p, const vi *c, int uns) {
  __m512i h = uns ? _mm512_packus_epi32(c[0], c[1]) : _mm512_packs_epi32(c[0], c[1]);
  __m512i b = uns ? _mm512_packus_epi16(h, h) : _mm512_packs_epi16(h, h);
  b = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), b);
  _mm256_storeu_si256((__m256i *)p, _mm512_castsi512_si256(b));
}

/* ---- words for VF_W blocks at once: one lane per block ---- */

static inline vi vi_zero(void) { return _mm512_setzero_si512(); }
static inline vi vi_set1(int a) { return _mm512_set1_epi32(a); }
static inline vi vi_add(vi a, vi b) { return _mm512_add_epi32(a, b); }
static inline vi vi_sub(vi a, vi b) { return _mm512_sub_epi32(a, b); }
static inline vf vi_to_vf(vi c) { return _mm512_cvtepi32_ps(c); }
static inline vi vf_bits(vf v) { return _mm512_castps_si512(v); }
static inline vf vf_from_bits(vi b) { return _mm512_castsi512_ps(b); }
static inline vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline float vf_hmin(vf v) { return _mm512_reduce_min_ps(v); }
/* the biased exponent of each lane of a >= 0 (0 for subnormals) */
static inline vi vf_exponent(vf a) { return _mm512_srli_epi32(_mm512_castps_si512(a), 23); }
static inline void vi_store_i32(int32_t *p, vi c) { _mm512_storeu_si512(p, c); }
/* the VF_W values, narrowed to int16 (they fit), to p */
static inline void vi_store_i16(void *p, vi c) {
  _mm256_storeu_si256((__m256i *)p, _mm512_cvtsepi32_epi16(c));
}
static inline vi vi_and(vi a, vi b) { return _mm512_and_si512(a, b); }
/* e << 23: a float's exponent field (wrapping, as the integer steps want) */
static inline vi vi_shl23(vi e) { return _mm512_slli_epi32(e, 23); }
/* bit i set where lane i of a > lane i of b (signed) */
static inline unsigned vi_gt_mask(vi a, vi b) { return (unsigned)_mm512_cmpgt_epi32_mask(a, b); }
/* bit i set where lane i of v is outside [lo, hi] */
static inline unsigned vf_outside_mask(vf v, float lo, float hi) {
  return (unsigned)(__mmask16) ~(_mm512_cmp_ps_mask(v, _mm512_set1_ps(lo), _CMP_GE_OQ) &
                                 _mm512_cmp_ps_mask(v, _mm512_set1_ps(hi), _CMP_LE_OQ));
}

/* One reduction tree for sixteen vectors (op: max of floats, or sum of int32
 * lanes), lane b of the result holding m[b]'s lanes reduced. Level 1 puts
 * m[2k]'s partial results at even places and m[2k+1]'s at odd ones, level 2
 * four vectors' in each 128-bit quarter, level 3 eight vectors' in each
 * half (quarters 0-1, 2-3), level 4 joins the quarters. `pairs` (2, 4 or 8,
 * a constant): the pairs m[2k], m[2k+1] that may be nonzero; the steps on
 * the zero ones are left out (they give zero lanes, the same bits). */
static inline __attribute__((always_inline)) __m512 lanes_tree(const __m512 *m, int add_i32,
                                                             int pairs) {
#define RN_OP(a, b)                                                                  \
  (add_i32 ? _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b))) \
           : _mm512_max_ps(a, b))
  __m512 p[8], r[4], t[2], z = _mm512_setzero_ps();
  for (int k = 0; k < 8; k++)
    p[k] = k >= pairs ? z
                      : RN_OP(_mm512_unpacklo_ps(m[2 * k], m[2 * k + 1]),
                              _mm512_unpackhi_ps(m[2 * k], m[2 * k + 1]));
  for (int k = 0; k < 4; k++)
    r[k] = 2 * k >= pairs ? z
                          : RN_OP(_mm512_shuffle_ps(p[2 * k], p[2 * k + 1], 0x44),
                                  _mm512_shuffle_ps(p[2 * k], p[2 * k + 1], 0xee));
  for (int k = 0; k < 2; k++) /* quarters 0, 2 of each, then 1, 3 */
    t[k] = 4 * k >= pairs ? z
                          : RN_OP(_mm512_shuffle_f32x4(r[2 * k], r[2 * k + 1], 0x88),
                                  _mm512_shuffle_f32x4(r[2 * k], r[2 * k + 1], 0xdd));
  return RN_OP(_mm512_shuffle_f32x4(t[0], t[1], 0x88), _mm512_shuffle_f32x4(t[0], t[1], 0xdd));
#undef RN_OP
}
/* The tree over the vectors that may be nonzero: m[b] from nb on are zero
 * (a row of 128 has 4 blocks: a quarter of the full tree's steps). */
static inline __m512 lanes_tree_nb(const __m512 *m, int add_i32, int nb) {
  if (nb <= 4) return lanes_tree(m, add_i32, 2);
  if (nb <= 8) return lanes_tree(m, add_i32, 4);
  return lanes_tree(m, add_i32, 8);
}
/* lane b = the max of m[b]'s lanes (no NaN); m[b] from nb on are zero */
static inline vf vf_max_lanes(const vf *m, int nb) { return lanes_tree_nb(m, 0, nb); }
/* lane b = the sum of c[b]'s lanes; c[b] from nb on are zero */
static inline vi vi_sum_lanes(const vi *c, int nb) {
  __m512 m[VF_W];
  for (int b = 0; b < VF_W; b++) m[b] = _mm512_castsi512_ps(c[b]);
  return _mm512_castps_si512(lanes_tree_nb(m, 1, nb));
}


/* MXFP4 (blocks_simd.inc): the keys of quant_avx2.h's vf_mxfp4_keys */
static inline vi vf_mxfp4_keys(vf y, vi bias) {
  __m512i a = _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32(0x7fffffff));
  return _mm512_srai_epi32(_mm512_add_epi32(a, bias), 21);
}
/* A block's 16 MXFP4 bytes from its keys (k[0], k[1]) and y, as
 * quant_avx2.h's vi_store_mxfp4; here the packs put element j in byte i of a
 * 128-bit lane and element j + 16 in byte i + 4. */
static inline void vi_store_mxfp4(void *p, const vi *k, const vf *y) {
  const __m512i lo = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5));
  const __m512i hi = _mm512_broadcast_i32x4(_mm_setr_epi8(6, 6, 7, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  __m512i kh = _mm512_packs_epi32(k[0], k[1]);
  __m512i kb = _mm512_packs_epi16(kh, kh);
  __m512i sh = _mm512_packs_epi32(_mm512_castps_si512(y[0]), _mm512_castps_si512(y[1]));
  __m512i sb = _mm512_packs_epi16(sh, sh);
  __m512i mag = _mm512_max_epu8(_mm512_shuffle_epi8(lo, kb),
                                _mm512_shuffle_epi8(hi, _mm512_subs_epi8(kb, _mm512_set1_epi8(16))));
  __m512i neg = _mm512_andnot_si512(sb, _mm512_add_epi8(mag, _mm512_set1_epi8(7))); /* bit 3: 8 */
  __m512i c = _mm512_ternarylogic_epi32(mag, neg, _mm512_set1_epi8(8), 0xf8); /* mag | (neg & 8) */
  c = _mm512_or_si512(c, _mm512_srli_epi64(c, 28)); /* byte i | byte i + 4 << 4 (nibbles < 16) */
  c = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), c);
  _mm_storeu_si128((__m128i *)p, _mm512_castsi512_si128(c));
}

#endif
