/* test_dequantize.c - rmsnorm_dequantize: values computed by hand for every
 * format from codes and scales written byte by byte here (E8M0 bytes at both
 * ends of their range and 0xFF, NaN and infinite block scales, NaN codes,
 * -0), strides with gaps left untouched, the round trip through
 * rmsnorm_forward_quantized within each format's rounding of the fp32
 * forward's y (NaN rows decoding to NaN), and the errors, with nothing
 * written. The bits against the Python package's dequantize:
 * tests/blocks/check_dequantize.py. */
#include <float.h>

#include "testutil.h"

#define PAT 0xcd /* the bytes of y the calls must not write */

static void put_u16(unsigned char *p, uint16_t v) { memcpy(p, &v, 2); }
static void put_f32(unsigned char *p, float v) { memcpy(p, &v, 4); }

/* Whether got[0..n) holds exactly want (NaN for NaN; a zero's sign too). */
static int same(const float *got, const float *want, size_t n) {
  for (size_t j = 0; j < n; j++) {
    if (isnan(want[j]) ? !isnan(got[j]) : got[j] != want[j] || signbit(got[j]) != signbit(want[j]))
      return 0;
  }
  return 1;
}

static rmsnorm_quant quant(rmsnorm_qformat f, size_t group, unsigned flags) {
  rmsnorm_quant q;
  rmsnorm_quant_init(&q, f);
  q.group = group;
  q.flags = flags;
  return q;
}

/* ---- values by hand ------------------------------------------------------ */

static void test_int8_fp8(void) {
  float y[2 * 6];
  /* int8 per row, two rows of 4 (ldc 5, lds 2, ldy 6: gaps untouched):
   * scale 0.5, then NaN (the whole row NaN) */
  unsigned char c[10] = {127, 0x80, 0, 1, 0xee, 3, 0xfd, 0, 0, 0xee};
  float s[4] = {0.5f, -1.0f, NAN, -1.0f};
  rmsnorm_quant q = quant(RMSNORM_QF_INT8, 0, 0);
  memset(y, PAT, sizeof y);
  TU_OK(rmsnorm_dequantize(&q, 2, 4, c, 5, s, 2, y, 6));
  const float want0[4] = {63.5f, -64.0f, 0.0f, 0.5f};
  tu_check(same(y, want0, 4), "int8 row: %g %g %g %g", y[0], y[1], y[2], y[3]);
  tu_check(isnan(y[6]) && isnan(y[7]) && isnan(y[8]) && isnan(y[9]), "int8 NaN row");
  unsigned char pat[4];
  memset(pat, PAT, 4);
  tu_check(!memcmp(y + 4, pat, 4) && !memcmp(y + 5, pat, 4) && !memcmp(y + 10, pat, 4),
           "int8: a gap of y written");
  /* a static scale (no scales array): 2 * 0.25, -4 * 0.25 */
  float s0 = 0.25f;
  q.static_scale = &s0;
  TU_OK(rmsnorm_dequantize(&q, 1, 4, (const unsigned char[]){2, 0xfc, 0, 0}, 4, NULL, 0, y, 4));
  tu_check(y[0] == 0.5f && y[1] == -1.0f, "int8 static: %g %g", y[0], y[1]);

  /* e4m3 per group of 32, float scales 2 and 0.25: 1.0 -> 2, 448 -> 896, -0,
   * NaN (S.1111.111 of either sign), the smallest subnormal 2^-9 -> 2^-8 */
  unsigned char e[64] = {0x38, 0x7e, 0x80, 0x7f, 0xff, 0x01};
  e[32] = 0xc0; /* -2 -> -0.5 */
  float gs[2] = {2.0f, 0.25f};
  float yg[64];
  q = quant(RMSNORM_QF_FP8_E4M3, 32, 0);
  TU_OK(rmsnorm_dequantize(&q, 1, 64, e, 64, gs, 2, yg, 64));
  const float wantg[6] = {2.0f, 896.0f, -0.0f, NAN, NAN, 0x1p-8f};
  tu_check(same(yg, wantg, 6) && yg[6] == 0 && yg[32] == -0.5f && yg[33] == 0,
           "e4m3 groups: %g %g %g %g %g %g, %g", yg[0], yg[1], yg[2], yg[3], yg[4], yg[5], yg[32]);

  /* e4m3 per row with E8M0 scales, four rows of 32: 126 (0.5), 0 (2^-127),
   * 254 (2^127) and 0xFF (NaN); codes 1.0 and 2.0 */
  unsigned char rows[4 * 32] = {0}, sb[4] = {126, 0, 254, 0xff};
  for (int r = 0; r < 4; r++) rows[32 * r] = 0x38, rows[32 * r + 1] = 0x40;
  float yr[4 * 32];
  q = quant(RMSNORM_QF_FP8_E4M3, 0, RMSNORM_QUANT_SCALE_E8M0);
  TU_OK(rmsnorm_dequantize(&q, 4, 32, rows, 32, sb, 1, yr, 32));
  tu_check(yr[0] == 0.5f && yr[1] == 1.0f && yr[2] == 0, "e8m0 row 126");
  tu_check(yr[32] == 0x1p-127f && yr[33] == 0x1p-126f, "e8m0 row 0: %g", yr[32]);
  tu_check(yr[64] == 0x1p127f && isinf(yr[65]), "e8m0 row 254: %g %g", yr[64], yr[65]);
  int nan = 1;
  for (int j = 96; j < 128; j++) nan &= isnan(yr[j]) != 0;
  tu_check(nan, "e8m0 row 0xFF: NaN");

  /* int8 per group of 32 with E8M0 bytes: 130 -> 8, so -3 -> -24; 1 -> 2^-126 */
  unsigned char ic[64] = {0xfd};
  ic[32] = 5;
  q = quant(RMSNORM_QF_INT8, 32, RMSNORM_QUANT_SCALE_E8M0);
  TU_OK(rmsnorm_dequantize(&q, 1, 64, ic, 64, (const unsigned char[]){130, 1}, 2, yg, 64));
  tu_check(yg[0] == -24.0f && yg[32] == 5 * 0x1p-126f, "int8 e8m0 groups: %g %g", yg[0], yg[32]);
}

