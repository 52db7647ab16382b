/* parallel.h - a persistent pool of worker threads owned by a context. The
 * caller's thread runs task 0 and waits for the rest; tasks never steal, so
 * each task's share of the work is fixed by the caller (and results that
 * depend on a split are made not to depend on it). */
#ifndef RMSNORM_PARALLEL_H
#define RMSNORM_PARALLEL_H

typedef struct rn_pool rn_pool;
typedef void (*rn_task_fn)(void *arg, int task, int ntasks);

/* A pool able to run `threads` tasks at once (threads - 1 workers), or NULL. */
rn_pool *rn_pool_create(int threads);
void rn_pool_free(rn_pool *pool);
int rn_pool_threads(const rn_pool *pool);
/* Runs fn(arg, t, ntasks) for t in [0, ntasks), ntasks <= rn_pool_threads;
 * returns when all are done. */
void rn_pool_run(rn_pool *pool, int ntasks, rn_task_fn fn, void *arg);

#endif
