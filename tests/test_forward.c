/* test_forward.c - RMSNorm and LayerNorm forward against the long-double
 * oracle: every dtype, weight mode, bias, eps form, partial fraction, param
 * dtype and rounding order, on ragged d, odd strides and in place; then the
 * large-d accuracy promise and the special rows (overflow, underflow, zeros,
 * NaN/Inf). */
#include "oracle.h"
#include "testutil.h"

static rmsnorm_context *ctx;

typedef struct fcase {
  rmsnorm_dtype dt, pdt;
  int layernorm;
  size_t rows, d, ldx, ldy;
  int weight; /* 0 none, 1 g, 2 offset (1 + g) */
  int bias;
  double eps;
  int outside;
  double partial;
  int round_first;
  int inplace;
  double scale; /* of the input values */
} fcase;

/* ulp of v in dtype dt (normal range; the smallest subnormal step below). */
static double ulp_of(rmsnorm_dtype dt, double v) {
  int bits = dt == RMSNORM_F16 ? 10 : dt == RMSNORM_BF16 ? 7 : dt == RMSNORM_F32 ? 23 : 52;
  int emin = dt == RMSNORM_F16 ? -14 : dt == RMSNORM_F64 ? -1022 : -126;
  int e = v != 0 ? ilogb(v) : emin;
  if (e < emin) e = emin;
  return ldexp(1.0, e - bits);
}

static void describe(const fcase *c, char *buf, size_t n) {
  snprintf(buf, n,
           "%s %s pdt=%s rows=%zu d=%zu ldx=%zu ldy=%zu w=%d b=%d eps=%g out=%d p=%g rf=%d ip=%d",
           c->layernorm ? "LN" : "RMS", tu_dtype_name(c->dt), tu_dtype_name(c->pdt), c->rows,
           c->d, c->ldx, c->ldy, c->weight, c->bias, c->eps, c->outside, c->partial,
           c->round_first, c->inplace);
}

/* Runs one forward case and compares every output with the oracle.
 * x_override (rows*d doubles) replaces the random input when given. */
