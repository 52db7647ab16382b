/* test_threads.c - many threads at once: every operation with random shapes
 * and variants, on two shared contexts and on each thread's own, while other
 * threads change the shared contexts' thread count and kernel set, read
 * them, trim their scratch, and create and free contexts. Every result must equal, bit for
 * bit, the same call made beforehand on one thread. Built and run under
 * ThreadSanitizer by `make test` (test-tsan). Set OPENBLAS_NUM_THREADS=1 for
 * it: a BLAS's own threading is outside this library. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "testutil.h"

#define NTHREADS 8
#define NSPECS 44
#define RUNS_PER_THREAD 30 /* 3 under emulation */
static int runs_per_thread(void) { return tu_emulated() ? 3 : RUNS_PER_THREAD; }

enum { OP_FWD, OP_LN_FWD, OP_BWD, OP_LN_BWD, OP_ADD_FWD, OP_ADD_BWD, OP_QUANT, OP_QK_FWD,
       OP_QK_BWD, OP_LIN_FWD, OP_LIN_BWD, NOPS };

typedef struct spec {
  int op;
  rmsnorm_dtype dt;
  size_t rows, d;
  unsigned flags;
  double partial, eps;
  uint64_t seed;
} spec;

typedef struct result {
  unsigned char *p;
  size_t n;
  rmsnorm_status st;
} result;

