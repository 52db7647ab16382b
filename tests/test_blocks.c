/* test_blocks.c - the block and per-group encoders of src/ref/blocks_ref.c
 * on hand-checked cases: rounding ties (Q8_0 and Q8_1 away from zero, Q8_K
 * to even), Q8_1's sum, zero blocks, MXFP4's scale just below a power of
 * two, MXFP8 saturation, subnormal scales, power-of-two scales kept in
 * UE8M0's range and their E8M0 bytes, NaN and Inf. Bytes against the oracles:
 * tests/blocks/check_blocks_oracle.py. */
#include "check.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "numerics/blocks.h"
#include "numerics/convert.h"
#include "numerics/quant.h"

static float rd_f32(const unsigned char *p) { float f; memcpy(&f, p, 4); return f; }
static int16_t rd_i16(const unsigned char *p) { int16_t v; memcpy(&v, p, 2); return v; }
static uint16_t rd_u16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static int8_t q8(const unsigned char *p, size_t j) { return (int8_t)p[j]; }

static void test_q8_0(void) {
  float y[64] = {0};
  unsigned char o[2 * RN_Q8_0_BYTES];
  /* amax 127: d = 1 exactly, the codes are roundf(y): ties away from zero */
  y[0] = 127.0f, y[1] = 2.5f, y[2] = -2.5f, y[3] = 0.5f, y[4] = -0.5f, y[5] = 3.5f, y[6] = 1.49f;
  /* second block all zero */
  memset(o, 0xAA, sizeof o);
  rn_ref_q8_0(y, 64, o);
  tu_check(rd_u16(o) == 0x3c00, "q8_0 d %04x", rd_u16(o));
  const int8_t want[7] = {127, 3, -3, 1, -1, 4, 1};
  for (int j = 0; j < 7; j++) tu_check(q8(o, 2 + j) == want[j], "q8_0 q[%d] %d want %d", j, q8(o, 2 + j), want[j]);
  for (int j = 0; j < RN_Q8_0_BYTES; j++) tu_check(o[RN_Q8_0_BYTES + j] == 0, "q8_0 zero block byte %d", j);
  /* an fp16-subnormal d: amax = 127 * 2^-20 -> d = 2^-20 = 16 * 2^-24 */
  memset(y, 0, sizeof y);
  y[0] = -127.0f * 0x1p-20f, y[1] = 0x1p-21f;
  rn_ref_q8_0(y, 32, o);
  tu_check(rd_u16(o) == 0x0010, "q8_0 subnormal d %04x", rd_u16(o));
  tu_check(q8(o, 2) == -127 && q8(o, 3) == 1, "q8_0 subnormal d codes %d %d", q8(o, 2), q8(o, 3));
  /* an fp32-subnormal d whose 1/d overflows (fp16 d 0): q = 0, what ggml on
   * x86 and gguf-py write */
  y[0] = 1e-39f, y[1] = -1e-39f, y[2] = 0.7e-39f;
  rn_ref_q8_0(y, 32, o);
  tu_check(rd_u16(o) == 0, "q8_0 tiny d %04x", rd_u16(o));
  for (int j = 0; j < 32; j++) tu_check(q8(o, 2 + j) == 0, "q8_0 tiny q[%d] %d", j, q8(o, 2 + j));
  /* a NaN makes d NaN (0x7e00) and every q 0; an Inf gives d = inf and q = 0 */
  memset(y, 0, sizeof y);
  y[0] = -NAN, y[1] = 127.0f, y[2] = -1.0f;
  rn_ref_q8_0(y, 32, o);
  tu_check(rd_u16(o) == 0x7e00, "q8_0 NaN d %04x", rd_u16(o));
  for (int j = 0; j < 32; j++) tu_check(o[2 + j] == 0, "q8_0 NaN q[%d]", j);
  y[0] = 0, y[5] = -INFINITY;
  rn_ref_q8_0(y, 32, o);
  tu_check(rd_u16(o) == 0x7c00, "q8_0 inf d %04x", rd_u16(o));
  for (int j = 0; j < 32; j++) tu_check(o[2 + j] == 0, "q8_0 inf q[%d]", j);
}