static void run_case(const fcase *c, const double *x_override) {
  char what[256];
  describe(c, what, sizeof what);
  size_t rows = c->rows, d = c->d;
  tu_tensor x = tu_alloc(c->dt, rows, d, c->ldx);
  if (x_override) {
    for (size_t i = 0; i < rows; i++)
      for (size_t j = 0; j < d; j++) tu_set(&x, i, j, x_override[i * d + j]);
  } else {
    tu_fill_normal(&x, c->scale);
  }
  tu_tensor w = tu_alloc(c->pdt, 1, d, d), b = tu_alloc(c->pdt, 1, d, d);
  for (size_t j = 0; j < d; j++) {
    tu_set(&w, 0, j, c->weight == 2 ? 0.1 * tu_normal() : 1 + 0.3 * tu_normal());
    tu_set(&b, 0, j, 0.5 * tu_normal());
  }
  tu_tensor y = c->inplace ? x : tu_alloc(c->dt, rows, d, c->ldy);
  size_t as = rn_acc_size(c->dt);
  void *mean = malloc(rows * as), *rstd = malloc(rows * as);

  /* the oracle sees exactly the stored inputs */
  ld_t *xl = malloc(rows * d * sizeof(ld_t)), *yl = malloc(d * sizeof(ld_t));
  ld_t *wl = malloc(d * sizeof(ld_t)), *bl = malloc(d * sizeof(ld_t));
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < d; j++) xl[i * d + j] = tu_get(&x, i, j);
  for (size_t j = 0; j < d; j++) {
    wl[j] = (c->weight == 2 ? 1 : 0) + (ld_t)tu_get(&w, 0, j);
    bl[j] = tu_get(&b, 0, j);
  }

  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, c->dt);
  cfg.param_dtype = c->pdt;
  cfg.eps = c->eps;
  cfg.partial = c->partial;
  cfg.flags = (c->outside ? RMSNORM_FLAG_EPS_OUTSIDE : 0) |
              (c->weight == 2 ? RMSNORM_FLAG_WEIGHT_OFFSET : 0) |
              (c->round_first ? RMSNORM_FLAG_ROUND_BEFORE_WEIGHT : 0);
  const void *wp = c->weight ? w.data : NULL, *bp = c->bias ? b.data : NULL;
  rmsnorm_status st =
      c->layernorm
          ? rmsnorm_layernorm_forward(ctx, &cfg, rows, d, x.data, c->ldx, wp, bp, y.data,
                                      c->inplace ? c->ldx : c->ldy, mean, rstd)
          : rmsnorm_forward(ctx, &cfg, rows, d, x.data, c->ldx, wp, bp, y.data,
                            c->inplace ? c->ldx : c->ldy, rstd);
  tu_check(st == RMSNORM_OK, "%s: status %s", what, rmsnorm_status_name(st));

  oracle_opts o = {c->layernorm, c->layernorm ? d : tu_partial_k(c->partial, d),
                   c->eps, c->outside, c->round_first, c->dt};
  if (o.k > d) o.k = d;
  int f64 = rn_acc_is_f64(c->dt);
  for (size_t i = 0; i < rows && st == RMSNORM_OK; i++) {
    ld_t m, r, ymax = 0;
    oracle_forward_row(xl + i * d, d, c->weight ? wl : NULL, c->bias ? bl : NULL, &o, yl, &m, &r);
    for (size_t j = 0; j < d; j++) ymax = fmaxl(ymax, fabsl(yl[j]));
    double worst = 0;
    size_t worst_j = 0;
    for (size_t j = 0; j < d; j++) {
      double got = tu_get(&y, i, j), want = (double)yl[j];
      double err;
      if (c->dt == RMSNORM_F32 || c->dt == RMSNORM_F64) {
        double bound = (c->dt == RMSNORM_F32 ? 2e-6 : 1e-13) * (ymax > 0 ? (double)ymax : 1.0);
        if (c->dt == RMSNORM_F32 && c->layernorm) {
          /* x - mean in fp32 cancels on a row whose spread is far below its
           * mean (and below eps, so ymax is small too): fp32's error on the
           * terms, as for fp16 */
          ld_t wj = c->weight ? wl[j] : 1;
          bound += 0x1p-22 * (double)((fabsl(xl[i * d + j]) + fabsl(m)) * r * fabsl(wj));
        }
        err = fabs(got - want) / bound; /* in units of the promise */
      } else {
        err = tu_ulps(c->dt, got, want); /* promise: <= 1 ulp */
        if (err > 1 && (c->bias || c->round_first || c->layernorm)) {
          /* fp32 error of the terms (x - mean, xhat * w, + b), and of rounding
           * xhat first, can exceed an ulp of a result that cancels: the
           * documented bound */
          ld_t h = (xl[i * d + j] - m) * r, wj = c->weight ? wl[j] : 1;
          ld_t terms = (fabsl(xl[i * d + j]) + fabsl(m)) * r * fabsl(wj) + (c->bias ? fabsl(bl[j]) : 0);
          double bound = ulp_of(c->dt, want) + 0x1p-22 * (double)terms;
          if (c->round_first) bound += ulp_of(c->dt, (double)h) * (double)fabsl(wj);
          err = fabs(got - want) / bound;
        }
      }
      if (!(err <= worst)) {
        worst = isnan(err) ? INFINITY : err;
        worst_j = j;
      }
    }
    tu_check(worst <= 1, "%s: row %zu col %zu: got %.9g want %.9g (%.3g of the bound)", what, i,
             worst_j, tu_get(&y, i, worst_j), (double)yl[worst_j], worst);
    double rgot = rn_load_acc(rstd, f64, i);
    tu_check(fabsl(rgot - r) <= (f64 ? 1e-14L : 5e-7L) * r, "%s: row %zu rstd %.9g want %.9Lg",
             what, i, rgot, r);
    if (c->layernorm) {
      /* a sum's error scales with its terms, not with the sum: mean |x_j|
       * (the mean of a row far from zero cancels) */
      ld_t mabs = 0;
      for (size_t j = 0; j < d; j++) mabs += fabsl(xl[i * d + j]);
      mabs /= (ld_t)d;
      tu_check(fabsl(rn_load_acc(mean, f64, i) - m) <= (f64 ? 1e-14L : 1e-6L) * (mabs + fabsl(m) + r),
               "%s: row %zu mean %.17g want %.17Lg", what, i, rn_load_acc(mean, f64, i), m);
    }
    /* the stride gaps of y are untouched */
    if (!c->inplace && i + 1 < rows && c->ldy > d) {
      const unsigned char *gap =
          (const unsigned char *)y.data + (i * c->ldy + d) * rn_dtype_size(c->dt);
      int clean = 1;
      for (size_t g = 0; g < (c->ldy - d) * rn_dtype_size(c->dt); g++) clean &= gap[g] == 0x7f;
      tu_check(clean, "%s: row %zu: stride gap written", what, i);
    }
  }
  free(xl), free(yl), free(wl), free(bl), free(mean), free(rstd);
  if (!c->inplace) tu_free(&y);
  tu_free(&x), tu_free(&w), tu_free(&b);
}

