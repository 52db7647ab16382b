/* test_gated.c - gated RMSNorm (rmsnorm_gated_forward / _backward) from the
 * user's side:
 *   - against the long double oracle (gated_oracle.h, itself held to finite
 *     differences by test_gated_oracle.c) for both gate orders, SiLU and
 *     sigmoid, grouped and whole-row statistics, every dtype, ragged d;
 *   - the fp64 backward against central finite differences of the library's
 *     own fp64 forward;
 *   - every kernel set at 1, 2 and 3 threads bit for bit equal to the scalar
 *     reference at 1 thread (y, rstd, dx, dz, dweight), with strides, in
 *     place use, saved or recomputed rstd, and rows that take the long
 *     double path (overflowing squares, zero rows with eps = 0, NaN);
 *   - HF's roundings (RMSNORM_FLAG_ROUND_BEFORE_WEIGHT) against the oracle
 *     with the modules' rounding steps applied;
 *   - errors: each bad argument gets its status and writes nothing. */
#include "testutil.h"
#include "gated_oracle.h"

static rmsnorm_context *ctx;
/* every data dtype; fp16 and bf16 last (weights of the data's dtype) */
static const rmsnorm_dtype dts[] = {RMSNORM_F32, RMSNORM_F64, RMSNORM_F16, RMSNORM_BF16};

typedef struct tcase {
  rmsnorm_dtype dt;
  size_t rows, d, group; /* group 0: the whole row */
  double eps;
  int sigmoid, norm_first, hf, weight;
  int wdata, offset; /* a weight of the data's dtype (fp16/bf16); Gemma's 1 + g */
} tcase;

static rmsnorm_config config_of(const tcase *c) {
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, c->dt);
  cfg.eps = c->eps;
  cfg.param_dtype = c->wdata ? c->dt : RMSNORM_F32;
  if (c->hf) cfg.flags |= RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
  if (c->offset) cfg.flags |= RMSNORM_FLAG_WEIGHT_OFFSET;
  return cfg;
}

static rmsnorm_gate gate_of(const tcase *c) {
  rmsnorm_gate g;
  rmsnorm_gate_init(&g, c->sigmoid ? RMSNORM_GATE_SIGMOID : RMSNORM_GATE_SILU);
  g.group = c->group;
  if (c->norm_first) g.flags |= RMSNORM_GATE_NORM_FIRST;
  return g;
}

/* Real-looking rows: N(0,1) with one outlier channel at 25x, gates around
 * 0 with a wide tail (SiLU's negative dip and both saturations are met). */
static void fill_data(tu_tensor *x, tu_tensor *z, tu_tensor *dy) {
  for (size_t i = 0; i < x->rows; i++)
    for (size_t j = 0; j < x->d; j++) {
      double v = tu_normal();
      if (j % 97 == 5) v *= 25;
      tu_set(x, i, j, v);
      tu_set(z, i, j, 3 * tu_normal());
      if (dy) tu_set(dy, i, j, tu_normal());
    }
}

static void fill_weight(void *w, rmsnorm_dtype pdt, size_t d) {
  for (size_t j = 0; j < d; j++) rn_store(w, pdt, j, 1 + 0.5 * tu_normal());
}

/* Tolerances, relative to the row's largest oracle value: the data dtype's
 * rounding of the output (a few half-ulps), plus float compute. */
static double tol_of(rmsnorm_dtype dt, int hf) {
  switch (dt) {
    case RMSNORM_F64: return 1e-12;
    case RMSNORM_F32: return 2e-5;
    case RMSNORM_F16: return hf ? 4e-3 : 2e-3;
    default: return hf ? 3e-2 : 1.6e-2;
  }
}

/* The oracle's forward with HF's roundings: v rounded before the weight,
 * and (norm first) the product with the weight before the gate. */
static gl_t round_dt(rmsnorm_dtype dt, gl_t v) {
  unsigned char b[8];
  rn_store(b, dt, 0, (double)v);
  return rn_load(b, dt, 0);
}

