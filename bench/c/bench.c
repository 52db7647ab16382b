/* bench.c - `rmsnorm bench`: times every op, dtype and shape with one thread
 * and with all threads, against the copy limit of the same byte count (the
 * best of memcpy and non-temporal copies on as many threads as the op) and
 * against the scalar reference, measured in the same run. The copies read
 * and write the op's own buffers, because the same copy on other buffers of
 * the same size can run tens of percent faster or slower. Medians of many
 * repetitions after a warm-up, on buffers allocated and touched once; one
 * thread and all threads are timed in the same rounds. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_copy.h"
#include "bench_stats.h"
#include "cli.h"
#include "rmsnorm.h"

typedef enum op_kind { OP_RMS_FWD, OP_RMS_BWD, OP_LN_FWD, OP_LN_BWD, NUM_OPS } op_kind;
static const char *const op_names[NUM_OPS] = {"rms_forward", "rms_backward", "ln_forward",
                                              "ln_backward"};
static const char *const dtype_names[4] = {"f32", "f16", "bf16", "f64"};

typedef struct shape {
  size_t rows, d;
} shape;

/* The standard shapes: training and prefill batches, a decode step, QK-norm,
 * one very long row. */
static const shape default_shapes[] = {{4096, 4096}, {2048, 8192}, {512, 4096}, {16, 4096},
                                       {1, 4096},    {8, 5120},    {65536, 128}, {1, 1048576}};
#define MAX_SHAPES 32
#define MAX_COPY_KINDS 4

typedef struct options {
  int quick, csv, json, threads, scalar;
  size_t offset; /* bytes past a 64-byte boundary where every row block starts */
  unsigned dtypes; /* bit per rmsnorm_dtype */
  shape shapes[MAX_SHAPES];
  size_t nshapes;
} options;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}


/* ---- the copy limit, on a team of threads started once ------------------- */

typedef struct team {
  pthread_barrier_t start, done;
  pthread_t *threads;
  int n, stop;
  const struct copy_job *job;
} team;

typedef struct member {
  team *t;
  int index;
} member;

/* A copy of up to two spans (the op's own buffers: x to y for a forward; x
 * to dx and dy to y for a backward), each split evenly over the team. */
typedef struct copy_job {
  team *t;
  const rn_copy_kind *kind;
  char *dst[2];
  const char *src[2];
  size_t bytes[2];
} copy_job;

static void copy_share(team *t, int i) {
  const copy_job *c = t->job;
  for (int k = 0; k < 2; k++) {
    size_t b0 = c->bytes[k] * (size_t)i / (size_t)t->n;
    size_t b1 = c->bytes[k] * (size_t)(i + 1) / (size_t)t->n;
    if (b1 > b0) c->kind->copy(c->dst[k] + b0, c->src[k] + b0, b1 - b0);
  }
}

static void *member_main(void *p) {
  member m = *(member *)p;
  free(p);
  for (;;) {
    pthread_barrier_wait(&m.t->start);
    if (m.t->stop) return NULL;
    copy_share(m.t, m.index);
    pthread_barrier_wait(&m.t->done);
  }
}

static int team_start(team *t, int n) {
  memset(t, 0, sizeof *t);
  t->n = n;
  t->threads = calloc((size_t)n, sizeof(pthread_t));
  if (!t->threads) return -1;
  pthread_barrier_init(&t->start, NULL, (unsigned)n);
  pthread_barrier_init(&t->done, NULL, (unsigned)n);
  for (int i = 1; i < n; i++) {
    member *m = malloc(sizeof *m);
    if (!m) return -1;
    m->t = t;
    m->index = i;
    if (pthread_create(&t->threads[i], NULL, member_main, m) != 0) return -1;
  }
  return 0;
}

static void team_copy(team *t) {
  if (t->n > 1) pthread_barrier_wait(&t->start);
  copy_share(t, 0);
  if (t->n > 1) pthread_barrier_wait(&t->done);
}

