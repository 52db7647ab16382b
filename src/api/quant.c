/* quant.c - the public entry point of RMSNorm with a quantized output (int8
 * or fp8 e4m3, a static scale or one per row): the kernels compute the norm
 * in the compute type and round once to the 8-bit type (ref/fused_ref.inc). */
#include <float.h>

#include "api/entry.h"
#include "numerics/dtype.h"
#include "numerics/rowmath.h"

typedef struct quant_job {
  rn_quant_fn kernel;
  rn_quant_args args;
  size_t task_bytes;
  char *task_scratch;
} quant_job;

static void quant_rows(const void *p, size_t r0, size_t r1, int task) {
  const quant_job *job = p;
  job->kernel(&job->args, r0, r1, job->task_scratch + (size_t)task * job->task_bytes);
}

rmsnorm_status rmsnorm_forward_quant(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                     size_t rows, size_t d, const void *x, size_t ldx,
                                     const void *weight, const void *bias, rmsnorm_qtype qtype,
                                     const float *static_scale, void *q, size_t ldq,
                                     float *scale, void *rstd) {
  rn_entry e;
  rmsnorm_status st = rn_entry_begin(&e, ctx, &cfg, RN_RMSNORM, RMSNORM_FLAG_ACCUMULATE, d);
  if (st == RMSNORM_OK) st = rn_entry_matrices(&e, rows, d, RN_LDS(ldx));
  if (st == RMSNORM_OK) st = rn_check_matrix(rows, d, ldq, 1);
  if (st != RMSNORM_OK) return st;
  if (qtype != RMSNORM_Q_INT8 && qtype != RMSNORM_Q_FP8_E4M3) return RMSNORM_ERROR_BAD_ARGUMENT;
  float s0 = static_scale ? rn_ld_f32(static_scale, 0) : 0.0f;
  if (static_scale && (!(s0 > 0 && s0 <= FLT_MAX) || scale))
    return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  if (!x || !q || (!static_scale && !scale)) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = e.es;
  rn_buffers b = {.in = {rn_matrix(x, rows, d, ldx, es), rn_vector(static_scale, 1, 4)},
                  .out = {rn_matrix(q, rows, d, ldq, 1), rn_vector(scale, rows, 4),
                          rn_vector(rstd, rows, e.as)},
                  .weight = weight, .bias = bias, .nparam = d};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;

  /* scratch: [weight, bias copies][each task's row scratch] */
  rn_entry_lock(&e);
  rn_split sp = rn_split_for(ctx, rows, rows * d * (es + 1), rows);
  quant_job job;
  job.task_bytes = RN_QUANT_SCRATCH(d);
  if (!(job.task_scratch = rn_entry_scratch(&e, (size_t)sp.tasks * job.task_bytes)))
    return rn_entry_unlock(&e, RMSNORM_ERROR_OUT_OF_MEMORY);
  job.kernel = e.kernels->quant[cfg->dtype];
  job.args.f = rn_entry_forward_args(&e, RN_RMSNORM, d, x, ldx, NULL, 0);
  job.args.f.rstd = rstd;
  /* rn_stream_ok's tiers on the input's size (bytes: no alignment to meet);
   * kernels prefetch from 1, repeatedly from 2 (DRAM-sized) */
  job.args.f.stream = rn_stream_ok(1, q, 1, rows * d * es);
  job.args.fp8 = qtype == RMSNORM_Q_FP8_E4M3;
  job.args.q = q;
  job.args.ldq = ldq;
  job.args.scale = scale;
  job.args.static_scale = s0;
  rn_run_rows(ctx, sp, rows, quant_rows, &job);
  return rn_entry_unlock(&e, RMSNORM_OK);
}
