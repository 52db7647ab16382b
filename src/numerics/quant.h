/* quant.h - 8-bit output codes in portable C: int8 and fp8 e4m3 (the OCP
 * "E4M3FN" variant: bias 7, 3 mantissa bits, max 448, no infinities, NaN =
 * S.1111.111). Round to nearest even, saturate. The SIMD vocabularies
 * (kernels/<isa>/quant_<isa>.h) do the same integer steps, so they give the
 * same codes. */
#ifndef RMSNORM_QUANT_H
#define RMSNORM_QUANT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "numerics/convert.h"

#define RN_INT8_QMAX 127.0
#define RN_E4M3_MAX 448.0

/* How the quantizers get t_j from y_j and the row's scale s (docs/fusions.md,
 * "Quantized output"): RN_QT_MUL, t_j = y_j * inv with inv = 1/s rounded to
 * the compute type once per row, when 2^-126 <= s <= 2^126 (so that inv is a
 * normal float); RN_QT_DIV, t_j = y_j / s, for the other s > 0 (a subnormal
 * s, whose 1/s would overflow float, or one above 2^126, whose 1/s would be
 * subnormal); RN_QT_ZERO, t_j = 0, when s = 0 (an all-zero row) or NaN (a
 * row holding a NaN: its codes are 0, and s dequantizes them to NaN). */
enum { RN_QT_ZERO = 0, RN_QT_MUL = 1, RN_QT_DIV = 2 };
static inline int rn_quant_t_mode(float s) {
  if (!(s > 0)) return RN_QT_ZERO;
  return s >= 0x1p-126f && s <= 0x1p126f ? RN_QT_MUL : RN_QT_DIV;
}

/* The smallest power of two >= s (UE8M0 scales; 0, a power of two and inf
 * stay). */
static inline float rn_pow2_up(float s) {
  if (!(s > 0.0f) || isinf(s)) return s;
  int e;
  float m = frexpf(s, &e); /* s = m 2^e, m in [0.5, 1) */
  return m == 0.5f ? s : ldexpf(1.0f, e);
}

/* A dynamic scale under RMSNORM_QUANT_SCALE_POW2: rn_pow2_up kept in
 * UE8M0's range [2^-127, 2^127], so that its exponent byte is the scale.
 * Below it (0 too: an all-zero row or group, whose t = y / s are then all
 * zero) 2^-127, as MXFP8's smallest block scale; above it (only a double
 * row's finite s above 2^127) 2^127. NaN and inf stay (E8M0 0xFF). */
static inline float rn_ue8m0_scale(float s) {
  if (s != s || isinf(s)) return s;
  if (!(s > 0x1p-127f)) return 0x1p-127f;
  return s > 0x1p127f ? 0x1p127f : rn_pow2_up(s);
}

/* The E8M0 byte of a scale rn_ue8m0_scale gave: e with s = 2^(e - 127), e
 * in 0..254 (2^-127 is the float subnormal whose exponent field is 0), 0xFF
 * for NaN and inf. */
static inline uint8_t rn_e8m0_byte(float s) {
  if (s != s || isinf(s)) return 0xFF;
  return s == 0x1p-127f ? 0 : (uint8_t)(rn_f32_bits(s) >> 23);
}

/* The value of an E8M0 byte: 2^(e - 127), NaN for 0xFF. */
static inline float rn_e8m0_value(uint8_t e) {
  if (e == 0xFF) return NAN;
  return e == 0 ? 0x1p-127f : rn_bits_f32((uint32_t)e << 23);
}

/* Bytes of one stored scale: a float, or an E8M0 byte. */
static inline size_t rn_scale_bytes(int e8m0) { return e8m0 ? 1 : sizeof(float); }

/* A row's or group's scale into scales[at]: the float, or (e8m0) its byte. */
static inline void rn_store_scale(void *scales, size_t at, float s, int e8m0) {
  if (e8m0)
    ((unsigned char *)scales)[at] = rn_e8m0_byte(s);
  else
    memcpy((char *)scales + at * sizeof s, &s, sizeof s); /* any alignment */
}

/* int8 code of t (float compute): NaN -> 0, clamp to [-128, 127], round to
 * nearest even. */
static inline int8_t rn_i8_code_f32(float t) {
  if (isnan(t)) return 0;
  t = t < -128.0f ? -128.0f : t > 127.0f ? 127.0f : t;
  return (int8_t)nearbyintf(t);
}

/* The same in double (fp64 data): no intermediate rounding to float. */
static inline int8_t rn_i8_code_f64(double t) {
  if (isnan(t)) return 0;
  t = t < -128.0 ? -128.0 : t > 127.0 ? 127.0 : t;
  return (int8_t)nearbyint(t);
}

/* e4m3 code of t: NaN -> S.1111.111 keeping t's sign; |t| clamped to 448
 * (infinities too); below 2^-6 the subnormal code is |t| * 2^9 rounded to
 * nearest even (8 is the smallest normal, 0x08); above, the fp32 bits are
 * rebiased (127 -> 7) and the 20 dropped mantissa bits rounded to nearest
 * even, a carry stepping into the exponent. */
static inline uint8_t rn_e4m3_code(float t) {
  uint32_t u = rn_f32_bits(t);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  if (isnan(t)) return (uint8_t)(sign | 0x7fu);
  float a = fabsf(t);
  if (a > 448.0f) a = 448.0f;
  if (a < 0x1p-6f) return (uint8_t)(sign | (uint8_t)nearbyintf(a * 512.0f));
  uint32_t m = rn_f32_bits(a) - (120u << 23);
  m += 0x7ffffu + ((m >> 20) & 1u);
  return (uint8_t)(sign | (m >> 20));
}

/* The value of an e4m3 code (exact in float); NaN for S.1111.111. */
static inline float rn_e4m3_value(uint8_t c) {
  int e = (c >> 3) & 15, m = c & 7;
  float v;
  if (e == 15 && m == 7) return NAN;
  v = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m, -9);
  return (c & 0x80) ? -v : v;
}

#endif
