/* api.c - the public entry points: validate every argument once (nothing is
 * written on error), bring the weight and bias to the compute type, run the
 * chosen kernel set over the rows, and reduce the backward's dweight/dbias
 * partial sums in a fixed order. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "parallel.h"
#include "dtype.h"
#include "kernels.h"
#include "rowmath.h"

#define KNOWN_FLAGS                                                              \
  (RMSNORM_FLAG_EPS_OUTSIDE | RMSNORM_FLAG_WEIGHT_OFFSET |                       \
   RMSNORM_FLAG_ROUND_BEFORE_WEIGHT | RMSNORM_FLAG_ACCUMULATE)

rmsnorm_status rmsnorm_default_eps(rmsnorm_dtype dtype, double *eps) {
  if (!eps) return RMSNORM_ERROR_NULL_POINTER;
  if (!rn_dtype_valid(dtype)) return RMSNORM_ERROR_BAD_DTYPE;
  /* torch: torch.finfo(opmath type).eps, the opmath type of half/bf16 being float */
  *eps = dtype == RMSNORM_F64 ? 0x1p-52 : 0x1p-23;
  return RMSNORM_OK;
}

rmsnorm_status rmsnorm_config_init(rmsnorm_config *cfg, rmsnorm_dtype dtype) {
  double eps;
  if (!cfg) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_status st = rmsnorm_default_eps(dtype, &eps);
  if (st != RMSNORM_OK) return st;
  cfg->dtype = dtype;
  cfg->param_dtype = dtype;
  cfg->eps = eps;
  cfg->partial = 1.0;
  cfg->flags = 0;
  return RMSNORM_OK;
}

/* ---- validation ------------------------------------------------------- */

static rmsnorm_status check_config(const rmsnorm_config *cfg, rn_norm norm) {
  if (!cfg) return RMSNORM_ERROR_NULL_POINTER;
  if (!rn_dtype_valid((int)cfg->dtype) || !rn_dtype_valid((int)cfg->param_dtype) ||
      (cfg->param_dtype != RMSNORM_F32 && cfg->param_dtype != cfg->dtype))
    return RMSNORM_ERROR_BAD_DTYPE;
  if ((cfg->flags & ~(unsigned)KNOWN_FLAGS) ||
      (norm == RN_LAYERNORM && (cfg->flags & RMSNORM_FLAG_EPS_OUTSIDE)))
    return RMSNORM_ERROR_BAD_FLAGS;
  if (!(cfg->eps >= 0 && cfg->eps <= DBL_MAX)) return RMSNORM_ERROR_BAD_EPS;
  if (!(cfg->partial > 0 && cfg->partial <= 1) || (norm == RN_LAYERNORM && cfg->partial != 1))
    return RMSNORM_ERROR_BAD_PARTIAL;
  return RMSNORM_OK;
}

/* A buffer as a byte range [lo, hi), for the overlap checks. */
typedef struct span {
  const char *lo, *hi;
  size_t ld; /* row stride of a matrix, 0 for vectors */
  int output;
} span;

/* Checks a rows x d matrix's stride and that its extent fits in memory. */
static rmsnorm_status check_matrix(size_t rows, size_t d, size_t ld, size_t es) {
  if (ld < d) return RMSNORM_ERROR_BAD_STRIDE;
  if (rows > 1 && (rows - 1) > (SIZE_MAX - d) / ld) return RMSNORM_ERROR_BAD_SIZE;
  size_t extent = rows ? (rows - 1) * ld + d : 0;
  if (extent > (size_t)PTRDIFF_MAX / es) return RMSNORM_ERROR_BAD_SIZE;
  return RMSNORM_OK;
}

static span matrix_span(const void *p, size_t rows, size_t d, size_t ld, size_t es,
                        int output) {
  span s = {(const char *)p, (const char *)p + ((rows - 1) * ld + d) * es, ld, output};
  return s;
}