/* Every variant on small ragged d, with strides and in-place use varied. */
static void test_variant_grid(void) {
  static const size_t sizes[] = {127};
  size_t n = 0;
  for (int dt = 0; dt < 4; dt++)
    for (int ln = 0; ln < 2; ln++)
      for (int pd = 0; pd < 2; pd++)
        for (int weight = 0; weight < 3; weight++)
          for (int bias = 0; bias < 2; bias++)
            for (int epsk = 0; epsk < 3; epsk++)
              for (int part = 0; part < 2; part++)
                for (int rf = 0; rf < 2; rf++) {
                  rmsnorm_dtype pdt = pd ? RMSNORM_F32 : (rmsnorm_dtype)dt;
                  if (pd && dt == RMSNORM_F32) continue;
                  if (ln && (epsk == 2 || part)) continue;
                  if (rf && (dt == RMSNORM_F32 || dt == RMSNORM_F64)) continue;
                  for (size_t d = 1; d <= 71; d++) {
                    n++;
                    /* a third of the cases: whole groups of short rows (their
                     * statistics are taken together) and a partial one */
                    size_t rows = n % 3 ? 3 : tu_reduced() ? 9 : 19;
                    fcase c = {(rmsnorm_dtype)dt, pdt, ln, rows, d == 71 ? sizes[0] : d, 0, 0,
                               weight, bias, epsk == 1 ? 0.0 : 1e-5, epsk == 2,
                               part ? 0.37 : 1.0, rf, n % 5 == 0, n % 7 == 3 ? 1e-3 : 1.0};
                    c.ldx = c.d + (n % 3 == 1 ? 3 : 0);
                    c.ldy = c.d + (n % 4 == 2 ? 1 : 0);
                    run_case(&c, NULL);
                  }
                }
}

/* The sizes of real models, fewer variants. */
static void test_model_sizes(void) {
  static const size_t sizes[] = {4095, 4096, 5120, 65537};
  for (int dt = 0; dt < 4; dt++)
    for (int ln = 0; ln < 2; ln++)
      for (size_t s = 0; s < 4; s++)
        for (int v = 0; v < 3; v++) {
          if (ln && v == 2) continue;
          /* reduced: 65537 once per dtype */
          if (tu_reduced() && s == 3 && (ln || v)) continue;
          fcase c = {(rmsnorm_dtype)dt, (rmsnorm_dtype)dt, ln, 2, sizes[s], sizes[s],
                     sizes[s] + 5, v, v == 1, 1e-6, v == 2, v == 2 ? 0.25 : 1.0,
                     0, 0, 1.0};
          run_case(&c, NULL);
        }
}

