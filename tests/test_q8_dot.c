/* test_q8_dot.c - the next layer in 8 bits: Z = Y W with Y from
 * rmsnorm_forward_quantized (Q8_0) and W's columns in Q8_0 by the same rule,
 * multiplied as ggml's vec_dot_q8_0_q8_0 does (integer sums per block, one
 * float scale per block pair), held to a bound derived from the rounding
 * steps, not tuned, against the float64 Z of the same Y and W.
 *
 * The bound. Q8_0 codes a block of 32 values v with d = fl(amax/127),
 * id = fl(1/d), q = roundf(fl(v id)), and stores delta = fp16(d). Then
 * fl(v id) = (v/d)(1 + e1)(1 + e2) with |e1|, |e2| <= u = 2^-24 and
 * |v/d| <= 127(1 + u), so |fl(v id) - v/d| < 2^-15 and |v/d - q| <= 1/2 +
 * 2^-15. For a normal fp16 delta, |d - delta| <= 2^-11 d, and |q| <= 127:
 *   |v - delta q| <= d (1/2 + 2^-15) + 127 * 2^-11 d
 *                 <= E = delta (1/2 + 2^-15 + 127 * 2^-11) / (1 - 2^-11).
 * (The fp16 rounding of d, not only half a step, is why E is 0.5626 delta
 * and not delta / 2.) With y = delta_y q_y + a, w = delta_w q_w + b,
 *   y w - (delta_y q_y)(delta_w q_w) = a w + b y - a b,
 * so |sum_j y_j w_j - sum_j delta_y q_yj delta_w q_wj|
 *   <= sum over blocks, over j in the block, of E_y |w_j| + E_w |y_j| + E_y E_w.
 * The float arithmetic: a block's integer sum s is exact (|s| <= 32 * 127^2
 * < 2^24, exact in float too), delta_y delta_w is exact in float (two 11-bit
 * significands), each s * (delta_y delta_w) is rounded once and the nb block
 * terms are summed in float: at most gamma_nb * sum |s delta_y delta_w| more,
 * gamma_n = n u / (1 - n u). The float64 Z of d terms is within
 * gamma_d (in double) * sum |y w| of the exact one. The sum of the three is
 * the bound every Z must meet. The y the encoder sees is rmsnorm_forward's
 * float y (float32 data computes in float32); each value's |y - delta q| <= E
 * is checked too, so the bound's premise is tested, not assumed; and the
 * library's blocks of y are checked to be this file's quantizer's, so Y and W
 * take one rule. */
#include "testutil.h"

#define D 4096
#define QK 32
#define NB (D / QK)
#define BLOCK_BYTES 34
#define ROWS 16
#define N 24

static float half_value(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m + 1024), e - 25);
  return h & 0x8000u ? -v : v;
}

/* float -> fp16 bits, round to nearest even, for finite d >= 0 below 65504
 * (the scales here) */
static uint16_t half_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if (u < 0x38800000u) return (uint16_t)nearbyintf(f * 0x1p24f); /* subnormal or 0 */
  uint32_t h = (u - 0x38000000u) >> 13, rest = u & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return (uint16_t)h;
}

/* ggml's quantize_row_q8_0 on one block of 32 floats */
static void q8_0_block(const float *v, unsigned char *out) {
  float amax = 0;
  for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(v[j]));
  float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
  uint16_t h = half_bits(d);
  out[0] = (unsigned char)(h & 0xff), out[1] = (unsigned char)(h >> 8);
  for (int j = 0; j < QK; j++) out[2 + j] = (unsigned char)(signed char)roundf(v[j] * id);
}

static float delta_of(const unsigned char *b) { return half_value((uint16_t)(b[0] | b[1] << 8)); }

/* E for a block of stored scale delta (normal fp16) */
static double code_error(double delta) {
  return delta * (0.5 + 0x1p-15 + 127 * 0x1p-11) / (1 - 0x1p-11);
}