static void test_q8_1(void) {
  float y[64] = {0};
  unsigned char o[2 * RN_Q8_1_BYTES], o0[2 * RN_Q8_0_BYTES];
  /* amax 127: d = 1, q = roundf(y) (ties away), s = sum(q) * 1 */
  y[0] = 127.0f, y[1] = 2.5f, y[2] = -2.5f, y[3] = 0.5f, y[4] = -0.5f, y[5] = 3.5f, y[6] = 1.49f;
  y[31] = -100.0f;
  memset(o, 0xAA, sizeof o);
  rn_ref_q8_1(y, 64, o);
  tu_check(rd_u16(o) == 0x3c00, "q8_1 d %04x", rd_u16(o));
  /* 127 + 3 - 3 + 1 - 1 + 4 + 1 - 100 = 32: fp16 0x5000 */
  tu_check(rd_u16(o + 2) == 0x5000, "q8_1 s %04x", rd_u16(o + 2));
  const int8_t want[7] = {127, 3, -3, 1, -1, 4, 1};
  for (int j = 0; j < 7; j++) tu_check(q8(o, 4 + j) == want[j], "q8_1 q[%d] %d want %d", j, q8(o, 4 + j), want[j]);
  tu_check(q8(o, 4 + 31) == -100, "q8_1 q[31]");
  for (int j = 0; j < RN_Q8_1_BYTES; j++) tu_check(o[RN_Q8_1_BYTES + j] == 0, "q8_1 zero block byte %d", j);
  /* d and the codes are Q8_0's */
  rn_ref_q8_0(y, 64, o0);
  tu_check(!memcmp(o, o0, 2) && !memcmp(o + 4, o0 + 2, 32), "q8_1 d and qs as q8_0's");
  /* s = sum * the fp32 d, rounded to fp32 then fp16, not the fp16 d: 32
   * values of 31.765625 give q = 127 each, sum 4064, s = fp16(4064 * d) =
   * 0x63f1 (1016.5), where the stored d would give 0x63f2 */
  for (int j = 0; j < 32; j++) y[j] = 31.765625f;
  rn_ref_q8_1(y, 32, o);
  float d = 31.765625f / 127.0f;
  int all127 = 1;
  for (int j = 0; j < 32; j++) all127 &= q8(o, 4 + j) == 127;
  tu_check(all127 && rd_u16(o) == rn_f32_to_f16(d) && rd_u16(o + 2) == 0x63f1 &&
           rn_f32_to_f16(4064.0f * rn_f16_to_f32(rd_u16(o))) == 0x63f2,
           "q8_1 s of the fp32 d %04x", rd_u16(o + 2));
  /* a sum that fp16 rounds: d = 3/127, the codes -127 and round(j/16 * 127/3) */
  y[0] = -3.0f;
  for (int j = 1; j < 32; j++) y[j] = (float)j / 16.0f;
  rn_ref_q8_1(y, 32, o);
  int sum = 0;
  for (int j = 0; j < 32; j++) sum += q8(o, 4 + j);
  d = 3.0f / 127.0f;
  tu_check(rd_u16(o + 2) == rn_f32_to_f16((float)sum * d), "q8_1 s %04x sum %d", rd_u16(o + 2), sum);
  /* an fp32-subnormal d: q = 0, so s = 0 */
  memset(y, 0, sizeof y);
  y[0] = 1e-39f, y[1] = -1e-39f;
  rn_ref_q8_1(y, 32, o);
  tu_check(rd_u16(o) == 0 && rd_u16(o + 2) == 0, "q8_1 tiny d %04x s %04x", rd_u16(o), rd_u16(o + 2));
  /* a NaN: d and s 0x7e00, codes 0; an Inf: d = inf, codes 0, s = inf * 0 = NaN */
  y[0] = -NAN, y[1] = 127.0f;
  rn_ref_q8_1(y, 32, o);
  tu_check(rd_u16(o) == 0x7e00 && rd_u16(o + 2) == 0x7e00, "q8_1 NaN d %04x s %04x", rd_u16(o), rd_u16(o + 2));
  for (int j = 0; j < 32; j++) tu_check(o[4 + j] == 0, "q8_1 NaN q[%d]", j);
  y[0] = 0, y[5] = -INFINITY;
  rn_ref_q8_1(y, 32, o);
  tu_check(rd_u16(o) == 0x7c00 && rd_u16(o + 2) == 0x7e00, "q8_1 inf d %04x s %04x", rd_u16(o), rd_u16(o + 2));
  for (int j = 0; j < 32; j++) tu_check(o[4 + j] == 0, "q8_1 inf q[%d]", j);
}

