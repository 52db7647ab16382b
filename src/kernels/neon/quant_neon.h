/* quant_neon.h - the vector vocabulary of fused_simd.inc for AArch64 NEON,
 * on top of simd_neon.h: abs/max/divide, and int8 / fp8 e4m3 codes computed
 * with the integer steps of quant.h (so the codes equal the reference's).
 * Where x86's MAXPS/MINPS and NEON's FMAX/FMIN differ (NaN, signed zeros),
 * the x86 meaning is built from a compare and a select. */
#ifndef RMSNORM_QUANT_NEON_H
#define RMSNORM_QUANT_NEON_H

#include <string.h>

#include "simd_neon.h"

typedef int32x4_t vi; /* VF_W int32 codes */

static inline vf vf_abs(vf v) { return vabsq_f32(v); }
static inline vd vd_abs(vd v) { return vabsq_f64(v); }
/* max(a, b) = a > b ? a : b: b when a is NaN, as x86's MAXPS */
static inline vf vf_max_keep(vf a, vf b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
static inline vd vd_max_keep(vd a, vd b) { return vbslq_f64(vcgtq_f64(a, b), a, b); }
/* the accumulated max |y| holds no NaN (vf_max_keep keeps the old value), so
 * the order of the lane reduction does not matter */
static inline float vf_hmax(vf v) { return vmaxvq_f32(v); }
static inline double vd_hmax(vd v) { return vmaxvq_f64(v); }
static inline vf vf_div(vf a, vf b) { return vdivq_f32(a, b); }
/* doubles rounded to float, in the low VD_W lanes */
static inline vf vd_to_vf(vd v) { return vcombine_f32(vcvt_f32_f64(v), vdup_n_f32(0.0f)); }

/* int8 codes: NaN -> 0, clamp to [-128, 127], round to nearest even */
static inline vi vf_i8_codes(vf t) {
  t = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(t), vceqq_f32(t, t)));
  t = vminq_f32(vmaxq_f32(t, vdupq_n_f32(-128.0f)), vdupq_n_f32(127.0f));
  return vcvtnq_s32_f32(t);
}
static inline vi vd_i8_codes(vd t) {
  t = vreinterpretq_f64_u64(vandq_u64(vreinterpretq_u64_f64(t), vceqq_f64(t, t)));
  t = vminq_f64(vmaxq_f64(t, vdupq_n_f64(-128.0)), vdupq_n_f64(127.0));
  return vcombine_s32(vmovn_s64(vcvtnq_s64_f64(t)), vdup_n_s32(0));
}

/* e4m3 codes, as rn_e4m3_code */
static inline vi e4m3_codes_of(vf t, int sat, int nan) {
  uint32x4_t u = vreinterpretq_u32_f32(t);
  uint32x4_t sign = vandq_u32(vshrq_n_u32(u, 24), vdupq_n_u32(0x80));
  vf big = vdupq_n_f32(448.0f), at = vabsq_f32(t);
  vf a = sat ? vbslq_f32(vcltq_f32(at, big), at, big) : at; /* x86 MINPS: 448 for NaN */
  uint32x4_t m = vsubq_u32(vreinterpretq_u32_f32(a), vdupq_n_u32(120u << 23));
  m = vaddq_u32(m, vaddq_u32(vdupq_n_u32(0x7ffff), vandq_u32(vshrq_n_u32(m, 20), vdupq_n_u32(1))));
  uint32x4_t c = vshrq_n_u32(m, 20);
  uint32x4_t sub = vcltq_f32(a, vdupq_n_f32(0x1p-6f));
  c = vbslq_u32(sub, vreinterpretq_u32_s32(vcvtnq_s32_f32(vmulq_f32(a, vdupq_n_f32(512.0f)))), c);
  if (nan) c = vbslq_u32(vmvnq_u32(vceqq_f32(t, t)), vdupq_n_u32(0x7f), c);
  return vreinterpretq_s32_u32(vorrq_u32(c, sign));
}
static inline vi vf_e4m3_codes(vf t) { return e4m3_codes_of(t, 1, 1); }
/* The same for a t free of NaN (the NaN step left out), and for one also
 * within |t| < 464, whose codes round to at most 448 (the 448 clamp left
 * out too): t = y (1/s) for a block's own dynamic scale s = amax / 448. */
static inline vi vf_e4m3_codes_finite(vf t) { return e4m3_codes_of(t, 1, 0); }
static inline vi vf_e4m3_codes_bounded(vf t) { return e4m3_codes_of(t, 0, 0); }
static inline vi vd_e4m3_codes(vd t) { return vf_e4m3_codes(vd_to_vf(t)); }

