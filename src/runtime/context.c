/* context.c - the opaque rmsnorm_context: a mutex (calls on a shared context
 * that use its scratch or its workers serialize, and every field is written
 * under it), scratch memory, the kernel set in use and the thread limit
 * (both also read without the lock: context.h). The worker threads are the
 * process-wide pool's (parallel.c). Contexts are kept in a registry so that
 * fork() can wait for the calls in flight and leave the child every context
 * unlocked and usable (pthread_atfork handlers below). */
#include "runtime/context.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "runtime/dispatch.h"

#define MAX_THREADS 1024

struct rmsnorm_context {
  pthread_mutex_t lock;
  rmsnorm_context *prev, *next; /* the registry (registry_lock) */
  void *scratch;
  size_t scratch_bytes;
  rmsnorm_isa isa;
  /* written under the lock, read with or without it (a call that needs
   * neither scratch nor workers: context.h) */
  _Atomic(const rn_kernel_set *) kernels;
  _Atomic int threads; /* the most threads a call may use */
};

static int online_cpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

/* ---- the registry and fork --------------------------------------------- */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static rmsnorm_context *registry; /* every live context */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* Before fork(): lock the registry, then every context (which waits for the
 * calls in flight on other threads that hold it to finish), then the pool.
 * The child then starts with every lock free and none of the library's
 * state half changed (a call that runs without the lock changes none). */
static void fork_prepare(void) {
  pthread_mutex_lock(&registry_lock);
  for (rmsnorm_context *c = registry; c; c = c->next) pthread_mutex_lock(&c->lock);
  rn_parallel_fork_prepare();
}

static void fork_parent(void) {
  rn_parallel_fork_parent();
  for (rmsnorm_context *c = registry; c; c = c->next) pthread_mutex_unlock(&c->lock);
  pthread_mutex_unlock(&registry_lock);
}

/* The forking thread holds every lock (taken in fork_prepare) and unlocks
 * them; the pool forgets the parent's workers and starts new ones on the
 * child's first parallel call. */
static void fork_child(void) {
  rn_parallel_fork_child();
  for (rmsnorm_context *c = registry; c; c = c->next) pthread_mutex_unlock(&c->lock);
  pthread_mutex_unlock(&registry_lock);
}

static void register_atfork(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

/* ---- public ------------------------------------------------------------- */

rmsnorm_status rmsnorm_context_create(rmsnorm_context **ctx) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  pthread_once(&atfork_once, register_atfork);
  rmsnorm_context *c = calloc(1, sizeof *c);
  if (!c) return RMSNORM_ERROR_OUT_OF_MEMORY;
  if (pthread_mutex_init(&c->lock, NULL) != 0) {
    free(c);
    return RMSNORM_ERROR_OUT_OF_MEMORY;
  }
  c->isa = rn_isa_auto();
  atomic_init(&c->kernels, rn_kernels_for(c->isa));
  atomic_init(&c->threads, online_cpus());
  pthread_mutex_lock(&registry_lock);
  c->next = registry;
  if (registry) registry->prev = c;
  registry = c;
  rn_parallel_retain();
  pthread_mutex_unlock(&registry_lock);
  *ctx = c;
  return RMSNORM_OK;
}

/* Neither locks ctx nor waits for its calls: the caller has ordered them all
 * before the free (rmsnorm.h). Taken out of the registry under its lock, ctx
 * is out of fork_prepare's reach before its mutex is destroyed. */
void rmsnorm_context_free(rmsnorm_context *ctx) {
  if (!ctx) return;
  pthread_mutex_lock(&registry_lock);
  if (ctx->prev) ctx->prev->next = ctx->next;
  else registry = ctx->next;
  if (ctx->next) ctx->next->prev = ctx->prev;
  rn_parallel_release();
  pthread_mutex_unlock(&registry_lock);
  pthread_mutex_destroy(&ctx->lock);
  free(ctx->scratch);
  free(ctx);
}