static void oracle_row(const tcase *c, const tu_tensor *x, const tu_tensor *z, const void *w,
                       rmsnorm_dtype pdt, size_t i, gl_t *y, gl_t *r) {
  size_t d = c->d, gs = c->group ? c->group : d;
  gated_opts o = {gs, 1e-6L, c->sigmoid, c->norm_first};
  static gl_t xr[GATED_ORACLE_MAX_D], zr[GATED_ORACLE_MAX_D], wr[GATED_ORACLE_MAX_D];
  for (size_t j = 0; j < d; j++) {
    xr[j] = tu_get(x, i, j);
    zr[j] = tu_get(z, i, j);
    wr[j] = w ? (c->offset ? 1 : 0) + rn_load(w, pdt, j) : 1;
  }
  if (!c->hf || c->dt == RMSNORM_F32 || c->dt == RMSNORM_F64) {
    gated_forward_row(xr, zr, w ? wr : NULL, d, &o, y, r);
    return;
  }
  /* the HF modules' steps */
  gl_t n[GATED_ORACLE_MAX_D];
  for (size_t j = 0; j < d; j++) n[j] = c->norm_first ? xr[j] : xr[j] * gated_act(&o, zr[j]);
  gated_group_r(n, d, &o, r);
  for (size_t j = 0; j < d; j++) {
    gl_t v = round_dt(c->dt, n[j] * r[j / gs]) * wr[j];
    y[j] = c->norm_first ? round_dt(c->dt, v) * gated_act(&o, zr[j]) : v;
  }
}

