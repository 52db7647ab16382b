/* bench_fused.c - the fused ops against their unfused paths: best
 * of N wall-clock times, at 1 thread and at all threads.
 *   add:    rmsnorm_add_forward vs (h += u, threads as many) + rmsnorm_forward
 *   qk:     rmsnorm_qk_norm_forward on Q inside a [T, 3, H, hd] QKV buffer vs
 *           rmsnorm_forward on contiguous (T*H) x hd rows
 *   quant:  rmsnorm_forward_quantized in each format (per row, per group,
 *           Q8_0, Q8_K, MXFP8, MXFP4) vs rmsnorm_forward, and the fused add
 *           + quantize vs rmsnorm_add_forward, at 4096x4096 and 16x4096;
 *           interleaved rounds, medians (the others: best of N)
 *   linear: rmsnorm_linear_forward vs rmsnorm_forward + cblas_sgemm
 *   sandwich: rmsnorm_sandwich_forward (Gemma's h' = h + post_norm(a), x' =
 *           pre_norm(h')) vs the three separate calls: rmsnorm_forward into
 *           a temporary, h += it (a plain C loop, threads as many from 1M
 *           elements, one below: a thread's start costs more there), and
 *           rmsnorm_forward of h'; fp32 and bf16 at 4096x4096 and 16x4096;
 *           interleaved rounds, medians
 *   gated:  rmsnorm_gated_forward / _backward (Mamba2's gate first, and
 *           Qwen3-Next's norm first) against the copy limit of their own
 *           bytes (forward: x, z read, y written; backward: x, z, dy read,
 *           dx, dz written): the best of memcpy and non-temporal copies
 *           (bench_copy.c) moving the same byte total between the op's own
 *           buffers on as many threads; fp32 4096x4096; interleaved rounds,
 *           medians
 *   rope:   rmsnorm_qk_norm_rope_forward on Q (32 heads) and K (8 heads) in
 *           place in a [T, 32 + 8 + 8, 128] QKV buffer (one call each) vs
 *           the unfused composition: rmsnorm_qk_norm_forward on Q and K, then
 *           a separate NeoX rotation pass over the same rows (a plain C loop,
 *           compiled for AVX-512/AVX2 where the CPU has them, as the
 *           library's kernels are; threads as many from 1M elements);
 *           fp32 and bf16, decode (T = 1) and prefill (T = 512), 1 and 2
 *           threads, with each step of the unfused composition also timed
 *           alone: "qk-norm share" = qk / (qk + rotation) is the ratio a
 *           fused op would reach if it cost what QK-norm alone does (it does
 *           all of QK-norm's work, and its rotation besides); then the fused
 *           op against the copy limit of its own
 *           bytes at 65536 x 128 (one head per token: x read, y written,
 *           the table's row of each token read), and the backward against
 *           its own (x, dy and the table read, dx written; rstd saved by the
 *           forward, dweight summed), each also on its first 512 rows in
 *           cache (what a row's arithmetic costs where memory is free, to set
 *           beside the copy limit a row); interleaved rounds, medians
 * usage: bench_fused [add|qk|quant|linear|sandwich|gated|rope|all] [reps] */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_copy.h"
#include "bench_stats.h"
#include "rmsnorm.h"
#ifdef BENCH_HAVE_BLAS
#include <cblas.h>
#endif

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

