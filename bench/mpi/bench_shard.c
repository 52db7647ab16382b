/* bench_shard.c - the sharded hidden dimension under mpirun: per call, the
 * median over rounds of the slowest rank's time, the variants timed in turn
 * within each round (one untimed warm call first). Each rank holds rows x
 * d/P columns and runs one library thread (the ranks share the machine).
 *   mpi:     rmsnorm_mpi_forward / rmsnorm_mpi_backward (each: the ranks'
 *            agreement with the first 7 rows' sums in one MPI_Allreduce of 32
 *            doubles, the other rows' in a second)
 *   gather:  what engines do today: MPI_Allgather of the shards (x; x and dy
 *            for the backward) into whole rows, then rmsnorm_forward /
 *            rmsnorm_backward of the whole rows on every rank
 *   local:   the split steps without communication (stats + forward; dots +
 *            backward), and rmsnorm_forward/backward of the shard's columns
 *            as if they were whole rows (the cost of a plain norm of the
 *            same bytes)
 *   reduce:  MPI_Allreduce of rows doubles alone
 * usage: mpirun -n P bench_shard [rounds]; prints a table on rank 0 (median
 * and fastest round). */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmsnorm_mpi.h"

static int rank, nranks, rounds = 21;

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return p;
}

/* bf16 or fp32 values in [-1, 1), the same stream on every rank */
static void fill(void *p, size_t n, rmsnorm_dtype dt, unsigned seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    float v = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    if (dt == RMSNORM_F32) {
      ((float *)p)[i] = v;
    } else {
      unsigned u;
      memcpy(&u, &v, 4);
      ((unsigned short *)p)[i] = (unsigned short)(u >> 16);
    }
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

enum { V_MPI_FWD, V_GATHER_FWD, V_LOCAL_FWD, V_PLAIN_FWD, V_MPI_BWD, V_GATHER_BWD,
       V_LOCAL_BWD, V_PLAIN_BWD, V_REDUCE, V_N };
static const char *names[V_N] = {
    "mpi forward", "allgather + forward", "split steps forward (no comm)",
    "rmsnorm_forward of the shard", "mpi backward", "allgather + backward",
    "split steps backward (no comm)", "rmsnorm_backward of the shard",
    "MPI_Allreduce of rows doubles"};

static void bench(rmsnorm_context *ctx, rmsnorm_dtype dt, size_t rows, size_t d) {
  size_t es = dt == RMSNORM_F32 ? 4 : 2;
  size_t off = d * (size_t)rank / (size_t)nranks;
  size_t w = d * (size_t)(rank + 1) / (size_t)nranks - off;
  if (d % (size_t)nranks) {
    if (rank == 0) printf("d = %zu: not a multiple of %d ranks, skipped\n", d, nranks);
    return;
  }
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.eps = 1e-6;
  char *x = xmalloc(rows * w * es), *y = xmalloc(rows * w * es), *dy = xmalloc(rows * w * es);
  char *dx = xmalloc(rows * w * es), *g = xmalloc(w * es), *dg = xmalloc(w * es);
  char *xa = xmalloc(rows * d * es), *ya = xmalloc(rows * d * es), *dya = xmalloc(rows * d * es);
  char *dxa = xmalloc(rows * d * es), *ga = xmalloc(d * es), *dga = xmalloc(d * es);
  char *xg = xmalloc(rows * d * es); /* gathered: (P, rows, w) */
  double *stats = xmalloc(rows * sizeof(double)), *part = xmalloc(rows * sizeof(double));
  fill(x, rows * w, dt, 1u + (unsigned)rank);
  fill(dy, rows * w, dt, 7u + (unsigned)rank);
  fill(g, w, dt, 99);
  fill(ga, d, dt, 99);
  double *t = xmalloc((size_t)rounds * V_N * sizeof(double));
  for (int r = -1; r < rounds; r++)
    for (int v = 0; v < V_N; v++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      rmsnorm_status st = RMSNORM_OK;
      switch (v) {
        case V_MPI_FWD:
          st = rmsnorm_mpi_forward(ctx, &cfg, rows, d, off, w, x, w, g, NULL, y, w, stats,
                                   NULL, MPI_COMM_WORLD);
          break;
        case V_GATHER_FWD:
        case V_GATHER_BWD: {
          /* gather the shards, lay them out as whole rows, normalize them */
          int n = (int)(rows * w * es);
          MPI_Allgather(x, n, MPI_BYTE, xg, n, MPI_BYTE, MPI_COMM_WORLD);
          for (int p = 0; p < nranks; p++)
            for (size_t i = 0; i < rows; i++)
              memcpy(xa + (i * d + (size_t)p * w) * es, xg + ((size_t)p * rows + i) * w * es, w * es);
          if (v == V_GATHER_FWD) {
            st = rmsnorm_forward(ctx, &cfg, rows, d, xa, d, ga, NULL, ya, d, NULL);
            break;
          }
          MPI_Allgather(dy, n, MPI_BYTE, xg, n, MPI_BYTE, MPI_COMM_WORLD);
          for (int p = 0; p < nranks; p++)
            for (size_t i = 0; i < rows; i++)
              memcpy(dya + (i * d + (size_t)p * w) * es, xg + ((size_t)p * rows + i) * w * es, w * es);
          st = rmsnorm_backward(ctx, &cfg, rows, d, xa, d, dya, d, ga, NULL, dxa, d, dga, NULL);
          break;
        }
        case V_LOCAL_FWD:
          st = rmsnorm_shard_stats(ctx, &cfg, rows, d, off, w, x, w, part);
          if (st == RMSNORM_OK)
            st = rmsnorm_shard_forward(ctx, &cfg, rows, d, off, w, x, w, g, NULL, stats, y, w,
                                       NULL);
          break;
        case V_PLAIN_FWD:
          st = rmsnorm_forward(ctx, &cfg, rows, w, x, w, g, NULL, y, w, NULL);
          break;
        case V_MPI_BWD:
          st = rmsnorm_mpi_backward(ctx, &cfg, rows, d, off, w, x, w, dy, w, g, stats, dx, w, dg,
                                    NULL, MPI_COMM_WORLD, MPI_COMM_NULL);
          break;
        case V_LOCAL_BWD:
          st = rmsnorm_shard_backward_dots(ctx, &cfg, rows, d, off, w, x, w, dy, w, g, stats,
                                           part);
          if (st == RMSNORM_OK)
            st = rmsnorm_shard_backward(ctx, &cfg, rows, d, off, w, x, w, dy, w, g, stats, part,
                                        dx, w, dg, NULL);
          break;
        case V_PLAIN_BWD:
          st = rmsnorm_backward(ctx, &cfg, rows, w, x, w, dy, w, g, NULL, dx, w, dg, NULL);
          break;
        default:
          memset(part, 0, rows * sizeof(double));
          MPI_Allreduce(MPI_IN_PLACE, part, (int)rows, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
          break;
      }
      double el = MPI_Wtime() - t0, slowest;
      if (st != RMSNORM_OK) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, names[v], rmsnorm_status_message(st));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      MPI_Allreduce(&el, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (r >= 0) t[v * rounds + r] = slowest;
    }
  if (rank == 0) {
    printf("\n%s, %zu rows x %zu columns over %d ranks (%zu columns each), %d rounds:\n",
           dt == RMSNORM_F32 ? "fp32" : "bf16", rows, d, nranks, w, rounds);
    for (int v = 0; v < V_N; v++) {
      qsort(t + v * rounds, (size_t)rounds, sizeof(double), cmp_double);
      printf("  %-34s %10.1f us  (fastest %.1f)\n", names[v], 1e6 * t[v * rounds + rounds / 2],
             1e6 * t[v * rounds]);
    }
  }
  free(x), free(y), free(dy), free(dx), free(g), free(dg), free(xa), free(ya), free(dya);
  free(dxa), free(ga), free(dga), free(xg), free(stats), free(part), free(t);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (argc > 1) rounds = atoi(argv[1]) > 0 ? atoi(argv[1]) : rounds;
  rmsnorm_context *ctx;
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) MPI_Abort(MPI_COMM_WORLD, 2);
  rmsnorm_context_set_threads(ctx, 1);
  static const size_t shapes[][2] = {{4096, 4096}, {1, 4096}, {32, 8192}};
  for (int dt = 0; dt < 2; dt++)
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
      bench(ctx, dt ? RMSNORM_BF16 : RMSNORM_F32, shapes[s][0], shapes[s][1]);
  rmsnorm_context_free(ctx);
  MPI_Finalize();
  return 0;
}
