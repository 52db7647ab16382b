/* blocks_ref.c - the scalar reference (the spec) of the block and per-group
 * quantizers of a normed fp32 row segment y: Q8_0, Q8_1, Q8_K, MXFP4, MXFP8 E4M3,
 * per-group int8/e4m3. Plain C11, no ISA flags; layouts in numerics/blocks.h.
 *
 * All arithmetic is fp32 without contraction (the build has
 * -ffp-contract=off), in the order written: the bytes depend on it.
 *
 * Q8_0 (ggml's quantize_row_q8_0_ref and gguf-py's Q8_0, byte for byte on
 *   finite blocks):
 *   amax = max |y_j|; d = amax / 127; id = d ? 1/d : 0;
 *   stored d = fp16(d), round to nearest even; q_j = roundf(y_j * id),
 *   ties AWAY from zero. Where ggml's float -> int8 conversion is undefined
 *   (only with an fp32-subnormal d, whose fp16 is 0 anyway): an infinite id
 *   (amax <= ~2^-122) gives q = 0, what ggml's x86 build and gguf-py write;
 *   a finite one whose |y_j * id| exceeds 127.5 gives q_j clamped to +-127.
 * Q8_1 (ggml's quantize_row_q8_1_ref; gguf-py has no quantizer for it): d
 *   and q_j as Q8_0's; then s = sum_j q_j (an integer, exact in fp32) times
 *   the fp32 d (not the stored fp16 one), rounded to fp32, then to fp16.
 * Q8_K (ggml's quantize_row_q8_K_ref; gguf-py has no quantizer for it):
 *   max = the y_j of largest |y_j|, the first one on ties; amax = |max|;
 *   amax == 0: d = 0, qs = 0 and bsums = 0 (ggml leaves bsums as they were);
 *   else iscale = -127 / max (negative for a positive max), q_j = round half
 *   to EVEN(iscale * y_j) (ggml's nearest_int), at most 127; bsums[i] = sum
 *   of q[16i..16i+15]; d = 1 / iscale (so y ~ d * q with d of max's
 *   opposite sign). A max whose iscale overflows (|max| < ~2^-121) gives
 *   q = 0 and d = -+0, what ggml's integer trick yields there.
 * MXFP4 (ggml's quantize_row_mxfp4_ref and gguf-py's MXFP4, byte for byte on
 *   finite blocks with amax = 0 or amax >= 2^-125):
 *   e = amax > 0 ? floor(log2(amax)) - 2 + 127 : 0, the log2 rounded to fp32
 *   before the floor (log2f/numpy float32 log2 round up to k just below 2^k,
 *   and both references floor that rounded value); e < 0 (amax < 2^-125) is
 *   clamped to 0: ggml's float -> uint8 conversion is undefined there (x86
 *   builds and gguf-py wrap it to 256 + e, a huge d with zero codes; a
 *   saturating conversion, as aarch64's, gives 0 as here);
 *   d = 2^(e - 128) (ggml's E8M0-to-float "half": the E2M1 values doubled);
 *   code_j = the first i minimising |kvalues[i] * d - y_j| (fp32),
 *   kvalues = {0,1,2,3,4,6,8,12, 0,-1,-2,-3,-4,-6,-8,-12}.
 * MXFP8 E4M3 (OCP Microscaling v1.0, no reference library):
 *   k = floor(log2(amax)) - 8 exactly (the exponent of amax; 8 = emax of
 *   E4M3), clamped to >= -127; scale byte = k + 127 (E8M0, X = 2^k);
 *   code_j = e4m3(y_j / X): nearest even, saturated to +-448 (quant.h).
 *   amax == 0: scale byte 0 (X = 2^-127), codes +-0.
 * per group of g (int8 or e4m3): as rmsnorm_forward_quant's per-row rule
 *   applied to each group: s = amax / QMAX (127 or 448) in fp32, optionally
 *   rounded UP to a power of two in UE8M0's range (rn_ue8m0_scale: a power
 *   of two stays, 0 and anything below 2^-127 become 2^-127) and then
 *   optionally stored as its E8M0 byte; t_j = y_j * (1/s), or y_j / s
 *   outside 2^-126 <= s <= 2^126, 0 when s = 0; int8 round half even, e4m3
 *   as above (rn_quant_t_mode and codes, quant.h).
 *
 * NaN and Inf: a block (or group) that dequantizes to NaN throughout. A
 * NaN makes the block's scale NaN and every code 0: Q8_0 d = fp16 NaN
 * (0x7e00), Q8_1 d and s both 0x7e00, Q8_K d = NaN with bsums 0, MXFP4 and MXFP8 scale byte 0xFF (the
 * E8M0 NaN), a group's s = NaN (gguf-py's NaN max gives a NaN Q8_0 d too; its
 * codes are then undefined). Without a NaN, an infinity makes amax infinite:
 * Q8_0 d = fp16 inf and q = 0 (ggml, gguf-py), Q8_1 the same with s =
 * fp16 NaN 0x7e00 (inf * 0); Q8_K d = 1/iscale = -+inf,
 * q = 0, bsums 0; MXFP4 and MXFP8 scale byte 0xFF (E8M0 has no infinity),
 * MXFP4 codes 0, MXFP8 codes 0 and the infinities e4m3 NaN with their sign;
 * per group s = inf and the per-row rule's codes (t = y / inf: 0, or NaN for
 * the infinities). The SIMD encoders never see a NaN: the kernels send every
 * row that can hold one to these (kernels.h, rn_quant_args.nan_rows). */
