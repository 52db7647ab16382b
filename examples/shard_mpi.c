/* shard_mpi.c - RMSNorm of rows whose hidden dimension is split across MPI
 * ranks (librmsnorm_mpi). Each rank holds only its columns of a 4 x 4096
 * tensor; the forward and the backward each sum 4 doubles across the ranks
 * (32 bytes), where gathering the rows would move 4 x 4096 floats. Every rank
 * then checks its columns against the unsharded library, which it can run
 * here only because this example makes up its data from a formula.
 * Run: mpirun -n 2 ./shard_mpi */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rmsnorm_mpi.h"

#define ROWS 4
#define D 4096 /* d_global */

static float x_at(size_t i, size_t j) { return (float)sin(0.01 * (double)(j + 1) * (double)(i + 1)); }
static float g_at(size_t j) { return 1.0f + 0.001f * (float)(j % 7); }

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  /* this rank's shard: columns [offset, offset + width) */
  size_t offset = (size_t)D * (size_t)rank / (size_t)nranks;
  size_t width = (size_t)D * (size_t)(rank + 1) / (size_t)nranks - offset;
  float *x = malloc(ROWS * width * sizeof(float)), *y = malloc(ROWS * width * sizeof(float));
  float *dy = malloc(ROWS * width * sizeof(float)), *dx = malloc(ROWS * width * sizeof(float));
  float *g = malloc(width * sizeof(float)), *dg = malloc(width * sizeof(float));
  for (size_t j = 0; j < width; j++) g[j] = g_at(offset + j);
  for (size_t i = 0; i < ROWS; i++)
    for (size_t j = 0; j < width; j++) {
      x[i * width + j] = x_at(i, offset + j);
      dy[i * width + j] = 1.0f;
    }

  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  double stats[ROWS]; /* each row's sum of x^2 over all ranks: kept for the backward */
  rmsnorm_context_create(&ctx);
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  cfg.eps = 1e-6;
  rmsnorm_status st = rmsnorm_mpi_forward(ctx, &cfg, ROWS, D, offset, width, x, width, g, NULL,
                                          y, width, stats, NULL, MPI_COMM_WORLD);
  if (st == RMSNORM_OK) /* dx of this rank's columns and dg of its slice of g */
    st = rmsnorm_mpi_backward(ctx, &cfg, ROWS, D, offset, width, x, width, dy, width, g, stats,
                              dx, width, dg, NULL, MPI_COMM_WORLD, MPI_COMM_NULL);
  if (st != RMSNORM_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, rmsnorm_status_message(st));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  /* the unsharded forward of the same rows, to compare this rank's columns */
  float *xa = malloc(ROWS * D * sizeof(float)), *ya = malloc(ROWS * D * sizeof(float));
  float *ga = malloc(D * sizeof(float));
  for (size_t j = 0; j < D; j++) ga[j] = g_at(j);
  for (size_t i = 0; i < ROWS; i++)
    for (size_t j = 0; j < D; j++) xa[i * D + j] = x_at(i, j);
  rmsnorm_forward(ctx, &cfg, ROWS, D, xa, D, ga, NULL, ya, D, NULL);
  /* distance in ulps: float bit patterns of same-signed values differ by it */
  int worst = 0, all_worst;
  for (size_t i = 0; i < ROWS; i++)
    for (size_t j = 0; j < width; j++) {
      float a = y[i * width + j], b = ya[i * D + offset + j];
      int32_t ia, ib;
      memcpy(&ia, &a, 4);
      memcpy(&ib, &b, 4);
      int u = (a < 0) == (b < 0) ? abs(ia - ib) : 1 << 30;
      if (u > worst) worst = u;
    }
  MPI_Allreduce(&worst, &all_worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  /* rank 0 prints what every rank holds (stdout of ranks interleaves) */
  double mine[4] = {(double)offset, (double)width, width ? y[0] : 0, width ? dx[0] : 0};
  double *all = malloc(4 * (size_t)nranks * sizeof(double));
  MPI_Gather(mine, 4, MPI_DOUBLE, all, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  for (int p = 0; rank == 0 && p < nranks; p++)
    printf("rank %d: columns [%.0f, %.0f): y[0][%.0f] = %.6f, dx[0][%.0f] = %.6f\n", p,
           all[4 * p], all[4 * p] + all[4 * p + 1], all[4 * p], all[4 * p + 2], all[4 * p],
           all[4 * p + 3]);
  free(all);
  if (rank == 0) {
    printf("row 0: sum of x^2 over all ranks = %.6f\n", stats[0]);
    if (all_worst == 0)
      printf("y equals the unsharded forward bit for bit\n");
    else /* cuts off the 1024-column blocks: see docs/sharding.md */
      printf("y is within %d ulp(s) of the unsharded forward\n", all_worst);
  }
  rmsnorm_context_free(ctx);
  free(x), free(y), free(dy), free(dx), free(g), free(dg), free(xa), free(ya), free(ga);
  MPI_Finalize();
  return 0;
}
