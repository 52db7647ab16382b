/* sandwich.c - the public entry points of Gemma 2/3's sandwich norms, forward
 * and backward: h' = h + post_norm(a), x' = pre_norm(h'). The forward runs
 * the set's one-pass kernel where it has one (kernels/sandwich_simd.inc);
 * otherwise, and in the backward, the two norms and the add run on the
 * context's kernels block by block over the rows, the intermediate
 * (post_norm's y, pre_norm's dx) in a per-task buffer, so each operand makes
 * one trip to memory. Either way the results are bit for bit the separate
 * calls' (rmsnorm_forward / rmsnorm_backward and the add). */
#include "api/entry.h"
#include "numerics/dtype.h"

/* Bytes of the compute-type copy of the second norm's weight w (the entry
 * machinery converts the first; rn_param_as_acc makes this one, 1 + g folded
 * in): 0 when the kernels take w as it is. */
static size_t second_weight_bytes(const rn_entry *e, const void *w, size_t d) {
  return rn_param_needs_copy(&e->cfg, w, 1) ? rn_align64(d * e->as) : 0;
}

/* ---- forward ------------------------------------------------------------ */

typedef struct sw_fwd_job {
  const rn_kernel_set *ks;
  rn_forward_args post; /* y = post_norm(a): rows of a, y into the task's buffer */
  rn_add_args add;      /* h = h + y */
  rn_forward_args pre;  /* x' = pre_norm(h') */
  size_t block, task_bytes;
  char *task_scratch;   /* (tasks, block, d) of the dtype */
  rn_sandwich_fn fused; /* the set's one-pass kernel, or NULL */
} sw_fwd_job;

/* Each block of rows: post_norm(a) into the task's buffer, h += it (h' stays
 * in cache), then pre_norm reads h' back for x'. */
static void sw_fwd_rows(const void *p, size_t r0, size_t r1, int task) {
  const sw_fwd_job *job = p;
  rmsnorm_dtype dt = job->pre.dtype;
  size_t d = job->pre.d, es = rn_dtype_size(dt), as = rn_acc_size(dt);
  char *buf = job->task_scratch + (size_t)task * job->task_bytes;
  if (job->fused) {
    rn_sandwich_args sw = {job->post, job->pre};
    job->fused(&sw, r0, r1, buf);
    return;
  }
  for (size_t r = r0; r < r1; r += job->block) {
    size_t n = r + job->block < r1 ? job->block : r1 - r;
    rn_forward_args post = job->post; /* this block's rows, from row 0 */
    post.x = (const char *)job->post.x + r * post.ldx * es;
    post.rstd = post.rstd ? (char *)post.rstd + r * as : NULL;
    post.y = buf;
    post.ldy = d;
    job->ks->forward[dt](&post, 0, n);
    rn_add_args add = job->add;
    add.a = (const char *)add.a + r * add.lda * es;
    add.b = buf;
    add.out = (char *)add.out + r * add.ldo * es;
    job->ks->add[dt](&add, 0, n);
    job->ks->forward[dt](&job->pre, r, r + n);
  }
}

/* rows x d, four operands of es bytes an element */
RN_FUSED_STEP rn_split sw_fwd_split(const rmsnorm_context *ctx, size_t rows, size_t d, size_t es) {
  return rn_split_for(ctx, rows, rows * d * 4 * es, rows);
}

RN_FUSED_STEP rmsnorm_status sw_fwd_check(rn_entry *e, rn_fused_call *c) {
  if (c->rows == 0) return RMSNORM_OK;
  if (!c->x || !c->u || !c->y) return RMSNORM_ERROR_NULL_POINTER;
  size_t rows = c->rows, d = c->d, es = e->es;
  /* h is updated: it must not meet anything; x' may be exactly a. The entry
   * machinery converts weight_post; weight_pre is an input like a. */
  rn_buffers b = {.in = {rn_inplace(rn_matrix(c->x, rows, d, c->ldx, es)),
                         rn_vector(c->weight_pre, d, e->ps)},
                  .out = {rn_matrix(c->y, rows, d, c->ldy, es),
                          rn_matrix(c->u, rows, d, c->ldu, es), rn_vector(c->rstd, rows, e->as),
                          rn_vector(c->rstd_pre, rows, e->as)},
                  .weight = c->weight, .nparam = d};
  return rn_entry_check(e, &b);
}

