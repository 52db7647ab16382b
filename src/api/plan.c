/* plan.c - plans (rmsnorm.h, "Plans"): a forward, add + forward, backward,
 * sandwich, gated or quantized forward call checked and prepared once
 * (create, reshape, setup), then run many times through the one-shot calls'
 * own run functions (entry.h), so the bits are theirs. What a run skips:
 * the config and size checks, the overlap rule, the weight conversion, the
 * thread decision, the backward's reduction plan and, when the work stays on
 * the caller's thread, the context's lock (the scratch being the plan's own). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/entry.h"
#include "numerics/dtype.h"

struct rmsnorm_plan {
  rmsnorm_context *ctx;
  rmsnorm_config cfg; /* the caller's, read and checked at create */
  rmsnorm_plan_op op;
  rn_norm norm;
  /* reshape */
  int shaped;
  size_t rows, d, ldx, ldu, ldy;
  const rn_kernel_set *kernels; /* the context's at reshape */
  rn_split split;               /* the thread decision at reshape */
  rn_split cols;                /* the backward's column split of long rows (tasks 0: none) */
  int direct;                   /* one task on the caller's thread: no lock, no pool */
  /* setup */
  int ready;
  char *params;        /* weight and bias in the compute type, when converted;
                          the backward's reduction scratch after them */
  size_t params_bytes; /* params' allocation */
  rn_forward_args fwd;    /* forward plans */
  rn_add_forward_job add; /* add plans */
  rn_backward_job bwd;    /* backward plans: */
  rn_grad_plan grad;      /*   their reduction */
  char *sums;             /*   and its scratch, in params */
  int one_call;           /*   direct, and all of it one kernel call on these partials */
  void *dw_part, *db_part;
  const rn_fused_op *fused; /* sandwich, quantized and gated plans: the op's table, */
  rn_rows_job job;          /*   and its job (in params) */
};

static int op_backward(rmsnorm_plan_op op) {
  return op == RMSNORM_PLAN_BACKWARD || op == RMSNORM_PLAN_LAYERNORM_BACKWARD;
}

/* The fused forwards' tables (entry.h), NULL for the other ops. */
static const rn_fused_op *op_fused(rmsnorm_plan_op op) {
  switch (op) {
  case RMSNORM_PLAN_SANDWICH_FORWARD: return &rn_sandwich_forward_op;
  case RMSNORM_PLAN_FORWARD_QUANTIZED: return &rn_quantized_op;
  case RMSNORM_PLAN_ADD_FORWARD_QUANTIZED: return &rn_add_quantized_op;
  case RMSNORM_PLAN_GATED_FORWARD: return &rn_gated_forward_op;
  default: return NULL;
  }
}

/* The quantized plans: their codes are not rows x d of the dtype, so their
 * stride comes with the format, at setup (reshape's ldy is 0). */
static int op_quantized(rmsnorm_plan_op op) {
  return op == RMSNORM_PLAN_FORWARD_QUANTIZED || op == RMSNORM_PLAN_ADD_FORWARD_QUANTIZED;
}

/* Whether the op reads a second input of rows x d (reshape's ldu). */
static int op_second_input(rmsnorm_plan_op op) {
  return op != RMSNORM_PLAN_FORWARD && op != RMSNORM_PLAN_LAYERNORM_FORWARD &&
         op != RMSNORM_PLAN_FORWARD_QUANTIZED;
}

/* The flags the op's one-shot call refuses, and its norm. */
static int op_known(rmsnorm_plan_op op, rn_norm *norm, unsigned *refused) {
  switch (op) {
  case RMSNORM_PLAN_FORWARD: *norm = RN_RMSNORM, *refused = 0; return 1;
  case RMSNORM_PLAN_LAYERNORM_FORWARD: *norm = RN_LAYERNORM, *refused = 0; return 1;
  case RMSNORM_PLAN_ADD_FORWARD: *norm = RN_RMSNORM, *refused = RMSNORM_FLAG_ACCUMULATE; return 1;
  case RMSNORM_PLAN_BACKWARD: *norm = RN_RMSNORM, *refused = 0; return 1;
  case RMSNORM_PLAN_LAYERNORM_BACKWARD: *norm = RN_LAYERNORM, *refused = 0; return 1;
  case RMSNORM_PLAN_SANDWICH_FORWARD:
  case RMSNORM_PLAN_FORWARD_QUANTIZED:
  case RMSNORM_PLAN_ADD_FORWARD_QUANTIZED:
    *norm = RN_RMSNORM, *refused = RMSNORM_FLAG_ACCUMULATE;
    return 1;
  case RMSNORM_PLAN_GATED_FORWARD: /* as rmsnorm_gated_forward: eps inside, whole rows */
    *norm = RN_RMSNORM, *refused = RMSNORM_FLAG_ACCUMULATE | RMSNORM_FLAG_EPS_OUTSIDE;
    return 1;
  }
  return 0;
}

