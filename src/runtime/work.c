/* work.c - weight/bias conversion to the compute type, work splitting over
 * the context's pool, and the fixed-order dweight/dbias reduction shared by
 * the backward entry points (see work.h). */
#include "runtime/work.h"

#include <stdint.h>
#include <string.h>

#include "numerics/convert.h"
#include "numerics/dtype.h"

const void *rn_param_as_acc(const rmsnorm_config *cfg, const rn_kernel_set *k, const void *p,
                            int is_weight, size_t d, void *buf) {
  if (!rn_param_needs_copy(cfg, p, is_weight)) return p;
  int f64 = rn_acc_is_f64(cfg->dtype);
  double offset = is_weight && (cfg->flags & RMSNORM_FLAG_WEIGHT_OFFSET) ? 1.0 : 0.0;
  if (f64) {
    for (size_t j = 0; j < d; j++) rn_store_acc(buf, 1, j, offset + rn_load(p, cfg->param_dtype, j));
    return buf;
  }
  /* offset: 1 + g in the compute type, as Gemma's (1.0 + weight.float());
   * the add is made with offset 0 too, as a plain copy's bits are pinned */
  float off = (float)offset, *out = buf;
  const unsigned char *src = p; /* any alignment: loaded by memcpy */
  if (k && k->widen) { /* the set's vectors: fp32 (1 + g or misaligned), fp16, bf16 */
    k->widen(cfg->param_dtype, p, d, off, out);
  } else if (cfg->param_dtype == RMSNORM_F32) {
    for (size_t j = 0; j < d; j++) {
      float g;
      memcpy(&g, src + 4 * j, 4);
      out[j] = off + g;
    }
  } else if (cfg->param_dtype == RMSNORM_BF16) {
    for (size_t j = 0; j < d; j++) {
      uint16_t h;
      memcpy(&h, src + 2 * j, 2);
      out[j] = off + rn_bf16_to_f32(h);
    }
  } else {
    for (size_t j = 0; j < d; j++) {
      uint16_t h;
      memcpy(&h, src + 2 * j, 2);
      out[j] = off + rn_f16_to_f32_lanes(h);
    }
  }
  return buf;
}

/* ---- how many threads a call wakes: a cost model --------------------------
 * The constants are fitted on one thread, the fp32 forward with the AVX-512
 * kernels (the fits and the wake-up times are in bench/RESULTS.md):
 *   a row costs ROW_PS on top of its bytes (statistics' lane halving, sqrt,
 *     division, loop set-up);
 *   a byte of traffic costs CACHE_PS while a thread's share fits in its L2,
 *     DRAM_PS beyond (one thread's streaming rate), and the whole call never
 *     goes faster than MEM_PS a byte (the copy limit on every core);
 *   waking a worker costs WAKE_PS before it runs a task (a condition
 *     variable's wake-up is tens of microseconds on an idle VM, milliseconds
 *     when another process holds the other core), or the pool's running
 *     estimate of recent wake-ups when that is more
 *     (rn_parallel_wake_estimate), so a loaded machine splits less.
 * The backward moves more per byte (about 2.5x the forward's in cache), so
 * the model, timed with the forward's rates, is cautious for it. A call
 * takes n threads when the model says n is at least 1 / GAIN faster than
 * one thread; otherwise it runs on the caller's thread alone. */
#define ROW_PS 10000ull      /* 10 ns a row */
#define CACHE_PS 22ull       /* 45 GB/s */
#define DRAM_PS 55ull        /* 18 GB/s */
#define MEM_PS 35ull         /* 29 GB/s, all threads together */
#define WAKE_PS 40000000ull  /* 40 us */
#define CACHE_SHARE ((size_t)1 << 20) /* a thread's bytes that count as in cache */
#define GAIN_NUM 3           /* n threads must take <= 3/4 of one thread's time */
#define GAIN_DEN 4
/* Tasks per thread, and the least predicted work a task is cut to: more
 * tasks than threads let the caller take over from a worker that starts
 * late, at the price of one atomic increment and a cold prefetch a task. */
#define TASKS_PER_THREAD 8
#define TASK_PS 20000000ull  /* 20 us */

/* Predicted picoseconds of a call on n threads, `wake` the wake-up cost. */
static double predict_ps(size_t rows, size_t bytes, int n, double wake) {
  double share = (double)bytes / n;
  double t = (double)rows / n * ROW_PS + share * (share <= CACHE_SHARE ? CACHE_PS : DRAM_PS);
  if (share > CACHE_SHARE && t < (double)bytes * MEM_PS) t = (double)bytes * MEM_PS;
  return t + (n > 1 ? wake : 0.0);
}