static void team_stop(team *t) {
  if (t->n > 1) {
    t->stop = 1;
    pthread_barrier_wait(&t->start);
    for (int i = 1; i < t->n; i++) pthread_join(t->threads[i], NULL);
  }
  pthread_barrier_destroy(&t->start);
  pthread_barrier_destroy(&t->done);
  free(t->threads);
}

/* ---- what is timed --------------------------------------------------------- */

typedef struct buffers {
  void *x, *y, *dy, *dx;
  void *base[4]; /* what to free: x, y, dy, dx before the offset */
  float *w, *dw, *db, *mean, *rstd, *ln_rstd; /* stats: RMSNorm's, LayerNorm's */
} buffers;

typedef struct job {
  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  op_kind op;
  shape s;
  buffers *b;
} job;

static rmsnorm_status run_op(const job *j) {
  size_t r = j->s.rows, d = j->s.d;
  const buffers *b = j->b;
  switch (j->op) {
    case OP_RMS_FWD: /* saving the statistics, as in training */
      return rmsnorm_forward(j->ctx, &j->cfg, r, d, b->x, d, b->w, NULL, b->y, d, b->rstd);
    case OP_RMS_BWD: /* with the forward's saved statistics, as in training */
      return rmsnorm_backward(j->ctx, &j->cfg, r, d, b->x, d, b->dy, d, b->w, b->rstd, b->dx, d,
                              b->dw, NULL);
    case OP_LN_FWD:
      return rmsnorm_layernorm_forward(j->ctx, &j->cfg, r, d, b->x, d, b->w, NULL, b->y, d,
                                       b->mean, b->ln_rstd);
    default:
      return rmsnorm_layernorm_backward(j->ctx, &j->cfg, r, d, b->x, d, b->dy, d, b->w, b->mean,
                                        b->ln_rstd, b->dx, d, b->dw, NULL);
  }
}

/* Repetitions: enough to fill about `budget` seconds, within [lo, hi]. */
static int reps_for(double first, double budget, int lo, int hi) {
  double n = first > 0 ? budget / first : hi;
  return n < lo ? lo : n > hi ? hi : (int)n;
}

/* Median seconds of fn(arg): one warm-up call, then repetitions to fill
 * about `budget` seconds, within [lo, hi]. */
static double median_time(void (*fn)(const void *), const void *arg, double budget, int lo,
                          int hi) {
  fn(arg);
  double t0 = now();
  fn(arg);
  int reps = reps_for(now() - t0, budget, lo, hi);
  double *t = malloc((size_t)reps * sizeof *t);
  if (!t) return NAN;
  for (int i = 0; i < reps; i++) {
    double a = now();
    fn(arg);
    t[i] = now() - a;
  }
  double med = bench_median(t, reps);
  free(t);
  return med;
}

static void run_op_void(const void *j) { (void)run_op(j); }

/* A copy of one kind by a team (as many threads as the op). */
static void copy_job_run(const void *p) {
  const copy_job *c = p;
  c->t->job = c;
  team_copy(c->t);
}

/* Something to time, and its median seconds. */
typedef struct timed {
  void (*fn)(const void *);
  const void *arg;
  double median;
} timed;

/* Medians of several items measured in rounds, each round running every item
 * in order: the bandwidth of a shared VM drifts over seconds, and this way a
 * drift hits every item alike, so their ratios hold; the order rotates by one
 * item a round, so no item always follows the same one (a 2-thread copy's
 * write-back, say, or another op's cache footprint). Each timed call follows
 * an untimed one of the same item, so cache-resident shapes are timed warm.
 * Rounds fill about `budget` seconds, within [lo, hi]. */
static void interleaved_medians(timed *items, int n, double budget, int lo, int hi) {
  for (int i = 0; i < n; i++) items[i].fn(items[i].arg); /* warm-up */
  double t0 = now();
  for (int i = 0; i < n; i++) items[i].fn(items[i].arg);
  int rounds = reps_for(2 * (now() - t0), budget, lo, hi);
  double *t = malloc((size_t)rounds * (size_t)n * sizeof *t);
  if (!t) {
    for (int i = 0; i < n; i++) items[i].median = NAN;
    return;
  }
  for (int r = 0; r < rounds; r++)
    for (int q = 0; q < n; q++) {
      int i = (q + r) % n; /* each round starts one item later: every item
                            * follows every other equally often */
      items[i].fn(items[i].arg);
      double a = now();
      items[i].fn(items[i].arg);
      t[(size_t)i * (size_t)rounds + (size_t)r] = now() - a;
    }
  for (int i = 0; i < n; i++) {
    double *ti = t + (size_t)i * (size_t)rounds;
    items[i].median = bench_median(ti, rounds);
  }
  free(t);
}

