/* rescue.h - the double-precision, range-scaled path for the rare rows whose
 * fast-path sums overflowed, underflowed or met a NaN/Inf. Shared by every
 * ISA, so a rescued row has the same bits whatever kernel set runs. */
#ifndef RMSNORM_RESCUE_H
#define RMSNORM_RESCUE_H

#include <float.h>
#include <math.h>

#include "kernels/kernels.h"

/* Computes row `row` of a forward completely (y, mean, rstd). */
void rn_rescue_forward_row(const rn_forward_args *a, size_t row);

/* Computes row `row` of a backward completely (dx), adding its dweight/dbias
 * terms into dw_part/db_part (acc type, may be NULL). Saved stats are ignored:
 * the row's statistics are recomputed from x. */
void rn_rescue_backward_row(const rn_backward_args *a, size_t row, void *dw_part,
                            void *db_part);

/* v * rs * 2^-e without leaving double's range on the way: the mantissas
 * (in [0.5, 1)) are multiplied, rounded once, and the exponents added. rs
 * may be anywhere in range (tiny when eps dominates the statistic). */
static inline double rn_scaled_mul(double v, double rs, int e) {
  int ev, er;
  double mv = frexp(v, &ev), mr = frexp(rs, &er);
  return ldexp(mv * mr, ev + er - e);
}

/* RMSNorm r of row `row` of a->x in a scaled form that never leaves
 * double's range: r = *rs * 2^-*e. *rs is NaN when the statistic's elements
 * hold a NaN; 0 when they hold an infinity (r = 1/sqrt(inf), *e = 0) or for
 * a zero row with eps = 0. */
void rn_rescue_row_r(const rn_forward_args *a, size_t row, double *rs, int *e);

#endif
