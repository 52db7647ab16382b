/* test_rope.c - QK-norm + RoPE (rmsnorm_rope_table, rmsnorm_qk_norm_rope_
 * forward / _backward) from the user's side:
 *   - the table against cosl/sinl of the angle computed in long double;
 *   - against the long double oracle (rope_oracle.h, itself held to finite
 *     differences by test_rope_oracle.c) for every dtype, head_dim 1..70,
 *     80, 128, 256, full and partial rotation, NeoX and GPT-J pairs, 1, 2,
 *     8 and 32 heads, token-major, head-major and fused-QKV strides,
 *     positions given or not, the weight offset, no weight, in place;
 *   - HF's roundings (RMSNORM_FLAG_ROUND_BEFORE_WEIGHT) bit for bit against
 *     an emulation with its own fp16/bf16 rounding;
 *   - at position 0 the rotation is the identity: the results equal
 *     rmsnorm_qk_norm_forward / _backward;
 *   - the fp64 backward against central differences of the fp64 forward;
 *   - Q and K in place in a fused GQA QKV buffer, with the KV-cache write:
 *     K rows equal y rows bit for bit, V copied bit for bit, negative slots
 *     skipped, every other byte of the cache kept;
 *   - every kernel set at 1, 2 and 3 threads bit for bit equal to the scalar
 *     reference at 1 thread (y, rstd, the cache, dx, dweight), in place and
 *     not, saved or recomputed rstd, rows that take the long double path
 *     (overflowing squares, zero rows with eps = 0, NaN, 1e-30);
 *   - errors: each bad argument gets its status and writes nothing. */
#include "testutil.h"
#include "rope_oracle.h"

static rmsnorm_context *ctx;

/* ---- grids of [tokens, heads, hd] rows ----------------------------------- */

typedef enum layout { TOKEN_MAJOR = 0, HEAD_MAJOR = 1, FUSED_QKV = 2 } layout;

/* A [tokens, heads] grid of rows of hd inside an allocation of exactly
 * `bytes` (ASan sees over-reads); row (t, h) at base + t*ld_t + h*ld_h
 * elements, base `off` elements into buf. FUSED_QKV: the K part of a
 * [tokens, 3, heads, hd] buffer. */
typedef struct grid {
  rmsnorm_dtype dt;
  size_t tokens, heads, hd, ld_t, ld_h, off, es, bytes;
  unsigned char *buf;
} grid;

static grid grid_alloc(rmsnorm_dtype dt, size_t tokens, size_t heads, size_t hd, layout lay) {
  grid g = {dt, tokens, heads, hd, 0, 0, 0, rn_dtype_size(dt), 0, NULL};
  size_t n;
  if (lay == TOKEN_MAJOR) {
    g.ld_h = hd + 2, g.ld_t = heads * g.ld_h + 1;
    n = (tokens - 1) * g.ld_t + (heads - 1) * g.ld_h + hd;
  } else if (lay == HEAD_MAJOR) {
    g.ld_t = hd + 1, g.ld_h = tokens * g.ld_t + 3;
    n = (heads - 1) * g.ld_h + (tokens - 1) * g.ld_t + hd;
  } else {
    g.ld_h = hd, g.ld_t = 3 * heads * hd, g.off = heads * hd;
    n = tokens * g.ld_t;
  }
  g.bytes = n * g.es;
  g.buf = malloc(g.bytes);
  if (!g.buf) exit(2);
  memset(g.buf, 0x7f, g.bytes);
  return g;
}

static grid grid_copy(const grid *g) {
  grid c = *g;
  c.buf = malloc(g->bytes);
  if (!c.buf) exit(2);
  memcpy(c.buf, g->buf, g->bytes);
  return c;
}

static void grid_free(grid *g) {
  free(g->buf);
  g->buf = NULL;
}

static void *gp(const grid *g) { return g->buf + g->off * g->es; }
static size_t gi(const grid *g, size_t t, size_t h, size_t j) {
  return t * g->ld_t + h * g->ld_h + j;
}
static double gget(const grid *g, size_t t, size_t h, size_t j) {
  return rn_load(gp(g), g->dt, gi(g, t, h, j));
}
static void gset(grid *g, size_t t, size_t h, size_t j, double v) {
  rn_store(gp(g), g->dt, gi(g, t, h, j), v);
}
/* whether two grids of the same shape hold the same bits in every row */
static int grid_same(const grid *a, const grid *b) {
  for (size_t t = 0; t < a->tokens; t++)
    for (size_t h = 0; h < a->heads; h++)
      if (memcmp((char *)gp(a) + gi(a, t, h, 0) * a->es, (char *)gp(b) + gi(b, t, h, 0) * b->es,
                 a->hd * a->es))
        return 0;
  return 1;
}

/* Real-looking rows: N(0,1), one outlier channel at 25x, and every fifth
 * token with ties (every third value 0.5). */
static void fill_act(grid *g) {
  size_t outlier = g->hd > 5 ? 5 : g->hd - 1;
  for (size_t t = 0; t < g->tokens; t++)
    for (size_t h = 0; h < g->heads; h++)
      for (size_t j = 0; j < g->hd; j++) {
        double v = tu_normal();
        if (j == outlier) v *= 25;
        if (t % 5 == 2 && j % 3 == 0) v = 0.5;
        gset(g, t, h, j, v);
      }
}

static void fill_grad(grid *g) {
  for (size_t t = 0; t < g->tokens; t++)
    for (size_t h = 0; h < g->heads; h++)
      for (size_t j = 0; j < g->hd; j++) gset(g, t, h, j, tu_normal());
}

/* ---- cases ---------------------------------------------------------------- */

typedef struct tcase {
  rmsnorm_dtype dt;
  size_t tokens, heads, hd, rot; /* rot: rotary_dim as passed (0: hd) */
  int gptj;
  layout lay;
  int positions; /* 1: a positions array; 0: NULL (token t at row t) */
  int weight;    /* 0: NULL */
  unsigned flags; /* RMSNORM_FLAG_WEIGHT_OFFSET, the rounding flags */
  double eps;
  int per_token; /* RMSNORM_ROPE_NORM_TOKEN: one statistic per token (OLMo 2) */
} tcase;

static size_t rot_of(const tcase *c) { return c->rot ? c->rot : c->hd; }
/* the weight's (and dweight's) length, and the number of statistics */
static size_t wlen(const tcase *c) { return c->per_token ? c->heads * c->hd : c->hd; }
static size_t nstat(const tcase *c) { return c->per_token ? c->tokens : c->tokens * c->heads; }
/* HF's roundings apply (2-byte data and a rounding flag) */
static int hf_mode(const tcase *c) {
  return (c->flags & (RMSNORM_FLAG_ROUND_BEFORE_WEIGHT | RMSNORM_FLAG_ROUND_BEFORE_ROTATION)) &&
         (c->dt == RMSNORM_F16 || c->dt == RMSNORM_BF16);
}

static rmsnorm_config config_of(const tcase *c) {
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, c->dt);
  cfg.eps = c->eps;
  cfg.param_dtype = RMSNORM_F32;
  cfg.flags = c->flags;
  return cfg;
}

/* A table of n_pos rows for the case, from rmsnorm_rope_table, and the
 * tokens' positions (a scrambled order with repeats) or NULL. */
typedef struct rope_in {
  void *table;
  size_t n_pos;
  int64_t *pos;
  rmsnorm_rope rope;
} rope_in;

static rope_in rope_make(const tcase *c, double theta) {
  rope_in r;
  size_t rot = rot_of(c), as = c->dt == RMSNORM_F64 ? 8 : 4;
  r.n_pos = c->tokens + 17;
  r.table = malloc(r.n_pos * rot * as);
  if (rmsnorm_rope_table(r.table, c->dt == RMSNORM_F64 ? RMSNORM_F64 : RMSNORM_F32, r.n_pos, rot,
                         theta, 1) != RMSNORM_OK)
    tu_check(0, "rmsnorm_rope_table failed");
  r.pos = NULL;
  if (c->positions) {
    r.pos = malloc(c->tokens * sizeof *r.pos);
    for (size_t t = 0; t < c->tokens; t++) r.pos[t] = (int64_t)((t * 7 + 3) % r.n_pos);
  }
  rmsnorm_rope_init(&r.rope, c->gptj ? RMSNORM_ROPE_GPTJ : RMSNORM_ROPE_NEOX);
  r.rope.norm = c->per_token ? RMSNORM_ROPE_NORM_TOKEN : RMSNORM_ROPE_NORM_HEAD;
  r.rope.rotary_dim = c->rot;
  r.rope.cos_sin = r.table;
  r.rope.n_positions = r.n_pos;
  r.rope.positions = r.pos;
  return r;
}

static void rope_free(rope_in *r) { free(r->table), free(r->pos); }

/* token t's table row as long doubles */
static void row_angles(const tcase *c, const rope_in *r, size_t t, ro_t *cs) {
  size_t rot = rot_of(c), p = r->pos ? (size_t)r->pos[t] : t;
  for (size_t j = 0; j < rot; j++)
    cs[j] = c->dt == RMSNORM_F64 ? rn_ld_f64(r->table, p * rot + j)
                                 : rn_ld_f32(r->table, p * rot + j);
}

static float *weight_make(const tcase *c) {
  if (!c->weight) return NULL;
  float *w = malloc(wlen(c) * sizeof *w);
  for (size_t j = 0; j < wlen(c); j++) {
    double g = (c->flags & RMSNORM_FLAG_WEIGHT_OFFSET) ? 0.5 * tu_normal() : 1 + 0.5 * tu_normal();
    /* HF keeps the weight in the model's dtype */
    unsigned char b[8];
    rn_store(b, c->dt == RMSNORM_F64 ? RMSNORM_F32 : c->dt, 0, g);
    w[j] = (float)rn_load(b, c->dt == RMSNORM_F64 ? RMSNORM_F32 : c->dt, 0);
  }
  return w;
}

/* the effective gain of column j, as the library forms it in the compute type */
static ro_t weight_at(const tcase *c, const float *w, size_t j) {
  if (!w) return 1;
  if (!(c->flags & RMSNORM_FLAG_WEIGHT_OFFSET)) return w[j];
  return c->dt == RMSNORM_F64 ? (ro_t)(1.0 + w[j]) : (ro_t)(1.0f + w[j]);
}

