/* test_sandwich.c - Gemma 2/3's sandwich norms, rmsnorm_sandwich_forward and
 * rmsnorm_sandwich_backward: bit for bit the separate calls (rmsnorm_forward,
 * the add, rmsnorm_forward; rmsnorm_backward, the add, rmsnorm_backward) on
 * every available kernel set and thread count, every dtype and config option,
 * ragged row lengths, strides, rows across the fused loops' blocks and the
 * reduction's groups, the in-place views, rescue rows (overflow, zero, NaN);
 * the dweights the same for every set and thread count; near the long double
 * oracle (sandwich_oracle.h) in fp32 and fp64; every error status, in order,
 * with nothing written. */
#include <float.h>

#include "sandwich_oracle.h"
#include "testutil.h"

static const rmsnorm_isa isas[] = {RMSNORM_ISA_SCALAR, RMSNORM_ISA_AVX2, RMSNORM_ISA_AVX512,
                                   RMSNORM_ISA_NEON};
#define NISAS (sizeof isas / sizeof isas[0])
static const int threads[] = {1, 2, 3};
#define NTHREADS (sizeof threads / sizeof threads[0])

static rmsnorm_context *ctx;

/* Variant v picks the options: Gemma's 1 + g in most, eps 0, eps outside,
 * pRMSNorm, HF's rounding (fp16/bf16). */
static rmsnorm_config make_cfg(rmsnorm_dtype dt, rmsnorm_dtype pdt, int v) {
  rmsnorm_config c;
  rmsnorm_config_init(&c, dt);
  c.param_dtype = pdt;
  c.eps = v % 4 == 1 ? 0.0 : 1e-6;
  c.partial = v % 5 == 2 ? 0.4 : 1.0;
  c.flags = (v % 3 == 1 ? RMSNORM_FLAG_EPS_OUTSIDE : 0) |
            (v % 2 == 0 ? RMSNORM_FLAG_WEIGHT_OFFSET : 0) |
            (v % 6 == 5 && dt != RMSNORM_F32 && dt != RMSNORM_F64
                 ? RMSNORM_FLAG_ROUND_BEFORE_WEIGHT : 0);
  return c;
}

/* Realistic rows: N(0, scale) with an outlier channel (x25) and ties (rows
 * of equal values); with `rescue`, rows for the rescue path: a huge row (its
 * sum of squares overflows), a zero row (r infinite with eps = 0) and a NaN. */
static void fill(tu_tensor *t, double scale, int rescue) {
  size_t out = 5 % t->d;
  for (size_t i = 0; i < t->rows; i++)
    for (size_t j = 0; j < t->d; j++) {
      double x = scale * tu_normal();
      if (j == out) x *= 25;
      if (i % 7 == 3 && j % 3 == 0) x = 0.5 * scale;
      tu_set(t, i, j, x);
    }
  if (!rescue || t->rows < 5) return;
  double huge = t->dt == RMSNORM_F64 ? 1e300 : t->dt == RMSNORM_F16 ? 3000.0 : 1e30;
  for (size_t j = 0; j < t->d; j++) {
    tu_set(t, 1, j, huge * (j % 2 ? -1 : 1));
    tu_set(t, 2, j, 0.0);
  }
  tu_set(t, 4, 0, NAN);
}

static tu_tensor vec(rmsnorm_dtype dt, size_t n, double base, double scale) {
  tu_tensor t = tu_alloc(dt, 1, n, n);
  for (size_t j = 0; j < n; j++) tu_set(&t, 0, j, base + scale * tu_normal());
  return t;
}

static tu_tensor copy_of(const tu_tensor *t) {
  tu_tensor c = tu_alloc(t->dt, t->rows, t->d, t->ld);
  memcpy(c.data, t->data, t->bytes);
  return c;
}

/* rows x d elements at p (stride ldp) and q (ldq) of dtype dt: the same bits,
 * or both NaN (a NaN's payload is not part of the contract). */
static int same_bits(rmsnorm_dtype dt, const void *p, size_t ldp, const void *q, size_t ldq,
                     size_t rows, size_t d) {
  size_t es = rn_dtype_size(dt);
  for (size_t i = 0; i < rows; i++) {
    const char *a = (const char *)p + i * ldp * es, *b = (const char *)q + i * ldq * es;
    if (!memcmp(a, b, d * es)) continue;
    for (size_t j = 0; j < d; j++)
      if (memcmp(a + j * es, b + j * es, es) &&
          !(isnan(rn_load(a, dt, j)) && isnan(rn_load(b, dt, j))))
        return 0;
  }
  return 1;
}

static int same_t(const tu_tensor *a, const tu_tensor *b) {
  return same_bits(a->dt, a->data, a->ld, b->data, b->ld, a->rows, a->d);
}

/* The stride gaps of t still hold tu_alloc's pattern. */
static int gaps_kept(const tu_tensor *t) {
  size_t es = rn_dtype_size(t->dt);
  for (size_t i = 0; i + 1 < t->rows; i++)
    for (size_t b = t->d * es; b < t->ld * es; b++)
      if (((const unsigned char *)t->data)[i * t->ld * es + b] != 0x7f) return 0;
  return 1;
}

/* h = round(h + u) element by element (the separate add; a double sum of two
 * values of the dtype rounded to it is the compute type's rounded sum) */