rn_split rn_split_for(const rmsnorm_context *ctx, size_t rows, size_t bytes, size_t units) {
  int most = rn_context_threads(ctx);
  if ((size_t)most > units) most = units < 1 ? 1 : (int)units;
  rn_split s = {1, 1, most};
  if (most < 2) return s;
  /* a decode-sized call: its time bounded above in integers (the dearest
   * rate for every byte) leaves no split to pay, without the doubles below */
  if (rows < ((size_t)1 << 24) && bytes < ((size_t)1 << 24) &&
      (rows * ROW_PS + bytes * DRAM_PS) * GAIN_NUM <= WAKE_PS * GAIN_DEN)
    return s;
  double t1 = predict_ps(rows, bytes, 1, 0), best = t1 * GAIN_NUM / GAIN_DEN;
  if ((double)WAKE_PS >= best) return s; /* small: no split can pay */
  /* a worker's wake-up: the measured constant, or what the pool has seen
   * lately when that is more (another process holding the cores) */
  double wake = rn_parallel_wake_estimate() * 1e12;
  if (wake < (double)WAKE_PS) wake = (double)WAKE_PS;
  if (wake >= best) return s; /* no split can pay */
  for (int n = 2; n <= most; n++) {
    double t = predict_ps(rows, bytes, n, wake);
    if (t <= best) best = t, s.threads = n;
  }
  if (s.threads == 1) return s;
  size_t tasks = (size_t)s.threads * TASKS_PER_THREAD, fill = (size_t)(t1 / TASK_PS);
  if (tasks > fill) tasks = fill;
  if (tasks > units) tasks = units;
  s.tasks = tasks < (size_t)s.threads ? s.threads : (int)tasks;
  return s;
}

void rn_run_tasks(rmsnorm_context *ctx, rn_split s, rn_task_fn fn, void *arg) {
  (void)ctx; /* s already respects the context's limit (rn_split_for) */
  rn_parallel_run(s.threads, s.tasks, fn, arg);
}

typedef struct rows_job {
  rn_rows_fn fn;
  const void *arg;
  size_t units;
} rows_job;

static void rows_task(void *p, int t, int n) {
  const rows_job *j = p;
  j->fn(j->arg, rn_split_begin(j->units, t, n), rn_split_begin(j->units, t + 1, n), t);
}

void rn_run_rows(rmsnorm_context *ctx, rn_split s, size_t units, rn_rows_fn fn, const void *arg) {
  if (s.tasks == 1) { /* one task: no pool to go through */
    fn(arg, 0, units, 0);
    return;
  }
  rows_job j = {fn, arg, units};
  rn_run_tasks(ctx, s, rows_task, &j);
}

/* ---- the dweight/dbias reduction ---------------------------------------- */

int rn_grad_plan_init(rn_grad_plan *p, const rmsnorm_config *cfg, size_t units,
                      size_t chunk_units, size_t d, void *dweight, void *dbias, rn_split split) {
  memset(p, 0, sizeof *p);
  p->cfg = cfg;
  p->units = units;
  p->chunk_units = chunk_units;
  p->nchunks = (units + chunk_units - 1) / chunk_units;
  p->ngroups = p->nchunks < RN_GRAD_GROUPS ? p->nchunks : RN_GRAD_GROUPS;
  p->multi = p->nchunks > p->ngroups;
  p->d = d;
  p->acc_size = rn_acc_size(cfg->dtype);
  p->dweight = dweight;
  p->dbias = dbias;
  p->split = split;
  /* a task of several chunks per group has its own chunk partial: one task
   * a thread, and partials for as many threads as the context allows, so
   * scratch is bounded by the thread limit and does not depend on how many
   * threads the cost model chose for this call (nor on the machine's load) */
  if (p->multi) p->split.tasks = p->split.threads;
  if ((size_t)p->split.tasks > p->ngroups) p->split.tasks = (int)p->ngroups;
  if (p->split.threads > p->split.tasks) p->split.threads = p->split.tasks;
  p->ntasks = p->split.tasks;
  if (p->multi) {
    size_t most = p->split.most < 1 ? 1 : (size_t)p->split.most;
    p->ntasks = (int)(most < p->ngroups ? most : p->ngroups);
    if (p->ntasks < p->split.tasks) p->ntasks = p->split.tasks;
  }
  size_t nparts = (dweight != NULL) + (dbias != NULL);
  if (!nparts) return 1;
  if (d > SIZE_MAX / 16 / (RN_GRAD_GROUPS + (size_t)p->ntasks + 2)) return 0;
  /* one chunk per group: the chunk's partial is the group's slot (compute
   * type), and the sum over groups needs d doubles of its own; several: the
   * slots are double sums (group 0 collects the total) and every task has a
   * chunk partial */
  p->part_bytes = p->multi ? rn_align64(d * p->acc_size) : 0;
  p->group_bytes = rn_align64(d * (p->multi ? sizeof(double) : p->acc_size));
  p->total_bytes = p->multi ? 0 : rn_align64(d * sizeof(double));
  p->bytes = nparts * (p->ngroups * p->group_bytes + (size_t)p->ntasks * p->part_bytes) +
             p->total_bytes;
  return 1;
}