/* Every field is written under the lock, and the getters read under it too
 * (the context is const to the caller; its lock is not): locked() takes it,
 * and the accessor returns through unlocked(). */
static rmsnorm_context *locked(const rmsnorm_context *ctx) {
  rmsnorm_context *c = (rmsnorm_context *)ctx;
  pthread_mutex_lock(&c->lock);
  return c;
}

static rmsnorm_status unlocked(rmsnorm_context *c) {
  pthread_mutex_unlock(&c->lock);
  return RMSNORM_OK;
}

rmsnorm_status rmsnorm_context_set_isa(rmsnorm_context *ctx, rmsnorm_isa isa) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  if (isa < RMSNORM_ISA_AUTO || isa > RMSNORM_ISA_NEON) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (isa == RMSNORM_ISA_AUTO) isa = rn_isa_auto();
  const rn_kernel_set *k = rn_kernels_for(isa);
  if (!k) return RMSNORM_ERROR_NOT_AVAILABLE;
  rmsnorm_context *c = locked(ctx);
  c->isa = isa;
  atomic_store_explicit(&c->kernels, k, memory_order_relaxed);
  return unlocked(c);
}

rmsnorm_status rmsnorm_context_get_isa(const rmsnorm_context *ctx, rmsnorm_isa *isa) {
  if (!ctx || !isa) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_context *c = locked(ctx);
  *isa = c->isa;
  return unlocked(c);
}

rmsnorm_status rmsnorm_context_set_threads(rmsnorm_context *ctx, int threads) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  if (threads < 0 || threads > MAX_THREADS) return RMSNORM_ERROR_BAD_ARGUMENT;
  rmsnorm_context *c = locked(ctx);
  atomic_store_explicit(&c->threads, threads ? threads : online_cpus(), memory_order_relaxed);
  return unlocked(c);
}

rmsnorm_status rmsnorm_context_get_threads(const rmsnorm_context *ctx, int *threads) {
  if (!ctx || !threads) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_context *c = locked(ctx);
  *threads = atomic_load_explicit(&c->threads, memory_order_relaxed);
  return unlocked(c);
}

rmsnorm_status rmsnorm_context_trim(rmsnorm_context *ctx) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_context *c = locked(ctx);
  free(c->scratch);
  c->scratch = NULL;
  c->scratch_bytes = 0;
  return unlocked(c);
}

rmsnorm_status rmsnorm_context_get_scratch_bytes(const rmsnorm_context *ctx, size_t *bytes) {
  if (!ctx || !bytes) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_context *c = locked(ctx);
  *bytes = c->scratch_bytes;
  return unlocked(c);
}

/* ---- internal ----------------------------------------------------------- */

void rn_context_lock(rmsnorm_context *ctx) { pthread_mutex_lock(&ctx->lock); }
void rn_context_unlock(rmsnorm_context *ctx) { pthread_mutex_unlock(&ctx->lock); }

void *rn_context_scratch(rmsnorm_context *ctx, size_t bytes) {
  if (bytes < 64) bytes = 64;
  if (bytes <= ctx->scratch_bytes) return ctx->scratch;
  size_t rounded = (bytes + 63) & ~(size_t)63;
  void *p = rounded < bytes ? NULL : aligned_alloc(64, rounded);
  if (!p) return NULL;
  free(ctx->scratch);
  ctx->scratch = p;
  ctx->scratch_bytes = rounded;
  return p;
}

/* relaxed: a set is an immutable table, and any value either field has
 * held gives the same results (the sets' bits are the same; the thread
 * count changes only the split) */
const rn_kernel_set *rn_context_kernels(const rmsnorm_context *ctx) {
  return atomic_load_explicit(&ctx->kernels, memory_order_relaxed);
}

int rn_context_threads(const rmsnorm_context *ctx) {
  return atomic_load_explicit(&ctx->threads, memory_order_relaxed);
}