/* the low bytes of the four codes, in the low 32 bits */
static inline uint32_t vi_low_bytes(vi c) {
  uint8x8_t b = vmovn_u16(vcombine_u16(vmovn_u32(vreinterpretq_u32_s32(c)), vdup_n_u16(0)));
  return vget_lane_u32(vreinterpret_u32_u8(b), 0);
}
/* the low byte of the first n codes to p */
static inline void vi_store_bytes(void *p, vi c, size_t n) {
  uint32_t bytes = vi_low_bytes(c);
  memcpy(p, &bytes, n);
}
/* the low byte of the four codes to p (n = 4), aligned to 4: a plain store */
static inline void vi_stream_bytes(void *p, vi c, size_t n) {
  uint32_t bytes = vi_low_bytes(c);
  memcpy(p, &bytes, n);
}

/* the low bytes of 2 x n codes (c0's, then c1's) to p, non-temporally; p is
 * aligned to 2n (uns: the codes are in [0, 255]; unused here) */
static inline void vi_stream_bytes2(void *p, vi c0, vi c1, size_t n, int uns) {
  (void)uns;
  vi_stream_bytes(p, c0, n);
  vi_stream_bytes((char *)p + n, c1, n);
}

/* the low bytes of 4 x 4 codes (c0's, c1's, c2's, c3's) to p, one 16-byte
 * store (uns and stream: unused here; narrowing keeps the low byte) */
static inline void vi_store_bytes4(void *p, vi c0, vi c1, vi c2, vi c3, int uns, int stream) {
  (void)uns, (void)stream;
  uint16x8_t h0 = vcombine_u16(vmovn_u32(vreinterpretq_u32_s32(c0)),
                               vmovn_u32(vreinterpretq_u32_s32(c1)));
  uint16x8_t h1 = vcombine_u16(vmovn_u32(vreinterpretq_u32_s32(c2)),
                               vmovn_u32(vreinterpretq_u32_s32(c3)));
  vst1q_u8((uint8_t *)p, vcombine_u8(vmovn_u16(h0), vmovn_u16(h1)));
}

/* ---- the block encoders' extra words (blocks_simd.inc), float only ---- */

/* roundf of each lane: FCVTAS rounds ties away from zero; NaN -> 0 */
static inline vi vf_round_away_i32(vf t) { return vcvtaq_s32_f32(t); }
/* each lane rounded to the nearest integer, ties to even (no NaN, within
 * int32) */
static inline vi vf_cvt_i32(vf t) { return vcvtnq_s32_f32(t); }
/* bit i set where lane i of a equals lane i of b */
static inline unsigned vf_eq_mask(vf a, vf b) {
  const uint32_t bits[4] = {1, 2, 4, 8};
  return vaddvq_u32(vandq_u32(vceqq_f32(a, b), vld1q_u32(bits)));
}


/* the low bytes of 32 codes (c[0]'s to c[7]'s) to p, two 16-byte stores */
static inline void vi_store_bytes32(void *p, const vi *c, int uns) {
  vi_store_bytes4(p, c[0], c[1], c[2], c[3], uns, 0);
  vi_store_bytes4((char *)p + 16, c[4], c[5], c[6], c[7], uns, 0);
}

/* ---- words for VF_W blocks at once: one lane per block ---- */

