/* test_backward.c - RMSNorm and LayerNorm backward: dx, dweight, dbias
 * against the long-double oracle for every dtype and variant, saved or
 * recomputed statistics, accumulation, in place; special rows; and the fp64
 * path against central finite differences of the library's own forward. */
#include "oracle.h"
#include "testutil.h"

static rmsnorm_context *ctx;

typedef struct bcase {
  rmsnorm_dtype dt, pdt;
  int layernorm;
  size_t rows, d, ldx, lddy, lddx;
  int weight; /* 0 none, 1 g, 2 offset */
  int want_dw, want_db;
  double eps;
  int outside;
  double partial;
  int saved;   /* pass the forward's statistics */
  int inplace; /* 0, 1: dx = dy, 2: dx = x */
  int accumulate;
  double scale;
} bcase;

static rmsnorm_config make_config(const bcase *c) {
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, c->dt);
  cfg.param_dtype = c->pdt;
  cfg.eps = c->eps;
  cfg.partial = c->partial;
  cfg.flags = (c->outside ? RMSNORM_FLAG_EPS_OUTSIDE : 0) |
              (c->weight == 2 ? RMSNORM_FLAG_WEIGHT_OFFSET : 0) |
              (c->accumulate ? RMSNORM_FLAG_ACCUMULATE : 0);
  return cfg;
}

/* relative tolerance of a stored result of dtype dt */
static double tol_of(rmsnorm_dtype dt) {
  return dt == RMSNORM_F32 ? 1e-5 : dt == RMSNORM_F64 ? 1e-12 : dt == RMSNORM_F16 ? 0x1p-10 : 0x1p-7;
}