static void add_into(tu_tensor *h, const tu_tensor *u) {
  for (size_t i = 0; i < h->rows; i++)
    for (size_t j = 0; j < h->d; j++)
      tu_set(h, i, j, rn_round_to(h->dt, tu_get(h, i, j) + tu_get(u, i, j)));
}

static int nsets(void) {
  int n = 0;
  for (size_t i = 0; i < NISAS; i++) n += rmsnorm_context_set_isa(ctx, isas[i]) == RMSNORM_OK;
  rmsnorm_context_set_isa(ctx, RMSNORM_ISA_AUTO);
  return n;
}

/* ---- forward: the separate calls' bits -------------------------------- */

typedef struct fwd_out {
  tu_tensor h, x;
  void *rp, *rq; /* rstd_post, rstd_pre */
} fwd_out;

static void fwd_out_free(fwd_out *o) {
  tu_free(&o->h), tu_free(&o->x);
  free(o->rp), free(o->rq);
}

static void forward_case(rmsnorm_dtype dt, rmsnorm_dtype pdt, size_t rows, size_t d, int v) {
  rmsnorm_config cfg = make_cfg(dt, pdt, v);
  int inplace = v % 3 == 2; /* x' over a */
  int stats = v % 5 != 4;
  size_t lda = d + (v & 1) * 3, ldh = d + (v % 4 == 3 ? 5 : 0);
  size_t ldx = inplace ? lda : d + ((v >> 1) & 1);
  int offset = (cfg.flags & RMSNORM_FLAG_WEIGHT_OFFSET) != 0;
  tu_tensor a = tu_alloc(dt, rows, d, lda), h0 = tu_alloc(dt, rows, d, ldh);
  fill(&a, 2.0, v % 2 == 1), fill(&h0, 1.0, v % 4 == 0);
  tu_tensor wpost = vec(pdt, d, offset ? 0 : 1, 0.2), wpre = vec(pdt, d, offset ? 0 : 1, 0.2);
  const void *wp = v % 7 == 6 ? NULL : wpost.data, *wq = v % 11 == 10 ? NULL : wpre.data;
  size_t as = rn_acc_size(dt);
  char label[200];
  snprintf(label, sizeof label, "forward %s pdt=%s rows=%zu d=%zu v=%d%s", tu_dtype_name(dt),
           tu_dtype_name(pdt), rows, d, v, inplace ? " x'=a" : "");
  fwd_out first = {{0}, {0}, NULL, NULL};
  int have_first = 0;
  for (size_t s = 0; s < NISAS; s++) {
    if (rmsnorm_context_set_isa(ctx, isas[s]) != RMSNORM_OK) continue;
    for (size_t t = 0; t < NTHREADS; t++) {
      rmsnorm_context_set_threads(ctx, threads[t]);
      /* the separate calls: y = post(a), h' = h + y, x' = pre(h') */
      tu_tensor y = tu_alloc(dt, rows, d, d), hs = copy_of(&h0), xs = tu_alloc(dt, rows, d, d);
      void *rps = calloc(rows, as), *rqs = calloc(rows, as);
      rmsnorm_status st = rmsnorm_forward(ctx, &cfg, rows, d, a.data, lda, wp, NULL, y.data, d,
                                          rps);
      add_into(&hs, &y);
      if (st == RMSNORM_OK)
        st = rmsnorm_forward(ctx, &cfg, rows, d, hs.data, ldh, wq, NULL, xs.data, d, rqs);
      tu_check(st == RMSNORM_OK, "%s: separate calls: %s", label, rmsnorm_status_name(st));
      /* the fused call */
      fwd_out o = {copy_of(&h0), inplace ? copy_of(&a) : tu_alloc(dt, rows, d, ldx),
                   malloc(rows * as), malloc(rows * as)};
      memset(o.rp, 0x7f, rows * as), memset(o.rq, 0x7f, rows * as);
      tu_tensor abuf = inplace ? o.x : a;
      st = rmsnorm_sandwich_forward(ctx, &cfg, rows, d, abuf.data, lda, o.h.data, ldh, wp, wq,
                                    o.x.data, ldx, stats ? o.rp : NULL, stats ? o.rq : NULL);
      int ok = st == RMSNORM_OK && same_t(&o.h, &hs) && same_t(&o.x, &xs) && gaps_kept(&o.h) &&
               gaps_kept(&o.x);
      if (stats)
        ok &= same_bits(as == 8 ? RMSNORM_F64 : RMSNORM_F32, o.rp, 0, rps, 0, 1, rows) &&
              same_bits(as == 8 ? RMSNORM_F64 : RMSNORM_F32, o.rq, 0, rqs, 0, 1, rows);
      tu_check(ok, "%s %s threads %d: %s, not the separate calls' bits", label,
               rmsnorm_isa_name(isas[s]), threads[t], rmsnorm_status_name(st));
      if (!have_first) {
        first = o, have_first = 1;
      } else {
        tu_check(same_t(&o.h, &first.h) && same_t(&o.x, &first.x) &&
                     (!stats || (!memcmp(o.rp, first.rp, rows * as) &&
                                 !memcmp(o.rq, first.rq, rows * as))),
                 "%s %s threads %d: not the first set's bits", label, rmsnorm_isa_name(isas[s]),
                 threads[t]);
        fwd_out_free(&o);
      }
      tu_free(&y), tu_free(&hs), tu_free(&xs), free(rps), free(rqs);
    }
  }
  if (have_first) fwd_out_free(&first);
  tu_free(&a), tu_free(&h0), tu_free(&wpost), tu_free(&wpre);
}