/* A private random source (testutil's is global, not for threads). */
static double rnd(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

static void *data(rmsnorm_dtype dt, size_t n, uint64_t *s, double base, double scale) {
  void *p = malloc(n * rn_dtype_size(dt) + 1);
  for (size_t i = 0; i < n; i++) rn_store(p, dt, i, base + scale * (2 * rnd(s) - 1));
  return p;
}

static void put(result *r, const void *p, size_t n) {
  r->p = realloc(r->p, r->n + n);
  memcpy(r->p + r->n, p, n);
  r->n += n;
}

/* Runs one spec on c with inputs drawn from its seed; every output in r. */
static result run_spec(rmsnorm_context *c, const spec *sp) {
  result r = {NULL, 0, RMSNORM_OK};
  uint64_t s = sp->seed;
  rmsnorm_dtype dt = sp->dt, adt = dt == RMSNORM_F64 ? RMSNORM_F64 : RMSNORM_F32;
  size_t rows = sp->rows, d = sp->d, n = 16, es = rn_dtype_size(dt), as = rn_acc_size(dt);
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.flags = sp->flags;
  cfg.partial = sp->partial;
  cfg.eps = sp->eps;
  void *x = data(dt, rows * d, &s, 0, 2), *dy = data(dt, rows * d, &s, 0, 1);
  void *w = data(dt, d, &s, 1, 0.3), *b = data(dt, d, &s, 0, 0.5);
  void *y = calloc(rows * d + 1, es), *st1 = calloc(2 * rows + 1, as), *st2 = calloc(rows + 1, as);
  void *dw = calloc(d + 1, es), *db = calloc(d + 1, es);
  switch (sp->op) {
    case OP_FWD:
      r.st = rmsnorm_forward(c, &cfg, rows, d, x, d, w, b, y, d, st1);
      put(&r, y, rows * d * es), put(&r, st1, rows * as);
      break;
    case OP_LN_FWD:
      r.st = rmsnorm_layernorm_forward(c, &cfg, rows, d, x, d, w, b, y, d, st1, st2);
      put(&r, y, rows * d * es), put(&r, st1, rows * as), put(&r, st2, rows * as);
      break;
    case OP_BWD:
    case OP_LN_BWD:
      r.st = sp->op == OP_BWD
                 ? rmsnorm_backward(c, &cfg, rows, d, x, d, dy, d, w, NULL, y, d, dw, db)
                 : rmsnorm_layernorm_backward(c, &cfg, rows, d, x, d, dy, d, w, NULL, NULL, y, d,
                                              dw, db);
      put(&r, y, rows * d * es), put(&r, dw, d * es), put(&r, db, d * es);
      break;
    case OP_ADD_FWD:
      r.st = rmsnorm_add_forward(c, &cfg, rows, d, x, d, dy, d, w, b, y, d, st1);
      put(&r, x, rows * d * es), put(&r, y, rows * d * es), put(&r, st1, rows * as);
      break;
    case OP_ADD_BWD: {
      void *dres = data(dt, rows * d, &s, 0, 1);
      r.st = rmsnorm_add_backward(c, &cfg, rows, d, x, d, dy, d, dres, d, w, NULL, y, d, dw, db);
      put(&r, y, rows * d * es), put(&r, dw, d * es), put(&r, db, d * es);
      free(dres);
      break;
    }
    case OP_QUANT: {
      unsigned char *q = calloc(rows * d + 1, 1);
      float *sc = calloc(rows + 1, sizeof(float));
      r.st = rmsnorm_forward_quant(c, &cfg, rows, d, x, d, w, b, RMSNORM_Q_INT8, NULL, q, d, sc,
                                   st1);
      put(&r, q, rows * d), put(&r, sc, rows * sizeof(float)), put(&r, st1, rows * as);
      free(q), free(sc);
      break;
    }
    case OP_QK_FWD: /* every row as two heads of d/2 */
      r.st = rmsnorm_qk_norm_forward(c, &cfg, rows, 2, d / 2, x, d, d / 2, w, b, y, d, d / 2, st1);
      put(&r, y, rows * d * es), put(&r, st1, 2 * rows * as);
      break;
    case OP_QK_BWD:
      r.st = rmsnorm_qk_norm_backward(c, &cfg, rows, 2, d / 2, x, d, d / 2, dy, d, d / 2, w, NULL,
                                      y, d, d / 2, dw, db);
      put(&r, y, rows * d * es), put(&r, dw, d / 2 * es), put(&r, db, d / 2 * es);
      break;
    case OP_LIN_FWD:
    case OP_LIN_BWD: {
      cfg.param_dtype = RMSNORM_F32;
      cfg.flags &= ~(unsigned)RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
      void *W = data(adt, d * n, &s, 0, 0.1), *Wf = calloc(d * n + 1, as);
      void *g = data(RMSNORM_F32, d, &s, 1, 0.2), *z = calloc(rows * n + 1, es);
      void *dz = data(dt, rows * n, &s, 0, 1), *dW = calloc(d * n + 1, as);
      void *dg = calloc(d + 1, 4), *dbias = calloc(n + 1, 4);
      r.st = rmsnorm_fold_weight(&cfg, d, n, g, W, n, Wf, n);
      if (sp->op == OP_LIN_FWD) {
        if (r.st == RMSNORM_OK)
          r.st = rmsnorm_linear_forward(c, &cfg, rows, d, n, x, d, Wf, n, NULL, z, n, st1);
        put(&r, z, rows * n * es), put(&r, st1, rows * as);
      } else {
        if (r.st == RMSNORM_OK)
          r.st = rmsnorm_linear_backward(c, &cfg, rows, d, n, x, d, g, W, n, Wf, n, dz, n, y, d,
                                         dg, dW, n, dbias);
        put(&r, y, rows * d * es), put(&r, dg, d * 4), put(&r, dW, d * n * as);
        put(&r, dbias, n * 4);
      }
      free(W), free(Wf), free(g), free(z), free(dz), free(dW), free(dg), free(dbias);
      break;
    }
  }
  free(x), free(dy), free(w), free(b), free(y), free(st1), free(st2), free(dw), free(db);
  return r;
}

static spec specs[NSPECS];
static result want[NSPECS];
static rmsnorm_context *shared[2];
static const rmsnorm_isa isas[] = {RMSNORM_ISA_AUTO, RMSNORM_ISA_SCALAR, RMSNORM_ISA_AVX2,
                                   RMSNORM_ISA_AVX512, RMSNORM_ISA_NEON};

typedef struct thread_state {
  int index;
  long runs, wrong;
  char first[200];
} thread_state;

static void *thread_main(void *p) {
  thread_state *ts = p;
  uint64_t s = 1000 + (uint64_t)ts->index;
  rmsnorm_context *own;
  if (rmsnorm_context_create(&own) != RMSNORM_OK) return NULL;
  for (int i = 0; i < runs_per_thread(); i++) {
    int k = (int)(rnd(&s) * NSPECS);
    double u = rnd(&s);
    rmsnorm_context *c = u < 0.35 ? shared[0] : u < 0.7 ? shared[1] : own;
    /* meddle with a context while others may be calling on it */
    double m = rnd(&s);
    if (m < 0.15)
      rmsnorm_context_set_threads(c, (int)(rnd(&s) * 5));
    else if (m < 0.3)
      rmsnorm_context_set_isa(c, isas[(int)(rnd(&s) * 5)]); /* NOT_AVAILABLE is fine */
    else if (m < 0.35)
      rmsnorm_context_trim(c);
    else if (m < 0.4) {
      size_t bytes;
      int t;
      rmsnorm_isa isa;
      rmsnorm_context_get_scratch_bytes(c, &bytes);
      rmsnorm_context_get_threads(c, &t);
      rmsnorm_context_get_isa(c, &isa);
    } else if (m < 0.45) { /* a short-lived context of its own */
      rmsnorm_context *tmp;
      if (rmsnorm_context_create(&tmp) == RMSNORM_OK) {
        rmsnorm_context_set_threads(tmp, 3);
        c = tmp;
      }
    }
    result got = run_spec(c, &specs[k]);
    if (c != shared[0] && c != shared[1] && c != own) rmsnorm_context_free(c);
    ts->runs++;
    if (got.st != want[k].st || got.n != want[k].n || memcmp(got.p, want[k].p, got.n)) {
      if (!ts->wrong++)
        snprintf(ts->first, sizeof ts->first, "thread %d: spec %d (op %d %s %zux%zu) differs",
                 ts->index, k, specs[k].op, tu_dtype_name(specs[k].dt), specs[k].rows,
                 specs[k].d);
    }
    free(got.p);
  }
  rmsnorm_context_free(own);
  return NULL;
}

/* Threads that only change and read the shared contexts' settings, as fast
 * as they can, until the callers are done. */
static atomic_int callers_done;

static void *meddler_main(void *p) {
  uint64_t s = 77 + (uint64_t)(size_t)p;
  long ops = 0;
  while (!atomic_load(&callers_done) || ops < 1000) {
    rmsnorm_context *c = shared[(int)(rnd(&s) * 2)];
    size_t bytes;
    int t;
    rmsnorm_isa isa;
    switch ((int)(rnd(&s) * 6)) {
      case 0: rmsnorm_context_set_threads(c, (int)(rnd(&s) * 5)); break;
      case 1: rmsnorm_context_set_isa(c, isas[(int)(rnd(&s) * 5)]); break;
      case 2: rmsnorm_context_get_threads(c, &t); break;
      case 3: rmsnorm_context_get_isa(c, &isa); break;
      case 4: rmsnorm_context_get_scratch_bytes(c, &bytes); break;
      default: if (rnd(&s) < 0.1) rmsnorm_context_trim(c); break;
    }
    if (++ops % 64 == 0) sched_yield();
  }
  return NULL;
}

int main(void) {
  static const size_t ds[] = {2, 8, 64, 130, 1024, 2050};
  uint64_t s = 7;
  int lin = rmsnorm_linear_available() == RMSNORM_OK;
  for (int i = 0; i < NSPECS; i++) {
    spec *sp = &specs[i];
    sp->op = i % NOPS;
    if (!lin && (sp->op == OP_LIN_FWD || sp->op == OP_LIN_BWD)) sp->op = OP_FWD;
    sp->dt = (rmsnorm_dtype)(i / NOPS % 4);
    sp->d = ds[(int)(rnd(&s) * 6)];
    /* about half of them large enough to be split across threads */
    sp->rows = rnd(&s) < 0.5 ? 1 + (size_t)(rnd(&s) * 40) : (size_t)(2e6 / (double)sp->d / 4);
    if (sp->rows < 1) sp->rows = 1;
    if (sp->op == OP_LIN_FWD || sp->op == OP_LIN_BWD) sp->rows = sp->rows > 300 ? 300 : sp->rows;
    int ln = sp->op == OP_LN_FWD || sp->op == OP_LN_BWD;
    sp->flags = (!ln && rnd(&s) < 0.3 ? RMSNORM_FLAG_EPS_OUTSIDE : 0) |
                (rnd(&s) < 0.3 ? RMSNORM_FLAG_WEIGHT_OFFSET : 0);
    sp->partial = !ln && rnd(&s) < 0.3 ? 0.5 : 1.0;
    sp->eps = 1e-5;
    sp->seed = 100 + (uint64_t)i;
  }
  /* the expected bits: one thread, one context */
  rmsnorm_context *ref;
  if (rmsnorm_context_create(&ref) != RMSNORM_OK) return 2;
  rmsnorm_context_set_threads(ref, 1);
  for (int i = 0; i < NSPECS; i++) {
    want[i] = run_spec(ref, &specs[i]);
    tu_check(want[i].st == RMSNORM_OK, "spec %d (op %d): %s", i, specs[i].op,
             rmsnorm_status_name(want[i].st));
  }
  rmsnorm_context_free(ref);

  for (int k = 0; k < 2; k++) {
    if (rmsnorm_context_create(&shared[k]) != RMSNORM_OK) return 2;
    rmsnorm_context_set_threads(shared[k], 4);
  }
  pthread_t th[NTHREADS], med[2];
  thread_state ts[NTHREADS];
  for (size_t m = 0; m < 2; m++)
    if (pthread_create(&med[m], NULL, meddler_main, (void *)m) != 0) return 2;
  for (int t = 0; t < NTHREADS; t++) {
    memset(&ts[t], 0, sizeof ts[t]);
    ts[t].index = t;
    if (pthread_create(&th[t], NULL, thread_main, &ts[t]) != 0) return 2;
  }
  long runs = 0;
  for (int t = 0; t < NTHREADS; t++) {
    pthread_join(th[t], NULL);
    runs += ts[t].runs;
    tu_check(ts[t].wrong == 0, "%s (%ld of %ld runs wrong)", ts[t].first, ts[t].wrong,
             ts[t].runs);
  }
  atomic_store(&callers_done, 1);
  for (int m = 0; m < 2; m++) pthread_join(med[m], NULL);
  tu_check(runs == NTHREADS * runs_per_thread(), "every run ran: %ld", runs);
  rmsnorm_context_free(shared[0]);
  rmsnorm_context_free(shared[1]);
  for (int i = 0; i < NSPECS; i++) free(want[i].p);
  printf("test_threads: %d threads, %ld calls on shared and private contexts\n", NTHREADS, runs);
  return tu_finish("test_threads");
}