/* ---- results ---------------------------------------------------------------- */

typedef struct result {
  op_kind op;
  int dtype, threads;
  shape s;
  double median, gbps, limit_gbps, scalar_median, ln_over_rms;
  char limit[24]; /* the copy that set limit_gbps, and its threads: "nt-avx2/2T" */
} result;

static void print_header(const options *o) {
  if (o->csv)
    printf("op,dtype,rows,d,threads,median_us,gbps,limit_gbps,pct_limit,speedup_vs_scalar,"
           "ln_over_rms,limit\n");
  else if (o->json)
    printf("[\n");
  else
    printf("%-13s %-5s %-12s %7s %11s %8s %7s %-13s %9s %7s\n", "op", "dtype", "shape",
           "threads", "median_us", "GB/s", "%limit", "limit", "x_scalar", "ln/rms");
}

static void print_result(const options *o, const result *r, int first) {
  double pct = 100.0 * r->gbps / r->limit_gbps;
  double speedup = r->scalar_median > 0 ? r->scalar_median / r->median : NAN;
  if (o->csv) {
    printf("%s,%s,%zu,%zu,%d,%.3f,%.3f,%.3f,%.1f,", op_names[r->op], dtype_names[r->dtype],
           r->s.rows, r->s.d, r->threads, r->median * 1e6, r->gbps, r->limit_gbps, pct);
    if (isnan(speedup)) printf(","); else printf("%.2f,", speedup);
    if (isnan(r->ln_over_rms)) printf(","); else printf("%.3f,", r->ln_over_rms);
    printf("%s\n", r->limit);
  } else if (o->json) {
    printf("%s  {\"op\": \"%s\", \"dtype\": \"%s\", \"rows\": %zu, \"d\": %zu, \"threads\": %d, "
           "\"median_us\": %.3f, \"gbps\": %.3f, \"limit_gbps\": %.3f, \"pct_limit\": %.1f, "
           "\"limit\": \"%s\", \"speedup_vs_scalar\": ",
           first ? "" : ",\n", op_names[r->op], dtype_names[r->dtype], r->s.rows, r->s.d,
           r->threads, r->median * 1e6, r->gbps, r->limit_gbps, pct, r->limit);
    if (isnan(speedup)) printf("null"); else printf("%.2f", speedup);
    printf(", \"ln_over_rms\": ");
    if (isnan(r->ln_over_rms)) printf("null}"); else printf("%.3f}", r->ln_over_rms);
  } else {
    char sh[32];
    snprintf(sh, sizeof sh, "%zux%zu", r->s.rows, r->s.d);
    printf("%-13s %-5s %-12s %7d %11.1f %8.1f %7.1f %-13s ", op_names[r->op],
           dtype_names[r->dtype], sh, r->threads, r->median * 1e6, r->gbps, pct, r->limit);
    if (isnan(speedup)) printf("%9s ", "-"); else printf("%9.1f ", speedup);
    if (isnan(r->ln_over_rms)) printf("%7s\n", "-"); else printf("%7.2f\n", r->ln_over_rms);
  }
  fflush(stdout);
}

/* ---- options ---------------------------------------------------------------- */