static void run_case(const bcase *c, const double *x_override) {
  char what[256];
  snprintf(what, sizeof what,
           "%s %s pdt=%s rows=%zu d=%zu w=%d dw=%d db=%d eps=%g out=%d p=%g saved=%d ip=%d acc=%d",
           c->layernorm ? "LN" : "RMS", tu_dtype_name(c->dt), tu_dtype_name(c->pdt), c->rows,
           c->d, c->weight, c->want_dw, c->want_db, c->eps, c->outside, c->partial, c->saved,
           c->inplace, c->accumulate);
  size_t rows = c->rows, d = c->d;
  size_t lddx = c->inplace == 1 ? c->lddy : c->inplace == 2 ? c->ldx : c->lddx;
  tu_tensor x = tu_alloc(c->dt, rows, d, c->ldx), dy = tu_alloc(c->dt, rows, d, c->lddy);
  if (x_override) {
    for (size_t i = 0; i < rows; i++)
      for (size_t j = 0; j < d; j++) tu_set(&x, i, j, x_override[i * d + j]);
  } else {
    tu_fill_normal(&x, c->scale);
  }
  tu_fill_normal(&dy, 1.0);
  tu_tensor w = tu_alloc(c->pdt, 1, d, d), dw = tu_alloc(c->pdt, 1, d, d),
            db = tu_alloc(c->pdt, 1, d, d);
  for (size_t j = 0; j < d; j++) {
    tu_set(&w, 0, j, c->weight == 2 ? 0.1 * tu_normal() : 1 + 0.3 * tu_normal());
    tu_set(&dw, 0, j, c->accumulate ? tu_normal() : 0);
    tu_set(&db, 0, j, c->accumulate ? tu_normal() : 0);
  }
  size_t as = rn_acc_size(c->dt);
  void *mean = malloc(rows * as), *rstd = malloc(rows * as);
  rmsnorm_config cfg = make_config(c);
  const void *wp = c->weight ? w.data : NULL;
  if (c->saved) {
    tu_tensor y = tu_alloc(c->dt, rows, d, d);
    rmsnorm_status st =
        c->layernorm ? rmsnorm_layernorm_forward(ctx, &cfg, rows, d, x.data, c->ldx, wp, NULL,
                                                 y.data, d, mean, rstd)
                     : rmsnorm_forward(ctx, &cfg, rows, d, x.data, c->ldx, wp, NULL, y.data, d,
                                       rstd);
    tu_check(st == RMSNORM_OK, "%s: forward status %s", what, rmsnorm_status_name(st));
    tu_free(&y);
  }

  ld_t *xl = malloc(rows * d * sizeof(ld_t)), *dyl = malloc(rows * d * sizeof(ld_t));
  ld_t *dxl = malloc(rows * d * sizeof(ld_t)), *wl = malloc(d * sizeof(ld_t));
  ld_t *dwl = calloc(d, sizeof(ld_t)), *dbl = calloc(d, sizeof(ld_t));
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < d; j++) {
      xl[i * d + j] = tu_get(&x, i, j);
      dyl[i * d + j] = tu_get(&dy, i, j);
    }
  for (size_t j = 0; j < d; j++) {
    wl[j] = (c->weight == 2 ? 1 : 0) + (ld_t)tu_get(&w, 0, j);
    dwl[j] = tu_get(&dw, 0, j);
    dbl[j] = tu_get(&db, 0, j);
  }

  tu_tensor dx = c->inplace == 1 ? dy : c->inplace == 2 ? x : tu_alloc(c->dt, rows, d, lddx);
  void *dwp = c->want_dw ? dw.data : NULL, *dbp = c->want_db ? db.data : NULL;
  rmsnorm_status st =
      c->layernorm
          ? rmsnorm_layernorm_backward(ctx, &cfg, rows, d, x.data, c->ldx, dy.data, c->lddy, wp,
                                       c->saved ? mean : NULL, c->saved ? rstd : NULL, dx.data,
                                       lddx, dwp, dbp)
          : rmsnorm_backward(ctx, &cfg, rows, d, x.data, c->ldx, dy.data, c->lddy, wp,
                             c->saved ? rstd : NULL, dx.data, lddx, dwp, dbp);
  tu_check(st == RMSNORM_OK, "%s: status %s", what, rmsnorm_status_name(st));

  oracle_opts o = {c->layernorm, c->layernorm ? d : tu_partial_k(c->partial, d), c->eps,
                   c->outside, 0, c->dt};
  if (o.k > d) o.k = d;
  for (size_t i = 0; i < rows; i++)
    oracle_backward_row(xl + i * d, dyl + i * d, d, c->weight ? wl : NULL, &o, dxl + i * d,
                        dwl, dbl);
  if (st == RMSNORM_OK) {
    /* dx is judged relative to its largest magnitude, or to that of its
     * leading term r * gy where dx cancels (d = 1: y = sign(x)) */
    ld_t mx = 0, mw = 0, mb = 0;
    for (size_t i = 0; i < rows * d; i++) mx = fmaxl(mx, fabsl(dxl[i]));
    for (size_t i = 0; i < rows; i++) {
      ld_t m, r;
      oracle_stats(xl + i * d, d, &o, &m, &r);
      for (size_t j = 0; j < d; j++)
        mx = fmaxl(mx, fabsl(r * dyl[i * d + j] * (c->weight ? wl[j] : 1)));
    }
    for (size_t j = 0; j < d; j++) mw = fmaxl(mw, fabsl(dwl[j])), mb = fmaxl(mb, fabsl(dbl[j]));
    double ex = 0, ew = 0, eb = 0;
    for (size_t i = 0; i < rows; i++)
      for (size_t j = 0; j < d; j++) {
        double want = (double)dxl[i * d + j], got = tu_get(&dx, i, j);
        /* a gradient past the dtype's range must come out as that infinity */
        double e = isinf(rn_round_to(c->dt, want))
                       ? (got == rn_round_to(c->dt, want) ? 0 : INFINITY)
                       : fabs(got - want) / (double)(mx > 0 ? mx : 1);
        ex = isnan(e) || e > ex ? (isnan(e) ? INFINITY : e) : ex;
      }
    for (size_t j = 0; j < d; j++) {
      double e1 = fabs(tu_get(&dw, 0, j) - (double)dwl[j]) / (double)(mw > 0 ? mw : 1);
      double e2 = fabs(tu_get(&db, 0, j) - (double)dbl[j]) / (double)(mb > 0 ? mb : 1);
      if (c->want_dw) ew = isnan(e1) ? INFINITY : fmax(ew, e1);
      if (c->want_db) eb = isnan(e2) ? INFINITY : fmax(eb, e2);
    }
    tu_check(ex <= tol_of(c->dt), "%s: dx error %.3g", what, ex);
    tu_check(ew <= tol_of(c->pdt), "%s: dweight error %.3g", what, ew);
    tu_check(eb <= tol_of(c->pdt), "%s: dbias error %.3g", what, eb);
  }
  free(xl), free(dyl), free(dxl), free(wl), free(dwl), free(dbl), free(mean), free(rstd);
  if (!c->inplace) tu_free(&dx);
  tu_free(&x), tu_free(&dy), tu_free(&w), tu_free(&dw), tu_free(&db);
}