static void test_ggml_blocks(void) {
  float y[96];
  /* Q8_0: d = 0.5 (fp16 0x3800), then d NaN (0x7e00: all NaN), then d = inf
   * (0x7c00): q = 0 gives NaN, q = 1 inf */
  unsigned char b[3 * 34] = {0};
  put_u16(b, 0x3800), b[2] = 0xfd, b[2 + 31] = 127;
  put_u16(b + 34, 0x7e00), b[36] = 1;
  put_u16(b + 68, 0x7c00), b[70] = 1;
  rmsnorm_quant q = quant(RMSNORM_QF_Q8_0, 0, 0);
  TU_OK(rmsnorm_dequantize(&q, 1, 96, b, 102, NULL, 0, y, 96));
  tu_check(y[0] == -1.5f && y[31] == 63.5f && y[1] == 0, "q8_0: %g %g", y[0], y[31]);
  int nan = 1;
  for (int j = 32; j < 64; j++) nan &= isnan(y[j]) != 0;
  tu_check(nan && isinf(y[64]) && isnan(y[65]), "q8_0 NaN and inf d");

  /* Q8_1: d = 1 (0x3c00), s ignored (NaN here), codes from byte 4 */
  unsigned char c1[36] = {0};
  put_u16(c1, 0x3c00), put_u16(c1 + 2, 0x7e00), c1[4] = 5, c1[35] = 0x81;
  q = quant(RMSNORM_QF_Q8_1, 0, 0);
  TU_OK(rmsnorm_dequantize(&q, 1, 32, c1, 36, NULL, 0, y, 32));
  tu_check(y[0] == 5 && y[1] == 0 && y[31] == -127, "q8_1: %g %g", y[0], y[31]);

  /* Q8_K: float d = -2, codes 5 and -1; the block sums are not read */
  static unsigned char ck[292];
  memset(ck, 0x55, sizeof ck);
  put_f32(ck, -2.0f);
  memset(ck + 4, 0, 256);
  ck[4] = 5, ck[4 + 255] = 0xff;
  static float yk[256];
  q = quant(RMSNORM_QF_Q8_K, 0, 0);
  TU_OK(rmsnorm_dequantize(&q, 1, 256, ck, 292, NULL, 0, yk, 256));
  tu_check(yk[0] == -10 && yk[255] == 2 && yk[1] == 0 && signbit(yk[1]), "q8_k: %g %g", yk[0],
           yk[255]);

  /* MXFP8: scale bytes 130 (8) and 0xFF (NaN): 1.0 -> 8, -1.0 -> -8, NaN */
  unsigned char m[64] = {0x38, 0xb8, 0x7f}, ms[2] = {130, 0xff};
  q = quant(RMSNORM_QF_MXFP8_E4M3, 0, 0);
  TU_OK(rmsnorm_dequantize(&q, 1, 64, m, 64, ms, 2, y, 64));
  nan = 1;
  for (int j = 32; j < 64; j++) nan &= isnan(y[j]) != 0;
  tu_check(y[0] == 8 && y[1] == -8 && isnan(y[2]) && y[3] == 0 && nan, "mxfp8: %g %g", y[0], y[1]);

  /* MXFP4: e = 127 (1.0): byte 1 = code 7 (6) | code 9 (-0.5) << 4, byte 2 =
   * code 8 (-0) | 0; e = 0 (2^-127): code 1 (0.5) -> 2^-128; e = 0xFF: NaN */
  unsigned char f4[3 * 17] = {0};
  f4[0] = 127, f4[1] = 7 | 9 << 4, f4[2] = 8;
  f4[17] = 0, f4[18] = 1;
  f4[34] = 0xff;
  q = quant(RMSNORM_QF_MXFP4, 0, 0);
  TU_OK(rmsnorm_dequantize(&q, 1, 96, f4, 51, NULL, 0, y, 96));
  const float want[3] = {6.0f, -0.0f, 0.0f};
  tu_check(same(y, want, 3) && y[16] == -0.5f && y[17] == 0, "mxfp4: %g %g %g", y[0], y[1], y[16]);
  tu_check(y[32] == 0x1p-128f && y[33] == 0, "mxfp4 e 0: %g", y[32]);
  nan = 1;
  for (int j = 64; j < 96; j++) nan &= isnan(y[j]) != 0;
  tu_check(nan, "mxfp4 e 0xFF: NaN");
}