/* ---- backward: rmsnorm_backward, the add, rmsnorm_backward ------------- */

/* In-place modes: which outputs are which inputs. */
enum { M_APART, M_DH_DHOUT, M_DH_DXN, M_DA_A, M_DA_DXN, M_DH_DHOUT_DA_A, M_NO_DHOUT, M_N };
static const char *const mode_names[M_N] = {"apart", "dh=dh_out", "dh=dx_next", "da=a",
                                            "da=dx_next", "dh=dh_out da=a", "no dh_out"};

static void backward_case(rmsnorm_dtype dt, rmsnorm_dtype pdt, size_t rows, size_t d, int v) {
  rmsnorm_config cfg = make_cfg(dt, pdt, v);
  if (v % 4 == 3) cfg.flags |= RMSNORM_FLAG_ACCUMULATE;
  int mode = v % M_N, saved = (v & 2) != 0;
  int offset = (cfg.flags & RMSNORM_FLAG_WEIGHT_OFFSET) != 0;
  size_t ld = d + (v & 1), ld2 = d + (v % 3 == 0 ? 2 : 0);
  tu_tensor a = tu_alloc(dt, rows, d, ld), h = tu_alloc(dt, rows, d, ld2);
  tu_tensor dho = tu_alloc(dt, rows, d, ld), dxn = tu_alloc(dt, rows, d, ld2);
  fill(&a, 2.0, v % 2 == 1), fill(&h, 1.0, v % 3 == 1);
  fill(&dho, 1.0, 0), fill(&dxn, 1.0, 0);
  tu_tensor wpost = vec(pdt, d, offset ? 0 : 1, 0.2), wpre = vec(pdt, d, offset ? 0 : 1, 0.2);
  const void *wp = v % 9 == 8 ? NULL : wpost.data, *wq = v % 10 == 7 ? NULL : wpre.data;
  int want_dwp = wp != NULL, want_dwq = wq != NULL && v % 5 != 4;
  tu_tensor dw0 = vec(pdt, d, 0, 1), dq0 = vec(pdt, d, 0, 1); /* accumulated into */
  size_t as = rn_acc_size(dt);
  void *rp = calloc(rows, as), *rq = calloc(rows, as);
  if (saved) { /* the forward's rstd (the same config, less ACCUMULATE) */
    rmsnorm_config fc = cfg;
    fc.flags &= ~(unsigned)RMSNORM_FLAG_ACCUMULATE;
    tu_tensor y = tu_alloc(dt, rows, d, d);
    rmsnorm_forward(ctx, &fc, rows, d, a.data, ld, wp, NULL, y.data, d, rp);
    rmsnorm_forward(ctx, &fc, rows, d, h.data, ld2, wq, NULL, y.data, d, rq);
    tu_free(&y);
  }
  const void *rps = saved ? rp : NULL, *rqs = saved ? rq : NULL;
  const void *dh_out = mode == M_NO_DHOUT ? NULL : dho.data;
  char label[200];
  snprintf(label, sizeof label, "backward %s pdt=%s rows=%zu d=%zu v=%d %s%s%s",
           tu_dtype_name(dt), tu_dtype_name(pdt), rows, d, v, mode_names[mode],
           saved ? " saved rstd" : "", cfg.flags & RMSNORM_FLAG_ACCUMULATE ? " accumulate" : "");
  tu_tensor fda = {0}, fdh = {0}, fdw = {0}, fdq = {0};
  int have_first = 0;
  for (size_t s = 0; s < NISAS; s++) {
    if (rmsnorm_context_set_isa(ctx, isas[s]) != RMSNORM_OK) continue;
    for (size_t t = 0; t < NTHREADS; t++) {
      rmsnorm_context_set_threads(ctx, threads[t]);
      /* separate: dx = pre backward at h, dt = dx + dh_out, da = post backward */
      tu_tensor dx = tu_alloc(dt, rows, d, d), dts = tu_alloc(dt, rows, d, d);
      tu_tensor das = tu_alloc(dt, rows, d, d), dws = copy_of(&dw0), dqs = copy_of(&dq0);
      rmsnorm_status st = rmsnorm_backward(ctx, &cfg, rows, d, h.data, ld2, dxn.data, ld2, wq,
                                           rqs, dx.data, d, want_dwq ? dqs.data : NULL, NULL);
      for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < d; j++) {
          double g = tu_get(&dx, i, j);
          tu_set(&dts, i, j, dh_out ? rn_round_to(dt, g + tu_get(&dho, i, j)) : g);
        }
      if (st == RMSNORM_OK)
        st = rmsnorm_backward(ctx, &cfg, rows, d, a.data, ld, dts.data, d, wp, rps, das.data, d,
                              want_dwp ? dws.data : NULL, NULL);
      tu_check(st == RMSNORM_OK, "%s: separate calls: %s", label, rmsnorm_status_name(st));
      /* fused, on copies (in place overwrites inputs) */
      tu_tensor ca = copy_of(&a), cdho = copy_of(&dho), cdxn = copy_of(&dxn);
      tu_tensor dhb = tu_alloc(dt, rows, d, ld + 1), dab = tu_alloc(dt, rows, d, ld2);
      tu_tensor dw = copy_of(&dw0), dq = copy_of(&dq0);
      tu_tensor gdh = mode == M_DH_DHOUT || mode == M_DH_DHOUT_DA_A ? cdho
                      : mode == M_DH_DXN || mode == M_NO_DHOUT        ? cdxn
                                                                      : dhb;
      tu_tensor gda = mode == M_DA_A || mode == M_DH_DHOUT_DA_A || mode == M_NO_DHOUT ? ca
                      : mode == M_DA_DXN                                            ? cdxn
                                                                                    : dab;
      st = rmsnorm_sandwich_backward(ctx, &cfg, rows, d, ca.data, ld, h.data, ld2,
                                     dh_out ? cdho.data : NULL, ld, cdxn.data, ld2, wp, wq, rps,
                                     rqs, gda.data, gda.ld, gdh.data, gdh.ld,
                                     want_dwp ? dw.data : NULL, want_dwq ? dq.data : NULL);
      int ok = st == RMSNORM_OK && same_t(&gdh, &dts) && same_t(&gda, &das) &&
               same_t(&dw, &dws) && same_t(&dq, &dqs) && gaps_kept(&gdh) && gaps_kept(&gda);
      tu_check(ok, "%s %s threads %d: %s, not the separate calls' bits", label,
               rmsnorm_isa_name(isas[s]), threads[t], rmsnorm_status_name(st));
      if (!have_first) {
        fda = copy_of(&gda), fdh = copy_of(&gdh), fdw = copy_of(&dw), fdq = copy_of(&dq);
        have_first = 1;
      } else {
        tu_check(same_t(&gda, &fda) && same_t(&gdh, &fdh) && !memcmp(dw.data, fdw.data, dw.bytes) &&
                     !memcmp(dq.data, fdq.data, dq.bytes),
                 "%s %s threads %d: not the first set's bits (da, dh, dweights)", label,
                 rmsnorm_isa_name(isas[s]), threads[t]);
      }
      tu_free(&dx), tu_free(&dts), tu_free(&das), tu_free(&dws), tu_free(&dqs);
      tu_free(&ca), tu_free(&cdho), tu_free(&cdxn), tu_free(&dhb), tu_free(&dab);
      tu_free(&dw), tu_free(&dq);
    }
  }
  if (have_first) tu_free(&fda), tu_free(&fdh), tu_free(&fdw), tu_free(&fdq);
  free(rp), free(rq);
  tu_free(&a), tu_free(&h), tu_free(&dho), tu_free(&dxn), tu_free(&wpost), tu_free(&wpre);
  tu_free(&dw0), tu_free(&dq0);
}