static void test_variant_grid(void) {
  size_t n = 0;
  for (int dt = 0; dt < 4; dt++)
    for (int ln = 0; ln < 2; ln++)
      for (int pd = 0; pd < 2; pd++)
        for (int weight = 0; weight < 3; weight++)
          for (int epsk = 0; epsk < 3; epsk++)
            for (int part = 0; part < 2; part++)
              for (int saved = 0; saved < 2; saved++) {
                rmsnorm_dtype pdt = pd ? RMSNORM_F32 : (rmsnorm_dtype)dt;
                if (pd && dt == RMSNORM_F32) continue;
                if (ln && (epsk == 2 || part)) continue;
                for (size_t d = 1; d <= 71; d++) {
                  n++;
                  /* reduced: 70 rows (two chunks of 64) only for d <= 9 */
                  size_t rows = n % 2 ? 3 : tu_reduced() && d > 9 ? 6 : 70;
                  bcase c = {(rmsnorm_dtype)dt, pdt, ln, rows, d == 71 ? 127 : d, 0, 0, 0,
                             weight, weight && n % 3 != 0, n % 4 != 1,
                             epsk == 1 ? 0.0 : 1e-5, epsk == 2, part ? 0.37 : 1.0, saved,
                             (int)(n % 5 == 0 ? 1 : n % 5 == 3 ? 2 : 0), n % 6 == 2, 1.0};
                  c.ldx = c.d + (n % 3 == 1 ? 2 : 0);
                  c.lddy = c.d + (n % 4 == 2 ? 5 : 0);
                  c.lddx = c.d + (n % 7 == 1 ? 1 : 0);
                  run_case(&c, NULL);
                }
              }
}

static void test_model_sizes(void) {
  static const size_t sizes[] = {4095, 4096, 5120};
  for (int dt = 0; dt < 4; dt++)
    for (int ln = 0; ln < 2; ln++)
      for (size_t s = 0; s < 3; s++)
        for (int v = 0; v < 2; v++) {
          size_t d = sizes[s];
          bcase c = {(rmsnorm_dtype)dt, RMSNORM_F32, ln, tu_reduced() ? 7 : 130, d, d, d + 1, d, 1, 1, 1, 1e-6,
                     v && !ln, v && !ln ? 0.5 : 1.0, v, 0, 0, 1.0};
          run_case(&c, NULL);
        }
  /* one long row, fp32 */
  size_t long_d = tu_reduced() ? 1u << 18 : 1u << 20;
  bcase c = {RMSNORM_F32, RMSNORM_F32, 0, 1, long_d, long_d, long_d, long_d, 1, 1, 1,
             1e-5, 0, 1.0, 0, 0, 0, 2.0};
  run_case(&c, NULL);
  c.layernorm = 1;
  run_case(&c, NULL);
}