/* ---- the round trip -------------------------------------------------------- */

typedef struct fmt {
  const char *name;
  rmsnorm_qformat format;
  size_t group;
  unsigned flags;
  double rel; /* |y' - y| <= rel * (max |y| of the block) */
  size_t block;
} fmt;

static const fmt fmts[] = {
    {"int8/row", RMSNORM_QF_INT8, 0, 0, 0.5 / 127, 0},
    {"int8/32 pow2", RMSNORM_QF_INT8, 32, RMSNORM_QUANT_SCALE_POW2, 1.0 / 127, 32},
    {"int8/64 e8m0", RMSNORM_QF_INT8, 64, RMSNORM_QUANT_SCALE_E8M0, 1.0 / 127, 64},
    {"e4m3/row", RMSNORM_QF_FP8_E4M3, 0, 0, 1.0 / 16, 0},
    {"e4m3/128 e8m0", RMSNORM_QF_FP8_E4M3, 128, RMSNORM_QUANT_SCALE_E8M0, 1.0 / 16, 128},
    {"q8_0", RMSNORM_QF_Q8_0, 0, 0, 0.6 / 127, 32},
    {"q8_1", RMSNORM_QF_Q8_1, 0, 0, 0.6 / 127, 32},
    {"q8_k", RMSNORM_QF_Q8_K, 0, 0, 0.5 / 127, 256},
    {"mxfp8", RMSNORM_QF_MXFP8_E4M3, 0, 0, 1.0 / 8, 32},
    {"mxfp4", RMSNORM_QF_MXFP4, 0, 0, 0.25, 32},
};
#define NFMTS (sizeof fmts / sizeof fmts[0])