/* An entry (entry.h) over the plan's checked config, for the shared steps. */
static rn_entry plan_entry(const rmsnorm_plan *p) {
  rn_entry e;
  e.cfg = p->cfg;
  rn_entry_set(&e, p->ctx);
  e.kernels = p->kernels;
  return e;
}

rmsnorm_status rmsnorm_plan_create(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                   rmsnorm_plan_op op, rmsnorm_plan **plan) {
  if (!plan) return RMSNORM_ERROR_NULL_POINTER;
  *plan = NULL;
  rn_norm norm;
  unsigned refused;
  rn_entry e;
  if (!op_known(op, &norm, &refused)) return RMSNORM_ERROR_BAD_ARGUMENT;
  rmsnorm_status st = rn_entry_begin(&e, ctx, &cfg, norm, refused, 1);
  if (st != RMSNORM_OK) return st;
  if (op == RMSNORM_PLAN_GATED_FORWARD && e.cfg.partial != 1) return RMSNORM_ERROR_BAD_PARTIAL;
  rmsnorm_plan *p = calloc(1, sizeof *p);
  if (!p) return RMSNORM_ERROR_OUT_OF_MEMORY;
  p->ctx = ctx;
  p->cfg = e.cfg;
  p->op = op;
  p->norm = norm;
  p->fused = op_fused(op);
  *plan = p;
  return RMSNORM_OK;
}

rmsnorm_status rmsnorm_plan_reshape(rmsnorm_plan *p, size_t rows, size_t d, size_t ldx,
                                    size_t ldu, size_t ldy) {
  if (!p) return RMSNORM_ERROR_NULL_POINTER;
  p->shaped = p->ready = 0;
  if (d == 0) return RMSNORM_ERROR_BAD_SIZE;
  int add = p->op == RMSNORM_PLAN_ADD_FORWARD, second = op_second_input(p->op);
  int quantized = op_quantized(p->op);
  if ((!second && ldu != 0) || (quantized && ldy != 0)) return RMSNORM_ERROR_BAD_ARGUMENT;
  rn_entry e = plan_entry(p);
  rmsnorm_status st;
  if (quantized)
    st = second ? rn_entry_matrices(&e, rows, d, RN_LDS(ldx, ldu))
                : rn_entry_matrices(&e, rows, d, RN_LDS(ldx));
  else
    st = second ? rn_entry_matrices(&e, rows, d, RN_LDS(ldx, ldu, ldy))
                : rn_entry_matrices(&e, rows, d, RN_LDS(ldx, ldy));
  if (st != RMSNORM_OK) return st;
  p->rows = rows, p->d = d, p->ldx = ldx, p->ldu = ldu, p->ldy = ldy;
  rn_context_lock(p->ctx);
  p->kernels = e.kernels = rn_context_kernels(p->ctx);
  if (p->fused) {
    p->split = p->fused->split(p->ctx, rows, d, e.es);
    p->direct = p->split.tasks == 1;
  } else if (op_backward(p->op)) {
    p->split = rn_backward_split(&e, rows, d, &p->cols);
    p->direct = 0; /* decided at setup, with the reduction */
  } else if (add) {
    p->split = rn_add_forward_split(p->ctx, rows, d, e.es);
    p->direct = p->split.tasks == 1;
  } else {
    p->split = rn_forward_split(p->ctx, rows, d, e.es);
    p->direct = rn_forward_direct(p->ctx, p->split, rows, d, e.es);
  }
  rn_context_unlock(p->ctx);
  p->shaped = 1;
  return RMSNORM_OK;
}

/* Weight and bias in the compute type (the caller's, or copies in the plan's
 * own memory), and `more` bytes of the plan's after them at *rest. e: after
 * rn_entry_check. */