/* The forward and backward of one case against the oracle. */
static void check_oracle(const tcase *c) {
  size_t d = c->d, rows = c->rows, gs = c->group ? c->group : d, ng = d / gs, ld = d + 3;
  rmsnorm_config cfg = config_of(c);
  rmsnorm_gate g = gate_of(c);
  rmsnorm_dtype pdt = c->wdata ? c->dt : RMSNORM_F32;
  size_t as = c->dt == RMSNORM_F64 ? 8 : 4;
  if (c->dt == RMSNORM_F64) cfg.param_dtype = pdt = RMSNORM_F64;
  tu_tensor x = tu_alloc(c->dt, rows, d, ld), z = tu_alloc(c->dt, rows, d, ld);
  tu_tensor dy = tu_alloc(c->dt, rows, d, d), y = tu_alloc(c->dt, rows, d, ld);
  tu_tensor dx = tu_alloc(c->dt, rows, d, d), dz = tu_alloc(c->dt, rows, d, ld);
  fill_data(&x, &z, &dy);
  void *w = c->weight ? malloc(d * 8) : NULL, *dw = c->weight ? malloc(d * 8) : NULL;
  void *rstd = malloc(rows * ng * as);
  if (w) fill_weight(w, pdt, d);
  double tol = tol_of(c->dt, c->hf);
  static gl_t yo[GATED_ORACLE_MAX_D], ro[GATED_ORACLE_MAX_D], dxo[GATED_ORACLE_MAX_D],
      dzo[GATED_ORACLE_MAX_D], dwo[GATED_ORACLE_MAX_D], xr[GATED_ORACLE_MAX_D],
      zr[GATED_ORACLE_MAX_D], dyr[GATED_ORACLE_MAX_D], wr[GATED_ORACLE_MAX_D];
  const char *wname = !c->weight ? " no-weight" : !c->wdata ? "" : c->offset ? " 1+g (dtype)"
                                                                           : " weight (dtype)";
  char what[160];
  snprintf(what, sizeof what, "%s d=%zu group=%zu %s %s%s%s", tu_dtype_name(c->dt), d, gs,
           c->sigmoid ? "sigmoid" : "silu", c->norm_first ? "norm-first" : "gate-first",
           c->hf ? " hf" : "", wname);
  rmsnorm_status st = rmsnorm_gated_forward(ctx, &cfg, &g, rows, d, x.data, ld, z.data, ld, w,
                                            y.data, ld, rstd);
  if (!tu_check(st == RMSNORM_OK, "%s: forward -> %s", what, rmsnorm_status_name(st))) goto out;
  for (size_t j = 0; j < d; j++) dwo[j] = 0;
  gated_opts o = {gs, 1e-6L, c->sigmoid, c->norm_first};
  for (size_t i = 0; i < rows; i++) {
    oracle_row(c, &x, &z, w, pdt, i, yo, ro);
    gl_t big = 0;
    for (size_t j = 0; j < d; j++) big = fabsl(yo[j]) > big ? fabsl(yo[j]) : big;
    int ok = 1;
    for (size_t j = 0; j < d && ok; j++)
      ok = tu_check(fabsl(tu_get(&y, i, j) - yo[j]) <= tol * (fabsl(yo[j]) + 1e-3L * big) + 1e-30,
                    "%s: y[%zu][%zu] = %.9g, oracle %.9Lg", what, i, j, tu_get(&y, i, j), yo[j]);
    for (size_t k = 0; k < ng && ok; k++) {
      double rv = as == 8 ? rn_ld_f64(rstd, i * ng + k) : rn_ld_f32(rstd, i * ng + k);
      ok = tu_check(fabsl(rv - ro[k]) <= 1e-6L * ro[k], "%s: rstd[%zu][%zu] = %.9g, oracle %.9Lg",
                    what, i, k, rv, ro[k]);
    }
    /* the backward */
    for (size_t j = 0; j < d; j++) {
      xr[j] = tu_get(&x, i, j), zr[j] = tu_get(&z, i, j), dyr[j] = tu_get(&dy, i, j);
      wr[j] = w ? (c->offset ? 1 : 0) + rn_load(w, pdt, j) : 1;
    }
    gated_backward_row(xr, zr, w ? wr : NULL, dyr, d, &o, dxo, dzo, dwo);
    (void)dxo;
  }
  st = rmsnorm_gated_backward(ctx, &cfg, &g, rows, d, x.data, ld, z.data, ld, dy.data, d, w,
                              rstd, dx.data, d, dz.data, ld, dw);
  if (!tu_check(st == RMSNORM_OK, "%s: backward -> %s", what, rmsnorm_status_name(st))) goto out;
  /* per-row oracle again for dx, dz (dwo already holds the sum) */
  for (size_t i = 0; i < rows; i++) {
    for (size_t j = 0; j < d; j++) {
      xr[j] = tu_get(&x, i, j), zr[j] = tu_get(&z, i, j), dyr[j] = tu_get(&dy, i, j);
      wr[j] = w ? (c->offset ? 1 : 0) + rn_load(w, pdt, j) : 1;
    }
    gated_backward_row(xr, zr, w ? wr : NULL, dyr, d, &o, dxo, dzo, NULL);
    /* the scale of the row's terms before they cancel: |dy w r| times the
     * gate's factor (dx) or x act' (dz); dx of a one-column group, for one,
     * cancels to ~eps/u^2 of it */
    gl_t bx = 0, bz = 0, n[GATED_ORACLE_MAX_D];
    for (size_t j = 0; j < d; j++) n[j] = c->norm_first ? xr[j] : xr[j] * gated_act(&o, zr[j]);
    gated_group_r(n, d, &o, ro);
    for (size_t j = 0; j < d; j++) {
      gl_t t = fabsl(dyr[j] * wr[j] * ro[j / gs]) * (1 + fabsl(gated_act(&o, zr[j])));
      gl_t tz = t * (1 + fabsl(xr[j] * gated_act_prime(&o, zr[j])));
      bx = fabsl(dxo[j]) > bx ? fabsl(dxo[j]) : bx;
      bz = fabsl(dzo[j]) > bz ? fabsl(dzo[j]) : bz;
      bx = t > bx ? t : bx;
      bz = tz > bz ? tz : bz;
    }
    /* the backward takes the forward's roundings as the identity: with HF's,
     * the bound widens by that rounding */
    double tb = c->dt == RMSNORM_F32 ? 1e-4 : c->dt == RMSNORM_F64 ? 1e-10 : tol;
    int ok = 1;
    for (size_t j = 0; j < d && ok; j++) {
      ok = tu_check(fabsl(tu_get(&dx, i, j) - dxo[j]) <= tb * (fabsl(dxo[j]) + 1e-2L * bx) + 1e-30,
                    "%s: dx[%zu][%zu] = %.9g, oracle %.9Lg", what, i, j, tu_get(&dx, i, j), dxo[j]);
      ok = ok && tu_check(fabsl(tu_get(&dz, i, j) - dzo[j]) <= tb * (fabsl(dzo[j]) + 1e-2L * bz) + 1e-30,
                          "%s: dz[%zu][%zu] = %.9g, oracle %.9Lg", what, i, j, tu_get(&dz, i, j),
                          dzo[j]);
    }
  }
  if (dw) {
    gl_t bw = 0;
    for (size_t j = 0; j < d; j++) bw = fabsl(dwo[j]) > bw ? fabsl(dwo[j]) : bw;
    double tw = c->dt == RMSNORM_F64 ? 1e-10 : c->dt == RMSNORM_F32 ? 1e-4 : tol;
    for (size_t j = 0; j < d; j++)
      if (!tu_check(fabsl(rn_load(dw, pdt, j) - dwo[j]) <= tw * (fabsl(dwo[j]) + 1e-2L * bw),
                    "%s: dweight[%zu] = %.9g, oracle %.9Lg", what, j, rn_load(dw, pdt, j), dwo[j]))
        break;
  }
out:
  tu_free(&x), tu_free(&z), tu_free(&dy), tu_free(&y), tu_free(&dx), tu_free(&dz);
  free(w), free(dw), free(rstd);
}

