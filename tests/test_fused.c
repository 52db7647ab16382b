/* test_fused.c - the transformer-block fusions: residual add + RMSNorm
 * (bit for bit the unfused composition, forward and backward), quantized
 * output (against a long-double oracle of the documented formula, and the e4m3
 * rounding against a brute-force nearest search), QK-norm (bit for bit
 * rmsnorm_forward/backward per token, QKV layouts), RMSNorm + linear (against
 * the unfused long-double oracle, forward and backward); every available ISA
 * and thread count bit-identical to the scalar reference; error statuses with
 * nothing written. Run per kernel set through RMSNORM_ISA. */
#include <float.h>

#include "oracle.h"
#include "numerics/quant.h"
#include "numerics/rowmath.h"
#include "testutil.h"

static rmsnorm_context *ctx;

static rmsnorm_config make_cfg(rmsnorm_dtype dt, rmsnorm_dtype pdt, int v) {
  rmsnorm_config c;
  rmsnorm_config_init(&c, dt);
  c.param_dtype = pdt;
  c.eps = v % 4 == 1 ? 0.0 : 1e-5;
  c.partial = v % 5 == 2 ? 0.4 : 1.0;
  c.flags = (v % 3 == 1 ? RMSNORM_FLAG_EPS_OUTSIDE : 0) |
            (v % 4 == 2 ? RMSNORM_FLAG_WEIGHT_OFFSET : 0) |
            (v % 6 == 5 && dt != RMSNORM_F32 && dt != RMSNORM_F64
                 ? RMSNORM_FLAG_ROUND_BEFORE_WEIGHT : 0);
  return c;
}

static tu_tensor vec(rmsnorm_dtype dt, size_t n, double base, double scale) {
  tu_tensor t = tu_alloc(dt, 1, n, n);
  for (size_t j = 0; j < n; j++) tu_set(&t, 0, j, base + scale * tu_normal());
  return t;
}

static int same_rows(const tu_tensor *a, const tu_tensor *b) {
  size_t es = rn_dtype_size(a->dt);
  for (size_t i = 0; i < a->rows; i++)
    if (memcmp((char *)a->data + i * a->ld * es, (char *)b->data + i * b->ld * es, a->d * es))
      return 0;
  return 1;
}

static tu_tensor copy_of(const tu_tensor *t) {
  tu_tensor c = tu_alloc(t->dt, t->rows, t->d, t->ld);
  memcpy(c.data, t->data, t->bytes);
  return c;
}

/* ---- residual add + RMSNorm ------------------------------------------- */

/* h' = round(h + u) exactly, y and rstd bit for bit rmsnorm_forward(h'). */
static void add_forward_case(rmsnorm_dtype dt, rmsnorm_dtype pdt, size_t rows, size_t d, int v) {
  rmsnorm_config cfg = make_cfg(dt, pdt, v);
  int inplace = v % 3 == 2; /* y = u */
  size_t ldh = d + (v & 1) * 3, ldu = inplace ? d + 2 : d + (v % 3 == 0), ldy = inplace ? ldu : d + (v & 2);
  tu_tensor h = tu_alloc(dt, rows, d, ldh), u = tu_alloc(dt, rows, d, ldu);
  tu_fill_normal(&h, 1.0), tu_fill_normal(&u, 0.5);
  if (rows > 3 && v % 7 == 0) /* a row for the rescue path */
    for (size_t j = 0; j < d; j++) tu_set(&h, 1, j, dt == RMSNORM_F16 ? 3000.0 : 1e30);
  tu_tensor w = vec(pdt, d, v % 4 == 2 ? 0 : 1, 0.2), b = vec(pdt, d, 0, 0.5);
  const void *wp = v % 5 == 4 ? NULL : w.data, *bp = v & 1 ? b.data : NULL;
  tu_tensor h0 = copy_of(&h), u0 = copy_of(&u);
  tu_tensor y = inplace ? u : tu_alloc(dt, rows, d, ldy);
  size_t as = rn_acc_size(dt);
  void *rstd = calloc(rows, as), *rstd2 = calloc(rows, as);
  rmsnorm_status st = rmsnorm_add_forward(ctx, &cfg, rows, d, h.data, ldh, u.data, ldu, wp, bp,
                                          y.data, ldy, rstd);
  tu_check(st == RMSNORM_OK, "add_forward %s d=%zu v=%d: %s", tu_dtype_name(dt), d, v,
           rmsnorm_status_name(st));
  int sum_ok = 1;
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < d; j++) {
      double want = rn_round_to(dt, tu_get(&h0, i, j) + tu_get(&u0, i, j));
      sum_ok &= tu_get(&h, i, j) == want;
    }
  tu_check(sum_ok, "add_forward %s d=%zu v=%d: h' is not the rounded sum", tu_dtype_name(dt), d, v);
  tu_tensor y2 = tu_alloc(dt, rows, d, d);
  st = rmsnorm_forward(ctx, &cfg, rows, d, h.data, ldh, wp, bp, y2.data, d, rstd2);
  tu_check(st == RMSNORM_OK && same_rows(&y, &y2) && !memcmp(rstd, rstd2, rows * as),
           "add_forward %s pdt=%s rows=%zu d=%zu v=%d: y/rstd differ from rmsnorm_forward(h')",
           tu_dtype_name(dt), tu_dtype_name(pdt), rows, d, v);
  free(rstd), free(rstd2);
  tu_free(&h), tu_free(&u), tu_free(&h0), tu_free(&u0), tu_free(&w), tu_free(&b), tu_free(&y2);
  if (!inplace) tu_free(&y);
}

/* dh bit for bit rmsnorm_backward followed by dh = round(dx + dres). */
static void add_backward_case(rmsnorm_dtype dt, rmsnorm_dtype pdt, size_t rows, size_t d, int v) {
  rmsnorm_config cfg = make_cfg(dt, pdt, v);
  cfg.flags &= ~(unsigned)RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
  if (v % 4 == 3) cfg.flags |= RMSNORM_FLAG_ACCUMULATE;
  int mode = v % 4; /* 0 dh separate, 1 dh = dres, 2 dh = dy, 3 no dres */
  size_t ld = d + (v & 1);
  tu_tensor h = tu_alloc(dt, rows, d, ld), dy = tu_alloc(dt, rows, d, ld), dres = tu_alloc(dt, rows, d, ld);
  tu_fill_normal(&h, 1.0), tu_fill_normal(&dy, 1.0), tu_fill_normal(&dres, 1.0);
  if (rows > 3 && v % 5 == 0)
    for (size_t j = 0; j < d; j++) tu_set(&h, 2, j, dt == RMSNORM_F16 ? 3000.0 : 1e30);
  tu_tensor w = vec(pdt, d, v % 4 == 2 ? 0 : 1, 0.2);
  tu_tensor dw = vec(pdt, d, 0, 1), db = vec(pdt, d, 0, 1);
  tu_tensor dw2 = copy_of(&dw), db2 = copy_of(&db), dy0 = copy_of(&dy), dres0 = copy_of(&dres);
  tu_tensor dhbuf = tu_alloc(dt, rows, d, ld), dx = tu_alloc(dt, rows, d, d);
  void *dh = mode == 1 ? dres.data : mode == 2 ? dy.data : dhbuf.data;
  size_t as = rn_acc_size(dt);
  void *rstd = calloc(rows, as);
  if (v & 2) { /* saved rstd */
    tu_tensor y = tu_alloc(dt, rows, d, d);
    rmsnorm_forward(ctx, &cfg, rows, d, h.data, ld, w.data, NULL, y.data, d, rstd);
    tu_free(&y);
  }
  const void *rp = v & 2 ? rstd : NULL;
  rmsnorm_status st = rmsnorm_add_backward(ctx, &cfg, rows, d, h.data, ld, dy.data, ld,
                                           mode == 3 ? NULL : dres.data, ld, w.data, rp, dh, ld,
                                           dw.data, db.data);
  rmsnorm_status st2 = rmsnorm_backward(ctx, &cfg, rows, d, h.data, ld, dy0.data, ld, w.data, rp,
                                        dx.data, d, dw2.data, db2.data);
  int ok = st == RMSNORM_OK && st2 == RMSNORM_OK;
  tu_tensor dht = {dt, rows, d, ld, dh, 0};
  for (size_t i = 0; i < rows && ok; i++)
    for (size_t j = 0; j < d; j++) {
      double want = tu_get(&dx, i, j);
      if (mode != 3) want = rn_round_to(dt, want + tu_get(&dres0, i, j));
      double got = tu_get(&dht, i, j);
      ok &= got == want || (isnan(got) && isnan(want));
    }
  ok &= same_rows(&dw, &dw2) && same_rows(&db, &db2);
  tu_check(ok, "add_backward %s pdt=%s rows=%zu d=%zu v=%d mode=%d: differs from backward + add",
           tu_dtype_name(dt), tu_dtype_name(pdt), rows, d, v, mode);
  free(rstd);
  tu_free(&h), tu_free(&dy), tu_free(&dres), tu_free(&w), tu_free(&dw), tu_free(&db);
  tu_free(&dw2), tu_free(&db2), tu_free(&dy0), tu_free(&dres0), tu_free(&dhbuf), tu_free(&dx);
}

