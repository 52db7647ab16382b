/* train_main.c - rmsnorm-train: trains the byte-level transformer of model.h
 * with each chosen norm (none, layer, rms, prms) and seed under one budget,
 * the norms interleaved step by step in one process (same batches, same
 * initial weights, and the machine's noise shared fairly), and writes one CSV
 * per run plus runs.csv and summary.csv. `rmsnorm-train --help` lists the
 * options. Exit status: 0 done (diverged runs included: they are results),
 * 1 data or library failure, 2 bad arguments. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cblas.h>

#include "data.h"
#include "model.h"
#include "rmsnorm.h"

#define MAX_NORMS 4
#define MAX_SEEDS 16
#define MAX_FILES 64

/* The default text: the Debian package `fortunes` (and `fortunes-min`),
 * minus its ASCII pictures and two joke collections about groups of people. */
#define FORTUNE_DIR "/usr/share/games/fortunes/"
static const char *const default_files[] = {
    "computers", "cookie", "debian", "definitions", "disclaimer", "drugs", "education",
    "food", "fortunes", "goedel", "humorists", "kids", "knghtbrd", "law", "linux",
    "linuxcookie", "literature", "love", "magic", "medicine", "miscellaneous", "news",
    "paradoxum", "people", "perl", "pets", "platitudes", "politics", "pratchett", "riddles",
    "science", "songs-poems", "sports", "startrek", "tao", "translate-me", "wisdom", "work",
    "zippy"};

typedef struct options {
  train_shape shape;
  train_norm norms[MAX_NORMS];
  int nnorms;
  long seeds[MAX_SEEDS];
  int nseeds;
  int steps, warmup, eval_every, eval_batches, threads, norm_threads, f64, quiet;
  double lr, min_lr_frac, wd, clip;
  const char *files[MAX_FILES];
  int nfiles;
  const char *out;
} options;

static void usage(FILE *f) {
  fprintf(f,
          "usage: rmsnorm-train --out DIR [options]\n"
          "Trains a byte-level pre-norm transformer with each norm and seed; the norms run\n"
          "interleaved step by step in one process with the same batches and initial weights.\n"
          "  --norm LIST        none,layer,rms,prms or all (default rms)\n"
          "  --seed LIST        seeds, e.g. 1 or 1,2,3 (default 1)\n"
          "  --layers N         blocks (default 4)      --dim N      width (default 128)\n"
          "  --heads N          heads (default 4)       --seq N      context bytes (default 128)\n"
          "  --batch N          sequences per step (default 16)\n"
          "  --steps N          optimizer steps (default 300)\n"
          "  --lr X             peak learning rate (default 0.001)\n"
          "  --warmup N         linear warmup steps (default steps/10), then cosine to\n"
          "  --min-lr X         this fraction of the peak (default 0.1)\n"
          "  --wd X             AdamW weight decay on matrices (default 0.1)\n"
          "  --clip X           global gradient-norm clip, 0 for none (default 1)\n"
          "  --partial P        pRMSNorm fraction (default 0.0625)\n"
          "  --eps X            norm eps (default 1e-5)\n"
          "  --eval-every N     validation every N steps (default 25)\n"
          "  --eval-batches N   validation batches (default 8)\n"
          "  --threads N        threads of each model and of its norms (default: online\n"
          "                     CPUs); the BLAS runs single-threaded inside the model's tasks\n"
          "  --norm-threads N   threads librmsnorm may use per norm call (default: --threads)\n"
          "  --data FILE,...    text files (default: the Debian package fortunes, in\n"
          "                     " FORTUNE_DIR ")\n"
          "  --f64              compute in double (slow; for checking)\n"
          "  --quiet            no progress lines\n"
          "  --blas-core        print OpenBLAS's kernel choice for this CPU and exit\n"
          "Writes DIR/<norm>-L<layers>-s<seed>.csv (step,train_loss,val_loss,ms_per_step,\n"
          "norm_ms,wall_ms,cpu_ms,norm_cpu_ms), DIR/runs.csv, DIR/summary.csv, and prints\n"
          "the summary.\n");
}

static int bad_arg(const char *opt, const char *want, const char *got) {
  fprintf(stderr, "rmsnorm-train: %s: expected %s, got '%s'\n", opt, want, got);
  return 2;
}