static float *randf(size_t n) {
  float *p = xmalloc(n * sizeof *p);
  unsigned s = 12345;
  for (size_t i = 0; i < n; i++) {
    s = s * 1103515245u + 12345u;
    p[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
  }
  return p;
}

static int reps = 20;
#define BEST(var, stmt)                              \
  do {                                               \
    var = 1e30;                                      \
    for (int r_ = 0; r_ < reps; r_++) {              \
      double t0_ = now();                            \
      stmt;                                          \
      double t_ = now() - t0_;                       \
      if (t_ < var) var = t_;                        \
    }                                                \
  } while (0)

/* bf16 bit patterns: to float exactly, from float rounded to nearest even
 * (no NaN here) */
static float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* the unfused add: h += u (fp32, or bf16 through float) split over threads
 * like the library splits rows */
typedef struct add_part {
  void *h;
  const void *u;
  size_t n;
  int bf16;
} add_part;

static void *add_run(void *p) {
  add_part *a = p;
  if (a->bf16) {
    uint16_t *h = a->h;
    const uint16_t *u = a->u;
    for (size_t i = 0; i < a->n; i++) h[i] = f32_to_bf16(bf16_to_f32(h[i]) + bf16_to_f32(u[i]));
  } else {
    float *h = a->h;
    const float *u = a->u;
    for (size_t i = 0; i < a->n; i++) h[i] += u[i];
  }
  return NULL;
}

static void add_threads_of(void *h, const void *u, size_t n, int threads, int bf16) {
  pthread_t th[64];
  add_part parts[64];
  size_t es = bf16 ? 2 : 4;
  for (int t = 0; t < threads; t++) {
    size_t b = n * (size_t)t / (size_t)threads, e = n * (size_t)(t + 1) / (size_t)threads;
    parts[t] = (add_part){(char *)h + b * es, (const char *)u + b * es, e - b, bf16};
    if (t) pthread_create(&th[t], NULL, add_run, &parts[t]);
  }
  add_run(&parts[0]);
  for (int t = 1; t < threads; t++) pthread_join(th[t], NULL);
}

static void add_threads(float *h, const float *u, size_t n, int threads) {
  add_threads_of(h, u, n, threads, 0);
}

static int all_threads(rmsnorm_context *ctx) {
  int t;
  rmsnorm_context_set_threads(ctx, 0);
  rmsnorm_context_get_threads(ctx, &t);
  return t;
}

static void bench_add(rmsnorm_context *ctx, size_t rows, size_t d) {
  size_t n = rows * d;
  float *h = randf(n), *u = randf(n), *y = xmalloc(n * sizeof *y), *w = randf(d);
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  int most = all_threads(ctx);
  for (int threads = 1; threads <= most; threads = threads == most ? most + 1 : most) {
    rmsnorm_context_set_threads(ctx, threads);
    double fused, unfused;
    BEST(fused, rmsnorm_add_forward(ctx, &cfg, rows, d, h, d, u, d, w, NULL, y, d, NULL));
    BEST(unfused, (add_threads(h, u, n, threads),
                   rmsnorm_forward(ctx, &cfg, rows, d, h, d, w, NULL, y, d, NULL)));
    printf("add+rmsnorm f32 %zux%zu threads=%d: fused %.3f ms (%.1f GB/s), add-then-norm %.3f ms, "
           "speedup %.2fx\n",
           rows, d, threads, fused * 1e3, 16.0 * (double)n / fused * 1e-9, unfused * 1e3,
           unfused / fused);
  }
  free(h), free(u), free(y), free(w);
}

static void bench_qk(rmsnorm_context *ctx, size_t tokens, size_t heads, size_t hd) {
  size_t rows = tokens * heads, n = rows * hd;
  float *qkv = randf(3 * n), *flat = randf(n), *w = randf(hd);
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  int most = all_threads(ctx);
  for (int threads = 1; threads <= most; threads = threads == most ? most + 1 : most) {
    rmsnorm_context_set_threads(ctx, threads);
    double qk, plain;
    /* in place, as in an attention block */
    BEST(qk, rmsnorm_qk_norm_forward(ctx, &cfg, tokens, heads, hd, qkv, 3 * heads * hd, hd, w,
                                     NULL, qkv, 3 * heads * hd, hd, NULL));
    BEST(plain, rmsnorm_forward(ctx, &cfg, rows, hd, flat, hd, w, NULL, flat, hd, NULL));
    printf("qk-norm f32 %zu tokens x %zu heads x %zu in QKV, threads=%d: %.3f ms; plain %zux%zu: "
           "%.3f ms; ratio plain/qk %.2f\n",
           tokens, heads, hd, threads, qk * 1e3, rows, hd, plain * 1e3, plain / qk);
  }
  free(qkv), free(flat), free(w);
}


/* The quantized outputs against the fp32-output forward of the same rows
 * (and the fused add + quantize against the fused add with an fp32 output),
 * timed interleaved in each round (a shared machine's drift hits all alike):
 * median times and the median of the rounds' ratios. In-cache shapes repeat
 * each call `inner` times a round. */
typedef struct qcase {
  const char *name;
  rmsnorm_qformat format;
  size_t group;
  unsigned flags;
} qcase;
static const qcase qcases[] = {
    {"int8/row", RMSNORM_QF_INT8, 0, 0},          {"fp8/row", RMSNORM_QF_FP8_E4M3, 0, 0},
    {"int8/g128", RMSNORM_QF_INT8, 128, 0},
    {"fp8/g128+ue8m0", RMSNORM_QF_FP8_E4M3, 128, RMSNORM_QUANT_SCALE_POW2},
    {"q8_0", RMSNORM_QF_Q8_0, 0, 0},              {"q8_k", RMSNORM_QF_Q8_K, 0, 0},
    {"mxfp8", RMSNORM_QF_MXFP8_E4M3, 0, 0},       {"mxfp4", RMSNORM_QF_MXFP4, 0, 0},
};
#define NQ (sizeof qcases / sizeof qcases[0])

static void bench_quant(rmsnorm_context *ctx, size_t rows, size_t d, int add) {
  size_t n = rows * d;
  float *x = randf(n), *u = randf(n), *y = xmalloc(n * sizeof *y), *w = randf(d);
  unsigned char *codes = xmalloc(2 * n), *scales = xmalloc(n);
  int inner = n < ((size_t)1 << 20) ? 200 : 1;
  double *t = xmalloc((NQ + 1) * (size_t)reps * sizeof(double));
  double *ratio = xmalloc((size_t)reps * sizeof(double));
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  rmsnorm_quant qd[NQ];
  size_t ldc[NQ], lds[NQ];
  for (size_t k = 0; k < NQ; k++) {
    rmsnorm_quant_init(&qd[k], qcases[k].format);
    qd[k].group = qcases[k].group;
    qd[k].flags = qcases[k].flags;
    rmsnorm_quant_row_size(&qd[k], d, &ldc[k], &lds[k]);
  }
  int most = all_threads(ctx);
  for (int threads = 1; threads <= most; threads = threads == most ? most + 1 : most) {
    rmsnorm_context_set_threads(ctx, threads);
    for (int r = -1; r < reps; r++) { /* round -1 warms up */
      for (size_t k = 0; k <= NQ; k++) {
        double t0 = now();
        for (int i = 0; i < inner; i++) {
          if (k == 0 && !add) rmsnorm_forward(ctx, &cfg, rows, d, x, d, w, NULL, y, d, NULL);
          if (k == 0 && add) rmsnorm_add_forward(ctx, &cfg, rows, d, x, d, u, d, w, NULL, y, d, NULL);
          if (k > 0 && !add)
            rmsnorm_forward_quantized(ctx, &cfg, rows, d, x, d, w, NULL, &qd[k - 1], codes,
                                      ldc[k - 1], lds[k - 1] ? scales : NULL, lds[k - 1], NULL);
          if (k > 0 && add)
            rmsnorm_add_forward_quantized(ctx, &cfg, rows, d, x, d, u, d, w, NULL, &qd[k - 1],
                                          codes, ldc[k - 1], lds[k - 1] ? scales : NULL,
                                          lds[k - 1], NULL);
        }
        if (r >= 0) t[k * (size_t)reps + (size_t)r] = (now() - t0) / inner;
      }
      if (add) /* keep h bounded: the add feeds on itself */
        for (size_t i = 0; i < n; i++) x[i] = u[i];
    }
    printf("%s f32 %zux%zu threads=%d, median of %d interleaved rounds: f32 out %.3f us\n",
           add ? "add+rmsnorm" : "rmsnorm", rows, d, threads, reps,
           bench_median(t, reps) * 1e6);
    for (size_t k = 1; k <= NQ; k++) {
      for (int r = 0; r < reps; r++) ratio[r] = t[k * (size_t)reps + (size_t)r] / t[r];
      printf("  %-15s %10.3f us  %.2fx\n", qcases[k - 1].name,
             bench_median(t + k * (size_t)reps, reps) * 1e6, bench_median(ratio, reps));
    }
  }
  free(x), free(u), free(y), free(w), free(codes), free(scales), free(t), free(ratio);
}

/* Gemma's sandwich norms, fused against the three separate calls, timed
 * interleaved in each round (a shared machine's drift hits both alike):
 * median times and the median of the rounds' ratios. h is restored before
 * each round (the add feeds on itself); in-cache shapes repeat each call
 * `inner` times a round. */
static void bench_sandwich(rmsnorm_context *ctx, size_t rows, size_t d, int bf16) {
  size_t n = rows * d, es = bf16 ? 2 : 4;
  float *af = randf(n), *hf = randf(n), *w1 = randf(d), *w2 = randf(d);
  void *a = xmalloc(n * es), *h0 = xmalloc(n * es), *h = xmalloc(n * es);
  void *x = xmalloc(n * es), *tmp = xmalloc(n * es);
  for (size_t i = 0; i < n; i++) {
    if (bf16) {
      ((uint16_t *)a)[i] = f32_to_bf16(4 * af[i]);
      ((uint16_t *)h0)[i] = f32_to_bf16(hf[i]);
    } else {
      ((float *)a)[i] = 4 * af[i];
      ((float *)h0)[i] = hf[i];
    }
  }
  for (size_t j = 0; j < d; j++) w1[j] *= 0.3f, w2[j] *= 0.3f; /* Gemma's g, used as 1 + g */
  int small = n < ((size_t)1 << 20), inner = small ? 200 : 1;
  double *t = xmalloc(2 * (size_t)reps * sizeof(double));
  double *ratio = xmalloc((size_t)reps * sizeof(double));
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, bf16 ? RMSNORM_BF16 : RMSNORM_F32);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-6;
  cfg.flags = RMSNORM_FLAG_WEIGHT_OFFSET;
  int most = all_threads(ctx);
  for (int threads = 1; threads <= most; threads = threads == most ? most + 1 : most) {
    rmsnorm_context_set_threads(ctx, threads);
    for (int r = -1; r < reps; r++) { /* round -1 warms up */
      for (int k = 0; k < 2; k++) {
        memcpy(h, h0, n * es);
        double t0 = now();
        for (int i = 0; i < inner; i++) {
          if (k == 0) {
            rmsnorm_sandwich_forward(ctx, &cfg, rows, d, a, d, h, d, w1, w2, x, d, NULL, NULL);
          } else {
            rmsnorm_forward(ctx, &cfg, rows, d, a, d, w1, NULL, tmp, d, NULL);
            add_threads_of(h, tmp, n, small ? 1 : threads, bf16);
            rmsnorm_forward(ctx, &cfg, rows, d, h, d, w2, NULL, x, d, NULL);
          }
        }
        if (r >= 0) t[(size_t)k * (size_t)reps + (size_t)r] = (now() - t0) / inner;
      }
    }
    for (int r = 0; r < reps; r++) ratio[r] = t[r] / t[(size_t)reps + (size_t)r];
    double fused = bench_median(t, reps), separate = bench_median(t + reps, reps);
    printf("sandwich %s %zux%zu threads=%d, median of %d interleaved rounds: fused %.3f us, "
           "forward+add+forward %.3f us, fused/separate %.2fx\n",
           bf16 ? "bf16" : "f32", rows, d, threads, reps, fused * 1e6, separate * 1e6,
           bench_median(ratio, reps));
  }
  free(af), free(hf), free(w1), free(w2), free(a), free(h0), free(h), free(x), free(tmp);
  free(t), free(ratio);
}