/* The fp64 backward against central differences of the library's fp64
 * forward: L = sum dy * y, dL/dx_j and dL/dz_j. */
static void check_fd(size_t d, size_t group, int sigmoid, int norm_first) {
  tcase c = {RMSNORM_F64, 1, d, group, 1e-6, sigmoid, norm_first, 0, 1, 0, 0};
  rmsnorm_config cfg = config_of(&c);
  cfg.param_dtype = RMSNORM_F64;
  rmsnorm_gate g = gate_of(&c);
  double x[64], z[64], dy[64], w[64], y[64], dx[64], dz[64], dw[64];
  for (size_t j = 0; j < d; j++)
    x[j] = tu_normal(), z[j] = 2 * tu_normal(), dy[j] = tu_normal(), w[j] = 1 + tu_normal() / 2;
  TU_OK(rmsnorm_gated_backward(ctx, &cfg, &g, 1, d, x, d, z, d, dy, d, w, NULL, dx, d, dz, d, dw));
  for (int which = 0; which < 2; which++)
    for (size_t j = 0; j < d; j++) {
      double *p = which ? z : x, keep = p[j], h = 1e-6 * (fabs(keep) + 1), lp = 0, lm = 0;
      p[j] = keep + h;
      TU_OK(rmsnorm_gated_forward(ctx, &cfg, &g, 1, d, x, d, z, d, w, y, d, NULL));
      for (size_t i = 0; i < d; i++) lp += dy[i] * y[i];
      p[j] = keep - h;
      TU_OK(rmsnorm_gated_forward(ctx, &cfg, &g, 1, d, x, d, z, d, w, y, d, NULL));
      for (size_t i = 0; i < d; i++) lm += dy[i] * y[i];
      p[j] = keep;
      double fd = (lp - lm) / (2 * h), an = which ? dz[j] : dx[j];
      tu_check(fabs(fd - an) <= 1e-6 * (fabs(fd) + 1), "fd d=%zu group=%zu %s %s d%s[%zu]: %.12g vs %.12g",
               d, group, sigmoid ? "sigmoid" : "silu", norm_first ? "norm-first" : "gate-first",
               which ? "z" : "x", j, an, fd);
    }
}

/* ---- every set and thread count against scalar at 1 thread ------------- */

typedef struct outs {
  tu_tensor y, dx, dz;
  void *rstd, *dw;
} outs;