static void test_q8_k(void) {
  static float y[512];
  static unsigned char o[2 * RN_Q8_K_BYTES];
  memset(y, 0, sizeof y);
  /* max = +127: iscale = -1, d = -1, q = -round_half_even(y) */
  y[0] = 127.0f, y[1] = 2.5f, y[2] = -2.5f, y[3] = 3.5f, y[4] = 0.5f, y[5] = -127.0f, y[17] = 5.0f;
  memset(o, 0xAA, sizeof o);
  rn_ref_q8_k(y, 512, o);
  tu_check(rd_f32(o) == -1.0f, "q8_k d %g", rd_f32(o));
  const int8_t want[6] = {-127, -2, 2, -4, 0, 127};
  for (int j = 0; j < 6; j++) tu_check(q8(o, 4 + j) == want[j], "q8_k q[%d] %d want %d", j, q8(o, 4 + j), want[j]);
  tu_check(rd_i16(o + 260) == -4 && rd_i16(o + 262) == -5, "q8_k bsums %d %d", rd_i16(o + 260), rd_i16(o + 262));
  for (int j = 0; j < RN_Q8_K_BYTES; j++) tu_check(o[RN_Q8_K_BYTES + j] == 0, "q8_k zero block byte %d", j);
  /* the signed max: the first of equal magnitudes wins (here -127) */
  memset(y, 0, sizeof y);
  y[3] = -127.0f, y[10] = 127.0f, y[11] = 2.5f;
  rn_ref_q8_k(y, 256, o);
  tu_check(rd_f32(o) == 1.0f && q8(o, 4 + 3) == -127 && q8(o, 4 + 10) == 127 && q8(o, 4 + 11) == 2,
           "q8_k signed max d %g", rd_f32(o));
  /* a max whose iscale overflows: q = 0, d = -0 (ggml's bytes) */
  memset(y, 0, sizeof y);
  y[0] = 1e-38f, y[1] = -0.5e-38f;
  rn_ref_q8_k(y, 256, o);
  tu_check(rd_f32(o) == 0 && signbit(rd_f32(o)), "q8_k tiny max d %g", rd_f32(o));
  for (int j = 4; j < RN_Q8_K_BYTES; j++) tu_check(o[j] == 0, "q8_k tiny max byte %d", j);
  /* a normal but small max keeps full codes */
  y[0] = 0x1p-100f, y[1] = -0x1p-101f;
  rn_ref_q8_k(y, 256, o);
  tu_check(q8(o, 4) == -127 && q8(o, 5) == 64, "q8_k small max %d %d", q8(o, 4), q8(o, 5));
  /* a NaN: d NaN, codes and sums 0; Inf: d = -inf, q 0 */
  y[2] = NAN;
  rn_ref_q8_k(y, 256, o);
  tu_check(isnan(rd_f32(o)), "q8_k NaN d %g", rd_f32(o));
  for (int j = 4; j < RN_Q8_K_BYTES; j++) tu_check(o[j] == 0, "q8_k NaN byte %d", j);
  y[2] = 0, y[3] = INFINITY;
  rn_ref_q8_k(y, 256, o);
  tu_check(isinf(rd_f32(o)) && rd_f32(o) < 0, "q8_k inf d %g", rd_f32(o));
  for (int j = 4; j < RN_Q8_K_BYTES; j++) tu_check(o[j] == 0, "q8_k inf byte %d", j);
}

