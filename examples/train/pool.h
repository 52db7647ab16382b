/* pool.h - the model's thread pool: runs tasks 0..n-1 of a job on the
 * caller and its workers. Jobs are cut into tasks by the caller in a way
 * that does not depend on the thread count, and each task writes its own
 * outputs, so results are the same bits for any number of threads. Idle
 * workers sleep (no spinning), so the pool leaves the cores to librmsnorm's
 * own threads between jobs. */
#ifndef TRAIN_POOL_H
#define TRAIN_POOL_H

typedef void (*train_task_fn)(void *arg, int task);

typedef struct train_pool train_pool;

/* A pool of threads in all, the caller included (threads - 1 workers).
 * @return the pool, or NULL (out of memory, or a thread could not start). */
train_pool *train_pool_create(int threads);
/* Stops and joins the workers; NULL is accepted. */
void train_pool_free(train_pool *pool);
/* Runs fn(arg, t) for every t in [0, ntasks) and returns when all are done.
 * Tasks are handed out in order, one at a time, to whichever thread is free;
 * the workers run them in the caller's floating-point mode (fpmode.h).
 * A NULL pool runs them on the caller. */
void train_pool_run(train_pool *pool, int ntasks, train_task_fn fn, void *arg);
/* Tasks run by the workers (not the caller) since the pool was created. */
long train_pool_worker_tasks(const train_pool *pool);

#endif /* TRAIN_POOL_H */
