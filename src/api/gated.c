/* gated.c - the public entry points of gated RMSNorm, forward and backward
 * (ref/gated_ref.inc is the spec: formulas, derivation, rounding). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "api/entry.h"

/* The gate descriptor's first version ends after its last field. */
#define RN_GATE_SIZE_V1 (offsetof(rmsnorm_gate, flags) + sizeof(unsigned))

/* Reads the caller's gate (versioned by size as rmsnorm_config) and checks
 * it against d: the group 0 means the whole row. */
static rmsnorm_status read_gate(const rmsnorm_gate *user, size_t d, rmsnorm_gate *g) {
  rmsnorm_status st = rn_read_versioned(user, g, sizeof *g, RN_GATE_SIZE_V1);
  if (st != RMSNORM_OK) return st;
  if ((g->act != RMSNORM_GATE_SILU && g->act != RMSNORM_GATE_SIGMOID) ||
      (g->flags & ~(unsigned)RMSNORM_GATE_NORM_FIRST))
    return RMSNORM_ERROR_BAD_ARGUMENT;
  if (g->group == 0) g->group = d;
  if (d % g->group != 0) return RMSNORM_ERROR_BAD_SIZE;
  return RMSNORM_OK;
}

/* The config and the gate, in the order of the status codes a bad call gets. */
static rmsnorm_status begin(rn_entry *e, rmsnorm_context *ctx, const rmsnorm_config **cfg,
                            unsigned refused, const rmsnorm_gate *gate, size_t d,
                            rmsnorm_gate *g) {
  rmsnorm_status st =
      rn_entry_begin(e, ctx, cfg, RN_RMSNORM, refused | RMSNORM_FLAG_EPS_OUTSIDE, d);
  if (st != RMSNORM_OK) return st;
  if ((*cfg)->partial != 1) return RMSNORM_ERROR_BAD_PARTIAL;
  return read_gate(gate, d, g);
}

/* The kernels' arguments of the config, the gate and the inputs into *a
 * (the rest zero), in place: returned by value, the struct was copied into
 * the job in scratch memory (45 instructions a call). */
static void gated_args(rn_gated_args *a, const rn_entry *e, const rmsnorm_gate *g, size_t d,
                       const void *x, size_t ldx, const void *z, size_t ldz) {
  memset(a, 0, sizeof *a);
  a->dtype = e->cfg.dtype;
  a->d = d;
  a->group = g->group;
  a->sigmoid = g->act == RMSNORM_GATE_SIGMOID;
  a->norm_first = (g->flags & RMSNORM_GATE_NORM_FIRST) != 0;
  a->x = x, a->ldx = ldx, a->z = z, a->ldz = ldz;
  a->w = e->weight;
  a->eps = e->cfg.eps;
  a->flags = e->cfg.flags;
}

/* The gate's e^x and division make this op compute-bound: about 1 ns an
 * element forward and 2 backward on one core (AVX-512 at 4096 columns, in
 * L2), where the split's cost model counts bytes. It is given the bytes that
 * take as long: this many an element. */
#define GATED_FWD_BYTES 24
#define GATED_BWD_BYTES 48

/* ---- forward ------------------------------------------------------------ */

typedef struct gated_fwd_job {
  rn_gated_fwd_fn kernel;
  rn_gated_args args;
  size_t task_bytes;
  char *task_scratch;
} gated_fwd_job;

static void gated_fwd_rows(const void *p, size_t r0, size_t r1, int task) {
  const gated_fwd_job *job = p;
  job->kernel(&job->args, r0, r1, job->task_scratch + (size_t)task * job->task_bytes);
}

RN_FUSED_STEP rn_split gated_fwd_split(const rmsnorm_context *ctx, size_t rows, size_t d,
                                       size_t es) {
  (void)es;
  return rn_split_for(ctx, rows, rows * d * GATED_FWD_BYTES, rows);
}