static const char *case_name(const tcase *c, char *buf, size_t n) {
  static const char *lays[] = {"token-major", "head-major", "fused-qkv"};
  snprintf(buf, n, "%s T=%zu H=%zu hd=%zu rot=%zu %s %s%s%s%s%s%s%s%s", tu_dtype_name(c->dt),
           c->tokens, c->heads, c->hd, rot_of(c), c->gptj ? "gptj" : "neox", lays[c->lay],
           c->positions ? " positions" : "", c->weight ? "" : " no-weight",
           (c->flags & RMSNORM_FLAG_WEIGHT_OFFSET) ? " offset" : "",
           (c->flags & RMSNORM_FLAG_ROUND_BEFORE_WEIGHT) ? " round-before-weight" : "",
           (c->flags & RMSNORM_FLAG_ROUND_BEFORE_ROTATION) ? " round-before-rotation" : "",
           (c->flags & RMSNORM_FLAG_FLOAT_ROTATION) ? " float-rotation" : "",
           c->per_token ? " per-token" : "");
  return buf;
}

/* ---- HF's roundings, emulated -------------------------------------------- */

/* v rounded to fp16 or bf16, nearest even, from the formats' definitions
 * (significant bits and the fp16 subnormal quantum): independent of the
 * library's conversions. Values here stay far from overflow. */
static float emu_round(rmsnorm_dtype dt, float v) {
  if (dt == RMSNORM_F32 || dt == RMSNORM_F64 || v == 0 || !isfinite(v)) return v;
  int bits = dt == RMSNORM_BF16 ? 8 : 11, e = ilogbf(v);
  if (dt == RMSNORM_F16 && e < -14) e = -14;
  float q = ldexpf(1.0f, e - (bits - 1)); /* the quantum at v: v / q is exact */
  return nearbyintf(v / q) * q;            /* ties to even in the default mode */
}

/* One head's row as HF computes it in the model's dtype: r the library's
 * (the statistic's bits are not what this checks), w from column w0 of the
 * weight (the head's part, per token), then
 *   ROUND_BEFORE_WEIGHT (Qwen3RMSNorm):     n = RT(RT(x r) w)
 *   ROUND_BEFORE_ROTATION (Gemma3RMSNorm, Olmo2RMSNorm): n = RT((x r) w)
 * and the rotation with each product and sum rounded (cos and sin in the
 * model dtype), or in float32 and rounded once (FLOAT_ROTATION: float32 cos
 * and sin, as OLMo 2's). */
static void emu_hf_row(const tcase *c, const float *w, size_t w0, const float *x, float r,
                       const ro_t *cs, float *y) {
  size_t d = c->hd, rot = rot_of(c), half = rot / 2;
  int rxr = (c->flags & RMSNORM_FLAG_ROUND_BEFORE_WEIGHT) != 0;
  int rprod = !(c->flags & RMSNORM_FLAG_FLOAT_ROTATION);
  float n[ROPE_ORACLE_MAX_D];
  for (size_t j = 0; j < d; j++) {
    float h = x[j] * r;
    if (rxr) h = emu_round(c->dt, h);
    n[j] = emu_round(c->dt, w ? h * (float)weight_at(c, w, w0 + j) : h);
    y[j] = n[j];
  }
  for (size_t i = 0; i < half; i++) {
    size_t a = c->gptj ? 2 * i : i, b = c->gptj ? 2 * i + 1 : i + half;
    float cc = (float)cs[i], ss = (float)cs[half + i];
    float ac = n[a] * cc, bs = n[b] * ss, bc = n[b] * cc, as = n[a] * ss;
    if (rprod)
      ac = emu_round(c->dt, ac), bs = emu_round(c->dt, bs), bc = emu_round(c->dt, bc),
      as = emu_round(c->dt, as);
    y[a] = emu_round(c->dt, ac - bs);
    y[b] = emu_round(c->dt, bc + as);
  }
}

/* ---- against the oracle ---------------------------------------------------- */

/* Rounding to the storage dtype (half an ulp, relative) and the compute
 * type's error (relative to the magnitude of an output's terms). */
static double store_tol(rmsnorm_dtype dt) {
  switch (dt) {
    case RMSNORM_F64: return 0x1p-53;
    case RMSNORM_F32: return 0x1p-24;
    case RMSNORM_F16: return 0x1p-11;
    default: return 0x1p-8;
  }
}
static double compute_tol(rmsnorm_dtype dt) { return dt == RMSNORM_F64 ? 1e-14 : 2e-6; }
/* half the fp16 subnormals' quantum (the others': far below these values) */
static double store_abs(rmsnorm_dtype dt) { return dt == RMSNORM_F16 ? 0x1p-25 : 1e-30; }

/* The oracle's unit: a row (per head), or a token's heads (per token). */
typedef struct unit {
  size_t t, h0, nh; /* token, first head, heads */
} unit;

static unit unit_at(const tcase *c, size_t u) {
  return c->per_token ? (unit){u, 0, c->heads} : (unit){u / c->heads, u % c->heads, 1};
}

/* A unit's values of a grid, head after head, as long doubles. */
static void unit_get(const grid *g, unit u, ro_t *v) {
  for (size_t h = 0; h < u.nh; h++)
    for (size_t j = 0; j < g->hd; j++) v[h * g->hd + j] = gget(g, u.t, u.h0 + h, j);
}

static void check_oracle(const tcase *c) {
  size_t T = c->tokens, H = c->heads, d = c->hd, rot = rot_of(c), nw = wlen(c);
  size_t as = c->dt == RMSNORM_F64 ? 8 : 4;
  int hf = hf_mode(c);
  char what[240];
  case_name(c, what, sizeof what);
  rmsnorm_config cfg = config_of(c);
  rope_in R = rope_make(c, c->hd % 3 ? 10000 : 1e6);
  float *w = weight_make(c), *dw = malloc(nw * 4);
  grid x = grid_alloc(c->dt, T, H, d, c->lay), dy = grid_alloc(c->dt, T, H, d, c->lay);
  fill_act(&x), fill_grad(&dy);
  /* in place for head-major cases */
  int inplace = c->lay == HEAD_MAJOR;
  grid y = inplace ? grid_copy(&x) : grid_alloc(c->dt, T, H, d, c->lay);
  grid dx = grid_alloc(c->dt, T, H, d, c->lay);
  void *rstd = malloc(nstat(c) * as);
  static ro_t xr[ROPE_ORACLE_MAX_N], wr[ROPE_ORACLE_MAX_N], yo[ROPE_ORACLE_MAX_N],
      mo[ROPE_ORACLE_MAX_N], dyr[ROPE_ORACLE_MAX_N], dxo[ROPE_ORACLE_MAX_N],
      dwo[ROPE_ORACLE_MAX_N], dwabs[ROPE_ORACLE_MAX_N], dn[ROPE_ORACLE_MAX_N],
      cs[ROPE_ORACLE_MAX_D];
  rope_opts o = {rot, c->gptj, (ro_t)c->eps};
  rmsnorm_status st = rmsnorm_qk_norm_rope_forward(ctx, &cfg, T, H, d, inplace ? gp(&y) : gp(&x),
                                                   x.ld_t, x.ld_h, w, &R.rope, NULL, gp(&y),
                                                   y.ld_t, y.ld_h, rstd);
  if (!tu_check(st == RMSNORM_OK, "%s: forward -> %s", what, rmsnorm_status_name(st))) goto out;
  for (size_t j = 0; j < nw; j++) wr[j] = weight_at(c, w, j), dwo[j] = 0, dwabs[j] = 0;
  double ts = store_tol(c->dt), tc = compute_tol(c->dt);
  for (size_t u = 0; u < nstat(c); u++) {
    unit un = unit_at(c, u);
    size_t t = un.t, n = un.nh * d;
    ro_t ro;
    row_angles(c, &R, t, cs);
    unit_get(&x, un, xr), unit_get(&dy, un, dyr);
    rope_forward_token(xr, w ? wr : NULL, un.nh, d, &o, cs, yo, &ro, mo);
    double rv = as == 8 ? rn_ld_f64(rstd, u) : rn_ld_f32(rstd, u);
    int ok = tu_check(fabsl(rv - ro) <= (as == 8 ? 1e-14L : 1e-6L) * ro,
                      "%s: rstd[%zu] = %.17g, oracle %.17Lg", what, u, rv, ro);
    /* HF's roundings: the oracle within the extra roundings' error */
    double k = hf ? 4 : 0;
    for (size_t j = 0; j < n && ok; j++) {
      double got = gget(&y, t, un.h0 + j / d, j % d);
      ok = tu_check(fabsl(got - yo[j]) <= ts * fabsl(yo[j]) + (tc + k * ts) * mo[j] +
                                               (1 + k) * store_abs(c->dt),
                    "%s: y[%zu][%zu][%zu] = %.9g, oracle %.12Lg", what, t, un.h0 + j / d, j % d,
                    got, yo[j]);
    }
    for (size_t h = 0; h < un.nh && hf && ok; h++) { /* bit for bit the emulated HF row */
      float xf[ROPE_ORACLE_MAX_D], ye[ROPE_ORACLE_MAX_D];
      for (size_t j = 0; j < d; j++) xf[j] = (float)xr[h * d + j];
      emu_hf_row(c, w, c->per_token ? h * d : 0, xf, (float)rv, cs, ye);
      for (size_t j = 0; j < d && ok; j++)
        ok = tu_check(gget(&y, t, un.h0 + h, j) == ye[j], "%s: y[%zu][%zu][%zu] = %.9g, HF's %.9g",
                      what, t, un.h0 + h, j, gget(&y, t, un.h0 + h, j), ye[j]);
    }
  }
  /* the backward, from the forward's rstd; the rounding flags are the identity */
  st = rmsnorm_qk_norm_rope_backward(ctx, &cfg, T, H, d, gp(&x), x.ld_t, x.ld_h, gp(&dy),
                                     dy.ld_t, dy.ld_h, w, &R.rope, rstd, gp(&dx), dx.ld_t,
                                     dx.ld_h, w ? dw : NULL);
  if (!tu_check(st == RMSNORM_OK, "%s: backward -> %s", what, rmsnorm_status_name(st))) goto out;
  /* bounds: the storage's rounding of the result, and the compute type's
   * error relative to the scale of the terms before they cancel: with
   * |dn|_j = sum_k |R_kj dy_k|, for dx_j r (|dn|_j |w_j| + |xh_j| (1/n)
   * sum_i |dn|_i |w_i xh_i|) over the unit's n values; for dweight_j the
   * sum over units of |dn|_j |xh_j| */
  double tcb = c->dt == RMSNORM_F64 ? 2e-14 : 4e-6;
  for (size_t u = 0; u < nstat(c); u++) {
    unit un = unit_at(c, u);
    size_t t = un.t, n = un.nh * d;
    row_angles(c, &R, t, cs);
    unit_get(&x, un, xr), unit_get(&dy, un, dyr);
    rope_backward_token(xr, w ? wr : NULL, dyr, un.nh, d, &o, cs, dxo, dwo);
    ro_t r = rope_r(xr, n, o.eps), S = 0;
    for (size_t j = 0; j < n; j++) {
      size_t ks[2], nk = rope_cols(&o, j % d, ks), base = j - j % d;
      dn[j] = 0;
      for (size_t q = 0; q < nk; q++)
        dn[j] += fabsl(rope_R(&o, cs, ks[q], j % d) * dyr[base + ks[q]]);
      S += dn[j] * fabsl(wr[j] * xr[j] * r) / (ro_t)n;
      dwabs[j] += dn[j] * fabsl(xr[j] * r);
    }
    int ok = 1;
    for (size_t j = 0; j < n && ok; j++) {
      ro_t scale = r * (dn[j] * fabsl(wr[j]) + fabsl(xr[j] * r) * S);
      double got = gget(&dx, t, un.h0 + j / d, j % d);
      ok = tu_check(fabsl(got - dxo[j]) <= ts * fabsl(dxo[j]) + tcb * scale + store_abs(c->dt),
                    "%s: dx[%zu][%zu][%zu] = %.9g, oracle %.12Lg", what, t, un.h0 + j / d, j % d,
                    got, dxo[j]);
    }
  }
  if (w) {
    double tw = c->dt == RMSNORM_F64 ? 2e-14 : 8e-6;
    for (size_t j = 0; j < nw; j++) /* dweight is a float parameter */
      if (!tu_check(fabsl(dw[j] - dwo[j]) <= 0x1p-24 * fabsl(dwo[j]) + tw * dwabs[j] + 1e-30,
                    "%s: dweight[%zu] = %.9g, oracle %.12Lg", what, j, dw[j], dwo[j]))
        break;
  }
out:
  grid_free(&x), grid_free(&dy), grid_free(&y), grid_free(&dx);
  free(rstd), free(w), free(dw);
  rope_free(&R);
}

