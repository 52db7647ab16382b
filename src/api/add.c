/* add.c - the public entry points of residual add + RMSNorm, forward and
 * backward: the add and the norm run block by block over the rows, so each
 * operand makes one trip to memory (ref/fused_ref.inc is the spec). */
#include "api/entry.h"
#include "numerics/dtype.h"
#include "numerics/rowmath.h"

/* ---- forward ------------------------------------------------------------ */

/* Each block of rows: the add writes h' (kept in cache), the forward reads
 * it back for its statistics and output. One trip to memory per operand. */
static void add_fwd_rows(const void *p, size_t r0, size_t r1, int task) {
  const rn_add_forward_job *job = p;
  rmsnorm_dtype dt = job->add.dtype;
  (void)task;
  if (job->fused) { /* two passes a row (kernels.h) */
    job->fused(&job->add, &job->fwd, r0, r1);
    return;
  }
  for (size_t r = r0; r < r1; r += job->block) {
    size_t e = r + job->block < r1 ? r + job->block : r1;
    job->ks->add[dt](&job->add, r, e);
    job->ks->forward[dt](&job->fwd, r, e);
  }
}

void rn_add_forward_prepare(rn_add_forward_job *job, size_t rows) {
  size_t d = job->fwd.d, es = rn_dtype_size(job->fwd.dtype);
  /* streamed, but not as DRAM-sized (2): the add has just brought the
   * block's h into the caches */
  job->fwd.stream = rn_stream_ok(job->fwd.y != job->add.b, job->fwd.y, es, rows * d * es) != 0;
  job->block = rn_block_rows(d, es);
  /* the two-pass kernel takes a weight, no bias, and the whole row's statistic */
  job->fused = job->fwd.w && !job->fwd.b && job->fwd.k == d ? job->ks->add_forward[job->fwd.dtype]
                                                             : NULL;
}

rn_split rn_add_forward_split(const rmsnorm_context *ctx, size_t rows, size_t d, size_t es) {
  return rn_split_for(ctx, rows, rows * d * 4 * es, rows);
}

void rn_add_forward_run(rmsnorm_context *ctx, const rn_add_forward_job *job, size_t rows,
                        rn_split split) {
  if (split.tasks == 1) {
    add_fwd_rows(job, 0, rows, 0);
    return;
  }
  rn_run_rows(ctx, split, rows, add_fwd_rows, job);
}

rmsnorm_status rmsnorm_add_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows,
                                   size_t d, void *h, size_t ldh, const void *u, size_t ldu,
                                   const void *weight, const void *bias, void *y, size_t ldy,
                                   void *rstd) {
  rn_entry e;
  rmsnorm_status st = rn_entry_begin(&e, ctx, &cfg, RN_RMSNORM, RMSNORM_FLAG_ACCUMULATE, d);
  if (st == RMSNORM_OK) st = rn_entry_matrices(&e, rows, d, RN_LDS(ldh, ldu, ldy));
  if (st != RMSNORM_OK || rows == 0) return st;
  if (!h || !u || !y) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = e.es;
  /* h is an output: it must not meet anything; y may be exactly u */
  rn_buffers b;
  rn_buffers_empty(&b);
  b.in[0] = rn_inplace(rn_matrix(u, rows, d, ldu, es));
  b.out[0] = rn_matrix(y, rows, d, ldy, es);
  b.out[1] = rn_matrix(h, rows, d, ldh, es);
  b.out[2] = rn_vector(rstd, rows, e.as);
  b.weight = weight, b.bias = bias, b.nparam = d;
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;
  rn_entry_weight_direct(&e, rows, d, 0);

  rn_split split = rn_add_forward_split(ctx, rows, d, es);
  int unlocked = rn_entry_unlocked(&e, split.tasks == 1);
  if (!unlocked && (st = rn_entry_lock_params(&e)) != RMSNORM_OK) return st;
  rn_add_forward_job job;
  job.ks = e.kernels;
  job.add = (rn_add_args){cfg->dtype, d, h, ldh, u, ldu, h, ldh};
  job.fwd = rn_entry_forward_args(&e, RN_RMSNORM, d, h, ldh, y, ldy);
  job.fwd.rstd = rstd;
  rn_add_forward_prepare(&job, rows);
  rn_add_forward_run(ctx, &job, rows, split);
  return unlocked ? RMSNORM_OK : rn_entry_unlock(&e, RMSNORM_OK);
}

/* ---- backward ----------------------------------------------------------- */

/* Backward. Forward: h' = h + u, y = RMSNorm(h'), and h' goes on down the
 * residual stream. So dL/dh' = dres + J^T dy with J^T dy = rmsnorm_backward,
 * and h' = h + u gives dL/dh = dL/du = dL/dh'. Per block of rows the norm's
 * dx goes to a per-task buffer (rounded to the dtype, as rmsnorm_backward
 * writes it), then dh = dx + dres; the buffer lets dh be dres or dy. */