typedef struct grad_job {
  const rn_grad_plan *p;
  rn_chunk_fn fn;
  void *arg;
  char *dw_groups, *db_groups; /* (ngroups, d) group slots, or NULL */
  char *dw_parts, *db_parts;   /* (ntasks, d) acc chunk partials (multi), or NULL */
  double *total;               /* (d,) the sum over groups (not multi) */
  int dw_direct, db_direct;    /* the one chunk sums straight into the output */
} grad_job;

/* sum[j] += part[j] (a chunk's acc partial into its group's doubles) */
static void add_part(double *sum, const void *part, int f64, size_t d) {
  if (f64) {
    const double *q = part;
    for (size_t j = 0; j < d; j++) sum[j] += q[j];
  } else {
    const float *q = part;
    for (size_t j = 0; j < d; j++) sum[j] += q[j];
  }
}

/* Task t's groups, each chunk by chunk. */
static void chunks_task(void *arg, int t, int n) {
  const grad_job *job = arg;
  const rn_grad_plan *p = job->p;
  int f64 = rn_acc_is_f64(p->cfg->dtype);
  size_t g1 = rn_split_begin(p->ngroups, t + 1, n);
  for (size_t g = rn_split_begin(p->ngroups, t, n); g < g1; g++) {
    char *dws = job->dw_groups ? job->dw_groups + g * p->group_bytes : NULL;
    char *dbs = job->db_groups ? job->db_groups + g * p->group_bytes : NULL;
    size_t c0 = rn_split_begin(p->nchunks, (int)g, (int)p->ngroups);
    size_t c1 = rn_split_begin(p->nchunks, (int)g + 1, (int)p->ngroups);
    size_t slot = p->d * (p->multi ? sizeof(double) : p->acc_size);
    /* a group's one chunk writes its slot from nothing where fresh_parts
     * says so; double sums of several chunks start from zero */
    int zero_parts = !p->fresh_parts;
    if (dws && (p->multi || zero_parts)) memset(dws, 0, slot);
    if (dbs && (p->multi || zero_parts)) memset(dbs, 0, slot);
    /* several chunks: each into the task's partial, then into the group */
    char *dwp = p->multi && dws ? job->dw_parts + (size_t)t * p->part_bytes : dws;
    char *dbp = p->multi && dbs ? job->db_parts + (size_t)t * p->part_bytes : dbs;
    for (size_t c = c0; c < c1; c++) {
      size_t u0 = c * p->chunk_units;
      size_t u1 = u0 + p->chunk_units < p->units ? u0 + p->chunk_units : p->units;
      if (p->multi && dwp && zero_parts) memset(dwp, 0, p->d * p->acc_size);
      if (p->multi && dbp && zero_parts) memset(dbp, 0, p->d * p->acc_size);
      job->fn(job->arg, u0, u1, dwp, dbp, t);
      if (p->multi && dws) add_part((double *)(void *)dws, dwp, f64, p->d);
      if (p->multi && dbs) add_part((double *)(void *)dbs, dbp, f64, p->d);
    }
  }
}

/* chunks_task of a plan with one chunk (one group, on the caller's thread):
 * the same call on the same partials, without the group and chunk
 * arithmetic (its divisions are a good part of a one-row call's fixed cost). */
static void one_chunk(const grad_job *job) {
  const rn_grad_plan *p = job->p;
  if (!p->fresh_parts) {
    if (job->dw_groups) memset(job->dw_groups, 0, p->d * p->acc_size);
    if (job->db_groups) memset(job->db_groups, 0, p->d * p->acc_size);
  }
  job->fn(job->arg, 0, p->units, job->dw_groups, job->db_groups, 0);
}