/* Overflowing, underflowing and zero rows through the backward. */
static void test_special_rows(void) {
  const size_t d = 1000, rows = 3;
  double *xv = malloc(rows * d * sizeof(double));
  for (int dt = 0; dt < 4; dt++)
    for (int ln = 0; ln < 2; ln++)
      for (int kind = 0; kind < 3; kind++)
        for (int saved = 0; saved < 2; saved++) {
          double big = dt == RMSNORM_F64 ? 1e200 : dt == RMSNORM_F16 ? 2e3 : 1e30;
          double tiny = dt == RMSNORM_F64 ? 1e-200 : dt == RMSNORM_F16 ? 1e-3 : 1e-30;
          for (size_t i = 0; i < rows * d; i++) xv[i] = tu_normal();
          for (size_t j = 0; j < d; j++) xv[d + j] *= kind == 0 ? big : kind == 1 ? tiny : 0.0;
          bcase c = {(rmsnorm_dtype)dt, (rmsnorm_dtype)dt, ln, rows, d, d, d, d, 1, 1, 1,
                     kind == 2 ? 1e-5 : 0.0, 0, 1.0, saved, 0, 0, 1.0};
          run_case(&c, xv);
          if (!ln && (dt == RMSNORM_F16 || dt == RMSNORM_BF16)) {
            /* no dbias: the kernels read the weight as it is and store
             * dweight themselves, the special row last or alone too */
            bcase o = c;
            o.want_db = 0;
            for (o.weight = 1; o.weight <= 2; o.weight++) {
              o.rows = rows;
              run_case(&o, xv);
              o.rows = 2;
              run_case(&o, xv);
              o.rows = 1;
              run_case(&o, xv + d);
              o.outside = 1; /* a zero row, eps 0 outside: the rescue path */
              run_case(&o, xv + d);
              o.outside = 0;
            }
          }
          if (!ln) {
            c.outside = 1;
            run_case(&c, xv);
          }
        }
  free(xv);
}

/* The backward of tiny rows at the edges of the fast path's trust bounds,
 * each eps form (see test_forward.c's test_eps_edges): one row per case, as
 * dx is judged relative to its largest magnitude. pRMSNorm too: fp64 rows
 * near the subnormals give r near double's top, and x * r past k must stay
 * in range. */
static void test_eps_edges(void) {
  static const int float_exps[] = {-50, -63, -70, -75, -80, -100, -120};
  static const double float_eps[] = {0, 0x1p-71, 0x1p-70, 0x1p-50, 0x1p-45, 0x1p-44, 0x1p-43, 1e-5};
  static const int double_exps[] = {-450, -500, -537, -540, -600, -1000, -1030};
  static const double double_eps[] = {0, 0x1p-931, 0x1p-930, 0x1p-480, 0x1p-471, 0x1p-470,
                                      0x1p-469, 1e-12};
  const size_t d = 67;
  static const rmsnorm_dtype dts[] = {RMSNORM_F32, RMSNORM_BF16, RMSNORM_F64};
  double *xv = malloc(d * sizeof *xv);
  for (int t = 0; t < 3; t++) {
    int f64 = dts[t] == RMSNORM_F64;
    for (int outside = 0; outside < 2; outside++)
      for (size_t ei = 0; ei < 8; ei++)
        for (size_t xi = 0; xi < 7; xi++)
          for (int part = 0; part < 2; part++) {
            int e = f64 ? double_exps[xi] : float_exps[xi];
            for (size_t j = 0; j < d; j++) xv[j] = ldexp(tu_normal(), e);
            bcase c = {dts[t], dts[t], 0, 1, d, d, d, d, 1, 1, 1,
                       f64 ? double_eps[ei] : float_eps[ei], outside, part ? 0.5 : 1.0,
                       (int)(xi % 2), 0, 0, 1.0};
            run_case(&c, xv);
          }
  }
  free(xv);
}

/* dweight's and dbias's columns whose every term is a zero of either sign:
 * the sums start from +0 (the spec's order), so -0 terms (dy = +0 against a
 * negative x, or dy = -0 against a positive one) sum to +0, on the first row
 * as on the others; the outputs are filled with NaN first, so a column left
 * unwritten shows. Rows 1, 2, 3, 5 and 17 (one row, pairs, groups of short
 * rows), a first row that takes the rescue path (its x^2 past the float
 * range), with and without a bias, parameters in fp32 and in the dtype. */
