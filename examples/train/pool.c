/* pool.c - the model's thread pool (pool.h): workers wait on a condition
 * variable for a job, take on the caller's floating-point mode (fpmode.h),
 * then take tasks from a shared counter under the lock. */
#include "pool.h"

#include <pthread.h>

#include "fpmode.h"
#include <stdlib.h>

struct train_pool {
  pthread_mutex_t lock;
  pthread_cond_t start, done;
  pthread_t *workers;
  int nworkers;
  long generation; /* bumped for each job */
  int stop;
  /* the current job */
  train_task_fn fn;
  void *arg;
  int ntasks, next, finished;
  unsigned fp_mode; /* the caller's floating-point mode, taken on by the workers */
  long worker_tasks;
};

/* Takes and runs tasks until none is left. Called with the lock held;
 * returns with it held. */
static void drain(train_pool *p, int is_worker) {
  while (p->next < p->ntasks) {
    int t = p->next++;
    train_task_fn fn = p->fn;
    void *arg = p->arg;
    pthread_mutex_unlock(&p->lock);
    fn(arg, t);
    pthread_mutex_lock(&p->lock);
    p->finished++;
    if (is_worker) p->worker_tasks++;
  }
  if (p->finished == p->ntasks) pthread_cond_broadcast(&p->done);
}

static void *worker_main(void *vp) {
  train_pool *p = vp;
  long seen = 0;
  pthread_mutex_lock(&p->lock);
  for (;;) {
    while (p->generation == seen && !p->stop) pthread_cond_wait(&p->start, &p->lock);
    if (p->stop) break;
    seen = p->generation;
    train_fp_set(p->fp_mode);
    drain(p, 1);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

train_pool *train_pool_create(int threads) {
  train_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  if (threads < 1) threads = 1;
  p->workers = calloc((size_t)threads, sizeof *p->workers);
  if (!p->workers) {
    free(p);
    return NULL;
  }
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->start, NULL);
  pthread_cond_init(&p->done, NULL);
  for (int i = 0; i < threads - 1; i++) {
    if (pthread_create(&p->workers[i], NULL, worker_main, p) != 0) {
      train_pool_free(p);
      return NULL;
    }
    p->nworkers++;
  }
  return p;
}

void train_pool_free(train_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  p->stop = 1;
  pthread_cond_broadcast(&p->start);
  pthread_mutex_unlock(&p->lock);
  for (int i = 0; i < p->nworkers; i++) pthread_join(p->workers[i], NULL);
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->start);
  pthread_cond_destroy(&p->done);
  free(p->workers);
  free(p);
}

void train_pool_run(train_pool *p, int ntasks, train_task_fn fn, void *arg) {
  if (!p || p->nworkers == 0 || ntasks <= 1) {
    for (int t = 0; t < ntasks; t++) fn(arg, t);
    return;
  }
  pthread_mutex_lock(&p->lock);
  p->fn = fn;
  p->arg = arg;
  p->ntasks = ntasks;
  p->next = 0;
  p->finished = 0;
  p->fp_mode = train_fp_get();
  p->generation++;
  pthread_cond_broadcast(&p->start);
  drain(p, 0);
  while (p->finished < p->ntasks) pthread_cond_wait(&p->done, &p->lock);
  p->ntasks = 0; /* late workers find nothing to take */
  pthread_mutex_unlock(&p->lock);
}

long train_pool_worker_tasks(const train_pool *p) {
  return p ? p->worker_tasks : 0;
}