static void bench_linear(rmsnorm_context *ctx, size_t rows, size_t d, size_t n) {
  if (rmsnorm_linear_available() != RMSNORM_OK) {
    printf("linear: no BLAS in this build\n");
    return;
  }
#ifdef BENCH_HAVE_BLAS
  float *x = randf(rows * d), *W = randf(d * n), *Wf = xmalloc(d * n * 4), *g = randf(d);
  float *y = xmalloc(rows * d * 4), *z = xmalloc(rows * n * 4);
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  all_threads(ctx);
  rmsnorm_fold_weight(&cfg, d, n, g, W, n, Wf, n);
  double fused, unfused;
  int r0 = reps;
  if (rows * d * n > ((size_t)1 << 30)) reps = 5;
  else reps = 2000;
  BEST(fused, rmsnorm_linear_forward(ctx, &cfg, rows, d, n, x, d, Wf, n, NULL, z, n, NULL));
  BEST(unfused, (rmsnorm_forward(ctx, &cfg, rows, d, x, d, g, NULL, y, d, NULL),
                 cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)n, (int)d,
                             1.0f, y, (int)d, W, (int)n, 0.0f, z, (int)n)));
  reps = r0;
  printf("rmsnorm+linear f32 %zux%zu times %zux%zu (BLAS threads): fused %.3f us, norm-then-GEMM "
         "%.3f us, speedup %.2fx\n",
         rows, d, d, n, fused * 1e6, unfused * 1e6, unfused / fused);
  free(x), free(W), free(Wf), free(g), free(y), free(z);