static void test_mxfp4(void) {
  float y[64] = {0};
  unsigned char o[2 * RN_MXFP4_BYTES];
  /* amax 4: e = 2 - 2 + 127, d = 2^-1; codes of y/d among the doubled E2M1
   * values, ties to the first (lower) index */
  y[0] = 4.0f;   /* 8 -> 6 */
  y[1] = 3.0f;   /* 6 -> 5 */
  y[2] = 5.0f;   /* 10: 8 or 12 -> 6 */
  y[3] = -5.0f;  /* -10: -8 or -12 -> 14 */
  y[4] = 0.25f;  /* 0.5: 0 or 1 -> 0 */
  y[5] = 0.3f;   /* 0.6 -> 1 */
  y[6] = -0.0f;  /* -> 0 */
  y[16] = -4.0f; /* high nibble of byte 0: -8 -> 14 */
  y[17] = 1.0f;  /* 2 -> 2 */
  rn_ref_mxfp4(y, 64, o);
  tu_check(o[0] == 127, "mxfp4 e %d", o[0]);
  const unsigned char want[7] = {6 | 14 << 4, 5 | 2 << 4, 6, 14, 0, 1, 0};
  for (int j = 0; j < 7; j++) tu_check(o[1 + j] == want[j], "mxfp4 byte %d %02x want %02x", j, o[1 + j], want[j]);
  for (int j = 0; j < RN_MXFP4_BYTES; j++) tu_check(o[RN_MXFP4_BYTES + j] == 0, "mxfp4 zero block byte %d", j);
  /* just below a power of two: the fp32 log2 rounds up to k for large |k|
   * (so e is one above the exact floor), not for k = 0 */
  tu_check(rn_mxfp4_e8m0(nextafterf(1.0f, 0)) == 124, "mxfp4 e below 1");
  tu_check(rn_mxfp4_e8m0(1.0f) == 125, "mxfp4 e at 1");
  tu_check(rn_mxfp4_e8m0(nextafterf(0x1p100f, 0)) == 225, "mxfp4 e below 2^100 %d",
           rn_mxfp4_e8m0(nextafterf(0x1p100f, 0)));
  tu_check(rn_mxfp4_e8m0(nextafterf(0x1p-100f, 0)) == 25, "mxfp4 e below 2^-100 %d",
           rn_mxfp4_e8m0(nextafterf(0x1p-100f, 0)));
  /* the smallest scales: e 0 and 1 are subnormal d's; below 2^-125 clamped to 0 */
  tu_check(rn_e8m0_half(0) == 0x1p-128f && rn_e8m0_half(1) == 0x1p-127f && rn_e8m0_half(2) == 0x1p-126f &&
           rn_e8m0_half(127) == 0.5f, "e8m0 half");
  tu_check(rn_mxfp4_e8m0(0x1p-125f) == 0 && rn_mxfp4_e8m0(0x1p-124f) == 1 && rn_mxfp4_e8m0(0x1p-130f) == 0,
           "mxfp4 e subnormal");
  memset(y, 0, sizeof y);
  y[0] = 0x1p-125f, y[1] = -0x1p-126f; /* e 0, d 2^-128: 8 and -4 */
  rn_ref_mxfp4(y, 32, o);
  tu_check(o[0] == 0 && o[1] == 6 && o[2] == 12, "mxfp4 subnormal d: %d %02x %02x", o[0], o[1], o[2]);
  /* a NaN: e = 0xFF (E8M0's NaN), codes 0; Inf: the same */
  memset(y, 0, sizeof y);
  y[0] = NAN, y[1] = 4.0f;
  rn_ref_mxfp4(y, 32, o);
  tu_check(o[0] == 0xFF, "mxfp4 NaN e");
  for (int j = 1; j < RN_MXFP4_BYTES; j++) tu_check(o[j] == 0, "mxfp4 NaN byte %d", j);
  y[0] = 0, y[2] = -INFINITY;
  rn_ref_mxfp4(y, 32, o);
  tu_check(o[0] == 0xFF, "mxfp4 inf e");
  for (int j = 1; j < RN_MXFP4_BYTES; j++) tu_check(o[j] == 0, "mxfp4 inf byte %d", j);
}