/* ---- position 0: the identity, so QK-norm's results ---------------------- */

static void check_identity(rmsnorm_dtype dt, unsigned flags, int weight) {
  tcase c = {dt, 5, 3, 64, 0, 0, TOKEN_MAJOR, 1, weight, flags, 1e-6, 0};
  size_t T = c.tokens, H = c.heads, d = c.hd, as = dt == RMSNORM_F64 ? 8 : 4;
  rmsnorm_config cfg = config_of(&c);
  rope_in R = rope_make(&c, 10000);
  for (size_t t = 0; t < T; t++) R.pos[t] = 0;
  float *w = weight_make(&c), dw1[64], dw2[64];
  grid x = grid_alloc(dt, T, H, d, TOKEN_MAJOR), dy = grid_alloc(dt, T, H, d, TOKEN_MAJOR);
  fill_act(&x), fill_grad(&dy);
  grid y1 = grid_alloc(dt, T, H, d, TOKEN_MAJOR), y2 = grid_alloc(dt, T, H, d, TOKEN_MAJOR);
  grid dx1 = grid_alloc(dt, T, H, d, TOKEN_MAJOR), dx2 = grid_alloc(dt, T, H, d, TOKEN_MAJOR);
  unsigned char r1[5 * 3 * 8], r2[5 * 3 * 8];
  TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, T, H, d, gp(&x), x.ld_t, x.ld_h, w, &R.rope, NULL,
                                     gp(&y1), y1.ld_t, y1.ld_h, r1));
  TU_OK(rmsnorm_qk_norm_forward(ctx, &cfg, T, H, d, gp(&x), x.ld_t, x.ld_h, w, NULL, gp(&y2),
                                y2.ld_t, y2.ld_h, r2));
  int same = memcmp(r1, r2, T * H * as) == 0;
  for (size_t t = 0; t < T; t++)
    for (size_t h = 0; h < H; h++)
      for (size_t j = 0; j < d; j++) same &= gget(&y1, t, h, j) == gget(&y2, t, h, j);
  tu_check(same, "%s flags=%u weight=%d: at position 0 the forward is QK-norm's", tu_dtype_name(dt),
           flags, weight);
  TU_OK(rmsnorm_qk_norm_rope_backward(ctx, &cfg, T, H, d, gp(&x), x.ld_t, x.ld_h, gp(&dy), dy.ld_t,
                                      dy.ld_h, w, &R.rope, r1, gp(&dx1), dx1.ld_t, dx1.ld_h,
                                      w ? dw1 : NULL));
  TU_OK(rmsnorm_qk_norm_backward(ctx, &cfg, T, H, d, gp(&x), x.ld_t, x.ld_h, gp(&dy), dy.ld_t,
                                 dy.ld_h, w, r2, gp(&dx2), dx2.ld_t, dx2.ld_h, w ? dw2 : NULL,
                                 NULL));
  tu_check(grid_same(&dx1, &dx2) && (!w || memcmp(dw1, dw2, sizeof dw1) == 0),
           "%s flags=%u weight=%d: at position 0 the backward is QK-norm's, bit for bit",
           tu_dtype_name(dt), flags, weight);
  grid_free(&x), grid_free(&dy), grid_free(&y1), grid_free(&y2), grid_free(&dx1), grid_free(&dx2);
  free(w);
  rope_free(&R);
}

/* Per token at position 0: rmsnorm_forward / _backward of the [tokens,
 * heads * hd] rows, bit for bit (y, rstd, dx, dweight), whether the heads
 * lie contiguous or strided (token-major with gaps, head-major): the
 * token's heads are summed as one row in head order, and the tokens
 * chunked for dweight as rmsnorm_backward's rows. */
static void check_identity_token(rmsnorm_dtype dt, unsigned flags, int weight, size_t H,
                                 size_t hd) {
  tcase c = {dt, 70, H, hd, 0, 0, TOKEN_MAJOR, 1, weight, flags, 1e-6, 1};
  size_t T = c.tokens, D = H * hd, es = rn_dtype_size(dt), as = dt == RMSNORM_F64 ? 8 : 4;
  rmsnorm_config cfg = config_of(&c);
  rope_in R = rope_make(&c, 10000);
  for (size_t t = 0; t < T; t++) R.pos[t] = 0;
  float *w = weight_make(&c), *dw1 = malloc(D * 4), *dw2 = malloc(D * 4);
  unsigned char *x = malloc(T * D * es), *dy = malloc(T * D * es), *y = malloc(T * D * es);
  unsigned char *dx = malloc(T * D * es), *r1 = malloc(T * as), *r2 = malloc(T * as);
  for (size_t i = 0; i < T * D; i++)
    rn_store(x, dt, i, tu_normal() * (i % D == 5 ? 25 : 1)), rn_store(dy, dt, i, tu_normal());
  TU_OK(rmsnorm_forward(ctx, &cfg, T, D, x, D, w, NULL, y, D, r2));
  TU_OK(rmsnorm_backward(ctx, &cfg, T, D, x, D, dy, D, w, r2, dx, D, w ? dw2 : NULL, NULL));
  for (int lay = 0; lay < 3; lay++) {
    const char *lays[] = {"contiguous", "token-major", "head-major"};
    grid gx, gdy, gy, gdx;
    if (lay == 0) { /* the rows themselves */
      gx = grid_alloc(dt, T, H, hd, FUSED_QKV);
      gx.ld_h = hd, gx.ld_t = D, gx.off = 0;
    } else {
      gx = grid_alloc(dt, T, H, hd, lay == 1 ? TOKEN_MAJOR : HEAD_MAJOR);
    }
    gdy = grid_copy(&gx), gy = grid_copy(&gx), gdx = grid_copy(&gx);
    for (size_t t = 0; t < T; t++)
      for (size_t h = 0; h < H; h++)
        for (size_t j = 0; j < hd; j++)
          gset(&gx, t, h, j, rn_load(x, dt, t * D + h * hd + j)),
              gset(&gdy, t, h, j, rn_load(dy, dt, t * D + h * hd + j));
    TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, T, H, hd, gp(&gx), gx.ld_t, gx.ld_h, w, &R.rope,
                                       NULL, gp(&gy), gy.ld_t, gy.ld_h, r1));
    TU_OK(rmsnorm_qk_norm_rope_backward(ctx, &cfg, T, H, hd, gp(&gx), gx.ld_t, gx.ld_h, gp(&gdy),
                                        gdy.ld_t, gdy.ld_h, w, &R.rope, NULL, gp(&gdx), gdx.ld_t,
                                        gdx.ld_h, w ? dw1 : NULL));
    /* y by value: the identity rotation y_a = a 1 - b 0 turns a -0 (a gain
     * of 1 + -1) into +0 */
    int same_y = memcmp(r1, r2, T * as) == 0, same_dx = 1;
    for (size_t t = 0; t < T; t++)
      for (size_t h = 0; h < H; h++) {
        for (size_t j = 0; j < hd; j++)
          same_y &= gget(&gy, t, h, j) == rn_load(y, dt, t * D + h * hd + j);
        same_dx &= !memcmp((char *)gp(&gdx) + gi(&gdx, t, h, 0) * es, dx + (t * D + h * hd) * es,
                           hd * es);
      }
    tu_check(same_y, "%s flags=%u weight=%d H=%zu hd=%zu %s: per token at position 0 the forward "
             "is rmsnorm_forward's over heads*hd", tu_dtype_name(dt), flags, weight, H, hd,
             lays[lay]);
    tu_check(same_dx && (!w || !memcmp(dw1, dw2, D * 4)),
             "%s flags=%u weight=%d H=%zu hd=%zu %s: per token at position 0 the backward is "
             "rmsnorm_backward's", tu_dtype_name(dt), flags, weight, H, hd, lays[lay]);
    grid_free(&gx), grid_free(&gdy), grid_free(&gy), grid_free(&gdx);
  }
  free(w), free(dw1), free(dw2), free(x), free(dy), free(y), free(dx), free(r1), free(r2);
  rope_free(&R);
}