static void test_add(void) {
  static const size_t ds[] = {1, 2, 7, 16, 17, 33, 64, 100, 129, 1025, 4096};
  int v = 0;
  for (int dt = 0; dt < 4; dt++)
    for (int pd = 0; pd < 2; pd++)
      for (size_t k = 0; k < sizeof ds / sizeof *ds; k++)
        for (int rep = 0; rep < 3; rep++, v++) {
          rmsnorm_dtype pdt = pd ? RMSNORM_F32 : (rmsnorm_dtype)dt;
          size_t rows = ds[k] >= 1025 ? 9 : 5 + (size_t)rep;
          add_forward_case((rmsnorm_dtype)dt, pdt, rows, ds[k], v);
          add_backward_case((rmsnorm_dtype)dt, pdt, rows, ds[k], v);
        }
  /* many rows: several blocks and tasks, and streamed y */
  add_forward_case(RMSNORM_F32, RMSNORM_F32, 1100, 4096, 3);
  add_backward_case(RMSNORM_BF16, RMSNORM_F32, 700, 1000, 4);
  add_backward_case(RMSNORM_F32, RMSNORM_F32, 300, 4096, 1);
}

/* ---- quantized output ------------------------------------------------- */

/* Half a step of e4m3 around |t| (t finite, <= 448). */
static double e4m3_half_step(double t) {
  double a = fabs(t);
  if (a < 0x1p-6) return 0x1p-10;
  return ldexp(1.0, ilogb(a) - 3) / 2;
}

/* e4m3 of t by brute force: the nearest finite code, ties to the even code,
 * saturating; independent of quant.h's bit manipulation. */
static uint8_t e4m3_nearest(float t) {
  if (isnan(t)) return (uint8_t)((signbit(t) ? 0x80 : 0) | 0x7f);
  double a = fabs((double)t);
  int best = 0;
  double bd = INFINITY;
  for (int c = 0; c <= 0x7e; c++) {
    double dist = fabs(rn_e4m3_value((uint8_t)c) - a);
    if (dist < bd || (dist == bd && (c & 1) == 0)) bd = dist, best = c;
  }
  return (uint8_t)((signbit(t) ? 0x80 : 0) | best);
}

static void test_e4m3_rounding(void) {
  int bad = 0;
  /* every code, every midpoint, and the floats just around them */
  for (int c = 0; c < 0x7e; c++) {
    double lo = rn_e4m3_value((uint8_t)c), hi = rn_e4m3_value((uint8_t)(c + 1));
    float pts[6] = {(float)lo, (float)((lo + hi) / 2), nextafterf((float)((lo + hi) / 2), 0),
                    nextafterf((float)((lo + hi) / 2), INFINITY), (float)hi,
                    (float)(lo + (hi - lo) * 0.3)};
    for (int k = 0; k < 6; k++)
      for (int sg = 0; sg < 2; sg++) {
        float t = sg ? -pts[k] : pts[k];
        bad += rn_e4m3_code(t) != e4m3_nearest(t);
      }
  }
  float special[] = {448.0f, 463.99f, 464.0f, 1e6f, INFINITY, -INFINITY, 0x1p-10f, 0x1p-11f,
                     0x1.8p-10f, 1e-40f, 0.0f, -0.0f};
  for (size_t k = 0; k < sizeof special / sizeof *special; k++)
    bad += rn_e4m3_code(special[k]) != e4m3_nearest(special[k]);
  for (int k = 0; k < 20000; k++) {
    float t = (float)(tu_normal() * ldexp(1.0, (int)(tu_next() % 30) - 15));
    bad += rn_e4m3_code(t) != e4m3_nearest(t);
  }
  tu_check(bad == 0, "e4m3 rounding: %d codes differ from the nearest-even search", bad);
  tu_check(rn_e4m3_code(NAN) == 0x7f && rn_e4m3_code(-NAN) == 0xff &&
               rn_e4m3_code(INFINITY) == 0x7e && rn_e4m3_code(-1e9f) == 0xfe,
           "e4m3 NaN/saturation codes");
  tu_check(rn_i8_code_f32(2.5f) == 2 && rn_i8_code_f32(3.5f) == 4 && rn_i8_code_f32(-2.5f) == -2 &&
               rn_i8_code_f32(300.0f) == 127 && rn_i8_code_f32(-300.0f) == -128 &&
               rn_i8_code_f32(NAN) == 0,
           "int8 rounding: half-even, saturation, NaN");
}

/* Against the long-double oracle of the same formula: the scale within the
 * compute type's rounding, and every code within half a step (plus the
 * rounding of y) of the oracle's t. */