/* fp32 accuracy for one long row: no single long float sum. */
static void test_long_rows(void) {
  for (int dt = 0; dt < 4; dt++)
    for (int ln = 0; ln < 2; ln++) {
      if (tu_reduced() && dt != RMSNORM_F32) continue; /* reduced: fp32, 2^18 */
      size_t d = tu_reduced() ? 1u << 18 : 1u << 20;
      fcase c = {(rmsnorm_dtype)dt, RMSNORM_F32, ln, 1, d, d, d, 1, 0, 1e-5, 0, 1.0, 0, 0, 3.0};
      /* a mean far from zero makes LayerNorm's sums harder */
      double *xv = malloc(d * sizeof(double));
      for (size_t j = 0; j < d; j++) xv[j] = (ln ? 10.0 : 0.0) + 3.0 * tu_normal();
      run_case(&c, xv);
      free(xv);
    }
}

/* Rows the fast path cannot trust: they must still match the oracle, and
 * leave their neighbours' bits unchanged. */
static void test_special_rows(void) {
  const size_t d = 4096, rows = 4;
  double *xv = malloc(rows * d * sizeof(double));
  for (int dt = 0; dt < 4; dt++)
    for (int ln = 0; ln < 2; ln++)
      for (int kind = 0; kind < 5; kind++) {
        double big = dt == RMSNORM_F64 ? 1e200 : dt == RMSNORM_F16 ? 2e3 : 1e30;
        double tiny = dt == RMSNORM_F64 ? 1e-200 : dt == RMSNORM_F16 ? 1e-7 : 1e-30;
        if (dt == RMSNORM_BF16 && kind == 4) big = 5e37; /* near bf16's max */
        for (size_t i = 0; i < rows * d; i++) xv[i] = tu_normal();
        for (size_t j = 0; j < d; j++) {
          double v = xv[d + j];
          xv[d + j] = kind == 0 || kind == 4 ? v * big : kind == 1 ? v * tiny : 0.0;
        }
        if (kind == 3) xv[d + 3] = 0; /* zeros with a real eps */
        fcase c = {(rmsnorm_dtype)dt, (rmsnorm_dtype)dt, ln, rows, d, d, d, 1, 1,
                   kind == 3 ? 1e-5 : 0.0, 0, 1.0, 0, 0, 1.0};
        run_case(&c, xv);
        if (!ln) {
          c.outside = 1; /* the other eps form through the same rows */
          run_case(&c, xv);
        }
      }
  free(xv);
}

/* Tiny rows at the edges of the fast path's trust bounds (rowmath.h), for
 * each eps form: rows scaled by 2^e around where squares start to underflow,
 * eps around 2^-70 (inside) and 2^-44 (outside) for float compute, 2^-930 and
 * 2^-470 for double; every row within the forward's promise and its rstd
 * within float's rounding of the oracle. Among them the row x = 1.5 * 2^-75
 * with eps = 2^-70 outside the root, which a float sum trusted by the
 * inside-the-root bound got wrong by 2.6e-3 in r. */
static const int float_exps[] = {-40, -50, -60, -63, -66, -70, -73,
                                 -75, -78, -80, -90, -100, -110, -120};
static const double float_eps[] = {0, 0x1p-90, 0x1p-71, 0x1p-70, 0x1p-69, 0x1p-60, 0x1p-50,
                                   0x1p-45, 0x1p-44, 0x1p-43, 0x1p-30, 1e-5};
static const int double_exps[] = {-400, -450, -470, -480, -500, -520, -530, -537, -540, -560,
                                  -600, -700, -800, -900, -1000};
static const double double_eps[] = {0, 0x1p-940, 0x1p-931, 0x1p-930, 0x1p-929, 0x1p-600,
                                    0x1p-480, 0x1p-471, 0x1p-470, 0x1p-469, 0x1p-300, 1e-12};