#include <assert.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "numerics/blocks.h"
#include "numerics/convert.h"
#include "numerics/quant.h"

/* Max |y_j| over y[0..n): +inf when one is infinite, NaN when one is NaN. */
static float amax_f32(const float *y, size_t n) {
  float amax = 0.0f;
  for (size_t j = 0; j < n; j++) {
    float a = fabsf(y[j]);
    if (a != a) return a;
    if (a > amax) amax = a;
  }
  return amax;
}

/* Q8_0 code: roundf (ties away from zero) of t, NaN -> 0, within +-127. */
static int8_t q8_0_code(float t) {
  if (isnan(t)) return 0;
  if (t > 127.0f) t = 127.0f;
  if (t < -127.0f) t = -127.0f;
  return (int8_t)roundf(t);
}

/* fp16 of v, 0x7e00 for any NaN */
static uint16_t f16_canonical(float v) { return rn_f32_to_f16(isnan(v) ? NAN : v); }

/* Q8_0 (sum 0) and Q8_1 (sum 1: s after d, the codes 2 bytes later). */
static void q8_blocks(const float *y, size_t n, unsigned char *blocks, int sum) {
  size_t bytes = sum ? RN_Q8_1_BYTES : RN_Q8_0_BYTES, at = sum ? 4 : 2;
  assert(n % RN_Q8_0_BLOCK == 0);
  for (size_t b = 0; b < n / RN_Q8_0_BLOCK; b++) {
    const float *x = y + b * RN_Q8_0_BLOCK; /* x: (32,) */
    unsigned char *o = blocks + b * bytes;  /* o: fp16 d, [fp16 s,] int8 qs[32] */
    float d = amax_f32(x, RN_Q8_0_BLOCK) / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint16_t dh = f16_canonical(d);
    memcpy(o, &dh, sizeof dh);
    int total = 0;
    for (size_t j = 0; j < RN_Q8_0_BLOCK; j++) {
      int8_t q = isinf(id) || isnan(id) ? 0 : q8_0_code(x[j] * id);
      memcpy(o + at + j, &q, 1);
      total += q;
    }
    if (sum) { /* ggml: the int sum times the fp32 d, in fp32 */
      uint16_t sh = f16_canonical((float)total * d);
      memcpy(o + 2, &sh, sizeof sh);
    }
  }
}

void rn_ref_q8_0(const float *y, size_t n, unsigned char *blocks) { q8_blocks(y, n, blocks, 0); }
void rn_ref_q8_1(const float *y, size_t n, unsigned char *blocks) { q8_blocks(y, n, blocks, 1); }