static void quant_case(rmsnorm_dtype dt, rmsnorm_dtype pdt, size_t rows, size_t d, int v,
                       int fp8, int stat) {
  rmsnorm_config cfg = make_cfg(dt, pdt, v);
  size_t ldx = d + (v & 1) * 5, ldq = d + (v & 2);
  tu_tensor x = tu_alloc(dt, rows, d, ldx);
  tu_fill_normal(&x, v % 3 == 0 ? 1e-3 : 1.0);
  if (rows > 2) for (size_t j = 0; j < d; j++) tu_set(&x, 1, j, 0.0); /* an all-zero row */
  tu_tensor w = vec(pdt, d, v % 4 == 2 ? 0 : 1, 0.3), b = vec(pdt, d, 0, 0.5);
  const void *wp = v % 5 == 4 ? NULL : w.data, *bp = v & 1 ? b.data : NULL;
  unsigned char *q = malloc((rows - 1) * ldq + d);
  memset(q, 0xcd, (rows - 1) * ldq + d);
  float *scale = malloc(rows * sizeof(float));
  float sstat = fp8 ? 0.01f : 0.02f; /* saturates some codes */
  rmsnorm_status st = rmsnorm_forward_quant(ctx, &cfg, rows, d, x.data, ldx, wp, bp,
                                            fp8 ? RMSNORM_Q_FP8_E4M3 : RMSNORM_Q_INT8,
                                            stat ? &sstat : NULL, q, ldq, stat ? NULL : scale,
                                            NULL);
  tu_check(st == RMSNORM_OK, "quant: status %s", rmsnorm_status_name(st));
  oracle_opts o = {0, tu_partial_k(cfg.partial, d), cfg.eps,
                   (cfg.flags & RMSNORM_FLAG_EPS_OUTSIDE) != 0,
                   (cfg.flags & RMSNORM_FLAG_ROUND_BEFORE_WEIGHT) != 0, dt};
  ld_t *xl = malloc(d * sizeof(ld_t)), *yl = malloc(d * sizeof(ld_t));
  ld_t *wl = malloc(d * sizeof(ld_t)), *bl = malloc(d * sizeof(ld_t));
  for (size_t j = 0; j < d; j++) {
    wl[j] = (v % 4 == 2 ? 1 : 0) + (ld_t)tu_get(&w, 0, j);
    bl[j] = tu_get(&b, 0, j);
  }
  /* relative error of y in the compute type, and so of t */
  double rel = dt == RMSNORM_F64 ? 1e-13 : 2e-6;
  if (o.round_first) rel = dt == RMSNORM_F16 ? 2e-3 : 1e-2; /* an fp16/bf16 rounding of xhat */
  int worst_ok = 1;
  for (size_t i = 0; i < rows && st == RMSNORM_OK; i++) {
    ld_t m, r, amax = 0, ysum = 0;
    for (size_t j = 0; j < d; j++) xl[j] = tu_get(&x, i, j);
    oracle_forward_row(xl, d, wp ? wl : NULL, bp ? bl : NULL, &o, yl, &m, &r);
    /* rows the rescue path takes quantize y rounded to the data dtype */
    ld_t ss = 0;
    for (size_t j = 0; j < o.k; j++) ss += xl[j] * xl[j];
    int f64 = dt == RMSNORM_F64;
    if (f64 ? ss < 0x1p-960L && cfg.eps < 0x1p-930 : ss < 0x1p-100L && cfg.eps < 0x1p-70)
      for (size_t j = 0; j < d; j++) yl[j] = oracle_round(dt, yl[j]);
    for (size_t j = 0; j < d; j++) amax = fmaxl(amax, fabsl(yl[j])), ysum += fabsl(yl[j]);
    double s = stat ? sstat : scale[i];
    if (!stat) {
      double want = (double)(amax / (fp8 ? 448 : 127));
      worst_ok &= tu_check(fabs(s - want) <= (rel + 1e-7) * want + 1e-30,
                           "quant %s d=%zu v=%d row %zu: scale %.9g want %.9g", tu_dtype_name(dt),
                           d, v, i, s, want);
    }
    for (size_t j = 0; j < d && worst_ok; j++) {
      unsigned char c = q[i * ldq + j];
      double t = s > 0 ? (double)(yl[j] / s) : 0, err = rel * (s > 0 ? (double)amax / s : 0) + 1e-9;
      int ok;
      if (!fp8) {
        double tc = t < -128 ? -128 : t > 127 ? 127 : t;
        ok = fabs((double)(int8_t)c - tc) <= 0.5 + err;
      } else {
        double tc = fabs(t) > 448 ? copysign(448, t) : t;
        double val = rn_e4m3_value(c);
        ok = fabs(val - tc) <= e4m3_half_step(tc) + err * 2 && !isnan(val);
      }
      worst_ok &= tu_check(ok, "quant %s %s%s d=%zu v=%d (%zu,%zu): code %d for t=%.9g",
                           fp8 ? "e4m3" : "int8", tu_dtype_name(dt), stat ? " static" : "", d, v,
                           i, j, c, t);
    }
    /* the stride gap of q is untouched */
    for (size_t j = d; j < ldq && i + 1 < rows; j++)
      worst_ok &= tu_check(q[i * ldq + j] == 0xcd, "quant: gap written");
  }
  free(xl), free(yl), free(wl), free(bl), free(q), free(scale);
  tu_free(&x), tu_free(&w), tu_free(&b);
}

/* The spec's t = y * inv, inv = 1/s rounded to float once per row, where it
 * differs from y / s (docs/fusions.md, "Quantized output"). x = (2, 2, 2, 2) with
 * eps = 0 gives r = 1/2 and xhat = 1 exactly, so y = w. With the static
 * s = 0.1f (0.100000001490116...), inv rounds to exactly 10, and
 *   y = -0x1.84ccccp+3 (-12.1499996185...): y * 10 = -121.499996185... rounds
 *     in float to -121.5 (its ulp there is 2^-16), code -122 (half to even);
 *     y / s = -121.49999437... would round to -121.49999237, code -121;
 *   y = 0x1.8cccccp+0 (1.5499999523...): y * 10 = 15.499999523... is the
 *     midpoint of two floats and rounds to the even 15.5: int8 16, and e4m3
 *     the tie of 15 and 16, to the even code 16; y / s gives 15.499999, 15.
 * A subnormal s (1e-40: 1/s overflows float) and a tiny weight (s of
 * ~1e-41) keep the division: y = 0 is code 0 (not the NaN of 0 * inf), and
 * the codes are those of y / s, not saturated. */
static void test_quant_reciprocal(void) {
  for (int fp8 = 0; fp8 < 2; fp8++) {
    float x[4] = {2, 2, 2, 2}, w[4] = {-0x1.84ccccp+3f, 0x1.84ccccp+3f, 0x1.8cccccp+0f, 1.0f};
    float s = 0.1f, t_want[4] = {-121.5f, 121.5f, 15.5f, 10.0f};
    unsigned char q[4];
    rmsnorm_config c;
    rmsnorm_config_init(&c, RMSNORM_F32);
    c.eps = 0;
    rmsnorm_status st = rmsnorm_forward_quant(ctx, &c, 1, 4, x, 4, w, NULL,
                                              fp8 ? RMSNORM_Q_FP8_E4M3 : RMSNORM_Q_INT8, &s, q, 4,
                                              NULL, NULL);
    tu_check(st == RMSNORM_OK, "quant reciprocal: status %s", rmsnorm_status_name(st));
    static const int i8_want[4] = {-122, 122, 16, 10};
    for (int j = 0; j < 4; j++) {
      int want = fp8 ? e4m3_nearest(t_want[j]) : (uint8_t)(int8_t)i8_want[j];
      tu_check(q[j] == want, "quant reciprocal %s: y=%a code %#x, want %#x",
               fp8 ? "e4m3" : "int8", w[j], q[j], want);
    }
    /* a subnormal static scale: zeros stay 0, the rest saturate */
    float xz[4] = {1, 0, -3, 0}, tiny = 1e-40f;
    st = rmsnorm_forward_quant(ctx, &c, 1, 4, xz, 4, NULL, NULL,
                               fp8 ? RMSNORM_Q_FP8_E4M3 : RMSNORM_Q_INT8, &tiny, q, 4, NULL, NULL);
    int sat = fp8 ? 0x7e : 127, nsat = fp8 ? 0xfe : 0x80;
    tu_check(st == RMSNORM_OK && q[0] == sat && q[1] == 0 && q[2] == nsat && q[3] == 0,
             "quant subnormal scale %s: codes %#x %#x %#x %#x", fp8 ? "e4m3" : "int8", q[0], q[1],
             q[2], q[3]);
  }
  /* a tiny weight: the dynamic s is subnormal; codes within half a step of
   * y / s (y from rmsnorm_forward, which is the same y in float) */
  enum { D = 64 };
  float x[D], w[D], y[D], s = -1;
  unsigned char q[D];
  /* (fixed values: drawing from the shared generator would move the later cases' data) */
  for (int j = 0; j < D; j++)
    x[j] = (float)(j * 37 % 29 - 14) / 7.0f, w[j] = j % 9 == 4 ? 0.0f : 3e-39f;
  rmsnorm_config c;
  rmsnorm_config_init(&c, RMSNORM_F32);
  tu_check(rmsnorm_forward(ctx, &c, 1, D, x, D, w, NULL, y, D, NULL) == RMSNORM_OK &&
               rmsnorm_forward_quant(ctx, &c, 1, D, x, D, w, NULL, RMSNORM_Q_INT8, NULL, q, D, &s,
                                     NULL) == RMSNORM_OK,
           "quant tiny weight: status");
  tu_check(s > 0 && s < FLT_MIN, "quant tiny weight: scale %g not subnormal", s);
  int ok = 1, top = 0;
  for (int j = 0; j < D; j++) {
    long double t = (long double)y[j] / s;
    ok &= fabsl((long double)(int8_t)q[j] - t) <= 0.5L + 1e-4L; /* + the rounding of y / s in float */
    top |= abs((int8_t)q[j]) == 127;
  }
  tu_check(ok && top, "quant tiny weight: codes not those of y / s");
}

