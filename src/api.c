/* api.c - the public entry points of the plain norms: validate every argument
 * once (nothing is written on error, see validate.h), bring the weight and
 * bias to the compute type, run the chosen kernel set over the rows, and
 * reduce the backward's dweight/dbias partial sums in a fixed order (work.h). */
#include <string.h>

#include "context.h"
#include "dtype.h"
#include "kernels.h"
#include "rowmath.h"
#include "validate.h"
#include "work.h"

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

/* ---- forward ------------------------------------------------------------ */

typedef struct forward_job {
  rn_forward_fn kernel;
  const rn_forward_args *args;
  size_t rows;
} forward_job;

static void forward_task(void *p, int t, int n) {
  const forward_job *job = p;
  job->kernel(job->args, rn_split_begin(job->rows, t, n), rn_split_begin(job->rows, t + 1, n));
}

static rmsnorm_status run_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                  rn_norm norm, size_t rows, size_t d, const void *x,
                                  size_t ldx, const void *weight, const void *bias, void *y,
                                  size_t ldy, void *mean, void *rstd) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_status st = rn_check_config(cfg, norm, 0);
  if (st != RMSNORM_OK) return st;
  if (d == 0) return RMSNORM_ERROR_BAD_SIZE;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  if ((st = rn_check_matrix(rows, d, ldx, es)) != RMSNORM_OK ||
      (st = rn_check_matrix(rows, d, ldy, es)) != RMSNORM_OK)
    return st;
  if (rows == 0) return RMSNORM_OK;
  if (!x || !y) return RMSNORM_ERROR_NULL_POINTER;
  rn_span s[6] = {rn_matrix_span(x, rows, d, ldx, es, 0), rn_matrix_span(y, rows, d, ldy, es, 1),
                  rn_vector_span(weight, d, ps, 0),      rn_vector_span(bias, d, ps, 0),
                  rn_vector_span(mean, rows, as, 1),     rn_vector_span(rstd, rows, as, 1)};
  if ((st = rn_check_overlaps(s, 6, 1, 0, 0)) != RMSNORM_OK) return st;

  size_t wcopy = rn_param_needs_copy(cfg, weight, 1) ? rn_align64(d * as) : 0;
  size_t bcopy = rn_param_needs_copy(cfg, bias, 0) ? rn_align64(d * as) : 0;
  char *scratch = rn_context_acquire(ctx, wcopy + bcopy);
  if (!scratch) return RMSNORM_ERROR_OUT_OF_MEMORY;
  rn_forward_args a = {norm, cfg->dtype, d, norm == RN_LAYERNORM ? d : rn_partial_k(cfg->partial, d),
                       x, ldx, y, ldy,
                       rn_param_as_acc(cfg, weight, 1, d, scratch),
                       rn_param_as_acc(cfg, bias, 0, d, scratch + wcopy),
                       cfg->eps, cfg->flags, mean, rstd,
                       y != x && rows * d * es >= RN_STREAM_BYTES};
  forward_job job = {rn_context_kernels(ctx)->forward[cfg->dtype], &a, rows};
  rn_run_tasks(ctx, rn_threads_for(ctx, rows * d * 2 * es, rows), forward_task, &job);
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
} backward_job;

/* One chunk of rows: its dweight/dbias terms go to its own partial, so the
 * split between tasks cannot change a bit. */
static void backward_chunk(void *p, size_t r0, size_t r1, void *dw_part, void *db_part,
                           int task) {
  const backward_job *job = p;
  (void)task;
  job->kernel(job->args, r0, r1, dw_part, db_part);
}

static rmsnorm_status run_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                   rn_norm norm, size_t rows, size_t d, const void *x,
                                   size_t ldx, const void *dy, size_t lddy, const void *weight,
                                   const void *mean, const void *rstd, void *dx, size_t lddx,
                                   void *dweight, void *dbias) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_status st = rn_check_config(cfg, norm, 0);
  if (st != RMSNORM_OK) return st;
  if (d == 0) return RMSNORM_ERROR_BAD_SIZE;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  size_t as = rn_acc_size(cfg->dtype);
  if ((st = rn_check_matrix(rows, d, ldx, es)) != RMSNORM_OK ||
      (st = rn_check_matrix(rows, d, lddy, es)) != RMSNORM_OK ||
      (st = rn_check_matrix(rows, d, lddx, es)) != RMSNORM_OK)
    return st;
  if (dweight && !weight) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  if (!x || !dy || !dx) return RMSNORM_ERROR_NULL_POINTER;
  rn_span s[8] = {rn_matrix_span(x, rows, d, ldx, es, 0),   rn_matrix_span(dy, rows, d, lddy, es, 0),
                  rn_matrix_span(dx, rows, d, lddx, es, 1), rn_vector_span(weight, d, ps, 0),
                  rn_vector_span(mean, rows, as, 0),        rn_vector_span(rstd, rows, as, 0),
                  rn_vector_span(dweight, d, ps, 1),        rn_vector_span(dbias, d, ps, 1)};
  if ((st = rn_check_overlaps(s, 8, 2, 1, 0)) != RMSNORM_OK) return st;

  /* scratch: [weight copy][the reduction's partials and totals] */
  rn_grad_plan plan;
  if (!rn_grad_plan_init(&plan, cfg, rows, RN_BACKWARD_CHUNK_ROWS, d, dweight, dbias))
    return RMSNORM_ERROR_OUT_OF_MEMORY;
  size_t wcopy = rn_param_needs_copy(cfg, weight, 1) ? rn_align64(d * as) : 0;
  char *scratch = rn_context_acquire(ctx, wcopy + plan.bytes);
  if (!scratch) return RMSNORM_ERROR_OUT_OF_MEMORY;
  rn_backward_args a = {norm, cfg->dtype, d, norm == RN_LAYERNORM ? d : rn_partial_k(cfg->partial, d),
                        x, ldx, dy, lddy, dx, lddx,
                        rn_param_as_acc(cfg, weight, 1, d, scratch),
                        cfg->eps, cfg->flags, mean, rstd,
                        dx != dy && dx != x && rows * d * es >= RN_STREAM_BYTES};
  backward_job job = {rn_context_kernels(ctx)->backward[cfg->dtype], &a};
  rn_grad_run(ctx, &plan, scratch + wcopy, rn_threads_for(ctx, rows * d * 3 * es, plan.nchunks),
              backward_chunk, &job);
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