static void test_mxfp8(void) {
  float y[64] = {0};
  unsigned char c[64], s[2];
  /* amax 480: k = 8 - 8 = 0, X = 1; above 448 saturates */
  y[0] = 480.0f, y[1] = 464.0f, y[2] = -450.0f, y[3] = 1.0f, y[4] = 0.0f, y[5] = -0.0f, y[6] = 0x1p-10f;
  y[7] = 3.0f * 0x1p-10f; /* 1.5 * 2^-9: subnormal tie -> 2 * 2^-9 */
  rn_ref_mxfp8(y, 64, c, s);
  tu_check(s[0] == 127 && s[1] == 0, "mxfp8 scales %d %d", s[0], s[1]);
  const unsigned char want[8] = {0x7e, 0x7e, 0xfe, 0x38, 0x00, 0x80, 0x00, 0x02};
  for (int j = 0; j < 8; j++) tu_check(c[j] == want[j], "mxfp8 code %d %02x want %02x", j, c[j], want[j]);
  for (int j = 32; j < 64; j++) tu_check(c[j] == 0, "mxfp8 zero block code %d", j);
  /* amax 1: k = -8, y/X = 256 -> 0x78; just below 2^k the exact exponent */
  memset(y, 0, sizeof y);
  y[0] = 1.0f, y[1] = nextafterf(1.0f, 0);
  rn_ref_mxfp8(y, 32, c, s);
  tu_check(s[0] == 119 && c[0] == 0x78 && c[1] == 0x78, "mxfp8 amax 1: %d %02x %02x", s[0], c[0], c[1]);
  tu_check(rn_mxfp8_e8m0(nextafterf(0x1p100f, 0)) == 99 - 8 + 127, "mxfp8 e below 2^100");
  /* subnormal amax: the exponent clamped to -127 (byte 0) */
  y[0] = 0x1p-130f, y[1] = 0x1p-140f;
  rn_ref_mxfp8(y, 32, c, s);
  tu_check(s[0] == 0 && c[0] == 0x20 && c[1] == 0x00, "mxfp8 subnormal: %d %02x %02x", s[0], c[0], c[1]);
  tu_check(rn_mxfp8_e8m0(0x1p-119f) == 0 && rn_mxfp8_e8m0(0x1p-118f) == 1, "mxfp8 e smallest");
  /* a NaN: scale 0xFF, codes 0; Inf: scale 0xFF, finite -> 0, inf -> NaN */
  y[2] = -NAN;
  rn_ref_mxfp8(y, 32, c, s);
  tu_check(s[0] == 0xFF, "mxfp8 NaN scale %02x", s[0]);
  for (int j = 0; j < 32; j++) tu_check(c[j] == 0, "mxfp8 NaN code %d %02x", j, c[j]);
  y[2] = -INFINITY, y[3] = INFINITY;
  rn_ref_mxfp8(y, 32, c, s);
  tu_check(s[0] == 0xFF && c[0] == 0 && c[2] == 0xff && c[3] == 0x7f, "mxfp8 inf");
}