/* The kernels' code steps on the floats around every e4m3 and int8 rounding
 * boundary, every exponent, both signs, infinities and NaN: x = (1, ..., 1)
 * with eps = 0 gives xhat = 1 exactly, so y = w, and the static s = 1 gives
 * t = y. Expected: the brute-force nearest e4m3 code, and int8 by rint in
 * long double. */
static void test_quant_codes_all_exponents(void) {
  enum { D = 2 * 256 * 8 * 10 };
  static const uint32_t low[10] = {0, 1, 0x3ffff, 0x40000, 0x7ffff, 0x80000, 0x80001,
                                   0xbffff, 0xffffe, 0xfffff};
  float *x = malloc(D * sizeof(float)), *w = malloc(D * sizeof(float));
  unsigned char *q = malloc(D);
  size_t n = 0;
  for (uint32_t sg = 0; sg < 2; sg++)
    for (uint32_t e = 0; e < 256; e++)
      for (uint32_t m3 = 0; m3 < 8; m3++)
        for (int k = 0; k < 10; k++) {
          uint32_t u = sg << 31 | e << 23 | m3 << 20 | low[k];
          memcpy(&w[n], &u, 4);
          x[n++] = 1.0f;
        }
  rmsnorm_config c;
  rmsnorm_config_init(&c, RMSNORM_F32);
  c.eps = 0;
  float one = 1.0f;
  for (int fp8 = 0; fp8 < 2; fp8++) {
    rmsnorm_status st = rmsnorm_forward_quant(ctx, &c, 1, D, x, D, w, NULL,
                                              fp8 ? RMSNORM_Q_FP8_E4M3 : RMSNORM_Q_INT8, &one, q,
                                              D, NULL, NULL);
    int bad = 0;
    for (size_t j = 0; j < D && st == RMSNORM_OK; j++) {
      int want;
      if (fp8) {
        want = e4m3_nearest(w[j]);
      } else {
        long double t = isnan(w[j]) ? 0 : fminl(fmaxl(w[j], -128.0L), 127.0L);
        want = (uint8_t)(int8_t)rintl(t); /* the default mode: to nearest even */
      }
      if (q[j] != want && bad++ < 3)
        tu_check(0, "quant codes %s: t=%a code %#x, want %#x", fp8 ? "e4m3" : "int8", w[j], q[j],
                 want);
    }
    tu_check(st == RMSNORM_OK && bad == 0, "quant codes %s: %d of %d differ", fp8 ? "e4m3" : "int8",
             bad, D);
  }
  free(x), free(w), free(q);
}

static void test_quant(void) {
  static const size_t ds[] = {1, 3, 8, 17, 64, 130, 4096};
  int v = 0;
  for (int dt = 0; dt < 4; dt++)
    for (size_t k = 0; k < sizeof ds / sizeof *ds; k++)
      for (int mode = 0; mode < 4; mode++, v++)
        quant_case((rmsnorm_dtype)dt, v & 4 ? RMSNORM_F32 : (rmsnorm_dtype)dt, 4, ds[k], v,
                   mode & 1, mode >> 1);
  /* NaN rows: int8 codes 0, e4m3 NaN codes; dynamic scale ignores NaN */
  float x[8] = {1, 2, 3, NAN, 5, 6, 7, 8};
  unsigned char q[8];
  float s;
  rmsnorm_config c;
  rmsnorm_config_init(&c, RMSNORM_F32);
  tu_check(rmsnorm_forward_quant(ctx, &c, 1, 8, x, 8, NULL, NULL, RMSNORM_Q_INT8, NULL, q, 8, &s,
                                 NULL) == RMSNORM_OK,
           "quant NaN: status");
  int zeros = 1;
  for (int j = 0; j < 8; j++) zeros &= q[j] == 0;
  tu_check(zeros, "quant NaN row: int8 codes are 0");
}

/* ---- QK-norm ---------------------------------------------------------- */

/* Q and K of a [tokens, 3, heads, hd] QKV buffer, and a head-major layout:
 * bit for bit rmsnorm_forward / rmsnorm_backward per token. */
static void qk_case(rmsnorm_dtype dt, size_t tokens, size_t heads, size_t hd, int layout, int v) {
  rmsnorm_config cfg = make_cfg(dt, RMSNORM_F32, v);
  cfg.flags &= ~(unsigned)RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
  size_t es = rn_dtype_size(dt), as = rn_acc_size(dt), n = tokens * 3 * heads * hd;
  size_t lt, lh, off;
  if (layout == 0) lt = 3 * heads * hd, lh = hd, off = heads * hd;   /* QKV, K part */
  else if (layout == 1) lt = hd + 1, lh = tokens * (hd + 1), off = 0; /* head-major */
  else lt = heads * hd, lh = hd, off = 0;                             /* contiguous */
  tu_tensor buf = tu_alloc(dt, 1, n, n), out = tu_alloc(dt, 1, n, n), dyb = tu_alloc(dt, 1, n, n);
  tu_fill_normal(&buf, 1.0), tu_fill_normal(&dyb, 1.0);
  memset(out.data, 0, out.bytes);
  tu_tensor w = vec(RMSNORM_F32, hd, 1, 0.2), dw = vec(RMSNORM_F32, hd, 0, 0), db = vec(RMSNORM_F32, hd, 0, 0);
  char *x = (char *)buf.data + off * es, *y = (char *)out.data + off * es;
  char *dyp = (char *)dyb.data + off * es;
  void *rstd = calloc(tokens * heads, as);
  rmsnorm_status st = rmsnorm_qk_norm_forward(ctx, &cfg, tokens, heads, hd, x, lt, lh, w.data,
                                              NULL, y, lt, lh, rstd);
  tu_check(st == RMSNORM_OK, "qk forward: %s", rmsnorm_status_name(st));
  tu_tensor y2 = tu_alloc(dt, heads, hd, hd), dx = tu_alloc(dt, 1, n, n);
  void *r2 = calloc(heads, as);
  int ok = 1;
  for (size_t t = 0; t < tokens && st == RMSNORM_OK; t++) {
    rmsnorm_forward(ctx, &cfg, heads, hd, x + t * lt * es, lh, w.data, NULL, y2.data, hd, r2);
    for (size_t h = 0; h < heads; h++)
      ok &= !memcmp(y + (t * lt + h * lh) * es, (char *)y2.data + h * hd * es, hd * es);
    ok &= !memcmp((char *)rstd + t * heads * as, r2, heads * as);
  }
  tu_check(ok, "qk forward %s tokens=%zu heads=%zu hd=%zu layout=%d v=%d: differs from rmsnorm_forward",
           tu_dtype_name(dt), tokens, heads, hd, layout, v);
  /* backward: dx bit for bit per token; dweight/dbias sums close */
  st = rmsnorm_qk_norm_backward(ctx, &cfg, tokens, heads, hd, x, lt, lh, dyp, lt, lh, w.data,
                                v & 1 ? rstd : NULL, (char *)dx.data + off * es, lt, lh, dw.data,
                                db.data);
  tu_check(st == RMSNORM_OK, "qk backward: %s", rmsnorm_status_name(st));
  ok = 1;
  double dwsum[256] = {0}, dbsum[256] = {0};
  tu_tensor dx2 = tu_alloc(dt, heads, hd, hd), pw = vec(RMSNORM_F32, hd, 0, 0), pb = vec(RMSNORM_F32, hd, 0, 0);
  for (size_t t = 0; t < tokens && st == RMSNORM_OK; t++) {
    rmsnorm_backward(ctx, &cfg, heads, hd, x + t * lt * es, lh, dyp + t * lt * es, lh, w.data,
                     NULL, dx2.data, hd, pw.data, pb.data);
    for (size_t h = 0; h < heads; h++)
      ok &= !memcmp((char *)dx.data + (off + t * lt + h * lh) * es, (char *)dx2.data + h * hd * es,
                    hd * es);
    for (size_t j = 0; j < hd; j++) dwsum[j] += tu_get(&pw, 0, j), dbsum[j] += tu_get(&pb, 0, j);
  }
  tu_check(ok, "qk backward %s tokens=%zu heads=%zu hd=%zu layout=%d v=%d: dx differs",
           tu_dtype_name(dt), tokens, heads, hd, layout, v);
  for (size_t j = 0; j < hd; j++) {
    double tol = 1e-5 * (double)(tokens * heads); /* float dweight/dbias */
    ok &= fabs(tu_get(&dw, 0, j) - dwsum[j]) <= tol * (1 + fabs(dwsum[j])) &&
          fabs(tu_get(&db, 0, j) - dbsum[j]) <= tol * (1 + fabs(dbsum[j]));
  }
  tu_check(ok, "qk backward %s tokens=%zu heads=%zu hd=%zu layout=%d v=%d", tu_dtype_name(dt),
           tokens, heads, hd, layout, v);
  /* in place on the QKV buffer */
  if (layout == 0) {
    memcpy(out.data, buf.data, buf.bytes);
    st = rmsnorm_qk_norm_forward(ctx, &cfg, tokens, heads, hd, y, lt, lh, w.data, NULL, y, lt, lh,
                                 NULL);
    tu_free(&dx2);
    dx2 = tu_alloc(dt, 1, n, n);
    memset(dx2.data, 0, dx2.bytes);
    rmsnorm_qk_norm_forward(ctx, &cfg, tokens, heads, hd, x, lt, lh, w.data, NULL,
                            (char *)dx2.data + off * es, lt, lh, NULL);
    ok = st == RMSNORM_OK;
    for (size_t t = 0; t < tokens; t++)
      for (size_t h = 0; h < heads; h++)
        ok &= !memcmp(y + (t * lt + h * lh) * es, (char *)dx2.data + (off + t * lt + h * lh) * es,
                      hd * es);
    /* and Q, V untouched */
    for (size_t t = 0; t < tokens; t++) {
      ok &= !memcmp((char *)out.data + t * lt * es, (char *)buf.data + t * lt * es, heads * hd * es);
      ok &= !memcmp((char *)out.data + (t * lt + 2 * heads * hd) * es,
                    (char *)buf.data + (t * lt + 2 * heads * hd) * es, heads * hd * es);
    }
    tu_check(ok, "qk in place on QKV %s", tu_dtype_name(dt));
  }
  free(rstd), free(r2);
  tu_free(&buf), tu_free(&out), tu_free(&dyb), tu_free(&w), tu_free(&dw), tu_free(&db);
  tu_free(&y2), tu_free(&dx), tu_free(&dx2), tu_free(&pw), tu_free(&pb);
}

