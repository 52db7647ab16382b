/* test_nonfinite.c - the rule for non-finite inputs (docs/numerics.md,
 * "Non-finite inputs") on every op, forward and backward: each output against
 * the op's formula evaluated in long double IEEE arithmetic as the reference
 * frameworks write it (torch's rms_norm and layer_norm with their autograd
 * derivatives, the transformers gated and rotary modules, the composition of
 * the fused ops), never through the library's own code. A NaN, +Inf, -Inf,
 * or +Inf and -Inf together, at the first, middle or last column of one row
 * (for d = 7 and 33 the last is past a SIMD width), in x or in another
 * input (residual, gate, dy, dres), for d = 1, 7, 33, 4096 and every dtype.
 * Checked: NaN exactly where the formula gives NaN, the same infinities,
 * exact zeros (with their sign for the forward) in the non-finite row, the
 * other values within the dtype's rounding, and the other rows untouched.
 * Quantized outputs (no float reference): a block, group or row whose y
 * holds a NaN has a NaN scale and zero codes, every other block the bytes of
 * a run without the non-finite value. Run once per kernel set (ctest). */
#include <float.h>

#include "testutil.h"

typedef long double ld;

static rmsnorm_context *ctx;

#define ROWS 9  /* one group of short rows the kernels take together, and one more */
#define SROW 1  /* the row that holds the non-finite value */
#define MAXD 4096

static const size_t dims[] = {1, 7, 33, 4096};
#define NDIMS (sizeof dims / sizeof dims[0])

enum { K_NAN = 0, K_INF = 1, K_NINF = 2, K_BOTH = 3, NKINDS = 4 };
static const char *kind_names[] = {"nan", "+inf", "-inf", "+inf,-inf"};

/* One case: where the non-finite value goes. */
typedef struct nf {
  rmsnorm_dtype dt;
  size_t d, pos, pos2; /* pos2: the -inf of K_BOTH */
  int kind;
  const char *op;
} nf;

static double tol_of(rmsnorm_dtype dt) {
  return dt == RMSNORM_F64 ? 1e-10 : dt == RMSNORM_F32 ? 1e-4 : dt == RMSNORM_F16 ? 4e-3 : 3e-2;
}

/* The compute type's dtype (rstd, mean, linear's matrices). */
static rmsnorm_dtype acc_of(rmsnorm_dtype dt) { return dt == RMSNORM_F64 ? RMSNORM_F64 : RMSNORM_F32; }

/* Writes the case's non-finite value(s) into row `row` of t. */
static void put_special(tu_tensor *t, size_t row, const nf *c) {
  tu_set(t, row, c->pos, c->kind == K_NAN ? NAN : c->kind == K_NINF ? -INFINITY : INFINITY);
  if (c->kind == K_BOTH) tu_set(t, row, c->pos2, -INFINITY);
}

static tu_tensor mat(rmsnorm_dtype dt, size_t rows, size_t d, double scale) {
  tu_tensor t = tu_alloc(dt, rows, d, d);
  tu_fill_normal(&t, scale);
  return t;
}

/* t's values as long doubles (rows x d). */
static ld *vals(const tu_tensor *t) {
  ld *v = malloc(t->rows * t->d * sizeof(ld));
  for (size_t i = 0; i < t->rows; i++)
    for (size_t j = 0; j < t->d; j++) v[i * t->d + j] = tu_get(t, i, j);
  return v;
}

static ld *lds(size_t n) { return calloc(n ? n : 1, sizeof(ld)); }

/* Gemma's 1 + g as the library forms it: in the compute type. */
static ld offset_gain(rmsnorm_dtype dt, float g) {
  return dt == RMSNORM_F64 ? 1.0L + g : (ld)(1.0f + g);
}

/* A float vector of n N(0,1) values (weights), none zero. */
static float *fvec(size_t n) {
  float *w = malloc(n * sizeof(float));
  for (size_t j = 0; j < n; j++) {
    w[j] = (float)tu_normal();
    if (w[j] == 0) w[j] = 0.5f;
  }
  return w;
}

/* ---- comparison ---------------------------------------------------------- */

/* got (n values, already read from their dtype) against want rounded to dt.
 * special: exact zeros (signed when `sign`) where want is 0; elsewhere within
 * tol_of(dt) of the largest finite |want| (or `scale`, when larger). */
static void cmp(const nf *c, const char *what, rmsnorm_dtype dt, const double *got, const ld *want,
                size_t n, double scale, int special, int sign) {
  double tol = tol_of(c->dt), top = scale;
  for (size_t j = 0; j < n; j++) {
    double w = rn_round_to(dt, (double)want[j]);
    if (isfinite(w) && fabs(w) > top) top = fabs(w);
  }
  size_t bad = n;
  for (size_t j = 0; j < n && bad == n; j++) {
    double w = rn_round_to(dt, (double)want[j]), g = got[j];
    int ok;
    if (isnan(w))
      ok = isnan(g);
    else if (isinf(w))
      ok = g == w;
    else if (!isfinite(g))
      ok = 0;
    else if (special && w == 0)
      ok = g == 0 && (!sign || !signbit(g) == !signbit(w));
    else
      ok = fabs(g - w) <= tol * top;
    if (!ok) bad = j;
  }
  if (bad == n) {
    tu_check(1, "");
    return;
  }
  tu_check(0, "%s %s %s d=%zu %s at %zu: %s[%zu] = %.9g, want %.9g", c->op, tu_dtype_name(c->dt),
           what, c->d, kind_names[c->kind], c->pos, what, bad, got[bad],
           rn_round_to(dt, (double)want[bad]));
}

/* Row i of a tensor against row i of want (rows x d). */
static void cmp_row(const nf *c, const char *what, const tu_tensor *t, size_t i, const ld *want,
                    double scale, int sign) {
  double *g = malloc(t->d * sizeof(double));
  for (size_t j = 0; j < t->d; j++) g[j] = tu_get(t, i, j);
  char name[64];
  snprintf(name, sizeof name, "%s row %zu", what, i);
  cmp(c, name, t->dt, g, want + i * t->d, t->d, scale, i == SROW, sign);
  free(g);
}

/* mag: per row, the largest term of a sum that may cancel (a gradient's
 * tolerance is relative to it), or NULL. */
static void cmp_rows(const nf *c, const char *what, const tu_tensor *t, const ld *want, int sign,
                     const ld *mag) {
  for (size_t i = 0; i < t->rows; i++) cmp_row(c, what, t, i, want, mag ? (double)mag[i] : 0, sign);
}

/* *m = max(*m, |v|) over finite v */
static void grow(ld *m, ld v) {
  if (isfinite(v) && fabsl(v) > *m) *m = fabsl(v);
}

/* n values of dtype dt at p against want (dweight, dbias, stats). */
static void cmp_vec(const nf *c, const char *what, rmsnorm_dtype dt, const void *p, const ld *want,
                    size_t n, int special) {
  double *g = malloc((n ? n : 1) * sizeof(double));
  for (size_t j = 0; j < n; j++) g[j] = rn_load(p, dt, j);
  cmp(c, what, dt, g, want, n, 0, special, 0);
  free(g);
}

/* ---- the formulas ---------------------------------------------------------- */

/* RMSNorm of one row, as torch's rms_norm writes it: r = rsqrt(mean(x^2) +
 * eps) (or 1/(sqrt(mean) + eps)) over the first k columns, y = x r w + b,
 * and its autograd backward: dx_j = gy_j r + (sum_i gy_i x_i) dr/dx_j with
 * dr/dx_j = -r^3 x_j / k (eps inside) or -r^2 x_j / (k rho) (outside) for
 * j < k. */