static int run_all(const tcase *c, const tu_tensor *x, const tu_tensor *z, const tu_tensor *dy,
                   const void *w, int inplace, int saved, outs *o) {
  rmsnorm_config cfg = config_of(c);
  rmsnorm_gate g = gate_of(c);
  size_t rows = c->rows, d = c->d, ld = x->ld;
  tu_tensor xi = *x, zi = *z, dyi = *dy;
  /* inplace 1: y = x, dx = dy, dz = z; 2: y = z, dx = x */
  o->y = tu_alloc(c->dt, rows, d, ld);
  o->dx = tu_alloc(c->dt, rows, d, ld);
  o->dz = tu_alloc(c->dt, rows, d, ld);
  memcpy(o->y.data, inplace == 1 ? x->data : z->data, x->bytes);
  memcpy(o->dx.data, inplace == 1 ? dy->data : x->data, x->bytes);
  memcpy(o->dz.data, z->data, x->bytes);
  rmsnorm_status st;
  if (inplace) { /* work on copies that the outputs replace */
    xi = tu_alloc(c->dt, rows, d, ld), zi = tu_alloc(c->dt, rows, d, ld);
    memcpy(xi.data, x->data, x->bytes), memcpy(zi.data, z->data, x->bytes);
    st = rmsnorm_gated_forward(ctx, &cfg, &g, rows, d, inplace == 1 ? o->y.data : xi.data, ld,
                               inplace == 2 ? o->y.data : zi.data, ld, w, o->y.data, ld, o->rstd);
  } else {
    st = rmsnorm_gated_forward(ctx, &cfg, &g, rows, d, x->data, ld, z->data, ld, w, o->y.data,
                               ld, o->rstd);
  }
  if (st != RMSNORM_OK) return 0;
  if (inplace == 1) {
    dyi = tu_alloc(c->dt, rows, d, ld);
    memcpy(dyi.data, dy->data, x->bytes);
    st = rmsnorm_gated_backward(ctx, &cfg, &g, rows, d, x->data, ld, o->dz.data, ld, o->dx.data,
                                ld, w, saved ? o->rstd : NULL, o->dx.data, ld, o->dz.data, ld,
                                o->dw);
    tu_free(&dyi);
  } else if (inplace == 2) {
    st = rmsnorm_gated_backward(ctx, &cfg, &g, rows, d, o->dx.data, ld, z->data, ld, dy->data,
                                ld, w, saved ? o->rstd : NULL, o->dx.data, ld, o->dz.data, ld,
                                o->dw);
  } else {
    st = rmsnorm_gated_backward(ctx, &cfg, &g, rows, d, x->data, ld, z->data, ld, dy->data, ld,
                                w, saved ? o->rstd : NULL, o->dx.data, ld, o->dz.data, ld, o->dw);
  }
  if (inplace) tu_free(&xi), tu_free(&zi);
  return st == RMSNORM_OK;
}

static void free_outs(outs *o) {
  tu_free(&o->y), tu_free(&o->dx), tu_free(&o->dz);
}

