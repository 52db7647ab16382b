/* test_isa.c - every kernel set this machine runs gives the same bits as the
 * scalar reference, for every op, dtype and variant, on ragged d, odd
 * strides, misaligned rows and in place; and results do not depend on the
 * thread count. Together with the oracle tests (run on the default set),
 * this holds every ISA to the numerics promises. */
#include "testutil.h"

typedef struct run_spec {
  rmsnorm_dtype dt, pdt;
  int layernorm, backward;
  size_t rows, d, ld_in, ld_out;
  int weight, bias, dw, db, saved, inplace;
  unsigned flags;
  double eps, partial;
  int aligned; /* x, dy and the output on 64-byte boundaries (else malloc's) */
} run_spec;

/* Set while a case's backward also meets rows that leave a group's shared
 * path: row 5's saved r unusable (0: recomputed from x) and row 11's dy so
 * large that its sums overflow (the rescue path; fp16 sums cannot). */
static int edge_rows;

/* Runs one op on ctx with fixed inputs (seeded); returns the output bytes
 * (y or dx, then stats or dweight/dbias) in a malloc'd buffer. */
static unsigned char *run_once(rmsnorm_context *ctx, const run_spec *s, uint64_t seed,
                               size_t *nbytes, rmsnorm_status *st) {
  tu_seed(seed);
  size_t rows = s->rows, d = s->d, es = rn_dtype_size(s->dt), as = rn_acc_size(s->dt);
  tu_tensor x = tu_alloc_at(s->dt, rows, d, s->ld_in, s->aligned);
  tu_tensor dy = tu_alloc_at(s->dt, rows, d, s->ld_in, s->aligned);
  tu_tensor out = tu_alloc_at(s->dt, rows, d, s->ld_out, s->aligned);
  /* large tensors: uniform values, far cheaper to draw than normal ones */
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < d; j++) {
      tu_set(&x, i, j, rows * d > 100000 ? 4 * tu_uniform() - 2 : tu_normal());
      tu_set(&dy, i, j, rows * d > 100000 ? 4 * tu_uniform() - 2 : tu_normal());
    }
  /* a few rows the fast path cannot trust, to cover the rescue path */
  if (rows > 3)
    for (size_t j = 0; j < d; j++) tu_set(&x, 2, j, s->dt == RMSNORM_F64 ? 1e200 : s->dt == RMSNORM_F16 ? 1000.0 : 1e30);
  tu_tensor w = tu_alloc(s->pdt, 1, d, d), b = tu_alloc(s->pdt, 1, d, d);
  tu_tensor dw = tu_alloc(s->pdt, 1, d, d), db = tu_alloc(s->pdt, 1, d, d);
  for (size_t j = 0; j < d; j++) {
    tu_set(&w, 0, j, 1 + 0.2 * tu_normal());
    tu_set(&b, 0, j, tu_normal());
    tu_set(&dw, 0, j, tu_normal());
    tu_set(&db, 0, j, tu_normal());
  }
  void *mean = calloc(rows ? rows : 1, as), *rstd = calloc(rows ? rows : 1, as);
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, s->dt);
  cfg.param_dtype = s->pdt;
  cfg.eps = s->eps;
  cfg.partial = s->partial;
  cfg.flags = s->flags;
  void *wp = s->weight ? w.data : NULL, *bp = s->bias ? b.data : NULL;
  void *o = s->inplace ? (s->backward ? dy.data : x.data) : out.data;
  size_t ldo = s->inplace ? s->ld_in : s->ld_out;
  if (!s->backward) {
    *st = s->layernorm
              ? rmsnorm_layernorm_forward(ctx, &cfg, rows, d, x.data, s->ld_in, wp, bp, o, ldo, mean, rstd)
              : rmsnorm_forward(ctx, &cfg, rows, d, x.data, s->ld_in, wp, bp, o, ldo, rstd);
  } else {
    if (s->saved) {
      tu_tensor y = tu_alloc(s->dt, rows, d, d);
      *st = s->layernorm
                ? rmsnorm_layernorm_forward(ctx, &cfg, rows, d, x.data, s->ld_in, wp, NULL, y.data, d, mean, rstd)
                : rmsnorm_forward(ctx, &cfg, rows, d, x.data, s->ld_in, wp, NULL, y.data, d, rstd);
      tu_free(&y);
      if (edge_rows && rows > 12) memset((char *)rstd + 5 * as, 0, as);
    }
    if (edge_rows && rows > 12 && s->dt != RMSNORM_F16)
      for (size_t j = 0; j < d; j++) tu_set(&dy, 11, j, s->dt == RMSNORM_F64 ? 1e308 : 3e38);
    void *dwp = s->dw && s->weight ? dw.data : NULL, *dbp = s->db ? db.data : NULL;
    *st = s->layernorm
              ? rmsnorm_layernorm_backward(ctx, &cfg, rows, d, x.data, s->ld_in, dy.data, s->ld_in, wp,
                                           s->saved ? mean : NULL, s->saved ? rstd : NULL, o, ldo, dwp, dbp)
              : rmsnorm_backward(ctx, &cfg, rows, d, x.data, s->ld_in, dy.data, s->ld_in, wp,
                                 s->saved ? rstd : NULL, o, ldo, dwp, dbp);
  }
  /* collect: the output rows (not the gaps), then stats or gradients */
  size_t pbytes = d * rn_dtype_size(s->pdt);
  *nbytes = rows * d * es + 2 * rows * as + 2 * pbytes;
  unsigned char *res = malloc(*nbytes ? *nbytes : 1), *p = res;
  for (size_t i = 0; i < rows; i++, p += d * es)
    memcpy(p, (unsigned char *)o + i * ldo * es, d * es);
  memcpy(p, mean, rows * as), p += rows * as;
  memcpy(p, rstd, rows * as), p += rows * as;
  memcpy(p, dw.data, pbytes), p += pbytes;
  memcpy(p, db.data, pbytes);
  free(mean), free(rstd);
  tu_free(&x), tu_free(&dy), tu_free(&out), tu_free(&w), tu_free(&b), tu_free(&dw), tu_free(&db);
  return res;
}

