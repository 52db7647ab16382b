/* dequantize.c - rmsnorm_dequantize: the float values of the codes and
 * scales rmsnorm_forward_quantized writes, every format, decoded from the
 * formats' definitions (docs/quantized.md), a row at a time in plain C: a
 * decoder for checks and for consumers without their own, not a kernel.
 * Each value is code value times scale in float, the product in the order
 * rmsnorm.dequantize (python/rmsnorm/_quant.py) takes, so that both give the
 * same bits, NaN payloads included. */
#include <float.h>
#include <stddef.h>
#include <stdint.h>

#include "api/entry.h"
#include "api/qlayout.h"
#include "numerics/blocks.h"
#include "numerics/convert.h"
#include "numerics/dtype.h"
#include "numerics/quant.h"

/* E2M1 magnitudes by the low three bits of a code (bit 3: the sign). */
static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

static float e2m1_value(unsigned c) { return c & 8 ? -e2m1[c & 7] : e2m1[c & 7]; }

/* The value of a per-element code: int8, or e4m3 (NaN for S.1111.111). */
static float code_value(unsigned char c, int fp8) {
  return fp8 ? rn_e4m3_value(c) : (float)(int8_t)c;
}

/* Scale i of a row's scales: a float, or an E8M0 byte. */
static float scale_at(const void *scales, size_t i, int e8m0) {
  return e8m0 ? rn_e8m0_value(((const unsigned char *)scales)[i]) : rn_ld_f32(scales, i);
}

/* ggml's Q8_0 / Q8_1 blocks (at: the offset of the codes) and Q8_K's:
 * y = d * q, d stored as fp16 (Q8_0, Q8_1) or float (Q8_K). */
static void q8_row(const unsigned char *c, size_t d, size_t block, size_t bytes, size_t at,
                   int f32_d, void *y) {
  for (size_t b = 0; b < d / block; b++, c += bytes) {
    float s = f32_d ? rn_ld_f32(c, 0) : rn_f16_to_f32(rn_ld_u16(c, 0));
    for (size_t j = 0; j < block; j++) rn_st_f32(y, b * block + j, s * (float)(int8_t)c[at + j]);
  }
}

/* One row: codes c (row_bytes), its scales sc (or NULL), the static scale s0
 * (or 0), into y (d floats, any alignment as every user buffer). */
static void dequantize_row(const rmsnorm_quant *q, size_t d, const unsigned char *c,
                           const void *sc, float s0, void *y) {
  int e8m0 = (q->flags & RMSNORM_QUANT_SCALE_E8M0) != 0;
  switch (q->format) {
    case RMSNORM_QF_Q8_0: q8_row(c, d, RN_Q8_0_BLOCK, RN_Q8_0_BYTES, 2, 0, y); break;
    case RMSNORM_QF_Q8_1: q8_row(c, d, RN_Q8_1_BLOCK, RN_Q8_1_BYTES, 4, 0, y); break;
    case RMSNORM_QF_Q8_K: q8_row(c, d, RN_Q8_K_BLOCK, RN_Q8_K_BYTES, 4, 1, y); break;
    case RMSNORM_QF_MXFP8_E4M3:
      for (size_t j = 0; j < d; j++)
        rn_st_f32(y, j, rn_e4m3_value(c[j]) * scale_at(sc, j / RN_MX_BLOCK, 1));
      break;
    case RMSNORM_QF_MXFP4: /* byte i of a block: element i low nibble, i + 16 high */
      for (size_t b = 0; b < d / RN_MX_BLOCK; b++, c += RN_MXFP4_BYTES) {
        float s = rn_e8m0_value(c[0]);
        for (size_t i = 0; i < RN_MX_BLOCK / 2; i++) {
          rn_st_f32(y, b * RN_MX_BLOCK + i, e2m1_value(c[1 + i] & 15u) * s);
          rn_st_f32(y, b * RN_MX_BLOCK + i + RN_MX_BLOCK / 2, e2m1_value(c[1 + i] >> 4) * s);
        }
      }
      break;
    default: { /* INT8, FP8_E4M3: a static scale, one per row, or one per group */
      int fp8 = q->format == RMSNORM_QF_FP8_E4M3;
      size_t g = q->group ? q->group : d;
      for (size_t j = 0; j < d; j++)
        rn_st_f32(y, j, code_value(c[j], fp8) * (sc ? scale_at(sc, j / g, e8m0) : s0));
      break;
    }
  }
}

rmsnorm_status rmsnorm_dequantize(const rmsnorm_quant *qp, size_t rows, size_t d,
                                  const void *codes, size_t ldc, const void *scales, size_t lds,
                                  float *y, size_t ldy) {
  rmsnorm_quant q;
  rn_qlayout l;
  rmsnorm_status st = rn_qlayout_read(qp, d, &q, &l);
  if (st == RMSNORM_OK) st = rn_check_matrix(rows, l.row_bytes, ldc, 1);
  if (st == RMSNORM_OK && l.row_scales) st = rn_check_matrix(rows, l.row_scales, lds, l.scale_es);
  if (st == RMSNORM_OK) st = rn_check_matrix(rows, d, ldy, sizeof(float));
  if (st != RMSNORM_OK) return st;
  float s0 = q.static_scale ? rn_ld_f32(q.static_scale, 0) : 0.0f;
  if (q.static_scale && !(s0 > 0 && s0 <= FLT_MAX)) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (!l.row_scales && scales) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  if (!codes || !y || (l.row_scales && !scales)) return RMSNORM_ERROR_NULL_POINTER;
  rn_buffers b = {.in = {rn_matrix(codes, rows, l.row_bytes, ldc, 1),
                         rn_matrix(scales, rows, l.row_scales, lds, l.scale_es),
                         rn_vector(q.static_scale, 1, sizeof(float))},
                  .out = {rn_matrix(y, rows, d, ldy, sizeof(float))}};
  if ((st = rn_check_buffers(&b, sizeof(float))) != RMSNORM_OK) return st;
  for (size_t r = 0; r < rows; r++)
    dequantize_row(&q, d, (const unsigned char *)codes + r * ldc,
                   l.row_scales ? (const char *)scales + r * lds * l.scale_es : NULL, s0,
                   (char *)y + r * ldy * sizeof(float));
  return RMSNORM_OK;
}
