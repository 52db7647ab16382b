/* parallel.h - the process-wide pool of worker threads that every context's
 * calls share. A call's tasks run on the calling thread and on the workers
 * that are idle when it starts, so concurrent calls (one context per thread,
 * as Python makes them) share the cores instead of each waking a full pool.
 * Tasks never depend on which thread runs them or how many join in: work is
 * split by task index and task count alone, and results that depend on a
 * split are made not to depend on it. */
#ifndef RMSNORM_PARALLEL_H
#define RMSNORM_PARALLEL_H

typedef void (*rn_task_fn)(void *arg, int task, int ntasks);

/* Runs fn(arg, t, ntasks) once for every t in [0, ntasks) and returns when
 * all have finished, on at most nthreads threads: the caller runs tasks
 * itself, and up to min(nthreads, ntasks) - 1 idle workers take tasks as
 * they come free (the pool grows to nthreads - 1 workers, started on first
 * need; a worker the OS refuses leaves its tasks to the others). */
void rn_parallel_run(int nthreads, int ntasks, rn_task_fn fn, void *arg);

/* The pool lives while a context exists: contexts take a reference when
 * created and drop it when freed; the last one stops and joins the workers
 * (so the library can be unloaded once every context is freed). */
void rn_parallel_retain(void);
void rn_parallel_release(void);

/* fork() support (context.c registers these with pthread_atfork, after its
 * own handlers have quiesced every context): prepare locks the pool, parent
 * unlocks it, child forgets the parent's workers (they do not exist in the
 * child) and unlocks it; the child's next parallel call starts new ones. */
void rn_parallel_fork_prepare(void);
void rn_parallel_fork_parent(void);
void rn_parallel_fork_child(void);

/* How long a woken worker has recently taken to start a task, in seconds:
 * a running estimate over the calls that woke workers (a worker that had not
 * started by the end of a call counts the call's length), decaying toward 0
 * with a half-life of half a second. On an idle machine it is tens of
 * microseconds; when another process holds the other cores, milliseconds.
 * The cost model (work.c) takes the larger of it and its own constant. */
double rn_parallel_wake_estimate(void);

/* Workers the pool has now (for tests and `rmsnorm info`-like reports). */
int rn_parallel_workers(void);

#endif