static void check_sets(const tcase *c, int special) {
  size_t rows = c->rows, d = c->d, gs = c->group ? c->group : d, ng = d / gs, ld = d + 5;
  size_t as = c->dt == RMSNORM_F64 ? 8 : 4;
  tu_tensor x = tu_alloc(c->dt, rows, d, ld), z = tu_alloc(c->dt, rows, d, ld);
  tu_tensor dy = tu_alloc(c->dt, rows, d, ld);
  fill_data(&x, &z, &dy);
  special = special && d >= 4;
  if (special) { /* rows for the long double path (as many of the four as there are rows) */
    double big = c->dt == RMSNORM_F64 ? 1e200 : c->dt == RMSNORM_F16 ? 6e4 : 3e19;
    for (size_t j = 0; j < d; j++) {
      tu_set(&x, 0, j, j % 3 ? big : -big);
      tu_set(&z, 0, j, 5);
      if (rows > 1) tu_set(&x, 1, j, 0);
      if (rows > 2) tu_set(&x, 2, j, j == d / 2 ? NAN : 1);
      if (rows > 3)
        tu_set(&x, 3, j, c->dt == RMSNORM_F64 ? 1e-200 : c->dt == RMSNORM_F16 ? 1e-7 : 1e-30);
    }
  }
  rmsnorm_dtype pdt = c->wdata ? c->dt : RMSNORM_F32;
  void *w = c->weight ? malloc(d * 4) : NULL;
  if (w) fill_weight(w, pdt, d);
  rmsnorm_isa isas[] = {RMSNORM_ISA_SCALAR, RMSNORM_ISA_AVX2, RMSNORM_ISA_AVX512,
                        RMSNORM_ISA_NEON};
  outs ref = {.rstd = malloc(rows * ng * as), .dw = w ? calloc(d, 4) : NULL};
  rmsnorm_context_set_isa(ctx, RMSNORM_ISA_SCALAR);
  rmsnorm_context_set_threads(ctx, 1);
  tcase cc = *c;
  if (special) cc.hf = 0, cc.eps = 0; /* eps = 0: zero and tiny rows need the long double path */
  rmsnorm_config cfg = config_of(&cc);
  (void)cfg;
  int ok = tu_check(run_all(&cc, &x, &z, &dy, w, 0, 1, &ref), "reference run failed");
  for (size_t s = 0; s < 4 && ok; s++) {
    if (rmsnorm_context_set_isa(ctx, isas[s]) != RMSNORM_OK) continue;
    for (int th = 1; th <= 3; th++) {
      rmsnorm_context_set_threads(ctx, th);
      /* plain, in place 1, 2, and r recomputed (not with the special rows: a
       * huge row's saved r is usable, and the backward then takes the fast
       * path where recomputing the sums sends it to the long double one) */
      for (int variant = 0; variant < (special ? 3 : 4); variant++) {
        int inplace = variant == 1 || variant == 2 ? variant : 0, saved = variant != 3;
        outs o = {.rstd = malloc(rows * ng * as), .dw = w ? calloc(d, 4) : NULL};
        int ran = run_all(&cc, &x, &z, &dy, w, inplace, saved, &o);
        ok = tu_check(ran, "run failed");
        int same = ran && memcmp(o.y.data, ref.y.data, x.bytes) == 0 &&
                   memcmp(o.rstd, ref.rstd, rows * ng * as) == 0 &&
                   memcmp(o.dx.data, ref.dx.data, x.bytes) == 0 &&
                   memcmp(o.dz.data, ref.dz.data, x.bytes) == 0 &&
                   (!w || memcmp(o.dw, ref.dw, d * 4) == 0);
        ok = ok && tu_check(same, "%s %s threads=%d variant=%d %s d=%zu group=%zu rows=%zu %s %s: "
                            "bits differ from scalar", rmsnorm_isa_name(isas[s]),
                            tu_dtype_name(c->dt), th, variant, special ? "special" : "normal", d,
                            gs, rows, c->sigmoid ? "sigmoid" : "silu",
                            c->norm_first ? "norm-first" : "gate-first");
        free_outs(&o), free(o.rstd), free(o.dw);
        if (!ok) break;
      }
    }
  }
  if (special && ok && rows >= 4) { /* the long double rows are right, not just equal */
    size_t h = d / 2;
    tu_check(isfinite(tu_get(&ref.y, 0, 1)) && tu_get(&ref.y, 1, 0) == 0 &&
                 isnan(tu_get(&ref.y, 2, h)) && isfinite(tu_get(&ref.y, 3, 0)) &&
                 tu_get(&ref.y, 3, 0) != 0 && isfinite(tu_get(&ref.dx, 0, 1)) &&
                 isfinite(tu_get(&ref.y, rows - 1, 0)),
             "%s d=%zu: special rows: y = %g %g %g %g", tu_dtype_name(c->dt), d,
             tu_get(&ref.y, 0, 1), tu_get(&ref.y, 1, 0), tu_get(&ref.y, 2, h),
             tu_get(&ref.y, 3, 0));
    /* a huge row: columns 1 and 3 (+big, -big, the same gate) give opposite y */
    if (w == NULL) {
      double a = tu_get(&ref.y, 0, 1), b = tu_get(&ref.y, 0, 3);
      tu_check(a != 0 && fabs(a + b) <= 1e-6 * fabs(a), "huge row: y = %g, %g", a, b);
    }
  }
  rmsnorm_context_set_isa(ctx, RMSNORM_ISA_AUTO);
  rmsnorm_context_set_threads(ctx, 0);
  free_outs(&ref), free(ref.rstd), free(ref.dw), free(w);
  tu_free(&x), tu_free(&z), tu_free(&dy);
}

/* check_sets over shapes {d, group, rows, weight}, every gate option, with
 * HF's roundings on odd shapes; wdata: fp16/bf16 only, each weight of the
 * data's dtype, with Gemma's 1 + g on two of the four gate options. The
 * special rows go with two of the options. */
static void check_set_shapes(const size_t (*shapes)[4], size_t n, int emu, int wdata) {
  for (size_t s = 0; s < n; s++) {
    if (emu && shapes[s][0] > 128) continue;
    for (size_t di = wdata ? 2 : 0; di < 4; di++)
      for (int t = 0; t < 4; t++) {
        tcase c = {dts[di], shapes[s][2], shapes[s][0], shapes[s][1], 1e-6, t & 1, t >> 1,
                   (int)(s & 1), (int)shapes[s][3], wdata, wdata && (t == 1 || t == 2)};
        check_sets(&c, 0);
        if (t == 0 || t == 3) check_sets(&c, 1);
      }
  }
}

/* ---- errors ------------------------------------------------------------- */