static rmsnorm_context *ref_ctx, *ctxs[4];
static int nctx;

static void compare(const run_spec *s, uint64_t seed) {
  size_t n_ref, n;
  rmsnorm_status st_ref, st;
  unsigned char *want = run_once(ref_ctx, s, seed, &n_ref, &st_ref);
  tu_check(st_ref == RMSNORM_OK, "reference status %s", rmsnorm_status_name(st_ref));
  for (int c = 0; c < nctx; c++) {
    for (int threads = 1; threads <= 3; threads += 2) {
      rmsnorm_context_set_threads(ctxs[c], threads);
      unsigned char *got = run_once(ctxs[c], s, seed, &n, &st);
      rmsnorm_isa isa;
      rmsnorm_context_get_isa(ctxs[c], &isa);
      size_t first = 0;
      while (first < n && got[first] == want[first]) first++;
      tu_check(st == RMSNORM_OK && n == n_ref && first == n,
               "%s threads=%d: %s %s %s pdt=%s rows=%zu d=%zu flags=%u w=%d b=%d dw=%d db=%d "
               "saved=%d ip=%d p=%g eps=%g: first differing byte %zu of %zu",
               rmsnorm_isa_name(isa), threads, s->backward ? "backward" : "forward",
               s->layernorm ? "LN" : "RMS", tu_dtype_name(s->dt), tu_dtype_name(s->pdt), s->rows,
               s->d, s->flags, s->weight, s->bias, s->dw, s->db, s->saved, s->inplace,
               s->partial, s->eps, first, n);
      free(got);
    }
  }
  free(want);
}