static void test_qk(void) {
  int v = 0;
  for (int dt = 0; dt < 4; dt++)
    for (int layout = 0; layout < 3; layout++, v++) {
      qk_case((rmsnorm_dtype)dt, 5, 3, 64, layout, v);
      qk_case((rmsnorm_dtype)dt, 70, 4, 128, layout, v + 1);
      qk_case((rmsnorm_dtype)dt, 2, 1, 17, layout, v + 2);
    }
}

/* ---- RMSNorm + linear ------------------------------------------------- */

/* Against the unfused long-double oracle: Z = RMSNorm(X; g) W + bias, and
 * its autograd (dY = dZ W^T, dX = RMSNorm backward, dW = Y^T dZ, dg, dbias).
 * row_scale (rows values, or NULL for 1) scales each row of X; wscale W. */
static void linear_case_scaled(rmsnorm_dtype dt, size_t rows, size_t d, size_t n, int v,
                               const double *row_scale, double wscale) {
  rmsnorm_config cfg = make_cfg(dt, RMSNORM_F32, v);
  cfg.flags &= ~(unsigned)RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
  rmsnorm_dtype adt = dt == RMSNORM_F64 ? RMSNORM_F64 : RMSNORM_F32;
  size_t ldx = d + (v & 1), ldz = n + (v & 2);
  tu_tensor x = tu_alloc(dt, rows, d, ldx), g = vec(RMSNORM_F32, d, v % 4 == 2 ? 0 : 1, 0.3);
  tu_tensor W = tu_alloc(adt, d, n, n), Wf = tu_alloc(adt, d, n, n + 1), bias = vec(RMSNORM_F32, n, 0, 1);
  tu_tensor z = tu_alloc(dt, rows, n, ldz), dz = tu_alloc(dt, rows, n, ldz), dx = tu_alloc(dt, rows, d, d);
  tu_tensor dg = vec(RMSNORM_F32, d, 0, 0), dW = tu_alloc(adt, d, n, n), db = vec(RMSNORM_F32, n, 0, 0);
  tu_fill_normal(&W, wscale), tu_fill_normal(&dz, 1.0);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < d; j++) tu_set(&x, i, j, (row_scale ? row_scale[i] : 1.0) * tu_normal());
  int weighted = v % 5 != 4;
  const void *gp = weighted ? g.data : NULL, *bp = v & 1 ? bias.data : NULL;
  rmsnorm_status st = rmsnorm_fold_weight(&cfg, d, n, gp, W.data, n, Wf.data, n + 1);
  tu_check(st == RMSNORM_OK, "fold: %s", rmsnorm_status_name(st));
  st = rmsnorm_linear_forward(ctx, &cfg, rows, d, n, x.data, ldx, Wf.data, n + 1, bp, z.data, ldz, NULL);
  tu_check(st == RMSNORM_OK, "linear forward: %s", rmsnorm_status_name(st));
  st = rmsnorm_linear_backward(ctx, &cfg, rows, d, n, x.data, ldx, gp, W.data, n, Wf.data, n + 1,
                               dz.data, ldz, dx.data, d, weighted ? dg.data : NULL, dW.data, n,
                               db.data);
  tu_check(st == RMSNORM_OK, "linear backward: %s", rmsnorm_status_name(st));
  if (st != RMSNORM_OK) return;

  oracle_opts o = {0, tu_partial_k(cfg.partial, d), cfg.eps,
                   (cfg.flags & RMSNORM_FLAG_EPS_OUTSIDE) != 0, 0, dt};
  ld_t *xl = malloc(d * sizeof(ld_t)), *yl = malloc(rows * d * sizeof(ld_t)), *wl = malloc(d * sizeof(ld_t));
  ld_t *dyl = malloc(d * sizeof(ld_t)), *dxl = malloc(d * sizeof(ld_t));
  ld_t *dgl = calloc(d, sizeof(ld_t)), *dWl = calloc(d * n, sizeof(ld_t)), *dbl = calloc(n, sizeof(ld_t));
  for (size_t j = 0; j < d; j++) wl[j] = weighted ? (v % 4 == 2 ? 1 : 0) + (ld_t)tu_get(&g, 0, j) : 1;
  double tol = dt == RMSNORM_F64 ? 1e-11 : dt == RMSNORM_F32 ? 1e-5 : dt == RMSNORM_BF16 ? 1e-2 : 2e-3;
  int ok = 1;
  for (size_t i = 0; i < rows; i++) {
    ld_t m, r;
    for (size_t j = 0; j < d; j++) xl[j] = tu_get(&x, i, j);
    oracle_forward_row(xl, d, wl, NULL, &o, yl + i * d, &m, &r);
    for (size_t k = 0; k < n; k++) {
      ld_t zk = bp ? (ld_t)tu_get(&bias, 0, k) : 0, mag = fabsl(zk);
      for (size_t j = 0; j < d; j++) {
        zk += yl[i * d + j] * (ld_t)tu_get(&W, j, k);
        mag += fabsl(yl[i * d + j] * (ld_t)tu_get(&W, j, k));
      }
      ok &= tu_check(fabsl(tu_get(&z, i, k) - zk) <= tol * (mag + 1e-30L) &&
                         isfinite(tu_get(&z, i, k)),
                     "linear %s rows=%zu d=%zu n=%zu v=%d: z(%zu,%zu)=%.9g want %.9Lg",
                     tu_dtype_name(dt), rows, d, n, v, i, k, tu_get(&z, i, k), zk);
    }
    /* the unfused autograd: dY = dZ W^T, then the RMSNorm backward */
    for (size_t j = 0; j < d; j++) {
      dyl[j] = 0;
      for (size_t k = 0; k < n; k++) dyl[j] += (ld_t)tu_get(&dz, i, k) * (ld_t)tu_get(&W, j, k);
    }
    oracle_backward_row(xl, dyl, d, wl, &o, dxl, dgl, NULL);
    /* dx = r (gy - xhat c) may cancel: the error is relative to r |gy| */
    ld_t dmag = 0;
    for (size_t j = 0; j < d; j++) dmag = fmaxl(dmag, fmaxl(fabsl(dxl[j]), r * fabsl(dyl[j] * wl[j])));
    for (size_t j = 0; j < d; j++)
      ok &= tu_check(fabsl(tu_get(&dx, i, j) - dxl[j]) <= 4 * tol * (dmag + 1e-30L) ||
                         tu_overflows(dt, dxl[j], tu_get(&dx, i, j)),
                     "linear backward %s d=%zu n=%zu v=%d: dx(%zu,%zu)=%.9g want %.9Lg",
                     tu_dtype_name(dt), d, n, v, i, j, tu_get(&dx, i, j), dxl[j]);
    for (size_t j = 0; j < d; j++)
      for (size_t k = 0; k < n; k++) dWl[j * n + k] += yl[i * d + j] * (ld_t)tu_get(&dz, i, k);
    for (size_t k = 0; k < n; k++) dbl[k] += tu_get(&dz, i, k);
  }
  ld_t gmag = 0, wmag = 0;
  for (size_t j = 0; j < d; j++) gmag = fmaxl(gmag, fabsl(dgl[j]));
  for (size_t j = 0; j < d * n; j++) wmag = fmaxl(wmag, fabsl(dWl[j]));
  double ptol = tol > 1e-6 ? tol : 1e-6; /* dg, dbias: float params */
  for (size_t j = 0; j < d && weighted; j++)
    ok &= tu_check(fabsl(tu_get(&dg, 0, j) - dgl[j]) <= 4 * ptol * (gmag + 1e-30L) * sqrt((double)rows),
                   "linear backward %s d=%zu n=%zu v=%d: dg[%zu]=%.9g want %.9Lg", tu_dtype_name(dt),
                   d, n, v, j, tu_get(&dg, 0, j), dgl[j]);
  for (size_t j = 0; j < d; j++)
    for (size_t k = 0; k < n; k++)
      ok &= tu_check(fabsl(tu_get(&dW, j, k) - dWl[j * n + k]) <= 4 * tol * (wmag + 1e-30L) * sqrt((double)rows),
                     "linear backward %s: dW(%zu,%zu)=%.9g want %.9Lg", tu_dtype_name(dt), j, k,
                     tu_get(&dW, j, k), dWl[j * n + k]);
  for (size_t k = 0; k < n; k++)
    ok &= tu_check(fabsl(tu_get(&db, 0, k) - dbl[k]) <= 1e-5L * (1 + fabsl(dbl[k])) * rows,
                   "linear backward: dbias[%zu]", k);
  (void)ok;
  free(xl), free(yl), free(wl), free(dyl), free(dxl), free(dgl), free(dWl), free(dbl);
  tu_free(&x), tu_free(&g), tu_free(&W), tu_free(&Wf), tu_free(&bias), tu_free(&z), tu_free(&dz);
  tu_free(&dx), tu_free(&dg), tu_free(&dW), tu_free(&db);
}