static rmsnorm_status plan_params(rmsnorm_plan *p, rn_entry *e, size_t more, char **rest) {
  size_t bytes = rn_entry_params_bytes(e) + more;
  if (bytes > p->params_bytes || !p->params) { /* never NULL: the pointers below need one */
    char *q = aligned_alloc(64, bytes ? rn_align64(bytes) : 64);
    if (!q) return RMSNORM_ERROR_OUT_OF_MEMORY;
    free(p->params);
    p->params = q;
    p->params_bytes = bytes;
  }
  char *r = rn_entry_params_into(e, p->params);
  if (rest) *rest = r;
  return RMSNORM_OK;
}

/* The checks of the one-shot call on b, then its parameters (plan_params). */
static rmsnorm_status plan_check_params(rmsnorm_plan *p, rn_entry *e, const rn_buffers *b) {
  rmsnorm_status st = rn_entry_check(e, b);
  return st != RMSNORM_OK ? st : plan_params(p, e, 0, NULL);
}

rmsnorm_status rmsnorm_plan_setup_forward(rmsnorm_plan *p, const void *x, const void *weight,
                                          const void *bias, void *y, void *mean, void *rstd) {
  if (!p) return RMSNORM_ERROR_NULL_POINTER;
  p->ready = 0;
  if (!p->shaped || (p->op != RMSNORM_PLAN_FORWARD && p->op != RMSNORM_PLAN_LAYERNORM_FORWARD) ||
      (p->norm == RN_RMSNORM && mean))
    return RMSNORM_ERROR_BAD_ARGUMENT;
  size_t rows = p->rows, d = p->d;
  if (rows == 0) return p->ready = 1, RMSNORM_OK;
  if (!x || !y) return RMSNORM_ERROR_NULL_POINTER;
  rn_entry e = plan_entry(p);
  size_t es = e.es;
  rn_buffers b = {.in = {rn_inplace(rn_matrix(x, rows, d, p->ldx, es))},
                  .out = {rn_matrix(y, rows, d, p->ldy, es), rn_vector(mean, rows, e.as),
                          rn_vector(rstd, rows, e.as)},
                  .weight = weight, .bias = bias, .nparam = d};
  rmsnorm_status st = plan_check_params(p, &e, &b);
  if (st != RMSNORM_OK) return st;
  p->fwd = rn_entry_forward_args(&e, p->norm, d, x, p->ldx, y, p->ldy);
  p->fwd.mean = mean;
  p->fwd.rstd = rstd;
  rn_forward_stream(&p->fwd, rows);
  p->ready = 1;
  return RMSNORM_OK;
}

rmsnorm_status rmsnorm_plan_setup_add(rmsnorm_plan *p, void *h, const void *u,
                                      const void *weight, const void *bias, void *y,
                                      void *rstd) {
  if (!p) return RMSNORM_ERROR_NULL_POINTER;
  p->ready = 0;
  if (!p->shaped || p->op != RMSNORM_PLAN_ADD_FORWARD) return RMSNORM_ERROR_BAD_ARGUMENT;
  size_t rows = p->rows, d = p->d;
  if (rows == 0) return p->ready = 1, RMSNORM_OK;
  if (!h || !u || !y) return RMSNORM_ERROR_NULL_POINTER;
  rn_entry e = plan_entry(p);
  size_t es = e.es;
  /* as rmsnorm_add_forward: h is an output; y may be exactly u */
  rn_buffers b = {.in = {rn_inplace(rn_matrix(u, rows, d, p->ldu, es))},
                  .out = {rn_matrix(y, rows, d, p->ldy, es), rn_matrix(h, rows, d, p->ldx, es),
                          rn_vector(rstd, rows, e.as)},
                  .weight = weight, .bias = bias, .nparam = d};
  rmsnorm_status st = plan_check_params(p, &e, &b);
  if (st != RMSNORM_OK) return st;
  rn_add_forward_job *job = &p->add;
  job->ks = p->kernels;
  job->add = (rn_add_args){p->cfg.dtype, d, h, p->ldx, u, p->ldu, h, p->ldx};
  job->fwd = rn_entry_forward_args(&e, RN_RMSNORM, d, h, p->ldx, y, p->ldy);
  job->fwd.rstd = rstd;
  rn_add_forward_prepare(job, rows);
  p->ready = 1;
  return RMSNORM_OK;
}