/* bf16 outputs at the edges of the conversion: subnormal results (which
 * VCVTNEPS2BF16 would flush), NaN, infinity, zero and rounding ties, in
 * some vectors of a row but not others, forward (y) and backward (dx): every
 * set gives the reference's bits. With many rows the outputs are streamed
 * (past RN_STREAM_BYTES), and rows of 298 bytes start at every alignment:
 * the streamed pairs of vectors (AVX2, AVX512-BF16) meet those edges too. */
static void compare_bf16_edges(size_t rows) {
  const size_t d = 16 * 9 + 5;
  uint16_t *x = malloc(rows * d * 2), *dy = malloc(rows * d * 2);
  uint16_t *want = malloc(rows * d * 2), *got = malloc(rows * d * 2);
  float *w = malloc(d * 4), *rstd = malloc(rows * 4);
  static const float odd[] = {1e-39f, -3e-41f, 1e-45f, 0.0f, NAN, INFINITY, 1e38f, -1e-40f};
  tu_seed(77);
  for (size_t i = 0; i < rows * d; i++) {
    float v = (float)(2 * tu_uniform() - 1);
    uint32_t u;
    memcpy(&u, &v, 4);
    x[i] = (uint16_t)(u >> 16);
    /* dy: vectors 2 and 5 of odd rows tiny, so dx is subnormal there */
    size_t j = i % d, row = i / d;
    float g = (row & 1) && (j / 16 == 2 || j / 16 == 5) ? v * 1e-38f : v;
    memcpy(&u, &g, 4);
    dy[i] = (uint16_t)(u >> 16);
  }
  for (size_t j = 0; j < d; j++) /* vectors 1, 4 and 7 hold the odd weights */
    w[j] = (j / 16) % 3 == 1 ? odd[j % 8] : j % 5 == 0 ? 1.0f + 0x1p-8f : 1.0f + 0.01f * (float)(j % 7);
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_BF16);
  cfg.param_dtype = RMSNORM_F32;
  for (int bw = 0; bw < 2; bw++) {
    rmsnorm_status st =
        bw ? rmsnorm_backward(ref_ctx, &cfg, rows, d, x, d, dy, d, NULL, NULL, want, d, NULL, NULL)
           : rmsnorm_forward(ref_ctx, &cfg, rows, d, x, d, w, NULL, want, d, rstd);
    tu_check(st == RMSNORM_OK, "bf16 edges: reference status %s", rmsnorm_status_name(st));
    for (int c = 0; c < nctx; c++) {
      rmsnorm_isa isa;
      rmsnorm_context_get_isa(ctxs[c], &isa);
      st = bw ? rmsnorm_backward(ctxs[c], &cfg, rows, d, x, d, dy, d, NULL, NULL, got, d, NULL, NULL)
              : rmsnorm_forward(ctxs[c], &cfg, rows, d, x, d, w, NULL, got, d, rstd);
      size_t first = 0;
      while (first < rows * d && got[first] == want[first]) first++;
      tu_check(st == RMSNORM_OK && first == rows * d,
               "%s: bf16 %s with subnormal/NaN/inf outputs: first differing element %zu "
               "(0x%04x, want 0x%04x)",
               rmsnorm_isa_name(isa), bw ? "backward" : "forward", first,
               first < rows * d ? got[first] : 0, first < rows * d ? want[first] : 0);
    }
  }
  free(x), free(dy), free(want), free(got), free(w), free(rstd);
}