typedef struct rms_opts {
  size_t k;
  double eps;
  int outside;
  const ld *w, *b; /* effective gain and bias (d), or NULL */
} rms_opts;

static ld rms_r(const ld *x, const rms_opts *o, ld *rho) {
  ld ss = 0;
  for (size_t j = 0; j < o->k; j++) ss += x[j] * x[j];
  *rho = sqrtl(ss / o->k);
  return o->outside ? 1 / (*rho + o->eps) : 1 / sqrtl(ss / o->k + o->eps);
}

static void rms_fwd_row(const ld *x, size_t d, const rms_opts *o, ld *y, ld *rstd) {
  ld rho, r = rms_r(x, o, &rho);
  for (size_t j = 0; j < d; j++) {
    ld v = x[j] * r;
    if (o->w) v *= o->w[j];
    if (o->b) v += o->b[j];
    y[j] = v;
  }
  if (rstd) *rstd = r;
}

/* dx of one row; dw, db (d) accumulate dy_j xhat_j and dy_j; *mag (or
 * NULL) the largest term. */
static void rms_bwd_row(const ld *x, const ld *dy, size_t d, const rms_opts *o, ld *dx, ld *dw,
                        ld *db, ld *mag) {
  ld rho, r = rms_r(x, o, &rho), S = 0;
  for (size_t i = 0; i < d; i++) S += (o->w ? dy[i] * o->w[i] : dy[i]) * x[i];
  ld dr = o->outside ? -r * r / (2 * rho) : -r * r * r / 2; /* d r / d ms, ms = mean(x^2) */
  for (size_t j = 0; j < d; j++) {
    ld gy = o->w ? dy[j] * o->w[j] : dy[j];
    dx[j] = gy * r;
    if (mag) grow(mag, dx[j]);
    if (j < o->k) {
      ld t = S * dr * (2 * x[j] / o->k);
      dx[j] += t;
      if (mag) grow(mag, t);
    }
    if (dw) dw[j] += dy[j] * (x[j] * r);
    if (db) db[j] += dy[j];
  }
}

/* LayerNorm of one row (torch's layer_norm) and the backward of torch's
 * decomposition (torch/_decomp: rstd/N (N gy - sum gy - xhat sum gy xhat)). */
static void ln_row(const ld *x, const ld *dy, size_t d, double eps, const ld *w, const ld *b,
                   ld *y, ld *mean_o, ld *rstd_o, ld *dx, ld *dw, ld *db, ld *mag) {
  ld m = 0, var = 0;
  for (size_t j = 0; j < d; j++) m += x[j];
  m /= d;
  for (size_t j = 0; j < d; j++) var += (x[j] - m) * (x[j] - m);
  ld rstd = 1 / sqrtl(var / d + eps), A = 0, B = 0;
  if (mean_o) *mean_o = m;
  if (rstd_o) *rstd_o = rstd;
  for (size_t j = 0; j < d; j++) {
    ld h = (x[j] - m) * rstd;
    if (y) y[j] = h * w[j] + b[j];
    if (dy) {
      A += dy[j] * w[j];
      B += dy[j] * w[j] * h;
    }
  }
  for (size_t j = 0; dy && j < d; j++) {
    ld h = (x[j] - m) * rstd;
    dx[j] = rstd / d * (d * (dy[j] * w[j]) - A - h * B);
    grow(mag, rstd * dy[j] * w[j]), grow(mag, rstd / d * A), grow(mag, rstd / d * h * B);
    dw[j] += dy[j] * h;
    db[j] += dy[j];
  }
}

/* ---- RMSNorm and LayerNorm ---------------------------------------------- */

/* Variants: 0 weight; 1 weight offset + bias; 2 eps outside; 3 partial 0.5. */
static void rms_case(const nf *c, int v) {
  rmsnorm_dtype dt = c->dt;
  size_t d = c->d;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-5;
  if (v == 1) cfg.flags |= RMSNORM_FLAG_WEIGHT_OFFSET;
  if (v == 2) cfg.flags |= RMSNORM_FLAG_EPS_OUTSIDE;
  if (v == 3) cfg.partial = 0.5;
  float *g = fvec(d), *bias = v == 1 ? fvec(d) : NULL;
  ld *w = lds(d), *b = bias ? lds(d) : NULL;
  for (size_t j = 0; j < d; j++) {
    w[j] = v == 1 ? offset_gain(dt, g[j]) : g[j];
    if (b) b[j] = bias[j];
  }
  rms_opts o = {v == 3 ? tu_partial_k(0.5, d) : d, cfg.eps, v == 2, w, b};
  tu_tensor x = mat(dt, ROWS, d, 1), dy = mat(dt, ROWS, d, 1), y = tu_alloc(dt, ROWS, d, d);
  tu_tensor dx = tu_alloc(dt, ROWS, d, d);
  size_t n = ROWS * d;
  ld *wy = lds(n), *wr = lds(ROWS), *wdx = lds(n), *wdw = lds(d), *wdb = lds(d);
  double rstd[ROWS];
  float *dw = malloc(d * 4), *db = malloc(d * 4);
  for (int side = 0; side < 2; side++) { /* the non-finite value in x, then in dy */
    tu_fill_normal(&x, 1), tu_fill_normal(&dy, 1);
    put_special(side ? &dy : &x, SROW, c);
    ld *xv = vals(&x), *dyv = vals(&dy);
    memset(wdw, 0, d * sizeof(ld)), memset(wdb, 0, d * sizeof(ld));
    ld mag[ROWS] = {0};
    for (size_t i = 0; i < ROWS; i++) {
      rms_fwd_row(xv + i * d, d, &o, wy + i * d, wr + i);
      rms_bwd_row(xv + i * d, dyv + i * d, d, &o, wdx + i * d, wdw, wdb, mag + i);
    }
    nf cc = *c;
    cc.op = side ? "rms_norm (dy)" : "rms_norm";
    if (!side) {
      TU_OK(rmsnorm_forward(ctx, &cfg, ROWS, d, x.data, d, g, bias, y.data, d, rstd));
      cmp_rows(&cc, "y", &y, wy, 1, NULL);
      cmp_vec(&cc, "rstd", acc_of(dt), rstd, wr, ROWS, 1);
    } else { /* the forward's rstd of a finite x */
      TU_OK(rmsnorm_forward(ctx, &cfg, ROWS, d, x.data, d, g, bias, y.data, d, rstd));
    }
    /* the saved rstd for the x side on odd variants, recomputed otherwise */
    const void *saved = side || v % 2 ? rstd : NULL;
    TU_OK(rmsnorm_backward(ctx, &cfg, ROWS, d, x.data, d, dy.data, d, g, saved, dx.data, d, dw,
                           bias ? db : NULL));
    cmp_rows(&cc, "dx", &dx, wdx, 0, mag);
    cmp_vec(&cc, "dweight", RMSNORM_F32, dw, wdw, d, 0);
    if (bias) cmp_vec(&cc, "dbias", RMSNORM_F32, db, wdb, d, 0);
    free(xv), free(dyv);
  }
  tu_free(&x), tu_free(&dy), tu_free(&y), tu_free(&dx);
  free(g), free(bias), free(w), free(b), free(wy), free(wr), free(wdx), free(wdw), free(wdb);
  free(dw), free(db);
}