static void test_bits(void) {
  int emu = tu_reduced(), v = 0;
  for (int dt = 0; dt < 4; dt++)
    for (int p = 0; p < 2; p++) { /* parameters in fp32, then in the data's dtype */
      rmsnorm_dtype pdt = p ? (rmsnorm_dtype)dt : RMSNORM_F32;
      if (p == 1 && dt == RMSNORM_F32) continue;
      /* every row length up to 70 (a sample under emulation), rows 1 ... 23 */
      for (size_t d = 1; d <= 70; d += emu ? 9 : 1 + (p == 1)) {
        size_t rows = 1 + (d * 7 + (size_t)dt) % 23;
        forward_case((rmsnorm_dtype)dt, pdt, rows, d, v);
        backward_case((rmsnorm_dtype)dt, pdt, rows, d, v + 1);
        v += 3;
      }
      /* long rows, and rows across the blocks of the fused loops (~32 KiB)
       * and the reduction's chunks of 64 rows */
      static const size_t shapes[][2] = {{100, 64}, {300, 64}, {97, 127}, {9, 4095},
                                         {5, 4096}, {7, 5120}, {1100, 8}, {2, 32768}};
      size_t nshapes = emu ? 4 : sizeof shapes / sizeof shapes[0];
      for (size_t k = 0; k < nshapes; k++) {
        size_t rows = shapes[k][0], d = shapes[k][1];
        forward_case((rmsnorm_dtype)dt, pdt, rows, d, v);
        backward_case((rmsnorm_dtype)dt, pdt, rows, d, v + 1);
        v += 5;
      }
    }
  if (emu) return;
  /* the reduction with several chunks per group (over 4096 rows), and a row
   * long enough for the separate calls to split it across threads */
  for (int k = 0; k < 4; k++) backward_case(RMSNORM_F32, RMSNORM_F32, 4200, 16, 3 + 7 * k);
  backward_case(RMSNORM_BF16, RMSNORM_F32, 4100, 24, 4);
  /* large enough for several threads and tasks, each over many blocks */
  for (int k = 0; k < 3; k++) {
    forward_case(RMSNORM_F32, RMSNORM_F32, 1500, 512, 4 * k);
    forward_case(RMSNORM_BF16, RMSNORM_F32, 2000, 256, 4 * k + 2);
    backward_case(RMSNORM_F32, RMSNORM_F32, 1500, 512, 3 * k);
    backward_case(RMSNORM_BF16, RMSNORM_BF16, 2000, 256, 3 * k + 1);
  }
  forward_case(RMSNORM_F32, RMSNORM_F32, 2, 65536, 0);
  /* outputs of 4 MiB and more: the one-pass kernels' DRAM-sized path */
  forward_case(RMSNORM_F32, RMSNORM_F32, 300, 4096, 1);
  forward_case(RMSNORM_F64, RMSNORM_F64, 150, 4096, 5);
  backward_case(RMSNORM_F32, RMSNORM_F32, 2, 65536, 2);
  backward_case(RMSNORM_F64, RMSNORM_F64, 1, 32768, 6);
}