static void linear_case(rmsnorm_dtype dt, size_t rows, size_t d, size_t n, int v) {
  linear_case_scaled(dt, rows, d, n, v, NULL, 0.1);
}

/* Rows far from 1: the GEMM on unnormalized X would overflow (|x| ~ 1e37 in
 * fp32 against weights ~ 1: x W' ~ 1e39, while RMSNorm(X) W is ~ 10) or lose
 * r's range (|x| ~ 1e-40: r ~ 1e40 is no float). Z and every gradient stay
 * within the compute type's rounding of the unfused long-double oracle. */
static void test_linear_range(void) {
  static const double scales[4][6] = {
      {1e37, 5e37, 1e-30, 1e-40, 1.0, 1e30},      /* f32 (max 3.4e38; x is scale * N(0,1)) */
      {1e4, 2e3, 1e-6, 1e-7, 1.0, 100.0},         /* f16: its max is 65504 */
      {1e37, 5e37, 1e-30, 1e-38, 1.0, 1e30},      /* bf16 */
      {1e300, 3e307, 1e-300, 1e-310, 1.0, 1e200}, /* f64 */
  };
  int v = 1000;
  for (int dt = 0; dt < 4; dt++)
    for (int rep = 0; rep < 5; rep++, v++)
      linear_case_scaled((rmsnorm_dtype)dt, 6, 96, 24, v, scales[dt], 1.0);
}

/* The seed's worked example, 2 x 4 times 4 x 3, folded or not. */
static void test_linear_seed(void) {
  const float x[8] = {1, 2, 3, 4, -1, 0, 1, 2};
  const float g[4] = {1, 1, 1, 1};
  float W[12], Wf[12], z[6], y[8];
  for (int i = 0; i < 12; i++) W[i] = (float)(i % 5) * 0.25f - 0.5f;
  rmsnorm_config c;
  rmsnorm_config_init(&c, RMSNORM_F32);
  c.eps = 0;
  int ok = rmsnorm_fold_weight(&c, 4, 3, g, W, 3, Wf, 3) == RMSNORM_OK &&
           rmsnorm_linear_forward(ctx, &c, 2, 4, 3, x, 4, Wf, 3, NULL, z, 3, NULL) == RMSNORM_OK &&
           rmsnorm_forward(ctx, &c, 2, 4, x, 4, g, NULL, y, 4, NULL) == RMSNORM_OK;
  for (int i = 0; i < 2 && ok; i++)
    for (int k = 0; k < 3; k++) {
      double want = 0;
      for (int j = 0; j < 4; j++) want += (double)y[i * 4 + j] * W[j * 3 + k];
      ok &= fabs(z[i * 3 + k] - want) <= 1e-6 * (1 + fabs(want));
    }
  tu_check(ok, "linear: the seed's 2x4 times 4x3 example");
}

static void test_linear(void) {
  if (rmsnorm_linear_available() != RMSNORM_OK) {
    float x = 1, w = 1, z;
    rmsnorm_config c;
    rmsnorm_config_init(&c, RMSNORM_F32);
    tu_check(rmsnorm_linear_forward(ctx, &c, 1, 1, 1, &x, 1, &w, 1, NULL, &z, 1, NULL) ==
                 RMSNORM_ERROR_NOT_AVAILABLE,
             "linear without BLAS: NOT_AVAILABLE");
    printf("test_fused: no BLAS in this build, rmsnorm_linear_* not tested\n");
    return;
  }
  test_linear_seed();
  int v = 0;
  static const size_t shapes[][3] = {{1, 1, 1}, {2, 4, 3}, {5, 17, 9}, {3, 64, 33}, {7, 130, 5},
                                     {300, 96, 40}};
  for (int dt = 0; dt < 4; dt++)
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
      for (int rep = 0; rep < 2; rep++, v++)
        linear_case((rmsnorm_dtype)dt, shapes[s][0], shapes[s][1], shapes[s][2], v);
  test_linear_range();
}

/* ---- every ISA and thread count: the reference's bits ------------------- */

typedef struct isa_out {
  unsigned char *p;
  size_t n;
} isa_out;

static void put(isa_out *o, const void *p, size_t n) {
  o->p = realloc(o->p, o->n + n);
  memcpy(o->p + o->n, p, n);
  o->n += n;
}