static void test_zero_terms(void) {
  const rmsnorm_dtype dts[] = {RMSNORM_F32, RMSNORM_F64, RMSNORM_BF16, RMSNORM_F16};
  const size_t rows_set[] = {1, 2, 3, 5, 17}, ds[] = {1, 7, 8, 9, 16, 33, 127, 576, 1100};
  for (size_t k = 0; k < 4; k++)
    for (int own = 0; own < 2; own++)
      for (size_t ri = 0; ri < 5; ri++)
        for (size_t di = 0; di < 9; di++)
          for (int bias = 0; bias < 2; bias++)
            for (int huge = 0; huge < 2; huge++) {
              rmsnorm_dtype dt = dts[k];
              rmsnorm_dtype pdt = own ? dt : dt == RMSNORM_F64 ? RMSNORM_F64 : RMSNORM_F32;
              size_t rows = rows_set[ri], d = ds[di];
              if (huge && dt == RMSNORM_F16) continue; /* fp16 cannot hold such an x */
              rmsnorm_config cfg;
              rmsnorm_config_init(&cfg, dt);
              cfg.param_dtype = pdt;
              tu_tensor x = tu_alloc(dt, rows, d, d), dy = tu_alloc(dt, rows, d, d);
              tu_tensor dx = tu_alloc(dt, rows, d, d), w = tu_alloc(pdt, 1, d, d);
              tu_tensor dw = tu_alloc(pdt, 1, d, d), db = tu_alloc(pdt, 1, d, d);
              for (size_t j = 0; j < d; j++) {
                tu_set(&w, 0, j, 1 + 0.3 * tu_normal());
                tu_set(&dw, 0, j, NAN), tu_set(&db, 0, j, NAN);
              }
              for (size_t i = 0; i < rows; i++)
                for (size_t j = 0; j < d; j++) {
                  double v = 0.5 + fabs(tu_normal()), scale = huge && i == 0
                                                                   ? (dt == RMSNORM_F64 ? 1e200 : 1e30)
                                                                   : 1;
                  /* column kinds: 0: dy = +0, x < 0; 1: dy = -0, x > 0; 2: any */
                  int kind = (int)(j % 3);
                  tu_set(&x, i, j, scale * (kind == 0 ? -v : kind == 1 ? v : tu_normal()));
                  tu_set(&dy, i, j, kind == 0 ? 0.0 : kind == 1 ? -0.0 : tu_normal());
                }
              rmsnorm_status st = rmsnorm_backward(ctx, &cfg, rows, d, x.data, d, dy.data, d,
                                                   w.data, NULL, dx.data, d, dw.data,
                                                   bias ? db.data : NULL);
              int bad = st != RMSNORM_OK;
              for (size_t j = 0; j < d && !bad; j++) {
                double gw = tu_get(&dw, 0, j), gb = tu_get(&db, 0, j);
                if (j % 3 < 2)
                  bad = gw != 0 || signbit(gw) || (bias && (gb != 0 || signbit(gb)));
                else
                  bad = isnan(gw) || (bias && isnan(gb));
              }
              tu_check(!bad, "zero terms: %s pdt=%s %zu x %zu bias=%d huge=%d: a column's "
                       "sum is not +0 or was not written", tu_dtype_name(dt),
                       tu_dtype_name(pdt), rows, d, bias, huge);
              tu_free(&x), tu_free(&dy), tu_free(&dx), tu_free(&w), tu_free(&dw), tu_free(&db);
            }
}

/* A call of one row with a weight and a dweight and no dbias, whose
 * partial its only row writes from nothing (the kernels' own case for it):
 * every dtype, parameters in fp32 and in the dtype, RMSNorm and LayerNorm,
 * plain and 1 + g weights, saved or recomputed statistics, in place, ragged
 * and model sizes. */
static void test_one_row(void) {
  static const size_t ds[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 127, 576, 4095, 4096};
  size_t n = 0;
  for (int dt = 0; dt < 4; dt++)
    for (int pd = 0; pd < 2; pd++)
      for (int ln = 0; ln < 2; ln++)
        for (size_t di = 0; di < sizeof ds / sizeof *ds; di++) {
          rmsnorm_dtype pdt = pd ? RMSNORM_F32 : (rmsnorm_dtype)dt;
          if (pd && dt == RMSNORM_F32) continue;
          size_t d = ds[di];
          n++;
          bcase c = {(rmsnorm_dtype)dt, pdt, ln, 1, d, d, d, d, 1 + (int)(n % 2), 1, 0,
                     1e-5, 0, !ln && n % 5 == 2 ? 0.37 : 1.0, (int)(n % 3 != 0),
                     (int)(n % 4 == 1 ? 1 : n % 4 == 3 ? 2 : 0), 0, 1.0};
          run_case(&c, NULL);
        }
}