static void ln_case(const nf *c) {
  rmsnorm_dtype dt = c->dt;
  size_t d = c->d, n = ROWS * d;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-5;
  float *g = fvec(d), *bias = fvec(d);
  ld *w = lds(d), *b = lds(d);
  for (size_t j = 0; j < d; j++) w[j] = g[j], b[j] = bias[j];
  tu_tensor x = mat(dt, ROWS, d, 1), dy = mat(dt, ROWS, d, 1), y = tu_alloc(dt, ROWS, d, d);
  tu_tensor dx = tu_alloc(dt, ROWS, d, d);
  ld *wy = lds(n), *wm = lds(ROWS), *wr = lds(ROWS), *wdx = lds(n), *wdw = lds(d), *wdb = lds(d);
  double mean[ROWS], rstd[ROWS];
  float *dw = malloc(d * 4), *db = malloc(d * 4);
  for (int side = 0; side < 2; side++) {
    tu_fill_normal(&x, 1), tu_fill_normal(&dy, 1);
    put_special(side ? &dy : &x, SROW, c);
    ld *xv = vals(&x), *dyv = vals(&dy);
    memset(wdw, 0, d * sizeof(ld)), memset(wdb, 0, d * sizeof(ld));
    ld mag[ROWS] = {0};
    for (size_t i = 0; i < ROWS; i++)
      ln_row(xv + i * d, dyv + i * d, d, cfg.eps, w, b, wy + i * d, wm + i, wr + i, wdx + i * d,
             wdw, wdb, mag + i);
    nf cc = *c;
    cc.op = side ? "layer_norm (dy)" : "layer_norm";
    TU_OK(rmsnorm_layernorm_forward(ctx, &cfg, ROWS, d, x.data, d, g, bias, y.data, d, mean, rstd));
    if (!side) {
      cmp_rows(&cc, "y", &y, wy, 1, NULL);
      cmp_vec(&cc, "mean", acc_of(dt), mean, wm, ROWS, 1);
      cmp_vec(&cc, "rstd", acc_of(dt), rstd, wr, ROWS, 1);
    }
    TU_OK(rmsnorm_layernorm_backward(ctx, &cfg, ROWS, d, x.data, d, dy.data, d, g,
                                     side ? mean : NULL, side ? rstd : NULL, dx.data, d, dw, db));
    cmp_rows(&cc, "dx", &dx, wdx, 0, mag);
    cmp_vec(&cc, "dweight", RMSNORM_F32, dw, wdw, d, 0);
    cmp_vec(&cc, "dbias", RMSNORM_F32, db, wdb, d, 0);
    free(xv), free(dyv);
  }
  tu_free(&x), tu_free(&dy), tu_free(&y), tu_free(&dx);
  free(g), free(bias), free(w), free(b), free(wy), free(wm), free(wr), free(wdx), free(wdw);
  free(wdb), free(dw), free(db);
}

/* ---- residual add + RMSNorm ------------------------------------------------ */

/* h' = h + u rounded to the dtype, y = RMSNorm(h'); the backward dh = dres +
 * dx, each rounded to the dtype (autograd of the unfused ops). The value in
 * h, then u; in the backward in dres. */
static void add_case(const nf *c) {
  rmsnorm_dtype dt = c->dt;
  size_t d = c->d, n = ROWS * d;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-5;
  float *g = fvec(d);
  ld *w = lds(d);
  for (size_t j = 0; j < d; j++) w[j] = g[j];
  rms_opts o = {d, cfg.eps, 0, w, NULL};
  tu_tensor h = mat(dt, ROWS, d, 1), u = mat(dt, ROWS, d, 1), y = tu_alloc(dt, ROWS, d, d);
  tu_tensor dy = mat(dt, ROWS, d, 1), dres = mat(dt, ROWS, d, 1), dh = tu_alloc(dt, ROWS, d, d);
  ld *wh = lds(n), *wy = lds(n), *wdx = lds(n), *wdh = lds(n), *wdw = lds(d);
  float *dw = malloc(d * 4);
  for (int side = 0; side < 3; side++) { /* in h, in u, in dres */
    tu_fill_normal(&h, 1), tu_fill_normal(&u, 1), tu_fill_normal(&dres, 1);
    put_special(side == 0 ? &h : side == 1 ? &u : &dres, SROW, c);
    ld *hv = vals(&h), *uv = vals(&u), *dyv = vals(&dy), *drv = vals(&dres);
    for (size_t j = 0; j < n; j++) wh[j] = rn_round_to(dt, (double)(hv[j] + uv[j]));
    memset(wdw, 0, d * sizeof(ld));
    ld mag[ROWS] = {0};
    for (size_t i = 0; i < ROWS; i++) {
      rms_fwd_row(wh + i * d, d, &o, wy + i * d, NULL);
      rms_bwd_row(wh + i * d, dyv + i * d, d, &o, wdx + i * d, wdw, NULL, mag + i);
    }
    for (size_t j = 0; j < n; j++) wdh[j] = drv[j] + rn_round_to(dt, (double)wdx[j]);
    nf cc = *c;
    cc.op = side == 0 ? "add (h)" : side == 1 ? "add (u)" : "add (dres)";
    TU_OK(rmsnorm_add_forward(ctx, &cfg, ROWS, d, h.data, d, u.data, d, g, NULL, y.data, d, NULL));
    cmp_rows(&cc, "h'", &h, wh, 1, NULL);
    cmp_rows(&cc, "y", &y, wy, 1, NULL);
    TU_OK(rmsnorm_add_backward(ctx, &cfg, ROWS, d, h.data, d, dy.data, d, dres.data, d, g, NULL,
                               dh.data, d, dw, NULL));
    cmp_rows(&cc, "dh", &dh, wdh, 0, mag);
    cmp_vec(&cc, "dweight", RMSNORM_F32, dw, wdw, d, 0);
    free(hv), free(uv), free(dyv), free(drv);
  }
  tu_free(&h), tu_free(&u), tu_free(&y), tu_free(&dy), tu_free(&dres), tu_free(&dh);
  free(g), free(w), free(wh), free(wy), free(wdx), free(wdh), free(wdw), free(dw);
}

/* ---- QK-norm (tokens 3 x heads 3 rows) ----------------------------------- */

static void qk_case(const nf *c) {
  rmsnorm_dtype dt = c->dt;
  size_t d = c->d, n = ROWS * d, heads = 3, tokens = ROWS / 3;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-6;
  float *g = fvec(d), *bias = fvec(d);
  ld *w = lds(d), *b = lds(d);
  for (size_t j = 0; j < d; j++) w[j] = g[j], b[j] = bias[j];
  rms_opts o = {d, cfg.eps, 0, w, b};
  tu_tensor x = mat(dt, ROWS, d, 1), dy = mat(dt, ROWS, d, 1), y = tu_alloc(dt, ROWS, d, d);
  tu_tensor dx = tu_alloc(dt, ROWS, d, d);
  put_special(&x, SROW, c);
  ld *xv = vals(&x), *dyv = vals(&dy), *wy = lds(n), *wdx = lds(n), *wdw = lds(d), *wdb = lds(d);
  ld mag[ROWS] = {0};
  for (size_t i = 0; i < ROWS; i++) {
    rms_fwd_row(xv + i * d, d, &o, wy + i * d, NULL);
    rms_bwd_row(xv + i * d, dyv + i * d, d, &o, wdx + i * d, wdw, wdb, mag + i);
  }
  nf cc = *c;
  cc.op = "qk_norm";
  float *dw = malloc(d * 4), *db = malloc(d * 4);
  TU_OK(rmsnorm_qk_norm_forward(ctx, &cfg, tokens, heads, d, x.data, heads * d, d, g, bias,
                                y.data, heads * d, d, NULL));
  cmp_rows(&cc, "y", &y, wy, 1, NULL);
  TU_OK(rmsnorm_qk_norm_backward(ctx, &cfg, tokens, heads, d, x.data, heads * d, d, dy.data,
                                 heads * d, d, g, NULL, dx.data, heads * d, d, dw, db));
  cmp_rows(&cc, "dx", &dx, wdx, 0, mag);
  cmp_vec(&cc, "dweight", RMSNORM_F32, dw, wdw, d, 0);
  cmp_vec(&cc, "dbias", RMSNORM_F32, db, wdb, d, 0);
  tu_free(&x), tu_free(&dy), tu_free(&y), tu_free(&dx);
  free(g), free(bias), free(w), free(b), free(xv), free(dyv), free(wy), free(wdx), free(wdw);
  free(wdb), free(dw), free(db);
}

