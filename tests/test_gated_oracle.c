/* test_gated_oracle.c - holds the gated RMSNorm oracle (gated_oracle.h) to
 * central finite differences of its own forward in long double, for both gate
 * orders, SiLU and sigmoid, grouped and whole-row statistics, with an outlier
 * channel: the oracle the gated kernels are judged against must itself be
 * right, grouped backward above all (a backward that sums the statistic's
 * term over the whole row instead of the group fails here). */
#include <math.h>
#include <stdio.h>

#include "check.h"
#include "gated_oracle.h"

static unsigned long long state = 0x243f6a8885a308d3ull;
static gl_t uniform(void) { /* [-1, 1) */
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return (gl_t)(state >> 11) * 0x1p-52L - 1;
}

/* L = sum_j c_j y_j over one row */
static gl_t loss(const gl_t *x, const gl_t *z, const gl_t *w, const gl_t *c, size_t d,
                 const gated_opts *o) {
  gl_t y[GATED_ORACLE_MAX_D], r[GATED_ORACLE_MAX_D], L = 0;
  gated_forward_row(x, z, w, d, o, y, r);
  for (size_t j = 0; j < d; j++) L += c[j] * y[j];
  return L;
}

/* dL/dv_i by a central difference of step h |v_i| (h for v_i = 0) */
static gl_t fd(gl_t *v, size_t i, const gl_t *x, const gl_t *z, const gl_t *w, const gl_t *c,
               size_t d, const gated_opts *o) {
  gl_t keep = v[i], h = 1e-7L * (fabsl(keep) > 1 ? fabsl(keep) : 1);
  v[i] = keep + h;
  gl_t up = loss(x, z, w, c, d, o);
  v[i] = keep - h;
  gl_t down = loss(x, z, w, c, d, o);
  v[i] = keep;
  return (up - down) / (2 * h);
}

static int close_to(gl_t got, gl_t want, gl_t scale) {
  return fabsl(got - want) <= 1e-7L * scale;
}

static void check_case(size_t d, size_t group, int sigmoid, int norm_first) {
  gated_opts o = {group, 1e-5L, sigmoid, norm_first};
  gl_t x[256] = {0}, z[256] = {0}, w[256] = {0}, c[256] = {0}, dx[256], dz[256];
  gl_t dw[256] = {0}, dw1[256] = {0};
  for (size_t j = 0; j < d; j++) {
    x[j] = uniform(), z[j] = 3 * uniform(), w[j] = 1 + 0.5L * uniform(), c[j] = uniform();
  }
  x[d / 3] *= 25; /* an outlier channel */
  gated_backward_row(x, z, w, c, d, &o, dx, dz, dw);
  gl_t sx = 0, sz = 0, sw = 0; /* the gradients' scale, for a relative bound */
  for (size_t j = 0; j < d; j++) {
    sx = fmaxl(sx, fabsl(dx[j])), sz = fmaxl(sz, fabsl(dz[j])), sw = fmaxl(sw, fabsl(dw[j]));
  }
  for (size_t j = 0; j < d; j++) {
    const char *mode = norm_first ? "norm first" : "gate first";
    const char *act = sigmoid ? "sigmoid" : "silu";
    tu_check(close_to(dx[j], fd(x, j, x, z, w, c, d, &o), sx), "dx d=%zu g=%zu %s %s j=%zu", d,
             group, mode, act, j);
    tu_check(close_to(dz[j], fd(z, j, x, z, w, c, d, &o), sz), "dz d=%zu g=%zu %s %s j=%zu", d,
             group, mode, act, j);
    tu_check(close_to(dw[j], fd(w, j, x, z, w, c, d, &o), sw), "dw d=%zu g=%zu %s %s j=%zu", d,
             group, mode, act, j);
  }
  /* dw accumulates: a second row's call adds its own term */
  gated_backward_row(x, z, w, c, d, &o, dx, dz, dw1);
  gated_backward_row(x, z, w, c, d, &o, dx, dz, dw1);
  for (size_t j = 0; j < d; j++)
    tu_check(fabsl(dw1[j] - 2 * dw[j]) <= 1e-15L * sw, "dw accumulates d=%zu j=%zu", d, j);
}

int main(void) {
  static const size_t shapes[][2] = {{32, 32}, {64, 32}, {96, 32}, {128, 64}, {256, 128},
                                     {64, 64}, {256, 256}, {7, 7}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int sigmoid = 0; sigmoid < 2; sigmoid++)
      for (int norm_first = 0; norm_first < 2; norm_first++)
        check_case(shapes[s][0], shapes[s][1], sigmoid, norm_first);
  return tu_summary("gated_oracle");
}
