/* rope_oracle.h - the long double oracle of QK-norm + RoPE (Qwen3's,
 * OLMo 2's and Gemma 3's attention: RMSNorm of each head of Q and K, or of
 * each token's heads together (OLMo 2), then the rotary embedding), written
 * from the models' formulas with plain sequential sums: the rotation as a
 * matrix R of cos and sin entries, and a
 * backward by the chain rule through r itself (dr/dx_j = -r^3 x_j / d) with
 * R's transpose built entry by entry, not the library's normalized form. */
#ifndef RMSNORM_ROPE_ORACLE_H
#define RMSNORM_ROPE_ORACLE_H

#include <math.h>
#include <stddef.h>

typedef long double ro_t;

/* head rows up to this long: the row buffers are on the stack */
#define ROPE_ORACLE_MAX_D 512

typedef struct rope_opts {
  size_t rot;   /* rotated columns (even, <= d) */
  int gptj;     /* pairs (2i, 2i + 1); else (i, i + rot/2) */
  ro_t eps;
} rope_opts;

/* The columns of frequency i's pair. */
static inline void rope_pair(const rope_opts *o, size_t i, size_t *a, size_t *b) {
  *a = o->gptj ? 2 * i : i;
  *b = o->gptj ? 2 * i + 1 : i + o->rot / 2;
}

/* The pair of column k: its frequency *i and the other column *m (k < rot). */
static inline void rope_partner(const rope_opts *o, size_t k, size_t *i, size_t *m) {
  size_t half = o->rot / 2;
  if (o->gptj) {
    *i = k / 2;
    *m = k ^ 1;
  } else {
    *i = k < half ? k : k - half;
    *m = k < half ? k + half : k - half;
  }
}

/* R[k][j] of the rotation with cos/sin cs[] (rot values: the rot/2 cos,
 * then the sin): y_k = sum_j R[k][j] n_j, one 2 x 2 block [c -s; s c] per
 * pair (a, b), the identity past rot. */
static inline ro_t rope_R(const rope_opts *o, const ro_t *cs, size_t k, size_t j) {
  if (k >= o->rot || j >= o->rot) return k == j ? 1 : 0;
  size_t i, m, a, b;
  rope_partner(o, k, &i, &m);
  if (j != k && j != m) return 0;
  rope_pair(o, i, &a, &b);
  ro_t c = cs[i], s = cs[o->rot / 2 + i];
  if (j == k) return c;
  return k == a ? -s : s; /* R[a][b] = -s, R[b][a] = s */
}

/* The columns j with R[k][j] possibly nonzero (R is symmetric in that
 * pattern): k and its partner. @return how many. */
static inline size_t rope_cols(const rope_opts *o, size_t k, size_t cols[2]) {
  cols[0] = k;
  if (k >= o->rot) return 1;
  size_t i;
  rope_partner(o, k, &i, &cols[1]);
  return 2;
}

static inline ro_t rope_r(const ro_t *x, size_t d, ro_t eps) {
  ro_t ss = 0;
  for (size_t j = 0; j < d; j++) ss += x[j] * x[j];
  ro_t den = sqrtl(ss / (ro_t)d + eps);
  return den > 0 ? 1 / den : 0;
}

/* One row forward: y (d), *r; mag (optional, d): each output's terms'
 * magnitude |n_a c| + |n_b s| (|n_j| past rot), the scale of its rounding
 * errors where the two terms cancel. */
static inline void rope_forward_row(const ro_t *x, const ro_t *w, size_t d, const rope_opts *o,
                                    const ro_t *cs, ro_t *y, ro_t *r, ro_t *mag) {
  ro_t n[ROPE_ORACLE_MAX_D];
  *r = rope_r(x, d, o->eps);
  for (size_t j = 0; j < d; j++) n[j] = x[j] * *r * (w ? w[j] : 1);
  for (size_t k = 0; k < d; k++) {
    ro_t v = 0, m = 0;
    size_t cols[2], nc = rope_cols(o, k, cols);
    for (size_t q = 0; q < nc; q++) {
      size_t j = cols[q];
      ro_t t = rope_R(o, cs, k, j) * n[j];
      v += t;
      m += fabsl(t);
    }
    y[k] = v;
    if (mag) mag[k] = m;
  }
}