/* ---- QK-norm + RoPE ------------------------------------------------------ */

/* n = RMSNorm(x) w, then HF's rotation (rotate-half, or interleaved pairs)
 * over the first rot columns: y_a = a c - b s, y_b = b c + a s; backward
 * dn = R^T dy, then the RMSNorm backward with dn. head_dim even. */
static void rope_case(const nf *c, int gptj) {
  rmsnorm_dtype dt = c->dt;
  size_t d = c->d, n = ROWS * d, heads = 3, tokens = ROWS / 3;
  size_t rot = gptj && d > 2 ? d - 2 : d, half = rot / 2;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-6;
  int f64 = dt == RMSNORM_F64;
  void *table = malloc(tokens * rot * (f64 ? 8 : 4));
  if (rmsnorm_rope_table(table, acc_of(dt), tokens, rot, 10000.0, 1.0) != RMSNORM_OK) {
    tu_check(0, "rope table");
    free(table);
    return;
  }
  rmsnorm_rope rope;
  rmsnorm_rope_init(&rope, gptj ? RMSNORM_ROPE_GPTJ : RMSNORM_ROPE_NEOX);
  rope.rotary_dim = rot;
  rope.cos_sin = table;
  rope.n_positions = tokens;
  float *g = fvec(d);
  ld *w = lds(d);
  for (size_t j = 0; j < d; j++) w[j] = g[j];
  rms_opts o = {d, cfg.eps, 0, w, NULL};
  tu_tensor x = mat(dt, ROWS, d, 1), dy = mat(dt, ROWS, d, 1), y = tu_alloc(dt, ROWS, d, d);
  tu_tensor dx = tu_alloc(dt, ROWS, d, d);
  put_special(&x, SROW, c);
  ld *xv = vals(&x), *dyv = vals(&dy), *wy = lds(n), *wdx = lds(n), *wdw = lds(d), *dn = lds(d);
  ld mag[ROWS] = {0};
  for (size_t i = 0; i < ROWS; i++) {
    size_t t = i / heads;
    ld *yr = wy + i * d;
    rms_fwd_row(xv + i * d, d, &o, yr, NULL);
    for (size_t j = 0; j < d; j++) dn[j] = dyv[i * d + j];
    for (size_t p = 0; p < half; p++) {
      size_t ia = gptj ? 2 * p : p, ib = gptj ? 2 * p + 1 : p + half;
      ld cs = rn_load(table, acc_of(dt), t * rot + p), sn = rn_load(table, acc_of(dt), t * rot + half + p);
      ld a = yr[ia], b = yr[ib];
      yr[ia] = a * cs - b * sn;
      yr[ib] = b * cs + a * sn;
      ld da = dyv[i * d + ia], db = dyv[i * d + ib];
      dn[ia] = da * cs + db * sn;
      dn[ib] = db * cs - da * sn;
    }
    rms_bwd_row(xv + i * d, dn, d, &o, wdx + i * d, wdw, NULL, mag + i);
  }
  nf cc = *c;
  cc.op = gptj ? "qk_norm_rope gptj" : "qk_norm_rope neox";
  float *dw = malloc(d * 4);
  TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, tokens, heads, d, x.data, heads * d, d, g, &rope,
                                     NULL, y.data, heads * d, d, NULL));
  cmp_rows(&cc, "y", &y, wy, 1, NULL);
  TU_OK(rmsnorm_qk_norm_rope_backward(ctx, &cfg, tokens, heads, d, x.data, heads * d, d, dy.data,
                                      heads * d, d, g, &rope, NULL, dx.data, heads * d, d, dw));
  cmp_rows(&cc, "dx", &dx, wdx, 0, mag);
  cmp_vec(&cc, "dweight", RMSNORM_F32, dw, wdw, d, 0);
  tu_free(&x), tu_free(&dy), tu_free(&y), tu_free(&dx);
  free(table), free(g), free(w), free(xv), free(dyv), free(wy), free(wdx), free(wdw), free(dn);
  free(dw);
}

/* ---- gated RMSNorm ------------------------------------------------------- */

static ld sig(ld z) { return 1 / (1 + expl(-z)); }

/* transformers' MambaRMSNormGated (gate first: y = RMSNorm(x act(z)) w) and
 * Qwen3NextRMSNormGated (norm first: y = RMSNorm(x) w act(z)), r per group
 * of g columns, and their autograd backward (torch's silu / sigmoid
 * derivatives: s (1 + z (1 - s)), s (1 - s)). */
static void gated_row(const ld *x, const ld *z, const ld *dy, size_t d, size_t gs, int sigmoid,
                      int norm_first, double eps, const ld *w, ld *y, ld *rg, ld *dx, ld *dz,
                      ld *dw, ld *mdx, ld *mdz) {
  ld a[MAXD], da[MAXD], v[MAXD];
  for (size_t j = 0; j < d; j++) {
    ld s = sig(z[j]);
    a[j] = sigmoid ? s : z[j] * s;
    da[j] = sigmoid ? s * (1 - s) : s * (1 + z[j] * (1 - s));
    v[j] = norm_first ? x[j] : x[j] * a[j];
  }
  for (size_t g0 = 0; g0 < d; g0 += gs) {
    ld ss = 0, S = 0;
    for (size_t j = g0; j < g0 + gs; j++) ss += v[j] * v[j];
    ld r = 1 / sqrtl(ss / gs + eps);
    rg[g0 / gs] = r;
    for (size_t j = g0; j < g0 + gs; j++) {
      ld up = norm_first ? dy[j] * a[j] : dy[j]; /* the gradient at v r w */
      S += up * w[j] * v[j];
    }
    for (size_t j = g0; j < g0 + gs; j++) {
      ld vh = v[j] * r, n = vh * w[j];
      y[j] = norm_first ? n * a[j] : n;
      ld up = norm_first ? dy[j] * a[j] : dy[j];
      ld t1 = up * w[j] * r, t2 = S * (-r * r * r / 2) * (2 * v[j] / gs), dv = t1 + t2;
      dx[j] = norm_first ? dv : dv * a[j];
      dz[j] = norm_first ? dy[j] * n * da[j] : dv * x[j] * da[j];
      ld fx = norm_first ? 1 : a[j], fz = norm_first ? 0 : x[j] * da[j];
      grow(mdx, t1 * fx), grow(mdx, t2 * fx), grow(mdz, t1 * fz), grow(mdz, t2 * fz);
      dw[j] += up * vh;
    }
  }
}

/* Variants: 0 gate first SiLU, whole row; 1 norm first SiLU; 2 gate first
 * sigmoid in groups. */
