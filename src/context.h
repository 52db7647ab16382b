/* context.h - what the API layer needs of a context: its lock, its scratch
 * (grown on demand, kept between calls so warm calls do not allocate) and
 * the kernel set it runs. */
#ifndef RMSNORM_CONTEXT_H
#define RMSNORM_CONTEXT_H

#include <stddef.h>

#include "kernels.h"
#include "parallel.h"
#include "rmsnorm.h"

/* Calls on one context serialize: an entry point locks the context after
 * validating its arguments and before it reads anything of the context
 * (kernel set, thread count, scratch), and unlocks it when done. */
void rn_context_lock(rmsnorm_context *ctx);
void rn_context_unlock(rmsnorm_context *ctx);
/* At least `bytes` (and at least 64) of 64-byte-aligned scratch, lock held.
 * When it cannot be allocated, unlocks the context and returns NULL (the
 * caller returns RMSNORM_ERROR_OUT_OF_MEMORY; the old scratch is kept). */
void *rn_context_scratch(rmsnorm_context *ctx, size_t bytes);
const rn_kernel_set *rn_context_kernels(const rmsnorm_context *ctx);
/* The most threads a call may use. */
int rn_context_threads(const rmsnorm_context *ctx);
/* The context's pool when `wanted` > 1 threads are worth starting (created
 * on first use with rn_context_threads() threads; may run fewer if the OS
 * refused some), else NULL. Call with the lock held. */
rn_pool *rn_context_pool(rmsnorm_context *ctx, int wanted);

#endif