int main(void) {
  static const rmsnorm_isa isas[] = {RMSNORM_ISA_AVX2, RMSNORM_ISA_AVX512, RMSNORM_ISA_NEON};
  if (rmsnorm_context_create(&ref_ctx) != RMSNORM_OK) return 2;
  rmsnorm_context_set_isa(ref_ctx, RMSNORM_ISA_SCALAR);
  rmsnorm_context_set_threads(ref_ctx, 1);
  for (int i = 0; i < 3; i++) {
    rmsnorm_context *c;
    if (rmsnorm_context_create(&c) != RMSNORM_OK) return 2;
    if (rmsnorm_context_set_isa(c, isas[i]) != RMSNORM_OK) {
      printf("test_isa: %s not available here, not tested\n", rmsnorm_isa_name(isas[i]));
      rmsnorm_context_free(c);
      continue;
    }
    ctxs[nctx++] = c;
  }
  /* the reference also against itself across thread counts (natively: under
   * emulation the fast sets' runs on 1 and 3 threads suffice) */
  if (!tu_reduced()) {
    if (rmsnorm_context_create(&ctxs[nctx]) != RMSNORM_OK) return 2;
    rmsnorm_context_set_isa(ctxs[nctx++], RMSNORM_ISA_SCALAR);
  }

  uint64_t seed = 100;
  static const size_t small[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 129,
                                 255, 1023, 1024, 1025, 2049};
  for (int dt = 0; dt < 4; dt++)
    for (int ln = 0; ln < 2; ln++)
      for (int bw = 0; bw < 2; bw++)
        for (size_t si = 0; si < sizeof small / sizeof *small; si++)
          for (int v = 0; v < 4; v++, seed++) {
            size_t d = small[si];
            /* reduced: the sizes past 129 with one variant each */
            if (tu_reduced() && d > 129 && v != (int)(si % 4)) continue;
            run_spec s = {(rmsnorm_dtype)dt, v & 1 ? RMSNORM_F32 : (rmsnorm_dtype)dt, ln, bw,
                          5, d, d + (v >= 2 ? 3 : 0), d + (v == 1 ? 1 : 0),
                          v != 3, v & 1, v != 2, v != 1, v & 2, v == 3, 0, 1e-5, 1.0, 0};
            if (!ln) {
              s.flags |= v == 1 ? RMSNORM_FLAG_EPS_OUTSIDE : 0;
              s.partial = v == 2 ? 0.4 : 1.0;
            }
            s.flags |= v == 2 ? RMSNORM_FLAG_WEIGHT_OFFSET : 0;
            s.flags |= (v == 3 && !bw) ? RMSNORM_FLAG_ROUND_BEFORE_WEIGHT : 0;
            s.flags |= (v == 1 && bw) ? RMSNORM_FLAG_ACCUMULATE : 0;
            compare(&s, seed);
          }
  /* large: threads split rows and chunks; outputs of 1 MiB and more are
   * streamed (fp32: 1100 x 4101 x 4 bytes; the fp16/bf16 forward: 2050 x
   * 4101 x 2, its output rows 8204 bytes apart, so at every 4-byte alignment),
   * from 4 MiB with the repeated prefetches (fp32; fp64: 600 x 1000 x 8) */
  for (int dt = 0; dt < 4; dt++)
    for (int ln = 0; ln < 2; ln++)
      for (int bw = 0; bw < 2; bw++, seed++) {
        size_t d = dt == RMSNORM_F64 ? 1000 : 4096 + 5;
        int half = dt == RMSNORM_F16 || dt == RMSNORM_BF16;
        size_t rows = dt == RMSNORM_F32 && ln == bw ? 1100
                      : dt == RMSNORM_F64 && ln == bw ? 600
                      : half && !bw                   ? 2050
                                                      : 300;
        /* reduced: streamed once (fp32 RMSNorm forward), the rest on fewer rows
         * (still split across threads) */
        if (tu_reduced() && !(dt == RMSNORM_F32 && !ln && !bw)) rows = 70;
        run_spec s = {(rmsnorm_dtype)dt, RMSNORM_F32, ln, bw, rows, d, d, d + 1,
                      1, 1, 1, 1, bw, 0, 0, 1e-6, 1.0, 0};
        compare(&s, seed);
      }
  /* the RMSNorm forward on rows that start on 64-byte lines (torch's
   * layout; malloc's blocks above start 16 bytes past one) and hold whole
   * lane groups, past the streaming threshold: no partial vectors, streamed
   * pairs from each row's start; row 2 through the rescue path between
   * streamed rows; d = 1088 and 4096, every dtype and option; fp32 and fp64
   * past 4 MiB, where their prefetches repeat */
  for (int dt = 0; dt < 4; dt++)
    for (int v = 0; v < 4; v++, seed++) {
      if (tu_reduced() && (dt != RMSNORM_F32 || v)) continue; /* reduced: one */
      size_t d = v % 2 ? 4096 : 1088, es = dt == RMSNORM_F64 ? 8 : dt == RMSNORM_F32 ? 4 : 2;
      size_t rows = ((size_t)(es >= 4 ? 4 : 1) << 20) / (d * es) + 5 + (size_t)v;
      unsigned flags = v == 1 ? RMSNORM_FLAG_EPS_OUTSIDE
                       : v == 2 ? RMSNORM_FLAG_WEIGHT_OFFSET
                       : v == 3 && es == 2 ? RMSNORM_FLAG_ROUND_BEFORE_WEIGHT : 0;
      run_spec s = {(rmsnorm_dtype)dt, v & 1 ? RMSNORM_F32 : (rmsnorm_dtype)dt, 0, 0, rows, d,
                    d + (v == 3 ? 7 : 0), d, v != 3, v == 1 || v == 2, 0, 0, 0, 0, flags, 1e-6,
                    1.0, 1};
      compare(&s, seed);
    }
  /* many short rows past the streaming threshold (fp32: 42003 x 101 x 4
   * bytes): row groups, and the prefetch of the next group */
  for (int ln = 0; ln < 2; ln++)
    for (int bw = 0; bw < 2; bw++, seed++) {
      if (tu_reduced() && (ln || bw)) continue; /* reduced: the RMSNorm forward */
      run_spec s = {RMSNORM_F32, RMSNORM_F32, ln, bw, 42003, 101, 101, 101,
                    1, 1, 1, 1, bw, 0, 0, 1e-6, 1.0, 0};
      compare(&s, seed);
    }
  /* short rows of fp32 and fp64 whose call moves 32 MiB or more
   * (RN_PAST_L3_BYTES), in place (y = x, dx = dy: not streamed) and apart:
   * where a vector is a whole line (AVX-512) they leave the groups of 8, the
   * forward's one at a time and the backward's in pairs (an odd count: a
   * last row alone); the backward with a saved r whose rows 5 and 11 leave
   * the fast path (edge_rows) */
  for (int v = 0; v < 4; v++, seed++) {
    if (tu_reduced()) continue; /* a path of line-sized vectors only */
    int f64 = v >> 1, bw = v & 1, inplace = v == 0 || v == 3;
    size_t rows = (((size_t)32 << 20) / ((bw ? 3 : 2) * 128 * (f64 ? 8 : 4)) + 1) | 1;
    edge_rows = bw;
    run_spec s = {f64 ? RMSNORM_F64 : RMSNORM_F32, RMSNORM_F32, 0, bw, rows, 128, 128, 128, 1,
                  0, bw, 0, bw, inplace, 0, 1e-6, 1.0, 1};
    compare(&s, seed);
    edge_rows = 0;
  }
  /* the same in bf16 (rows 202 bytes apart: two rows meet inside a streamed
   * vector at every offset, and their partial vectors are joined), and
   * pRMSNorm, whose backward splits each row at k */
  for (int bw = 0; bw < 2; bw++, seed++) {
    if (tu_reduced()) continue;
    run_spec h = {RMSNORM_BF16, RMSNORM_F32, 0, bw, 84003, 101, 101, 101,
                  1, 1, 1, 1, bw, 0, 0, 1e-6, 1.0, 0};
    compare(&h, seed);
    run_spec p = {RMSNORM_F32, RMSNORM_F32, 0, bw, 42003, 101, 101, 101,
                  1, 0, 1, 0, bw, 0, 0, 1e-6, 0.4, 0};
    compare(&p, seed);
  }
  /* short rows whose dx rows share an offset to a vector boundary (ld_out a
   * multiple of 16 elements), past the streaming threshold: the backward's
   * pass 2 streams two rows at once. Whole vectors on 64-byte lines (fp32,
   * DRAM-sized); at malloc's 16-byte offset, each row's partial head and tail
   * meet the other row's in the join (LayerNorm with bias, x at its own
   * stride; bf16); rows of 120 in 128 with pRMSNorm's split at k */
  for (int v = 0; v < 4; v++, seed++) {
    if (tu_reduced() && v) continue; /* reduced: one */
    run_spec s = {v == 3 ? RMSNORM_BF16 : RMSNORM_F32, RMSNORM_F32, v == 1, 1, 9001 + (size_t)v,
                  v == 2 ? 120 : 128, v == 1 ? 131 : 128, 128, 1, v == 1, 1, v == 1, v != 2, 0,
                  0, 1e-6, v == 2 ? 0.4 : 1.0, v == 0 || v == 2};
    compare(&s, seed);
  }
  /* the RMSNorm backward of short rows in whole groups of 8 (their sums'
   * last steps shared) with a saved r, where rows 5 and 11 leave the group's
   * path (edge_rows); every dtype, with and without a weight, pRMSNorm;
   * fp32 also streamed past the threshold */
  edge_rows = 1;
  for (int dt = 0; dt < 4; dt++)
    for (int v = 0; v < 3; v++, seed++) {
      if (tu_reduced() && (dt == RMSNORM_F16 || dt == RMSNORM_F64)) continue;
      size_t rows = v == 2 && dt == RMSNORM_F32 ? 9001 : 43, d = v == 1 ? 33 : 128;
      run_spec s = {(rmsnorm_dtype)dt, RMSNORM_F32, 0, 1, rows, d, d, d, v != 1, 0, v != 1, 0,
                    1, 0, 0, 1e-6, v == 1 ? 0.6 : 1.0, 0};
      compare(&s, seed);
    }
  edge_rows = 0;
  /* many rows: more than 64 backward chunks of 64 rows, so the dweight and
   * dbias reduction sums chunks in groups (work.h) */
  for (int dt = 0; dt < 4; dt++)
    for (int ln = 0; ln < 2; ln++, seed++) {
      if (tu_reduced() && (dt == RMSNORM_F16 || dt == RMSNORM_F64)) continue;
      run_spec s = {(rmsnorm_dtype)dt, dt % 2 ? RMSNORM_F32 : (rmsnorm_dtype)dt, ln, 1, 5000, 33,
                    35, 33, 1, 1, 1, 1, dt & 2, 0, dt == 1 ? RMSNORM_FLAG_ACCUMULATE : 0, 1e-5,
                    1.0, 0};
      compare(&s, seed);
    }
  /* one long row, and two: split across threads by columns (at least 1 MiB
   * of traffic per thread) */
  for (int dt = 0; dt < 4; dt++)
    for (int ln = 0; ln < 2; ln++)
      for (int bw = 0; bw < 2; bw++, seed++) {
        size_t d = (dt == RMSNORM_F64 ? 150000 : dt == RMSNORM_F32 ? 300000 : 600000) + 3;
        /* reduced: fp32, and the bf16 backward (the others take the same split) */
        if (tu_reduced() && dt != RMSNORM_F32 && !(dt == RMSNORM_BF16 && ln && bw)) continue;
        run_spec s = {(rmsnorm_dtype)dt, RMSNORM_F32, ln, bw, 1 + (size_t)bw, d, d, d + 1,
                      1, 1, 1, 1, bw, 0, 0, 1e-6, ln ? 1.0 : 0.7, 0};
        compare(&s, seed);
      }
  compare_bf16_edges(6);
  if (!tu_reduced()) compare_bf16_edges(56400); /* 16.0 MiB of outputs */
  for (int c = 0; c < nctx; c++) rmsnorm_context_free(ctxs[c]);
  rmsnorm_context_free(ref_ctx);
  return tu_finish("test_isa");
}