static void gated_case(const nf *c, int v) {
  rmsnorm_dtype dt = c->dt;
  size_t d = c->d, n = ROWS * d;
  size_t gs = v == 2 ? (d == 4096 ? 64 : d == 33 ? 11 : d) : d, ng = d / gs;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-6;
  rmsnorm_gate gate;
  rmsnorm_gate_init(&gate, v == 2 ? RMSNORM_GATE_SIGMOID : RMSNORM_GATE_SILU);
  gate.group = v == 2 ? gs : 0;
  if (v == 1) gate.flags |= RMSNORM_GATE_NORM_FIRST;
  float *g = fvec(d);
  ld *w = lds(d);
  for (size_t j = 0; j < d; j++) w[j] = g[j];
  tu_tensor x = mat(dt, ROWS, d, 1), z = mat(dt, ROWS, d, 1), dy = mat(dt, ROWS, d, 1);
  tu_tensor y = tu_alloc(dt, ROWS, d, d), dx = tu_alloc(dt, ROWS, d, d), dz = tu_alloc(dt, ROWS, d, d);
  ld *wy = lds(n), *wr = lds(ROWS * ng), *wdx = lds(n), *wdz = lds(n), *wdw = lds(d);
  double rstd[ROWS * 64];
  float *dw = malloc(d * 4);
  for (int side = 0; side < 2; side++) { /* in x, in the gate z */
    tu_fill_normal(&x, 1), tu_fill_normal(&z, 1);
    put_special(side ? &z : &x, SROW, c);
    ld *xv = vals(&x), *zv = vals(&z), *dyv = vals(&dy);
    memset(wdw, 0, d * sizeof(ld));
    ld mdx[ROWS] = {0}, mdz[ROWS] = {0};
    for (size_t i = 0; i < ROWS; i++)
      gated_row(xv + i * d, zv + i * d, dyv + i * d, d, gs, v == 2, v == 1, cfg.eps, w,
                wy + i * d, wr + i * ng, wdx + i * d, wdz + i * d, wdw, mdx + i, mdz + i);
    nf cc = *c;
    static const char *names[2][3] = {{"gated (x)", "gated norm-first (x)", "gated sigmoid (x)"},
                                      {"gated (z)", "gated norm-first (z)", "gated sigmoid (z)"}};
    cc.op = names[side][v];
    TU_OK(rmsnorm_gated_forward(ctx, &cfg, &gate, ROWS, d, x.data, d, z.data, d, g, y.data, d,
                                rstd));
    cmp_rows(&cc, "y", &y, wy, 1, NULL);
    cmp_vec(&cc, "rstd", acc_of(dt), rstd, wr, ROWS * ng, 0);
    TU_OK(rmsnorm_gated_backward(ctx, &cfg, &gate, ROWS, d, x.data, d, z.data, d, dy.data, d, g,
                                 side ? rstd : NULL, dx.data, d, dz.data, d, dw));
    cmp_rows(&cc, "dx", &dx, wdx, 0, mdx);
    cmp_rows(&cc, "dz", &dz, wdz, 0, mdz);
    cmp_vec(&cc, "dweight", RMSNORM_F32, dw, wdw, d, 0);
    free(xv), free(zv), free(dyv);
  }
  tu_free(&x), tu_free(&z), tu_free(&dy), tu_free(&y), tu_free(&dx), tu_free(&dz);
  free(g), free(w), free(wy), free(wr), free(wdx), free(wdz), free(wdw), free(dw);
}

/* ---- sandwich norms ------------------------------------------------------ */

/* The three calls: y = post(a) rounded, h' = h + y rounded, x' = pre(h');
 * backward dt = dh_out + pre's dx (each rounded), da = post's dx from dt.
 * The value in a, then in h. */
static void sandwich_case(const nf *c) {
  rmsnorm_dtype dt = c->dt;
  size_t d = c->d, n = ROWS * d;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-6;
  cfg.flags |= RMSNORM_FLAG_WEIGHT_OFFSET;
  float *gp = fvec(d), *gq = fvec(d);
  ld *wp = lds(d), *wq = lds(d);
  for (size_t j = 0; j < d; j++) wp[j] = offset_gain(dt, gp[j]), wq[j] = offset_gain(dt, gq[j]);
  rms_opts op = {d, cfg.eps, 0, wp, NULL}, oq = {d, cfg.eps, 0, wq, NULL};
  tu_tensor a = mat(dt, ROWS, d, 1), h = mat(dt, ROWS, d, 1), xn = tu_alloc(dt, ROWS, d, d);
  tu_tensor dho = mat(dt, ROWS, d, 1), dxn = mat(dt, ROWS, d, 1);
  tu_tensor da = tu_alloc(dt, ROWS, d, d), dh = tu_alloc(dt, ROWS, d, d);
  ld *wh = lds(n), *wx = lds(n), *wt = lds(n), *wda = lds(n), *wdp = lds(d), *wdq = lds(d);
  ld *tmp = lds(d);
  float *dwp = malloc(d * 4), *dwq = malloc(d * 4);
  for (int side = 0; side < 2; side++) {
    tu_fill_normal(&a, 1), tu_fill_normal(&h, 1);
    put_special(side ? &h : &a, SROW, c);
    ld *av = vals(&a), *hv = vals(&h), *dov = vals(&dho), *dnv = vals(&dxn);
    memset(wdp, 0, d * sizeof(ld)), memset(wdq, 0, d * sizeof(ld));
    ld mq[ROWS] = {0}, mp[ROWS] = {0};
    for (size_t i = 0; i < ROWS; i++) {
      rms_fwd_row(av + i * d, d, &op, tmp, NULL);
      for (size_t j = 0; j < d; j++)
        wh[i * d + j] = rn_round_to(dt, (double)(hv[i * d + j] + rn_round_to(dt, (double)tmp[j])));
      rms_fwd_row(wh + i * d, d, &oq, wx + i * d, NULL);
      rms_bwd_row(wh + i * d, dnv + i * d, d, &oq, tmp, wdq, NULL, mq + i);
      for (size_t j = 0; j < d; j++)
        wt[i * d + j] = rn_round_to(dt, (double)(dov[i * d + j] + rn_round_to(dt, (double)tmp[j])));
      rms_bwd_row(av + i * d, wt + i * d, d, &op, wda + i * d, wdp, NULL, mp + i);
    }
    nf cc = *c;
    cc.op = side ? "sandwich (h)" : "sandwich (a)";
    TU_OK(rmsnorm_sandwich_forward(ctx, &cfg, ROWS, d, a.data, d, h.data, d, gp, gq, xn.data, d,
                                   NULL, NULL));
    cmp_rows(&cc, "h'", &h, wh, 1, NULL);
    cmp_rows(&cc, "x'", &xn, wx, 1, NULL);
    TU_OK(rmsnorm_sandwich_backward(ctx, &cfg, ROWS, d, a.data, d, h.data, d, dho.data, d,
                                    dxn.data, d, gp, gq, NULL, NULL, da.data, d, dh.data, d, dwp,
                                    dwq));
    cmp_rows(&cc, "dh", &dh, wt, 0, mq);
    cmp_rows(&cc, "da", &da, wda, 0, mp);
    cmp_vec(&cc, "dweight_post", RMSNORM_F32, dwp, wdp, d, 0);
    cmp_vec(&cc, "dweight_pre", RMSNORM_F32, dwq, wdq, d, 0);
    free(av), free(hv), free(dov), free(dnv);
  }
  tu_free(&a), tu_free(&h), tu_free(&xn), tu_free(&dho), tu_free(&dxn), tu_free(&da), tu_free(&dh);
  free(gp), free(gq), free(wp), free(wq), free(wh), free(wx), free(wt), free(wda), free(wdp);
  free(wdq), free(tmp), free(dwp), free(dwq);
}

/* ---- RMSNorm + linear ---------------------------------------------------- */