/* 1-3 fp16/bf16 rows with a weight of their dtype and no dbias, whose
 * weight the kernels read as it is and whose dweight they store rounded
 * themselves (fp16 on every SIMD set, bf16 on AVX-512): the bits of the same
 * call with the weight's values in fp32 (as the 16-bit weight's copy holds
 * them; the dweight sum rounded after), dx equal and dweight the fp32 one
 * rounded. Every 16-bit weight pattern (NaNs, infinities, -0), plain and
 * 1 + g, rows whose dy holds an infinity (the rescue path), eps 0 over a
 * zero row. */
static void test_weight_in_place(void) {
  enum { D = 2048 };
  static uint16_t x[3 * D], dy[3 * D], wh[D], dxh[3 * D], dxf[3 * D], dwh[D];
  static float wf[D], dwf[D];
  size_t checks = 0, bad = 0;
  for (int bf16 = 0; bf16 < 2; bf16++)
    for (int offset = 0; offset < 2; offset++)
      for (size_t rows = 1; rows <= 3; rows++)
        for (int kind = 0; kind < 3; kind++)
          for (uint32_t base = 0; base < 65536; base += D) {
            rmsnorm_dtype dt = bf16 ? RMSNORM_BF16 : RMSNORM_F16;
            rmsnorm_config ch, cf;
            rmsnorm_config_init(&ch, dt);
            ch.param_dtype = dt;
            ch.flags = offset ? RMSNORM_FLAG_WEIGHT_OFFSET : 0;
            ch.eps = kind == 2 ? 0.0 : 1e-5;
            cf = ch;
            cf.param_dtype = RMSNORM_F32;
            volatile float zero = 0.0f;
            for (size_t j = 0; j < D; j++) {
              wh[j] = (uint16_t)(base + j);
              /* as the 16-bit weight's copy holds it: 0 + g (-0 is +0) */
              float g = bf16 ? rn_bf16_to_f32(wh[j]) : rn_f16_to_f32(wh[j]);
              wf[j] = offset ? g : zero + g;
            }
            for (size_t i = 0; i < rows * D; i++) {
              /* zeros where the weight holds -0 (column 0): x r c = 0, and
               * the sign of g dy reaches dx */
              int z = (kind == 2 && i >= (rows - 1) * D) || i % D % 64 == 0;
              float xv = (float)tu_normal(), dv = (float)tu_normal();
              x[i] = z ? 0 : bf16 ? rn_f32_to_bf16(xv) : rn_f32_to_f16(xv);
              dy[i] = bf16 ? rn_f32_to_bf16(dv) : rn_f32_to_f16(dv);
            }
            if (kind == 1) dy[(rows - 1) * D + 5] = bf16 ? 0x7f80 : 0x7c00; /* +inf, last row */
            TU_OK(rmsnorm_backward(ctx, &ch, rows, D, x, D, dy, D, wh, NULL, dxh, D, dwh, NULL));
            TU_OK(rmsnorm_backward(ctx, &cf, rows, D, x, D, dy, D, wf, NULL, dxf, D, dwf, NULL));
            for (size_t i = 0; i < rows * D; i++, checks++) bad += dxh[i] != dxf[i];
            for (size_t j = 0; j < D; j++, checks++)
              bad += dwh[j] != (bf16 ? rn_f32_to_bf16(dwf[j]) : rn_f32_to_f16(dwf[j]));
          }
  tu_check(bad == 0, "16-bit weight read in place: %zu of %zu outputs differ from the fp32 "
           "weight's", bad, checks);
}

/* Many rows: the dweight/dbias reduction sums chunks in groups; the result
 * stays within the promise, and the context's scratch does not grow with the
 * row count: it holds at most (64 + threads) row-length vectors of doubles
 * per gradient output plus a weight copy, whatever the rows. trim gives it
 * back, and the next call allocates again with the same bits. */