/* [the job][weight_pre copy][each task's block of y] */
RN_FUSED_STEP size_t sw_fwd_bytes(rn_entry *e, const rn_fused_call *c, rn_split split) {
  size_t d = c->d, task_bytes = rn_align64(rn_block_rows(d, e->es) * d * e->es);
  return rn_align64(sizeof(sw_fwd_job)) + second_weight_bytes(e, c->weight_pre, d) +
         (size_t)split.tasks * task_bytes;
}

RN_FUSED_STEP rn_rows_job sw_fwd_prepare(const rn_entry *e, const rn_fused_call *c, rn_split split,
                                         char *mem) {
  (void)split;
  size_t d = c->d, es = e->es, rows = c->rows;
  rmsnorm_dtype dt = e->cfg.dtype;
  sw_fwd_job *job = (sw_fwd_job *)(void *)mem;
  char *s = mem + rn_align64(sizeof *job);
  size_t wpre_bytes = second_weight_bytes(e, c->weight_pre, d);
  job->ks = e->kernels;
  job->post = rn_entry_forward_args(e, RN_RMSNORM, d, c->x, c->ldx, NULL, d);
  job->post.rstd = c->rstd;
  job->post.stream = RN_CACHED; /* y is read back at once */
  job->add = (rn_add_args){dt, d, c->u, c->ldu, NULL, d, c->u, c->ldu};
  job->pre = rn_entry_forward_args(e, RN_RMSNORM, d, c->u, c->ldu, c->y, c->ldy);
  job->pre.w = rn_param_as_acc(&e->cfg, e->kernels, c->weight_pre, 1, d, s);
  job->pre.rstd = c->rstd_pre;
  /* streamed, but not as DRAM-sized (2): the add has just brought the block's
   * h' into the caches */
  job->pre.stream = rn_stream_ok(c->y != c->x, c->y, es, rows * d * es) != 0;
  job->block = rn_block_rows(d, es);
  job->task_bytes = rn_align64(job->block * d * es);
  job->task_scratch = s + wpre_bytes;
  /* the one-pass kernel takes what Gemma runs: whole-row statistics, both
   * weights */
  int fits = job->post.k == d && job->post.w && job->pre.w;
  job->fused = fits ? e->kernels->sandwich_forward[dt] : NULL;
  /* it reads a and h from memory: DRAM-sized calls prefetch as such */
  if (job->fused) job->pre.stream = rn_stream_ok(c->y != c->x, c->y, es, rows * d * es);
  return (rn_rows_job){sw_fwd_rows, job};
}

const rn_fused_op rn_sandwich_forward_op = {sw_fwd_split, sw_fwd_check, sw_fwd_bytes,
                                            sw_fwd_prepare};

rmsnorm_status rmsnorm_sandwich_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                        size_t rows, size_t d, const void *a, size_t lda,
                                        void *h, size_t ldh, const void *weight_post,
                                        const void *weight_pre, void *x_next, size_t ldxn,
                                        void *rstd_post, void *rstd_pre) {
  rn_entry e;
  rmsnorm_status st = rn_entry_begin(&e, ctx, &cfg, RN_RMSNORM, RMSNORM_FLAG_ACCUMULATE, d);
  if (st == RMSNORM_OK) st = rn_entry_matrices(&e, rows, d, RN_LDS(lda, ldh, ldxn));
  if (st != RMSNORM_OK) return st;
  rn_fused_call c;
  rn_fused_call_init(&c, rows, d);
  c.x = a, c.ldx = lda, c.u = h, c.ldu = ldh, c.y = x_next, c.ldy = ldxn;
  c.weight = weight_post, c.weight_pre = weight_pre, c.rstd = rstd_post, c.rstd_pre = rstd_pre;
  return rn_fused_oneshot(&e, &rn_sandwich_forward_op, &c);
}

/* ---- backward ----------------------------------------------------------- */