/* The rounding flags together: FLOAT_ROTATION alone changes nothing (the
 * plain rotation is already in the compute type), and ROUND_BEFORE_WEIGHT
 * with ROUND_BEFORE_ROTATION is ROUND_BEFORE_WEIGHT; in fp32 none of them
 * changes a bit. */
static void check_flag_combinations(rmsnorm_dtype dt) {
  tcase c = {dt, 6, 3, 64, 0, 0, TOKEN_MAJOR, 1, 1, 0, 1e-6, 0};
  size_t T = c.tokens, H = c.heads, d = c.hd;
  rope_in R = rope_make(&c, 10000);
  float *w = weight_make(&c);
  grid x = grid_alloc(dt, T, H, d, TOKEN_MAJOR);
  fill_act(&x);
  const unsigned pairs[][2] = {
      {RMSNORM_FLAG_FLOAT_ROTATION, 0},
      {RMSNORM_FLAG_ROUND_BEFORE_WEIGHT | RMSNORM_FLAG_ROUND_BEFORE_ROTATION,
       RMSNORM_FLAG_ROUND_BEFORE_WEIGHT},
      {RMSNORM_FLAG_ROUND_BEFORE_WEIGHT | RMSNORM_FLAG_ROUND_BEFORE_ROTATION |
           RMSNORM_FLAG_FLOAT_ROTATION,
       RMSNORM_FLAG_ROUND_BEFORE_WEIGHT | RMSNORM_FLAG_FLOAT_ROTATION},
      {RMSNORM_FLAG_ROUND_BEFORE_ROTATION,
       dt == RMSNORM_F32 ? 0 : RMSNORM_FLAG_ROUND_BEFORE_ROTATION}};
  for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
    grid y[2] = {grid_alloc(dt, T, H, d, TOKEN_MAJOR), grid_alloc(dt, T, H, d, TOKEN_MAJOR)};
    for (int i = 0; i < 2; i++) {
      rmsnorm_config cfg = config_of(&c);
      cfg.flags = pairs[k][i];
      TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, T, H, d, gp(&x), x.ld_t, x.ld_h, w, &R.rope,
                                         NULL, gp(&y[i]), y[i].ld_t, y[i].ld_h, NULL));
    }
    tu_check(grid_same(&y[0], &y[1]), "%s: flags %#x give the bits of flags %#x",
             tu_dtype_name(dt), pairs[k][0], pairs[k][1]);
    grid_free(&y[0]), grid_free(&y[1]);
  }
  grid_free(&x);
  free(w);
  rope_free(&R);
}

/* ---- the table -------------------------------------------------------------- */

static void check_table(rmsnorm_dtype dt, size_t n_pos, size_t rot, double theta, double lf) {
  size_t es = dt == RMSNORM_F64 ? 8 : 4, half = rot / 2;
  void *t = malloc(n_pos * rot * es);
  TU_OK(rmsnorm_rope_table(t, dt, n_pos, rot, theta, lf));
  int ok = 1;
  for (size_t p = 0; p < n_pos && ok; p++)
    for (size_t i = 0; i < half && ok; i++) {
      long double ang = ((long double)p / lf) * powl(theta, -(long double)(2 * i) / rot);
      long double wc = cosl(ang), ws = sinl(ang);
      double gc = rn_load(t, dt, p * rot + i), gs = rn_load(t, dt, p * rot + half + i);
      /* the angle in double is off by a few of its ulps; then one rounding */
      long double e = (fabsl(ang) + 1) * 4 * 0x1p-53L;
      long double tc = store_tol(dt) * fabsl(wc) + e, tsn = store_tol(dt) * fabsl(ws) + e;
      ok = tu_check(fabsl(gc - wc) <= tc && fabsl(gs - ws) <= tsn,
                    "table %s rot=%zu theta=%g lf=%g p=%zu i=%zu: %.17g %.17g, want %.17Lg %.17Lg",
                    tu_dtype_name(dt), rot, theta, lf, p, i, gc, gs, wc, ws);
    }
  free(t);
}

static void check_table_errors(void) {
  float t[8];
  tu_check(rmsnorm_rope_table(NULL, RMSNORM_F32, 2, 4, 1e4, 1) == RMSNORM_ERROR_NULL_POINTER,
           "table: NULL");
  tu_check(rmsnorm_rope_table(NULL, RMSNORM_F32, 0, 4, 1e4, 1) == RMSNORM_OK,
           "table: no positions, NULL accepted");
  tu_check(rmsnorm_rope_table(t, RMSNORM_BF16, 2, 4, 1e4, 1) == RMSNORM_ERROR_BAD_DTYPE,
           "table: bf16");
  tu_check(rmsnorm_rope_table(t, (rmsnorm_dtype)9, 2, 4, 1e4, 1) == RMSNORM_ERROR_BAD_DTYPE,
           "table: unknown dtype");
  tu_check(rmsnorm_rope_table(t, RMSNORM_F32, 2, 0, 1e4, 1) == RMSNORM_ERROR_BAD_SIZE,
           "table: rotary_dim 0");
  tu_check(rmsnorm_rope_table(t, RMSNORM_F32, 2, 3, 1e4, 1) == RMSNORM_ERROR_BAD_ROPE,
           "table: odd rotary_dim");
  tu_check(rmsnorm_rope_table(t, RMSNORM_F32, SIZE_MAX / 2, 4, 1e4, 1) == RMSNORM_ERROR_BAD_SIZE,
           "table: size overflow");
  const double thetas[] = {1, 0.5, -1, NAN, INFINITY};
  for (int i = 0; i < 5; i++)
    tu_check(rmsnorm_rope_table(t, RMSNORM_F32, 2, 4, thetas[i], 1) == RMSNORM_ERROR_BAD_ROPE,
             "table: theta %g", thetas[i]);
  const double lfs[] = {0, -2, NAN, INFINITY};
  for (int i = 0; i < 4; i++)
    tu_check(rmsnorm_rope_table(t, RMSNORM_F32, 2, 4, 1e4, lfs[i]) == RMSNORM_ERROR_BAD_ROPE,
             "table: linear factor %g", lfs[i]);
}

/* ---- the fp64 backward against finite differences of the fp64 forward ---- */

static void check_fd(size_t heads, size_t d, size_t rot, int gptj, int per_token) {
  tcase c = {RMSNORM_F64, 1, heads, d, rot, gptj, TOKEN_MAJOR, 1, 1, 0, 1e-6, per_token};
  rmsnorm_config cfg = config_of(&c);
  cfg.param_dtype = RMSNORM_F64;
  rope_in R = rope_make(&c, 10000);
  R.pos[0] = 11;
  size_t D = heads * d, nw = wlen(&c);
  double x[192], dy[192], w[192], y[192], dx[192], dw[192];
  for (size_t j = 0; j < D; j++) x[j] = tu_normal(), dy[j] = tu_normal();
  for (size_t j = 0; j < nw; j++) w[j] = 1 + tu_normal() / 2;
  TU_OK(rmsnorm_qk_norm_rope_backward(ctx, &cfg, 1, heads, d, x, D, d, dy, D, d, w, &R.rope, NULL,
                                      dx, D, d, dw));
  for (int which = 0; which < 2; which++)
    for (size_t j = 0; j < (which ? nw : D); j++) {
      double *p = which ? w : x, keep = p[j], h = 1e-6 * (fabs(keep) + 1), lp = 0, lm = 0;
      p[j] = keep + h;
      TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, 1, heads, d, x, D, d, w, &R.rope, NULL, y, D,
                                         d, NULL));
      for (size_t i = 0; i < D; i++) lp += dy[i] * y[i];
      p[j] = keep - h;
      TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, 1, heads, d, x, D, d, w, &R.rope, NULL, y, D,
                                         d, NULL));
      for (size_t i = 0; i < D; i++) lm += dy[i] * y[i];
      p[j] = keep;
      double fdv = (lp - lm) / (2 * h), an = which ? dw[j] : dx[j];
      tu_check(fabs(fdv - an) <= 1e-6 * (fabs(fdv) + 1),
               "fd H=%zu d=%zu rot=%zu %s%s d%s[%zu]: %.12g vs %.12g", heads, d, rot,
               gptj ? "gptj" : "neox", per_token ? " per-token" : "", which ? "w" : "x", j, an,
               fdv);
    }
  rope_free(&R);
}

/* ---- fused GQA QKV with the KV cache ---------------------------------------- */

/* Q (hq heads) and K (hk heads) normalized and rotated in place inside a
 * [tokens, hq + 2 hk, hd] buffer, K also into a cache of [n_slots, 2, hk, hd]
 * (K and V of a slot side by side) with V copied from the buffer: bit for bit
 * the calls on contiguous copies, V untouched in the buffer, the cache's
 * written rows equal to K's, the rest of the cache as it was. */
