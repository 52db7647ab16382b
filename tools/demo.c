/* demo.c - `rmsnorm demo`: the seed's worked example, one step at a time,
 * every number computed by the library (in float64, so the printed six
 * decimals are exact) and explained in a line; then its Z = Y W again in
 * 8 bits (ggml's Q8_0) as CPU inference engines compute it. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "rmsnorm.h"

#define ROWS 2
#define D 4
#define OUT 3

/* x: (ROWS, D), the seed's hidden states of two tokens */
static const double demo_x[ROWS][D] = {{2.0, -1.0, 0.0, 3.0}, {0.5, 1.5, -2.0, 1.0}};
/* g: (D,), chosen: a gain that started at 1 and has drifted halfway through training */
static const double demo_g[D] = {1.15, 0.85, 1.05, 0.92};
/* W: (D, OUT), chosen: a small projection of the next linear layer */
static const double demo_w[D][OUT] = {
  {0.50, -0.25, 0.10}, {-0.30, 0.80, 0.20}, {0.15, 0.05, -0.60}, {0.40, 0.30, 0.25}};

static void print_row(const char *label, const double *v, size_t n) {
  printf("     %-10s", label);
  for (size_t j = 0; j < n; j++) printf(" %10.6f", v[j]);
  printf("\n");
}

static int check(rmsnorm_status st, const char *what) {
  if (st == RMSNORM_OK) return 0;
  rn_cli_error("demo: %s: %s (%s)", what, rmsnorm_status_message(st), rmsnorm_status_name(st));
  return -1;
}

/* ---- Q8_0: per block of 32 values an fp16 scale d and 32 int8 codes ------ */

#define QK 32 /* Q8_0's block */
#define Q8_0_BYTES 34

/* float -> IEEE half bits, round to nearest even (d is >= 0 and finite
 * here; overflow gives infinity, tiny values subnormals) */
static uint16_t half_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7fffffffu;
  if (mag >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* >= 65536: inf */
  if (mag < 0x38800000u) {                                   /* below 2^-14: subnormal */
    float a = fabsf(f) * 0x1p24f;                            /* in units of 2^-24, exact */
    return (uint16_t)(sign | (uint32_t)nearbyintf(a));       /* nearest even */
  }
  uint32_t h = (mag - 0x38000000u) >> 13, rest = mag & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* may carry into the exponent */
  return (uint16_t)(sign | h);
}

static float half_value(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m + 1024), e - 25);
  return h & 0x8000u ? -v : v;
}

/* One Q8_0 block of v[0..32) as ggml's quantize_row_q8_0 writes it:
 * d = amax/127 (stored as fp16), q = roundf(v * (1/d)) with the unrounded d. */
static void q8_0_block(const float *v, unsigned char *out) {
  float amax = 0;
  for (int j = 0; j < QK; j++) amax = fabsf(v[j]) > amax ? fabsf(v[j]) : amax;
  float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
  uint16_t h = half_bits(d);
  out[0] = (unsigned char)(h & 0xff), out[1] = (unsigned char)(h >> 8);
  for (int j = 0; j < QK; j++) out[2 + j] = (unsigned char)(signed char)roundf(v[j] * id);
}

static float block_d(const unsigned char *b) { return half_value((uint16_t)(b[0] | b[1] << 8)); }

/* The dot product of two rows of nb Q8_0 blocks as ggml's vec_dot_q8_0_q8_0
 * computes it: per block the integer sum of q_a q_b, scaled by d_a d_b, the
 * blocks summed in float. */
static float q8_0_dot(const unsigned char *a, const unsigned char *b, size_t nb) {
  float sum = 0;
  for (size_t k = 0; k < nb; k++, a += Q8_0_BYTES, b += Q8_0_BYTES) {
    int32_t si = 0;
    for (int j = 0; j < QK; j++) si += (signed char)a[2 + j] * (signed char)b[2 + j];
    sum += (float)si * (block_d(a) * block_d(b));
  }
  return sum;
}