/* out[j] = sum[j] rounded to the fp16/bf16 parameter dtype (with
 * RMSNORM_FLAG_ACCUMULATE: sum[j] + out[j], added in double), as rn_store
 * does, for j in [j0, j1); sum is f (floats) or t (doubles). Loops without
 * branches, so they run in vector lanes: a decode-sized backward writes d
 * of these a call. out: any alignment (reached by memcpy). */
static void store_halves(const rn_grad_plan *p, const float *f, const double *t, void *out,
                         size_t j0, size_t j1) {
  const rmsnorm_config *cfg = p->cfg;
  unsigned char *o = out;
  int acc = (cfg->flags & RMSNORM_FLAG_ACCUMULATE) != 0;
  if (f && !acc && p->kernels && p->kernels->narrow) {
    p->kernels->narrow(cfg->param_dtype, f + j0, j1 - j0, o + 2 * j0);
    return;
  }
#define RN_STORE_HALVES(value, narrow)                                          \
  for (size_t j = j0; j < j1; j++) {                                            \
    uint16_t h;                                                                 \
    memcpy(&h, o + 2 * j, 2);                                                   \
    h = narrow((float)(value));                                                 \
    memcpy(o + 2 * j, &h, 2);                                                   \
  }
#define RN_STORE_SUMS(s, widen, narrow)                                         \
  do {                                                                          \
    if (acc)                                                                    \
      RN_STORE_HALVES((double)(s)[j] + (double)widen(h), narrow)                \
    else                                                                        \
      RN_STORE_HALVES((s)[j], narrow)                                           \
  } while (0)
  if (cfg->param_dtype == RMSNORM_BF16) {
    if (f)
      RN_STORE_SUMS(f, rn_bf16_to_f32, rn_f32_to_bf16_lanes);
    else
      RN_STORE_SUMS(t, rn_bf16_to_f32, rn_f32_to_bf16_lanes);
  } else {
    if (f)
      RN_STORE_SUMS(f, rn_f16_to_f32_lanes, rn_f32_to_f16_lanes);
    else
      RN_STORE_SUMS(t, rn_f16_to_f32_lanes, rn_f32_to_f16_lanes);
  }
#undef RN_STORE_SUMS
#undef RN_STORE_HALVES
}

/* out[j] (or +=) = the sum over groups of slot[g][j] in group order, in
 * double, for j in [j0, j1). */
static void reduce_groups(const grad_job *job, const char *groups, void *out, size_t j0,
                          size_t j1) {
  const rn_grad_plan *p = job->p;
  const rmsnorm_config *cfg = p->cfg;
  int f64 = rn_acc_is_f64(cfg->dtype);
  int acc = (cfg->flags & RMSNORM_FLAG_ACCUMULATE) != 0;
  double *total;
  if (p->multi) { /* double sums: group 0 collects the others */
    total = (double *)(void *)groups;
    for (size_t g = 1; g < p->ngroups; g++) {
      const double *q = (const double *)(const void *)(groups + g * p->group_bytes);
      for (size_t j = j0; j < j1; j++) total[j] += q[j];
    }
  } else {
    if (p->ngroups == 1 && !acc && cfg->param_dtype == (f64 ? RMSNORM_F64 : RMSNORM_F32)) {
      /* one chunk of the output's type: the sum is the partial itself */
      memcpy((char *)out + j0 * p->acc_size, groups + j0 * p->acc_size,
             (j1 - j0) * p->acc_size);
      return;
    }
    if (p->ngroups == 1 && !f64 && cfg->param_dtype != RMSNORM_F32) {
      /* one chunk of floats into fp16/bf16: its values are the sums (in
       * double they would be the same numbers), stored without a pass
       * through doubles */
      store_halves(p, (const float *)(const void *)groups, NULL, out, j0, j1);
      return;
    }
    total = job->total;
    for (size_t g = 0; g < p->ngroups; g++) {
      const char *q = groups + g * p->group_bytes;
      if (f64) {
        const double *qd = (const double *)(const void *)q;
        if (g == 0)
          for (size_t j = j0; j < j1; j++) total[j] = qd[j];
        else
          for (size_t j = j0; j < j1; j++) total[j] += qd[j];
      } else {
        const float *qf = (const float *)(const void *)q;
        if (g == 0)
          for (size_t j = j0; j < j1; j++) total[j] = qf[j];
        else
          for (size_t j = j0; j < j1; j++) total[j] += qf[j];
      }
    }
  }
  if (cfg->param_dtype == RMSNORM_F32) { /* out: any address */
    for (size_t j = j0; j < j1; j++)
      rn_st_f32(out, j, (float)(acc ? total[j] + rn_ld_f32(out, j) : total[j]));
    return;
  }
  if (cfg->param_dtype == RMSNORM_F64) {
    for (size_t j = j0; j < j1; j++)
      rn_st_f64(out, j, acc ? total[j] + rn_ld_f64(out, j) : total[j]);
    return;
  }
  store_halves(p, NULL, total, out, j0, j1);
}