/* The gate (a plan's; the one-shot call reads it first, into c->gate, and
 * passes no gate_arg), then the buffers. */
RN_FUSED_STEP rmsnorm_status gated_fwd_check(rn_entry *e, rn_fused_call *c) {
  rmsnorm_status st = c->gate_arg ? read_gate(c->gate_arg, c->d, &c->gate) : RMSNORM_OK;
  if (st != RMSNORM_OK || c->rows == 0) return st;
  if (!c->x || !c->u || !c->y) return RMSNORM_ERROR_NULL_POINTER;
  size_t rows = c->rows, d = c->d, es = e->es;
  /* y may be exactly x or z */
  rn_buffers b = {.in = {rn_inplace(rn_matrix(c->x, rows, d, c->ldx, es)),
                         rn_inplace(rn_matrix(c->u, rows, d, c->ldu, es))},
                  .out = {rn_matrix(c->y, rows, d, c->ldy, es),
                          rn_vector(c->rstd, rows * (d / c->gate.group), e->as)},
                  .weight = c->weight, .nparam = d};
  return rn_entry_check(e, &b);
}

/* [the job][each task's row scratch] */
RN_FUSED_STEP size_t gated_fwd_bytes(rn_entry *e, const rn_fused_call *c, rn_split split) {
  rn_entry_weight_direct(e, c->rows, c->d, 0);
  return rn_align64(sizeof(gated_fwd_job)) + (size_t)split.tasks * RN_GATED_SCRATCH(c->d);
}

RN_FUSED_STEP rn_rows_job gated_fwd_prepare(const rn_entry *e, const rn_fused_call *c,
                                            rn_split split, char *mem) {
  (void)split;
  size_t rows = c->rows, d = c->d, es = e->es;
  gated_fwd_job *job = (gated_fwd_job *)(void *)mem;
  job->task_bytes = RN_GATED_SCRATCH(d);
  job->task_scratch = mem + rn_align64(sizeof *job);
  job->kernel = e->kernels->gated_forward[e->cfg.dtype];
  gated_args(&job->args, e, &c->gate, d, c->x, c->ldx, c->u, c->ldu);
  job->args.w_data = e->weight_data;
  job->args.w_offset = e->cfg.flags & RMSNORM_FLAG_WEIGHT_OFFSET ? 1.0f : 0.0f;
  job->args.y = c->y;
  job->args.ldy = c->ldy;
  job->args.rstd = c->rstd;
  job->args.stream =
      rn_stream_ok(c->y != c->x && c->y != c->u, c->y, es, rows * d * es) != RN_CACHED;
  job->args.prefetch = 2 * rows * d * es >= RN_DRAM_BYTES;
  return (rn_rows_job){gated_fwd_rows, job};
}

const rn_fused_op rn_gated_forward_op = {gated_fwd_split, gated_fwd_check, gated_fwd_bytes,
                                         gated_fwd_prepare};

rmsnorm_status rmsnorm_gated_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                     const rmsnorm_gate *gate, size_t rows, size_t d,
                                     const void *x, size_t ldx, const void *z, size_t ldz,
                                     const void *weight, void *y, size_t ldy, void *rstd) {
  rn_entry e;
  rn_fused_call c;
  rmsnorm_status st = begin(&e, ctx, &cfg, RMSNORM_FLAG_ACCUMULATE, gate, d, &c.gate);
  if (st == RMSNORM_OK) st = rn_entry_matrices(&e, rows, d, RN_LDS(ldx, ldz, ldy));
  if (st != RMSNORM_OK) return st;
  rn_fused_call_init(&c, rows, d); /* the gate read: no gate_arg */
  c.x = x, c.ldx = ldx, c.u = (void *)(uintptr_t)z, c.ldu = ldz, c.y = y, c.ldy = ldy;
  c.weight = weight, c.rstd = rstd;
  return rn_fused_oneshot(&e, &rn_gated_forward_op, &c);
}