rmsnorm_status rmsnorm_plan_setup_backward(rmsnorm_plan *p, const void *x, const void *dy,
                                           const void *weight, const void *mean,
                                           const void *rstd, void *dx, void *dweight,
                                           void *dbias) {
  if (!p) return RMSNORM_ERROR_NULL_POINTER;
  p->ready = 0;
  if (!p->shaped || !op_backward(p->op) || (p->norm == RN_RMSNORM && mean) ||
      (dweight && !weight))
    return RMSNORM_ERROR_BAD_ARGUMENT;
  size_t rows = p->rows, d = p->d;
  if (rows == 0) return p->ready = 1, RMSNORM_OK;
  if (!x || !dy || !dx) return RMSNORM_ERROR_NULL_POINTER;
  rn_entry e = plan_entry(p);
  size_t es = e.es;
  rn_buffers b;
  rn_buffers_empty(&b);
  b.in[0] = rn_inplace(rn_matrix(x, rows, d, p->ldx, es));
  b.in[1] = rn_inplace(rn_matrix(dy, rows, d, p->ldu, es));
  b.in[2] = rn_vector(mean, rows, e.as);
  b.in[3] = rn_vector(rstd, rows, e.as);
  b.out[0] = rn_matrix(dx, rows, d, p->ldy, es);
  b.out[1] = rn_vector(dweight, d, e.ps);
  b.out[2] = rn_vector(dbias, d, e.ps);
  b.weight = weight, b.nparam = d;
  rmsnorm_status st = rn_entry_check(&e, &b);
  if (st != RMSNORM_OK) return st;
  rn_backward_weight(&e, p->norm, rows, d, p->cols, dbias);
  rn_grad_plan *g = &p->grad;
  if (!rn_grad_plan_init(g, &p->cfg, rows, RN_BACKWARD_CHUNK_ROWS, d, dweight, dbias, p->split))
    return RMSNORM_ERROR_OUT_OF_MEMORY;
  g->kernels = p->kernels;
  rn_context_lock(p->ctx);
  g->reduce = rn_grad_reduce_split(p->ctx, g);
  rn_context_unlock(p->ctx);
  if ((st = plan_params(p, &e, g->bytes, &p->sums)) != RMSNORM_OK) return st;
  rn_backward_prepare(&p->bwd, g, &e, p->norm, rows, d, x, p->ldx, dy, p->ldu, mean, rstd, dx,
                      p->ldy, dweight, p->cols);
  /* the caller's thread alone, chunks and reduction: no lock, no pool */
  p->direct = !p->cols.tasks && g->split.threads == 1 && g->reduce.threads == 1;
  p->one_call = p->direct && rn_grad_one_call(g, p->sums, &p->dw_part, &p->db_part);
  p->ready = 1;
  return RMSNORM_OK;
}

/* A fused forward's setup: c holds the buffers (and the quantized plans'
 * codes stride); the rest comes from reshape. The op's checks, its memory
 * in the plan's, its job. */
static rmsnorm_status setup_fused(rmsnorm_plan *p, rmsnorm_plan_op op, rn_fused_call *c) {
  if (!p) return RMSNORM_ERROR_NULL_POINTER;
  p->ready = 0;
  if (!p->shaped || p->op != op) return RMSNORM_ERROR_BAD_ARGUMENT;
  rn_entry e = plan_entry(p);
  c->rows = p->rows, c->d = p->d, c->ldx = p->ldx, c->ldu = p->ldu;
  if (!op_quantized(op)) c->ldy = p->ldy;
  rmsnorm_status st = p->fused->check(&e, c);
  if (st != RMSNORM_OK) return st;
  if (p->rows == 0) return p->ready = 1, RMSNORM_OK;
  char *mem;
  if ((st = plan_params(p, &e, p->fused->bytes(&e, c, p->split), &mem)) != RMSNORM_OK)
    return st;
  p->job = p->fused->prepare(&e, c, p->split, mem);
  p->ready = 1;
  return RMSNORM_OK;
}

rmsnorm_status rmsnorm_plan_setup_sandwich(rmsnorm_plan *p, const void *a, void *h,
                                           const void *weight_post, const void *weight_pre,
                                           void *x_next, void *rstd_post, void *rstd_pre) {
  rn_fused_call c;
  rn_fused_call_init(&c, 0, 0);
  c.x = a, c.u = h, c.y = x_next, c.weight = weight_post, c.weight_pre = weight_pre;
  c.rstd = rstd_post, c.rstd_pre = rstd_pre;
  return setup_fused(p, RMSNORM_PLAN_SANDWICH_FORWARD, &c);
}