static span vector_span(const void *p, size_t n, size_t es, int output) {
  span s = {(const char *)p, (const char *)p + n * es, 0, output};
  return s;
}

/* Every output must be disjoint from every other buffer, except the exact
 * in-place views: output `inplace_out` may equal inputs inplace_in[0..1]. */
static rmsnorm_status check_overlaps(const span *s, size_t n, size_t inplace_out,
                                     size_t inplace_in0, size_t inplace_in1) {
  for (size_t i = 0; i < n; i++) {
    if (!s[i].lo || !s[i].output) continue;
    for (size_t j = 0; j < n; j++) {
      if (j == i || !s[j].lo) continue;
      if (s[j].output && j < i) continue; /* pair already seen */
      if (s[i].lo >= s[j].hi || s[j].lo >= s[i].hi) continue;
      int allowed = i == inplace_out && (j == inplace_in0 || j == inplace_in1) &&
                    s[i].lo == s[j].lo && s[i].ld == s[j].ld;
      if (!allowed) return RMSNORM_ERROR_OVERLAP;
    }
  }
  return RMSNORM_OK;
}

/* ---- parameters in the compute type ----------------------------------- */

/* The storage dtype of the compute type: what kernels read weights as. */
static rmsnorm_dtype acc_dtype(rmsnorm_dtype dt) {
  return rn_acc_is_f64(dt) ? RMSNORM_F64 : RMSNORM_F32;
}

static int param_needs_copy(const rmsnorm_config *cfg, const void *p, int is_weight) {
  if (!p) return 0;
  return cfg->param_dtype != acc_dtype(cfg->dtype) ||
         (is_weight && (cfg->flags & RMSNORM_FLAG_WEIGHT_OFFSET));
}

/* Returns p in the compute type: p itself, or a converted copy in `buf`. */
static const void *param_as_acc(const rmsnorm_config *cfg, const void *p, int is_weight,
                                size_t d, void *buf) {
  if (!param_needs_copy(cfg, p, is_weight)) return p;
  int f64 = rn_acc_is_f64(cfg->dtype);
  double offset = is_weight && (cfg->flags & RMSNORM_FLAG_WEIGHT_OFFSET) ? 1.0 : 0.0;
  for (size_t j = 0; j < d; j++) {
    /* offset: 1 + g in the compute type, as Gemma's (1.0 + weight.float()) */
    double g = rn_load(p, cfg->param_dtype, j);
    rn_store_acc(buf, f64, j, f64 ? offset + g : (double)((float)offset + (float)g));
  }
  return buf;
}

/* ---- splitting work across the context's threads ------------------------ */

/* Below this many bytes moved per thread, waking a thread costs more than it
 * saves (a decode row of 4096 stays on the caller's thread). */
#define MIN_BYTES_PER_THREAD ((size_t)1 << 20)

/* Threads worth using for `bytes` of traffic split into `units` pieces. */
static int threads_for(const rmsnorm_context *ctx, size_t bytes, size_t units) {
  size_t n = bytes / MIN_BYTES_PER_THREAD;
  size_t most = (size_t)rn_context_threads(ctx);
  if (n > most) n = most;
  if (n > units) n = units;
  return n < 1 ? 1 : (int)n;
}

/* Outputs this large are written with non-temporal stores where the kernel
 * set has them: they would not stay in cache, and skipping the read-for-
 * ownership saves a third of the traffic. */
#define STREAM_BYTES ((size_t)16 << 20)

/* Runs fn over `ntasks` tasks on the context's pool, or inline as one task
 * when no pool is wanted or can be had. */
static void run_tasks(rmsnorm_context *ctx, int ntasks, rn_task_fn fn, void *arg) {
  rn_pool *pool = rn_context_pool(ctx, ntasks);
  if (!pool) {
    fn(arg, 0, 1);
    return;
  }
  if (ntasks > rn_pool_threads(pool)) ntasks = rn_pool_threads(pool);
  rn_pool_run(pool, ntasks, fn, arg);
}