static void test_bounded_scratch(void) {
  const size_t d = 256;
  for (int dt = 0; dt < 4; dt++) {
    /* (reduced: 4200 rows, still past 64 chunks of 64) */
    bcase c = {(rmsnorm_dtype)dt, RMSNORM_F32, dt == 3, tu_reduced() ? 4200 : 20000, d, d, d, d,
               1, 1, 1, 1e-5, 0, 1.0, 0, 0, 0, 1.0};
    run_case(&c, NULL);
  }
  rmsnorm_context *c;
  if (rmsnorm_context_create(&c) != RMSNORM_OK) return;
  int threads;
  rmsnorm_context_get_threads(c, &threads);
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_BF16);
  size_t bound = 2 * (64 + (size_t)threads) * d * 8 + 2 * d * 8 + 4096, held[2] = {0, 0};
  uint16_t *dw1 = malloc(d * 2), *dw2 = malloc(d * 2), *db = malloc(d * 2);
  for (int k = 0; k < 2; k++) {
    /* 79 and 625 chunks of 64 rows (reduced: 79 and 141) */
    size_t rows = k ? (tu_reduced() ? 9000 : 40000) : 5000;
    tu_tensor x = tu_alloc(RMSNORM_BF16, rows, d, d), dy = tu_alloc(RMSNORM_BF16, rows, d, d);
    tu_tensor dx = tu_alloc(RMSNORM_BF16, rows, d, d), w = tu_alloc(RMSNORM_BF16, 1, d, d);
    for (size_t i = 0; i < rows * d; i++) {
      rn_store(x.data, RMSNORM_BF16, i, 2 * tu_uniform() - 1);
      rn_store(dy.data, RMSNORM_BF16, i, 2 * tu_uniform() - 1);
    }
    for (size_t j = 0; j < d; j++) tu_set(&w, 0, j, 1 + 0.1 * tu_normal());
    rmsnorm_status st = rmsnorm_backward(c, &cfg, rows, d, x.data, d, dy.data, d, w.data, NULL,
                                         dx.data, d, dw1, db);
    rmsnorm_context_get_scratch_bytes(c, &held[k]);
    tu_check(st == RMSNORM_OK && held[k] > 0 && held[k] <= bound,
             "bf16 backward of %zu x %zu: scratch %zu bytes, bound %zu", rows, d, held[k], bound);
    if (k) {
      size_t after = 1;
      tu_check(rmsnorm_context_trim(c) == RMSNORM_OK &&
                   rmsnorm_context_get_scratch_bytes(c, &after) == RMSNORM_OK && after == 0,
               "trim: %zu bytes left", after);
      st = rmsnorm_backward(c, &cfg, rows, d, x.data, d, dy.data, d, w.data, NULL, dx.data, d,
                            dw2, db);
      tu_check(st == RMSNORM_OK && !memcmp(dw1, dw2, d * 2), "after trim: the same dweight");
    }
    tu_free(&x), tu_free(&dy), tu_free(&dx), tu_free(&w);
  }
  tu_check(held[0] == held[1], "scratch grew with the rows: %zu, then %zu bytes", held[0],
           held[1]);
  tu_check(rmsnorm_context_trim(NULL) == RMSNORM_ERROR_NULL_POINTER &&
               rmsnorm_context_get_scratch_bytes(c, NULL) == RMSNORM_ERROR_NULL_POINTER,
           "trim / get_scratch_bytes: NULL");
  free(dw1), free(dw2), free(db);
  rmsnorm_context_free(c);
}

/* L(x, g, b) = sum dy * y through the library's fp64 forward. */
static double fd_loss(const rmsnorm_config *cfg, int ln, size_t rows, size_t d, const double *x,
                      const double *g, const double *b, const double *dy, double *y) {
  rmsnorm_status st =
      ln ? rmsnorm_layernorm_forward(ctx, cfg, rows, d, x, d, g, b, y, d, NULL, NULL)
         : rmsnorm_forward(ctx, cfg, rows, d, x, d, g, b, y, d, NULL);
  if (st != RMSNORM_OK) return NAN;
  double s = 0;
  for (size_t i = 0; i < rows * d; i++) s += dy[i] * y[i];
  return s;
}

/* Central differences of one coordinate of v. */
static double fd_partial(const rmsnorm_config *cfg, int ln, size_t rows, size_t d, double *x,
                         double *g, double *b, const double *dy, double *y, double *v) {
  double keep = *v, h = 1e-6 * fmax(1.0, fabs(keep));
  *v = keep + h;
  double lp = fd_loss(cfg, ln, rows, d, x, g, b, dy, y);
  *v = keep - h;
  double lm = fd_loss(cfg, ln, rows, d, x, g, b, dy, y);
  *v = keep;
  return (lp - lm) / (2 * h);
}