static int parse_int(const char *opt, const char *s, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    char want[64];
    snprintf(want, sizeof want, "an integer in %ld..%ld", lo, hi);
    return bad_arg(opt, want, s);
  }
  *out = (int)v;
  return 0;
}

static int parse_real(const char *opt, const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi)) {
    char want[80];
    snprintf(want, sizeof want, "a number in [%g, %g]", lo, hi);
    return bad_arg(opt, want, s);
  }
  *out = v;
  return 0;
}

/* Splits a comma list in place into at most max items. @return the count,
 * or -1 when there are too many or one is empty. */
static int split_list(char *s, char **items, int max) {
  int n = 0;
  for (char *p = s;;) {
    char *c = strchr(p, ',');
    if (c) *c = '\0';
    if (!*p || n == max) return -1;
    items[n++] = p;
    if (!c) return n;
    p = c + 1;
  }
}

static int parse_args(int argc, char **argv, options *o) {
  train_shape_default(&o->shape);
  o->norms[0] = TRAIN_NORM_RMS;
  o->nnorms = 1;
  o->seeds[0] = 1;
  o->nseeds = 1;
  o->steps = 300;
  o->warmup = -1;
  o->eval_every = 25;
  o->eval_batches = 8;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  o->threads = ncpu > 0 && ncpu <= 1024 ? (int)ncpu : 1;
  o->lr = 1e-3;
  o->min_lr_frac = 0.1;
  o->wd = 0.1;
  o->clip = 1.0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      exit(0);
    }
    if (!strcmp(a, "--blas-core")) {
#ifdef TRAIN_HAVE_OPENBLAS
      printf("%s\n", openblas_get_corename());
#else
      printf("unknown\n");
#endif
      exit(0);
    }
    if (!strcmp(a, "--f64")) {
      o->f64 = 1;
      continue;
    }
    if (!strcmp(a, "--quiet")) {
      o->quiet = 1;
      continue;
    }
    if (strncmp(a, "--", 2) != 0) {
      fprintf(stderr, "rmsnorm-train: unexpected argument '%s' (see --help)\n", a);
      return 2;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "rmsnorm-train: %s needs a value (see --help)\n", a);
      return 2;
    }
    char *v = argv[++i];
    int rc = 0;
    if (!strcmp(a, "--norm")) {
      if (!strcmp(v, "all")) {
        for (int k = 0; k < 4; k++) o->norms[k] = (train_norm)k;
        o->nnorms = 4;
        continue;
      }
      char *items[MAX_NORMS + 1];
      int n = split_list(v, items, MAX_NORMS);
      if (n < 0) return bad_arg(a, "a list of none, layer, rms, prms (or all)", v);
      for (int k = 0; k < n; k++) {
        if (train_norm_parse(items[k], &o->norms[k]))
          return bad_arg(a, "none, layer, rms, prms or all", items[k]);
        for (int j = 0; j < k; j++)
          if (o->norms[j] == o->norms[k]) return bad_arg(a, "each norm once", items[k]);
      }
      o->nnorms = n;
    } else if (!strcmp(a, "--seed")) {
      char *items[MAX_SEEDS + 1];
      int n = split_list(v, items, MAX_SEEDS);
      if (n < 0) return bad_arg(a, "a list of at most 16 seeds", v);
      for (int k = 0; k < n; k++) {
        int s;
        if ((rc = parse_int(a, items[k], 0, 2147483647, &s))) return rc;
        o->seeds[k] = s;
      }
      o->nseeds = n;
    } else if (!strcmp(a, "--layers")) rc = parse_int(a, v, 1, 256, &o->shape.layers);
    else if (!strcmp(a, "--dim")) rc = parse_int(a, v, 1, 8192, &o->shape.dim);
    else if (!strcmp(a, "--heads")) rc = parse_int(a, v, 1, 8192, &o->shape.heads);
    else if (!strcmp(a, "--seq")) rc = parse_int(a, v, 1, 4096, &o->shape.seq_len);
    else if (!strcmp(a, "--batch")) rc = parse_int(a, v, 1, 4096, &o->shape.batch);
    else if (!strcmp(a, "--steps")) rc = parse_int(a, v, 1, 10000000, &o->steps);
    else if (!strcmp(a, "--warmup")) rc = parse_int(a, v, 0, 10000000, &o->warmup);
    else if (!strcmp(a, "--eval-every")) rc = parse_int(a, v, 1, 10000000, &o->eval_every);
    else if (!strcmp(a, "--eval-batches")) rc = parse_int(a, v, 1, 100000, &o->eval_batches);
    else if (!strcmp(a, "--threads")) rc = parse_int(a, v, 1, 1024, &o->threads);
    else if (!strcmp(a, "--norm-threads")) rc = parse_int(a, v, 1, 1024, &o->norm_threads);
    else if (!strcmp(a, "--lr")) rc = parse_real(a, v, 0, 10, &o->lr);
    else if (!strcmp(a, "--min-lr")) rc = parse_real(a, v, 0, 1, &o->min_lr_frac);
    else if (!strcmp(a, "--wd")) rc = parse_real(a, v, 0, 10, &o->wd);
    else if (!strcmp(a, "--clip")) rc = parse_real(a, v, 0, 1e30, &o->clip);
    else if (!strcmp(a, "--partial")) {
      rc = parse_real(a, v, 0, 1, &o->shape.partial);
      if (!rc && o->shape.partial <= 0) return bad_arg(a, "a fraction in (0, 1]", v);
    } else if (!strcmp(a, "--eps")) rc = parse_real(a, v, 0, 1, &o->shape.eps);
    else if (!strcmp(a, "--data")) {
      char *items[MAX_FILES + 1];
      int n = split_list(v, items, MAX_FILES);
      if (n < 0) return bad_arg(a, "a comma list of at most 64 files", v);
      for (int k = 0; k < n; k++) o->files[k] = items[k];
      o->nfiles = n;
    } else if (!strcmp(a, "--out")) o->out = v;
    else {
      fprintf(stderr, "rmsnorm-train: unknown option '%s' (see --help)\n", a);
      return 2;
    }
    if (rc) return rc;
  }
  if (!o->out) {
    fprintf(stderr, "rmsnorm-train: --out DIR is required (see --help)\n");
    return 2;
  }
  if (o->shape.dim % o->shape.heads) {
    fprintf(stderr, "rmsnorm-train: --heads %d does not divide --dim %d\n", o->shape.heads,
            o->shape.dim);
    return 2;
  }
  if (o->warmup < 0) o->warmup = o->steps / 10;
  return 0;
}

