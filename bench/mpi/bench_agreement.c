/* bench_agreement.c - what the ranks' agreement costs librmsnorm_mpi: its
 * forward and backward (saved statistics, no replicas) against the same
 * source built without the agreement (RN_MPI_AGREEMENT=0, its functions
 * renamed bench_noagree_*: CMakeLists.txt), the two alternated rep by rep
 * in one run, at 1, 8 (the first row count whose sums take a second
 * collective) and 4096 rows of 4096 columns. A rep is `batch` calls in a
 * row after a barrier (100 below 4096 rows, else 1), timed per call; per shape and variant the median over the
 * reps on each rank, and the largest of the ranks' medians is printed. fp32,
 * one library thread per rank.
 * usage: mpirun -n 2 bench_agreement [reps of 100 calls [reps at 4096 rows]] */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmsnorm_mpi.h"

/* the same calls without the agreement */
rmsnorm_status bench_noagree_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                     size_t rows, size_t d_global, size_t offset, size_t width,
                                     const void *x, size_t ldx, const void *weight,
                                     const void *bias, void *y, size_t ldy, double *stats,
                                     void *rstd, MPI_Comm comm);
rmsnorm_status bench_noagree_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                      size_t rows, size_t d_global, size_t offset, size_t width,
                                      const void *x, size_t ldx, const void *dy, size_t lddy,
                                      const void *weight, const double *stats, void *dx,
                                      size_t lddx, void *dweight, void *dbias, MPI_Comm comm,
                                      MPI_Comm replicas);

static int rank, nranks;

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return p;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

enum { FWD, FWD_NOAGREE, BWD, BWD_NOAGREE, V_N };
static const char *names[V_N] = {"forward", "forward without agreement", "backward",
                                 "backward without agreement"};

static void bench(rmsnorm_context *ctx, size_t rows, size_t d, int reps, int batch) {
  size_t off = d * (size_t)rank / (size_t)nranks;
  size_t w = d * (size_t)(rank + 1) / (size_t)nranks - off;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  cfg.eps = 1e-6;
  float *x = xmalloc(rows * w * 4), *dy = xmalloc(rows * w * 4), *g = xmalloc(w * 4);
  float *y[2] = {xmalloc(rows * w * 4), xmalloc(rows * w * 4)};
  float *dx[2] = {xmalloc(rows * w * 4), xmalloc(rows * w * 4)};
  float *dg = xmalloc(w * 4);
  double *stats = xmalloc(rows * sizeof(double));
  unsigned seed = 1u + (unsigned)rank;
  for (size_t i = 0; i < rows * w; i++) {
    seed = seed * 1103515245u + 12345u;
    x[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    dy[i] = x[i] * 0.5f + 0.25f;
  }
  for (size_t j = 0; j < w; j++) g[j] = 1.0f + 0.001f * (float)j;
  double *t = xmalloc((size_t)reps * V_N * sizeof(double));
  for (int r = -2; r < reps; r++)
    for (int k = 0; k < V_N; k++) {
      /* odd reps run each pair in the other order */
      int v = r % 2 ? k ^ 1 : k;
      int agree = v == FWD || v == BWD;
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      rmsnorm_status st = RMSNORM_OK;
      for (int b = 0; b < batch && st == RMSNORM_OK; b++) {
        if (v == FWD || v == FWD_NOAGREE)
          st = (agree ? rmsnorm_mpi_forward : bench_noagree_forward)(
              ctx, &cfg, rows, d, off, w, x, w, g, NULL, y[agree], w, stats, NULL,
              MPI_COMM_WORLD);
        else
          st = (agree ? rmsnorm_mpi_backward : bench_noagree_backward)(
              ctx, &cfg, rows, d, off, w, x, w, dy, w, g, stats, dx[agree], w, dg, NULL,
              MPI_COMM_WORLD, MPI_COMM_NULL);
      }
      double el = (MPI_Wtime() - t0) / batch;
      if (st != RMSNORM_OK) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, names[v], rmsnorm_status_message(st));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      if (r >= 0) t[v * reps + r] = el;
    }
  int same = memcmp(y[0], y[1], rows * w * 4) == 0 && memcmp(dx[0], dx[1], rows * w * 4) == 0;
  double med[V_N], worst[V_N];
  for (int v = 0; v < V_N; v++) {
    qsort(t + v * reps, (size_t)reps, sizeof(double), cmp_double);
    med[v] = t[v * reps + reps / 2];
  }
  MPI_Reduce(med, worst, V_N, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  int all_same;
  MPI_Reduce(&same, &all_same, 1, MPI_INT, MPI_LAND, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("fp32, %zu rows x %zu columns over %d ranks, %d reps of %d calls (medians, slowest "
           "rank)%s:\n", rows, d, nranks, reps, batch, all_same ? "" : " RESULTS DIFFER");
    for (int v = 0; v < V_N; v += 2)
      printf("  %-9s %10.2f us  without agreement %10.2f us  difference %+8.2f us (%+.1f%%)\n",
             names[v], 1e6 * worst[v], 1e6 * worst[v + 1], 1e6 * (worst[v] - worst[v + 1]),
             100 * (worst[v] / worst[v + 1] - 1));
  }
  free(x), free(dy), free(g), free(y[0]), free(y[1]), free(dx[0]), free(dx[1]), free(dg);
  free(stats), free(t);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int reps_small = argc > 1 && atoi(argv[1]) > 0 ? atoi(argv[1]) : 1001;
  int reps_large = argc > 2 && atoi(argv[2]) > 0 ? atoi(argv[2]) : 61;
  rmsnorm_context *ctx;
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) MPI_Abort(MPI_COMM_WORLD, 2);
  rmsnorm_context_set_threads(ctx, 1);
  rmsnorm_mpi_set_checks(0);
  bench(ctx, 1, 4096, reps_small, 100);
  bench(ctx, 8, 4096, reps_small, 100);
  bench(ctx, 4096, 4096, reps_large, 1);
  rmsnorm_context_free(ctx);
  MPI_Finalize();
  return 0;
}
