/* test_norm.c - forward, backward, layernorm and layernorm-backward over an
 * option matrix, every dtype: bit for bit with the library, near the oracle. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_fixture.h"

typedef struct tcase {
  const char *cmd;
  norm_opts o;
  int weight;     /* 0 none, 1 in the data's dtype, 2 float32 */
  int bias;       /* as weight (the same as the weight's when both are given) */
  int stats;      /* forward: --rstd, and --mean for layernorm */
  int grads;      /* backward: 1 --dbias, 2 --dweight --dbias, 3 --dweight */
} tcase;

static const tcase cases[] = {
  {"forward", {0, -1, 0, 0, 0}, 0, 0, 0, 0},
  {"forward", {0, 0.25, 0, 0, 0}, 1, 1, 1, 0},
  {"forward", {0, 0.25, 1, 0, 0}, 2, 2, 1, 0},
  {"forward", {0, 0.01, 0, 1, 0.5}, 1, 0, 1, 0},
  {"forward", {0, 0.25, 1, 0, 0.3}, 0, 0, 1, 0},
  {"forward", {2, 0.25, 0, 0, 0}, 1, 1, 1, 0},
  {"forward", {3, -1, 0, 0, 0.3}, 0, 0, 1, 0},
  {"forward", {0, 0, 0, 0, 0}, 0, 2, 1, 0},
  {"backward", {0, -1, 0, 0, 0}, 0, 0, 0, 1},
  {"backward", {0, 0.25, 0, 0, 0}, 1, 1, 0, 2},
  {"backward", {0, 0.25, 1, 0, 0}, 2, 0, 0, 2},
  {"backward", {0, 0.01, 0, 1, 0.5}, 1, 0, 0, 3},
  {"backward", {0, 0.25, 1, 1, 0.3}, 2, 0, 0, 2},
  {"backward", {2, 0.25, 0, 0, 0}, 2, 2, 0, 2},
  {"backward", {3, 0, 0, 0, 0}, 1, 0, 0, 3},
  {"layernorm", {0, -1, 0, 0, 0}, 0, 0, 1, 0},
  {"layernorm", {0, 0.25, 0, 0, 0}, 1, 1, 1, 0},
  {"layernorm", {0, 1e-5, 0, 1, 0}, 2, 2, 1, 0},
  {"layernorm", {2, 0.25, 0, 0, 0}, 1, 1, 1, 0},
  {"layernorm", {0, 0.25, 0, 0, 0}, 0, 1, 0, 0},
  {"layernorm-backward", {0, -1, 0, 0, 0}, 0, 0, 0, 1},
  {"layernorm-backward", {0, 0.25, 0, 0, 0}, 1, 1, 0, 2},
  {"layernorm-backward", {0, 1e-5, 0, 1, 0}, 2, 0, 0, 2},
  {"layernorm-backward", {3, 0.25, 0, 0, 0}, 1, 0, 0, 3},
};

/* Tolerance against the oracle for results stored in dt. */