/* Z = RMSNorm(X; g) W + bias, and autograd of it: dY = dZ W^T, dX the
 * RMSNorm backward of dY, dW = Y^T dZ, dg_j = sum_i dY_ij xhat_ij, dbias =
 * sum dZ. */
static void linear_case(const nf *c) {
  if (rmsnorm_linear_available() != RMSNORM_OK) return;
  rmsnorm_dtype dt = c->dt, adt = acc_of(dt);
  size_t d = c->d, nn = 5, n = ROWS * d;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-6;
  float *g = fvec(d), *bias = fvec(nn);
  ld *w = lds(d);
  for (size_t j = 0; j < d; j++) w[j] = g[j];
  rms_opts o = {d, cfg.eps, 0, NULL, NULL}; /* xhat; the gain applied below */
  tu_tensor W = mat(adt, d, nn, 0.2), Wf = tu_alloc(adt, d, nn, nn), dW = tu_alloc(adt, d, nn, nn);
  tu_tensor x = mat(dt, ROWS, d, 1), z = tu_alloc(dt, ROWS, nn, nn), dz = mat(dt, ROWS, nn, 1);
  tu_tensor dx = tu_alloc(dt, ROWS, d, d);
  put_special(&x, SROW, c);
  ld *xv = vals(&x), *Wv = vals(&W), *dzv = vals(&dz), *xh = lds(n), *wz = lds(ROWS * nn);
  ld *dY = lds(n), *wdx = lds(n), *wdW = lds(d * nn), *wdg = lds(d), *wdb = lds(nn);
  ld mz[ROWS] = {0}, mag[ROWS] = {0};
  for (size_t i = 0; i < ROWS; i++) {
    rms_fwd_row(xv + i * d, d, &o, xh + i * d, NULL);
    for (size_t k = 0; k < nn; k++) {
      ld s = 0;
      for (size_t j = 0; j < d; j++) {
        s += xh[i * d + j] * w[j] * Wv[j * nn + k];
        grow(mz + i, xh[i * d + j] * w[j] * Wv[j * nn + k] * 8);
      }
      wz[i * nn + k] = s + bias[k];
      wdb[k] += dzv[i * nn + k];
    }
    for (size_t j = 0; j < d; j++) {
      ld s = 0;
      for (size_t k = 0; k < nn; k++) s += dzv[i * nn + k] * Wv[j * nn + k];
      dY[i * d + j] = s;
      wdg[j] += s * xh[i * d + j];
      for (size_t k = 0; k < nn; k++) wdW[j * nn + k] += xh[i * d + j] * w[j] * dzv[i * nn + k];
    }
    rms_opts og = {d, cfg.eps, 0, w, NULL};
    ld gyw[MAXD];
    for (size_t j = 0; j < d; j++) gyw[j] = dY[i * d + j]; /* dY is the gradient at y = xhat w */
    rms_bwd_row(xv + i * d, gyw, d, &og, wdx + i * d, NULL, NULL, mag + i);
  }
  nf cc = *c;
  cc.op = "linear";
  float *dg = malloc(d * 4), *db = malloc(nn * 4);
  TU_OK(rmsnorm_fold_weight(&cfg, d, nn, g, W.data, nn, Wf.data, nn));
  TU_OK(rmsnorm_linear_forward(ctx, &cfg, ROWS, d, nn, x.data, d, Wf.data, nn, bias, z.data, nn,
                               NULL));
  cmp_rows(&cc, "z", &z, wz, 0, mz);
  TU_OK(rmsnorm_linear_backward(ctx, &cfg, ROWS, d, nn, x.data, d, g, W.data, nn, Wf.data, nn,
                                dz.data, nn, dx.data, d, dg, dW.data, nn, db));
  cmp_rows(&cc, "dx", &dx, wdx, 0, mag);
  cmp_vec(&cc, "dW", adt, dW.data, wdW, d * nn, 0);
  cmp_vec(&cc, "dweight", RMSNORM_F32, dg, wdg, d, 0);
  cmp_vec(&cc, "dbias", RMSNORM_F32, db, wdb, nn, 0);
  tu_free(&W), tu_free(&Wf), tu_free(&dW), tu_free(&x), tu_free(&z), tu_free(&dz), tu_free(&dx);
  free(g), free(bias), free(w), free(xv), free(Wv), free(dzv), free(xh), free(wz), free(dY);
  free(wdx), free(wdW), free(wdg), free(wdb), free(dg), free(db);
}

/* ---- column shards -------------------------------------------------------- */

/* Two shards cut at d/2 (for d = 1 the first is empty), the statistics and
 * dots summed between the steps: RMSNorm of the whole rows. fp64 data is
 * the documented exception: an infinity in the statistic's columns gives a
 * NaN row (its sum cannot be told from one that overflowed double).
 * Variants: 0 weight + bias; 1 partial 0.5, eps outside. */
static void shard_case(const nf *c, int v) {
  rmsnorm_dtype dt = c->dt;
  size_t d = c->d, n = ROWS * d, es = rn_dtype_size(dt), cut = d / 2;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-5;
  if (v) cfg.partial = 0.5, cfg.flags |= RMSNORM_FLAG_EPS_OUTSIDE;
  size_t k = v ? tu_partial_k(0.5, d) : d;
  float *g = fvec(d), *bias = v ? NULL : fvec(d);
  ld *w = lds(d), *b = bias ? lds(d) : NULL;
  for (size_t j = 0; j < d; j++) {
    w[j] = g[j];
    if (b) b[j] = bias[j];
  }
  rms_opts o = {k, cfg.eps, v, w, b};
  tu_tensor x = mat(dt, ROWS, d, 1), dy = mat(dt, ROWS, d, 1), y = tu_alloc(dt, ROWS, d, d);
  tu_tensor dx = tu_alloc(dt, ROWS, d, d);
  put_special(&x, SROW, c);
  ld *xv = vals(&x), *dyv = vals(&dy), *wy = lds(n), *wr = lds(ROWS), *wdx = lds(n);
  ld *wdw = lds(d), *wdb = lds(d);
  int fp64_inf = 0; /* the fp64 exception: an infinity among the first k columns */
  for (size_t j = 0; j < k; j++) fp64_inf |= dt == RMSNORM_F64 && isinf((double)xv[SROW * d + j]);
  ld mag[ROWS] = {0};
  for (size_t i = 0; i < ROWS; i++) {
    int exc = i == SROW && fp64_inf;
    rms_fwd_row(xv + i * d, d, &o, wy + i * d, wr + i);
    rms_bwd_row(xv + i * d, dyv + i * d, d, &o, wdx + i * d, exc ? NULL : wdw,
                bias && !exc ? wdb : NULL, mag + i);
    if (!exc) continue;
    wr[i] = NAN; /* r NaN: every output and dweight NaN, dbias as always */
    for (size_t j = 0; j < d; j++) {
      wy[i * d + j] = wdx[i * d + j] = wdw[j] = NAN;
      wdb[j] += dyv[i * d + j];
    }
  }
  double s[2][ROWS], t[2][ROWS], st[ROWS], dt2[ROWS], rstd[2][ROWS];
  float *dw = malloc(d * 4), *db = malloc(d * 4);
  size_t off[2] = {0, cut}, wid[2] = {cut, d - cut};
  for (int p = 0; p < 2; p++)
    TU_OK(rmsnorm_shard_stats(ctx, &cfg, ROWS, d, off[p], wid[p],
                              (char *)x.data + off[p] * es, d, s[p]));
  for (size_t i = 0; i < ROWS; i++) st[i] = s[0][i] + s[1][i];
  for (int p = 0; p < 2; p++)
    TU_OK(rmsnorm_shard_forward(ctx, &cfg, ROWS, d, off[p], wid[p], (char *)x.data + off[p] * es,
                                d, g + off[p], bias ? bias + off[p] : NULL, st,
                                (char *)y.data + off[p] * es, d, rstd[p]));
  for (int p = 0; p < 2; p++)
    TU_OK(rmsnorm_shard_backward_dots(ctx, &cfg, ROWS, d, off[p], wid[p],
                                      (char *)x.data + off[p] * es, d,
                                      (char *)dy.data + off[p] * es, d, g + off[p], st, t[p]));
  for (size_t i = 0; i < ROWS; i++) dt2[i] = t[0][i] + t[1][i];
  for (int p = 0; p < 2; p++)
    TU_OK(rmsnorm_shard_backward(ctx, &cfg, ROWS, d, off[p], wid[p], (char *)x.data + off[p] * es,
                                 d, (char *)dy.data + off[p] * es, d, g + off[p], st, dt2,
                                 (char *)dx.data + off[p] * es, d, dw + off[p],
                                 bias ? db + off[p] : NULL));
  nf cc = *c;
  cc.op = v ? "shard partial" : "shard";
  cmp_rows(&cc, "y", &y, wy, 1, NULL);
  cmp_vec(&cc, "rstd", acc_of(dt), rstd[1], wr, ROWS, 1);
  cmp_rows(&cc, "dx", &dx, wdx, 0, mag);
  cmp_vec(&cc, "dweight", RMSNORM_F32, dw, wdw, d, 0);
  if (bias) cmp_vec(&cc, "dbias", RMSNORM_F32, db, wdb, d, 0);
  tu_free(&x), tu_free(&dy), tu_free(&y), tu_free(&dx);
  free(g), free(bias), free(w), free(b), free(xv), free(dyv), free(wy), free(wr), free(wdx);
  free(wdw), free(wdb), free(dw), free(db);
}

