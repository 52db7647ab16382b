/* parallel.c - the thread pool: workers sleep on a condition variable until
 * the caller publishes a new generation of work, run their task, and count
 * down; the caller runs task 0 itself meanwhile. */
#include "parallel.h"

#include <pthread.h>
#include <stdlib.h>

struct rn_pool {
  pthread_mutex_t lock;
  pthread_cond_t start, done;
  int threads;          /* tasks it can run at once, the caller included */
  int started;          /* workers actually running */
  unsigned long generation;
  int stop;
  int pending;          /* workers yet to finish this generation */
  rn_task_fn fn;
  void *arg;
  int ntasks;
  pthread_t *workers;
};

typedef struct worker_start {
  rn_pool *pool;
  int index; /* task index this worker runs: 1 .. threads-1 */
} worker_start;

static void *worker_main(void *p) {
  worker_start ws = *(worker_start *)p;
  free(p);
  rn_pool *pool = ws.pool;
  unsigned long seen = 0;
  pthread_mutex_lock(&pool->lock);
  for (;;) {
    while (pool->generation == seen && !pool->stop) pthread_cond_wait(&pool->start, &pool->lock);
    if (pool->stop) break;
    seen = pool->generation;
    rn_task_fn fn = pool->fn;
    void *arg = pool->arg;
    int ntasks = pool->ntasks;
    pthread_mutex_unlock(&pool->lock);
    if (ws.index < ntasks) fn(arg, ws.index, ntasks);
    pthread_mutex_lock(&pool->lock);
    if (--pool->pending == 0) pthread_cond_signal(&pool->done);
  }
  pthread_mutex_unlock(&pool->lock);
  return NULL;
}

rn_pool *rn_pool_create(int threads) {
  rn_pool *pool = calloc(1, sizeof *pool);
  if (!pool) return NULL;
  pool->workers = calloc((size_t)(threads > 1 ? threads - 1 : 1), sizeof(pthread_t));
  if (!pool->workers || pthread_mutex_init(&pool->lock, NULL) != 0) {
    free(pool->workers);
    free(pool);
    return NULL;
  }
  pthread_cond_init(&pool->start, NULL);
  pthread_cond_init(&pool->done, NULL);
  pool->threads = 1;
  for (int i = 1; i < threads; i++) {
    worker_start *ws = malloc(sizeof *ws);
    if (!ws) break;
    ws->pool = pool;
    ws->index = i;
    if (pthread_create(&pool->workers[i - 1], NULL, worker_main, ws) != 0) {
      free(ws);
      break;
    }
    pool->started++;
    pool->threads++;
  }
  return pool;
}

void rn_pool_free(rn_pool *pool) {
  if (!pool) return;
  pthread_mutex_lock(&pool->lock);
  pool->stop = 1;
  pthread_cond_broadcast(&pool->start);
  pthread_mutex_unlock(&pool->lock);
  for (int i = 0; i < pool->started; i++) pthread_join(pool->workers[i], NULL);
  pthread_cond_destroy(&pool->start);
  pthread_cond_destroy(&pool->done);
  pthread_mutex_destroy(&pool->lock);
  free(pool->workers);
  free(pool);
}

int rn_pool_threads(const rn_pool *pool) { return pool->threads; }

void rn_pool_run(rn_pool *pool, int ntasks, rn_task_fn fn, void *arg) {
  if (ntasks <= 1 || pool->started == 0) {
    for (int t = 0; t < ntasks; t++) fn(arg, t, ntasks);
    return;
  }
  pthread_mutex_lock(&pool->lock);
  pool->fn = fn;
  pool->arg = arg;
  pool->ntasks = ntasks;
  pool->pending = pool->started;
  pool->generation++;
  pthread_cond_broadcast(&pool->start);
  pthread_mutex_unlock(&pool->lock);
  fn(arg, 0, ntasks);
  pthread_mutex_lock(&pool->lock);
  while (pool->pending > 0) pthread_cond_wait(&pool->done, &pool->lock);
  pthread_mutex_unlock(&pool->lock);
}