static void check_qkv_cache(rmsnorm_dtype dt, size_t T, size_t hq, size_t hk, size_t hd,
                            int gptj) {
  size_t es = rn_dtype_size(dt), W = hq + 2 * hk, as = dt == RMSNORM_F64 ? 8 : 4;
  tcase c = {dt, T, hk, hd, 0, gptj, TOKEN_MAJOR, 1, 1, 0, 1e-6, 0};
  rmsnorm_config cfg = config_of(&c);
  rope_in R = rope_make(&c, 1e6);
  float *wq = weight_make(&c), *wk = weight_make(&c);
  unsigned char *qkv = malloc(T * W * hd * es), *qkv0 = malloc(T * W * hd * es);
  for (size_t i = 0; i < T * W * hd; i++)
    rn_store(qkv, dt, i, tu_normal() * (i % hd == 3 ? 25 : 1)); /* an outlier channel */
  memcpy(qkv0, qkv, T * W * hd * es);
  /* slots: some tokens padded (negative), the rest scattered */
  size_t n_slots = 2 * T + 3, ld_slot = 2 * hk * hd;
  int64_t *slots = malloc(T * sizeof *slots);
  for (size_t t = 0; t < T; t++) slots[t] = t % 4 == 1 ? -1 : (int64_t)((t * 5 + 2) % n_slots);
  unsigned char *cache = malloc(n_slots * ld_slot * es), *expect = malloc(n_slots * ld_slot * es);
  memset(cache, 0x5a, n_slots * ld_slot * es);
  rmsnorm_kv_cache kv;
  rmsnorm_kv_cache_init(&kv);
  kv.k = cache, kv.v = cache + hk * hd * es;
  kv.n_slots = n_slots, kv.ld_slot = ld_slot, kv.ld_head = hd;
  kv.slots = slots;
  kv.v_src = qkv0 + (hq + hk) * hd * es, kv.ldv_token = W * hd, kv.ldv_head = hd;
  void *rq = malloc(T * hq * as), *rk = malloc(T * hk * as);
  char what[120];
  snprintf(what, sizeof what, "%s T=%zu hq=%zu hk=%zu hd=%zu %s", tu_dtype_name(dt), T, hq, hk, hd,
           gptj ? "gptj" : "neox");
  /* contiguous copies: the references */
  unsigned char *q = malloc(T * hq * hd * es), *k = malloc(T * hk * hd * es);
  for (size_t t = 0; t < T; t++) {
    memcpy(q + t * hq * hd * es, qkv + t * W * hd * es, hq * hd * es);
    memcpy(k + t * hk * hd * es, qkv + (t * W + hq) * hd * es, hk * hd * es);
  }
  TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, T, hq, hd, q, hq * hd, hd, wq, &R.rope, NULL, q,
                                     hq * hd, hd, NULL));
  TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, T, hk, hd, k, hk * hd, hd, wk, &R.rope, NULL, k,
                                     hk * hd, hd, NULL));
  /* in place in the fused buffer; K with the cache */
  TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, T, hq, hd, qkv, W * hd, hd, wq, &R.rope, NULL, qkv,
                                     W * hd, hd, rq));
  TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, T, hk, hd, qkv + hq * hd * es, W * hd, hd, wk,
                                     &R.rope, &kv, qkv + hq * hd * es, W * hd, hd, rk));
  int same = 1;
  for (size_t t = 0; t < T; t++) {
    same &= !memcmp(qkv + t * W * hd * es, q + t * hq * hd * es, hq * hd * es);
    same &= !memcmp(qkv + (t * W + hq) * hd * es, k + t * hk * hd * es, hk * hd * es);
    same &= !memcmp(qkv + (t * W + hq + hk) * hd * es, qkv0 + (t * W + hq + hk) * hd * es,
                    hk * hd * es);
  }
  tu_check(same, "%s: in place in the QKV buffer = contiguous calls, V untouched", what);
  /* the cache: written rows are K's (V's), every other byte kept */
  memset(expect, 0x5a, n_slots * ld_slot * es);
  for (size_t t = 0; t < T; t++) {
    if (slots[t] < 0) continue;
    size_t s = (size_t)slots[t];
    memcpy(expect + s * ld_slot * es, k + t * hk * hd * es, hk * hd * es);
    memcpy(expect + (s * ld_slot + hk * hd) * es, qkv0 + (t * W + hq + hk) * hd * es, hk * hd * es);
  }
  tu_check(!memcmp(cache, expect, n_slots * ld_slot * es),
           "%s: the cache holds K and V of the slotted tokens, and nothing else changed", what);
  /* y NULL: the cache alone, the same bits */
  memset(cache, 0x5a, n_slots * ld_slot * es);
  TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, T, hk, hd, qkv0 + hq * hd * es, W * hd, hd, wk,
                                     &R.rope, &kv, NULL, 0, 0, NULL));
  tu_check(!memcmp(cache, expect, n_slots * ld_slot * es), "%s: y NULL: the same cache", what);
  free(qkv), free(qkv0), free(slots), free(cache), free(expect), free(rq), free(rk), free(q),
      free(k), free(wq), free(wk);
  rope_free(&R);
}

/* ---- every set and thread count against scalar at 1 thread --------------- */

typedef struct outs {
  grid y, dx, dx2;
  void *rstd;
  float *dw, *dw2;
  unsigned char *cache;
} outs;

typedef struct ins {
  grid x, dy, v;
  float *w;
  rope_in R;
  int64_t *slots;
  size_t n_slots, cache_bytes;
} ins;

/* forward (with the cache), backward with the saved rstd (dx, dw) and with
 * rstd recomputed (dx2, dw2). variant 1: y = x and dx = dy in place;
 * variant 2: dx2 = x in place; variant 3: no y, the cache the only
 * output (o->y left as x). */
static int run_all(const tcase *c, const ins *in, int variant, outs *o) {
  rmsnorm_config cfg = config_of(c);
  size_t T = c->tokens, H = c->heads, d = c->hd, as = c->dt == RMSNORM_F64 ? 8 : 4;
  grid x = grid_copy(&in->x), dy = grid_copy(&in->dy);
  o->y = variant == 1 ? x : grid_copy(&in->x);
  o->dx = variant == 1 ? dy : grid_copy(&in->dy);
  o->dx2 = grid_copy(&in->x);
  o->rstd = malloc(nstat(c) * as);
  o->dw = malloc(wlen(c) * 4), o->dw2 = malloc(wlen(c) * 4);
  o->cache = malloc(in->cache_bytes);
  memset(o->cache, 0x33, in->cache_bytes);
  rmsnorm_kv_cache kv;
  rmsnorm_kv_cache_init(&kv);
  size_t es = rn_dtype_size(c->dt);
  kv.k = o->cache, kv.v = o->cache + H * d * es;
  kv.n_slots = in->n_slots, kv.ld_slot = 2 * H * d, kv.ld_head = d;
  kv.slots = in->slots;
  kv.v_src = gp(&in->v), kv.ldv_token = in->v.ld_t, kv.ldv_head = in->v.ld_h;
  rmsnorm_status st = rmsnorm_qk_norm_rope_forward(
      ctx, &cfg, T, H, d, gp(&x), x.ld_t, x.ld_h, in->w, &in->R.rope, &kv,
      variant == 3 ? NULL : gp(&o->y), o->y.ld_t, o->y.ld_h, o->rstd);
  if (st != RMSNORM_OK) return 0;
  /* the backward's x: the original (variant 1 overwrote its copy) */
  const grid *xb = variant == 1 ? &in->x : &x;
  st = rmsnorm_qk_norm_rope_backward(ctx, &cfg, T, H, d, gp(xb), xb->ld_t, xb->ld_h,
                                     gp(variant == 1 ? &o->dx : &dy), dy.ld_t, dy.ld_h, in->w,
                                     &in->R.rope, o->rstd, gp(&o->dx), o->dx.ld_t, o->dx.ld_h,
                                     in->w ? o->dw : NULL);
  if (st != RMSNORM_OK) return 0;
  if (variant == 2) {
    st = rmsnorm_qk_norm_rope_backward(ctx, &cfg, T, H, d, gp(&o->dx2), o->dx2.ld_t, o->dx2.ld_h,
                                       gp(&in->dy), in->dy.ld_t, in->dy.ld_h, in->w, &in->R.rope,
                                       NULL, gp(&o->dx2), o->dx2.ld_t, o->dx2.ld_h,
                                       in->w ? o->dw2 : NULL);
  } else {
    st = rmsnorm_qk_norm_rope_backward(ctx, &cfg, T, H, d, gp(&in->x), in->x.ld_t, in->x.ld_h,
                                       gp(&in->dy), in->dy.ld_t, in->dy.ld_h, in->w, &in->R.rope,
                                       NULL, gp(&o->dx2), o->dx2.ld_t, o->dx2.ld_h,
                                       in->w ? o->dw2 : NULL);
  }
  if (variant != 1) grid_free(&x);
  if (variant != 1) grid_free(&dy);
  return st == RMSNORM_OK;
}

static void free_outs(outs *o) {
  grid_free(&o->y), grid_free(&o->dx), grid_free(&o->dx2);
  free(o->rstd), free(o->dw), free(o->dw2), free(o->cache);
}

static int outs_same(const tcase *c, const ins *in, const outs *a, const outs *b,
                     int with_y) {
  size_t as = c->dt == RMSNORM_F64 ? 8 : 4, nw = wlen(c) * 4;
  return (!with_y || grid_same(&a->y, &b->y)) && grid_same(&a->dx, &b->dx) &&
         grid_same(&a->dx2, &b->dx2) && !memcmp(a->rstd, b->rstd, nstat(c) * as) &&
         !memcmp(a->cache, b->cache, in->cache_bytes) &&
         (!in->w || (!memcmp(a->dw, b->dw, nw) && !memcmp(a->dw2, b->dw2, nw)));
}

/* Set for cases too large to run every variant: check_sets then runs the
 * in-place one (y = x, dx = dy) on 1 and 2 threads. */
static int sets_in_place_only;

/* Set for weights whose outputs reach the stores' edges: check_sets then
 * gives some columns gains that make y subnormal (a pair's both halves, so
 * the rotated sums stay tiny: VCVTNEPS2BF16 would flush them), and one a
 * NaN (its pair partner normal), in some vectors of a row but not others. */
static int edge_weights;

static void weight_edges(float *w, size_t d) {
  size_t half = d / 2;
  for (size_t j = 0; j < half; j += 16 + j % 3) w[j] = w[j + half] = 3e-39f * (1 + (float)(j % 4));
  w[half / 2 + 1] = NAN;
}