static void test_finite_differences(void) {
  static const size_t sizes[] = {1, 2, 3, 5, 8, 17, 33};
  for (int ln = 0; ln < 2; ln++)
    for (int weight = 0; weight < 3; weight++)
      for (int epsk = 0; epsk < 3; epsk++)
        for (int part = 0; part < 2; part++)
          for (size_t s = 0; s < 7; s++) {
            if (ln && (epsk == 2 || part)) continue;
            size_t rows = 2, d = sizes[s], n = rows * d;
            rmsnorm_config cfg;
            rmsnorm_config_init(&cfg, RMSNORM_F64);
            cfg.eps = epsk == 1 ? 0.0 : 1e-3;
            cfg.partial = part ? 0.5 : 1.0;
            cfg.flags = (epsk == 2 ? RMSNORM_FLAG_EPS_OUTSIDE : 0) |
                        (weight == 2 ? RMSNORM_FLAG_WEIGHT_OFFSET : 0);
            double *x = malloc(n * 8), *dy = malloc(n * 8), *y = malloc(n * 8),
                   *dx = malloc(n * 8);
            double *g = malloc(d * 8), *b = malloc(d * 8), *dg = malloc(d * 8),
                   *db = malloc(d * 8);
            for (size_t i = 0; i < n; i++) x[i] = tu_normal(), dy[i] = tu_normal();
            for (size_t j = 0; j < d; j++) g[j] = 1 + 0.5 * tu_normal(), b[j] = tu_normal();
            double *gp = weight ? g : NULL;
            rmsnorm_status st =
                ln ? rmsnorm_layernorm_backward(ctx, &cfg, rows, d, x, d, dy, d, gp, NULL, NULL,
                                                dx, d, weight ? dg : NULL, db)
                   : rmsnorm_backward(ctx, &cfg, rows, d, x, d, dy, d, gp, NULL, dx, d,
                                      weight ? dg : NULL, db);
            tu_check(st == RMSNORM_OK, "fd: status");
            /* judged against dx's largest magnitude or its leading term r*gy */
            double worst = 0, scale = 1e-12, rstd[2];
            if (ln)
              rmsnorm_layernorm_forward(ctx, &cfg, rows, d, x, d, gp, b, y, d, NULL, rstd);
            else
              rmsnorm_forward(ctx, &cfg, rows, d, x, d, gp, b, y, d, rstd);
            for (size_t i = 0; i < n; i++)
              scale = fmax(scale, fmax(fabs(dx[i]), rstd[i / d] * fabs(dy[i] * (gp ? g[i % d] : 1))));
            for (size_t i = 0; i < n; i++)
              worst = fmax(worst, fabs(fd_partial(&cfg, ln, rows, d, x, gp, b, dy, y, &x[i]) -
                                       dx[i]) / scale);
            for (size_t j = 0; j < d; j++) {
              if (weight)
                worst = fmax(worst, fabs(fd_partial(&cfg, ln, rows, d, x, gp, b, dy, y, &g[j]) -
                                         dg[j]) / fmax(1, fabs(dg[j])));
              worst = fmax(worst, fabs(fd_partial(&cfg, ln, rows, d, x, gp, b, dy, y, &b[j]) -
                                       db[j]) / fmax(1, fabs(db[j])));
            }
            tu_check(worst < 1e-6, "fd %s w=%d eps=%d p=%d d=%zu: error %.3g", ln ? "LN" : "RMS",
                     weight, epsk, part, d, worst);
            free(x), free(dy), free(y), free(dx), free(g), free(b), free(dg), free(db);
          }
}

int main(void) {
  tu_seed(2);
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) return 2;
  test_variant_grid();
  test_model_sizes();
  test_special_rows();
  test_eps_edges();
  test_zero_terms();
  test_bounded_scratch();
  test_finite_differences();
  test_one_row();
  test_weight_in_place();
  rmsnorm_context_free(ctx);
  return tu_finish("test_backward");
}