static void check_errors(void) {
  size_t rows = 3, d = 64;
  float x[3 * 64], z[3 * 64], y[3 * 64], w[64], dw[64], keep[3 * 64];
  for (size_t i = 0; i < rows * d; i++) x[i] = (float)tu_normal(), z[i] = (float)tu_normal();
  for (size_t j = 0; j < d; j++) w[j] = 1, dw[j] = 7;
  for (size_t i = 0; i < rows * d; i++) y[i] = keep[i] = 42;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  rmsnorm_gate g;
  rmsnorm_gate_init(&g, RMSNORM_GATE_SILU);
  struct {
    const char *what;
    rmsnorm_status want, got;
  } cases[12];
  size_t n = 0;
#define FWD(what_, want_, ...)                                        \
  do {                                                                \
    rmsnorm_config c_ = cfg;                                          \
    rmsnorm_gate g_ = g;                                              \
    __VA_ARGS__;                                                      \
    cases[n].what = what_, cases[n].want = want_;                     \
    cases[n++].got = rmsnorm_gated_forward(ctx, &c_, &g_, rows, d, x, d, z, d, w, y, d, NULL); \
  } while (0)
  FWD("group not dividing d", RMSNORM_ERROR_BAD_SIZE, g_.group = 48);
  FWD("unknown act", RMSNORM_ERROR_BAD_ARGUMENT, g_.act = (rmsnorm_gate_act)7);
  FWD("unknown gate flag", RMSNORM_ERROR_BAD_ARGUMENT, g_.flags = 2);
  FWD("gate size 0", RMSNORM_ERROR_BAD_CONFIG, g_.size = 0);
  FWD("eps outside", RMSNORM_ERROR_BAD_FLAGS, c_.flags = RMSNORM_FLAG_EPS_OUTSIDE);
  FWD("accumulate in the forward", RMSNORM_ERROR_BAD_FLAGS, c_.flags = RMSNORM_FLAG_ACCUMULATE);
  FWD("partial", RMSNORM_ERROR_BAD_PARTIAL, c_.partial = 0.5);
  FWD("negative eps", RMSNORM_ERROR_BAD_EPS, c_.eps = -1);
#undef FWD
  for (size_t i = 0; i < n; i++)
    tu_check(cases[i].got == cases[i].want, "forward, %s: %s, want %s", cases[i].what,
             rmsnorm_status_name(cases[i].got), rmsnorm_status_name(cases[i].want));
  tu_check(rmsnorm_gated_forward(ctx, &cfg, NULL, rows, d, x, d, z, d, w, y, d, NULL) ==
               RMSNORM_ERROR_NULL_POINTER, "NULL gate");
  tu_check(rmsnorm_gated_forward(ctx, &cfg, &g, rows, d, x, d, z, d, w, z + 64, d, NULL) ==
               RMSNORM_ERROR_OVERLAP, "y = z one row on: overlap");
  tu_check(rmsnorm_gated_forward(ctx, &cfg, &g, rows, d, x, d, z, d, w, x + 3, d, NULL) ==
               RMSNORM_ERROR_OVERLAP, "y overlapping x: overlap");
  tu_check(rmsnorm_gated_forward(ctx, &cfg, &g, rows, d, x, d, z, d - 1, w, y, d, NULL) ==
               RMSNORM_ERROR_BAD_STRIDE, "ldz < d: bad stride");
  tu_check(memcmp(y, keep, sizeof y) == 0 && x[3] == x[3], "nothing written on errors");
  /* backward */
  float dx[3 * 64], dz[3 * 64];
  memcpy(dx, keep, sizeof dx), memcpy(dz, keep, sizeof dz);
  tu_check(rmsnorm_gated_backward(ctx, &cfg, &g, rows, d, x, d, z, d, y, d, NULL, NULL, dx, d,
                                  dz, d, dw) == RMSNORM_ERROR_BAD_ARGUMENT,
           "dweight without weight");
  tu_check(rmsnorm_gated_backward(ctx, &cfg, &g, rows, d, x, d, z, d, y, d, w, NULL, dx, d, x,
                                  d, dw) == RMSNORM_ERROR_OVERLAP,
           "dz = x: overlap");
  tu_check(rmsnorm_gated_backward(ctx, &cfg, &g, rows, d, x, d, z, d, y, d, w, NULL, dx, d, dx,
                                  d, dw) == RMSNORM_ERROR_OVERLAP,
           "dz = dx: overlap");
  tu_check(memcmp(dx, keep, sizeof dx) == 0 && memcmp(dz, keep, sizeof dz) == 0 && dw[0] == 7,
           "nothing written on backward errors");
  /* accumulate adds into dweight */
  float dw1[64], dw2[64];
  TU_OK(rmsnorm_gated_backward(ctx, &cfg, &g, rows, d, x, d, z, d, y, d, w, NULL, dx, d, dz, d,
                               dw1));
  for (size_t j = 0; j < d; j++) dw2[j] = 1;
  rmsnorm_config acc = cfg;
  acc.flags |= RMSNORM_FLAG_ACCUMULATE;
  TU_OK(rmsnorm_gated_backward(ctx, &acc, &g, rows, d, x, d, z, d, y, d, w, NULL, dx, d, dz, d,
                               dw2));
  int same = 1;
  for (size_t j = 0; j < d; j++) same &= dw2[j] == 1 + dw1[j];
  tu_check(same, "RMSNORM_FLAG_ACCUMULATE adds dweight");
  /* rows == 0 touches nothing */
  TU_OK(rmsnorm_gated_forward(ctx, &cfg, &g, 0, d, NULL, d, NULL, d, NULL, NULL, d, NULL));
}

