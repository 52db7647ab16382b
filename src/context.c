/* context.c - the opaque rmsnorm_context: a mutex (calls on a shared context
 * serialize), scratch memory, and the kernel set in use. */
#include "context.h"

#include <pthread.h>
#include <stdlib.h>

struct rmsnorm_context {
  pthread_mutex_t lock;
  void *scratch;
  size_t scratch_bytes;
  const rn_kernel_set *kernels;
};

rmsnorm_status rmsnorm_context_create(rmsnorm_context **ctx) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_context *c = calloc(1, sizeof *c);
  if (!c) return RMSNORM_ERROR_OUT_OF_MEMORY;
  if (pthread_mutex_init(&c->lock, NULL) != 0) {
    free(c);
    return RMSNORM_ERROR_OUT_OF_MEMORY;
  }
  c->kernels = &rn_kernels_ref;
  *ctx = c;
  return RMSNORM_OK;
}

void rmsnorm_context_free(rmsnorm_context *ctx) {
  if (!ctx) return;
  pthread_mutex_destroy(&ctx->lock);
  free(ctx->scratch);
  free(ctx);
}

void rn_context_lock(rmsnorm_context *ctx) { pthread_mutex_lock(&ctx->lock); }
void rn_context_unlock(rmsnorm_context *ctx) { pthread_mutex_unlock(&ctx->lock); }

void *rn_context_scratch(rmsnorm_context *ctx, size_t bytes) {
  if (bytes <= ctx->scratch_bytes) return ctx->scratch;
  size_t rounded = (bytes + 63) & ~(size_t)63;
  if (rounded < bytes) return NULL;
  void *p = aligned_alloc(64, rounded);
  if (!p) return NULL;
  free(ctx->scratch);
  ctx->scratch = p;
  ctx->scratch_bytes = rounded;
  return p;
}

const rn_kernel_set *rn_context_kernels(const rmsnorm_context *ctx) { return ctx->kernels; }
