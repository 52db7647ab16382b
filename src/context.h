/* context.h - what the API layer needs of a context: its lock, its scratch
 * (grown on demand, kept between calls so warm calls do not allocate) and
 * the kernel set it runs. */
#ifndef RMSNORM_CONTEXT_H
#define RMSNORM_CONTEXT_H

#include <stddef.h>

#include "kernels.h"
#include "rmsnorm.h"

void rn_context_lock(rmsnorm_context *ctx);
void rn_context_unlock(rmsnorm_context *ctx);
/* At least `bytes` of 64-byte-aligned scratch, or NULL when it cannot be had
 * (the old scratch is kept). Call with the lock held. */
void *rn_context_scratch(rmsnorm_context *ctx, size_t bytes);
const rn_kernel_set *rn_context_kernels(const rmsnorm_context *ctx);

#endif
