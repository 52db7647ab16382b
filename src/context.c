/* context.c - the opaque rmsnorm_context: a mutex (calls on a shared context
 * serialize), scratch memory, the kernel set in use, and the thread pool
 * (started on first use by work large enough to split). */
#include "context.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "dispatch.h"

#define MAX_THREADS 1024

struct rmsnorm_context {
  pthread_mutex_t lock;
  void *scratch;
  size_t scratch_bytes;
  rmsnorm_isa isa;
  const rn_kernel_set *kernels;
  int threads;   /* the most threads a call may use */
  rn_pool *pool; /* NULL until needed; rebuilt when `threads` changes */
  int pool_for;  /* the `threads` the pool was made for */
};

static int online_cpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

rmsnorm_status rmsnorm_context_create(rmsnorm_context **ctx) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_context *c = calloc(1, sizeof *c);
  if (!c) return RMSNORM_ERROR_OUT_OF_MEMORY;
  if (pthread_mutex_init(&c->lock, NULL) != 0) {
    free(c);
    return RMSNORM_ERROR_OUT_OF_MEMORY;
  }
  c->isa = rn_isa_auto();
  c->kernels = rn_kernels_for(c->isa);
  c->threads = online_cpus();
  *ctx = c;
  return RMSNORM_OK;
}

void rmsnorm_context_free(rmsnorm_context *ctx) {
  if (!ctx) return;
  rn_pool_free(ctx->pool);
  pthread_mutex_destroy(&ctx->lock);
  free(ctx->scratch);
  free(ctx);
}

rmsnorm_status rmsnorm_context_set_isa(rmsnorm_context *ctx, rmsnorm_isa isa) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  if (isa < RMSNORM_ISA_AUTO || isa > RMSNORM_ISA_AVX512) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (isa == RMSNORM_ISA_AUTO) isa = rn_isa_auto();
  const rn_kernel_set *k = rn_kernels_for(isa);
  if (!k) return RMSNORM_ERROR_NOT_AVAILABLE;
  pthread_mutex_lock(&ctx->lock);
  ctx->isa = isa;
  ctx->kernels = k;
  pthread_mutex_unlock(&ctx->lock);
  return RMSNORM_OK;
}

rmsnorm_status rmsnorm_context_get_isa(const rmsnorm_context *ctx, rmsnorm_isa *isa) {
  if (!ctx || !isa) return RMSNORM_ERROR_NULL_POINTER;
  *isa = ctx->isa;
  return RMSNORM_OK;
}

rmsnorm_status rmsnorm_context_set_threads(rmsnorm_context *ctx, int threads) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  if (threads < 0 || threads > MAX_THREADS) return RMSNORM_ERROR_BAD_ARGUMENT;
  pthread_mutex_lock(&ctx->lock);
  ctx->threads = threads ? threads : online_cpus();
  pthread_mutex_unlock(&ctx->lock);
  return RMSNORM_OK;
}

rmsnorm_status rmsnorm_context_get_threads(const rmsnorm_context *ctx, int *threads) {
  if (!ctx || !threads) return RMSNORM_ERROR_NULL_POINTER;
  *threads = ctx->threads;
  return RMSNORM_OK;
}

void rn_context_lock(rmsnorm_context *ctx) { pthread_mutex_lock(&ctx->lock); }
void rn_context_unlock(rmsnorm_context *ctx) { pthread_mutex_unlock(&ctx->lock); }

void *rn_context_scratch(rmsnorm_context *ctx, size_t bytes) {
  if (bytes < 64) bytes = 64;
  if (bytes <= ctx->scratch_bytes) return ctx->scratch;
  size_t rounded = (bytes + 63) & ~(size_t)63;
  void *p = rounded < bytes ? NULL : aligned_alloc(64, rounded);
  if (!p) {
    rn_context_unlock(ctx);
    return NULL;
  }
  free(ctx->scratch);
  ctx->scratch = p;
  ctx->scratch_bytes = rounded;
  return p;
}

const rn_kernel_set *rn_context_kernels(const rmsnorm_context *ctx) { return ctx->kernels; }

int rn_context_threads(const rmsnorm_context *ctx) { return ctx->threads; }

rn_pool *rn_context_pool(rmsnorm_context *ctx, int wanted) {
  if (wanted <= 1) return NULL;
  if (ctx->pool && ctx->pool_for == ctx->threads) return ctx->pool;
  rn_pool_free(ctx->pool);
  ctx->pool = rn_pool_create(ctx->threads);
  ctx->pool_for = ctx->threads;
  return ctx->pool;
}