static void run_case(const tcase *c, tdt dt, const size_t *xshape, int xndim) {
  int backward = strstr(c->cmd, "backward") != NULL, ln = !strncmp(c->cmd, "layernorm", 9);
  int k = c->o.dims ? c->o.dims : 1, lead = xndim - k;
  char label[160];
  snprintf(label, sizeof label, "%s %s dims=%d eps=%g%s%s p=%g w=%d b=%d", c->cmd, tdt_name[dt],
           k, c->o.eps, c->o.eps_outside ? " eps-outside" : "", c->o.offset ? " offset" : "",
           c->o.partial, c->weight, c->bias);
  size_t rows = 1, d = 1;
  for (int i = 0; i < lead; i++) rows *= xshape[i];
  for (int i = lead; i < xndim; i++) d *= xshape[i];
  tdt pdt = c->weight ? (c->weight == 2 ? TF32 : dt) : c->bias ? (c->bias == 2 ? TF32 : dt) : dt;

  arr x = npy_fixture("x.npy", dt, xndim, xshape, FILL_DATA);
  arr dy = npy_fixture("dy.npy", dt, xndim, xshape, FILL_DATA);
  arr w = npy_fixture("w.npy", pdt, k, xshape + lead, c->o.offset ? FILL_OFFSET_GAIN : FILL_GAIN);
  arr b = npy_fixture("b.npy", pdt, k, xshape + lead, FILL_DATA);

  const char *args[40];
  int n = 0;
  norm_opts_text opt_text;
  args[n++] = c->cmd;
  args[n++] = "x.npy";
  if (backward) args[n++] = "dy.npy";
  args[n++] = "-o";
  args[n++] = "out.npy";
  if (c->stats && ln) args[n++] = "--mean", args[n++] = "mean.npy";
  if (c->stats) args[n++] = "--rstd", args[n++] = "rstd.npy";
  if (c->grads & 2) args[n++] = "--dweight", args[n++] = "dw.npy";
  if (c->grads & 1) args[n++] = "--dbias", args[n++] = "db.npy";
  if (c->weight) args[n++] = "--weight", args[n++] = "w.npy";
  if (c->bias) args[n++] = "--bias", args[n++] = "b.npy";
  norm_opts_args(&c->o, dt, args, n, &opt_text);
  const char *outs[] = {"out.npy", "mean.npy", "rstd.npy", "dw.npy", "db.npy"};
  for (int i = 0; i < 5; i++) unlink(outs[i]);

  if (!run_ok(label, args)) goto done;

  /* the library, called directly on the same bytes */
  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  rmsnorm_context_create(&ctx);
  norm_opts_config(&c->o, dt, pdt, &cfg);
  size_t acc = dt == TF64 ? 8 : 4;
  unsigned char *ly = calloc(x.n + 1, tdt_size[dt]), *lmean = calloc(rows + 1, acc),
                *lrstd = calloc(rows + 1, acc), *ldw = calloc(d + 1, tdt_size[pdt]),
                *ldb = calloc(d + 1, tdt_size[pdt]);
  const void *wp = c->weight ? w.bytes : NULL, *bp = c->bias ? b.bytes : NULL;
  rmsnorm_status st;
  if (!strcmp(c->cmd, "forward"))
    st = rmsnorm_forward(ctx, &cfg, rows, d, x.bytes, d, wp, bp, ly, d, c->stats ? lrstd : NULL);
  else if (!strcmp(c->cmd, "backward"))
    st = rmsnorm_backward(ctx, &cfg, rows, d, x.bytes, d, dy.bytes, d, wp, NULL, ly, d,
                          c->grads & 2 ? ldw : NULL, c->grads & 1 ? ldb : NULL);
  else if (!strcmp(c->cmd, "layernorm"))
    st = rmsnorm_layernorm_forward(ctx, &cfg, rows, d, x.bytes, d, wp, bp, ly, d,
                                   c->stats ? lmean : NULL, c->stats ? lrstd : NULL);
  else
    st = rmsnorm_layernorm_backward(ctx, &cfg, rows, d, x.bytes, d, dy.bytes, d, wp, NULL, NULL,
                                    ly, d, c->grads & 2 ? ldw : NULL, c->grads & 1 ? ldb : NULL);
  rmsnorm_context_free(ctx);
  tu_check(st == RMSNORM_OK, "%s: library: %s", label, rmsnorm_status_name(st));

  /* the oracle */
  oracle_cfg oc = norm_opts_oracle(&c->o, dt, ln);
  ld *oy = calloc(x.n + 1, sizeof(ld)), *om = calloc(rows + 1, sizeof(ld)),
     *orr = calloc(rows + 1, sizeof(ld)), *odw = calloc(d + 1, sizeof(ld)),
     *odb = calloc(d + 1, sizeof(ld));
  if (backward)
    oracle_backward(&oc, rows, d, x.v, dy.v, c->weight ? w.v : NULL, oy, odw, odb);
  else
    oracle_forward(&oc, rows, d, x.v, c->weight ? w.v : NULL, c->bias ? b.v : NULL, oy, om, orr);

  arr got;
  double tol = tol_of(dt);
  if (read_npy("out.npy", dt, xndim, xshape, &got)) {
    tu_check(!memcmp(got.bytes, ly, x.n * tdt_size[dt]), "%s: output differs from the library", label);
    close_all(label, &got, oy, x.n, backward ? 4 * tol : tol);
    arr_free(&got);
  }
  /* statistics: float32 files; the library's float, or its double rounded */
  const char *stat_files[2] = {"mean.npy", "rstd.npy"};
  unsigned char *stat_lib[2] = {lmean, lrstd};
  ld *stat_oracle[2] = {om, orr};
  for (int s = ln ? 0 : 1; c->stats && s < 2; s++) {
    if (!read_npy(stat_files[s], TF32, lead, xshape, &got)) continue;
    for (size_t i = 0; i < rows; i++) {
      float want = acc == 8 ? (float)((double *)(void *)stat_lib[s])[i]
                            : ((float *)(void *)stat_lib[s])[i];
      float have;
      memcpy(&have, got.bytes + 4 * i, 4);
      tu_check(memcmp(&want, &have, 4) == 0, "%s: %s[%zu] %g, library %g", label, stat_files[s], i,
            have, want);
    }
    close_all(stat_files[s], &got, stat_oracle[s], rows, 1e-5);
    arr_free(&got);
  }
  /* gradients of the parameters: the normalized shape, the weight's dtype */
  const char *grad_files[2] = {"dw.npy", "db.npy"};
  unsigned char *grad_lib[2] = {ldw, ldb};
  ld *grad_oracle[2] = {odw, odb};
  for (int g = 0; g < 2; g++) {
    if (!(c->grads & (g == 0 ? 2 : 1))) {
      tu_check(!file_exists(grad_files[g]), "%s: %s written unasked", label, grad_files[g]);
      continue;
    }
    if (!read_npy(grad_files[g], pdt, k, xshape + lead, &got)) continue;
    tu_check(!memcmp(got.bytes, grad_lib[g], d * tdt_size[pdt]), "%s: %s differs from the library",
          label, grad_files[g]);
    close_all(grad_files[g], &got, grad_oracle[g], d, 4 * tol_of(pdt));
    arr_free(&got);
  }
  free(ly), free(lmean), free(lrstd), free(ldw), free(ldb);
  free(oy), free(om), free(orr), free(odw), free(odb);
done:
  arr_free(&x), arr_free(&dy), arr_free(&w), arr_free(&b);
}

static void test_matrix(void) {
  static const size_t shape[3] = {3, 5, 8};
  for (int dt = TF32; dt <= TF64; dt++)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], (tdt)dt, shape, 3);
  /* one axis (the statistics are 0-d), and no rows at all */
  static const size_t one[1] = {16}, none[2] = {0, 8};
  static const tcase fwd = {"forward", {0, 1e-3, 0, 0, 0}, 1, 1, 1, 0};
  static const tcase bwd = {"backward", {0, 1e-3, 0, 0, 0}, 1, 0, 0, 2};
  static const tcase lnf = {"layernorm", {0, 1e-3, 0, 0, 0}, 1, 1, 1, 0};
  static const tcase lnb = {"layernorm-backward", {0, 1e-3, 0, 0, 0}, 2, 0, 0, 2};
  const tcase *few[] = {&fwd, &bwd, &lnf, &lnb};
  for (int dt = TF32; dt <= TF64; dt++)
    for (int i = 0; i < 4; i++) {
      run_case(few[i], (tdt)dt, one, 1);
      run_case(few[i], (tdt)dt, none, 2);
    }
}

int main(int argc, char **argv) {
  cli_begin(argc, argv);
  test_matrix();
  return cli_end("cli_commands_norm");
}
