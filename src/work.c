/* work.c - weight/bias conversion to the compute type, work splitting over
 * the context's pool, and the fixed-order dweight/dbias reduction shared by
 * the backward entry points (see work.h). */
#include "work.h"

#include <stdint.h>
#include <string.h>

#include "dtype.h"

const void *rn_param_as_acc(const rmsnorm_config *cfg, const void *p, int is_weight, size_t d,
                            void *buf) {
  if (!rn_param_needs_copy(cfg, p, is_weight)) return p;
  int f64 = rn_acc_is_f64(cfg->dtype);
  double offset = is_weight && (cfg->flags & RMSNORM_FLAG_WEIGHT_OFFSET) ? 1.0 : 0.0;
  for (size_t j = 0; j < d; j++) {
    /* offset: 1 + g in the compute type, as Gemma's (1.0 + weight.float()) */
    double g = rn_load(p, cfg->param_dtype, j);
    rn_store_acc(buf, f64, j, f64 ? offset + g : (double)((float)offset + (float)g));
  }
  return buf;
}

/* Below this many bytes moved per thread, waking a thread costs more than it
 * saves. */
#define MIN_BYTES_PER_THREAD ((size_t)1 << 20)

int rn_threads_for(const rmsnorm_context *ctx, size_t bytes, size_t units) {
  size_t n = bytes / MIN_BYTES_PER_THREAD;
  size_t most = (size_t)rn_context_threads(ctx);
  if (n > most) n = most;
  if (n > units) n = units;
  return n < 1 ? 1 : (int)n;
}

void rn_run_tasks(rmsnorm_context *ctx, int ntasks, rn_task_fn fn, void *arg) {
  (void)ctx; /* ntasks already respects the context's limit (rn_threads_for) */
  rn_parallel_run(ntasks, fn, arg);
}

/* ---- the dweight/dbias reduction ---------------------------------------- */

int rn_grad_plan_init(rn_grad_plan *p, const rmsnorm_config *cfg, size_t units,
                      size_t chunk_units, size_t d, void *dweight, void *dbias, int ntasks) {
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
  p->ntasks = ntasks < 1 ? 1 : (size_t)ntasks > p->ngroups ? (int)p->ngroups : ntasks;
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
    if (dws) memset(dws, 0, p->group_bytes);
    if (dbs) memset(dbs, 0, p->group_bytes);
    /* several chunks: each into the task's partial, then into the group */
    char *dwp = p->multi && dws ? job->dw_parts + (size_t)t * p->part_bytes : dws;
    char *dbp = p->multi && dbs ? job->db_parts + (size_t)t * p->part_bytes : dbs;
    for (size_t c = c0; c < c1; c++) {
      size_t u0 = c * p->chunk_units;
      size_t u1 = u0 + p->chunk_units < p->units ? u0 + p->chunk_units : p->units;
      if (p->multi && dwp) memset(dwp, 0, p->d * p->acc_size);
      if (p->multi && dbp) memset(dbp, 0, p->d * p->acc_size);
      job->fn(job->arg, u0, u1, dwp, dbp, t);
      if (p->multi && dws) add_part((double *)(void *)dws, dwp, f64, p->d);
      if (p->multi && dbs) add_part((double *)(void *)dbs, dbp, f64, p->d);
    }
  }
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
  for (size_t j = j0; j < j1; j++) {
    double v = total[j];
    if (acc) v += rn_load(out, cfg->param_dtype, j);
    rn_store(out, cfg->param_dtype, j, v);
  }
}

static void reduce_task(void *arg, int t, int n) {
  const grad_job *job = arg;
  size_t j0 = rn_split_begin(job->p->d, t, n), j1 = rn_split_begin(job->p->d, t + 1, n);
  if (job->p->dweight) reduce_groups(job, job->dw_groups, job->p->dweight, j0, j1);
  if (job->p->dbias) reduce_groups(job, job->db_groups, job->p->dbias, j0, j1);
}

void rn_grad_run(rmsnorm_context *ctx, const rn_grad_plan *p, void *scratch, rn_chunk_fn fn,
                 void *arg) {
  char *s = scratch;
  size_t nparts = (p->dweight != NULL) + (p->dbias != NULL);
  size_t groups = p->ngroups * p->group_bytes, parts = (size_t)p->ntasks * p->part_bytes;
  grad_job job = {p, fn, arg, NULL, NULL, NULL, NULL, NULL};
  if (p->dweight) {
    job.dw_groups = s;
    job.dw_parts = s + nparts * groups;
  }
  if (p->dbias) {
    job.db_groups = s + (p->dweight ? groups : 0);
    job.db_parts = s + nparts * groups + (p->dweight ? parts : 0);
  }
  if (nparts && !p->multi) job.total = (double *)(void *)(s + nparts * (groups + parts));
  rn_run_tasks(ctx, p->ntasks, chunks_task, &job);
  if (nparts)
    rn_run_tasks(ctx, rn_threads_for(ctx, nparts * p->ngroups * p->group_bytes, p->d),
                 reduce_task, &job);
}