/* Runs every fused op on c with seeded inputs; collects all outputs. */
static isa_out run_all(rmsnorm_context *c, rmsnorm_dtype dt, size_t rows, size_t d, int v) {
  isa_out out = {NULL, 0};
  tu_seed(1000 + (uint64_t)v);
  rmsnorm_config cfg = make_cfg(dt, v & 1 ? RMSNORM_F32 : dt, v);
  size_t es = rn_dtype_size(dt), as = rn_acc_size(dt), ld = d + (v & 2 ? 3 : 0);
  tu_tensor h = tu_alloc(dt, rows, d, ld), u = tu_alloc(dt, rows, d, ld), y = tu_alloc(dt, rows, d, d);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < d; j++) {
      tu_set(&h, i, j, 4 * tu_uniform() - 2);
      tu_set(&u, i, j, 4 * tu_uniform() - 2);
    }
  if (rows > 3)
    for (size_t j = 0; j < d; j++) tu_set(&h, 2, j, dt == RMSNORM_F16 ? 3000.0 : 1e30);
  tu_tensor w = vec(cfg.param_dtype, d, v % 4 == 2 ? 0 : 1, 0.2), b = vec(cfg.param_dtype, d, 0, 1);
  tu_tensor dw = vec(cfg.param_dtype, d, 0, 1), db = vec(cfg.param_dtype, d, 0, 1);
  void *rstd = calloc(rows, as);
  unsigned char *q = calloc(rows, d);
  float *scale = calloc(rows, sizeof(float));
  rmsnorm_status st = rmsnorm_add_forward(c, &cfg, rows, d, h.data, ld, u.data, ld, w.data,
                                          v & 4 ? b.data : NULL, y.data, d, rstd);
  put(&out, &st, sizeof st);
  put(&out, h.data, h.bytes), put(&out, y.data, y.bytes), put(&out, rstd, rows * as);
  rmsnorm_config bcfg = cfg;
  bcfg.flags &= ~(unsigned)RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
  st = rmsnorm_add_backward(c, &bcfg, rows, d, h.data, ld, y.data, d, v & 8 ? NULL : u.data, ld,
                            w.data, v & 2 ? rstd : NULL, u.data, ld, dw.data, db.data);
  put(&out, &st, sizeof st);
  put(&out, u.data, u.bytes), put(&out, dw.data, dw.bytes), put(&out, db.data, db.bytes);
  for (int fp8 = 0; fp8 < 2; fp8++) {
    float ss = 0.03f;
    st = rmsnorm_forward_quant(c, &cfg, rows, d, h.data, ld, w.data, v & 4 ? b.data : NULL,
                               fp8 ? RMSNORM_Q_FP8_E4M3 : RMSNORM_Q_INT8, v & 8 ? &ss : NULL, q,
                               d, v & 8 ? NULL : scale, rstd);
    put(&out, &st, sizeof st);
    put(&out, q, rows * d), put(&out, scale, rows * sizeof(float)), put(&out, rstd, rows * as);
  }
  /* QK-norm: rows as tokens x 2 heads of d/2 when d is even */
  if (d % 2 == 0 && rows % 2 == 0) {
    size_t hd = d / 2;
    st = rmsnorm_qk_norm_forward(c, &bcfg, rows / 2, 2, hd, h.data, 2 * ld, ld, w.data, NULL,
                                 y.data, d, hd, rstd);
    put(&out, &st, sizeof st);
    put(&out, y.data, y.bytes), put(&out, rstd, rows * as);
    st = rmsnorm_qk_norm_backward(c, &bcfg, rows / 2, 2, hd, h.data, 2 * ld, ld, u.data, 2 * ld,
                                  ld, w.data, NULL, y.data, d, hd, dw.data, db.data);
    put(&out, &st, sizeof st);
    put(&out, y.data, y.bytes), put(&out, dw.data, dw.bytes), put(&out, db.data, db.bytes);
  }
  (void)es;
  free(rstd), free(q), free(scale);
  tu_free(&h), tu_free(&u), tu_free(&y), tu_free(&w), tu_free(&b), tu_free(&dw), tu_free(&db);
  return out;
}

static void test_isas(void) {
  static const rmsnorm_isa isas[] = {RMSNORM_ISA_SCALAR, RMSNORM_ISA_AVX2, RMSNORM_ISA_AVX512,
                                     RMSNORM_ISA_NEON};
  rmsnorm_context *ref, *c;
  if (rmsnorm_context_create(&ref) != RMSNORM_OK || rmsnorm_context_create(&c) != RMSNORM_OK) return;
  rmsnorm_context_set_isa(ref, RMSNORM_ISA_SCALAR);
  rmsnorm_context_set_threads(ref, 1);
  static const size_t ds[] = {1, 2, 7, 8, 16, 17, 31, 64, 65, 100, 128, 1024, 1025, 4096};
  int v = 0;
  for (int dt = 0; dt < 4; dt++)
    for (size_t k = 0; k < sizeof ds / sizeof *ds + 2; k++, v++) {
      /* then one large shape (big fp32: 18 MB, past the streaming threshold:
       * prefetching, streamed codes), and one of many rows: more than 64
       * chunks of 64 rows (32 QK tokens), so the dweight reduction groups chunks */
      int big = k == sizeof ds / sizeof *ds, many = k > sizeof ds / sizeof *ds;
      size_t d = big ? 4100 : many ? 40 : ds[k];
      size_t rows = big ? (dt == RMSNORM_F32 ? 1100 : 600) : many ? 5000 : 6;
      /* reduced: the big shape streamed in fp32 only, many rows in fp32/bf16 */
      if (tu_reduced() && big && dt != RMSNORM_F32) rows = 40;
      if (tu_reduced() && many && (dt == RMSNORM_F16 || dt == RMSNORM_F64)) rows = 200;
      isa_out want = run_all(ref, (rmsnorm_dtype)dt, rows, d, v);
      for (int i = 0; i < 4; i++) {
        if (rmsnorm_context_set_isa(c, isas[i]) != RMSNORM_OK) continue;
        for (int threads = 1; threads <= 3; threads += 2) {
          rmsnorm_context_set_threads(c, threads);
          isa_out got = run_all(c, (rmsnorm_dtype)dt, rows, d, v);
          size_t first = 0;
          while (first < got.n && first < want.n && got.p[first] == want.p[first]) first++;
          tu_check(got.n == want.n && first == got.n,
                   "isa %s threads=%d %s rows=%zu d=%zu v=%d: first differing byte %zu of %zu",
                   rmsnorm_isa_name(isas[i]), threads, tu_dtype_name((rmsnorm_dtype)dt), rows, d,
                   v, first, want.n);
          free(got.p);
        }
      }
      free(want.p);
    }
  rmsnorm_context_free(ref);
  rmsnorm_context_free(c);
}

/* ---- errors: a status, nothing written -------------------------------- */