static void test_group(void) {
  float y[128] = {0}, sc[4];
  unsigned char c[128];
  /* int8, g 32: s = amax / 127; ties to even */
  y[0] = 127.0f, y[1] = 2.5f, y[2] = -3.5f;
  y[32] = 100.0f, y[33] = 2.5f; /* pow2: s = 1 */
  rn_ref_group(y, 128, 32, RN_GROUP_INT8, 0, c, sc);
  tu_check(sc[0] == 1.0f && (int8_t)c[1] == 2 && (int8_t)c[2] == -4, "group int8");
  tu_check(sc[1] == 100.0f / 127.0f && sc[2] == 0 && c[64] == 0, "group int8 scales");
  rn_ref_group(y, 128, 64, RN_GROUP_INT8, RN_GROUP_SCALE_POW2, c, sc);
  /* an all-zero group: UE8M0's smallest scale 2^-127, codes 0 */
  tu_check(sc[0] == 1.0f && sc[1] == 0x1p-127f && c[64] == 0, "group pow2 %g %g", sc[0], sc[1]);
  rn_ref_group(y + 32, 32, 32, RN_GROUP_INT8, RN_GROUP_SCALE_POW2, c, sc);
  tu_check(sc[0] == 1.0f && (int8_t)c[0] == 100 && (int8_t)c[1] == 2, "group pow2 codes");
  /* subnormal scales: s = 1.5 * 2^-140 (t = y / s); pow2: 2^-139 is below
   * UE8M0's range, so 2^-127, and t = y / 2^-127 */
  memset(y, 0, sizeof y);
  y[0] = 190.5f * 0x1p-140f, y[1] = -0x1p-140f;
  rn_ref_group(y, 32, 32, RN_GROUP_INT8, 0, c, sc);
  tu_check(sc[0] == 1.5f * 0x1p-140f && (int8_t)c[0] == 127 && (int8_t)c[1] == -1, "group subnormal s");
  rn_ref_group(y, 32, 32, RN_GROUP_INT8, RN_GROUP_SCALE_POW2, c, sc);
  tu_check(sc[0] == 0x1p-127f && (int8_t)c[0] == 0 && (int8_t)c[1] == 0, "group subnormal pow2 %g %d",
           sc[0], (int8_t)c[0]);
  /* amax 126 * 2^-127: s = 126/127 * 2^-127 rounds up to 2^-127 (byte 0),
   * codes 126 and -64 (t = y / 2^-127) */
  y[0] = 126.0f * 0x1p-127f, y[1] = -64.0f * 0x1p-127f;
  unsigned char e[4];
  rn_ref_group(y, 32, 32, RN_GROUP_INT8, RN_GROUP_SCALE_POW2, c, sc);
  tu_check(sc[0] == 0x1p-127f && (int8_t)c[0] == 126 && (int8_t)c[1] == -64, "group pow2 smallest");
  rn_ref_group(y, 32, 32, RN_GROUP_INT8, RN_GROUP_SCALE_POW2 | RN_GROUP_SCALE_E8M0, c, e);
  tu_check(e[0] == 0 && (int8_t)c[0] == 126 && (int8_t)c[1] == -64, "group e8m0 smallest %d", e[0]);
  /* e4m3, amax 448 * 2^-126: s = 2^-126 exactly (byte 1), codes 448 */
  y[0] = 448.0f * 0x1p-126f, y[1] = 0;
  rn_ref_group(y, 32, 32, RN_GROUP_E4M3, RN_GROUP_SCALE_POW2 | RN_GROUP_SCALE_E8M0, c, e);
  tu_check(e[0] == 1 && c[0] == 0x7e, "group e8m0 2^-126: %d %02x", e[0], c[0]);
  /* an all-zero e4m3 group with -0: 2^-127 and the codes of +-0 / 2^-127 */
  memset(y, 0, sizeof y);
  y[3] = -0.0f;
  rn_ref_group(y, 32, 32, RN_GROUP_E4M3, RN_GROUP_SCALE_POW2, c, sc);
  tu_check(sc[0] == 0x1p-127f && c[0] == 0 && c[3] == 0x80, "group e4m3 zero pow2 %02x", c[3]);
  /* E8M0 bytes of ordinary scales: amax 127 -> s 1 (127), amax 100 -> 1
   * (127), amax 128 -> 2 (128), amax 127 * 2^-20 -> 2^-20 (107) */
  float g4[128] = {0};
  g4[0] = 127.0f, g4[32] = 100.0f, g4[64] = -128.0f, g4[96] = 127.0f * 0x1p-20f;
  rn_ref_group(g4, 128, 32, RN_GROUP_INT8, RN_GROUP_SCALE_POW2 | RN_GROUP_SCALE_E8M0, c, e);
  tu_check(e[0] == 127 && e[1] == 127 && e[2] == 128 && e[3] == 107, "group e8m0 bytes %d %d %d %d",
           e[0], e[1], e[2], e[3]);
  tu_check((int8_t)c[64] == -64 && (int8_t)c[96] == 127, "group e8m0 codes");
  float f4[4];
  rn_ref_group(g4, 128, 32, RN_GROUP_INT8, RN_GROUP_SCALE_POW2, c, f4);
  for (int i = 0; i < 4; i++) tu_check(rn_e8m0_value(e[i]) == f4[i], "group e8m0 value %d", i);
  /* e4m3, g 128: amax 448 -> s 1; pow2 of 480/448 -> 2 */
  memset(y, 0, sizeof y);
  y[0] = 448.0f, y[1] = 2.5f, y[2] = -0.0f;
  rn_ref_group(y, 128, 128, RN_GROUP_E4M3, 0, c, sc);
  tu_check(sc[0] == 1.0f && c[0] == 0x7e && c[1] == 0x42 && c[2] == 0x80, "group e4m3");
  y[0] = 480.0f;
  rn_ref_group(y, 128, 128, RN_GROUP_E4M3, RN_GROUP_SCALE_POW2, c, sc);
  tu_check(sc[0] == 2.0f && c[0] == 0x77 && c[1] == 0x3a, "group e4m3 pow2 %02x %02x", c[0], c[1]);
  /* a NaN: that group's s NaN (pow2 keeps it; E8M0 0xFF) and its codes 0,
   * the next group as before; an infinity: s = inf (E8M0 0xFF too) */
  memset(y, 0, sizeof y);
  y[3] = NAN, y[4] = 5.0f, y[40] = 127.0f;
  for (int kind = 0; kind < 2; kind++) {
    rn_ref_group(y, 64, 32, kind ? RN_GROUP_E4M3 : RN_GROUP_INT8, RN_GROUP_SCALE_POW2, c, sc);
    int zero = 1;
    for (int j = 0; j < 32; j++) zero &= c[j] == 0;
    tu_check(isnan(sc[0]) && zero && sc[1] > 0 && c[40] != 0, "group NaN (%s)",
             kind ? "e4m3" : "int8");
    rn_ref_group(y, 64, 32, kind ? RN_GROUP_E4M3 : RN_GROUP_INT8,
                 RN_GROUP_SCALE_POW2 | RN_GROUP_SCALE_E8M0, c, e);
    /* the next group: 127/127 = 1 (byte 127), 127/448 up to 0.5 (126) */
    tu_check(e[0] == 0xFF && e[1] == (kind ? 126 : 127), "group NaN e8m0 (%s)", kind ? "e4m3" : "int8");
  }
  y[3] = INFINITY;
  rn_ref_group(y, 64, 32, RN_GROUP_INT8, RN_GROUP_SCALE_POW2 | RN_GROUP_SCALE_E8M0, c, e);
  rn_ref_group(y, 64, 32, RN_GROUP_INT8, RN_GROUP_SCALE_POW2, c + 64, sc);
  tu_check(e[0] == 0xFF && isinf(sc[0]) && !memcmp(c, c + 64, 64), "group inf e8m0");
}