#else
  (void)ctx, (void)rows, (void)d, (void)n;
  printf("linear: bench built without cblas.h\n");
#endif
}

/* A copy of spans[k] (dst, src, bytes) split over threads, each thread
 * copying its share of every span with `kind`. */
typedef struct copy_part {
  const rn_copy_kind *kind;
  char *dst[3];
  const char *src[3];
  size_t bytes[3];
} copy_part;

static void *copy_run(void *p) {
  copy_part *c = p;
  for (int k = 0; k < 3; k++)
    if (c->bytes[k]) c->kind->copy(c->dst[k], c->src[k], c->bytes[k]);
  return NULL;
}

static void copy_threads(const rn_copy_kind *kind, char *const dst[3], const char *const src[3],
                         const size_t bytes[3], int threads) {
  pthread_t th[64];
  copy_part parts[64];
  for (int t = 0; t < threads; t++) {
    parts[t].kind = kind;
    for (int k = 0; k < 3; k++) { /* 64-byte aligned shares */
      size_t b = bytes[k] / 64 * (size_t)t / (size_t)threads * 64;
      size_t e = t + 1 == threads ? bytes[k] : bytes[k] / 64 * (size_t)(t + 1) / (size_t)threads * 64;
      parts[t].dst[k] = dst[k] + b, parts[t].src[k] = src[k] + b, parts[t].bytes[k] = e - b;
    }
    if (t) pthread_create(&th[t], NULL, copy_run, &parts[t]);
  }
  copy_run(&parts[0]);
  for (int t = 1; t < threads; t++) pthread_join(th[t], NULL);
}