static void test_errors(void) {
  enum { R = 3, D = 8 };
  float h[R * D], u[R * D], y[R * D], w[D], r[R], h0[R * D], y0[R * D];
  unsigned char q[R * D], q0[R * D];
  float sc[R];
  for (int i = 0; i < R * D; i++) h[i] = h0[i] = (float)(i % 5), u[i] = 1, y[i] = y0[i] = 9;
  for (int j = 0; j < D; j++) w[j] = 1;
  memset(q, 7, sizeof q), memset(q0, 7, sizeof q0);
  rmsnorm_config c, bad;
  rmsnorm_config_init(&c, RMSNORM_F32);
#define UNTOUCHED (!memcmp(h, h0, sizeof h) && !memcmp(y, y0, sizeof y) && !memcmp(q, q0, sizeof q))
#define EXPECT(call, want)                                                                     \
  do {                                                                                         \
    rmsnorm_status st_ = (call);                                                               \
    tu_check(st_ == (want) && UNTOUCHED, "line %d: %s -> %s (want %s), untouched %d", __LINE__, \
             #call, rmsnorm_status_name(st_), rmsnorm_status_name(want), UNTOUCHED);           \
  } while (0)
  EXPECT(rmsnorm_add_forward(NULL, &c, R, D, h, D, u, D, w, NULL, y, D, r), RMSNORM_ERROR_NULL_POINTER);
  EXPECT(rmsnorm_add_forward(ctx, &c, R, D, h, D, u, D, w, NULL, h, D, r), RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_add_forward(ctx, &c, R, D, h, D, h, D, w, NULL, y, D, r), RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_add_forward(ctx, &c, R, D, h, D, u, D, w, NULL, y, D, h), RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_add_forward(ctx, &c, R, D, h, D, u, D, w, NULL, u + 1, D, r), RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_add_forward(ctx, &c, R, D, h, D - 1, u, D, w, NULL, y, D, r), RMSNORM_ERROR_BAD_STRIDE);
  EXPECT(rmsnorm_add_forward(ctx, &c, R, 0, h, D, u, D, w, NULL, y, D, r), RMSNORM_ERROR_BAD_SIZE);
  bad = c, bad.flags = RMSNORM_FLAG_ACCUMULATE;
  EXPECT(rmsnorm_add_forward(ctx, &bad, R, D, h, D, u, D, w, NULL, y, D, r), RMSNORM_ERROR_BAD_FLAGS);
  bad = c, bad.eps = -1;
  EXPECT(rmsnorm_add_forward(ctx, &bad, R, D, h, D, u, D, w, NULL, y, D, r), RMSNORM_ERROR_BAD_EPS);
  bad = c, bad.dtype = (rmsnorm_dtype)9;
  EXPECT(rmsnorm_add_forward(ctx, &bad, R, D, h, D, u, D, w, NULL, y, D, r), RMSNORM_ERROR_BAD_DTYPE);
  EXPECT(rmsnorm_add_forward(ctx, &c, 0, D, NULL, D, NULL, D, NULL, NULL, NULL, D, NULL), RMSNORM_OK);

  EXPECT(rmsnorm_add_backward(ctx, &c, R, D, h0, D, u, D, NULL, D, NULL, NULL, y, D, w, NULL),
         RMSNORM_ERROR_BAD_ARGUMENT);
  EXPECT(rmsnorm_add_backward(ctx, &c, R, D, h0, D, u, D, y0, D, w, NULL, y, D, u, NULL),
         RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_add_backward(ctx, &c, R, D, h0, D, u, D, u, D, w, NULL, h0, D, NULL, NULL),
         RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_add_backward(ctx, &c, R, D, h0, D, u, D, u, D, w, NULL, NULL, D, NULL, NULL),
         RMSNORM_ERROR_NULL_POINTER);

  float s0 = 0, sn = NAN, s1 = 1;
  EXPECT(rmsnorm_forward_quant(ctx, &c, R, D, h0, D, w, NULL, (rmsnorm_qtype)5, NULL, q, D, sc, NULL),
         RMSNORM_ERROR_BAD_ARGUMENT);
  EXPECT(rmsnorm_forward_quant(ctx, &c, R, D, h0, D, w, NULL, RMSNORM_Q_INT8, &s0, q, D, NULL, NULL),
         RMSNORM_ERROR_BAD_ARGUMENT);
  EXPECT(rmsnorm_forward_quant(ctx, &c, R, D, h0, D, w, NULL, RMSNORM_Q_INT8, &sn, q, D, NULL, NULL),
         RMSNORM_ERROR_BAD_ARGUMENT);
  EXPECT(rmsnorm_forward_quant(ctx, &c, R, D, h0, D, w, NULL, RMSNORM_Q_INT8, &s1, q, D, sc, NULL),
         RMSNORM_ERROR_BAD_ARGUMENT);
  EXPECT(rmsnorm_forward_quant(ctx, &c, R, D, h0, D, w, NULL, RMSNORM_Q_INT8, NULL, q, D, NULL, NULL),
         RMSNORM_ERROR_NULL_POINTER);
  EXPECT(rmsnorm_forward_quant(ctx, &c, R, D, h0, D, w, NULL, RMSNORM_Q_INT8, NULL, q, D - 1, sc, NULL),
         RMSNORM_ERROR_BAD_STRIDE);
  EXPECT(rmsnorm_forward_quant(ctx, &c, R, D, h0, D, w, NULL, RMSNORM_Q_FP8_E4M3, NULL, (void *)h0, D, sc, NULL),
         RMSNORM_ERROR_OVERLAP);

  /* QK: overlapping rows of an output, or y meeting x but not exactly */
  EXPECT(rmsnorm_qk_norm_forward(ctx, &c, 2, 2, 4, h0, 8, 4, w, NULL, y, 6, 4, NULL),
         RMSNORM_ERROR_BAD_STRIDE);
  EXPECT(rmsnorm_qk_norm_forward(ctx, &c, 2, 2, 4, h0, 8, 3, w, NULL, y, 8, 4, NULL),
         RMSNORM_ERROR_BAD_STRIDE);
  EXPECT(rmsnorm_qk_norm_forward(ctx, &c, 2, 2, 4, h, 8, 4, w, NULL, h + 1, 8, 4, NULL),
         RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_qk_norm_forward(ctx, &c, 2, 2, 4, h, 8, 4, w, NULL, h, 16, 8, NULL),
         RMSNORM_ERROR_OVERLAP);
  /* no heads: no rows, so success touching nothing (as rows == 0), dweight included */
  EXPECT(rmsnorm_qk_norm_forward(ctx, &c, 2, 0, 4, h0, 8, 4, w, NULL, y, 8, 4, NULL), RMSNORM_OK);
  EXPECT(rmsnorm_qk_norm_backward(ctx, &c, 2, 0, 4, h0, 8, 4, u, 8, 4, w, NULL, y, 8, 4, y0, NULL),
         RMSNORM_OK);
  EXPECT(rmsnorm_qk_norm_backward(ctx, &c, 2, 2, 4, h0, 8, 4, u, 8, 4, NULL, NULL, y, 8, 4, y0, NULL),
         RMSNORM_ERROR_BAD_ARGUMENT);

  if (rmsnorm_linear_available() == RMSNORM_OK) {
    bad = c, bad.flags = RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
    EXPECT(rmsnorm_linear_forward(ctx, &bad, R, D, D, h0, D, u, D, NULL, y, D, NULL), RMSNORM_ERROR_BAD_FLAGS);
    EXPECT(rmsnorm_linear_forward(ctx, &c, R, D, D, h0, D, u, D, NULL, y, D - 1, NULL), RMSNORM_ERROR_BAD_STRIDE);
    EXPECT(rmsnorm_linear_forward(ctx, &c, R, D, D, h0, D, u, D, NULL, u, D, NULL), RMSNORM_ERROR_OVERLAP);
    EXPECT(rmsnorm_linear_forward(ctx, &c, R, D, 0, h0, D, u, D, NULL, y, D, NULL), RMSNORM_ERROR_BAD_SIZE);
    EXPECT(rmsnorm_linear_backward(ctx, &c, R, D, D, h0, D, w, NULL, D, u, D, u, D, y, D, y0, NULL, D, NULL),
           RMSNORM_ERROR_BAD_ARGUMENT);
  }
  EXPECT(rmsnorm_fold_weight(&c, D, 3, w, u, 3, y, 2), RMSNORM_ERROR_BAD_STRIDE);
  EXPECT(rmsnorm_fold_weight(&c, D, 3, w, u, 3, u + 1, 3), RMSNORM_ERROR_OVERLAP);
#undef EXPECT
#undef UNTOUCHED
}

int main(void) {
  tu_seed(6);
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) return 2;
  test_errors();
  test_e4m3_rounding();
  test_add();
  test_quant();
  test_quant_reciprocal();
  test_quant_codes_all_exponents();
  test_qk();
  test_linear();
  /* the cross-ISA comparison runs every set itself: once per suite suffices
   * (under emulation the suite runs once, on neon) */
  const char *isa_env = getenv("RMSNORM_ISA");
  if (!isa_env || !strcmp(isa_env, "scalar") || tu_emulated()) test_isas();
  rmsnorm_context_free(ctx);
  return tu_finish("test_fused");
}