/* ---- quantized outputs ----------------------------------------------------- */

typedef struct qfmt {
  const char *name;
  rmsnorm_qformat format;
  size_t group;
  unsigned flags;
  int fixed; /* a static scale */
} qfmt;

static const qfmt qfmts[] = {
    {"int8/row", RMSNORM_QF_INT8, 0, 0, 0},
    {"e4m3/row pow2", RMSNORM_QF_FP8_E4M3, 0, RMSNORM_QUANT_SCALE_POW2, 0},
    {"int8/static", RMSNORM_QF_INT8, 0, 0, 1},
    {"e4m3/static", RMSNORM_QF_FP8_E4M3, 0, 0, 1},
    {"int8/32", RMSNORM_QF_INT8, 32, 0, 0},
    {"e4m3/64 pow2", RMSNORM_QF_FP8_E4M3, 64, RMSNORM_QUANT_SCALE_POW2, 0},
    {"int8/row e8m0", RMSNORM_QF_INT8, 0, RMSNORM_QUANT_SCALE_E8M0, 0},
    {"e4m3/32 e8m0", RMSNORM_QF_FP8_E4M3, 32, RMSNORM_QUANT_SCALE_E8M0, 0},
    {"q8_0", RMSNORM_QF_Q8_0, 0, 0, 0},
    {"q8_1", RMSNORM_QF_Q8_1, 0, 0, 0},
    {"q8_k", RMSNORM_QF_Q8_K, 0, 0, 0},
    {"mxfp4", RMSNORM_QF_MXFP4, 0, 0, 0},
    {"mxfp8", RMSNORM_QF_MXFP8_E4M3, 0, 0, 0},
};
#define NQFMTS (sizeof qfmts / sizeof qfmts[0])

/* Elements per scale (a block or group; d for one scale per row). */
static size_t qblock(const qfmt *f, size_t d) {
  switch (f->format) {
    case RMSNORM_QF_Q8_0: case RMSNORM_QF_Q8_1: case RMSNORM_QF_MXFP4: case RMSNORM_QF_MXFP8_E4M3:
      return 32;
    case RMSNORM_QF_Q8_K: return 256;
    default: return f->group ? f->group : d;
  }
}

/* Block b of a row: whether its scale is NaN and its codes all zero, and its
 * bytes (codes and scale) as one span for comparing. */
typedef struct qblk {
  int scale_nan, codes_zero;
} qblk;

static qblk qblock_at(const qfmt *f, const unsigned char *codes, const unsigned char *scales,
                      size_t b, size_t bs) {
  qblk r = {0, 1};
  const unsigned char *cs = codes + b * bs; /* codes of the per-element formats */
  size_t n = bs;
  switch (f->format) {
    case RMSNORM_QF_Q8_0: {
      const unsigned char *p = codes + b * 34;
      uint16_t h = (uint16_t)(p[0] | p[1] << 8);
      r.scale_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
      cs = p + 2, n = 32;
      break;
    }
    case RMSNORM_QF_Q8_1: { /* d and s both NaN */
      const unsigned char *p = codes + b * 36;
      uint16_t h = (uint16_t)(p[0] | p[1] << 8), hs = (uint16_t)(p[2] | p[3] << 8);
      r.scale_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) && (hs & 0x7c00) == 0x7c00 && (hs & 0x3ff);
      cs = p + 4, n = 32;
      break;
    }
    case RMSNORM_QF_Q8_K: {
      const unsigned char *p = codes + b * 292;
      float s;
      memcpy(&s, p, 4);
      r.scale_nan = isnan(s);
      cs = p + 4, n = 256 + 32; /* the codes and the bsums */
      break;
    }
    case RMSNORM_QF_MXFP4: {
      const unsigned char *p = codes + b * 17;
      r.scale_nan = p[0] == 0xff;
      cs = p + 1, n = 16;
      break;
    }
    case RMSNORM_QF_MXFP8_E4M3: r.scale_nan = scales[b] == 0xff; break;
    default: {
      if (f->fixed) break;
      if (f->flags & RMSNORM_QUANT_SCALE_E8M0) {
        r.scale_nan = scales[b] == 0xff;
        break;
      }
      float s;
      memcpy(&s, scales + b * 4, 4);
      r.scale_nan = isnan(s);
      break;
    }
  }
  for (size_t j = 0; j < n; j++) r.codes_zero &= cs[j] == 0;
  return r;
}

/* The bytes of a block of a row (codes, then its scale) into out; @return
 * their count. */
static size_t qblock_bytes(const qfmt *f, const unsigned char *codes, const unsigned char *scales,
                           size_t b, size_t bs, unsigned char *out) {
  switch (f->format) {
    case RMSNORM_QF_Q8_0: memcpy(out, codes + b * 34, 34); return 34;
    case RMSNORM_QF_Q8_1: memcpy(out, codes + b * 36, 36); return 36;
    case RMSNORM_QF_Q8_K: memcpy(out, codes + b * 292, 292); return 292;
    case RMSNORM_QF_MXFP4: memcpy(out, codes + b * 17, 17); return 17;
    case RMSNORM_QF_MXFP8_E4M3:
      memcpy(out, codes + b * bs, bs), out[bs] = scales[b];
      return bs + 1;
    default:
      memcpy(out, codes + b * bs, bs);
      if (f->fixed) return bs;
      if (f->flags & RMSNORM_QUANT_SCALE_E8M0) {
        out[bs] = scales[b];
        return bs + 1;
      }
      memcpy(out + bs, scales + b * 4, 4);
      return bs + 4;
  }
}

/* One format: x with the case's value in row SROW (or, `in_weight`, the
 * weight at column pos for every row), against a run on the same data with a
 * finite value there. Blocks whose y holds a NaN: NaN scale, zero codes;
 * with a static scale, int8 codes 0 and e4m3 NaN codes (none can carry a NaN
 * scale); other blocks the bytes of the finite run. */
