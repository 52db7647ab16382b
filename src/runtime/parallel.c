/* parallel.c - the process-wide worker pool (see parallel.h). Each worker
 * sleeps on its own condition variable until a call assigns it a job; a
 * job's tasks are handed out by an atomic counter to the caller and the
 * workers it claimed; the caller takes back claims that no worker picked up
 * by the time it ran out of tasks, then waits for the workers that did. With
 * more tasks than threads, a worker that wakes late (its core busy with
 * another process) takes fewer tasks: the caller waits at most for the task
 * that worker holds, never for a fixed share of the work. The pool also
 * keeps a running estimate of how long woken workers take to start, for the
 * cost model (work.c). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "runtime/parallel.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define MAX_WORKERS 1023

typedef struct job {
  rn_task_fn fn;
  void *arg;
  int ntasks;
  atomic_int next; /* the next task index to hand out */
  int active;      /* workers claimed and not yet done (pool lock) */
  double start;    /* when the caller woke its workers (seconds, monotonic) */
} job;

enum { IDLE, ASSIGNED, RUNNING };

typedef struct worker {
  pthread_t thread;
  pthread_cond_t wake;
  job *job;  /* the job it is assigned to, or NULL (pool lock) */
  int state; /* IDLE, ASSIGNED (claimed, not yet running), RUNNING */
  int stop;
  int fresh; /* started for the job it holds: its start is not a wake-up */
} worker;

static struct {
  pthread_mutex_t lock;
  pthread_cond_t done; /* broadcast when a job's last worker finishes */
  worker *w[MAX_WORKERS];
  int nworkers;
  int refs;      /* contexts alive */
  int can_grow;  /* 0 once the OS refused a thread: no more tries */
  double wake, wake_at; /* the wake-up estimate (seconds) and when it was set */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, 0, 0, 1, 0, 0};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The wake-up estimate decays with a half-life of WAKE_HALF_LIFE seconds, so
 * one slow wake (another process held the core) stops splitting calls only
 * for a while, and the next split measures again. */
#define WAKE_HALF_LIFE 0.5

static double wake_decayed(double t) {
  double age = t - pool.wake_at;
  return age <= 0 ? pool.wake : pool.wake * exp2(-age / WAKE_HALF_LIFE);
}

/* A worker took `latency` seconds from being woken to running (or at least
 * that long: it had not started when the caller finished); pool lock held. */
static void observe_wake(double latency, double t) {
  double w = wake_decayed(t);
  pool.wake = w + 0.5 * (latency - w);
  pool.wake_at = t;
}

static void run_tasks(job *j) {
  for (;;) {
    int t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    if (t >= j->ntasks) return;
    j->fn(j->arg, t, j->ntasks);
  }
}

static void *worker_main(void *p) {
  worker *w = p;
  pthread_mutex_lock(&pool.lock);
  for (;;) {
    while (!w->stop && w->state != ASSIGNED) pthread_cond_wait(&w->wake, &pool.lock);
    if (w->stop) break;
    job *j = w->job;
    w->state = RUNNING;
    double t = now_s();
    if (!w->fresh) observe_wake(t - j->start, t);
    w->fresh = 0;
    pthread_mutex_unlock(&pool.lock);
    run_tasks(j);
    pthread_mutex_lock(&pool.lock);
    w->state = IDLE;
    w->job = NULL;
    if (--j->active == 0) pthread_cond_broadcast(&pool.done);
  }
  pthread_mutex_unlock(&pool.lock);
  return NULL;
}

/* Starts workers until there are `want` (pool lock held). */
static void grow(int want) {
  if (want > MAX_WORKERS) want = MAX_WORKERS;
  while (pool.nworkers < want && pool.can_grow) {
    worker *w = calloc(1, sizeof *w);
    if (!w || pthread_cond_init(&w->wake, NULL) != 0) {
      free(w);
      pool.can_grow = 0;
      return;
    }
    w->fresh = 1;
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
      pthread_cond_destroy(&w->wake);
      free(w);
      pool.can_grow = 0;
      return;
    }
    pool.w[pool.nworkers++] = w;
  }
}

