/* context.h - what the API layer needs of a context: its lock, its scratch
 * (grown on demand, kept between calls so warm calls do not allocate, given
 * back by rmsnorm_context_trim), the kernel set it runs and its thread
 * limit. The threads themselves are the process-wide pool's (parallel.h). */
#ifndef RMSNORM_CONTEXT_H
#define RMSNORM_CONTEXT_H

#include <stddef.h>

#include "kernels/kernels.h"
#include "runtime/parallel.h"
#include "rmsnorm.h"

/* Calls on one context that use its scratch or its workers serialize: such
 * an entry point locks the context after validating its arguments and before
 * it takes scratch, and unlocks it when done. A call that needs neither
 * (api/entry.h: rn_entry_unlocked) reads the kernel set and the thread count
 * alone, without the lock, and runs at once, as a plan's run does.
 * Lock discipline: the function that locks a context unlocks it, on every
 * path out, errors included; nothing called with the lock held unlocks it
 * (api/entry.h: rn_entry_lock, then every return through rn_entry_unlock). */
void rn_context_lock(rmsnorm_context *ctx);
void rn_context_unlock(rmsnorm_context *ctx);
/* At least `bytes` (and at least 64) of 64-byte-aligned scratch, lock held.
 * NULL when it cannot be allocated (the old scratch is kept, the lock still
 * held). */
void *rn_context_scratch(rmsnorm_context *ctx, size_t bytes);
/* The kernel set and the most threads a call may use; with or without the
 * lock (a set_isa or set_threads meanwhile gives the old value or the new). */
const rn_kernel_set *rn_context_kernels(const rmsnorm_context *ctx);
int rn_context_threads(const rmsnorm_context *ctx);

#endif