/* The UE8M0 scale rule and the E8M0 bytes (numerics/quant.h). */
static void test_ue8m0(void) {
  tu_check(rn_ue8m0_scale(0.0f) == 0x1p-127f && rn_ue8m0_scale(0x1p-149f) == 0x1p-127f &&
           rn_ue8m0_scale(0x1p-127f) == 0x1p-127f && rn_ue8m0_scale(0x1.8p-128f) == 0x1p-127f,
           "ue8m0 below the range");
  tu_check(rn_ue8m0_scale(nextafterf(0x1p-127f, 1)) == 0x1p-126f &&
           rn_ue8m0_scale(0x1p-126f) == 0x1p-126f && rn_ue8m0_scale(0.75f) == 1.0f &&
           rn_ue8m0_scale(1.0f) == 1.0f && rn_ue8m0_scale(0x1.000002p3f) == 16.0f,
           "ue8m0 rounds up");
  tu_check(rn_ue8m0_scale(0x1p127f) == 0x1p127f && rn_ue8m0_scale(FLT_MAX) == 0x1p127f &&
           isinf(rn_ue8m0_scale(INFINITY)) && isnan(rn_ue8m0_scale(NAN)), "ue8m0 top");
  tu_check(rn_e8m0_byte(0x1p-127f) == 0 && rn_e8m0_byte(0x1p-126f) == 1 && rn_e8m0_byte(1.0f) == 127 &&
           rn_e8m0_byte(0x1p127f) == 254 && rn_e8m0_byte(NAN) == 0xFF &&
           rn_e8m0_byte(INFINITY) == 0xFF, "e8m0 bytes");
  int ok = 1;
  for (int e = 0; e < 255; e++) {
    float v = rn_e8m0_value((uint8_t)e);
    ok &= v == ldexpf(1.0f, e - 127) && rn_e8m0_byte(v) == e && rn_ue8m0_scale(v) == v;
  }
  tu_check(ok && isnan(rn_e8m0_value(0xFF)), "e8m0 values");
}

int main(void) {
  test_q8_0();
  test_q8_1();
  test_q8_k();
  test_mxfp4();
  test_mxfp8();
  test_group();
  test_ue8m0();
  return tu_summary("test_blocks");
}