/* Backward. Forward: h' = h + y with y = post_norm(a), x' = pre_norm(h'), and
 * h' goes on down the residual stream. So
 *   dL/dh' = dh_out + J_pre^T dx_next          (dt; J_pre^T dx_next is
 *                                               rmsnorm_backward of pre_norm at h')
 *   dL/dh  = dL/dh'                            (h' = h + y: the identity in h)
 *   dL/dy  = dL/dh'                            (and in y)
 *   dL/da  = J_post^T dL/dy                    (rmsnorm_backward of post_norm at a)
 * with each norm's dweight its rmsnorm_backward's. As the separate calls
 * give it, pre_norm's dx is rounded to the dtype, the sum with dh_out rounded
 * again, and post_norm's backward reads that rounded dt. Per block of rows:
 * pre_norm's dx goes to the task's buffer (to dh itself when dh_out is NULL),
 * dt = dx + dh_out is written to dh, and post_norm's backward reads it back
 * from the cache for da. */
typedef struct sw_bwd_job {
  const rn_kernel_set *ks;
  rn_backward_args pre;  /* x = h', dy = dx_next, dx = dh (through the buffer with dh_out) */
  rn_backward_args post; /* x = a, dy = dt (in dh), dx = da */
  const void *dh_out;
  size_t lddh_out, block, task_bytes;
  char *task_scratch;    /* (ntasks, block, d) of the dtype */
} sw_bwd_job;

/* One chunk of rows; pre_norm's dweight terms go to dw_part, post_norm's to
 * db_part (the reduction's second output, treated as the first). */
static void sw_bwd_chunk(void *p, size_t r0, size_t r1, void *dw_pre, void *dw_post, int t) {
  const sw_bwd_job *job = p;
  rmsnorm_dtype dt = job->pre.dtype;
  rn_backward_fn kernel = job->ks->backward[dt];
  size_t d = job->pre.d, es = rn_dtype_size(dt), as = rn_acc_size(dt);
  char *buf = job->task_scratch + (size_t)t * job->task_bytes;
  for (size_t r = r0; r < r1; r += job->block) {
    size_t n = r + job->block < r1 ? job->block : r1 - r;
    if (!job->dh_out) { /* dt is pre_norm's dx: straight into dh */
      kernel(&job->pre, r, r + n, dw_pre, NULL);
    } else {
      rn_backward_args pre = job->pre; /* this block's rows, from row 0 */
      pre.x = (const char *)pre.x + r * pre.ldx * es;
      pre.dy = (const char *)pre.dy + r * pre.lddy * es;
      pre.rstd = pre.rstd ? (const char *)pre.rstd + r * as : NULL;
      pre.dx = buf;
      pre.lddx = d;
      kernel(&pre, 0, n, dw_pre, NULL);
      size_t lddh = job->pre.lddx;
      rn_add_args add = {dt, d, buf, d, (const char *)job->dh_out + r * job->lddh_out * es,
                         job->lddh_out, (char *)job->pre.dx + r * lddh * es, lddh};
      job->ks->add[dt](&add, 0, n);
    }
    kernel(&job->post, r, r + n, dw_post, NULL);
  }
}

/* The backward's overlap rule: every output disjoint from every other buffer,
 * except that dh may be exactly dh_out or dx_next and da exactly a or
 * dx_next. rn_check_overlaps allows one in-place output, so the rule runs
 * twice over one list of the buffers: dh and the dweights written (da then
 * counts as read, which still keeps it apart from dh), then da. */
enum { B_DH, B_DHOUT, B_DXN, B_DA, B_A, B_H, B_RPOST, B_RPRE, B_WPOST, B_WPRE, B_DWPOST,
       B_DWPRE, B_N };

static rmsnorm_status check_backward_buffers(rn_span *s) {
  static const int first[] = {B_DH, B_DWPOST, B_DWPRE};
  for (size_t i = 0; i < sizeof first / sizeof first[0]; i++) s[first[i]].output = 1;
  rmsnorm_status st = rn_check_overlaps(s, B_N, B_DH, B_DHOUT, B_DXN);
  if (st != RMSNORM_OK) return st;
  for (size_t i = 0; i < sizeof first / sizeof first[0]; i++) s[first[i]].output = 0;
  s[B_DA].output = 1;
  return rn_check_overlaps(s, B_N, B_DA, B_A, B_DXN);
}

