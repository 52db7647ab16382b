/* shardcmp.h - how the sharded results are judged against the unsharded
 * library (rmsnorm_forward/backward on whole rows), shared by test_shard.c
 * (split steps in one process) and test_mpi.c (librmsnorm_mpi): bit for bit
 * where docs/sharding.md promises it, else r within an ulp (fp64: a few), y within
 * an ulp of the dtype plus the few ulps of x r w that an ulp of r moves, and
 * gradients within the backward bound. Columns [j0, j1) of the whole rows are
 * compared; the sharded buffers start at column j0. */
#ifndef RMSNORM_SHARDCMP_H
#define RMSNORM_SHARDCMP_H

#include "testutil.h"

/* ulp of v in dtype dt (the subnormal step below the normal range). */
static inline double ulp_of(rmsnorm_dtype dt, double v) {
  int bits = dt == RMSNORM_F16 ? 10 : dt == RMSNORM_BF16 ? 7 : dt == RMSNORM_F32 ? 23 : 52;
  int emin = dt == RMSNORM_F16 ? -14 : dt == RMSNORM_F64 ? -1022 : -126;
  int e = v != 0 ? ilogb(v) : emin;
  if (e < emin) e = emin;
  return ldexp(1.0, e - bits);
}

static inline int same_bits(const void *a, const void *b, size_t es) {
  return memcmp(a, b, es) == 0;
}

/* The blocked sums' block (kernels.h): cuts at its multiples keep the bits. */
static inline size_t block_of(rmsnorm_dtype dt) { return dt == RMSNORM_F64 ? 512 : 1024; }

/* Whether docs/sharding.md promises the unsharded bits for shards cut at c[0..n-1]:
 * one non-empty shard, or fp32/fp16/bf16 data with every non-empty shard
 * starting on a block boundary (rows of ordinary magnitude: not those the
 * unsharded library computes on its double-precision path). */
static inline int promises_bits(rmsnorm_dtype dt, const size_t *c, size_t n) {
  size_t nonempty = 0;
  int aligned = 1;
  for (size_t i = 0; i + 1 < n; i++)
    if (c[i + 1] > c[i]) {
      nonempty++;
      aligned &= c[i] % block_of(dt) == 0;
    }
  return nonempty <= 1 || (aligned && dt != RMSNORM_F64);
}

/* The backward bound (docs/sharding.md: relative to the largest magnitude). */
static inline double grad_tol(rmsnorm_dtype dt) {
  return dt == RMSNORM_F32 ? 1e-5 : dt == RMSNORM_F64 ? 1e-12
         : dt == RMSNORM_F16 ? 0x1p-10 : 0x1p-7;
}

/* Largest differences seen where bits are not promised, per data dtype:
 * rstd in ulps, y (rows without bias) in ulps. */
static double cmp_worst_r[4], cmp_worst_y[4];

/* rstd of every row (acc type). @return whether all passed. */
static inline int cmp_rstd(const char *what, rmsnorm_dtype dt, int bitwise, size_t rows,
                           const void *r0, const void *r1) {
  int f64 = rn_acc_is_f64(dt), ok = 1;
  size_t as = rn_acc_size(dt);
  for (size_t i = 0; i < rows && ok; i++) {
    double ra = rn_load_acc(r0, f64, i), rb = rn_load_acc(r1, f64, i);
    double du = tu_ulps(f64 ? RMSNORM_F64 : RMSNORM_F32, ra, rb);
    if (du > cmp_worst_r[dt]) cmp_worst_r[dt] = du;
    if (bitwise)
      ok = tu_check(same_bits((const char *)r0 + i * as, (const char *)r1 + i * as, as),
                    "%s: row %zu: rstd %.17g, unsharded %.17g (bits promised)", what, i, rb, ra);
    else
      ok = tu_check(du <= (f64 ? 8 : 1), "%s: row %zu: rstd %.17g is %g ulps from unsharded "
                    "%.17g", what, i, rb, du, ra);
  }
  return ok;
}

/* y over columns [j0, j1). x, y0: whole rows (ldx, ld0); y1 at column j0
 * (ld1); weff: each column's effective weight (1 + g with the offset) or
 * NULL; r0: the unsharded rstd. @return whether all passed. */