/* Step 6: Z = Y W with Y and W in Q8_0. The hidden size 4 is less than a
 * block: each row is padded with zeros to 32, and normed over its first 4
 * only (pRMSNorm with partial = 4/32), so r and the 4 values of y are the
 * unpadded ones; a zero codes as 0 and adds 0 to every dot product. */
static int run_q8(rmsnorm_context *ctx, double z[ROWS][OUT]) {
  double xp[ROWS][QK] = {{0}}, gp[QK] = {0};
  unsigned char yq[ROWS][Q8_0_BYTES], wq[OUT][Q8_0_BYTES];
  char label[32];
  for (int i = 0; i < ROWS; i++) memcpy(xp[i], demo_x[i], sizeof demo_x[i]);
  memcpy(gp, demo_g, sizeof demo_g);
  rmsnorm_config cfg;
  rmsnorm_quant q;
  if (check(rmsnorm_config_init(&cfg, RMSNORM_F64), "config")) return -1;
  cfg.eps = 1e-5;
  cfg.partial = (double)D / QK;
  rmsnorm_quant_init(&q, RMSNORM_QF_Q8_0);
  if (check(rmsnorm_forward_quantized(ctx, &cfg, ROWS, QK, xp, QK, gp, NULL, &q, yq, Q8_0_BYTES,
                                      NULL, 0, NULL),
            "forward_quantized"))
    return -1;
  /* W's columns are what each z meets: a row of W^T, zero-padded, one block */
  for (int o = 0; o < OUT; o++) {
    float col[QK] = {0};
    for (int j = 0; j < D; j++) col[j] = (float)demo_w[j][o];
    q8_0_block(col, wq[o]);
  }

  printf("\n6. The same Z in 8 bits, as CPU inference engines run this layer: ggml's\n"
         "   Q8_0 keeps, per block of 32 values, one fp16 scale d = max|v|/127 and 32\n"
         "   int8 codes q = round(v/d), so v ~ d q. The hidden size 4 is less than a\n"
         "   block: each row is padded with 28 zeros and normed over its first 4 only\n"
         "   (partial = 4/32, the same RMS); a zero codes as 0 and adds nothing to Z.\n"
         "   Y's blocks come from rmsnorm_forward_quantized; W's columns get the\n"
         "   same rule here. Shown: d, and the codes of the 4 real values.\n");
  for (int i = 0; i < ROWS; i++) {
    snprintf(label, sizeof label, "y%d", i + 1);
    printf("     %-10s d = %.8f   q =", label, block_d(yq[i]));
    for (int j = 0; j < D; j++) printf(" %4d", (signed char)yq[i][2 + j]);
    printf("\n");
  }
  for (int o = 0; o < OUT; o++) {
    snprintf(label, sizeof label, "W col %d", o + 1);
    printf("     %-10s d = %.8f   q =", label, block_d(wq[o]));
    for (int j = 0; j < D; j++) printf(" %4d", (signed char)wq[o][2 + j]);
    printf("\n");
  }
  printf("   z = d_y d_w sum(q_y q_w): integer products summed in int32, one float\n"
         "   scale per block pair (ggml's vec_dot_q8_0_q8_0); next to Z from step 5:\n");
  double err = 0, zmax = 0;
  for (int i = 0; i < ROWS; i++) {
    double z8[OUT];
    for (int o = 0; o < OUT; o++) {
      z8[o] = q8_0_dot(yq[i], wq[o], 1);
      err = fmax(err, fabs(z8[o] - z[i][o]));
      zmax = fmax(zmax, fabs(z[i][o]));
    }
    snprintf(label, sizeof label, "z%d Q8_0", i + 1);
    print_row(label, z8, OUT);
    snprintf(label, sizeof label, "z%d", i + 1);
    print_row(label, z[i], OUT);
  }
  printf("     largest difference %.1e, %.2f%% of the largest |z|\n", err, 100 * err / zmax);
  return 0;
}