static void test_round_trip(void) {
  const size_t rows = 7, d = 512;
  rmsnorm_context *c;
  if (rmsnorm_context_create(&c) != RMSNORM_OK) return;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  float *x = malloc(rows * d * 4), *w = malloc(d * 4), *y = malloc(rows * d * 4);
  float *back = malloc(rows * d * 4);
  unsigned char *codes = malloc(rows * d * 2), *scales = malloc(rows * d * 4);
  tu_seed(11);
  for (size_t i = 0; i < rows * d; i++) x[i] = (float)tu_normal();
  for (size_t j = 0; j < d; j++) w[j] = (float)(0.5 + tu_uniform());
  for (size_t j = 0; j < d; j += 97) w[j] *= 25; /* outlier channels */
  for (size_t j = 64; j < 128; j++) x[d + j] = 0; /* a zero block of row 1 */
  for (size_t j = 0; j < d; j++) x[3 * d + j] = 0; /* a zero row */
  x[5 * d + 9] = NAN;                              /* a NaN row */
  TU_OK(rmsnorm_forward(c, &cfg, rows, d, x, d, w, NULL, y, d, NULL));
  for (size_t fi = 0; fi < NFMTS; fi++) {
    const fmt *f = &fmts[fi];
    rmsnorm_quant q = quant(f->format, f->group, f->flags);
    size_t rb, rs;
    TU_OK(rmsnorm_quant_row_size(&q, d, &rb, &rs));
    TU_OK(rmsnorm_forward_quantized(c, &cfg, rows, d, x, d, w, NULL, &q, codes, rb,
                                    rs ? scales : NULL, rs, NULL));
    TU_OK(rmsnorm_dequantize(&q, rows, d, codes, rb, rs ? scales : NULL, rs, back, d));
    size_t block = f->block ? f->block : d;
    int ok = 1;
    for (size_t r = 0; r < rows; r++)
      for (size_t b0 = 0; b0 < d; b0 += block) {
        const float *yb = y + r * d + b0, *bb = back + r * d + b0;
        double amax = 0;
        for (size_t j = 0; j < block; j++) /* not fmax: that reduction crashes aarch64 GCC 12 */
          if (fabs(yb[j]) > amax) amax = fabs(yb[j]);
        for (size_t j = 0; j < block; j++) {
          if (r == 5) { /* the NaN row: NaN throughout */
            ok &= isnan(bb[j]) != 0;
            continue;
          }
          double err = fabs((double)bb[j] - yb[j]);
          ok &= err <= f->rel * 1.01 * amax + 1e-30;
          if (amax == 0) ok &= bb[j] == 0; /* zero blocks and rows decode to zeros */
        }
      }
    tu_check(ok, "%s: round trip beyond the format's rounding", f->name);
  }
  free(x), free(w), free(y), free(back), free(codes), free(scales);
  rmsnorm_context_free(c);
}

/* ---- errors: a status, nothing written ------------------------------------ */