/* Task t of n gets units [begin, end): contiguous, cache-friendly blocks. */
static size_t split_begin(size_t units, int t, int n) { return units * (size_t)t / (size_t)n; }

typedef struct forward_job {
  rn_forward_fn kernel;
  const rn_forward_args *args;
  size_t rows;
} forward_job;

static void forward_task(void *p, int t, int n) {
  const forward_job *job = p;
  job->kernel(job->args, split_begin(job->rows, t, n), split_begin(job->rows, t + 1, n));
}

/* Scratch regions start on 64-byte boundaries. */
static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* ---- forward ------------------------------------------------------------ */

static rmsnorm_status run_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                  rn_norm norm, size_t rows, size_t d, const void *x,
                                  size_t ldx, const void *weight, const void *bias, void *y,
                                  size_t ldy, void *mean, void *rstd) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_status st = check_config(cfg, norm);
  if (st != RMSNORM_OK) return st;
  if (d == 0) return RMSNORM_ERROR_BAD_SIZE;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  if ((st = check_matrix(rows, d, ldx, es)) != RMSNORM_OK ||
      (st = check_matrix(rows, d, ldy, es)) != RMSNORM_OK)
    return st;
  if (rows == 0) return RMSNORM_OK;
  if (!x || !y) return RMSNORM_ERROR_NULL_POINTER;
  span s[6] = {matrix_span(x, rows, d, ldx, es, 0), matrix_span(y, rows, d, ldy, es, 1),
               vector_span(weight, d, ps, 0),      vector_span(bias, d, ps, 0),
               vector_span(mean, rows, as, 1),     vector_span(rstd, rows, as, 1)};
  if ((st = check_overlaps(s, 6, 1, 0, 0)) != RMSNORM_OK) return st;

  size_t wcopy = param_needs_copy(cfg, weight, 1) ? align64(d * as) : 0;
  size_t bcopy = param_needs_copy(cfg, bias, 0) ? align64(d * as) : 0;
  rn_context_lock(ctx);
  char *scratch = rn_context_scratch(ctx, wcopy + bcopy);
  if (!scratch && wcopy + bcopy) {
    rn_context_unlock(ctx);
    return RMSNORM_ERROR_OUT_OF_MEMORY;
  }
  rn_forward_args a = {norm, cfg->dtype, d, norm == RN_LAYERNORM ? d : rn_partial_k(cfg->partial, d),
                       x, ldx, y, ldy,
                       param_as_acc(cfg, weight, 1, d, scratch),
                       param_as_acc(cfg, bias, 0, d, scratch + wcopy),
                       cfg->eps, cfg->flags, mean, rstd,
                       y != x && rows * d * es >= STREAM_BYTES};
  forward_job job = {rn_context_kernels(ctx)->forward[cfg->dtype], &a, rows};
  run_tasks(ctx, threads_for(ctx, rows * d * 2 * es, rows), forward_task, &job);
  rn_context_unlock(ctx);
  return RMSNORM_OK;
}

rmsnorm_status rmsnorm_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows,
                               size_t d, const void *x, size_t ldx, const void *weight,
                               const void *bias, void *y, size_t ldy, void *rstd) {
  return run_forward(ctx, cfg, RN_RMSNORM, rows, d, x, ldx, weight, bias, y, ldy, NULL, rstd);
}

rmsnorm_status rmsnorm_layernorm_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                         size_t rows, size_t d, const void *x, size_t ldx,
                                         const void *weight, const void *bias, void *y,
                                         size_t ldy, void *mean, void *rstd) {
  return run_forward(ctx, cfg, RN_LAYERNORM, rows, d, x, ldx, weight, bias, y, ldy, mean, rstd);
}

/* ---- backward ----------------------------------------------------------- */

typedef struct backward_job {
  rn_backward_fn kernel;
  const rn_backward_args *args;
  const rmsnorm_config *cfg;
  size_t rows, nchunks, d, acc_size;
  char *dw_parts, *db_parts; /* (nchunks, d) acc partial sums, or NULL */
  double *total;             /* (d,) the reduction's running sums */
  void *dweight, *dbias;
} backward_job;

