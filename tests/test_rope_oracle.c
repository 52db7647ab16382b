/* test_rope_oracle.c - holds the QK-norm + RoPE oracle (rope_oracle.h) to
 * what it stands for, in long double:
 *   - its rotation against complex multiplication: for a pair (a, b) of
 *     frequency i, y_a + i y_b = (n_a + i n_b) e^(i p theta_i), with the
 *     angle's cos and sin from cosl/sinl, NeoX and GPT-J pairs;
 *   - its backward (dx and dw) against central finite differences of its
 *     own forward, both styles, full and partial rotation, with an outlier
 *     channel, per row and per token (one statistic over a token's heads):
 *     the kernels are judged against this oracle, so it must be right
 *     first. */
#include <math.h>
#include <stdio.h>

#include "check.h"
#include "rope_oracle.h"

static unsigned long long state = 0x13198a2e03707344ull;
static ro_t uniform(void) { /* [-1, 1) */
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return (ro_t)(state >> 11) * 0x1p-52L - 1;
}

/* the table row of position p: cos, then sin, of p theta^(-2i/rot) */
static void angles(size_t rot, ro_t p, ro_t *cs) {
  for (size_t i = 0; i < rot / 2; i++) {
    ro_t a = p * powl(10000.0L, -(ro_t)(2 * i) / (ro_t)rot);
    cs[i] = cosl(a), cs[rot / 2 + i] = sinl(a);
  }
}

static void check_rotation(size_t d, size_t rot, int gptj) {
  rope_opts o = {rot, gptj, 1e-6L};
  ro_t x[ROPE_ORACLE_MAX_D], y[ROPE_ORACLE_MAX_D], cs[ROPE_ORACLE_MAX_D], r;
  for (size_t j = 0; j < d; j++) x[j] = uniform();
  angles(rot, 37, cs);
  rope_forward_row(x, NULL, d, &o, cs, y, &r, NULL);
  ro_t ny = 0, nn = 0;
  for (size_t i = 0; i < rot / 2; i++) {
    size_t a = gptj ? 2 * i : i, b = gptj ? 2 * i + 1 : i + rot / 2;
    ro_t ang = 37 * powl(10000.0L, -(ro_t)(2 * i) / (ro_t)rot);
    ro_t c = cosl(ang), s = sinl(ang), na = x[a] * r, nb = x[b] * r;
    /* (na + i nb)(c + i s) = (na c - nb s) + i (na s + nb c) */
    tu_check(fabsl(y[a] - (na * c - nb * s)) <= 1e-15L && fabsl(y[b] - (na * s + nb * c)) <= 1e-15L,
             "rotation d=%zu rot=%zu %s pair %zu", d, rot, gptj ? "gptj" : "neox", i);
  }
  for (size_t j = 0; j < d; j++) ny += y[j] * y[j], nn += x[j] * r * x[j] * r;
  tu_check(fabsl(ny - nn) <= 1e-15L * nn, "rotation d=%zu rot=%zu keeps the norm", d, rot);
  for (size_t j = rot; j < d; j++)
    tu_check(y[j] == x[j] * r, "d=%zu rot=%zu: column %zu passes through", d, rot, j);
}

/* L = sum_j c_j y_j over one row */
static ro_t loss(const ro_t *x, const ro_t *w, const ro_t *c, size_t d, const rope_opts *o,
                 const ro_t *cs) {
  ro_t y[ROPE_ORACLE_MAX_D], r, L = 0;
  rope_forward_row(x, w, d, o, cs, y, &r, NULL);
  for (size_t j = 0; j < d; j++) L += c[j] * y[j];
  return L;
}

/* dL/dv_i by a central difference */
static ro_t fd(ro_t *v, size_t i, const ro_t *x, const ro_t *w, const ro_t *c, size_t d,
               const rope_opts *o, const ro_t *cs) {
  ro_t keep = v[i], h = 1e-7L * (fabsl(keep) > 1 ? fabsl(keep) : 1);
  v[i] = keep + h;
  ro_t up = loss(x, w, c, d, o, cs);
  v[i] = keep - h;
  ro_t down = loss(x, w, c, d, o, cs);
  v[i] = keep;
  return (up - down) / (2 * h);
}

