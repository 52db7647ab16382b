/* dispatch.h - from a requested rmsnorm_isa to a kernel set. */
#ifndef RMSNORM_DISPATCH_H
#define RMSNORM_DISPATCH_H

#include "kernels/kernels.h"

/* The kernel set for isa, or NULL when this build or CPU lacks it. AUTO
 * resolves to rn_isa_auto(). */
const rn_kernel_set *rn_kernels_for(rmsnorm_isa isa);
/* The run-time choice: RMSNORM_ISA from the environment when it names a
 * supported set, else the best supported one. Computed once. */
rmsnorm_isa rn_isa_auto(void);

#endif