static inline int cmp_y(const char *what, rmsnorm_dtype dt, int bitwise, int round_first,
                        int bias, size_t rows, size_t j0, size_t j1, const void *x, size_t ldx,
                        const double *weff, const void *r0, const void *y0, size_t ld0,
                        const void *y1, size_t ld1) {
  size_t es = rn_dtype_size(dt);
  int f64 = rn_acc_is_f64(dt);
  int rf = round_first && (dt == RMSNORM_F16 || dt == RMSNORM_BF16);
  /* an ulp of r moves x r w by up to 2 of its ulps (4 after the weight's
   * rounding); with rounding before the weight, an ulp of the dtype */
  double e_terms = dt == RMSNORM_F64 ? 0x1p-49 : !rf ? 0x1p-20
                   : ldexp(1.0, dt == RMSNORM_F16 ? -9 : -6);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = j0; j < j1; j++) {
      const char *pa = (const char *)y0 + (i * ld0 + j) * es;
      const char *pb = (const char *)y1 + (i * ld1 + j - j0) * es;
      double ya = rn_load(pa, dt, 0), yb = rn_load(pb, dt, 0);
      if (bitwise) {
        if (!tu_check(same_bits(pa, pb, es), "%s: y[%zu][%zu] = %.17g, unsharded %.17g (bits "
                      "promised)", what, i, j, yb, ya))
          return 0;
        continue;
      }
      double xrw = fabs(rn_load(x, dt, i * ldx + j) * rn_load_acc(r0, f64, i) *
                        (weff ? weff[j] : 1));
      double u = tu_ulps(dt, ya, yb);
      if (!bias && u > cmp_worst_y[dt]) cmp_worst_y[dt] = u;
      if (!tu_check(u == 0 || fabs(ya - yb) <= ulp_of(dt, ya) + e_terms * xrw,
                    "%s: y[%zu][%zu] = %.17g, unsharded %.17g (%g ulps)", what, i, j, yb, ya, u))
        return 0;
      /* without bias: fp16/bf16 within 1 ulp (2 when x r is rounded first); fp32,
       * whose r is within an ulp: x r within 2 ulps, times the weight within 4 */
      if (!bias && (dt == RMSNORM_F16 || dt == RMSNORM_BF16) &&
          !tu_check(u <= (rf ? 2 : 1), "%s: y[%zu][%zu] %g ulps from unsharded", what, i, j, u))
        return 0;
      if (!bias && dt == RMSNORM_F32 &&
          !tu_check(u <= (weff ? 4 : 2), "%s: y[%zu][%zu] %g ulps from unsharded", what, i, j, u))
        return 0;
    }
  return 1;
}

/* A gradient over columns [j0, j1) of `rows` rows (1 for dweight/dbias): a
 * whole (ld0), b at column j0 (ld1); scale: the largest magnitude of the
 * whole unsharded gradient. @return whether all passed. */
static inline int cmp_grad(const char *what, const char *name, rmsnorm_dtype dt, int bitwise,
                           size_t rows, size_t j0, size_t j1, const void *a, size_t ld0,
                           const void *b, size_t ld1, double scale) {
  size_t es = rn_dtype_size(dt);
  double e = 0;
  for (size_t i = 0; i < rows; i++)
    for (size_t j = j0; j < j1; j++) {
      const char *pa = (const char *)a + (i * ld0 + j) * es;
      const char *pb = (const char *)b + (i * ld1 + j - j0) * es;
      if (bitwise && !tu_check(same_bits(pa, pb, es), "%s: %s[%zu][%zu] = %.17g, unsharded "
                               "%.17g (bits promised)", what, name, i, j, rn_load(pb, dt, 0),
                               rn_load(pa, dt, 0)))
        return 0;
      double va = rn_load(pa, dt, 0), vb = rn_load(pb, dt, 0);
      double ej = va == vb ? 0 : fabs(va - vb) / (scale > 0 ? scale : 1);
      if (!(ej <= e)) e = isnan(ej) ? INFINITY : ej;
    }
  return tu_check(e <= grad_tol(dt), "%s: %s %.3g of its largest magnitude from unsharded", what,
                  name, e);
}

/* The largest magnitude of columns [0, d) of a rows x d gradient. */
static inline double grad_scale(rmsnorm_dtype dt, size_t rows, size_t d, const void *a,
                                size_t ld) {
  double m = 0;
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < d; j++) m = fmax(m, fabs(rn_load(a, dt, i * ld + j)));
  return m;
}

#endif