rmsnorm_status rmsnorm_sandwich_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                         size_t rows, size_t d, const void *a, size_t lda,
                                         const void *h, size_t ldh, const void *dh_out,
                                         size_t lddh_out, const void *dx_next, size_t lddxn,
                                         const void *weight_post, const void *weight_pre,
                                         const void *rstd_post, const void *rstd_pre, void *da,
                                         size_t ldda, void *dh, size_t lddh,
                                         void *dweight_post, void *dweight_pre) {
  rn_entry e;
  rmsnorm_status st = rn_entry_begin(&e, ctx, &cfg, RN_RMSNORM, 0, d);
  if (st == RMSNORM_OK)
    st = rn_entry_matrices(&e, rows, d,
                           RN_LDS(lda, ldh, dh_out ? lddh_out : d, lddxn, ldda, lddh));
  if (st != RMSNORM_OK) return st;
  if ((dweight_post && !weight_post) || (dweight_pre && !weight_pre))
    return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  if (!a || !h || !dx_next || !da || !dh) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = e.es;
  rn_span s[B_N] = {
      [B_DH] = rn_matrix(dh, rows, d, lddh, es),
      [B_DHOUT] = rn_matrix(dh_out, rows, d, lddh_out, es),
      [B_DXN] = rn_matrix(dx_next, rows, d, lddxn, es),
      [B_DA] = rn_matrix(da, rows, d, ldda, es),
      [B_A] = rn_matrix(a, rows, d, lda, es),
      [B_H] = rn_matrix(h, rows, d, ldh, es),
      [B_RPOST] = rn_vector(rstd_post, rows, e.as),
      [B_RPRE] = rn_vector(rstd_pre, rows, e.as),
      [B_WPOST] = rn_vector(weight_post, d, e.ps),
      [B_WPRE] = rn_vector(weight_pre, d, e.ps),
      [B_DWPOST] = rn_vector(dweight_post, d, e.ps),
      [B_DWPRE] = rn_vector(dweight_pre, d, e.ps),
  };
  if ((st = check_backward_buffers(s)) != RMSNORM_OK) return st;
  /* the overlaps are checked: this sizes weight_post's copy */
  rn_buffers b = {.weight = weight_post, .nparam = d};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;

  /* scratch: [weight_post copy][weight_pre copy][the reduction's sums][each
   * task's block of pre_norm's dx]. The reduction sums dweight_pre as its
   * first output and dweight_post as its second (the bias slot): both are
   * converted and accumulated alike, each as rmsnorm_backward's dweight. */
  rn_entry_lock(&e);
  size_t block = rn_block_rows(d, es);
  size_t task_bytes = dh_out ? rn_align64(block * d * es) : 0;
  size_t wpre_bytes = second_weight_bytes(&e, weight_pre, d);
  rn_grad_plan plan;
  rn_split split = rn_entry_backward_split(&e, rows, rows * d * (dh_out ? 6 : 5) * es);
  if (!rn_grad_plan_init(&plan, &e.cfg, rows, RN_BACKWARD_CHUNK_ROWS, d, dweight_pre,
                         dweight_post, split))
    return rn_entry_unlock(&e, RMSNORM_ERROR_OUT_OF_MEMORY);
  char *sc = rn_entry_scratch(&e, wpre_bytes + plan.bytes + (size_t)plan.ntasks * task_bytes);
  if (!sc) return rn_entry_unlock(&e, RMSNORM_ERROR_OUT_OF_MEMORY);
  sw_bwd_job job;
  job.ks = e.kernels;
  rn_entry_backward_args(&job.pre, &e, RN_RMSNORM, d, h, ldh, dx_next, lddxn, dh, lddh);
  job.pre.w = rn_param_as_acc(&e.cfg, e.kernels, weight_pre, 1, d, sc);
  job.pre.rstd = rstd_pre;
  job.pre.stream = RN_CACHED; /* dt is read back at once */
  rn_entry_backward_args(&job.post, &e, RN_RMSNORM, d, a, lda, dh, lddh, da, ldda);
  job.post.rstd = rstd_post;
  job.post.stream = rn_stream_ok(da != a && da != dx_next, da, es, rows * d * es);
  job.dh_out = dh_out;
  job.lddh_out = lddh_out;
  job.block = block;
  job.task_bytes = task_bytes;
  job.task_scratch = sc + wpre_bytes + plan.bytes;
  rn_grad_run(ctx, &plan, sc + wpre_bytes, sw_bwd_chunk, &job);
  return rn_entry_unlock(&e, RMSNORM_OK);
}
