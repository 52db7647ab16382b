/* context.h - what the API layer needs of a context: its lock, its scratch
 * (grown on demand, kept between calls so warm calls do not allocate) and
 * the kernel set it runs. */
#ifndef RMSNORM_CONTEXT_H
#define RMSNORM_CONTEXT_H

#include <stddef.h>

#include "kernels.h"
#include "parallel.h"
#include "rmsnorm.h"

void rn_context_lock(rmsnorm_context *ctx);
void rn_context_unlock(rmsnorm_context *ctx);
/* At least `bytes` of 64-byte-aligned scratch, or NULL when it cannot be had
 * (the old scratch is kept). Call with the lock held. */
void *rn_context_scratch(rmsnorm_context *ctx, size_t bytes);
/* Locks the context and returns at least `bytes` (and at least 64) of its
 * scratch; on allocation failure unlocks it again and returns NULL. */
void *rn_context_acquire(rmsnorm_context *ctx, size_t bytes);
const rn_kernel_set *rn_context_kernels(const rmsnorm_context *ctx);
/* The most threads a call may use. */
int rn_context_threads(const rmsnorm_context *ctx);
/* The context's pool when `wanted` > 1 threads are worth starting (created
 * on first use with rn_context_threads() threads; may run fewer if the OS
 * refused some), else NULL. Call with the lock held. */
rn_pool *rn_context_pool(rmsnorm_context *ctx, int wanted);

#endif