static void usage(FILE *to) {
  fprintf(to,
          "usage: rmsnorm bench [--quick] [--csv | --json] [--threads N] [--dtype LIST]\n"
          "                     [--shape RxD]... [--no-scalar] [--offset BYTES]\n"
          "\n"
          "Times RMSNorm and LayerNorm, forward and backward, with 1 thread and with N\n"
          "(default: online CPUs), each against the copy limit of the same bytes and the\n"
          "scalar reference kernels, measured in the same run. Median of many repetitions.\n"
          "\n"
          "  --quick        fewer repetitions (a short run)\n"
          "  --csv, --json  machine-readable output\n"
          "  --threads N    the 'all threads' count\n"
          "  --dtype LIST   comma-separated from f32,f16,bf16,f64 or all (default f32,bf16,f16)\n"
          "  --shape RxD    a shape to run (repeatable; default: the eight standard shapes)\n"
          "  --no-scalar    skip the scalar reference (no speedup column)\n"
          "  --offset BYTES start x, y, dy and dx BYTES past a 64-byte boundary\n"
          "                 (default 0; malloc gives 16, torch 0)\n"
          "\n"
          "GB/s counts bytes read + written: x and y for forward; x, dy and dx for\n"
          "backward (given the forward's saved statistics, as in training), plus the\n"
          "weight. %%limit compares with the fastest copy of the same total (memcpy or a\n"
          "non-temporal store loop, on as many threads as the op; column `limit` names it)\n"
          "between the op's own buffers: x to y (forward); x to dx, dy to y (backward).\n");
}

static int parse_dtypes(const char *s, unsigned *mask) {
  *mask = 0;
  char buf[64];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    int found = 0;
    if (!strcmp(tok, "all")) *mask |= 0xf, found = 1;
    for (int i = 0; i < 4; i++)
      if (!strcmp(tok, dtype_names[i])) *mask |= 1u << i, found = 1;
    if (!found) return -1;
  }
  return *mask ? 0 : -1;
}

static int parse_options(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->scalar = 1;
  o->dtypes = (1u << RMSNORM_F32) | (1u << RMSNORM_BF16) | (1u << RMSNORM_F16);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (rn_cli_is_help(a)) {
      usage(stdout);
      return 1;
    } else if (!strcmp(a, "--quick")) {
      o->quick = 1;
    } else if (!strcmp(a, "--csv")) {
      o->csv = 1;
    } else if (!strcmp(a, "--json")) {
      o->json = 1;
    } else if (!strcmp(a, "--no-scalar")) {
      o->scalar = 0;
    } else if (!strcmp(a, "--threads") || !strcmp(a, "--dtype") || !strcmp(a, "--shape") ||
               !strcmp(a, "--offset")) {
      if (i + 1 >= argc) {
        rn_cli_error("bench: %s needs a value", a);
        return -1;
      }
      const char *v = argv[++i];
      char *end;
      if (!strcmp(a, "--offset")) {
        long n = strtol(v, &end, 10);
        if (*end || !*v || n < 0 || n > 4095) {
          rn_cli_error("bench: --offset must be an integer in [0, 4095], not '%s'", v);
          return -1;
        }
        o->offset = (size_t)n;
      } else if (!strcmp(a, "--threads")) {
        long n = strtol(v, &end, 10);
        if (*end || n < 1 || n > 1024) {
          rn_cli_error("bench: --threads must be an integer in [1, 1024], not '%s'", v);
          return -1;
        }
        o->threads = (int)n;
      } else if (!strcmp(a, "--dtype")) {
        if (parse_dtypes(v, &o->dtypes)) {
          rn_cli_error("bench: --dtype takes f32, f16, bf16, f64 or all, not '%s'", v);
          return -1;
        }
      } else {
        unsigned long long r, d;
        char x;
        int n = 0;
        if (sscanf(v, "%llu%c%llu%n", &r, &x, &d, &n) != 3 || (x != 'x' && x != 'X') ||
            v[n] || r < 1 || d < 1 || r * d > (1ull << 31) || o->nshapes == MAX_SHAPES) {
          rn_cli_error("bench: --shape takes ROWSxD with at most 2^31 elements, not '%s'", v);
          return -1;
        }
        o->shapes[o->nshapes].rows = (size_t)r;
        o->shapes[o->nshapes++].d = (size_t)d;
      }
    } else {
      rn_cli_error("bench: unknown option '%s' (see rmsnorm bench --help)", a);
      return -1;
    }
  }
  if (o->csv && o->json) {
    rn_cli_error("bench: choose one of --csv and --json");
    return -1;
  }
  if (!o->nshapes) {
    memcpy(o->shapes, default_shapes, sizeof default_shapes);
    o->nshapes = sizeof default_shapes / sizeof *default_shapes;
  }
  return 0;
}