void rn_ref_q8_k(const float *y, size_t n, unsigned char *blocks) {
  assert(n % RN_Q8_K_BLOCK == 0);
  for (size_t b = 0; b < n / RN_Q8_K_BLOCK; b++) {
    const float *x = y + b * RN_Q8_K_BLOCK;         /* x: (256,) */
    unsigned char *o = blocks + b * RN_Q8_K_BYTES;  /* o: float d, int8 qs[256], int16 bsums[16] */
    float amax = 0.0f, max = 0.0f;
    for (size_t j = 0; j < RN_Q8_K_BLOCK; j++) {
      float a = fabsf(x[j]);
      if (a > amax) { /* strict: the first of equal magnitudes; NaN never */
        amax = a;
        max = x[j];
      }
    }
    int8_t q[RN_Q8_K_BLOCK] = {0};
    int16_t bsums[RN_Q8_K_BLOCK / 16] = {0};
    float d = 0.0f;
    if (isnan(amax_f32(x, RN_Q8_K_BLOCK))) {
      d = NAN;
    } else if (amax != 0.0f) {
      float iscale = -127.0f / max;
      if (isfinite(iscale))
        for (size_t j = 0; j < RN_Q8_K_BLOCK; j++) {
          float t = iscale * x[j]; /* |t| <= 127 (1 + 2^-23): nearest even below */
          q[j] = isnan(t) ? 0 : t > 127.0f ? 127 : (int8_t)nearbyintf(t);
        }
      for (size_t i = 0; i < RN_Q8_K_BLOCK / 16; i++) {
        int sum = 0;
        for (size_t j = 0; j < 16; j++) sum += q[16 * i + j];
        bsums[i] = (int16_t)sum;
      }
      d = 1.0f / iscale;
    }
    memcpy(o, &d, 4);
    memcpy(o + 4, q, sizeof q);
    memcpy(o + 4 + sizeof q, bsums, sizeof bsums);
  }
}

uint8_t rn_mxfp4_e8m0(float amax) {
  if (isnan(amax) || isinf(amax)) return 0xFF;
  if (!(amax > 0.0f)) return 0;
  /* log2 rounded to fp32 first, as log2f and numpy's float32 log2 give it
   * (the double log2 rounded once to float is the correctly rounded value
   * those agree with), then floored: just below 2^k it may be k. */
  int e = (int)floorf((float)log2((double)amax)) - 2 + 127;
  return e < 0 ? 0 : (uint8_t)e; /* at most 127 - 2 + 127 = 252 */
}

float rn_e8m0_half(uint8_t e) {
  uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  return rn_bits_f32(bits);
}