static void check_sets(const tcase *c0, int special) {
  tcase cc = *c0;
  size_t T = cc.tokens, H = cc.heads, d = cc.hd, rows = T * H;
  special = special && rows >= 4 && d >= 4;
  if (special)
    cc.eps = 0, cc.flags &= ~(unsigned)(RMSNORM_FLAG_ROUND_BEFORE_WEIGHT |
                                        RMSNORM_FLAG_ROUND_BEFORE_ROTATION |
                                        RMSNORM_FLAG_FLOAT_ROTATION);
  const tcase *c = &cc;
  char what[240];
  case_name(c, what, sizeof what);
  ins in;
  in.x = grid_alloc(c->dt, T, H, d, c->lay), in.dy = grid_alloc(c->dt, T, H, d, c->lay);
  in.v = grid_alloc(c->dt, T, H, d, FUSED_QKV);
  fill_act(&in.x), fill_grad(&in.dy), fill_grad(&in.v);
  /* rows 0..3 (t*H + h) for the long double path: overflowing squares,
   * zero (eps = 0), a NaN, squares that underflow (eps = 0) */
  size_t sr[4][2];
  for (size_t k = 0; k < 4; k++) sr[k][0] = k / H, sr[k][1] = k % H;
  if (special) {
    double big = c->dt == RMSNORM_F64 ? 1e200 : c->dt == RMSNORM_F16 ? 6e4 : 3e19;
    double tiny = c->dt == RMSNORM_F64 ? 1e-200 : c->dt == RMSNORM_F16 ? 1e-7 : 1e-30;
    for (size_t j = 0; j < d; j++) {
      gset(&in.x, sr[0][0], sr[0][1], j, j % 3 ? big : -big);
      gset(&in.x, sr[1][0], sr[1][1], j, 0);
      gset(&in.x, sr[2][0], sr[2][1], j, j == d / 2 ? NAN : 1);
      gset(&in.x, sr[3][0], sr[3][1], j, (j % 2 ? 1 : -1) * tiny * (1 + j % 5));
    }
  }
  in.w = weight_make(c);
  if (edge_weights && in.w) weight_edges(in.w, wlen(c));
  in.R = rope_make(c, 10000);
  in.n_slots = 3 * T + 2; /* slots 3t + 1: distinct, scattered */
  in.slots = malloc(T * sizeof *in.slots);
  for (size_t t = 0; t < T; t++) in.slots[t] = t % 3 == 2 ? -1 : (int64_t)(t * 3 + 1);
  in.cache_bytes = in.n_slots * 2 * H * d * rn_dtype_size(c->dt);
  rmsnorm_isa isas[] = {RMSNORM_ISA_SCALAR, RMSNORM_ISA_AVX2, RMSNORM_ISA_AVX512,
                        RMSNORM_ISA_NEON};
  outs ref;
  rmsnorm_context_set_isa(ctx, RMSNORM_ISA_SCALAR);
  rmsnorm_context_set_threads(ctx, 1);
  int ok = tu_check(run_all(c, &in, 0, &ref), "%s: reference run failed", what);
  for (size_t s = 0; s < 4 && ok; s++) {
    if (rmsnorm_context_set_isa(ctx, isas[s]) != RMSNORM_OK) continue;
    for (int th = 1; th <= (sets_in_place_only ? 2 : 3) && ok; th++) {
      rmsnorm_context_set_threads(ctx, th);
      for (int variant = 0; variant < 4 && ok; variant++) {
        if (sets_in_place_only && variant != 1) continue;
        outs o;
        int ran = run_all(c, &in, variant, &o);
        ok = tu_check(ran, "%s: run failed", what);
        ok = ok && tu_check(outs_same(c, &in, &o, &ref, variant != 3),
                            "%s %s threads=%d variant=%d%s: bits differ from scalar", what,
                            rmsnorm_isa_name(isas[s]), th, variant, special ? " special" : "");
        free_outs(&o);
      }
    }
  }
  if (ok && !sets_in_place_only) { /* a table at an address not aligned for its
                                      values (each token's row is then copied,
                                      not read in place): the same bits */
    size_t tb = in.R.n_pos * rot_of(c) * (c->dt == RMSNORM_F64 ? 8 : 4);
    unsigned char *odd = malloc(tb + 2);
    memcpy(odd + 2, in.R.table, tb);
    in.R.rope.cos_sin = odd + 2;
    rmsnorm_context_set_isa(ctx, RMSNORM_ISA_AUTO);
    outs o;
    ok = tu_check(run_all(c, &in, 0, &o), "%s: run failed", what) &&
         tu_check(outs_same(c, &in, &o, &ref, 1), "%s: table at an odd address: bits differ",
                  what);
    free_outs(&o);
    in.R.rope.cos_sin = in.R.table;
    free(odd);
  }
  if (special && ok) { /* the long double rows are right, not just equal */
    rope_opts o = {rot_of(c), c->gptj, 0};
    static ro_t xr[ROPE_ORACLE_MAX_N], wr[ROPE_ORACLE_MAX_N], yo[ROPE_ORACLE_MAX_N],
        mo[ROPE_ORACLE_MAX_N];
    ro_t cs[ROPE_ORACLE_MAX_D], r;
    for (size_t j = 0; j < wlen(c); j++) wr[j] = weight_at(c, in.w, j);
    /* the units (rows, or tokens) holding the special rows 0..3 */
    size_t last = c->per_token ? 3 / H : 3;
    for (size_t u = 0; u <= last; u++) {
      unit un = unit_at(c, u);
      size_t n = un.nh * d, first = un.t * H + un.h0; /* its rows: first .. first + nh - 1 */
      if (first <= 2 && 2 < first + un.nh) { /* NaN: the whole unit, and only it */
        int nan = 1;
        for (size_t j = 0; j < n; j++) nan &= isnan(gget(&ref.y, un.t, un.h0 + j / d, j % d)) != 0;
        tu_check(nan, "%s: a NaN row gives NaN (its unit %zu)", what, u);
        continue;
      }
      unit_get(&in.x, un, xr);
      row_angles(c, &in.R, un.t, cs);
      rope_forward_token(xr, in.w ? wr : NULL, un.nh, d, &o, cs, yo, &r, mo);
      int good = 1;
      for (size_t j = 0; j < n && good; j++) {
        double got = gget(&ref.y, un.t, un.h0 + j / d, j % d);
        long double bound =
            store_tol(c->dt) * fabsl(yo[j]) + compute_tol(c->dt) * mo[j] + store_abs(c->dt);
        good = tu_check(isfinite(got) && fabsl(got - yo[j]) <= bound,
                        "%s: special unit %zu y[%zu] = %.9g, oracle %.12Lg", what, u, j, got,
                        yo[j]);
      }
      for (size_t j = 0; j < n && good && first == 0; j++) /* the huge row's gradient */
        good = tu_check(isfinite(gget(&ref.dx, un.t, un.h0 + j / d, j % d)) &&
                            isfinite(gget(&ref.dx2, un.t, un.h0 + j / d, j % d)),
                        "%s: special unit %zu: dx finite", what, u);
    }
    if (rows > 4 && (!c->per_token || (rows - 1) / H > 2 / H)) /* a plain row beside them */
      tu_check(isfinite(gget(&ref.y, (rows - 1) / H, (rows - 1) % H, 0)), "%s: plain rows finite",
               what);
  }
  rmsnorm_context_set_isa(ctx, RMSNORM_ISA_AUTO);
  rmsnorm_context_set_threads(ctx, 0);
  free_outs(&ref);
  grid_free(&in.x), grid_free(&in.dy), grid_free(&in.v);
  free(in.w), free(in.slots);
  rope_free(&in.R);
}

/* ---- errors ------------------------------------------------------------------ */

#define ET 3 /* tokens */
#define EH 2 /* heads */
#define ED 8 /* head_dim */
#define EN (ET * EH * ED)

static float ex[EN], edy[EN], ew[ED], etable[16 * ED];
static float ey[EN], edx[EN], edw[ED], erstd[ET * EH], ecache[6 * 2 * EH * ED];
static float ey0[EN], edx0[EN], edw0[ED], erstd0[ET * EH], ecache0[6 * 2 * EH * ED];

static void err_reset(void) {
  for (int i = 0; i < EN; i++) ex[i] = (float)tu_normal(), edy[i] = (float)tu_normal();
  for (int i = 0; i < EN; i++) ey[i] = ey0[i] = edx[i] = edx0[i] = 42;
  for (int j = 0; j < ED; j++) ew[j] = 1, edw[j] = edw0[j] = 7;
  for (int i = 0; i < ET * EH; i++) erstd[i] = erstd0[i] = -5;
  for (size_t i = 0; i < sizeof ecache / 4; i++) ecache[i] = ecache0[i] = 99;
}

static int err_untouched(void) {
  return !memcmp(ey, ey0, sizeof ey) && !memcmp(edx, edx0, sizeof edx) &&
         !memcmp(edw, edw0, sizeof edw) && !memcmp(erstd, erstd0, sizeof erstd) &&
         !memcmp(ecache, ecache0, sizeof ecache);
}

static void err_expect(rmsnorm_status got, rmsnorm_status want, const char *what) {
  tu_check(got == want, "%s: %s, want %s", what, rmsnorm_status_name(got),
           rmsnorm_status_name(want));
  tu_check(err_untouched(), "%s: an output was written", what);
  err_reset();
}

static void check_errors(void) {
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  rmsnorm_rope rope;
  rmsnorm_rope_init(&rope, RMSNORM_ROPE_NEOX);
  TU_OK(rmsnorm_rope_table(etable, RMSNORM_F32, 16, ED, 1e4, 1));
  rope.cos_sin = etable;
  rope.n_positions = 16;
  int64_t pos[ET] = {3, 0, 15}, slots[ET] = {4, -1, 0};
  rmsnorm_kv_cache kv;
  rmsnorm_kv_cache_init(&kv);
  kv.k = ecache, kv.v = ecache + EH * ED;
  kv.n_slots = 6, kv.ld_slot = 2 * EH * ED, kv.ld_head = ED;
  kv.slots = slots;
  kv.v_src = edy, kv.ldv_token = EH * ED, kv.ldv_head = ED;
  rope.positions = pos;
  err_reset();
  /* a good call first (then restored) */
  TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, ET, EH, ED, ex, EH * ED, ED, ew, &rope, &kv, ey,
                                     EH * ED, ED, erstd));
  err_reset();