static void reduce_task(void *arg, int t, int n) {
  const grad_job *job = arg;
  size_t j0 = rn_split_begin(job->p->d, t, n), j1 = rn_split_begin(job->p->d, t + 1, n);
  if (job->p->dweight && !job->dw_direct)
    reduce_groups(job, job->dw_groups, job->p->dweight, j0, j1);
  if (job->p->dbias && !job->db_direct) reduce_groups(job, job->db_groups, job->p->dbias, j0, j1);
}

rn_split rn_grad_reduce_split(const rmsnorm_context *ctx, const rn_grad_plan *p) {
  size_t nparts = (p->dweight != NULL) + (p->dbias != NULL);
  return rn_split_for(ctx, 0, nparts * p->ngroups * p->group_bytes, p->d);
}

/* The job of p over scratch: where each chunk's partials go, and which
 * outputs need no reduction. */
static void grad_job_init(grad_job *job, const rn_grad_plan *p, void *scratch, rn_chunk_fn fn,
                          void *arg) {
  char *s = scratch;
  size_t nparts = (p->dweight != NULL) + (p->dbias != NULL);
  size_t groups = p->ngroups * p->group_bytes, parts = (size_t)p->ntasks * p->part_bytes;
  *job = (grad_job){p, fn, arg, NULL, NULL, NULL, NULL, NULL, 0, 0};
  if (p->dweight) {
    job->dw_groups = s;
    job->dw_parts = s + nparts * groups;
  }
  if (p->dbias) {
    job->db_groups = s + (p->dweight ? groups : 0);
    job->db_parts = s + nparts * groups + (p->dweight ? parts : 0);
  }
  if (nparts && !p->multi) job->total = (double *)(void *)(s + nparts * (groups + parts));
  /* One chunk whose output is its partial (compute type, aligned, not
   * accumulated into): the kernels sum into the output itself, which spares
   * a copy of d values at the end (the output is disjoint from the inputs,
   * rmsnorm_backward's overlap rule). The same bits: reduce_groups would copy
   * the partial as it is. */
  if (p->ngroups == 1 && !p->multi && !(p->cfg->flags & RMSNORM_FLAG_ACCUMULATE) &&
      p->cfg->param_dtype == (rn_acc_is_f64(p->cfg->dtype) ? RMSNORM_F64 : RMSNORM_F32)) {
    if (p->dweight && rn_aligned(p->dweight, p->acc_size))
      job->dw_groups = p->dweight, job->dw_direct = 1;
    if (p->dbias && rn_aligned(p->dbias, p->acc_size))
      job->db_groups = p->dbias, job->db_direct = 1;
  }
  if (p->dweight && p->dw_stored) job->dw_direct = 1;
}

int rn_grad_one_call(const rn_grad_plan *p, void *scratch, void **dw_part, void **db_part) {
  grad_job job;
  grad_job_init(&job, p, scratch, NULL, NULL);
  if (p->nchunks != 1 || !p->fresh_parts || (p->dweight && !job.dw_direct) ||
      (p->dbias && !job.db_direct))
    return 0;
  *dw_part = job.dw_groups, *db_part = job.db_groups;
  return 1;
}

void rn_grad_run(rmsnorm_context *ctx, const rn_grad_plan *p, void *scratch, rn_chunk_fn fn,
                 void *arg) {
  size_t nparts = (p->dweight != NULL) + (p->dbias != NULL);
  grad_job job;
  grad_job_init(&job, p, scratch, fn, arg);
  if (p->nchunks == 1)
    one_chunk(&job);
  else
    rn_run_tasks(ctx, p->split, chunks_task, &job);
  if (nparts > (size_t)job.dw_direct + (size_t)job.db_direct)
    rn_run_tasks(ctx, p->reduce.tasks ? p->reduce : rn_grad_reduce_split(ctx, p), reduce_task,
                 &job);
}