/* ---- the long double oracle --------------------------------------------- */

/* Gemma's config: 1 + g, eps 1e-6; rows with an outlier channel and ties,
 * against sandwich_oracle.h: |got - want| <= tol * (the row's largest |want|)
 * for h', x', da, dh; tol * the largest |want| for the dweights. */
static double row_max(const sw_t *v, size_t d) {
  double m = 0;
  for (size_t j = 0; j < d; j++) m = fmax(m, (double)fabsl(v[j]));
  return m;
}

static int close_row(const tu_tensor *t, size_t i, const sw_t *want, double tol) {
  double scale = row_max(want, t->d);
  for (size_t j = 0; j < t->d; j++)
    if (!(fabsl((sw_t)tu_get(t, i, j) - want[j]) <= tol * scale)) return 0;
  return 1;
}

static void oracle_case(rmsnorm_dtype dt, size_t rows, size_t d) {
  double tol = dt == RMSNORM_F64 ? 1e-12 : 2e-5, gtol = dt == RMSNORM_F64 ? 1e-11 : 1e-4;
  rmsnorm_dtype pdt = dt == RMSNORM_F64 ? RMSNORM_F64 : RMSNORM_F32;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = pdt;
  cfg.eps = 1e-6;
  cfg.flags = RMSNORM_FLAG_WEIGHT_OFFSET;
  tu_tensor a = tu_alloc(dt, rows, d, d), h = tu_alloc(dt, rows, d, d);
  tu_tensor dho = tu_alloc(dt, rows, d, d), dxn = tu_alloc(dt, rows, d, d);
  fill(&a, 4.0, 0), fill(&h, 1.0, 0), fill(&dho, 1.0, 0), fill(&dxn, 1.0, 0);
  tu_tensor wp = vec(pdt, d, 0, 0.3), wq = vec(pdt, d, 0, 0.3);
  tu_tensor h0 = copy_of(&h), x = tu_alloc(dt, rows, d, d);
  tu_tensor da = tu_alloc(dt, rows, d, d), dh = tu_alloc(dt, rows, d, d);
  tu_tensor dwp = tu_alloc(pdt, 1, d, d), dwq = tu_alloc(pdt, 1, d, d);
  rmsnorm_status st = rmsnorm_sandwich_forward(ctx, &cfg, rows, d, a.data, d, h.data, d, wp.data,
                                               wq.data, x.data, d, NULL, NULL);
  if (st == RMSNORM_OK)
    st = rmsnorm_sandwich_backward(ctx, &cfg, rows, d, a.data, d, h.data, d, dho.data, d,
                                   dxn.data, d, wp.data, wq.data, NULL, NULL, da.data, d,
                                   dh.data, d, dwp.data, dwq.data);
  if (!tu_check(st == RMSNORM_OK, "oracle %s d=%zu: %s", tu_dtype_name(dt), d,
                rmsnorm_status_name(st)))
    goto done;
  sw_t *buf = malloc(12 * d * sizeof(sw_t));
  sw_t *ra = buf, *rh = ra + d, *rwp = rh + d, *rwq = rwp + d, *rdho = rwq + d, *rdxn = rdho + d;
  sw_t *hn = rdxn + d, *xn = hn + d, *oda = xn + d, *odh = oda + d, *odwp = odh + d,
       *odwq = odwp + d;
  for (size_t j = 0; j < d; j++) {
    rwp[j] = tu_get(&wp, 0, j), rwq[j] = tu_get(&wq, 0, j);
    odwp[j] = odwq[j] = 0;
  }
  int fwd_ok = 1, bwd_ok = 1;
  for (size_t i = 0; i < rows; i++) {
    for (size_t j = 0; j < d; j++) {
      ra[j] = tu_get(&a, i, j), rh[j] = tu_get(&h0, i, j);
      rdho[j] = tu_get(&dho, i, j), rdxn[j] = tu_get(&dxn, i, j);
    }
    sandwich_forward_row(ra, rh, rwp, rwq, d, 1e-6L, hn, xn);
    fwd_ok &= close_row(&h, i, hn, tol) && close_row(&x, i, xn, tol);
    sandwich_backward_row(ra, rh, rwp, rwq, rdho, rdxn, d, 1e-6L, oda, odh, odwp, odwq);
    /* d = 1: a norm's dx is ~eps/x^2 of its input gradient, a cancellation
     * no rounded computation resolves relative to itself */
    if (d > 1) bwd_ok &= close_row(&da, i, oda, gtol) && close_row(&dh, i, odh, gtol);
  }
  tu_check(fwd_ok, "oracle %s rows=%zu d=%zu: h' or x' off the oracle", tu_dtype_name(dt), rows,
           d);
  tu_check(bwd_ok, "oracle %s rows=%zu d=%zu: da or dh off the oracle", tu_dtype_name(dt), rows,
           d);
  tu_check(close_row(&dwp, 0, odwp, gtol) && close_row(&dwq, 0, odwq, gtol),
           "oracle %s rows=%zu d=%zu: dweights off the oracle", tu_dtype_name(dt), rows, d);
  free(buf);
done:
  tu_free(&a), tu_free(&h), tu_free(&dho), tu_free(&dxn), tu_free(&wp), tu_free(&wq);
  tu_free(&h0), tu_free(&x), tu_free(&da), tu_free(&dh), tu_free(&dwp), tu_free(&dwq);
}

