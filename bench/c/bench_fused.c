/* bench_fused.c - the fused ops against their unfused paths: best
 * of N wall-clock times, at 1 thread and at all threads.
 *   add:    rmsnorm_add_forward vs (h += u, threads as many) + rmsnorm_forward
 *   qk:     rmsnorm_qk_norm_forward on Q inside a [T, 3, H, hd] QKV buffer vs
 *           rmsnorm_forward on contiguous (T*H) x hd rows
 *   quant:  rmsnorm_forward_quant (int8 and fp8, dynamic) vs rmsnorm_forward,
 *           interleaved rounds, medians (the others: best of N)
 *   linear: rmsnorm_linear_forward vs rmsnorm_forward + cblas_sgemm
 * usage: bench_fused [add|qk|quant|linear|all] [reps] */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* the unfused add: h += u split over threads like the library splits rows */
typedef struct add_part {
  float *h;
  const float *u;
  size_t n;
} add_part;

static void *add_run(void *p) {
  add_part *a = p;
  for (size_t i = 0; i < a->n; i++) a->h[i] += a->u[i];
  return NULL;
}

static void add_threads(float *h, const float *u, size_t n, int threads) {
  pthread_t th[64];
  add_part parts[64];
  for (int t = 0; t < threads; t++) {
    size_t b = n * (size_t)t / (size_t)threads, e = n * (size_t)(t + 1) / (size_t)threads;
    parts[t] = (add_part){h + b, u + b, e - b};
    if (t) pthread_create(&th[t], NULL, add_run, &parts[t]);
  }
  add_run(&parts[0]);
  for (int t = 1; t < threads; t++) pthread_join(th[t], NULL);
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

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The 8-bit outputs against the fp32-output forward, timed interleaved in
 * each round (a shared machine's drift hits all of them alike): median
 * times, and the median of the rounds' ratios. */
static void bench_quant(rmsnorm_context *ctx, size_t rows, size_t d) {
  size_t n = rows * d;
  float *x = randf(n), *y = xmalloc(n * sizeof *y), *w = randf(d), *scale = xmalloc(rows * 4);
  signed char *q = xmalloc(n);
  double *tf = xmalloc((size_t)reps * sizeof(double)), *ti = xmalloc((size_t)reps * sizeof(double));
  double *te = xmalloc((size_t)reps * sizeof(double)), *ri = xmalloc((size_t)reps * sizeof(double));
  double *re = xmalloc((size_t)reps * sizeof(double));
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  int most = all_threads(ctx);
  for (int threads = 1; threads <= most; threads = threads == most ? most + 1 : most) {
    rmsnorm_context_set_threads(ctx, threads);
    for (int r = -1; r < reps; r++) { /* round -1 warms up */
      double t0 = now();
      rmsnorm_forward(ctx, &cfg, rows, d, x, d, w, NULL, y, d, NULL);
      double t1 = now();
      rmsnorm_forward_quant(ctx, &cfg, rows, d, x, d, w, NULL, RMSNORM_Q_INT8, NULL, q, d, scale,
                            NULL);
      double t2 = now();
      rmsnorm_forward_quant(ctx, &cfg, rows, d, x, d, w, NULL, RMSNORM_Q_FP8_E4M3, NULL, q, d,
                            scale, NULL);
      double t3 = now();
      if (r < 0) continue;
      tf[r] = t1 - t0, ti[r] = t2 - t1, te[r] = t3 - t2;
      ri[r] = ti[r] / tf[r], re[r] = te[r] / tf[r];
    }
    printf("rmsnorm f32 %zux%zu threads=%d, median of %d interleaved rounds: f32 out %.3f ms; "
           "int8 dynamic %.3f ms (%.2fx); fp8 e4m3 dynamic %.3f ms (%.2fx)\n",
           rows, d, threads, reps, median(tf, reps) * 1e3, median(ti, reps) * 1e3,
           median(ri, reps), median(te, reps) * 1e3, median(re, reps));
  }
  free(x), free(y), free(w), free(scale), free(q), free(tf), free(ti), free(te), free(ri), free(re);
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
  if (all || !strcmp(what, "quant")) bench_quant(ctx, 4096, 4096);
  if (all || !strcmp(what, "linear")) {
    bench_linear(ctx, 2, 4, 3);
    bench_linear(ctx, 4096, 4096, 4096);
  }
  rmsnorm_context_free(ctx);
  return 0;
}