/* ---- backward ----------------------------------------------------------- */

typedef struct gated_bwd_job {
  rn_gated_bwd_fn kernel;
  rn_gated_args args;
  size_t task_bytes;
  char *task_scratch;
} gated_bwd_job;

static void gated_bwd_chunk(void *p, size_t r0, size_t r1, void *dw_part, void *db_part,
                            int task) {
  const gated_bwd_job *job = p;
  (void)db_part;
  job->kernel(&job->args, r0, r1, dw_part,
              job->task_scratch + (size_t)task * job->task_bytes);
}

rmsnorm_status rmsnorm_gated_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                      const rmsnorm_gate *gate, size_t rows, size_t d,
                                      const void *x, size_t ldx, const void *z, size_t ldz,
                                      const void *dy, size_t lddy, const void *weight,
                                      const void *rstd, void *dx, size_t lddx, void *dz,
                                      size_t lddz, void *dweight) {
  rn_entry e;
  rmsnorm_gate g;
  rmsnorm_status st = begin(&e, ctx, &cfg, 0, gate, d, &g);
  if (st == RMSNORM_OK) st = rn_entry_matrices(&e, rows, d, RN_LDS(ldx, ldz, lddy, lddx, lddz));
  if (st != RMSNORM_OK) return st;
  if (dweight && !weight) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  if (!x || !z || !dy || !dx || !dz) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = e.es;
  /* dx may be exactly x or dy; dz may be exactly z: then z is dz's bytes,
   * checked as that output (the kernel reads z_j before writing dz_j) */
  int dz_is_z = dz == z && lddz == ldz;
  rn_buffers b = {.in = {rn_inplace(rn_matrix(x, rows, d, ldx, es)),
                         rn_inplace(rn_matrix(dy, rows, d, lddy, es)),
                         dz_is_z ? (rn_span){0} : rn_matrix(z, rows, d, ldz, es),
                         rn_vector(rstd, rows * (d / g.group), e.as)},
                  .out = {rn_matrix(dx, rows, d, lddx, es), rn_matrix(dz, rows, d, lddz, es),
                          rn_vector(dweight, d, e.ps)},
                  .weight = weight, .nparam = d};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;

  /* scratch: [weight copy][the reduction's sums][each task's row scratch] */
  rn_entry_lock(&e);
  rn_grad_plan plan;
  size_t task_bytes = RN_GATED_SCRATCH(d);
  char *sums = rn_entry_grad_scratch(&e, &plan, rows, RN_BACKWARD_CHUNK_ROWS, d, dweight, NULL,
                                     rn_entry_backward_split(&e, rows, rows * d * GATED_BWD_BYTES),
                                     task_bytes);
  if (!sums) return rn_entry_unlock(&e, RMSNORM_ERROR_OUT_OF_MEMORY);
  gated_bwd_job job;
  job.kernel = e.kernels->gated_backward[cfg->dtype];
  gated_args(&job.args, &e, &g, d, x, ldx, z, ldz);
  job.args.dy = dy, job.args.lddy = lddy;
  job.args.dx = dx, job.args.lddx = lddx;
  job.args.dz = dz, job.args.lddz = lddz;
  job.args.rstd = (void *)(uintptr_t)rstd; /* read only in the backward */
  job.args.stream = rn_stream_ok(dx != x && dx != dy, dx, es, rows * d * es) != RN_CACHED &&
                    rn_stream_ok(!dz_is_z, dz, es, rows * d * es) != RN_CACHED;
  job.args.prefetch = 3 * rows * d * es >= RN_DRAM_BYTES;
  job.task_bytes = task_bytes;
  job.task_scratch = sums + plan.bytes;
  rn_grad_run(ctx, &plan, sums, gated_bwd_chunk, &job);
  return rn_entry_unlock(&e, RMSNORM_OK);
}