/* Rows, one chunk at a time: each chunk's dweight/dbias terms go to its own
 * partial, so the split between tasks cannot change a bit. */
static void backward_rows_task(void *p, int t, int n) {
  const backward_job *job = p;
  size_t c1 = split_begin(job->nchunks, t + 1, n);
  for (size_t c = split_begin(job->nchunks, t, n); c < c1; c++) {
    size_t r0 = c * RN_BACKWARD_CHUNK_ROWS;
    size_t r1 = r0 + RN_BACKWARD_CHUNK_ROWS < job->rows ? r0 + RN_BACKWARD_CHUNK_ROWS : job->rows;
    size_t off = c * job->d * job->acc_size;
    job->kernel(job->args, r0, r1, job->dw_parts ? job->dw_parts + off : NULL,
                job->db_parts ? job->db_parts + off : NULL);
  }
}

/* Writes (or adds) out[j] = sum over chunks of parts[c][j], summed in chunk
 * order in double whatever the thread count, for columns [j0, j1). */
static void reduce_parts(const backward_job *job, const char *parts, void *out, size_t j0,
                         size_t j1) {
  const rmsnorm_config *cfg = job->cfg;
  size_t n = j1 - j0, d = job->d;
  int acc = (cfg->flags & RMSNORM_FLAG_ACCUMULATE) != 0;
  if (job->nchunks == 1 && !acc && cfg->param_dtype == (rn_acc_is_f64(cfg->dtype) ? RMSNORM_F64 : RMSNORM_F32)) {
    /* one chunk, same type: the sum is the partial itself */
    memcpy((char *)out + j0 * job->acc_size, parts + j0 * job->acc_size, n * job->acc_size);
    return;
  }
  double *total = job->total + j0;
  if (rn_acc_is_f64(cfg->dtype)) {
    const double *p = (const double *)(const void *)parts + j0;
    for (size_t j = 0; j < n; j++) total[j] = p[j];
    for (size_t c = 1; c < job->nchunks; c++)
      for (size_t j = 0; j < n; j++) total[j] += p[c * d + j];
  } else {
    const float *p = (const float *)(const void *)parts + j0;
    for (size_t j = 0; j < n; j++) total[j] = p[j];
    for (size_t c = 1; c < job->nchunks; c++)
      for (size_t j = 0; j < n; j++) total[j] += p[c * d + j];
  }
  if (cfg->param_dtype == RMSNORM_F32) {
    float *o = (float *)out + j0;
    for (size_t j = 0; j < n; j++) o[j] = (float)(acc ? total[j] + o[j] : total[j]);
  } else {
    for (size_t j = j0; j < j1; j++) {
      double v = total[j - j0];
      if (acc) v += rn_load(out, cfg->param_dtype, j);
      rn_store(out, cfg->param_dtype, j, v);
    }
  }
}

static void backward_reduce_task(void *p, int t, int n) {
  const backward_job *job = p;
  size_t j0 = split_begin(job->d, t, n), j1 = split_begin(job->d, t + 1, n);
  if (job->dweight) reduce_parts(job, job->dw_parts, job->dweight, j0, j1);
  if (job->dbias) reduce_parts(job, job->db_parts, job->dbias, j0, j1);
}