static void test_errors(void) {
  unsigned char codes[512] = {0};
  float sc[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, y[256];
  float one = 1.0f, bad = -1.0f, inf = INFINITY;
  rmsnorm_quant q;
#define EXPECT(want, call)                                                               \
  do {                                                                                   \
    memset(y, PAT, sizeof y);                                                            \
    rmsnorm_status st_ = (call);                                                         \
    int clean_ = 1;                                                                      \
    for (size_t i_ = 0; i_ < sizeof y; i_++) clean_ &= ((unsigned char *)y)[i_] == PAT;  \
    tu_check(st_ == (want) && (st_ == RMSNORM_OK || clean_), "line %d: %s, want %s%s",  \
             __LINE__, rmsnorm_status_name(st_), rmsnorm_status_name(want),              \
             clean_ ? "" : " (y written)");                                              \
  } while (0)
  q = quant(RMSNORM_QF_Q8_0, 0, 0);
  EXPECT(RMSNORM_OK, rmsnorm_dequantize(&q, 2, 64, codes, 68, NULL, 0, y, 64));
  EXPECT(RMSNORM_ERROR_NULL_POINTER, rmsnorm_dequantize(NULL, 1, 64, codes, 68, NULL, 0, y, 64));
  EXPECT(RMSNORM_ERROR_BAD_SIZE, rmsnorm_dequantize(&q, 1, 48, codes, 68, NULL, 0, y, 64));
  EXPECT(RMSNORM_ERROR_BAD_SIZE, rmsnorm_dequantize(&q, 1, 0, codes, 68, NULL, 0, y, 64));
  EXPECT(RMSNORM_ERROR_BAD_STRIDE, rmsnorm_dequantize(&q, 2, 64, codes, 67, NULL, 0, y, 64));
  EXPECT(RMSNORM_ERROR_BAD_STRIDE, rmsnorm_dequantize(&q, 2, 64, codes, 68, NULL, 0, y, 63));
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_dequantize(&q, 1, 64, codes, 68, sc, 1, y, 64));
  EXPECT(RMSNORM_ERROR_NULL_POINTER, rmsnorm_dequantize(&q, 1, 64, NULL, 68, NULL, 0, y, 64));
  EXPECT(RMSNORM_ERROR_NULL_POINTER, rmsnorm_dequantize(&q, 1, 64, codes, 68, NULL, 0, NULL, 64));
  EXPECT(RMSNORM_OK, rmsnorm_dequantize(&q, 0, 64, NULL, 68, NULL, 0, NULL, 64));
  q.flags = RMSNORM_QUANT_SCALE_POW2; /* not Q8_0's */
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_dequantize(&q, 1, 64, codes, 68, NULL, 0, y, 64));
  q = quant((rmsnorm_qformat)7, 0, 0);
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_dequantize(&q, 1, 64, codes, 68, NULL, 0, y, 64));
  q = quant(RMSNORM_QF_MXFP4, 0, 0);
  q.size = 3;
  EXPECT(RMSNORM_ERROR_BAD_CONFIG, rmsnorm_dequantize(&q, 1, 64, codes, 34, NULL, 0, y, 64));
  /* int8 per group: the scales are required, with their stride */
  q = quant(RMSNORM_QF_INT8, 32, 0);
  EXPECT(RMSNORM_OK, rmsnorm_dequantize(&q, 2, 64, codes, 64, sc, 2, y, 64));
  EXPECT(RMSNORM_ERROR_NULL_POINTER, rmsnorm_dequantize(&q, 2, 64, codes, 64, NULL, 2, y, 64));
  EXPECT(RMSNORM_ERROR_BAD_STRIDE, rmsnorm_dequantize(&q, 2, 64, codes, 64, sc, 1, y, 64));
  q.group = 48;
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_dequantize(&q, 1, 96, codes, 96, sc, 2, y, 96));
  /* a static scale: finite and > 0, no scales array, no group or flags */
  q = quant(RMSNORM_QF_FP8_E4M3, 0, 0);
  q.static_scale = &one;
  EXPECT(RMSNORM_OK, rmsnorm_dequantize(&q, 1, 64, codes, 64, NULL, 0, y, 64));
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_dequantize(&q, 1, 64, codes, 64, sc, 1, y, 64));
  q.static_scale = &bad;
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_dequantize(&q, 1, 64, codes, 64, NULL, 0, y, 64));
  q.static_scale = &inf;
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_dequantize(&q, 1, 64, codes, 64, NULL, 0, y, 64));
  q.static_scale = &one;
  q.flags = RMSNORM_QUANT_SCALE_E8M0;
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_dequantize(&q, 1, 64, codes, 64, NULL, 0, y, 64));
  /* y may not overlap the codes or the scales */
  q = quant(RMSNORM_QF_INT8, 0, 0);
  float *buf = malloc(1024);
  memset(buf, 0, 1024);
  rmsnorm_status st = rmsnorm_dequantize(&q, 1, 64, buf, 64, sc, 1, buf + 8, 64);
  tu_check(st == RMSNORM_ERROR_OVERLAP, "y over the codes: %s", rmsnorm_status_name(st));
  st = rmsnorm_dequantize(&q, 1, 64, codes, 64, buf + 4, 1, buf, 64);
  tu_check(st == RMSNORM_ERROR_OVERLAP, "y over the scales: %s", rmsnorm_status_name(st));
  free(buf);
#undef EXPECT
}

int main(void) {
  test_int8_fp8();
  test_ggml_blocks();
  test_round_trip();
  test_errors();
  return tu_finish("test_dequantize");
}