#define FWD(what_, want_, ...)                                                               \
  do {                                                                                       \
    rmsnorm_config c_ = cfg;                                                                 \
    rmsnorm_rope r_ = rope;                                                                  \
    rmsnorm_kv_cache k_ = kv;                                                                \
    int64_t p_[ET], s_[ET];                                                                  \
    memcpy(p_, pos, sizeof p_), memcpy(s_, slots, sizeof s_);                                \
    r_.positions = p_, k_.slots = s_;                                                        \
    size_t T_ = ET, H_ = EH, D_ = ED, ldxt_ = EH * ED, ldxh_ = ED, ldyt_ = EH * ED, ldyh_ = ED; \
    const float *x_ = ex;                                                                    \
    float *y_ = ey;                                                                          \
    const rmsnorm_kv_cache *kp_ = &k_;                                                       \
    const rmsnorm_rope *rp_ = &r_;                                                           \
    rmsnorm_context *cx_ = ctx;                                                              \
    __VA_ARGS__;                                                                             \
    err_expect(rmsnorm_qk_norm_rope_forward(cx_, &c_, T_, H_, D_, x_, ldxt_, ldxh_, ew, rp_, \
                                            kp_, y_, ldyt_, ldyh_, erstd),                   \
               want_, "forward: " what_);                                                    \
  } while (0)
  FWD("NULL context", RMSNORM_ERROR_NULL_POINTER, cx_ = NULL);
  FWD("config size 0", RMSNORM_ERROR_BAD_CONFIG, c_.size = 0);
  FWD("eps outside", RMSNORM_ERROR_BAD_FLAGS, c_.flags = RMSNORM_FLAG_EPS_OUTSIDE);
  FWD("accumulate", RMSNORM_ERROR_BAD_FLAGS, c_.flags = RMSNORM_FLAG_ACCUMULATE);
  FWD("unknown flag", RMSNORM_ERROR_BAD_FLAGS, c_.flags = 1u << 9);
  FWD("unknown flag next to the rounding ones", RMSNORM_ERROR_BAD_FLAGS, c_.flags = 1u << 6);
  FWD("negative eps", RMSNORM_ERROR_BAD_EPS, c_.eps = -1);
  FWD("partial", RMSNORM_ERROR_BAD_PARTIAL, c_.partial = 0.5);
  FWD("bad dtype", RMSNORM_ERROR_BAD_DTYPE, c_.dtype = (rmsnorm_dtype)5);
  FWD("head_dim 0", RMSNORM_ERROR_BAD_SIZE, D_ = 0);
  FWD("NULL rope", RMSNORM_ERROR_NULL_POINTER, rp_ = NULL);
  FWD("rope size 0", RMSNORM_ERROR_BAD_CONFIG, r_.size = 0);
  FWD("rope size 5000", RMSNORM_ERROR_BAD_CONFIG, r_.size = 5000);
  FWD("unknown style", RMSNORM_ERROR_BAD_ROPE, r_.style = 2);
  FWD("unknown norm mode", RMSNORM_ERROR_BAD_ROPE, r_.norm = 2);
  FWD("odd rotary_dim", RMSNORM_ERROR_BAD_ROPE, r_.rotary_dim = 3);
  FWD("rotary_dim above head_dim", RMSNORM_ERROR_BAD_ROPE, r_.rotary_dim = ED + 2);
  FWD("odd head_dim, rotary_dim 0", RMSNORM_ERROR_BAD_ROPE, D_ = 7);
  FWD("head_dim 1", RMSNORM_ERROR_BAD_ROPE, D_ = 1);
  FWD("cache size 0", RMSNORM_ERROR_BAD_CONFIG, k_.size = 0);
  /* no heads: no rows, success touching nothing (NULL buffers then too) */
  FWD("heads 0", RMSNORM_OK, H_ = 0);
  FWD("heads 0, NULL buffers", RMSNORM_OK, H_ = 0, x_ = NULL, y_ = NULL, kp_ = NULL);
  FWD("x head stride below head_dim", RMSNORM_ERROR_BAD_STRIDE, ldxh_ = ED - 1);
  FWD("y token stride overlapping", RMSNORM_ERROR_BAD_STRIDE, ldyt_ = ED);
  FWD("cache head stride below head_dim", RMSNORM_ERROR_BAD_STRIDE, k_.ld_head = ED - 1);
  FWD("cache slot stride overlapping", RMSNORM_ERROR_BAD_STRIDE, k_.ld_slot = ED);
  FWD("V source stride", RMSNORM_ERROR_BAD_STRIDE, k_.ldv_head = 1);
  FWD("NULL x", RMSNORM_ERROR_NULL_POINTER, x_ = NULL);
  FWD("NULL y, no cache", RMSNORM_ERROR_NULL_POINTER, y_ = NULL, kp_ = NULL);
  FWD("NULL K cache", RMSNORM_ERROR_NULL_POINTER, k_.k = NULL);
  FWD("NULL slots", RMSNORM_ERROR_NULL_POINTER, k_.slots = NULL);
  FWD("V cache without its source", RMSNORM_ERROR_NULL_POINTER, k_.v_src = NULL);
  FWD("NULL table", RMSNORM_ERROR_BAD_ARGUMENT, r_.cos_sin = NULL);
  FWD("negative position", RMSNORM_ERROR_OUT_OF_RANGE, p_[1] = -1);
  FWD("position past the table", RMSNORM_ERROR_OUT_OF_RANGE, p_[2] = 16);
  FWD("tokens past the table", RMSNORM_ERROR_OUT_OF_RANGE, r_.positions = NULL,
      r_.n_positions = 2);
  FWD("table size overflows", RMSNORM_ERROR_BAD_SIZE, r_.n_positions = SIZE_MAX / 8);
  FWD("slot past the cache", RMSNORM_ERROR_OUT_OF_RANGE, s_[0] = 6);
  FWD("two tokens in one slot", RMSNORM_ERROR_OVERLAP, s_[2] = 4);
  FWD("y overlapping x", RMSNORM_ERROR_OVERLAP, y_ = (float *)ex + 1);
  FWD("y = x with other strides", RMSNORM_ERROR_OVERLAP, y_ = (float *)ex, ldyh_ = ED + 1,
      ldyt_ = EH * (ED + 1));
  FWD("K cache overlapping x", RMSNORM_ERROR_OVERLAP, k_.k = (float *)ex + 2, k_.v = NULL,
      k_.n_slots = 1, s_[0] = 0, s_[2] = -1);
  FWD("K cache overlapping y", RMSNORM_ERROR_OVERLAP, k_.k = ey + 5, k_.v = NULL, k_.n_slots = 1,
      s_[0] = 0, s_[2] = -1);
  FWD("K and V caches overlapping", RMSNORM_ERROR_OVERLAP, k_.v = ecache + 3);
  FWD("V cache overlapping its source", RMSNORM_ERROR_OVERLAP, k_.v_src = ecache + EH * ED);
  FWD("cache overlapping the table", RMSNORM_ERROR_OVERLAP, r_.cos_sin = ecache,
      r_.positions = NULL, r_.n_positions = 4);
  FWD("rstd overlapping the table", RMSNORM_ERROR_OVERLAP, r_.cos_sin = erstd,
      r_.positions = NULL, r_.n_positions = 3);
#undef FWD
  { /* a caller built before rmsnorm_rope.norm: the field past its size is not
     * read (per head), the same bits as today's struct */
    rmsnorm_rope old = rope;
    old.size = offsetof(rmsnorm_rope, positions) + sizeof(const int64_t *);
    old.norm = 5;
    float y1[EN], y2[EN];
    TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, ET, EH, ED, ex, EH * ED, ED, ew, &old, NULL, y1,
                                       EH * ED, ED, NULL));
    TU_OK(rmsnorm_qk_norm_rope_forward(ctx, &cfg, ET, EH, ED, ex, EH * ED, ED, ew, &rope, NULL, y2,
                                       EH * ED, ED, NULL));
    tu_check(!memcmp(y1, y2, sizeof y1), "a rope of the first version: per head");
  }
  /* tokens == 0 touches nothing, NULL buffers accepted */
  tu_check(rmsnorm_qk_norm_rope_forward(ctx, &cfg, 0, EH, ED, NULL, 0, 0, NULL, &rope, NULL, NULL,
                                        0, 0, NULL) == RMSNORM_OK, "forward: no tokens");
  err_reset();

#define BWD(what_, want_, ...)                                                                 \
  do {                                                                                         \
    rmsnorm_config c_ = cfg;                                                                   \
    rmsnorm_rope r_ = rope;                                                                    \
    int64_t p_[ET];                                                                            \
    memcpy(p_, pos, sizeof p_);                                                                \
    r_.positions = p_;                                                                         \
    size_t H_ = EH, lddxh_ = ED;                                                               \
    const float *dy_ = edy, *w_ = ew;                                                          \
    float *dx_ = edx, *dw_ = edw;                                                              \
    const void *rs_ = NULL;                                                                    \
    __VA_ARGS__;                                                                               \
    err_expect(rmsnorm_qk_norm_rope_backward(ctx, &c_, ET, H_, ED, ex, EH * ED, ED, dy_,       \
                                             EH * ED, ED, w_, &r_, rs_, dx_, EH * ED, lddxh_,  \
                                             dw_),                                             \
               want_, "backward: " what_);                                                     \
  } while (0)
  BWD("eps outside", RMSNORM_ERROR_BAD_FLAGS, c_.flags = RMSNORM_FLAG_EPS_OUTSIDE);
  BWD("partial", RMSNORM_ERROR_BAD_PARTIAL, c_.partial = 0.25);
  BWD("rope size 0", RMSNORM_ERROR_BAD_CONFIG, r_.size = 0);
  BWD("unknown style", RMSNORM_ERROR_BAD_ROPE, r_.style = 7);
  BWD("unknown norm mode", RMSNORM_ERROR_BAD_ROPE, r_.norm = 9);
  BWD("dweight without weight", RMSNORM_ERROR_BAD_ARGUMENT, w_ = NULL);
  BWD("heads 0", RMSNORM_OK, H_ = 0); /* dweight not written, as with rows == 0 */
  BWD("dx stride", RMSNORM_ERROR_BAD_STRIDE, lddxh_ = 2);
  BWD("NULL dy", RMSNORM_ERROR_NULL_POINTER, dy_ = NULL);
  BWD("NULL dx", RMSNORM_ERROR_NULL_POINTER, dx_ = NULL);
  BWD("NULL table", RMSNORM_ERROR_BAD_ARGUMENT, r_.cos_sin = NULL);
  BWD("position past the table", RMSNORM_ERROR_OUT_OF_RANGE, p_[0] = 99);
  /* dweight is heads*head_dim long per token: it meets an rstd that a
   * head_dim long one would not */
  BWD("per token: dweight of heads*head_dim overlapping rstd", RMSNORM_ERROR_OVERLAP,
      r_.norm = RMSNORM_ROPE_NORM_TOKEN, w_ = ecache0, dw_ = ecache, rs_ = ecache + 12);
  BWD("dx overlapping dy", RMSNORM_ERROR_OVERLAP, dx_ = (float *)edy + 1);
  BWD("dx overlapping rstd", RMSNORM_ERROR_OVERLAP, rs_ = edx + 4);
  BWD("dweight overlapping dx", RMSNORM_ERROR_OVERLAP, dw_ = edx + 3);
  BWD("dweight overlapping the table", RMSNORM_ERROR_OVERLAP, dw_ = (float *)etable);