static void quant_fmt(const nf *c, const qfmt *f, int in_weight) {
  rmsnorm_dtype dt = c->dt;
  size_t d = c->d, bs = qblock(f, d);
  if (d % bs) return;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-6;
  rmsnorm_quant q;
  rmsnorm_quant_init(&q, f->format);
  q.group = f->group;
  q.flags = f->flags;
  float s0 = 0.05f;
  if (f->fixed) q.static_scale = &s0;
  size_t row_bytes, row_scales;
  if (rmsnorm_quant_row_size(&q, d, &row_bytes, &row_scales) != RMSNORM_OK) {
    tu_check(0, "%s: row size", f->name);
    return;
  }
  size_t sbytes = f->format == RMSNORM_QF_MXFP8_E4M3 || (f->flags & RMSNORM_QUANT_SCALE_E8M0) ? 1 : 4;
  size_t nb = d / bs;
  float *g = fvec(d), *g2 = malloc(d * 4);
  memcpy(g2, g, d * 4);
  tu_tensor x = mat(dt, ROWS, d, 1);
  tu_tensor x2 = tu_alloc(dt, ROWS, d, d);
  memcpy(x2.data, x.data, x.bytes);
  if (in_weight) {
    g[c->pos] = c->kind == K_NAN ? NAN : c->kind == K_NINF ? -INFINITY : INFINITY;
  } else {
    put_special(&x, SROW, c);
    tu_set(&x2, SROW, c->pos, 0.5); /* finite: the other rows' bytes stay */
    if (c->kind == K_BOTH) tu_set(&x2, SROW, c->pos2, 0.5);
  }
  unsigned char *codes = calloc(ROWS * row_bytes, 1), *codes2 = calloc(ROWS * row_bytes, 1);
  unsigned char *sc = calloc(ROWS * row_scales * sbytes + 1, 1);
  unsigned char *sc2 = calloc(ROWS * row_scales * sbytes + 1, 1);
  unsigned char *b1 = malloc(bs + 300), *b2 = malloc(bs + 300);
  rmsnorm_status st1 = rmsnorm_forward_quantized(ctx, &cfg, ROWS, d, x.data, d, g, NULL, &q, codes,
                                                 row_bytes, row_scales ? sc : NULL, row_scales, NULL);
  rmsnorm_status st2 = rmsnorm_forward_quantized(ctx, &cfg, ROWS, d, x2.data, d, g2, NULL, &q,
                                                 codes2, row_bytes, row_scales ? sc2 : NULL,
                                                 row_scales, NULL);
  if (!tu_check(st1 == RMSNORM_OK && st2 == RMSNORM_OK, "%s: status", f->name)) goto done;
  /* y of the non-finite row as the formula gives it, in float */
  ld *xv = vals(&x), y[MAXD], w[MAXD];
  for (size_t j = 0; j < d; j++) w[j] = g[j];
  rms_opts o = {d, cfg.eps, 0, w, NULL};
  int bad = 0;
  for (size_t i = 0; i < ROWS && !bad; i++) {
    rms_fwd_row(xv + i * d, d, &o, y, NULL);
    for (size_t b = 0; b < nb && !bad; b++) {
      int nan = 0, inf = 0;
      for (size_t j = b * bs; j < (b + 1) * bs; j++) {
        float yf = (float)y[j];
        nan |= isnan(yf);
        inf |= isinf(yf);
      }
      const unsigned char *cr = codes + i * row_bytes, *sr = sc + i * row_scales * sbytes;
      qblk k = qblock_at(f, cr, sr, b, bs);
      if (nan && !f->fixed) {
        bad = !(k.scale_nan && k.codes_zero);
      } else if (nan || inf) { /* static: NaN and Inf codes per element; inf: the format's rule */
        bad = 0;
      } else {
        size_t n1 = qblock_bytes(f, cr, sr, b, bs, b1);
        qblock_bytes(f, codes2 + i * row_bytes, sc2 + i * row_scales * sbytes, b, bs, b2);
        bad = in_weight || i != SROW ? memcmp(b1, b2, n1) != 0 : k.scale_nan;
      }
      if (bad)
        tu_check(0, "quant %s %s %s d=%zu %s at %zu: row %zu block %zu (NaN in y %d): scale NaN %d, "
                 "codes zero %d", f->name, in_weight ? "weight" : "x", tu_dtype_name(dt), d,
                 kind_names[c->kind], c->pos, i, b, nan, k.scale_nan, k.codes_zero);
    }
  }
  if (!bad) tu_check(1, "");
  /* with a static scale the NaN elements' codes: int8 0, e4m3 a NaN code */
  if (f->fixed && !in_weight && c->kind == K_NAN) {
    int ok = 1;
    for (size_t j = 0; j < d; j++) {
      unsigned char cj = codes[SROW * row_bytes + j];
      ok &= f->format == RMSNORM_QF_INT8 ? cj == 0 : (cj & 0x7f) == 0x7f;
    }
    tu_check(ok, "quant %s %s d=%zu: NaN row codes", f->name, tu_dtype_name(dt), d);
  }
  free(xv);
done:
  tu_free(&x), tu_free(&x2);
  free(g), free(g2), free(codes), free(codes2), free(sc), free(sc2), free(b1), free(b2);
}

static void quant_case(const nf *c) {
  for (size_t k = 0; k < NQFMTS; k++) {
    quant_fmt(c, &qfmts[k], 0);
    if (c->kind == K_NAN || c->kind == K_INF) quant_fmt(c, &qfmts[k], 1);
  }
}

/* ---- the sweep ------------------------------------------------------------- */

static void sweep(void) {
  /* reduced (qemu, sanitizers): the long rows (d = 4096, past a block and a row
   * group) with the NaN and the infinities of both signs in the middle only */
  int reduced = tu_reduced();
  for (int dt = 0; dt < 4; dt++)
    for (size_t di = 0; di < NDIMS + 2; di++) {
      /* rope's head_dim is even; the block formats need multiples of 256 */
      int rope_only = di == NDIMS, quant_only = di == NDIMS + 1;
      size_t d = rope_only ? 34 : quant_only ? 256 : dims[di];
      size_t pos[3] = {0, d / 2, d - 1};
      for (size_t pi = 0; pi < 3; pi++) {
        if (pi && pos[pi] == pos[pi - 1]) continue;
        for (int kind = 0; kind < NKINDS; kind++) {
          if (kind == K_BOTH && d == 1) continue;
          if (reduced && d == MAXD && (pi != 1 || (kind != K_NAN && kind != K_BOTH))) continue;
          nf c = {(rmsnorm_dtype)dt, d, pos[pi], (pos[pi] + 1 + d / 3) % d, kind, ""};
          tu_seed(((uint64_t)dt * 97 + di) * 1009 + pi * 17 + (uint64_t)kind);
          if (rope_only || d % 2 == 0) {
            rope_case(&c, 0);
            rope_case(&c, 1);
          }
          if (rope_only) continue;
          quant_case(&c);
          if (quant_only) continue;
          for (int v = 0; v < 4; v++) rms_case(&c, v);
          ln_case(&c);
          add_case(&c);
          qk_case(&c);
          for (int v = 0; v < 3; v++) gated_case(&c, v);
          sandwich_case(&c);
          linear_case(&c);
          shard_case(&c, 0);
          shard_case(&c, 1);
        }
      }
    }
}

int main(void) {
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) return 2;
  sweep();
  rmsnorm_context_free(ctx);
  return tu_finish("test_nonfinite");
}