static void test_q8_dot(void) {
  static float x[ROWS][D], g[D], y[ROWS][D], w[D][N], wt[N][D];
  static unsigned char yq[ROWS][NB * BLOCK_BYTES], wq[N][NB * BLOCK_BYTES];
  tu_seed(0x8b175);

  /* hidden states as a transformer's residual stream has them: unit-ish
   * noise at a scale per token, a few channels far larger in every token
   * (the outlier features of LLMs), and one token with a single spike */
  static const int outliers[] = {17, 1024, 1025, 2900, 4000};
  for (int i = 0; i < ROWS; i++) {
    double scale = 0.05 * pow(2.0, i % 8);
    for (int j = 0; j < D; j++) x[i][j] = (float)(scale * tu_normal());
    for (size_t k = 0; k < sizeof outliers / sizeof outliers[0]; k++)
      x[i][outliers[k]] = (float)(scale * (20 + 40 * tu_uniform()) * (k % 2 ? -1 : 1));
  }
  x[5][333] = 3000.0f * x[5][333];
  /* a trained gain: around 1, a few channels damped */
  for (int j = 0; j < D; j++) g[j] = (float)(1 + 0.15 * tu_normal());
  for (int j = 0; j < D; j += 97) g[j] = 0.05f;
  /* the next layer's weights: N(0, 1/d) with a few large ones */
  for (int j = 0; j < D; j++)
    for (int o = 0; o < N; o++) {
      w[j][o] = (float)(tu_normal() / 64);
      if (tu_uniform() < 0.001) w[j][o] *= 12;
      wt[o][j] = w[j][o];
    }

  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  rmsnorm_quant q;
  TU_OK(rmsnorm_context_create(&ctx));
  TU_OK(rmsnorm_config_init(&cfg, RMSNORM_F32));
  cfg.eps = 1e-6;
  rmsnorm_quant_init(&q, RMSNORM_QF_Q8_0);
  size_t row_bytes = 0, row_scales = 1;
  TU_OK(rmsnorm_quant_row_size(&q, D, &row_bytes, &row_scales));
  tu_check(row_bytes == NB * BLOCK_BYTES && row_scales == 0, "Q8_0 row: %zu bytes, %zu scales",
           row_bytes, row_scales);
  TU_OK(rmsnorm_forward(ctx, &cfg, ROWS, D, x, D, g, NULL, y, D, NULL));
  TU_OK(rmsnorm_forward_quantized(ctx, &cfg, ROWS, D, x, D, g, NULL, &q, yq, row_bytes, NULL, 0,
                                  NULL));
  rmsnorm_context_free(ctx);
  for (int o = 0; o < N; o++)
    for (int k = 0; k < NB; k++) q8_0_block(&wt[o][k * QK], &wq[o][k * BLOCK_BYTES]);

  /* the premise: every stored delta is a normal fp16 and every value is
   * within E of delta q */
  long premise_bad = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int r = 0; r < (pass ? N : ROWS); r++)
      for (int k = 0; k < NB; k++) {
        const unsigned char *b = pass ? &wq[r][k * BLOCK_BYTES] : &yq[r][k * BLOCK_BYTES];
        const float *v = pass ? &wt[r][k * QK] : &y[r][k * QK];
        double delta = delta_of(b), e = code_error(delta);
        premise_bad += !(delta >= 0x1p-14);
        for (int j = 0; j < QK; j++)
          premise_bad += !(fabs(v[j] - delta * (signed char)b[2 + j]) <= e);
      }
  tu_check(premise_bad == 0, "%ld values or scales outside the bound's premise", premise_bad);
  /* Y and W take the same rule: the library's blocks are this file's
   * quantizer's on rmsnorm_forward's y, byte for byte */
  long differ = 0;
  for (int i = 0; i < ROWS; i++)
    for (int k = 0; k < NB; k++) {
      unsigned char mine[BLOCK_BYTES];
      q8_0_block(&y[i][k * QK], mine);
      differ += memcmp(mine, &yq[i][k * BLOCK_BYTES], BLOCK_BYTES) != 0;
    }
  tu_check(differ == 0, "%ld of Y's Q8_0 blocks differ from ggml's rule applied here", differ);

  const double u = 0x1p-24, gamma_nb = NB * u / (1 - NB * u);
  const double gamma_d64 = D * 0x1p-53 / (1 - D * 0x1p-53);
  double worst = 0, worst_rel = 0;
  for (int i = 0; i < ROWS; i++)
    for (int o = 0; o < N; o++) {
      double z = 0, sum_abs = 0, bound = 0, float_terms = 0;
      for (int j = 0; j < D; j++) {
        z += (double)y[i][j] * w[j][o];
        sum_abs += fabs((double)y[i][j] * w[j][o]);
      }
      float zq = 0;
      for (int k = 0; k < NB; k++) {
        const unsigned char *a = &yq[i][k * BLOCK_BYTES], *b = &wq[o][k * BLOCK_BYTES];
        int32_t s = 0;
        for (int j = 0; j < QK; j++) s += (signed char)a[2 + j] * (signed char)b[2 + j];
        float scale = delta_of(a) * delta_of(b);
        zq += (float)s * scale;
        float_terms += fabs((double)s * scale);
        double ey = code_error(delta_of(a)), ew = code_error(delta_of(b));
        for (int j = k * QK; j < (k + 1) * QK; j++)
          bound += ey * fabs(w[j][o]) + ew * fabs(y[i][j]) + ey * ew;
      }
      bound += gamma_nb * float_terms + gamma_d64 * sum_abs;
      double err = fabs((double)zq - z);
      tu_check(err <= bound, "Z[%d][%d]: Q8_0 %.9g, float64 %.9g: error %.3g past the bound %.3g",
               i, o, zq, z, err, bound);
      worst = fmax(worst, err / bound);
      worst_rel = fmax(worst_rel, err / sum_abs);
    }
  printf("Q8_0 Z = Y W, d = %d, %d x %d: largest error %.2f of its bound, %.2e of sum |y w|\n", D,
         ROWS, N, worst, worst_rel);
}

int main(void) {
  test_q8_dot();
  return tu_finish("q8_dot");
}
