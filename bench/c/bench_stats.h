/* bench_stats.h - the benchmarks' medians: qsort's comparison of doubles
 * and the median of n times (sorted in place). Shared by `rmsnorm bench`,
 * bench_fused and bench_decode. */
#ifndef RMSNORM_BENCH_STATS_H
#define RMSNORM_BENCH_STATS_H

#include <stdlib.h>

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of v[0..n), n >= 1; v is left sorted. */
static inline double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