static inline vi vi_zero(void) { return vdupq_n_s32(0); }
static inline vi vi_set1(int a) { return vdupq_n_s32(a); }
static inline vi vi_add(vi a, vi b) { return vaddq_s32(a, b); }
static inline vi vi_sub(vi a, vi b) { return vsubq_s32(a, b); }
static inline vf vi_to_vf(vi c) { return vcvtq_f32_s32(c); }
static inline vi vf_bits(vf v) { return vreinterpretq_s32_f32(v); }
static inline vf vf_from_bits(vi b) { return vreinterpretq_f32_s32(b); }
static inline vf vf_min(vf a, vf b) { return vminq_f32(a, b); }
static inline float vf_hmin(vf v) { return vminvq_f32(v); }
/* the biased exponent of each lane of a >= 0 (0 for subnormals) */
static inline vi vf_exponent(vf a) {
  return vreinterpretq_s32_u32(vshrq_n_u32(vreinterpretq_u32_f32(a), 23));
}
static inline void vi_store_i32(int32_t *p, vi c) { vst1q_s32(p, c); }
/* the VF_W values, narrowed to int16 (they fit), to p */
static inline void vi_store_i16(void *p, vi c) { vst1_s16((int16_t *)p, vmovn_s32(c)); }
static inline vi vi_and(vi a, vi b) { return vandq_s32(a, b); }
/* e << 23: a float's exponent field (wrapping, as the integer steps want) */
static inline vi vi_shl23(vi e) {
  return vreinterpretq_s32_u32(vshlq_n_u32(vreinterpretq_u32_s32(e), 23));
}
/* bit i set where lane i of a > lane i of b (signed) */
static inline unsigned vi_gt_mask(vi a, vi b) {
  const uint32_t bits[4] = {1, 2, 4, 8};
  return vaddvq_u32(vandq_u32(vcgtq_s32(a, b), vld1q_u32(bits)));
}
/* bit i set where lane i of v is outside [lo, hi] */
static inline unsigned vf_outside_mask(vf v, float lo, float hi) {
  const uint32_t bits[4] = {1, 2, 4, 8};
  uint32x4_t in = vandq_u32(vcgeq_f32(v, vdupq_n_f32(lo)), vcleq_f32(v, vdupq_n_f32(hi)));
  return vaddvq_u32(vbicq_u32(vld1q_u32(bits), in));
}
/* lane b = the max of m[b]'s lanes (no NaN): two pairwise steps (m[b] from
 * nb on are zero: four vectors leave nothing to skip) */
static inline vf vf_max_lanes(const vf *m, int nb) {
  (void)nb;
  return vpmaxq_f32(vpmaxq_f32(m[0], m[1]), vpmaxq_f32(m[2], m[3]));
}
/* lane b = the sum of c[b]'s lanes (c[b] from nb on are zero) */
static inline vi vi_sum_lanes(const vi *c, int nb) {
  (void)nb;
  return vpaddq_s32(vpaddq_s32(c[0], c[1]), vpaddq_s32(c[2], c[3]));
}


/* MXFP4 (blocks_simd.inc): the keys of quant_avx2.h's vf_mxfp4_keys */
static inline vi vf_mxfp4_keys(vf y, vi bias) {
  int32x4_t a = vreinterpretq_s32_u32(vandq_u32(vreinterpretq_u32_f32(y), vdupq_n_u32(0x7fffffff)));
  return vshrq_n_s32(vaddq_s32(a, bias), 21);
}
/* A block's 16 MXFP4 bytes from its keys (k[0..7]) and y, as quant_avx2.h's
 * vi_store_mxfp4: keys narrowed with saturation, looked up in one 32-entry
 * table (a negative key, 128 and up as a byte, gives 0). */
static inline void vi_store_mxfp4(void *p, const vi *k, const vf *y) {
  static const uint8_t table[32] = {0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 7};
  uint8x16x2_t t = {{vld1q_u8(table), vld1q_u8(table + 16)}};
  uint8x16_t c[2];
  for (int h = 0; h < 2; h++) { /* elements 16h .. 16h + 15 */
    const vi *kh = k + 4 * h;
    const vf *yh = y + 4 * h;
    int8x16_t kb = vcombine_s8(vqmovn_s16(vcombine_s16(vqmovn_s32(kh[0]), vqmovn_s32(kh[1]))),
                               vqmovn_s16(vcombine_s16(vqmovn_s32(kh[2]), vqmovn_s32(kh[3]))));
    uint8x16_t mag = vqtbl2q_u8(t, vreinterpretq_u8_s8(kb));
    uint32x4_t n0 = vcltq_f32(yh[0], vdupq_n_f32(0.0f)), n1 = vcltq_f32(yh[1], vdupq_n_f32(0.0f));
    uint32x4_t n2 = vcltq_f32(yh[2], vdupq_n_f32(0.0f)), n3 = vcltq_f32(yh[3], vdupq_n_f32(0.0f));
    uint8x16_t neg = vcombine_u8(vmovn_u16(vcombine_u16(vmovn_u32(n0), vmovn_u32(n1))),
                                 vmovn_u16(vcombine_u16(vmovn_u32(n2), vmovn_u32(n3))));
    /* 8 where y < 0 and the magnitude is nonzero */
    c[h] = vorrq_u8(mag, vandq_u8(vandq_u8(neg, vtstq_u8(mag, mag)), vdupq_n_u8(8)));
  }
  vst1q_u8((uint8_t *)p, vorrq_u8(c[0], vshlq_n_u8(c[1], 4)));
}

#endif