static void check_grad(size_t d, size_t rot, int gptj, ro_t pos) {
  rope_opts o = {rot, gptj, 1e-5L};
  ro_t x[ROPE_ORACLE_MAX_D] = {0}, w[ROPE_ORACLE_MAX_D] = {0}, c[ROPE_ORACLE_MAX_D] = {0};
  ro_t cs[ROPE_ORACLE_MAX_D];
  ro_t dx[ROPE_ORACLE_MAX_D], dw[ROPE_ORACLE_MAX_D] = {0};
  for (size_t j = 0; j < d; j++) x[j] = uniform(), w[j] = 1 + 0.5L * uniform(), c[j] = uniform();
  x[d / 3] *= 25; /* an outlier channel */
  angles(rot, pos, cs);
  rope_backward_row(x, w, c, d, &o, cs, dx, dw);
  ro_t sx = 0, sw = 0;
  for (size_t j = 0; j < d; j++) sx = fmaxl(sx, fabsl(dx[j])), sw = fmaxl(sw, fabsl(dw[j]));
  for (size_t j = 0; j < d; j++) {
    const char *st = gptj ? "gptj" : "neox";
    tu_check(fabsl(dx[j] - fd(x, j, x, w, c, d, &o, cs)) <= 1e-7L * sx,
             "dx d=%zu rot=%zu %s p=%Lg j=%zu", d, rot, st, pos, j);
    tu_check(fabsl(dw[j] - fd(w, j, x, w, c, d, &o, cs)) <= 1e-7L * sw,
             "dw d=%zu rot=%zu %s p=%Lg j=%zu", d, rot, st, pos, j);
  }
}

/* The per-token oracle: its backward against central differences of its
 * forward (L = sum_j c_j y_j over the token), and with one head its
 * results equal the per-row oracle's. */
static ro_t loss_token(const ro_t *x, const ro_t *w, const ro_t *c, size_t H, size_t d,
                       const rope_opts *o, const ro_t *cs) {
  static ro_t y[ROPE_ORACLE_MAX_N];
  ro_t r, L = 0;
  rope_forward_token(x, w, H, d, o, cs, y, &r, NULL);
  for (size_t j = 0; j < H * d; j++) L += c[j] * y[j];
  return L;
}

static void check_token(size_t H, size_t d, size_t rot, int gptj) {
  rope_opts o = {rot, gptj, 1e-5L};
  static ro_t x[ROPE_ORACLE_MAX_N], w[ROPE_ORACLE_MAX_N], c[ROPE_ORACLE_MAX_N],
      dx[ROPE_ORACLE_MAX_N], dw[ROPE_ORACLE_MAX_N];
  ro_t cs[ROPE_ORACLE_MAX_D];
  size_t D = H * d;
  for (size_t j = 0; j < D; j++)
    x[j] = uniform(), w[j] = 1 + 0.5L * uniform(), c[j] = uniform(), dw[j] = 0;
  x[D / 3] *= 25;
  angles(rot, 7, cs);
  rope_backward_token(x, w, c, H, d, &o, cs, dx, dw);
  ro_t sx = 0, sw = 0;
  for (size_t j = 0; j < D; j++) sx = fmaxl(sx, fabsl(dx[j])), sw = fmaxl(sw, fabsl(dw[j]));
  for (size_t j = 0; j < D; j++) {
    ro_t *vs[2] = {x, w};
    for (int which = 0; which < 2; which++) {
      ro_t *v = vs[which], keep = v[j], h = 1e-7L * (fabsl(keep) > 1 ? fabsl(keep) : 1);
      v[j] = keep + h;
      ro_t up = loss_token(x, w, c, H, d, &o, cs);
      v[j] = keep - h;
      ro_t down = loss_token(x, w, c, H, d, &o, cs);
      v[j] = keep;
      ro_t fdv = (up - down) / (2 * h), an = which ? dw[j] : dx[j];
      tu_check(fabsl(an - fdv) <= 1e-7L * (which ? sw : sx),
               "token H=%zu d=%zu rot=%zu %s d%s[%zu]", H, d, rot, gptj ? "gptj" : "neox",
               which ? "w" : "x", j);
    }
  }
  if (H == 1) { /* one head: the per-row oracle */
    ro_t y1[ROPE_ORACLE_MAX_D], y2[ROPE_ORACLE_MAX_D], r1, r2;
    rope_forward_token(x, w, 1, d, &o, cs, y1, &r1, NULL);
    rope_forward_row(x, w, d, &o, cs, y2, &r2, NULL);
    int same = r1 == r2;
    for (size_t j = 0; j < d; j++) same &= y1[j] == y2[j];
    tu_check(same, "token of one head d=%zu: the per-row oracle", d);
  }
}

int main(void) {
  static const size_t shapes[][2] = {{2, 2}, {8, 8}, {13, 6}, {64, 64}, {64, 32}, {128, 128},
                                     {128, 32}, {256, 64}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int gptj = 0; gptj < 2; gptj++) {
      check_rotation(shapes[s][0], shapes[s][1], gptj);
      check_grad(shapes[s][0], shapes[s][1], gptj, 5);
      check_grad(shapes[s][0], shapes[s][1], gptj, 3001);
    }
  static const size_t tokens[][3] = {{1, 16, 16}, {3, 8, 8}, {4, 16, 6}, {2, 13, 12}};
  for (size_t s = 0; s < sizeof tokens / sizeof tokens[0]; s++)
    for (int gptj = 0; gptj < 2; gptj++)
      check_token(tokens[s][0], tokens[s][1], tokens[s][2], gptj);
  return tu_summary("rope_oracle");
}