/* ---- the run ------------------------------------------------------------------ */

static int alloc_buffers(buffers *b, const options *o) {
  size_t most = 0, dmax = 0;
  for (size_t i = 0; i < o->nshapes; i++) {
    size_t n = o->shapes[i].rows * o->shapes[i].d;
    if (n > most) most = n;
    if (o->shapes[i].d > dmax) dmax = o->shapes[i].d;
  }
  size_t es = (o->dtypes & (1u << RMSNORM_F64)) ? 8 : (o->dtypes & 1u) ? 4 : 2;
  size_t bytes = most * es, rows_most = 0;
  for (size_t i = 0; i < o->nshapes; i++)
    if (o->shapes[i].rows > rows_most) rows_most = o->shapes[i].rows;
  memset(b, 0, sizeof *b);
  /* room past the data for the copies' share of the parameters' bytes */
  size_t room = bytes + 8 * dmax + 64;
  /* 64-byte aligned, then o->offset further: rows start where a caller's
   * would (malloc's blocks are 16 bytes past a page; torch's are aligned) */
  void **at[4] = {&b->x, &b->y, &b->dy, &b->dx};
  for (int i = 0; i < 4; i++) {
    size_t n = room + o->offset;
    b->base[i] = aligned_alloc(64, (n + 63) & ~(size_t)63);
    *at[i] = b->base[i] ? (char *)b->base[i] + o->offset : NULL;
  }
  b->w = malloc(dmax * 8), b->dw = malloc(dmax * 8), b->db = malloc(dmax * 8);
  b->mean = malloc(rows_most * 8), b->rstd = malloc(rows_most * 8);
  b->ln_rstd = malloc(rows_most * 8);
  if (!b->x || !b->y || !b->dy || !b->dx || !b->w || !b->dw ||
      !b->db || !b->mean || !b->rstd || !b->ln_rstd)
    return -1;
  /* touch everything once: page faults stay out of the timings */
  memset(b->y, 0, room), memset(b->dx, 0, room);
  memset(b->x, 0, room), memset(b->dy, 0, room);
  memset(b->dw, 0, dmax * 8), memset(b->db, 0, dmax * 8);
  for (size_t j = 0; j < dmax; j++) b->w[j] = 1.0f + 0.001f * (float)(j % 97);
  return 0;
}

/* Fills x and dy with values of dtype dt (a fixed pseudo-random pattern). */
static void fill_inputs(buffers *b, int dt, size_t n) {
  uint32_t s = 12345;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    float v = (float)((int)(s >> 9) - (1 << 22)) * 0x1p-21f; /* in [-2, 2) */
    float g = v * 0.5f + 0.25f;
    uint32_t u, ug;
    memcpy(&u, &v, 4);
    memcpy(&ug, &g, 4);
    switch (dt) {
      case RMSNORM_F32:
        ((float *)b->x)[i] = v, ((float *)b->dy)[i] = g;
        break;
      case RMSNORM_F64:
        ((double *)b->x)[i] = v, ((double *)b->dy)[i] = g;
        break;
      case RMSNORM_BF16: /* truncation is fine for test data */
        ((uint16_t *)b->x)[i] = (uint16_t)(u >> 16), ((uint16_t *)b->dy)[i] = (uint16_t)(ug >> 16);
        break;
      default: { /* f16: small normal values, built exactly */
        int m = (int)((s >> 9) & 0x3ff), e = 13 + (int)((s >> 20) & 3);
        ((uint16_t *)b->x)[i] = (uint16_t)((s & 1) << 15 | e << 10 | m);
        ((uint16_t *)b->dy)[i] = (uint16_t)((s & 2) << 14 | (e - 1) << 10 | m);
      }
    }
  }
}

