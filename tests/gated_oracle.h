/* gated_oracle.h - the long double oracle of gated RMSNorm (Mamba2's
 * MambaRMSNormGated and its Bamba / NemotronH copies: the gate before the
 * norm; Qwen3Next's RMSNormGated: the norm before the gate), written from the
 * modules' formulas with plain sequential sums and a backward by the chain
 * rule through r itself (dr/du_j = -r^3 u_j / g), not the library's
 * normalized form. The statistic runs over groups of `group` columns. */
#ifndef RMSNORM_GATED_ORACLE_H
#define RMSNORM_GATED_ORACLE_H

#include <math.h>
#include <stddef.h>

typedef long double gl_t;

/* rows up to this long: the row buffers are on the stack */
#define GATED_ORACLE_MAX_D 8192

typedef struct gated_opts {
  size_t group;    /* columns per statistic; d when ungrouped */
  gl_t eps;
  int sigmoid;     /* act = sigmoid (else SiLU) */
  int norm_first;  /* y = (RMSNorm(x) w) act(z) (else RMSNorm(x act(z)) w) */
} gated_opts;

static inline gl_t gated_sig(gl_t z) { return 1 / (1 + expl(-z)); }
static inline gl_t gated_act(const gated_opts *o, gl_t z) {
  return o->sigmoid ? gated_sig(z) : z * gated_sig(z);
}
static inline gl_t gated_act_prime(const gated_opts *o, gl_t z) {
  gl_t s = gated_sig(z);
  return o->sigmoid ? s * (1 - s) : s + z * s * (1 - s);
}

/* r of each group of the normed input n (x act(z) or x): r[G] */
static inline void gated_group_r(const gl_t *n, size_t d, const gated_opts *o, gl_t *r) {
  for (size_t g0 = 0, G = 0; g0 < d; g0 += o->group, G++) {
    gl_t ss = 0;
    for (size_t j = g0; j < g0 + o->group; j++) ss += n[j] * n[j];
    r[G] = 1 / sqrtl(ss / o->group + o->eps);
  }
}

/* One row forward; r: (d / group,) */
static inline void gated_forward_row(const gl_t *x, const gl_t *z, const gl_t *w, size_t d,
                                     const gated_opts *o, gl_t *y, gl_t *r) {
  gl_t n[GATED_ORACLE_MAX_D];
  for (size_t j = 0; j < d; j++) n[j] = o->norm_first ? x[j] : x[j] * gated_act(o, z[j]);
  gated_group_r(n, d, o, r);
  for (size_t j = 0; j < d; j++) {
    gl_t v = n[j] * r[j / o->group] * (w ? w[j] : 1);
    y[j] = o->norm_first ? v * gated_act(o, z[j]) : v;
  }
}

/* One row backward: dx, dz, and dw += (NULL to skip). With n the normed input
 * and v = n r w: dL/dv_j = dy_j (act(z_j) when norm first, else 1);
 * dL/dn_j = dL/dv_j r w_j + sum_{i in G(j)} dL/dv_i n_i w_i dr/dn_j,
 * dr/dn_j = -r^3 n_j / group. */
static inline void gated_backward_row(const gl_t *x, const gl_t *z, const gl_t *w,
                                      const gl_t *dy, size_t d, const gated_opts *o, gl_t *dx,
                                      gl_t *dz, gl_t *dw) {
  gl_t n[GATED_ORACLE_MAX_D], dv[GATED_ORACLE_MAX_D], r[GATED_ORACLE_MAX_D];
  for (size_t j = 0; j < d; j++) n[j] = o->norm_first ? x[j] : x[j] * gated_act(o, z[j]);
  gated_group_r(n, d, o, r);
  for (size_t j = 0; j < d; j++) dv[j] = o->norm_first ? dy[j] * gated_act(o, z[j]) : dy[j];
  for (size_t g0 = 0, G = 0; g0 < d; g0 += o->group, G++) {
    gl_t s = 0; /* sum_i dv_i n_i w_i over the group */
    for (size_t i = g0; i < g0 + o->group; i++) s += dv[i] * n[i] * (w ? w[i] : 1);
    for (size_t j = g0; j < g0 + o->group; j++) {
      gl_t wj = w ? w[j] : 1;
      gl_t dn = dv[j] * r[G] * wj + s * (-r[G] * r[G] * r[G] * n[j] / o->group);
      gl_t a = gated_act(o, z[j]);
      if (o->norm_first) {
        dx[j] = dn;
        dz[j] = dy[j] * n[j] * r[G] * wj * gated_act_prime(o, z[j]);
      } else {
        dx[j] = dn * a;
        dz[j] = dn * x[j] * gated_act_prime(o, z[j]);
      }
      if (dw) dw[j] += dv[j] * n[j] * r[G];
    }
  }
}

#endif