/* Linear warmup to lr, then cosine decay to min_lr_frac * lr at the last step. */
static double lr_at(const options *o, int step) {
  if (step < o->warmup) return o->lr * (step + 1) / o->warmup;
  int span = o->steps - o->warmup;
  double t = span > 1 ? (double)(step - o->warmup) / (span - 1) : 1.0;
  double lo = o->lr * o->min_lr_frac;
  return lo + 0.5 * (o->lr - lo) * (1 + cos(3.141592653589793 * t));
}

/* One training run's record. Rows are steps 0..steps (0: before training). */
typedef struct run {
  train_norm norm;
  long seed;
  train_model *model;
  double *train_loss, *val_loss, *ms, *norm_ms, *wall_ms, *cpu_ms, *norm_cpu_ms;
  int done;     /* steps completed */
  int diverged; /* a loss went non-finite (training stopped) or ended above ln 256 */
  double final_val;
  double peak_val; /* the worst validation loss after training began (a spike shows here) */
  double med_ms, med_norm_ms, med_cpu_ms, med_norm_cpu_ms; /* medians over the steps */
} run;

/* Mean validation loss over the fixed evaluation batches. in, tg: buffers of
 * its own (the training batch of the step must survive it). */
static double evaluate(run *r, const train_text *text, const options *o, uint8_t *in,
                       uint8_t *tg) {
  double sum = 0;
  for (int i = 0; i < o->eval_batches; i++) {
    train_text_eval_batch(text->val, text->nval, i, o->eval_batches, o->shape.batch,
                          o->shape.seq_len, in, tg);
    sum += train_model_forward(r->model, in, tg);
  }
  train_model_take_norm_seconds(r->model, NULL); /* evaluation is not timed */
  return sum / o->eval_batches;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median of v[1..n] (row 0 is the untimed initial evaluation). */
static double median_steps(const double *v, int n) {
  if (n < 1) return NAN;
  double *c = malloc((size_t)n * sizeof *c);
  if (!c) return NAN;
  memcpy(c, v + 1, (size_t)n * sizeof *c);
  qsort(c, (size_t)n, sizeof *c, cmp_double);
  double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
  free(c);
  return m;
}

static int mkdirs(const char *path) {
  char buf[4096];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -1;
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      if (mkdir(buf, 0777) && errno != EEXIST) return -1;
      *p = '/';
    }
  if (mkdir(buf, 0777) && errno != EEXIST) return -1;
  struct stat st;
  return stat(buf, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

/* Opens DIR/name.tmp for writing; close_out renames it into place, so a
 * reader never sees a half-written file. */
static FILE *open_out(const options *o, const char *name, char *tmp, size_t tmplen) {
  snprintf(tmp, tmplen, "%s/%s.tmp", o->out, name);
  FILE *f = fopen(tmp, "w");
  if (!f) fprintf(stderr, "rmsnorm-train: %s: %s\n", tmp, strerror(errno));
  return f;
}

static int close_out(FILE *f, const options *o, const char *name, const char *tmp) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", o->out, name);
  int bad = ferror(f);
  if (fclose(f) || bad || rename(tmp, path)) {
    fprintf(stderr, "rmsnorm-train: %s: could not write: %s\n", path, strerror(errno));
    remove(tmp);
    return -1;
  }
  return 0;
}

static void put_num(FILE *f, double v) {
  if (isnan(v)) fputs("nan", f);
  else fprintf(f, "%.6g", v);
}

static int write_run(const options *o, const run *r) {
  char name[128], tmp[4200];
  snprintf(name, sizeof name, "%s-L%d-s%ld.csv", train_norm_name(r->norm), o->shape.layers,
           r->seed);
  FILE *f = open_out(o, name, tmp, sizeof tmp);
  if (!f) return -1;
  fprintf(f, "step,train_loss,val_loss,ms_per_step,norm_ms,wall_ms,cpu_ms,norm_cpu_ms\n");
  for (int s = 0; s <= r->done; s++) {
    fprintf(f, "%d,", s);
    if (s) put_num(f, r->train_loss[s]);
    fputc(',', f);
    if (!isnan(r->val_loss[s])) put_num(f, r->val_loss[s]);
    fputc(',', f);
    if (s) fprintf(f, "%.4f,%.4f", r->ms[s], r->norm_ms[s]);
    else fputc(',', f);
    fprintf(f, ",%.3f,", r->wall_ms[s]);
    if (s) fprintf(f, "%.4f,%.4f", r->cpu_ms[s], r->norm_cpu_ms[s]);
    else fputc(',', f);
    fputc('\n', f);
  }
  return close_out(f, o, name, tmp);
}

/* Summary over seeds for one norm: mean (and spread) of the final validation
 * loss over the seeds that did not diverge, medians of the per-run medians of
 * step time and norm time, and the count of diverged seeds. */
typedef struct summary {
  double mean, sd, lo, hi, ms, norm_ms, cpu_ms, norm_cpu_ms, peak;
  int ok, diverged;
} summary;

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static summary summarize(const run *runs, int nruns, train_norm norm) {
  summary s = {0, 0, INFINITY, -INFINITY, 0, 0, 0, 0, -INFINITY, 0, 0};
  double ms[MAX_SEEDS], nms[MAX_SEEDS], cms[MAX_SEEDS], ncms[MAX_SEEDS];
  int n = 0;
  for (int i = 0; i < nruns; i++) {
    const run *r = &runs[i];
    if (r->norm != norm) continue;
    ms[n] = r->med_ms;
    nms[n] = r->med_norm_ms;
    cms[n] = r->med_cpu_ms;
    ncms[n] = r->med_norm_cpu_ms;
    n++;
    s.peak = r->diverged || isnan(r->peak_val) ? INFINITY : fmax(s.peak, r->peak_val);
    if (r->diverged) {
      s.diverged++;
      continue;
    }
    s.ok++;
    s.mean += r->final_val;
    s.lo = fmin(s.lo, r->final_val);
    s.hi = fmax(s.hi, r->final_val);
  }
  if (s.ok) s.mean /= s.ok;
  else s.mean = s.lo = s.hi = NAN;
  for (int i = 0; i < nruns; i++)
    if (runs[i].norm == norm && !runs[i].diverged)
      s.sd += (runs[i].final_val - s.mean) * (runs[i].final_val - s.mean);
  s.sd = s.ok > 1 ? sqrt(s.sd / (s.ok - 1)) : NAN;
  s.ms = median(ms, n);
  s.norm_ms = median(nms, n);
  s.cpu_ms = median(cms, n);
  s.norm_cpu_ms = median(ncms, n);
  return s;
}

static int write_summaries(const options *o, const run *runs, int nruns) {
  char tmp[4200];
  FILE *f = open_out(o, "runs.csv", tmp, sizeof tmp);
  if (!f) return -1;
  fprintf(f, "norm,layers,seed,final_val_loss,ms_per_step,norm_ms_per_step,diverged,steps,"
             "cpu_ms_per_step,norm_cpu_ms_per_step,peak_val_loss\n");
  for (int i = 0; i < nruns; i++) {
    const run *r = &runs[i];
    fprintf(f, "%s,%d,%ld,", train_norm_name(r->norm), o->shape.layers, r->seed);
    put_num(f, r->final_val);
    fprintf(f, ",%.4f,%.4f,%d,%d,%.4f,%.4f,", r->med_ms, r->med_norm_ms, r->diverged, r->done,
            r->med_cpu_ms, r->med_norm_cpu_ms);
    put_num(f, r->peak_val);
    fputc('\n', f);
  }
  if (close_out(f, o, "runs.csv", tmp)) return -1;

  f = open_out(o, "summary.csv", tmp, sizeof tmp);
  if (!f) return -1;
  fprintf(f, "norm,layers,final_val_loss,ms_per_step,norm_ms_per_step,diverged,seeds,"
             "val_loss_sd,val_loss_min,val_loss_max,steps,lr,cpu_ms_per_step,"
             "norm_cpu_ms_per_step,peak_val_loss\n");
  for (int k = 0; k < o->nnorms; k++) {
    summary s = summarize(runs, nruns, o->norms[k]);
    fprintf(f, "%s,%d,", train_norm_name(o->norms[k]), o->shape.layers);
    put_num(f, s.mean);
    fprintf(f, ",%.4f,%.4f,%d,%d,", s.ms, s.norm_ms, s.diverged, o->nseeds);
    put_num(f, s.sd);
    fputc(',', f);
    put_num(f, s.lo);
    fputc(',', f);
    put_num(f, s.hi);
    fprintf(f, ",%d,%g,%.4f,%.4f,", o->steps, o->lr, s.cpu_ms, s.norm_cpu_ms);
    put_num(f, s.peak);
    fputc('\n', f);
  }
  return close_out(f, o, "summary.csv", tmp);
}

static void print_table(const options *o, const run *runs, int nruns) {
  printf("\n%d layers, dim %d, %d heads, context %d, batch %d, %d steps, lr %g, %d seed%s, "
         "%d thread%s (norms: %d)\n",
         o->shape.layers, o->shape.dim, o->shape.heads, o->shape.seq_len, o->shape.batch,
         o->steps, o->lr, o->nseeds, o->nseeds > 1 ? "s" : "", o->threads,
         o->threads > 1 ? "s" : "", o->norm_threads ? o->norm_threads : o->threads);
  printf("final: mean +- sd over seeds that did not diverge; peak: the worst validation loss\n"
         "after step 0 (any seed); times: medians over steps (and seeds) per step and at the\n"
         "norm sites (residual add + norm, forward and backward); CPU: all threads' CPU time\n"
         "over the same spans; share: norm CPU / CPU\n");
  printf("%-6s %-22s %6s %9s %8s %9s %8s %6s  %s\n", "norm", "final val loss (nats)", "peak",
         "ms/step", "norm ms", "CPU ms", "norm CPU", "share", "diverged");
  for (int k = 0; k < o->nnorms; k++) {
    summary s = summarize(runs, nruns, o->norms[k]);
    char loss[64];
    if (s.ok > 1) snprintf(loss, sizeof loss, "%.4f +- %.4f", s.mean, s.sd);
    else snprintf(loss, sizeof loss, "%.4f", s.mean);
    printf("%-6s %-22s %6.2f %9.2f %8.3f %9.2f %8.3f %5.1f%%  %d/%d\n",
           train_norm_name(o->norms[k]), loss, s.peak, s.ms, s.norm_ms, s.cpu_ms, s.norm_cpu_ms,
           100 * s.norm_cpu_ms / s.cpu_ms, s.diverged, o->nseeds);
  }
}

static int alloc_run(run *r, int steps) {
  size_t n = (size_t)steps + 1;
  double **arrays[] = {&r->train_loss, &r->val_loss, &r->ms,     &r->norm_ms,
                       &r->wall_ms,    &r->cpu_ms,   &r->norm_cpu_ms};
  for (size_t i = 0; i < sizeof arrays / sizeof *arrays; i++) {
    *arrays[i] = malloc(n * sizeof(double));
    if (!*arrays[i]) return -1;
    for (size_t j = 0; j < n; j++) (*arrays[i])[j] = NAN;
  }
  return 0;
}

static void free_run(run *r) {
  train_model_free(r->model);
  free(r->train_loss);
  free(r->val_loss);
  free(r->ms);
  free(r->norm_ms);
  free(r->wall_ms);
  free(r->cpu_ms);
  free(r->norm_cpu_ms);
}

int main(int argc, char **argv) {
  double start_wall = train_now(), start_cpu = train_cpu_now();
  options o;
  memset(&o, 0, sizeof o);
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc;

  char paths_buf[MAX_FILES][256];
  if (!o.nfiles) {
    o.nfiles = (int)(sizeof default_files / sizeof *default_files);
    for (int i = 0; i < o.nfiles; i++) {
      snprintf(paths_buf[i], sizeof paths_buf[i], "%s%s", FORTUNE_DIR, default_files[i]);
      o.files[i] = paths_buf[i];
    }
    if (access(o.files[0], R_OK) != 0) {
      fprintf(stderr,
              "rmsnorm-train: %s: %s\n  the default text is the Debian package 'fortunes' "
              "(apt-get install fortunes, or make train-demo installs it); or pass --data "
              "FILE,...\n",
              o.files[0], strerror(errno));
      return 1;
    }
  }
  train_text text;
  char err[512];
  if (train_text_load(o.files, o.nfiles, 10, (size_t)o.shape.seq_len + 1, &text, err,
                      sizeof err)) {
    fprintf(stderr, "rmsnorm-train: %s\n", err);
    return 1;
  }
  if (mkdirs(o.out)) {
    fprintf(stderr, "rmsnorm-train: %s: cannot create the output folder: %s\n", o.out,
            strerror(errno));
    train_text_free(&text);
    return 1;
  }

#ifdef TRAIN_HAVE_OPENBLAS
  const char *blas = openblas_get_corename();
#else
  const char *blas = "(not OpenBLAS)";
#endif
  if (!o.quiet)
    fprintf(stderr,
            "rmsnorm-train: %zu bytes of text (%zu train, %zu validation); BLAS core %s; %d "
            "thread(s); librmsnorm %s\n",
            text.ntrain + text.nval, text.ntrain, text.nval, blas, o.threads,
            rmsnorm_version_string());

  int B = o.shape.batch, T = o.shape.seq_len, nruns = o.nnorms * o.nseeds, status = 0;
  run *runs = calloc((size_t)nruns, sizeof *runs);
  uint8_t *in = malloc((size_t)B * T), *tg = malloc((size_t)B * T);
  uint8_t *val_in = malloc((size_t)B * T), *val_tg = malloc((size_t)B * T);
  if (!runs || !in || !tg || !val_in || !val_tg) {
    fprintf(stderr, "rmsnorm-train: out of memory\n");
    return 1;
  }
  const double uniform_loss = log(256.0);

  /* Seeds one after another; within a seed, the norms step by step in turn,
   * starting from a different one each step, on the same batch. */
  for (int si = 0; si < o.nseeds && !status; si++) {
    run *rs = runs + si * o.nnorms;
    for (int k = 0; k < o.nnorms; k++) {
      run *r = &rs[k];
      r->norm = o.norms[k];
      r->seed = o.seeds[si];
      train_shape sh = o.shape;
      sh.norm = r->norm;
      if (alloc_run(r, o.steps) ||
          train_model_create(&sh, o.f64, (uint64_t)r->seed, &r->model, err, sizeof err) ||
          train_model_set_threads(r->model, o.threads, o.norm_threads)) {
        fprintf(stderr, "rmsnorm-train: %s model: %s\n", train_norm_name(r->norm),
                r->model ? train_model_error(r->model) : err);
        status = 1;
        break;
      }
      r->val_loss[0] = evaluate(r, &text, &o, val_in, val_tg);
      r->wall_ms[0] = 0;
    }
    uint64_t data_rng = (uint64_t)o.seeds[si] * 0x9e3779b97f4a7c15ull + 0xda7aull;
    for (int step = 1; step <= o.steps && !status; step++) {
      train_text_batch(text.train, text.ntrain, &data_rng, B, T, in, tg);
      double lr = lr_at(&o, step - 1);
      for (int j = 0; j < o.nnorms; j++) {
        run *r = &rs[(j + step) % o.nnorms];
        if (r->diverged) continue;
        train_model_take_norm_seconds(r->model, NULL);
        double t0 = train_now(), c0 = train_cpu_now();
        double loss = train_model_forward(r->model, in, tg);
        if (train_model_backward(r->model) == 0 && isfinite(loss))
          train_model_step(r->model, lr, o.wd, o.clip);
        double t1 = train_now(), c1 = train_cpu_now();
        if (train_model_error(r->model)) {
          fprintf(stderr, "rmsnorm-train: %s model, step %d: %s\n", train_norm_name(r->norm),
                  step, train_model_error(r->model));
          status = 1;
          break;
        }
        r->train_loss[step] = loss;
        r->ms[step] = 1e3 * (t1 - t0);
        double norm_cpu;
        r->norm_ms[step] = 1e3 * train_model_take_norm_seconds(r->model, &norm_cpu);
        r->cpu_ms[step] = 1e3 * (c1 - c0);
        r->norm_cpu_ms[step] = 1e3 * norm_cpu;
        r->wall_ms[step] = r->wall_ms[step - 1] + r->ms[step];
        r->done = step;
        if (!isfinite(loss)) {
          r->diverged = 1;
          r->val_loss[step] = NAN;
          if (!o.quiet)
            fprintf(stderr, "seed %ld step %d: %s diverged (loss %g); it stops here\n",
                    r->seed, step, train_norm_name(r->norm), loss);
          continue;
        }
        if (step % o.eval_every == 0 || step == o.steps)
          r->val_loss[step] = evaluate(r, &text, &o, val_in, val_tg);
      }
      if (!o.quiet && (step % o.eval_every == 0 || step == o.steps)) {
        fprintf(stderr, "seed %ld step %d/%d val loss:", o.seeds[si], step, o.steps);
        for (int k = 0; k < o.nnorms; k++)
          fprintf(stderr, " %s %.4f", train_norm_name(rs[k].norm),
                  rs[k].diverged ? NAN : rs[k].val_loss[step]);
        fprintf(stderr, "\n");
      }
    }
    for (int k = 0; k < o.nnorms && !status; k++) {
      run *r = &rs[k];
      r->final_val = r->diverged ? NAN : r->val_loss[o.steps];
      r->peak_val = NAN;
      for (int s = 1; s <= r->done; s++)
        if (!isnan(r->val_loss[s]) && !(r->val_loss[s] <= r->peak_val)) r->peak_val = r->val_loss[s];
      if (r->diverged) r->peak_val = INFINITY;
      if (!r->diverged && !(r->final_val <= uniform_loss)) r->diverged = 1;
      r->med_ms = median_steps(r->ms, r->done);
      r->med_norm_ms = median_steps(r->norm_ms, r->done);
      r->med_cpu_ms = median_steps(r->cpu_ms, r->done);
      r->med_norm_cpu_ms = median_steps(r->norm_cpu_ms, r->done);
      if (write_run(&o, r)) status = 1;
      train_model_free(r->model); /* free the activations before the next seed */
      r->model = NULL;
    }
  }
  if (!status && write_summaries(&o, runs, nruns)) status = 1;
  if (!status) {
    print_table(&o, runs, nruns);
    double cpu = train_cpu_now() - start_cpu;
    printf("time: %.0f s wall, %.0f s CPU over all threads (CPU / %d = %.0f s: the wall time on "
           "%d idle cores if no thread ever waited)\n",
           train_now() - start_wall, cpu, o.threads, cpu / o.threads, o.threads);
  }
  for (int i = 0; i < nruns; i++) free_run(&runs[i]);
  free(runs);
  free(in);
  free(tg);
  free(val_in);
  free(val_tg);
  train_text_free(&text);
  return status;
}
