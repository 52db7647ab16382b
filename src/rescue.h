/* rescue.h - the double-precision, range-scaled path for the rare rows whose
 * fast-path sums overflowed, underflowed or met a NaN/Inf. Shared by every
 * ISA, so a rescued row has the same bits whatever kernel set runs. */
#ifndef RMSNORM_RESCUE_H
#define RMSNORM_RESCUE_H

#include "kernels.h"

/* Computes row `row` of a forward completely (y, mean, rstd). */
void rn_rescue_forward_row(const rn_forward_args *a, size_t row);

/* Computes row `row` of a backward completely (dx), adding its dweight/dbias
 * terms into dw_part/db_part (acc type, may be NULL). Saved stats are ignored:
 * the row's statistics are recomputed from x. */
void rn_rescue_backward_row(const rn_backward_args *a, size_t row, void *dw_part,
                            void *db_part);

#endif