static void test_oracle(void) {
  static const size_t ds[] = {1, 7, 64, 100, 1000, 4096, 8192};
  size_t nd = tu_reduced() ? 4 : sizeof ds / sizeof ds[0];
  rmsnorm_context_set_isa(ctx, RMSNORM_ISA_AUTO);
  rmsnorm_context_set_threads(ctx, 0);
  for (size_t k = 0; k < nd; k++) {
    oracle_case(RMSNORM_F32, 6, ds[k]);
    oracle_case(RMSNORM_F64, 6, ds[k]);
  }
}

/* ---- errors: each bad argument its status, in order, nothing written ---- */

/* Every buffer of the error cases lives in one arena, so "nothing written"
 * is one comparison. */
#define ER 4
#define ED 8
enum { A_A, A_H, A_X, A_DHO, A_DXN, A_DA, A_DH, A_W1, A_W2, A_R1, A_R2, A_DW1, A_DW2, A_N };
static float arena[A_N][ER * 2 * ED + 16], arena0[A_N][ER * 2 * ED + 16];
#define P(k) ((void *)arena[k])

static void arena_reset(void) {
  for (int k = 0; k < A_N; k++)
    for (size_t i = 0; i < sizeof arena[0] / sizeof arena[0][0]; i++)
      arena[k][i] = (float)(0.25 * (double)((i * 7 + (size_t)k * 3) % 17) - 2.0);
  memcpy(arena0, arena, sizeof arena);
}

static void expect(rmsnorm_status st, rmsnorm_status want, const char *what) {
  tu_check(st == want, "%s: %s, want %s", what, rmsnorm_status_name(st),
           rmsnorm_status_name(want));
  tu_check(!memcmp(arena, arena0, sizeof arena), "%s: a buffer was written", what);
  memcpy(arena, arena0, sizeof arena);
}

/* The forward with one argument changed from a valid call. */
typedef struct fargs {
  rmsnorm_context *c;
  const rmsnorm_config *cfg;
  size_t rows, d;
  const void *a;
  size_t lda;
  void *h;
  size_t ldh;
  const void *wp, *wq;
  void *x;
  size_t ldx;
  void *rp, *rq;
} fargs;

static rmsnorm_status fcall(fargs f) {
  return rmsnorm_sandwich_forward(f.c, f.cfg, f.rows, f.d, f.a, f.lda, f.h, f.ldh, f.wp, f.wq,
                                  f.x, f.ldx, f.rp, f.rq);
}

typedef struct bargs {
  rmsnorm_context *c;
  const rmsnorm_config *cfg;
  size_t rows, d;
  const void *a;
  size_t lda;
  const void *h;
  size_t ldh;
  const void *dho;
  size_t lddho;
  const void *dxn;
  size_t lddxn;
  const void *wp, *wq, *rp, *rq;
  void *da;
  size_t ldda;
  void *dh;
  size_t lddh;
  void *dwp, *dwq;
} bargs;

static rmsnorm_status bcall(bargs b) {
  return rmsnorm_sandwich_backward(b.c, b.cfg, b.rows, b.d, b.a, b.lda, b.h, b.ldh, b.dho,
                                   b.lddho, b.dxn, b.lddxn, b.wp, b.wq, b.rp, b.rq, b.da, b.ldda,
                                   b.dh, b.lddh, b.dwp, b.dwq);
}

/* the call with f (b) gives RMSNORM_ERROR_<code> and writes nothing */
#define FX(code, what) expect(fcall(f), RMSNORM_ERROR_##code, what)
#define BX(code, what) expect(bcall(b), RMSNORM_ERROR_##code, what)

