/* work.c - weight/bias conversion to the compute type, work splitting over
 * the context's pool, and the fixed-order dweight/dbias reduction shared by
 * the backward entry points (see work.h). */
#include "work.h"

#include <stdint.h>
#include <string.h>

#include "dtype.h"

static rmsnorm_dtype acc_dtype(rmsnorm_dtype dt) {
  return rn_acc_is_f64(dt) ? RMSNORM_F64 : RMSNORM_F32;
}

int rn_param_needs_copy(const rmsnorm_config *cfg, const void *p, int is_weight) {
  if (!p) return 0;
  return cfg->param_dtype != acc_dtype(cfg->dtype) ||
         (is_weight && (cfg->flags & RMSNORM_FLAG_WEIGHT_OFFSET)) ||
         !rn_aligned(p, rn_acc_size(cfg->dtype));
}

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
  rn_pool *pool = rn_context_pool(ctx, ntasks);
  if (!pool) {
    fn(arg, 0, 1);
    return;
  }
  if (ntasks > rn_pool_threads(pool)) ntasks = rn_pool_threads(pool);
  rn_pool_run(pool, ntasks, fn, arg);
}

/* ---- the dweight/dbias reduction ---------------------------------------- */

int rn_grad_plan_init(rn_grad_plan *p, const rmsnorm_config *cfg, size_t units,
                      size_t chunk_units, size_t d, void *dweight, void *dbias) {
  memset(p, 0, sizeof *p);
  p->cfg = cfg;
  p->units = units;
  p->chunk_units = chunk_units;
  p->nchunks = (units + chunk_units - 1) / chunk_units;
  p->d = d;
  p->acc_size = rn_acc_size(cfg->dtype);
  p->dweight = dweight;
  p->dbias = dbias;
  size_t nparts = (dweight != NULL) + (dbias != NULL);
  if (!nparts) return 1;
  if (p->nchunks > SIZE_MAX / 16 / d / (nparts + 1)) return 0;
  p->part_bytes = rn_align64(p->nchunks * d * p->acc_size);
  p->bytes = nparts * p->part_bytes + d * sizeof(double);
  return 1;
}

typedef struct grad_job {
  const rn_grad_plan *p;
  rn_chunk_fn fn;
  void *arg;
  char *dw_parts, *db_parts; /* (nchunks, d) acc, or NULL */
  double *total;             /* (d,) running sums of the reduction */
} grad_job;

static void chunks_task(void *arg, int t, int n) {
  const grad_job *job = arg;
  const rn_grad_plan *p = job->p;
  size_t c1 = rn_split_begin(p->nchunks, t + 1, n);
  for (size_t c = rn_split_begin(p->nchunks, t, n); c < c1; c++) {
    size_t u0 = c * p->chunk_units;
    size_t u1 = u0 + p->chunk_units < p->units ? u0 + p->chunk_units : p->units;
    size_t off = c * p->d * p->acc_size;
    job->fn(job->arg, u0, u1, job->dw_parts ? job->dw_parts + off : NULL,
            job->db_parts ? job->db_parts + off : NULL, t);
  }
}

/* out[j] (or +=) = sum over chunks of parts[c][j] in chunk order, in double,
 * for j in [j0, j1); typed loops for the common cases. */
static void reduce_parts(const grad_job *job, const char *parts, void *out, size_t j0,
                         size_t j1) {
  const rn_grad_plan *p = job->p;
  const rmsnorm_config *cfg = p->cfg;
  size_t n = j1 - j0, d = p->d;
  int f64 = rn_acc_is_f64(cfg->dtype);
  int acc = (cfg->flags & RMSNORM_FLAG_ACCUMULATE) != 0;
  if (p->nchunks == 1 && !acc && cfg->param_dtype == (f64 ? RMSNORM_F64 : RMSNORM_F32)) {
    /* one chunk, same type: the sum is the partial itself */
    memcpy((char *)out + j0 * p->acc_size, parts + j0 * p->acc_size, n * p->acc_size);
    return;
  }
  double *total = job->total + j0;
  if (f64) {
    const double *q = (const double *)(const void *)parts + j0;
    for (size_t j = 0; j < n; j++) total[j] = q[j];
    for (size_t c = 1; c < p->nchunks; c++)
      for (size_t j = 0; j < n; j++) total[j] += q[c * d + j];
  } else {
    const float *q = (const float *)(const void *)parts + j0;
    for (size_t j = 0; j < n; j++) total[j] = q[j];
    for (size_t c = 1; c < p->nchunks; c++)
      for (size_t j = 0; j < n; j++) total[j] += q[c * d + j];
  }
  if (cfg->param_dtype == RMSNORM_F32) { /* out: any address */
    for (size_t j = 0; j < n; j++)
      rn_st_f32(out, j0 + j, (float)(acc ? total[j] + rn_ld_f32(out, j0 + j) : total[j]));
    return;
  }
  for (size_t j = j0; j < j1; j++) {
    double v = total[j - j0];
    if (acc) v += rn_load(out, cfg->param_dtype, j);
    rn_store(out, cfg->param_dtype, j, v);
  }
}

static void reduce_task(void *arg, int t, int n) {
  const grad_job *job = arg;
  size_t j0 = rn_split_begin(job->p->d, t, n), j1 = rn_split_begin(job->p->d, t + 1, n);
  if (job->p->dweight) reduce_parts(job, job->dw_parts, job->p->dweight, j0, j1);
  if (job->p->dbias) reduce_parts(job, job->db_parts, job->p->dbias, j0, j1);
}

void rn_grad_run(rmsnorm_context *ctx, const rn_grad_plan *p, void *scratch, int ntasks,
                 rn_chunk_fn fn, void *arg) {
  char *s = scratch;
  size_t nparts = (p->dweight != NULL) + (p->dbias != NULL);
  grad_job job = {p, fn, arg, NULL, NULL, NULL};
  if (nparts) {
    job.dw_parts = p->dweight ? s : NULL;
    job.db_parts = p->dbias ? s + (p->dweight ? p->part_bytes : 0) : NULL;
    job.total = (double *)(void *)(s + nparts * p->part_bytes);
    memset(s, 0, nparts * p->part_bytes);
  }
  rn_run_tasks(ctx, ntasks, chunks_task, &job);
  if (nparts)
    rn_run_tasks(ctx, rn_threads_for(ctx, nparts * p->nchunks * p->d * p->acc_size, p->d),
                 reduce_task, &job);
}
