/* seed_example.c - the worked example: RMSNorm of two tokens' hidden states
 * (hidden size 4) with eps = 1e-5, printed with 6 decimals. Uses only the
 * public header, as any program linking the installed library would. */
#include <stdio.h>

#include "rmsnorm.h"

#define ROWS 2
#define D 4

static int fail(const char *what, rmsnorm_status st) {
  fprintf(stderr, "seed_example: %s: %s\n", what, rmsnorm_status_message(st));
  return 1;
}

int main(void) {
  const float x[ROWS][D] = {{2.0f, -1.0f, 0.0f, 3.0f}, {0.5f, 1.5f, -2.0f, 1.0f}};
  float y[ROWS][D], rstd[ROWS];
  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  rmsnorm_status st;

  if ((st = rmsnorm_context_create(&ctx)) != RMSNORM_OK) return fail("context", st);
  if ((st = rmsnorm_config_init(&cfg, RMSNORM_F32)) != RMSNORM_OK) return fail("config", st);
  cfg.eps = 1e-5;
  /* no weight, no bias: y = x / RMS(x), RMS(x) = sqrt(mean(x^2) + eps) */
  st = rmsnorm_forward(ctx, &cfg, ROWS, D, x, D, NULL, NULL, y, D, rstd);
  rmsnorm_context_free(ctx);
  if (st != RMSNORM_OK) return fail("forward", st);

  printf("librmsnorm %s: RMSNorm of the seed example, eps = 1e-5\n", rmsnorm_version_string());
  for (int i = 0; i < ROWS; i++) {
    printf("row %d: x =", i + 1);
    for (int j = 0; j < D; j++) printf(" %9.6f", x[i][j]);
    printf("   RMS = %.6f\n       y =", 1.0 / rstd[i]);
    for (int j = 0; j < D; j++) printf(" %9.6f", y[i][j]);
    printf("\n");
  }
  return 0;
}