static int run_demo(rmsnorm_context *ctx) {
  rmsnorm_config cfg;
  double xhat[ROWS][D], y[ROWS][D], z[ROWS][OUT], ln[ROWS][D];
  double rstd[ROWS], ln_mean[ROWS], ln_rstd[ROWS];
  char label[32];

  if (check(rmsnorm_config_init(&cfg, RMSNORM_F64), "config")) return -1;
  cfg.eps = 1e-5;
  printf("RMSNorm, step by step, on the seed example (librmsnorm %s).\n"
         "A chatbot's transformer block normalizes each token's hidden state before its\n"
         "attention and MLP layers. Every number below is computed by the library.\n\n",
         rmsnorm_version_string());

  printf("1. Hidden states X: 2 tokens (rows), hidden size 4 (columns).\n");
  for (int i = 0; i < ROWS; i++) {
    snprintf(label, sizeof label, "x%d", i + 1);
    print_row(label, demo_x[i], D);
  }

  /* no weight: y = x * r, and r = 1/sqrt(mean(x^2) + eps) comes back as rstd */
  if (check(rmsnorm_forward(ctx, &cfg, ROWS, D, demo_x, D, NULL, NULL, xhat, D, rstd),
            "forward"))
    return -1;
  printf("\n2. Each row's mean of squares, and its RMS = sqrt(mean(x^2) + eps), eps = 1e-5.\n");
  for (int i = 0; i < ROWS; i++) {
    double rms = 1.0 / rstd[i];
    printf("     row %d: mean(x^2) = %.6f   RMS = %.6f\n", i + 1, rms * rms - cfg.eps, rms);
  }

  printf("\n3. Divide each row by its RMS: every row now has RMS 1 (up to eps), whatever\n"
         "   its scale was.\n");
  for (int i = 0; i < ROWS; i++) {
    snprintf(label, sizeof label, "x%d/RMS", i + 1);
    print_row(label, xhat[i], D);
  }

  if (check(rmsnorm_forward(ctx, &cfg, ROWS, D, demo_x, D, demo_g, NULL, y, D, NULL),
            "forward with weight"))
    return -1;
  printf("\n4. Multiply by the learned gain g, one value per feature: Y = X/RMS * g.\n"
         "   The seed gives no values for g, so these were chosen for the demo: a gain\n"
         "   starts at 1 and drifts as the model trains.\n");
  print_row("g", demo_g, D);
  for (int i = 0; i < ROWS; i++) {
    snprintf(label, sizeof label, "y%d", i + 1);
    print_row(label, y[i], D);
  }

  /* Z = Y W: a plain loop, the textbook product the folded form is checked against */
  for (int i = 0; i < ROWS; i++)
    for (int o = 0; o < OUT; o++) {
      double s = 0;
      for (int j = 0; j < D; j++) s += y[i][j] * demo_w[j][o];
      z[i][o] = s;
    }
  printf("\n5. The block's next layer sees Y: a linear projection Z = Y W, with a 4 x 3\n"
         "   matrix W chosen for the demo as g was.\n");
  for (int j = 0; j < D; j++) print_row(j == 0 ? "W" : "", demo_w[j], OUT);
  for (int i = 0; i < ROWS; i++) {
    snprintf(label, sizeof label, "z%d", i + 1);
    print_row(label, z[i], OUT);
  }

  /* the same Z with the gain folded into W (FlashNorm): no Y is formed */
  double wf[D][OUT], zf[ROWS][OUT];
  if (check(rmsnorm_fold_weight(&cfg, D, OUT, demo_g, demo_w, OUT, wf, OUT), "fold_weight"))
    return -1;
  printf("\n   Folded (FlashNorm): Y W = diag(r) X diag(g) W, so fold the gain into W\n"
         "   once, W' = diag(g) W, and scale each row of X W' by its r = 1/RMS:\n"
         "   Z = diag(r) (X W'), one matrix product and no pass to form Y.\n");
  for (int j = 0; j < D; j++) print_row(j == 0 ? "W'" : "", wf[j], OUT);
  rmsnorm_status st = rmsnorm_linear_available();
  if (st == RMSNORM_OK)
    st = rmsnorm_linear_forward(ctx, &cfg, ROWS, D, OUT, demo_x, D, wf, OUT, NULL, zf, OUT, NULL);
  if (st == RMSNORM_ERROR_NOT_AVAILABLE) {
    printf("     (rmsnorm_linear_forward is not available: this librmsnorm was built\n"
           "     without a BLAS, so the folded Z is not computed here)\n");
  } else {
    if (check(st, "linear_forward")) return -1;
    double diff = 0;
    for (int i = 0; i < ROWS; i++) {
      snprintf(label, sizeof label, "z%d'", i + 1);
      print_row(label, zf[i], OUT);
      for (int o = 0; o < OUT; o++) {
        double e = zf[i][o] > z[i][o] ? zf[i][o] - z[i][o] : z[i][o] - zf[i][o];
        if (e > diff) diff = e;
      }
    }
    printf("     the same Z: largest difference from the unfolded one %.1e\n", diff);
  }

  if (run_q8(ctx, z)) return -1;

  if (check(rmsnorm_layernorm_forward(ctx, &cfg, ROWS, D, demo_x, D, NULL, NULL, ln, D, ln_mean,
                                      ln_rstd),
            "layernorm"))
    return -1;
  printf("\n7. For contrast, LayerNorm first subtracts each row's mean, then divides by\n"
         "   sqrt(var + eps): y = (x - mean) / sqrt(var + eps), eps = 1e-5.\n");
  for (int i = 0; i < ROWS; i++) {
    printf("     row %d: mean = %.6f   sqrt(var + eps) = %.6f\n", i + 1, ln_mean[i],
           1.0 / ln_rstd[i]);
    snprintf(label, sizeof label, "LN(x%d)", i + 1);
    print_row(label, ln[i], D);
  }

  /* the seed's two-element example, eps = 0 */
  const double two[2] = {3.0, 4.0};
  double rms_two[2], ln_two[2], r_two, m_two, lr_two;
  cfg.eps = 0;
  if (check(rmsnorm_forward(ctx, &cfg, 1, 2, two, 2, NULL, NULL, rms_two, 2, &r_two),
            "forward of [3, 4]") ||
      check(rmsnorm_layernorm_forward(ctx, &cfg, 1, 2, two, 2, NULL, NULL, ln_two, 2, &m_two,
                                      &lr_two),
            "layernorm of [3, 4]"))
    return -1;
  printf("\n   The seed's two-element example x = [3, 4], eps = 0:\n"
         "     RMSNorm   -> [%9.6f, %9.6f]   x / %.6f (its RMS): the direction is kept\n"
         "     LayerNorm -> [%9.6f, %9.6f]   (x - %.6f) / %.6f: the mean is gone;\n"
         "                                           of two values only their order is left\n",
         rms_two[0], rms_two[1], 1.0 / r_two, ln_two[0], ln_two[1], m_two, 1.0 / lr_two);
  return 0;
}

int rn_cli_demo(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (rn_cli_is_help(argv[i])) {
      printf("usage: rmsnorm demo\n\n"
             "Walks through RMSNorm on the seed example (2 tokens, hidden size 4): the\n"
             "mean of squares, the RMS, the normalized rows, a learned gain, a linear\n"
             "layer after it (also with the gain folded into its weights, when the\n"
             "library has a BLAS), the same layer in 8 bits (Y and W in ggml's Q8_0,\n"
             "an integer dot product per block), and LayerNorm for contrast. Takes no\n"
             "arguments.\n");
      return RN_EXIT_OK;
    }
    rn_cli_error("demo: unexpected argument '%s' (see 'rmsnorm demo --help')", argv[i]);
    return RN_EXIT_USAGE;
  }
  rmsnorm_context *ctx = NULL;
  if (check(rmsnorm_context_create(&ctx), "context")) return RN_EXIT_FAILURE;
  int rc = run_demo(ctx);
  rmsnorm_context_free(ctx);
  return rc == 0 ? RN_EXIT_OK : RN_EXIT_FAILURE;
}