#undef BWD
  /* RMSNORM_FLAG_ACCUMULATE adds into dweight */
  float dw1[ED], dw2[ED];
  TU_OK(rmsnorm_qk_norm_rope_backward(ctx, &cfg, ET, EH, ED, ex, EH * ED, ED, edy, EH * ED, ED, ew,
                                      &rope, NULL, edx, EH * ED, ED, dw1));
  for (size_t j = 0; j < ED; j++) dw2[j] = 1;
  rmsnorm_config acc = cfg;
  acc.flags |= RMSNORM_FLAG_ACCUMULATE;
  TU_OK(rmsnorm_qk_norm_rope_backward(ctx, &acc, ET, EH, ED, ex, EH * ED, ED, edy, EH * ED, ED, ew,
                                      &rope, NULL, edx, EH * ED, ED, dw2));
  int same = 1;
  for (size_t j = 0; j < ED; j++) same &= dw2[j] == 1 + dw1[j];
  tu_check(same, "RMSNORM_FLAG_ACCUMULATE adds dweight");
  /* the rounding flag does not change the backward */
  float dx3[EN], dw3[ED];
  rmsnorm_config hf = cfg;
  hf.flags |= RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
  TU_OK(rmsnorm_qk_norm_rope_backward(ctx, &hf, ET, EH, ED, ex, EH * ED, ED, edy, EH * ED, ED, ew,
                                      &rope, NULL, dx3, EH * ED, ED, dw3));
  tu_check(!memcmp(dx3, edx, sizeof dx3) && !memcmp(dw3, dw1, sizeof dw3),
           "the rounding flag is the identity in the backward");
  tu_check(rmsnorm_qk_norm_rope_backward(ctx, &cfg, 0, EH, ED, NULL, 0, 0, NULL, 0, 0, NULL, &rope,
                                         NULL, NULL, 0, 0, NULL) == RMSNORM_OK,
           "backward: no tokens");
}

int main(void) {
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) return 2;
  tu_seed(23);
  int emu = tu_reduced(); /* the reduced sets (emulation, sanitizers) */
  static const rmsnorm_dtype dts[] = {RMSNORM_F32, RMSNORM_F64, RMSNORM_F16, RMSNORM_BF16};
  static const size_t heads_of[] = {1, 2, 8, 32};

  for (int dt = 0; dt < 2; dt++) {
    rmsnorm_dtype t = dt ? RMSNORM_F64 : RMSNORM_F32;
    check_table(t, emu ? 64 : 4096, 128, 10000, 1);
    check_table(t, emu ? 64 : 2048, 64, 1e6, 8);
    check_table(t, 33, 2, 500000, 1);
  }
  check_table_errors();

  /* the oracle: head_dim 1..70 and the common sizes, full and partial
   * rotation (odd head_dims rotate an even part) */
  size_t hds[80], nh = 0;
  for (size_t d = 1; d <= 70; d++)
    if (!emu || d % 3 == 1 || d <= 8) hds[nh++] = d;
  hds[nh++] = 80, hds[nh++] = 128;
  if (!emu) hds[nh++] = 256;
  size_t k = 0;
  for (size_t i = 0; i < nh; i++) {
    size_t d = hds[i];
    size_t rots[2] = {d % 2 ? d - 1 : 0, (d / 2) & ~(size_t)1};
    if (d == 128) rots[1] = 32;
    for (int ri = 0; ri < 2; ri++) {
      if (rots[ri] == 0 && d % 2) continue; /* head_dim 1: nothing to rotate */
      if (ri == 1 && (rots[1] == 0 || rots[1] == rot_of(&(tcase){.hd = d, .rot = rots[0]})))
        continue;
      for (int gptj = 0; gptj < 2; gptj++, k++)
        for (size_t di = 0; di < 4; di++) {
          /* k: the case's number among the dtypes' rounds, for the variety */
          size_t H = heads_of[(k + di) % 4], T = H >= 8 ? 2 : 5;
          if (emu) T = 2, H = H > 2 ? 2 : H;
          unsigned flags = (k + di) % 3 == 1 ? RMSNORM_FLAG_WEIGHT_OFFSET : 0;
          tcase c = {dts[di], T, H, d, rots[ri], gptj, (layout)((k + di) % 3),
                     (int)((k + di / 2) % 2), (int)(k % 5 != 3), flags, 1e-6, 0};
          check_oracle(&c);
          if (dts[di] != RMSNORM_F64 && (k % 4 == 0 || dts[di] == RMSNORM_F16 ||
                                         dts[di] == RMSNORM_BF16)) {
            unsigned base = c.flags;
            c.flags = base | RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
            check_oracle(&c);
            /* Gemma 3's and OLMo 2's roundings, and Qwen3's norm rotated in float */
            c.flags = base | RMSNORM_FLAG_ROUND_BEFORE_ROTATION |
                      ((k + di) % 2 ? RMSNORM_FLAG_FLOAT_ROTATION : 0);
            check_oracle(&c);
            if (k % 3 == 0) {
              c.flags = base | RMSNORM_FLAG_ROUND_BEFORE_WEIGHT | RMSNORM_FLAG_FLOAT_ROTATION;
              check_oracle(&c);
            }
            c.flags = base;
          }
          /* one statistic per token over its heads (OLMo 2) */
          if ((k + di) % 2 == 0 || H == 1) {
            c.per_token = 1;
            check_oracle(&c);
            if (dts[di] == RMSNORM_BF16 || dts[di] == RMSNORM_F16) {
              c.flags |= RMSNORM_FLAG_ROUND_BEFORE_ROTATION |
                         (k % 2 ? RMSNORM_FLAG_FLOAT_ROTATION : 0);
              check_oracle(&c);
            }
          }
        }
    }
  }
  for (size_t di = 0; di < 4; di++) {
    check_identity(dts[di], 0, 1);
    check_identity(dts[di], 0, 0);
    check_identity(dts[di], RMSNORM_FLAG_WEIGHT_OFFSET, 1);
    check_identity(dts[di], RMSNORM_FLAG_ROUND_BEFORE_WEIGHT, 1);
    check_identity_token(dts[di], 0, 1, 3, 64);
    check_identity_token(dts[di], 0, 0, 8, 14);
    check_identity_token(dts[di], 0, 1, 16, 128);
    check_identity_token(dts[di], RMSNORM_FLAG_WEIGHT_OFFSET, 1, 16, 128);
    check_identity_token(dts[di], RMSNORM_FLAG_ROUND_BEFORE_WEIGHT, 1, 2, 80);
    check_flag_combinations(dts[di]);
  }
  for (int gptj = 0; gptj < 2; gptj++) {
    check_fd(1, 16, 0, gptj, 0);
    check_fd(1, 24, 8, gptj, 0);
    check_fd(3, 16, 0, gptj, 1); /* one statistic over the token's heads */
    check_fd(4, 24, 8, gptj, 1);
  }
  for (size_t di = 0; di < 4; di++) {
    check_qkv_cache(dts[di], 7, 8, 2, 64, 0);
    check_qkv_cache(dts[di], 3, 4, 1, 128, 1);
    if (!emu) check_qkv_cache(dts[di], 20, 32, 8, 128, 0);
  }
  /* sets and threads: {tokens, heads, hd, rot, layout}, enough tokens to
   * split and to span several 64-row chunks; the last, 1 MiB of fp32 y or
   * more apart from x, has its rows streamed past the caches */
  static const size_t set_shapes[][5] = {{1, 32, 128, 0, 0}, {70, 2, 64, 0, 1},
                                         {9, 4, 7, 4, 0},    {5, 3, 80, 32, 2},
                                         {33, 1, 256, 0, 0}, {300, 8, 128, 64, 0},
                                         {2050, 1, 128, 0, 0}};
  for (size_t s = 0; s < sizeof set_shapes / sizeof set_shapes[0]; s++) {
    if (emu && set_shapes[s][2] > 128) continue;
    for (size_t di = 0; di < 4; di++)
      for (int gptj = 0; gptj < 2; gptj++) {
        size_t T = set_shapes[s][0];
        if (emu && T > 40) T = 40;
        tcase c = {dts[di], T, set_shapes[s][1], set_shapes[s][2], set_shapes[s][3], gptj,
                   (layout)set_shapes[s][4], (int)(s & 1), (int)(s != 2),
                   (s % 3 == 1 ? RMSNORM_FLAG_WEIGHT_OFFSET : 0) |
                       (di >= 2 && (gptj || s % 2) ? RMSNORM_FLAG_ROUND_BEFORE_WEIGHT : 0),
                   1e-6, 0};
        check_sets(&c, 0);
        if (gptj == 0) check_sets(&c, 1);
        if (s % 2 == 0 || gptj == 0) { /* per token, with Gemma 3's or OLMo 2's roundings */
          c.per_token = 1;
          if (di >= 2 && s % 3 != 1)
            c.flags = (c.flags & ~(unsigned)RMSNORM_FLAG_ROUND_BEFORE_WEIGHT) |
                      RMSNORM_FLAG_ROUND_BEFORE_ROTATION |
                      (s % 2 ? RMSNORM_FLAG_FLOAT_ROTATION : 0);
          check_sets(&c, gptj == 0);
        }
      }
  }
  edge_weights = 1; /* every dtype, rows in groups and alone */
  for (size_t di = 0; di < 4; di++) {
    tcase edges = {dts[di], 5, 4, 128, 0, 0, TOKEN_MAJOR, 0, 1, 0, 1e-6, 0};
    check_sets(&edges, 0);
    edges.per_token = 1;
    check_sets(&edges, 0);
  }
  edge_weights = 0;
  if (!emu) { /* 2-byte rows from 1 MiB on: y and the backward's dx stream too */
    tcase big = {RMSNORM_BF16, 4100, 1, 128, 0, 0, TOKEN_MAJOR, 1, 1, 0, 1e-6, 0};
    check_sets(&big, 0);
    /* from 4 MiB of x and y, streamed 2-byte rows prefetch the next group */
    for (size_t di = 2; di < 4; di++) {
      tcase dram = {dts[di], 8193, 1, 128, 0, 0, TOKEN_MAJOR, 1, 1, 0, 1e-6, 0};
      check_sets(&dram, 0);
    }
    /* calls of 32 MiB or more written in place: AVX-512 takes their rows one
     * at a time (fp32, fp64) */
    sets_in_place_only = 1;
    tcase f32 = {RMSNORM_F32, 32769, 1, 128, 0, 0, TOKEN_MAJOR, 1, 1, 0, 1e-6, 0};
    tcase f64 = {RMSNORM_F64, 16385, 1, 128, 0, 0, TOKEN_MAJOR, 0, 1, 0, 1e-6, 0};
    check_sets(&f32, 0);
    check_sets(&f64, 0);
    sets_in_place_only = 0;
  }
  check_errors();
  rmsnorm_context_free(ctx);
  return tu_finish("rope");
}