static void *xalloc64(size_t n) {
  void *p = aligned_alloc(64, (n + 63) / 64 * 64);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

/* Gated RMSNorm's forward and backward against the copy limit of their own
 * bytes, in interleaved rounds: per round the op, then each copy kind moving
 * the same byte total between the op's buffers (forward: x -> y and half of
 * z -> dz, 3N elements of traffic as the op's; backward: x -> dx, z -> dz and
 * half of dy -> y, 5N). %limit = fastest copy's median / the op's median. */
static void bench_gated(rmsnorm_context *ctx, size_t rows, size_t d, int norm_first) {
  size_t n = rows * d, es = 4;
  float *x = xalloc64(n * es), *z = xalloc64(n * es), *y = xalloc64(n * es);
  float *dy = xalloc64(n * es), *dx = xalloc64(n * es), *dz = xalloc64(n * es);
  float *w = randf(d), *dw = xmalloc(d * es), *rstd = xmalloc(rows * 8 * sizeof(float)); /* 8 groups */
  float *r1 = randf(n), *r2 = randf(n);
  for (size_t i = 0; i < n; i++) x[i] = r1[i], z[i] = 3 * r2[i], dy[i] = r1[(i * 7) % n];
  memset(y, 0, n * es), memset(dx, 0, n * es), memset(dz, 0, n * es);
  for (size_t j = 0; j < d; j++) w[j] += 1;
  const rn_copy_kind *kinds[4];
  int nkinds = rn_copy_kinds(kinds, 4);
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-6;
  rmsnorm_gate g;
  rmsnorm_gate_init(&g, RMSNORM_GATE_SILU);
  if (norm_first) g.flags |= RMSNORM_GATE_NORM_FIRST;
  else g.group = d / 8; /* Mamba2: ngroups = 8 */
  int most = all_threads(ctx);
  double *t = xmalloc((size_t)(2 + 2 * nkinds) * (size_t)reps * sizeof(double));
  for (int threads = 1; threads <= most; threads = threads == most ? most + 1 : most) {
    rmsnorm_context_set_threads(ctx, threads);
    for (int r = -1; r < reps; r++) {
      double t0 = now();
      rmsnorm_gated_forward(ctx, &cfg, &g, rows, d, x, d, z, d, w, y, d, rstd);
      double tf = now() - t0;
      t0 = now();
      rmsnorm_gated_backward(ctx, &cfg, &g, rows, d, x, d, z, d, dy, d, w, rstd, dx, d, dz, d, dw);
      double tb = now() - t0;
      if (r >= 0) t[r] = tf, t[reps + r] = tb;
      for (int k = 0; k < nkinds; k++) {
        char *fd[3] = {(char *)y, (char *)dz, NULL};
        const char *fs[3] = {(const char *)x, (const char *)z, NULL};
        size_t fb[3] = {n * es, n * es / 2, 0};
        t0 = now();
        copy_threads(kinds[k], fd, fs, fb, threads);
        double cf = now() - t0;
        char *bd[3] = {(char *)dx, (char *)dz, (char *)y};
        const char *bs[3] = {(const char *)x, (const char *)z, (const char *)dy};
        size_t bb[3] = {n * es, n * es, n * es / 2};
        t0 = now();
        copy_threads(kinds[k], bd, bs, bb, threads);
        double cb = now() - t0;
        if (r >= 0) t[(size_t)(2 + 2 * k) * reps + r] = cf, t[(size_t)(3 + 2 * k) * reps + r] = cb;
      }
    }
    double fwd = bench_median(t, reps), bwd = bench_median(t + reps, reps), lf = 1e30, lb = 1e30;
    const char *nf = "", *nb = "";
    for (int k = 0; k < nkinds; k++) {
      double cf = bench_median(t + (size_t)(2 + 2 * k) * reps, reps);
      double cb = bench_median(t + (size_t)(3 + 2 * k) * reps, reps);
      if (cf < lf) lf = cf, nf = kinds[k]->name;
      if (cb < lb) lb = cb, nb = kinds[k]->name;
    }
    printf("gated %s %zux%zu group %zu threads=%d, median of %d interleaved rounds: "
           "forward %.3f ms = %.2f of the copy limit (%s %.3f ms), "
           "backward %.3f ms = %.2f of the copy limit (%s %.3f ms)\n",
           norm_first ? "norm-first" : "gate-first", rows, d, g.group ? g.group : d, threads,
           reps, fwd * 1e3, lf / fwd, nf, lf * 1e3, bwd * 1e3, lb / bwd, nb, lb * 1e3);
  }
  free(x), free(z), free(y), free(dy), free(dx), free(dz), free(w), free(dw), free(rstd);
  free(r1), free(r2), free(t);
}

/* ---- QK-norm + RoPE ------------------------------------------------------ */

#define ROPE_HQ 32 /* Q heads */
#define ROPE_HK 8  /* K (and V) heads */
#define ROPE_HD 128

/* The unfused rotation: NeoX pairs (i, i + 64) of every head of tokens
 * [t0, t1) of a [T, heads] grid in place (row (t, h) at x + t*ld_t + h*HD),
 * in float: bf16 rows through float and back, rounded to nearest even.
 * Compiled for the best of AVX-512 and AVX2 the CPU has (x86-64 GCC and
 * clang), as the library's kernels are. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BENCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define BENCH_CLONES
#endif
BENCH_CLONES
static void rope_pass_f32(float *restrict x, size_t t0, size_t t1, size_t heads, size_t ld_t,
                          const float *restrict table, const int64_t *pos) {
  enum { half = ROPE_HD / 2 };
  for (size_t t = t0; t < t1; t++) {
    const float *restrict c = table + (size_t)pos[t] * ROPE_HD, *restrict s = c + half;
    for (size_t h = 0; h < heads; h++) {
      float *restrict a = x + t * ld_t + h * ROPE_HD, *restrict b = a + half;
      for (size_t i = 0; i < half; i++) {
        float ai = a[i], bi = b[i];
        a[i] = ai * c[i] - bi * s[i];
        b[i] = bi * c[i] + ai * s[i];
      }
    }
  }
}

BENCH_CLONES
static void rope_pass_bf16(uint16_t *restrict x, size_t t0, size_t t1, size_t heads, size_t ld_t,
                           const float *restrict table, const int64_t *pos) {
  enum { half = ROPE_HD / 2 };
  for (size_t t = t0; t < t1; t++) {
    const float *restrict c = table + (size_t)pos[t] * ROPE_HD, *restrict s = c + half;
    for (size_t h = 0; h < heads; h++) {
      uint16_t *restrict a = x + t * ld_t + h * ROPE_HD, *restrict b = a + half;
      for (size_t i = 0; i < half; i++) {
        uint32_t ua = (uint32_t)a[i] << 16, ub = (uint32_t)b[i] << 16;
        float ai, bi;
        memcpy(&ai, &ua, 4), memcpy(&bi, &ub, 4);
        float ya = ai * c[i] - bi * s[i], yb = bi * c[i] + ai * s[i];
        uint32_t va, vb;
        memcpy(&va, &ya, 4), memcpy(&vb, &yb, 4);
        a[i] = (uint16_t)((va + 0x7fffu + ((va >> 16) & 1u)) >> 16);
        b[i] = (uint16_t)((vb + 0x7fffu + ((vb >> 16) & 1u)) >> 16);
      }
    }
  }
}

typedef struct rope_part {
  void *x;
  size_t t0, t1, heads, ld_t;
  const float *table;
  const int64_t *pos;
  int bf16;
} rope_part;

static void *rope_run(void *p) {
  rope_part *r = p;
  if (r->bf16)
    rope_pass_bf16(r->x, r->t0, r->t1, r->heads, r->ld_t, r->table, r->pos);
  else
    rope_pass_f32(r->x, r->t0, r->t1, r->heads, r->ld_t, r->table, r->pos);
  return NULL;
}

/* the rotation pass over `threads` threads, tokens split evenly */
static void rope_threads(void *x, size_t tokens, size_t heads, size_t ld_t, const float *table,
                         const int64_t *pos, int bf16, int threads) {
  pthread_t th[64];
  rope_part parts[64];
  for (int t = 0; t < threads; t++) {
    parts[t] = (rope_part){x, tokens * (size_t)t / (size_t)threads,
                           tokens * (size_t)(t + 1) / (size_t)threads, heads, ld_t, table, pos,
                           bf16};
    if (t) pthread_create(&th[t], NULL, rope_run, &parts[t]);
  }
  rope_run(&parts[0]);
  for (int t = 1; t < threads; t++) pthread_join(th[t], NULL);
}

/* Fused Q and K calls against QK-norm then the rotation pass, in place in a
 * QKV buffer, at positions 4096 - T .. 4095 of a 4096-row table; the two
 * steps of the unfused composition are also timed on their own. The gains
 * are all 1: the rows are normalized and rotated again and again in place,
 * and gains of other values would drive the channels with the smaller ones
 * into subnormals within a few hundred rounds (whose arithmetic is slow on
 * x86: it would time the data, not the ops). */
static void bench_rope(rmsnorm_context *ctx, size_t tokens, int bf16) {
  size_t W = ROPE_HQ + 2 * ROPE_HK, es = bf16 ? 2 : 4, n = tokens * W * ROPE_HD;
  size_t npos = 4096;
  float *v = randf(n), *wq = xmalloc(ROPE_HD * sizeof(float));
  float *wk = xmalloc(ROPE_HD * sizeof(float));
  float *table = xmalloc(npos * ROPE_HD * sizeof(float));
  void *qkv = xalloc64(n * es);
  int64_t *pos = xmalloc(tokens * sizeof *pos);
  for (size_t i = 0; i < n; i++) {
    if (bf16)
      ((uint16_t *)qkv)[i] = f32_to_bf16(4 * v[i]);
    else
      ((float *)qkv)[i] = 4 * v[i];
  }
  for (size_t j = 0; j < ROPE_HD; j++) wq[j] = wk[j] = 1;
  for (size_t t = 0; t < tokens; t++) pos[t] = (int64_t)(npos - tokens + t);
  rmsnorm_rope_table(table, RMSNORM_F32, npos, ROPE_HD, 1e6, 1);
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, bf16 ? RMSNORM_BF16 : RMSNORM_F32);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-6;
  rmsnorm_rope rope;
  rmsnorm_rope_init(&rope, RMSNORM_ROPE_NEOX);
  rope.cos_sin = table, rope.n_positions = npos, rope.positions = pos;
  size_t ld_t = W * ROPE_HD, koff = ROPE_HQ * ROPE_HD * es;
  char *k = (char *)qkv + koff;
  int small = tokens * (ROPE_HQ + ROPE_HK) * ROPE_HD < ((size_t)1 << 20), inner = small ? 500 : 2;
  /* per round: the fused calls, the unfused composition, then its QK-norm
   * calls and its rotation passes each alone */
  enum { FUSED, UNFUSED, QK, ROT, STEPS };
  double *t = xmalloc(STEPS * (size_t)reps * sizeof(double));
  double *ratio = xmalloc(2 * (size_t)reps * sizeof(double)), *share = ratio + reps;
  for (int threads = 1; threads <= 2; threads++) {
    rmsnorm_context_set_threads(ctx, threads);
    for (int r = -1; r < reps; r++) { /* round -1 warms up */
      for (int m = 0; m < STEPS; m++) {
        double t0 = now();
        for (int i = 0; i < inner; i++) {
          if (m == FUSED) {
            rmsnorm_qk_norm_rope_forward(ctx, &cfg, tokens, ROPE_HQ, ROPE_HD, qkv, ld_t, ROPE_HD,
                                         wq, &rope, NULL, qkv, ld_t, ROPE_HD, NULL);
            rmsnorm_qk_norm_rope_forward(ctx, &cfg, tokens, ROPE_HK, ROPE_HD, k, ld_t, ROPE_HD,
                                         wk, &rope, NULL, k, ld_t, ROPE_HD, NULL);
            continue;
          }
          if (m == UNFUSED || m == QK) {
            rmsnorm_qk_norm_forward(ctx, &cfg, tokens, ROPE_HQ, ROPE_HD, qkv, ld_t, ROPE_HD, wq,
                                    NULL, qkv, ld_t, ROPE_HD, NULL);
            rmsnorm_qk_norm_forward(ctx, &cfg, tokens, ROPE_HK, ROPE_HD, k, ld_t, ROPE_HD, wk,
                                    NULL, k, ld_t, ROPE_HD, NULL);
          }
          if (m == UNFUSED || m == ROT) {
            rope_threads(qkv, tokens, ROPE_HQ, ld_t, table, pos, bf16, small ? 1 : threads);
            rope_threads(k, tokens, ROPE_HK, ld_t, table, pos, bf16, small ? 1 : threads);
          }
        }
        if (r >= 0) t[(size_t)m * (size_t)reps + (size_t)r] = (now() - t0) / inner;
      }
    }
    for (int r = 0; r < reps; r++) {
      double qk = t[QK * (size_t)reps + (size_t)r], rot = t[ROT * (size_t)reps + (size_t)r];
      ratio[r] = t[FUSED * (size_t)reps + (size_t)r] / t[UNFUSED * (size_t)reps + (size_t)r];
      share[r] = qk / (qk + rot);
    }
    printf("rope %s %s (%zu tokens x (%d Q + %d K heads) x %d) threads=%d, median of %d "
           "interleaved rounds: fused %.3f us, qk-norm + rope pass %.3f us (qk-norm %.3f, "
           "rope pass %.3f), fused/unfused %.2f, qk-norm share %.2f\n",
           bf16 ? "bf16" : "f32", tokens == 1 ? "decode" : "prefill", tokens, ROPE_HQ, ROPE_HK,
           ROPE_HD, threads, reps, bench_median(t + FUSED * reps, reps) * 1e6,
           bench_median(t + UNFUSED * reps, reps) * 1e6, bench_median(t + QK * reps, reps) * 1e6,
           bench_median(t + ROT * reps, reps) * 1e6, bench_median(ratio, reps), bench_median(share, reps));
  }
  free(v), free(wq), free(wk), free(table), free(qkv), free(pos), free(t), free(ratio);
}

