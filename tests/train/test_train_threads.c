/* test_train_threads.c - the training demo gives the same bits with 1 and 2
 * threads: for each norm, a few AdamW steps of the float model from the same
 * seed and batches, compared loss by loss and parameter by parameter. The
 * model is big enough that both thread pools really work: the test checks
 * that the model's pool ran tasks on its worker (and started it: Linux's
 * /proc/self/task; librmsnorm's own worker, which its cost model may leave
 * asleep on a loaded machine, is reported, not required), and that OpenBLAS ran
 * single-threaded inside the tasks (its results could otherwise depend on
 * its own thread count). */
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "../check.h"
#include "model.h"

#define STEPS 3

/* Threads of this process, or -1 where /proc is not there. */
static int count_threads(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

typedef struct result {
  double loss[STEPS];
  double *params;
  int threads_alive; /* process threads while the model was alive */
  long worker_tasks;
} result;

/* Trains a fresh model STEPS steps with `threads` threads. */
static int train(train_norm norm, int threads, result *r) {
  train_shape s;
  train_shape_default(&s);
  /* N = 1024 rows of 256 floats: 1 MiB per operand, enough traffic that
   * librmsnorm's cost model (src/runtime/work.c) splits some of the norms' calls
   * over 2 threads */
  s.batch = 16;
  s.seq_len = 64;
  s.layers = 1;
  s.dim = 256;
  s.heads = 4;
  s.norm = norm;
  train_model *m;
  char err[256];
  if (train_model_create(&s, 0, 11, &m, err, sizeof err) || train_model_set_threads(m, threads, threads)) {
    tu_check(0, "%s: create: %s", train_norm_name(norm), m ? train_model_error(m) : err);
    train_model_free(m);
    return -1;
  }
  int N = s.batch * s.seq_len;
  uint8_t *in = malloc((size_t)N), *tg = malloc((size_t)N);
  const char *text = "Normalization keeps deep residual networks trainable; RMSNorm drops "
                     "the re-centering of LayerNorm and keeps the re-scaling.\n";
  size_t len = strlen(text);
  uint64_t rng = 5;
  for (int step = 0; step < STEPS; step++) {
    for (int b = 0; b < s.batch; b++) {
      size_t at = (size_t)(train_rand64(&rng) % len);
      for (int t = 0; t < s.seq_len; t++) {
        in[b * s.seq_len + t] = (uint8_t)text[(at + t) % len];
        tg[b * s.seq_len + t] = (uint8_t)text[(at + t + 1) % len];
      }
    }
    r->loss[step] = train_model_forward(m, in, tg);
    tu_check(train_model_backward(m) == 0, "%s, %d threads: backward: %s", train_norm_name(norm),
          threads, train_model_error(m) ? train_model_error(m) : "?");
    train_model_step(m, 3e-3, 0.1, 1.0);
  }
#ifdef TRAIN_HAVE_OPENBLAS
  tu_check(openblas_get_num_threads() == 1, "OpenBLAS runs %d threads, want 1 inside the tasks",
        openblas_get_num_threads());
#endif
  r->threads_alive = count_threads();
  r->worker_tasks = train_model_worker_tasks(m);
  size_t n = train_model_num_params(m);
  r->params = malloc(n * sizeof *r->params);
  for (size_t i = 0; i < n; i++) r->params[i] = train_model_param(m, i);
  int ok = 0;
  for (int i = 0; i < STEPS; i++) ok |= !isfinite(r->loss[i]);
  tu_check(!ok, "%s, %d threads: loss not finite", train_norm_name(norm), threads);
  tu_check(r->loss[STEPS - 1] < r->loss[0], "%s, %d threads: loss %g -> %g does not fall",
        train_norm_name(norm), threads, r->loss[0], r->loss[STEPS - 1]);
  train_model_free(m);
  free(in);
  free(tg);
  return (int)n;
}

int main(void) {
  int start_threads = count_threads(); /* main and OpenBLAS's own (idle) workers */
  for (int k = 0; k < 4; k++) {
    train_norm norm = (train_norm)k;
    result one, two;
    int n1 = train(norm, 1, &one), n2 = train(norm, 2, &two);
    if (n1 < 0 || n2 < 0) continue;
    for (int i = 0; i < STEPS; i++)
      tu_check(memcmp(&one.loss[i], &two.loss[i], sizeof(double)) == 0,
            "%s step %d: loss %.17g with 1 thread, %.17g with 2", train_norm_name(norm), i + 1,
            one.loss[i], two.loss[i]);
    size_t differ = 0;
    for (int i = 0; i < n1; i++) differ += memcmp(&one.params[i], &two.params[i], sizeof(double)) != 0;
    tu_check(differ == 0, "%s: %zu of %d parameters differ between 1 and 2 threads",
          train_norm_name(norm), differ, n1);
    tu_check(one.worker_tasks == 0 && two.worker_tasks > 0,
          "%s: worker tasks %ld (1 thread), %ld (2 threads): want 0 and > 0",
          train_norm_name(norm), one.worker_tasks, two.worker_tasks);
    /* 2 threads: one more than at the start for the model's pool. librmsnorm's
     * own worker (one more again) is not required: its cost model wakes it
     * only when a call pays for the wake-up, which it estimates from the
     * wake-ups it has seen, so on a loaded machine (a sanitizer build beside
     * another test) it may rightly keep every call of a model on one thread.
     * Its count is printed below. */
    if (start_threads > 0)
      tu_check(two.threads_alive >= start_threads + 1,
            "%s: %d threads at the start, %d with a 2-thread model: want 1 more (the model's "
            "pool did not start)",
            train_norm_name(norm), start_threads, two.threads_alive);
    printf("%-5s: losses %.6f %.6f %.6f, %d parameters: same bits with 1 and 2 threads "
           "(process threads: %d at the start, %d and %d with the models; worker tasks %ld)\n",
           train_norm_name(norm), two.loss[0], two.loss[1], two.loss[2], n1, start_threads,
           one.threads_alive, two.threads_alive, two.worker_tasks);
    free(one.params);
    free(two.params);
  }
  return tu_summary("test_train_threads");
}