static void test_eps_edges(void) {
  const size_t d = 67;
  static const rmsnorm_dtype dts[] = {RMSNORM_F32, RMSNORM_BF16, RMSNORM_F64};
  for (int t = 0; t < 3; t++) {
    rmsnorm_dtype dt = dts[t];
    int f64 = dt == RMSNORM_F64;
    const int *exps = f64 ? double_exps : float_exps;
    size_t nexp = f64 ? sizeof double_exps / sizeof *double_exps
                      : sizeof float_exps / sizeof *float_exps;
    const double *epss = f64 ? double_eps : float_eps;
    size_t rows = nexp + 1;
    double *xv = malloc(rows * d * sizeof *xv);
    for (int outside = 0; outside < 2; outside++)
      for (size_t ei = 0; ei < 12; ei++) {
        for (size_t i = 0; i < nexp; i++)
          for (size_t j = 0; j < d; j++) xv[i * d + j] = ldexp(tu_normal(), exps[i]);
        for (size_t j = 0; j < d; j++) /* a row of the constant 1.5 * 2^-75 (or 2^-540) */
          xv[nexp * d + j] = ldexp(1.5, f64 ? -540 : -75) * (j % 2 ? -1 : 1);
        fcase c = {dt, dt, 0, rows, d, d, d, 1, 0, epss[ei], outside, 1.0, 0, 0, 1.0};
        run_case(&c, xv);
      }
    free(xv);
  }
}

/* Non-finite inputs touch their row only, as docs/numerics.md states (11
 * rows: one whole group of short rows, whose statistics are taken together,
 * and 3 more): a NaN makes the row NaN; an infinity gives RMSNorm r = 0, so
 * NaN at the infinity and zeros elsewhere, and LayerNorm NaN throughout.
 * (tests/test_nonfinite.c sweeps every op against the formulas.) */
static void test_nonfinite_rows(void) {
  const size_t d = 37, rows = 11;
  for (int dt = 0; dt < 4; dt++)
    for (int ln = 0; ln < 2; ln++)
      for (int kind = 0; kind < 2; kind++) {
        tu_tensor x = tu_alloc((rmsnorm_dtype)dt, rows, d, d), y = tu_alloc((rmsnorm_dtype)dt, rows, d, d);
        tu_tensor y2 = tu_alloc((rmsnorm_dtype)dt, rows, d, d);
        tu_fill_normal(&x, 1.0);
        rmsnorm_config cfg;
        rmsnorm_config_init(&cfg, (rmsnorm_dtype)dt);
        rmsnorm_status st = ln ? rmsnorm_layernorm_forward(ctx, &cfg, rows, d, x.data, d, NULL,
                                                           NULL, y2.data, d, NULL, NULL)
                               : rmsnorm_forward(ctx, &cfg, rows, d, x.data, d, NULL, NULL,
                                                 y2.data, d, NULL);
        tu_set(&x, 1, 5, kind ? INFINITY : NAN);
        st |= ln ? rmsnorm_layernorm_forward(ctx, &cfg, rows, d, x.data, d, NULL, NULL, y.data,
                                             d, NULL, NULL)
                 : rmsnorm_forward(ctx, &cfg, rows, d, x.data, d, NULL, NULL, y.data, d, NULL);
        tu_check(st == RMSNORM_OK, "nonfinite: status");
        int others_same = 1, row_ok = 1;
        for (size_t j = 0; j < d; j++) {
          for (size_t i = 0; i < rows; i++)
            if (i != 1) others_same &= tu_get(&y, i, j) == tu_get(&y2, i, j);
          double v = tu_get(&y, 1, j);
          row_ok &= kind && !ln && j != 5 ? v == 0 && !signbit(v) == !signbit(tu_get(&x, 1, j))
                                          : isnan(v) != 0;
        }
        tu_check(others_same && row_ok, "nonfinite %s %s kind %d: other rows same %d, row 1 as the rule %d",
                 ln ? "LN" : "RMS", tu_dtype_name((rmsnorm_dtype)dt), kind, others_same, row_ok);
        tu_free(&x), tu_free(&y), tu_free(&y2);
      }
}

int main(void) {
  tu_seed(1);
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) return 2;
  test_variant_grid();
  test_model_sizes();
  test_long_rows();
  test_special_rows();
  test_eps_edges();
  test_nonfinite_rows();
  rmsnorm_context_free(ctx);
  return tu_finish("test_forward");
}
