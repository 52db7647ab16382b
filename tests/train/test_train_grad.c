/* test_train_grad.c - the training demo's whole-model gradients, in double,
 * against central finite differences of its loss, for each norm choice
 * (none, LayerNorm, RMSNorm, pRMSNorm) on a tiny model: every norm gain and
 * bias and every linear bias, and a strided sample of every weight matrix and
 * embedding. The parameters are first moved off their initial values (gains
 * 1, biases 0) so that no term of the backward can hide behind a zero. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "model.h"

static double normal(uint64_t *rng) {
  double u1 = ((double)(train_rand64(rng) >> 11) + 0.5) * 0x1p-53;
  double u2 = ((double)(train_rand64(rng) >> 11) + 0.5) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static int is_small(const char *name) {
  /* gains, biases: vectors, all of them checked */
  return strstr(name, "gain") || strstr(name, "bias") || strstr(name, ".b");
}

static void check_norm(train_norm norm) {
  train_shape s;
  train_shape_default(&s);
  s.batch = 2;
  s.seq_len = 8;
  s.layers = 2;
  s.dim = 32; /* pRMSNorm p = 0.0625: the statistic over 2 of 32 channels */
  s.heads = 2;
  s.norm = norm;
  train_model *m;
  char err[256];
  if (train_model_create(&s, 1, 7, &m, err, sizeof err)) {
    tu_check(0, "%s: create: %s", train_norm_name(norm), err);
    return;
  }
  /* move every parameter: weights get larger, gains 1 + N(0, 0.3), biases N(0, 0.1) */
  uint64_t rng = 99 + (uint64_t)norm;
  size_t n = train_model_num_params(m);
  for (size_t i = 0; i < n; i++) {
    const char *name = train_model_param_name(m, i);
    double v = train_model_param(m, i);
    if (strstr(name, "gain")) v += 0.3 * normal(&rng);
    else if (is_small(name)) v += 0.1 * normal(&rng);
    else v *= 4;
    train_model_set_param(m, i, v);
  }
  int N = s.batch * s.seq_len;
  uint8_t in[64], tg[64];
  const char *text = "It was the best of times, it was the worst of times..";
  for (int i = 0; i < N; i++) {
    in[i] = (uint8_t)text[i];
    tg[i] = (uint8_t)text[i + 1];
  }
  in[3] = 0xe9; /* a byte outside ASCII */

  double loss = train_model_forward(m, in, tg);
  tu_check(isfinite(loss) && loss > 0, "%s: loss %g (want finite, > 0)", train_norm_name(norm), loss);
  if (train_model_backward(m)) {
    tu_check(0, "%s: backward: %s", train_norm_name(norm),
          train_model_error(m) ? train_model_error(m) : "?");
    train_model_free(m);
    return;
  }
  double *grad = malloc(n * sizeof *grad);
  if (!grad) abort();
  for (size_t i = 0; i < n; i++) grad[i] = train_model_grad(m, i);

  /* Per tensor: each checked element within 1e-7 + 1e-5 |g|, and the whole
   * checked part within 1e-6 relative (L2). Central differences with h = 1e-5
   * have truncation error ~h^2 and rounding error ~1e-16 * loss / h. */
  const double h = 1e-5;
  const char *tensor = NULL;
  double err2 = 0, ref2 = 0;
  size_t tensor_checked = 0;
  for (size_t i = 0; i <= n; i++) {
    const char *name = i < n ? train_model_param_name(m, i) : NULL;
    if (tensor && (!name || strcmp(name, tensor) != 0)) {
      double rel = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
      tu_check(rel <= 1e-6 && tensor_checked > 0, "%s %s (%zu elements): relative L2 error %g",
            train_norm_name(norm), tensor, tensor_checked, rel);
      err2 = ref2 = 0;
      tensor_checked = 0;
    }
    if (!name) break;
    tensor = name;
    if (!is_small(name) && i % 23 != 0) continue;
    double p = train_model_param(m, i);
    train_model_set_param(m, i, p + h);
    double up = train_model_forward(m, in, tg);
    train_model_set_param(m, i, p - h);
    double down = train_model_forward(m, in, tg);
    train_model_set_param(m, i, p);
    double fd = (up - down) / (2 * h);
    tu_check(fabs(fd - grad[i]) <= 1e-7 + 1e-5 * fabs(grad[i]),
          "%s %s (flat %zu): backward %.12g, finite difference %.12g", train_norm_name(norm), name,
          i, grad[i], fd);
    err2 += (fd - grad[i]) * (fd - grad[i]);
    ref2 += fd * fd;
    tensor_checked++;
  }
  /* the loss must come back exactly after the probes */
  double again = train_model_forward(m, in, tg);
  tu_check(again == loss, "%s: loss after the probes %.17g, before %.17g", train_norm_name(norm),
        again, loss);
  printf("%-5s: %zu parameters, loss %.6f, gradients checked\n", train_norm_name(norm), n, loss);
  free(grad);
  train_model_free(m);
}

int main(void) {
  for (int k = 0; k < 4; k++) check_norm((train_norm)k);
  return tu_summary("test_train_grad");
}
