/* test_seed.c - the seed's worked example, to 6 decimals: X (2 tokens,
 * hidden size 4), eps = 1e-5, no weight. */
#include "testutil.h"

static void check_seed(rmsnorm_dtype dt) {
  const double xv[2][4] = {{2.0, -1.0, 0.0, 3.0}, {0.5, 1.5, -2.0, 1.0}};
  const double rms[2] = {1.870831, 1.369310};
  const double want[2][4] = {{1.069043, -0.534522, 0.000000, 1.603565},
                             {0.365147, 1.095442, -1.460590, 0.730295}};
  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  TU_OK(rmsnorm_context_create(&ctx));
  TU_OK(rmsnorm_config_init(&cfg, dt));
  cfg.eps = 1e-5;
  tu_tensor x = tu_alloc(dt, 2, 4, 4), y = tu_alloc(dt, 2, 4, 4);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) tu_set(&x, i, j, xv[i][j]);
  double rstd[2];
  TU_OK(rmsnorm_forward(ctx, &cfg, 2, 4, x.data, 4, NULL, NULL, y.data, 4, rstd));
  /* fp32/fp64: six decimals; the 16-bit types hold about 3 */
  double tol = dt == RMSNORM_F32 || dt == RMSNORM_F64 ? 5e-7 : dt == RMSNORM_F16 ? 2e-3 : 1e-2;
  int f64 = rn_acc_is_f64(dt);
  for (int i = 0; i < 2; i++) {
    double r = rn_load_acc(rstd, f64, i);
    tu_check(fabs(1.0 / r - rms[i]) < 5e-7, "%s row %d RMS %.7f want %.6f", tu_dtype_name(dt),
             i, 1.0 / r, rms[i]);
    for (int j = 0; j < 4; j++)
      tu_check(fabs(tu_get(&y, i, j) - want[i][j]) < tol, "%s y[%d][%d] = %.7f want %.6f",
               tu_dtype_name(dt), i, j, tu_get(&y, i, j), want[i][j]);
  }
  /* mean of squares: 1/r^2 - eps */
  tu_check(fabs(1.0 / (rn_load_acc(rstd, f64, 0) * rn_load_acc(rstd, f64, 0)) - 1e-5 - 3.5) < 1e-5,
           "mean of squares row 1");
  tu_free(&x), tu_free(&y);
  rmsnorm_context_free(ctx);
}

int main(void) {
  for (int dt = 0; dt < 4; dt++) check_seed((rmsnorm_dtype)dt);
  return tu_finish("test_seed");
}