/* One row backward: dx (d), and dw += (NULL to skip). With n = x r w and
 * y = R n: dn_j = sum_k R[k][j] dy_k; dn_i/dx_j = w_i (r [i = j] + x_i
 * dr/dx_j) with dr/dx_j = -r^3 x_j / d; dn_j/dw_j = x_j r. */
static inline void rope_backward_row(const ro_t *x, const ro_t *w, const ro_t *dy, size_t d,
                                     const rope_opts *o, const ro_t *cs, ro_t *dx, ro_t *dw) {
  ro_t dn[ROPE_ORACLE_MAX_D];
  ro_t r = rope_r(x, d, o->eps);
  for (size_t j = 0; j < d; j++) {
    size_t rows[2], nr = rope_cols(o, j, rows);
    dn[j] = 0;
    for (size_t q = 0; q < nr; q++) dn[j] += rope_R(o, cs, rows[q], j) * dy[rows[q]];
  }
  ro_t s = 0; /* sum_i dn_i w_i x_i */
  for (size_t i = 0; i < d; i++) s += dn[i] * (w ? w[i] : 1) * x[i];
  for (size_t j = 0; j < d; j++) {
    ro_t drdx = -r * r * r * x[j] / (ro_t)d;
    dx[j] = dn[j] * (w ? w[j] : 1) * r + s * drdx;
    if (dw) dw[j] += dn[j] * x[j] * r;
  }
}

/* ---- one statistic per token over its heads (OLMo 2) ---------------------
 * A token's H heads of d as one row of D = H d values: r over all of them,
 * n = x r w with w of D, then each head's d values rotated by R as above.
 * The backward by the chain rule through that r: dr/dx_j = -r^3 x_j / D. */

/* tokens up to this many values: the buffers are static */
#define ROPE_ORACLE_MAX_N 4096

static inline void rope_forward_token(const ro_t *x, const ro_t *w, size_t heads, size_t d,
                                      const rope_opts *o, const ro_t *cs, ro_t *y, ro_t *r,
                                      ro_t *mag) {
  static ro_t n[ROPE_ORACLE_MAX_N];
  size_t D = heads * d;
  *r = rope_r(x, D, o->eps);
  for (size_t j = 0; j < D; j++) n[j] = x[j] * *r * (w ? w[j] : 1);
  for (size_t h = 0; h < heads; h++)
    for (size_t k = 0; k < d; k++) {
      ro_t v = 0, m = 0;
      size_t cols[2], nc = rope_cols(o, k, cols);
      for (size_t q = 0; q < nc; q++) {
        ro_t t = rope_R(o, cs, k, cols[q]) * n[h * d + cols[q]];
        v += t;
        m += fabsl(t);
      }
      y[h * d + k] = v;
      if (mag) mag[h * d + k] = m;
    }
}

/* dx (D) and dw += (D; NULL to skip) of one token. */
static inline void rope_backward_token(const ro_t *x, const ro_t *w, const ro_t *dy, size_t heads,
                                       size_t d, const rope_opts *o, const ro_t *cs, ro_t *dx,
                                       ro_t *dw) {
  static ro_t dn[ROPE_ORACLE_MAX_N];
  size_t D = heads * d;
  ro_t r = rope_r(x, D, o->eps);
  for (size_t h = 0; h < heads; h++)
    for (size_t j = 0; j < d; j++) {
      size_t rows[2], nr = rope_cols(o, j, rows);
      dn[h * d + j] = 0;
      for (size_t q = 0; q < nr; q++)
        dn[h * d + j] += rope_R(o, cs, rows[q], j) * dy[h * d + rows[q]];
    }
  ro_t s = 0; /* sum_i dn_i w_i x_i over the token */
  for (size_t i = 0; i < D; i++) s += dn[i] * (w ? w[i] : 1) * x[i];
  for (size_t j = 0; j < D; j++) {
    ro_t drdx = -r * r * r * x[j] / (ro_t)D;
    dx[j] = dn[j] * (w ? w[j] : 1) * r + s * drdx;
    if (dw) dw[j] += dn[j] * x[j] * r;
  }
}

#endif