typedef struct add_bwd_job {
  const rn_kernel_set *ks;
  rn_backward_args bwd; /* dx of the norm; dx unused when dres is present */
  const void *dres;
  size_t lddres, lddh, block, task_bytes;
  void *dh;
  char *task_scratch; /* (ntasks, block, d) of the dtype */
} add_bwd_job;

static void add_bwd_chunk(void *p, size_t r0, size_t r1, void *dw_part, void *db_part, int t) {
  const add_bwd_job *job = p;
  const rn_backward_args *a = &job->bwd;
  rn_backward_fn kernel = job->ks->backward[a->dtype];
  if (!job->dres) { /* dh is the norm's dx */
    kernel(a, r0, r1, dw_part, db_part);
    return;
  }
  size_t es = rn_dtype_size(a->dtype), as = rn_acc_size(a->dtype);
  char *buf = job->task_scratch + (size_t)t * job->task_bytes;
  for (size_t r = r0; r < r1; r += job->block) {
    size_t n = r + job->block < r1 ? job->block : r1 - r;
    rn_backward_args b = *a; /* this block's rows, from row 0 */
    b.x = (const char *)a->x + r * a->ldx * es;
    b.dy = (const char *)a->dy + r * a->lddy * es;
    b.dx = buf;
    b.lddx = a->d;
    b.rstd = a->rstd ? (const char *)a->rstd + r * as : NULL;
    b.stream = 0;
    kernel(&b, 0, n, dw_part, db_part);
    rn_add_args add = {a->dtype, a->d, buf, a->d, (const char *)job->dres + r * job->lddres * es,
                       job->lddres, (char *)job->dh + r * job->lddh * es, job->lddh};
    job->ks->add[a->dtype](&add, 0, n);
  }
}

rmsnorm_status rmsnorm_add_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows,
                                    size_t d, const void *h, size_t ldh, const void *dy,
                                    size_t lddy, const void *dres, size_t lddres,
                                    const void *weight, const void *rstd, void *dh, size_t lddh,
                                    void *dweight, void *dbias) {
  rn_entry e;
  rmsnorm_status st = rn_entry_begin(&e, ctx, &cfg, RN_RMSNORM, 0, d);
  if (st == RMSNORM_OK)
    st = rn_entry_matrices(&e, rows, d, RN_LDS(ldh, lddy, lddh, dres ? lddres : d));
  if (st != RMSNORM_OK) return st;
  if (dweight && !weight) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  if (!h || !dy || !dh) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = e.es;
  /* dh may be exactly dy or dres (the norm's dx goes through scratch first) */
  rn_buffers b = {.in = {rn_matrix(h, rows, d, ldh, es),
                         rn_inplace(rn_matrix(dy, rows, d, lddy, es)),
                         rn_inplace(rn_matrix(dres, rows, d, lddres, es)),
                         rn_vector(rstd, rows, e.as)},
                  .out = {rn_matrix(dh, rows, d, lddh, es), rn_vector(dweight, d, e.ps),
                          rn_vector(dbias, d, e.ps)},
                  .weight = weight, .nparam = d};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;

  /* scratch: [weight copy][the reduction's sums][each task's block of dx] */
  rn_entry_lock(&e);
  size_t block = rn_block_rows(d, es);
  size_t task_bytes = dres ? rn_align64(block * d * es) : 0;
  rn_grad_plan plan;
  char *sums = rn_entry_grad_scratch(
      &e, &plan, rows, RN_BACKWARD_CHUNK_ROWS, d, dweight, dbias,
      rn_entry_backward_split(&e, rows, rows * d * (dres ? 4 : 3) * es), task_bytes);
  if (!sums) return rn_entry_unlock(&e, RMSNORM_ERROR_OUT_OF_MEMORY);
  add_bwd_job job;
  job.ks = e.kernels;
  rn_entry_backward_args(&job.bwd, &e, RN_RMSNORM, d, h, ldh, dy, lddy, dh, lddh);
  job.bwd.rstd = rstd;
  job.bwd.stream = rn_stream_ok(!dres && dh != dy, dh, es, rows * d * es);
  job.dres = dres;
  job.lddres = lddres;
  job.lddh = lddh;
  job.dh = dh;
  job.block = block;
  job.task_bytes = task_bytes;
  job.task_scratch = sums + plan.bytes;
  rn_grad_run(ctx, &plan, sums, add_bwd_chunk, &job);
  return rn_entry_unlock(&e, RMSNORM_OK);
}