/* One call of bench_rope_limit's op over its first `rows` rows. */
static void rope_limit_call(rmsnorm_context *ctx, const rmsnorm_config *cfg, int bwd,
                            size_t rows, const void *x, const void *dy, const float *w,
                            const rmsnorm_rope *rope, float *rstd, void *y, float *dw) {
  if (bwd)
    rmsnorm_qk_norm_rope_backward(ctx, cfg, rows, 1, ROPE_HD, x, ROPE_HD, ROPE_HD, dy, ROPE_HD,
                                  ROPE_HD, w, rope, rstd, y, ROPE_HD, ROPE_HD, dw);
  else
    rmsnorm_qk_norm_rope_forward(ctx, cfg, rows, 1, ROPE_HD, x, ROPE_HD, ROPE_HD, w, rope, NULL,
                                 y, ROPE_HD, ROPE_HD, NULL);
}

/* Rows of bench_rope_limit's in-cache timing (x, y and the table's rows:
 * 768 KiB in fp32, inside a 1 MiB L2), and its calls a round. */
#define ROPE_CACHE_ROWS 512
#define ROPE_CACHE_CALLS 64

/* The fused op at rows x 128 (one head per token, positions 0..rows-1, y
 * apart from x) against the copy limit of its own bytes: per round the op,
 * the op on its first ROPE_CACHE_ROWS rows in cache (ROPE_CACHE_CALLS
 * times), then each copy kind moving the same byte total between the op's
 * buffers.
 * Forward: x -> y, and half of the table into a buffer of its size (2N
 * elements of data and the table's bytes, as the op reads and writes).
 * Backward (bwd): x -> dx and half of dy and of the table into buffers of
 * their size (3N elements, the table, and r's 4 bytes a row). */