rmsnorm_status rmsnorm_plan_setup_quantized(rmsnorm_plan *p, const void *x, const void *weight,
                                            const void *bias, const rmsnorm_quant *q,
                                            void *codes, size_t ldc, void *scales, size_t lds,
                                            void *rstd) {
  rn_fused_call c;
  rn_fused_call_init(&c, 0, 0);
  c.x = x, c.y = codes, c.ldy = ldc, c.scales = scales, c.lds = lds, c.quant_arg = q;
  c.weight = weight, c.bias = bias, c.rstd = rstd;
  return setup_fused(p, RMSNORM_PLAN_FORWARD_QUANTIZED, &c);
}

rmsnorm_status rmsnorm_plan_setup_add_quantized(rmsnorm_plan *p, void *h, const void *u,
                                                const void *weight, const void *bias,
                                                const rmsnorm_quant *q, void *codes, size_t ldc,
                                                void *scales, size_t lds, void *rstd) {
  rn_fused_call c;
  rn_fused_call_init(&c, 0, 0);
  c.x = h, c.u = (void *)(uintptr_t)u, c.y = codes, c.ldy = ldc, c.scales = scales, c.lds = lds;
  c.quant_arg = q, c.weight = weight, c.bias = bias, c.rstd = rstd;
  return setup_fused(p, RMSNORM_PLAN_ADD_FORWARD_QUANTIZED, &c);
}

rmsnorm_status rmsnorm_plan_setup_gated(rmsnorm_plan *p, const rmsnorm_gate *gate,
                                        const void *x, const void *z, const void *weight,
                                        void *y, void *rstd) {
  if (!gate) { /* the op reads gate_arg where one is given */
    if (p) p->ready = 0;
    return RMSNORM_ERROR_NULL_POINTER;
  }
  rn_fused_call c;
  rn_fused_call_init(&c, 0, 0);
  c.x = x, c.u = (void *)(uintptr_t)z, c.y = y, c.weight = weight, c.rstd = rstd;
  c.gate_arg = gate;
  return setup_fused(p, RMSNORM_PLAN_GATED_FORWARD, &c);
}

rmsnorm_status rmsnorm_plan_run(rmsnorm_plan *p) {
  if (!p) return RMSNORM_ERROR_NULL_POINTER;
  if (!p->ready) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (p->rows == 0) return RMSNORM_OK;
  int add = p->op == RMSNORM_PLAN_ADD_FORWARD;
  if (p->fused) {
    if (p->direct) { /* the caller's thread alone, on the plan's memory */
      p->job.fn(p->job.arg, 0, p->rows, 0);
    } else {
      rn_context_lock(p->ctx);
      rn_run_rows(p->ctx, p->split, p->rows, p->job.fn, p->job.arg);
      rn_context_unlock(p->ctx);
    }
    return RMSNORM_OK;
  }
  if (op_backward(p->op)) {
    const rn_backward_args *a = &p->bwd.args;
    if (p->one_call) { /* what rn_backward_run would call, with nothing around it */
      p->kernels->backward[a->dtype](a, 0, p->rows, p->dw_part, p->db_part);
    } else if (p->direct) {
      rn_backward_run(&p->grad, p->sums, &p->bwd);
    } else {
      rn_context_lock(p->ctx);
      rn_backward_run(&p->grad, p->sums, &p->bwd);
      rn_context_unlock(p->ctx);
    }
    return RMSNORM_OK;
  }
  if (p->direct) { /* the caller's thread alone: nothing of the context is used */
    if (add)
      rn_add_forward_run(p->ctx, &p->add, p->rows, p->split);
    else
      p->kernels->forward[p->fwd.dtype](&p->fwd, 0, p->rows);
    return RMSNORM_OK;
  }
  rn_context_lock(p->ctx);
  if (add)
    rn_add_forward_run(p->ctx, &p->add, p->rows, p->split);
  else
    rn_forward_run(p->ctx, p->kernels, &p->fwd, p->rows, p->split);
  rn_context_unlock(p->ctx);
  return RMSNORM_OK;
}

void rmsnorm_plan_free(rmsnorm_plan *p) {
  if (!p) return;
  free(p->params);
  free(p);
}