int rn_cli_bench(int argc, char **argv) {
  options o;
  int pr = parse_options(argc, argv, &o);
  if (pr) return pr > 0 ? RN_EXIT_OK : RN_EXIT_USAGE;

  rmsnorm_context *fast[2], *scalar; /* fast[0]: one thread; fast[1]: all */
  if (rmsnorm_context_create(&fast[0]) != RMSNORM_OK ||
      rmsnorm_context_create(&fast[1]) != RMSNORM_OK ||
      rmsnorm_context_create(&scalar) != RMSNORM_OK) {
    rn_cli_error("bench: cannot create a context");
    return RN_EXIT_FAILURE;
  }
  rmsnorm_context_set_isa(scalar, RMSNORM_ISA_SCALAR);
  int all = o.threads;
  if (!all) rmsnorm_context_get_threads(fast[1], &all);
  rmsnorm_context_set_threads(fast[0], 1);
  rmsnorm_context_set_threads(fast[1], all);
  rmsnorm_isa isa;
  rmsnorm_context_get_isa(fast[1], &isa);

  buffers b;
  if (alloc_buffers(&b, &o)) {
    rn_cli_error("bench: out of memory for the largest shape");
    return RN_EXIT_FAILURE;
  }
  const rn_copy_kind *kinds[MAX_COPY_KINDS];
  int nkinds = rn_copy_kinds(kinds, MAX_COPY_KINDS);
  team teams[2];
  if (team_start(&teams[0], 1) || team_start(&teams[1], all)) {
    rn_cli_error("bench: cannot start threads");
    return RN_EXIT_FAILURE;
  }
  double budget = o.quick ? 0.05 : 0.3, sbudget = o.quick ? 0.02 : 0.15;
  int lo = o.quick ? 3 : 7, hi = o.quick ? 20 : 200, slo = o.quick ? 1 : 3, shi = o.quick ? 3 : 10;
  int interactive = isatty(2);
  int ndt = 0;
  for (int dt = 0; dt < 4; dt++) ndt += (o.dtypes >> dt) & 1;
  int nthr = all > 1 ? 2 : 1, total = (int)o.nshapes * ndt * nthr * NUM_OPS, done = 0, first = 1;

  if (!o.csv && !o.json)
    printf("# rmsnorm bench: librmsnorm %s, kernels %s, threads 1 and %d, rows at 64-byte "
           "boundary + %zu%s\n",
           rmsnorm_version_string(), rmsnorm_isa_name(isa), all, o.offset,
           o.quick ? ", quick" : "");
  print_header(&o);
  for (int dt = 0; dt < 4; dt++) {
    if (!((o.dtypes >> dt) & 1)) continue;
    size_t es = dt == RMSNORM_F64 ? 8 : dt == RMSNORM_F32 ? 4 : 2;
    for (size_t si = 0; si < o.nshapes; si++) {
      shape s = o.shapes[si];
      size_t n = s.rows * s.d;
      fill_inputs(&b, dt, n);
      double fwd_bytes = 2.0 * (double)(n * es) + 4.0 * (double)s.d;
      double bwd_bytes = 3.0 * (double)(n * es) + 8.0 * (double)s.d;
      if (interactive)
        fprintf(stderr, "\r[%d/%d] %s %zux%zu   ", done += NUM_OPS * nthr, total,
                dtype_names[dt], s.rows, s.d);
      /* every copy of the same byte totals, on one thread and on all; the
       * four ops on one thread and on all: all of it in the same rounds, so
       * that one thread and all threads meet the same drift of a shared
       * machine. The limit at n threads is the fastest copy on at most n. */
      copy_job copies[2 * 2 * MAX_COPY_KINDS];
      job jobs[2][NUM_OPS];
      timed items[2 * 2 * MAX_COPY_KINDS + 2 * NUM_OPS];
      int ncopies = 0;
      for (int bwd = 0; bwd < 2; bwd++)
        for (int t = 0; t < nthr; t++)
          for (int k = 0; k < nkinds; k++) {
            /* the op's bytes, halved: x to y (forward, plus the weight's
             * share); x to dx and half of dy to y (backward) */
            size_t half = (size_t)((bwd ? bwd_bytes : fwd_bytes) / 2);
            copy_job c = {&teams[t], kinds[k], {b.dx, b.y}, {b.x, b.dy}, {n * es, half - n * es}};
            if (!bwd) c.dst[0] = b.y, c.bytes[0] = half, c.bytes[1] = 0;
            copies[ncopies] = c;
            items[ncopies].fn = copy_job_run;
            items[ncopies].arg = &copies[ncopies];
            ncopies++;
          }
      for (int ti = 0; ti < nthr; ti++)
        for (int op = 0; op < NUM_OPS; op++) {
          job j = {fast[ti], {0}, (op_kind)op, s, &b};
          rmsnorm_config_init(&j.cfg, (rmsnorm_dtype)dt);
          j.cfg.param_dtype = RMSNORM_F32;
          jobs[ti][op] = j;
          rmsnorm_status st = run_op(&jobs[ti][op]);
          if (st != RMSNORM_OK) {
            rn_cli_error("bench: %s: %s", op_names[op], rmsnorm_status_message(st));
            return RN_EXIT_FAILURE;
          }
          items[ncopies + ti * NUM_OPS + op].fn = run_op_void;
          items[ncopies + ti * NUM_OPS + op].arg = &jobs[ti][op];
        }
      interleaved_medians(items, ncopies + nthr * NUM_OPS, budget * 4 * nthr, lo, hi);
      for (int ti = 0; ti < nthr; ti++) {
        int threads = ti ? all : 1;
        double limit[2] = {0, 0};
        const char *limit_kind[2] = {"", ""};
        int limit_threads[2] = {1, 1};
        for (int c = 0; c < ncopies; c++) {
          int bwd = c >= ncopies / 2;
          if (copies[c].t->n > threads) continue;
          double bw = 2.0 * (double)(copies[c].bytes[0] + copies[c].bytes[1]) / items[c].median;
          if (bw > limit[bwd]) limit[bwd] = bw, limit_kind[bwd] = copies[c].kind->name,
                               limit_threads[bwd] = copies[c].t->n;
        }
        result res[NUM_OPS];
        for (int op = 0; op < NUM_OPS; op++) {
          result *r = &res[op];
          int bwd = op == OP_RMS_BWD || op == OP_LN_BWD;
          r->op = (op_kind)op, r->dtype = dt, r->threads = threads, r->s = s;
          r->median = items[ncopies + ti * NUM_OPS + op].median;
          r->gbps = (bwd ? bwd_bytes : fwd_bytes) / r->median / 1e9;
          r->limit_gbps = limit[bwd] / 1e9;
          snprintf(r->limit, sizeof r->limit, "%s/%dT", limit_kind[bwd], limit_threads[bwd]);
          r->scalar_median = 0;
          if (o.scalar) { /* the reference, on its own: only a speedup rides on it */
            job j = jobs[ti][op];
            j.ctx = scalar;
            rmsnorm_context_set_threads(scalar, threads);
            r->scalar_median = median_time(run_op_void, &j, sbudget, slo, shi);
          }
          r->ln_over_rms = NAN;
        }
        res[OP_RMS_FWD].ln_over_rms = res[OP_LN_FWD].median / res[OP_RMS_FWD].median;
        res[OP_RMS_BWD].ln_over_rms = res[OP_LN_BWD].median / res[OP_RMS_BWD].median;
        if (interactive) fprintf(stderr, "\r%60s\r", "");
        for (int op = 0; op < NUM_OPS; op++, first = 0) print_result(&o, &res[op], first);
      }
    }
  }
  if (o.json) printf("\n]\n");
  team_stop(&teams[0]);
  team_stop(&teams[1]);
  rmsnorm_context_free(fast[0]);
  rmsnorm_context_free(fast[1]);
  rmsnorm_context_free(scalar);
  for (int i = 0; i < 4; i++) free(b.base[i]);
  free(b.w), free(b.dw), free(b.db), free(b.mean), free(b.rstd), free(b.ln_rstd);
  return RN_EXIT_OK;
}