static const float mxfp4_kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* The first code of least |kvalues[i] * d - v| in fp32 (NaN -> 0). */
static unsigned mxfp4_code(float v, float d) {
  unsigned best = 0;
  float best_err = fabsf(mxfp4_kvalues[0] * d - v);
  for (unsigned i = 1; i < 16; i++) {
    float err = fabsf(mxfp4_kvalues[i] * d - v);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

void rn_ref_mxfp4(const float *y, size_t n, unsigned char *blocks) {
  assert(n % RN_MX_BLOCK == 0);
  for (size_t b = 0; b < n / RN_MX_BLOCK; b++) {
    const float *x = y + b * RN_MX_BLOCK;           /* x: (32,) */
    unsigned char *o = blocks + b * RN_MXFP4_BYTES; /* o: E8M0 e, 16 bytes of nibbles */
    float amax = amax_f32(x, RN_MX_BLOCK);
    o[0] = rn_mxfp4_e8m0(amax);
    if (!(amax <= FLT_MAX)) { /* inf or NaN: scale byte 0xFF, codes 0 */
      memset(o + 1, 0, RN_MX_BLOCK / 2);
      continue;
    }
    float d = rn_e8m0_half(o[0]);
    for (size_t j = 0; j < RN_MX_BLOCK / 2; j++)
      o[1 + j] = (unsigned char)(mxfp4_code(x[j], d) | mxfp4_code(x[j + RN_MX_BLOCK / 2], d) << 4);
  }
}

uint8_t rn_mxfp8_e8m0(float amax) {
  if (isnan(amax) || isinf(amax)) return 0xFF;
  if (!(amax > 0.0f)) return 0;
  int k = ilogbf(amax) - 8; /* exact floor(log2(amax)), subnormals too */
  return (uint8_t)(k < -127 ? 0 : k + 127);
}

void rn_ref_mxfp8(const float *y, size_t n, unsigned char *codes, unsigned char *scales) {
  assert(n % RN_MX_BLOCK == 0);
  for (size_t b = 0; b < n / RN_MX_BLOCK; b++) {
    const float *x = y + b * RN_MX_BLOCK; /* x: (32,) */
    unsigned char *c = codes + b * RN_MX_BLOCK;
    float amax = amax_f32(x, RN_MX_BLOCK);
    uint8_t e = rn_mxfp8_e8m0(amax);
    scales[b] = e;
    for (size_t j = 0; j < RN_MX_BLOCK; j++) {
      if (isnan(amax)) /* a NaN: codes 0 */
        c[j] = 0;
      else if (isinf(amax)) /* finite -> 0, +-inf -> NaN with its sign */
        c[j] = isinf(x[j]) ? (unsigned char)(signbit(x[j]) ? 0xff : 0x7f)
                           : (unsigned char)(isnan(x[j]) ? rn_e4m3_code(x[j]) : 0);
      else /* y / 2^k: exact (a power of two, no overflow, underflow far below e4m3) */
        c[j] = rn_e4m3_code(ldexpf(x[j], 127 - (int)e));
    }
  }
}

void rn_ref_group(const float *y, size_t n, size_t g, int kind, unsigned flags,
                  unsigned char *codes, void *scales) {
  assert(g > 0 && n % g == 0);
  assert(!(flags & RN_GROUP_SCALE_E8M0) || (flags & RN_GROUP_SCALE_POW2));
  float qmax = kind == RN_GROUP_E4M3 ? (float)RN_E4M3_MAX : (float)RN_INT8_QMAX;
  for (size_t gi = 0; gi < n / g; gi++) {
    const float *x = y + gi * g; /* x: (g,) */
    unsigned char *c = codes + gi * g;
    float s = amax_f32(x, g) / qmax;
    if (flags & RN_GROUP_SCALE_POW2) s = rn_ue8m0_scale(s);
    rn_store_scale(scales, gi, s, (flags & RN_GROUP_SCALE_E8M0) != 0);
    int mode = rn_quant_t_mode(s);
    float inv = 1.0f / s; /* used only in RN_QT_MUL mode */
    for (size_t j = 0; j < g; j++) {
      float t = mode == RN_QT_MUL ? x[j] * inv : mode == RN_QT_DIV ? x[j] / s : 0.0f;
      c[j] = kind == RN_GROUP_E4M3 ? rn_e4m3_code(t) : (unsigned char)rn_i8_code_f32(t);
    }
  }
}

void rn_ref_encode(const rn_quant_args *q, size_t row, const float *y) {
  size_t d = q->f.d;
  unsigned char *out = (unsigned char *)q->q + row * q->ldq;
  switch (q->format) {
    case RMSNORM_QF_Q8_0: rn_ref_q8_0(y, d, out); break;
    case RMSNORM_QF_Q8_1: rn_ref_q8_1(y, d, out); break;
    case RMSNORM_QF_Q8_K: rn_ref_q8_k(y, d, out); break;
    case RMSNORM_QF_MXFP4: rn_ref_mxfp4(y, d, out); break;
    case RMSNORM_QF_MXFP8_E4M3:
      rn_ref_mxfp8(y, d, out, (unsigned char *)q->scales + row * q->lds);
      break;
    default:
      rn_ref_group(y, d, q->group, q->format == RMSNORM_QF_FP8_E4M3 ? RN_GROUP_E4M3 : RN_GROUP_INT8,
                   (q->pow2 ? RN_GROUP_SCALE_POW2 : 0) | (q->e8m0 ? RN_GROUP_SCALE_E8M0 : 0), out,
                   (char *)q->scales + row * q->lds * rn_scale_bytes(q->e8m0));
      break;
  }
}