void rn_parallel_run(int nthreads, int ntasks, rn_task_fn fn, void *arg) {
  if (nthreads > ntasks) nthreads = ntasks;
  if (nthreads <= 1) {
    for (int t = 0; t < ntasks; t++) fn(arg, t, ntasks);
    return;
  }
  job j;
  j.fn = fn;
  j.arg = arg;
  j.ntasks = ntasks;
  atomic_init(&j.next, 0);
  j.active = 0;
  j.start = now_s();
  pthread_mutex_lock(&pool.lock);
  grow(nthreads - 1);
  for (int i = 0; i < pool.nworkers && j.active < nthreads - 1; i++) {
    worker *w = pool.w[i];
    if (w->state != IDLE) continue;
    w->state = ASSIGNED;
    w->job = &j;
    j.active++;
    pthread_cond_signal(&w->wake);
  }
  pthread_mutex_unlock(&pool.lock);
  run_tasks(&j);
  pthread_mutex_lock(&pool.lock);
  if (j.active > 0) {
    /* every task is handed out: claims not yet picked up are returned */
    for (int i = 0; i < pool.nworkers; i++) {
      worker *w = pool.w[i];
      if (w->job == &j && w->state == ASSIGNED) {
        double t = now_s();
        if (!w->fresh) observe_wake(t - j.start, t);
        w->state = IDLE;
        w->job = NULL;
        j.active--;
      }
    }
    while (j.active > 0) pthread_cond_wait(&pool.done, &pool.lock);
  }
  pthread_mutex_unlock(&pool.lock);
}

void rn_parallel_retain(void) {
  pthread_mutex_lock(&pool.lock);
  pool.refs++;
  pthread_mutex_unlock(&pool.lock);
}

void rn_parallel_release(void) {
  pthread_mutex_lock(&pool.lock);
  if (--pool.refs > 0 || pool.nworkers == 0) {
    pthread_mutex_unlock(&pool.lock);
    return;
  }
  /* the last context is gone, so no call is running: stop every worker */
  int n = pool.nworkers;
  worker *ws[MAX_WORKERS];
  for (int i = 0; i < n; i++) {
    ws[i] = pool.w[i];
    ws[i]->stop = 1;
    pthread_cond_signal(&ws[i]->wake);
  }
  pool.nworkers = 0;
  pool.can_grow = 1;
  pthread_mutex_unlock(&pool.lock);
  for (int i = 0; i < n; i++) {
    pthread_join(ws[i]->thread, NULL);
    pthread_cond_destroy(&ws[i]->wake);
    free(ws[i]);
  }
}

void rn_parallel_fork_prepare(void) { pthread_mutex_lock(&pool.lock); }

void rn_parallel_fork_parent(void) { pthread_mutex_unlock(&pool.lock); }

void rn_parallel_fork_child(void) {
  /* Only the forking thread exists here. The parent's workers were idle (the
   * prepare handlers waited for every call to finish) and sleep on their
   * condition variables in a process that is not this one: their records
   * are freed without pthread_cond_destroy (a condition variable with
   * waiters must not be destroyed; none of them will ever wake). */
  for (int i = 0; i < pool.nworkers; i++) free(pool.w[i]);
  pool.nworkers = 0;
  pool.can_grow = 1;
  pthread_mutex_unlock(&pool.lock);
}

double rn_parallel_wake_estimate(void) {
  pthread_mutex_lock(&pool.lock);
  double w = wake_decayed(now_s());
  pthread_mutex_unlock(&pool.lock);
  return w;
}

int rn_parallel_workers(void) {
  pthread_mutex_lock(&pool.lock);
  int n = pool.nworkers;
  pthread_mutex_unlock(&pool.lock);
  return n;
}