static void bench_rope_limit(rmsnorm_context *ctx, size_t rows, int bf16, int bwd) {
  size_t es = bf16 ? 2 : 4, n = rows * ROPE_HD, tb = rows * ROPE_HD * sizeof(float);
  float *v = randf(n), *w = randf(ROPE_HD), *dw = xmalloc(ROPE_HD * sizeof(float));
  void *x = xalloc64(n * es), *y = xalloc64(n * es), *dy = xalloc64(n * es);
  void *dycopy = xalloc64(n * es);
  float *table = xalloc64(tb), *tcopy = xalloc64(tb), *rstd = xalloc64(rows * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    if (bf16)
      ((uint16_t *)x)[i] = f32_to_bf16(4 * v[i]), ((uint16_t *)dy)[i] = f32_to_bf16(v[n - 1 - i]);
    else
      ((float *)x)[i] = 4 * v[i], ((float *)dy)[i] = v[n - 1 - i];
  }
  memset(y, 0, n * es), memset(tcopy, 0, tb), memset(dycopy, 0, n * es);
  for (size_t j = 0; j < ROPE_HD; j++) w[j] += 1;
  rmsnorm_rope_table(table, RMSNORM_F32, rows, ROPE_HD, 1e6, 1);
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, bf16 ? RMSNORM_BF16 : RMSNORM_F32);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 1e-6;
  rmsnorm_rope rope;
  rmsnorm_rope_init(&rope, RMSNORM_ROPE_NEOX);
  rope.cos_sin = table, rope.n_positions = rows;
  if (bwd) /* r saved by the forward, as training does */
    rmsnorm_qk_norm_rope_forward(ctx, &cfg, rows, 1, ROPE_HD, x, ROPE_HD, ROPE_HD, w, &rope,
                                 NULL, y, ROPE_HD, ROPE_HD, rstd);
  const rn_copy_kind *kinds[4];
  int nkinds = rn_copy_kinds(kinds, 4);
  /* per round: the op, the op in cache, each copy kind */
  double *t = xmalloc((size_t)(2 + nkinds) * (size_t)reps * sizeof(double));
  double *tc = t + (size_t)(1 + nkinds) * reps;
  for (int threads = 1; threads <= 2; threads++) {
    rmsnorm_context_set_threads(ctx, threads);
    for (int r = -1; r < reps; r++) {
      double t0 = now();
      rope_limit_call(ctx, &cfg, bwd, rows, x, dy, w, &rope, rstd, y, dw);
      if (r >= 0) t[r] = now() - t0;
      t0 = now();
      for (int i = 0; i < ROPE_CACHE_CALLS; i++)
        rope_limit_call(ctx, &cfg, bwd, ROPE_CACHE_ROWS, x, dy, w, &rope, rstd, y, dw);
      if (r >= 0) tc[r] = (now() - t0) / ROPE_CACHE_CALLS;
      for (int k = 0; k < nkinds; k++) {
        char *dst[3] = {(char *)y, (char *)tcopy, (char *)dycopy};
        const char *src[3] = {(const char *)x, (const char *)table, (const char *)dy};
        size_t bytes[3] = {n * es, tb / 2 + (bwd ? rows * 2 : 0), bwd ? n * es / 2 : 0};
        t0 = now();
        copy_threads(kinds[k], dst, src, bytes, threads);
        if (r >= 0) t[(size_t)(1 + k) * reps + r] = now() - t0;
      }
    }
    double op = bench_median(t, reps), lim = 1e30;
    const char *name = "";
    for (int k = 0; k < nkinds; k++) {
      double c = bench_median(t + (size_t)(1 + k) * reps, reps);
      if (c < lim) lim = c, name = kinds[k]->name;
    }
    double row_ns = 1e9 / (double)rows, cache_ns = bench_median(tc, reps) * 1e9 / ROPE_CACHE_ROWS;
    printf("rope %s %s %zux%d (one head per token) threads=%d, median of %d interleaved "
           "rounds: %.3f ms (%s %.1f MB + table %.1f MB) = %.2f of the copy limit (%s %.3f ms); "
           "a row: %.1f ns, %.1f in cache (%d rows), copy limit %.1f\n",
           bwd ? "backward" : "forward", bf16 ? "bf16" : "f32", rows, ROPE_HD, threads, reps,
           op * 1e3, bwd ? "x, dy, dx" : "x, y", (bwd ? 3 : 2) * n * es / 1e6, tb / 1e6,
           lim / op, name, lim * 1e3, op * row_ns, cache_ns, ROPE_CACHE_ROWS, lim * row_ns);
  }
  free(v), free(w), free(dw), free(x), free(y), free(dy), free(dycopy), free(table), free(tcopy);
  free(rstd), free(t);
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "all";
  if (argc > 2) reps = atoi(argv[2]);
  if (reps < 1) reps = 1;
  rmsnorm_context *ctx;
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) return 2;
  rmsnorm_isa isa;
  rmsnorm_context_get_isa(ctx, &isa);
  printf("kernels: %s, reps: %d\n", rmsnorm_isa_name(isa), reps);
  int all = !strcmp(what, "all");
  if (all || !strcmp(what, "add")) bench_add(ctx, 4096, 4096);
  if (all || !strcmp(what, "qk")) bench_qk(ctx, 4096, 32, 128);
  if (all || !strcmp(what, "quant")) {
    bench_quant(ctx, 4096, 4096, 0);
    bench_quant(ctx, 16, 4096, 0);
    bench_quant(ctx, 4096, 4096, 1);
    bench_quant(ctx, 16, 4096, 1);
  }
  if (all || !strcmp(what, "sandwich")) {
    for (int bf16 = 0; bf16 < 2; bf16++) {
      bench_sandwich(ctx, 4096, 4096, bf16);
      bench_sandwich(ctx, 16, 4096, bf16);
    }
  }
  if (all || !strcmp(what, "gated")) {
    bench_gated(ctx, 4096, 4096, 0);
    bench_gated(ctx, 4096, 4096, 1);
  }
  if (all || !strcmp(what, "rope")) {
    for (int bf16 = 0; bf16 < 2; bf16++) {
      bench_rope(ctx, 1, bf16);
      bench_rope(ctx, 512, bf16);
    }
    for (int bwd = 0; bwd < 2; bwd++)
      for (int bf16 = 0; bf16 < 2; bf16++) bench_rope_limit(ctx, 65536, bf16, bwd);
  }
  if (all || !strcmp(what, "linear")) {
    bench_linear(ctx, 2, 4, 3);
    bench_linear(ctx, 4096, 4096, 4096);
  }
  rmsnorm_context_free(ctx);
  return 0;
}