static rmsnorm_status run_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                   rn_norm norm, size_t rows, size_t d, const void *x,
                                   size_t ldx, const void *dy, size_t lddy, const void *weight,
                                   const void *mean, const void *rstd, void *dx, size_t lddx,
                                   void *dweight, void *dbias) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_status st = check_config(cfg, norm);
  if (st != RMSNORM_OK) return st;
  if (d == 0) return RMSNORM_ERROR_BAD_SIZE;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  if ((st = check_matrix(rows, d, ldx, es)) != RMSNORM_OK ||
      (st = check_matrix(rows, d, lddy, es)) != RMSNORM_OK ||
      (st = check_matrix(rows, d, lddx, es)) != RMSNORM_OK)
    return st;
  if (dweight && !weight) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  if (!x || !dy || !dx) return RMSNORM_ERROR_NULL_POINTER;
  span s[8] = {matrix_span(x, rows, d, ldx, es, 0),   matrix_span(dy, rows, d, lddy, es, 0),
               matrix_span(dx, rows, d, lddx, es, 1), vector_span(weight, d, ps, 0),
               vector_span(mean, rows, as, 0),        vector_span(rstd, rows, as, 0),
               vector_span(dweight, d, ps, 1),        vector_span(dbias, d, ps, 1)};
  if ((st = check_overlaps(s, 8, 2, 1, 0)) != RMSNORM_OK) return st;

  /* scratch: [weight copy][dweight parts][dbias parts][totals] */
  size_t nchunks = (rows + RN_BACKWARD_CHUNK_ROWS - 1) / RN_BACKWARD_CHUNK_ROWS;
  size_t nparts = (dweight != NULL) + (dbias != NULL);
  size_t wcopy = param_needs_copy(cfg, weight, 1) ? align64(d * as) : 0;
  if (nparts && nchunks > SIZE_MAX / 16 / d / (nparts + 1)) return RMSNORM_ERROR_OUT_OF_MEMORY;
  size_t part_bytes = align64(nchunks * d * as);
  size_t bytes = wcopy + nparts * part_bytes + (nparts ? d * sizeof(double) : 0);
  rn_context_lock(ctx);
  char *scratch = rn_context_scratch(ctx, bytes);
  if (!scratch && bytes) {
    rn_context_unlock(ctx);
    return RMSNORM_ERROR_OUT_OF_MEMORY;
  }
  char *dw_parts = dweight ? scratch + wcopy : NULL;
  char *db_parts = dbias ? scratch + wcopy + (dweight ? part_bytes : 0) : NULL;
  if (nparts) memset(scratch + wcopy, 0, nparts * part_bytes);

  rn_backward_args a = {norm, cfg->dtype, d, norm == RN_LAYERNORM ? d : rn_partial_k(cfg->partial, d),
                        x, ldx, dy, lddy, dx, lddx,
                        param_as_acc(cfg, weight, 1, d, scratch),
                        cfg->eps, cfg->flags, mean, rstd,
                        dx != dy && dx != x && rows * d * es >= STREAM_BYTES};
  backward_job job = {rn_context_kernels(ctx)->backward[cfg->dtype], &a, cfg, rows, nchunks, d,
                      as, dw_parts, db_parts,
                      (double *)(void *)(scratch + wcopy + nparts * part_bytes), dweight, dbias};
  run_tasks(ctx, threads_for(ctx, rows * d * 3 * es, nchunks), backward_rows_task, &job);
  if (nparts)
    run_tasks(ctx, threads_for(ctx, nparts * nchunks * d * as, d), backward_reduce_task, &job);
  rn_context_unlock(ctx);
  return RMSNORM_OK;
}

rmsnorm_status rmsnorm_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows,
                                size_t d, const void *x, size_t ldx, const void *dy,
                                size_t lddy, const void *weight, const void *rstd, void *dx,
                                size_t lddx, void *dweight, void *dbias) {
  return run_backward(ctx, cfg, RN_RMSNORM, rows, d, x, ldx, dy, lddy, weight, NULL, rstd, dx,
                      lddx, dweight, dbias);
}

rmsnorm_status rmsnorm_layernorm_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                          size_t rows, size_t d, const void *x, size_t ldx,
                                          const void *dy, size_t lddy, const void *weight,
                                          const void *mean, const void *rstd, void *dx,
                                          size_t lddx, void *dweight, void *dbias) {
  return run_backward(ctx, cfg, RN_LAYERNORM, rows, d, x, ldx, dy, lddy, weight, mean, rstd, dx,
                      lddx, dweight, dbias);
}