int main(void) {
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) return 2;
  tu_seed(11);
  int emu = tu_reduced(); /* the reduced sets (emulation, sanitizers) */
  /* d and a group that divides it (0: whole row) */
  static const size_t shapes[][2] = {{1, 0},    {2, 1},     {7, 0},     {31, 0},    {32, 8},
                                     {64, 16},  {70, 35},   {127, 0},   {128, 32},  {256, 64},
                                     {1000, 0}, {2048, 0},  {4095, 0},  {4096, 1024}, {5120, 0},
                                     {5120, 640}, {8192, 2048}};
  size_t nshapes = sizeof shapes / sizeof shapes[0];
  for (size_t s = 0; s < nshapes; s++) {
    /* reduced: small rows (under emulation the long double oracle is software quad precision) */
    if (emu && shapes[s][0] > 128) continue;
    for (int t = 0; t < 4; t++) {
      int sigmoid = t & 1, norm_first = (t >> 1) & 1;
      for (size_t di = 0; di < 4; di++) {
        size_t d = shapes[s][0];
        size_t rows = d > 2048 || emu ? 3 : 9;
        tcase c = {dts[di], rows, d, shapes[s][1], 1e-6, sigmoid, norm_first, 0,
                   (int)(s % 5 != 3), 0, 0};
        check_oracle(&c);
        if (dts[di] == RMSNORM_F16 || dts[di] == RMSNORM_BF16) {
          c.hf = 1;
          check_oracle(&c);
          if (c.weight) { /* 2 rows with a weight of the data's dtype: read as it is */
            c.hf = 0, c.rows = 2, c.wdata = 1, c.offset = t & 1;
            check_oracle(&c);
          }
        }
      }
    }
  }
  for (int t = 0; t < 4; t++) {
    check_fd(13, 0, t & 1, t >> 1);
    check_fd(48, 16, t & 1, t >> 1);
  }
  /* sets and threads: enough rows to split, and across the 64-row chunks */
  static const size_t set_shapes[][4] = {{1, 0, 5, 1},      {33, 11, 7, 1},  {128, 32, 130, 1},
                                         {4096, 512, 40, 1}, {5120, 0, 9, 0}, {32768, 4096, 3, 1}};
  check_set_shapes(set_shapes, sizeof set_shapes / sizeof set_shapes[0], emu, 0);
  /* fp16/bf16 weights of the data's dtype (torch's default), with and without
   * Gemma's 1 + g: up to 3 rows, SIMD sets read them as they are (in the long
   * double path too: the special rows) */
  static const size_t wd_shapes[][4] = {{1, 0, 1, 1},    {70, 35, 2, 1},     {576, 0, 3, 1},
                                        {4095, 0, 1, 1}, {4096, 1024, 3, 1}, {5120, 0, 4, 1}};
  check_set_shapes(wd_shapes, sizeof wd_shapes / sizeof wd_shapes[0], emu, 1);
  /* outputs of 1 MiB and more go through the sets' streamed stores: every
   * dtype, rows off their lines (ld = d + 5), both gate orders */
  if (!emu)
    for (size_t di = 0; di < 4; di++)
      for (int t = 0; t < 4; t += 3) {
        tcase c = {dts[di], 130, 4096, 1024, 1e-6, t & 1, t >> 1, 0, 1, 0, 0};
        check_sets(&c, 0);
      }
  check_errors();
  rmsnorm_context_free(ctx);
  return tu_finish("gated");
}