static void test_errors(void) {
  rmsnorm_context_set_isa(ctx, RMSNORM_ISA_AUTO);
  rmsnorm_config cfg, bad;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  cfg.flags = RMSNORM_FLAG_WEIGHT_OFFSET;
  arena_reset();
  const size_t ld = 2 * ED; /* room for interleaved and shifted views */
  fargs f0 = {ctx, &cfg, ER, ED, P(A_A), ld, P(A_H), ld, P(A_W1), P(A_W2), P(A_X), ld, P(A_R1),
              P(A_R2)};
  fargs f;
  /* a valid call writes (the arena then restored) */
  tu_check(fcall(f0) == RMSNORM_OK && memcmp(arena, arena0, sizeof arena), "forward: valid call");
  memcpy(arena, arena0, sizeof arena);
  f = f0, f.c = NULL, FX(NULL_POINTER, "forward ctx NULL");
  f = f0, f.cfg = NULL, FX(NULL_POINTER, "forward cfg NULL");
  bad = cfg, bad.size = 3, f = f0, f.cfg = &bad;
  FX(BAD_CONFIG, "forward cfg size");
  bad = cfg, bad.dtype = (rmsnorm_dtype)9, f = f0, f.cfg = &bad;
  FX(BAD_DTYPE, "forward dtype");
  bad = cfg, bad.flags |= RMSNORM_FLAG_ACCUMULATE, f = f0, f.cfg = &bad;
  FX(BAD_FLAGS, "forward ACCUMULATE");
  bad = cfg, bad.flags |= 1u << 20, f = f0, f.cfg = &bad;
  FX(BAD_FLAGS, "forward unknown flag");
  bad = cfg, bad.eps = -1, f = f0, f.cfg = &bad;
  FX(BAD_EPS, "forward eps");
  bad = cfg, bad.partial = 0, f = f0, f.cfg = &bad;
  FX(BAD_PARTIAL, "forward partial");
  f = f0, f.d = 0, FX(BAD_SIZE, "forward d 0");
  f = f0, f.rows = SIZE_MAX, FX(BAD_SIZE, "forward rows huge");
  f = f0, f.lda = ED - 1, FX(BAD_STRIDE, "forward lda < d");
  f = f0, f.ldh = ED - 1, FX(BAD_STRIDE, "forward ldh < d");
  f = f0, f.ldx = ED - 1, FX(BAD_STRIDE, "forward ldxn < d");
  /* the order: context, config, size, strides, pointers, overlaps */
  f = f0, f.c = NULL, f.d = 0, FX(NULL_POINTER, "forward ctx first");
  bad = cfg, bad.eps = -1, f = f0, f.cfg = &bad, f.d = 0;
  FX(BAD_EPS, "forward config before size");
  f = f0, f.lda = 1, f.a = NULL, FX(BAD_STRIDE, "forward stride first");
  f = f0, f.rows = 0, f.a = NULL, f.h = NULL, f.x = NULL;
  expect(fcall(f), RMSNORM_OK, "forward rows 0, NULL buffers");
  f = f0, f.a = NULL, FX(NULL_POINTER, "forward a NULL");
  f = f0, f.h = NULL, FX(NULL_POINTER, "forward h NULL");
  f = f0, f.x = NULL, FX(NULL_POINTER, "forward x_next NULL");
  f = f0, f.a = NULL, f.h = P(A_A), FX(NULL_POINTER, "forward NULL before overlap");
  f = f0, f.x = P(A_H), FX(OVERLAP, "forward x_next = h");
  f = f0, f.h = P(A_A), FX(OVERLAP, "forward h = a");
  f = f0, f.x = P(A_A), f.ldx = ED, FX(OVERLAP, "forward x_next = a, other ld");
  f = f0, f.x = (float *)P(A_A) + 1, FX(OVERLAP, "forward x_next = a shifted");
  f = f0, f.rp = P(A_H), FX(OVERLAP, "forward rstd_post in h");
  f = f0, f.rq = P(A_X), FX(OVERLAP, "forward rstd_pre in x_next");
  f = f0, f.rq = P(A_R1), FX(OVERLAP, "forward rstd_pre = rstd_post");
  f = f0, f.rp = P(A_A), FX(OVERLAP, "forward rstd_post in a");
  f = f0, f.wq = P(A_H), FX(OVERLAP, "forward weight_pre in h");
  f = f0, f.wp = (float *)P(A_X) + ld, FX(OVERLAP, "forward weight_post in x_next");
  /* allowed: x' over a (same ld), interleaved views, no weights, no stats */
  f = f0, f.x = P(A_A);
  tu_check(fcall(f) == RMSNORM_OK, "forward x_next = a");
  memcpy(arena, arena0, sizeof arena);
  f = f0, f.x = (float *)P(A_H) + ED;
  tu_check(fcall(f) == RMSNORM_OK, "forward x_next interleaved with h");
  memcpy(arena, arena0, sizeof arena);
  f = f0, f.wp = f.wq = NULL, f.rp = f.rq = NULL;
  tu_check(fcall(f) == RMSNORM_OK, "forward no weights, no stats");
  memcpy(arena, arena0, sizeof arena);

  bargs b0 = {ctx, &cfg, ER, ED, P(A_A), ld, P(A_H), ld, P(A_DHO), ld, P(A_DXN), ld, P(A_W1),
              P(A_W2), P(A_R1), P(A_R2), P(A_DA), ld, P(A_DH), ld, P(A_DW1), P(A_DW2)};
  bargs b;
  arena_reset();
  /* saved rstd of finite values (the arena's are) */
  tu_check(bcall(b0) == RMSNORM_OK && memcmp(arena, arena0, sizeof arena), "backward: valid call");
  memcpy(arena, arena0, sizeof arena);
  b = b0, b.c = NULL, BX(NULL_POINTER, "backward ctx NULL");
  b = b0, b.cfg = NULL, BX(NULL_POINTER, "backward cfg NULL");
  bad = cfg, bad.param_dtype = RMSNORM_F16, b = b0, b.cfg = &bad;
  BX(BAD_DTYPE, "backward param dtype");
  bad = cfg, bad.eps = NAN, b = b0, b.cfg = &bad;
  BX(BAD_EPS, "backward eps NaN");
  b = b0, b.d = 0, BX(BAD_SIZE, "backward d 0");
  b = b0, b.lda = 1, BX(BAD_STRIDE, "backward lda");
  b = b0, b.ldh = 1, BX(BAD_STRIDE, "backward ldh");
  b = b0, b.lddho = 1, BX(BAD_STRIDE, "backward lddh_out");
  b = b0, b.lddxn = 1, BX(BAD_STRIDE, "backward lddxn");
  b = b0, b.ldda = 1, BX(BAD_STRIDE, "backward ldda");
  b = b0, b.lddh = 1, BX(BAD_STRIDE, "backward lddh");
  b = b0, b.dwp = P(A_DW1), b.wp = NULL;
  BX(BAD_ARGUMENT, "backward dweight_post without weight_post");
  b = b0, b.wq = NULL, BX(BAD_ARGUMENT, "backward dweight_pre without weight_pre");
  b = b0, b.wq = NULL, b.rows = 0;
  BX(BAD_ARGUMENT, "backward bad argument before rows 0");
  b = b0, b.lddh = 1, b.wq = NULL, BX(BAD_STRIDE, "backward stride first");
  b = b0, b.rows = 0, b.a = b.h = b.dxn = NULL, b.da = b.dh = NULL;
  expect(bcall(b), RMSNORM_OK, "backward rows 0, NULL buffers");
  /* no dh_out: its stride is not looked at */
  b = b0, b.dho = NULL, b.lddho = 0;
  tu_check(bcall(b) == RMSNORM_OK, "backward dh_out NULL, its ld 0");
  memcpy(arena, arena0, sizeof arena);
  b = b0, b.a = NULL, BX(NULL_POINTER, "backward a NULL");
  b = b0, b.h = NULL, BX(NULL_POINTER, "backward h NULL");
  b = b0, b.dxn = NULL, BX(NULL_POINTER, "backward dx_next NULL");
  b = b0, b.da = NULL, BX(NULL_POINTER, "backward da NULL");
  b = b0, b.dh = NULL, BX(NULL_POINTER, "backward dh NULL");
  b = b0, b.dh = NULL, b.da = P(A_DH), BX(NULL_POINTER, "backward NULL before overlap");
  b = b0, b.da = P(A_DH), BX(OVERLAP, "backward da = dh");
  b = b0, b.da = b.dh = P(A_DXN), BX(OVERLAP, "backward da = dh = dx_next");
  b = b0, b.da = P(A_DHO), BX(OVERLAP, "backward da = dh_out");
  b = b0, b.da = P(A_H), BX(OVERLAP, "backward da = h");
  b = b0, b.dh = P(A_A), BX(OVERLAP, "backward dh = a");
  b = b0, b.dh = P(A_H), BX(OVERLAP, "backward dh = h");
  b = b0, b.dh = P(A_DHO), b.lddh = ED, BX(OVERLAP, "backward dh = dh_out, other ld");
  b = b0, b.da = (float *)P(A_A) + 1, BX(OVERLAP, "backward da = a shifted");
  b = b0, b.dwq = P(A_DW1), BX(OVERLAP, "backward dweight_pre = dweight_post");
  b = b0, b.dwp = P(A_A), BX(OVERLAP, "backward dweight_post in a");
  b = b0, b.dwq = P(A_DH), BX(OVERLAP, "backward dweight_pre in dh");
  b = b0, b.dwp = P(A_W1), BX(OVERLAP, "backward dweight_post = weight_post");
  b = b0, b.rq = P(A_DA), BX(OVERLAP, "backward rstd_pre in da");
  b = b0, b.rp = P(A_DH), BX(OVERLAP, "backward rstd_post in dh");
  b = b0, b.wq = P(A_DA), BX(OVERLAP, "backward weight_pre in da");
  b = b0, b.wp = (float *)P(A_DH) + ld, BX(OVERLAP, "backward weight_post in dh");
  /* allowed: the in-place views and interleaved ones; ACCUMULATE */
  static const char *const ok_names[] = {"dh = dh_out", "dh = dx_next", "da = a", "da = dx_next",
                                         "dh = dh_out, da = a", "dh = dx_next, da = a",
                                         "da interleaved with dh", "ACCUMULATE"};
  for (int k = 0; k < 8; k++) {
    b = b0;
    if (k == 0 || k == 4) b.dh = P(A_DHO);
    if (k == 1 || k == 5) b.dh = P(A_DXN);
    if (k == 2 || k == 4 || k == 5) b.da = P(A_A);
    if (k == 3) b.da = P(A_DXN);
    if (k == 6) b.da = (float *)P(A_DH) + ED;
    bad = cfg, bad.flags |= RMSNORM_FLAG_ACCUMULATE;
    if (k == 7) b.cfg = &bad;
    tu_check(bcall(b) == RMSNORM_OK, "backward %s", ok_names[k]);
    memcpy(arena, arena0, sizeof arena);
  }
}

int main(void) {
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) {
    fprintf(stderr, "context\n");
    return 2;
  }
  tu_seed(0x5a4d);
  printf("kernel sets available: %d\n", nsets());
  test_errors();
  test_oracle();
  test_bits();
  rmsnorm_context_free(ctx);
  return tu_finish("test_sandwich");
}
