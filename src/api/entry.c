/* entry.c - the steps of the entry skeleton (entry.h): config and size
 * checks, the overlap rule over a call's buffers by role, the lock, scratch
 * with the parameters in the compute type, and the kernels' common arguments. */
#include "api/entry.h"

#include <assert.h>

#include "numerics/dtype.h"
#include "numerics/rowmath.h"

void rn_entry_set(rn_entry *e, rmsnorm_context *ctx) {
  e->ctx = ctx;
  e->es = rn_dtype_size(e->cfg.dtype);
  e->ps = rn_dtype_size(e->cfg.param_dtype);
  e->as = rn_acc_size(e->cfg.dtype);
  e->weight = e->bias = NULL;
  e->nparam = e->wcopy = e->bcopy = 0;
  e->kernels = NULL;
  e->weight_direct = 0;
  e->weight_data = NULL;
}

static rmsnorm_status entry_config(rn_entry *e, const rmsnorm_config **cfgp, rn_norm norm,
                                   unsigned refused, unsigned own) {
  rmsnorm_status st = rn_check_config_own(*cfgp, &e->cfg, norm, refused, own);
  if (st != RMSNORM_OK) return st;
  *cfgp = &e->cfg;
  rn_entry_set(e, NULL);
  return RMSNORM_OK;
}

rmsnorm_status rn_entry_config(rn_entry *e, const rmsnorm_config **cfgp, rn_norm norm,
                               unsigned refused) {
  return entry_config(e, cfgp, norm, refused, 0);
}

rmsnorm_status rn_entry_begin_own(rn_entry *e, rmsnorm_context *ctx,
                                  const rmsnorm_config **cfgp, rn_norm norm, unsigned refused,
                                  unsigned own, size_t d) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  rmsnorm_status st = entry_config(e, cfgp, norm, refused, own);
  if (st != RMSNORM_OK) return st;
  e->ctx = ctx;
  return d == 0 ? RMSNORM_ERROR_BAD_SIZE : RMSNORM_OK;
}

rmsnorm_status rn_entry_begin(rn_entry *e, rmsnorm_context *ctx, const rmsnorm_config **cfgp,
                              rn_norm norm, unsigned refused, size_t d) {
  return rn_entry_begin_own(e, ctx, cfgp, norm, refused, 0, d);
}

rmsnorm_status rn_entry_matrices(const rn_entry *e, size_t rows, size_t d, const size_t *lds,
                                 size_t n) {
  rmsnorm_status st = RMSNORM_OK;
  for (size_t i = 0; i < n && st == RMSNORM_OK; i++) st = rn_check_matrix(rows, d, lds[i], e->es);
  return st;
}

#define NONE ((size_t)-1)

/* Whether every written buffer's extent is apart from every other buffer's:
 * then nothing can overlap, whatever the strides. The common case, decided
 * from the extents alone (a decode-sized call spends a good part of its
 * fixed cost here otherwise). An in-place input that is exactly out[0]'s
 * rows (the view rn_check_overlaps allows) is left out of the test against
 * out[0] alone: in-place calls take this path too. */
static int extents_apart(const rn_buffers *b, size_t ps) {
  uintptr_t lo[RN_BUFFERS_IN + 2 + RN_BUFFERS_OUT], hi[RN_BUFFERS_IN + 2 + RN_BUFFERS_OUT];
  int same0[RN_BUFFERS_IN + 2 + RN_BUFFERS_OUT]; /* out[0]'s exact in-place view */
  size_t n = 0; /* the outputs first, then the inputs */
  for (size_t i = 0; i < RN_BUFFERS_OUT; i++)
    if (b->out[i].p) same0[n] = 0, lo[n] = b->out[i].lo, hi[n++] = b->out[i].hi;
  size_t nout = n;
  for (size_t i = 0; i < RN_BUFFERS_IN; i++)
    if (b->in[i].p) {
      same0[n] = b->in[i].inplace && b->out[0].p && rn_spans_same(&b->in[i], &b->out[0]);
      lo[n] = b->in[i].lo, hi[n++] = b->in[i].hi;
    }
  const void *param[2] = {b->weight, b->bias};
  for (size_t i = 0; i < 2; i++)
    if (b->nparam && param[i])
      same0[n] = 0, lo[n] = (uintptr_t)param[i], hi[n] = lo[n] + b->nparam * ps, n++;
  for (size_t i = 0; i < nout; i++)
    for (size_t j = i + 1; j < n; j++)
      if (lo[i] < hi[j] && lo[j] < hi[i] && !(i == 0 && b->out[0].p && same0[j])) return 0;
  return 1;
}

rmsnorm_status rn_check_buffers(const rn_buffers *b, size_t ps) {
  if (extents_apart(b, ps)) return RMSNORM_OK;
  /* laid out for rn_check_overlaps: out[0] first, the inputs and parameters,
   * the other outputs; the marked inputs are out[0]'s in-place views */
  rn_span s[RN_BUFFERS_IN + 2 + RN_BUFFERS_OUT];
  size_t n = 0, inplace[2] = {NONE, NONE}, ninplace = 0;
  s[n++] = rn_with_role(b->out[0], 1);
  for (size_t i = 0; i < RN_BUFFERS_IN; i++) {
    if (b->in[i].inplace && b->in[i].p) {
      assert(ninplace < 2);
      inplace[ninplace++] = n;
    }
    s[n++] = rn_with_role(b->in[i], 0);
  }
  /* parameters of no elements (a shard of width 0) are no buffer */
  s[n++] = rn_vector_span(b->nparam ? b->weight : NULL, b->nparam, ps, 0);
  s[n++] = rn_vector_span(b->nparam ? b->bias : NULL, b->nparam, ps, 0);
  for (size_t i = 1; i < RN_BUFFERS_OUT; i++) s[n++] = rn_with_role(b->out[i], 1);
  return rn_check_overlaps(s, n, 0, inplace[0], inplace[1]);
}

rmsnorm_status rn_entry_check(rn_entry *e, const rn_buffers *b) {
  rmsnorm_status st = rn_check_buffers(b, e->ps);
  if (st != RMSNORM_OK) return st;

  e->weight = b->weight;
  e->bias = b->bias;
  e->nparam = b->nparam;
  e->wcopy = rn_param_needs_copy(&e->cfg, b->weight, 1) ? rn_align64(b->nparam * e->as) : 0;
  e->bcopy = rn_param_needs_copy(&e->cfg, b->bias, 0) ? rn_align64(b->nparam * e->as) : 0;
  return RMSNORM_OK;
}

void rn_entry_lock(rn_entry *e) {
  rn_context_lock(e->ctx);
  e->kernels = rn_context_kernels(e->ctx);
}

void rn_entry_weight_direct(rn_entry *e, size_t rows, size_t d, int f32) {
  rmsnorm_dtype dt = e->cfg.dtype;
  /* an fp32 weight is used as it is unless 1 + g needs the copy */
  int kind = dt == RMSNORM_F16 || dt == RMSNORM_BF16 ||
             (f32 && dt == RMSNORM_F32 && (e->cfg.flags & RMSNORM_FLAG_WEIGHT_OFFSET));
  e->weight_direct = kind && e->cfg.param_dtype == dt && e->weight && !e->bias &&
                     ((uintptr_t)e->weight & (e->ps - 1)) == 0 && rows <= RN_DIRECT_WEIGHT_ROWS &&
                     rows * d * e->es <= RN_DIRECT_WEIGHT_BYTES;
}

/* The weight read in place where rn_entry_weight_direct chose it and
 * e->kernels can: no copy to make. */
static void take_weight_direct(rn_entry *e) {
  if (e->weight_direct && e->kernels->weight_in_data) {
    e->weight_data = e->weight;
    e->weight = NULL;
    e->wcopy = 0;
  }
}

int rn_entry_unlocked(rn_entry *e, int one_task) {
  if (!one_task || e->bcopy || (e->wcopy && !e->weight_direct)) return 0;
  const rn_kernel_set *k = rn_context_kernels(e->ctx);
  if (e->wcopy && !(e->weight_direct && k->weight_in_data)) return 0;
  e->kernels = k;
  take_weight_direct(e);
  return 1;
}

size_t rn_entry_params_bytes(rn_entry *e) {
  take_weight_direct(e);
  return e->wcopy + e->bcopy;
}

char *rn_entry_params_into(rn_entry *e, char *s) {
  e->weight = rn_param_as_acc(&e->cfg, e->kernels, e->weight, 1, e->nparam, s);
  e->bias = rn_param_as_acc(&e->cfg, e->kernels, e->bias, 0, e->nparam, s + e->wcopy);
  return s + e->wcopy + e->bcopy;
}

char *rn_entry_scratch(rn_entry *e, size_t bytes) {
  char *s = rn_context_scratch(e->ctx, rn_entry_params_bytes(e) + bytes);
  return s ? rn_entry_params_into(e, s) : NULL;
}

rmsnorm_status rn_entry_lock_params(rn_entry *e) {
  rn_entry_lock(e);
  if (!rn_entry_scratch(e, 0)) return rn_entry_unlock(e, RMSNORM_ERROR_OUT_OF_MEMORY);
  return RMSNORM_OK;
}

rn_split rn_entry_backward_split(const rn_entry *e, size_t rows, size_t bytes) {
  size_t nchunks = (rows + RN_BACKWARD_CHUNK_ROWS - 1) / RN_BACKWARD_CHUNK_ROWS;
  return rn_split_for(e->ctx, rows, bytes, nchunks);
}

char *rn_entry_grad_scratch(rn_entry *e, rn_grad_plan *plan, size_t units, size_t chunk_units,
                            size_t d, void *dweight, void *dbias, rn_split split,
                            size_t task_bytes) {
  if (!rn_grad_plan_init(plan, &e->cfg, units, chunk_units, d, dweight, dbias, split))
    return NULL;
  plan->kernels = e->kernels;
  return rn_entry_scratch(e, plan->bytes + (size_t)plan->ntasks * task_bytes);
}

rmsnorm_status rn_entry_unlock(rn_entry *e, rmsnorm_status st) {
  rn_context_unlock(e->ctx);
  return st;
}

/* LayerNorm's statistics take the whole row; RMSNorm's the config's part. */
static size_t stat_columns(const rn_entry *e, rn_norm norm, size_t d) {
  return norm == RN_LAYERNORM ? d : rn_partial_k(e->cfg.partial, d);
}

rn_forward_args rn_entry_forward_args(const rn_entry *e, rn_norm norm, size_t d,
                                      const void *x, size_t ldx, void *y, size_t ldy) {
  rn_forward_args a = {.norm = norm, .dtype = e->cfg.dtype, .d = d, .k = stat_columns(e, norm, d),
                       .x = x, .ldx = ldx, .y = y, .ldy = ldy, .w = e->weight, .b = e->bias,
                       .w_data = e->weight_data, .eps = e->cfg.eps, .flags = e->cfg.flags};
  a.w_offset = e->cfg.flags & RMSNORM_FLAG_WEIGHT_OFFSET ? 1.0f : 0.0f;
  return a;
}

void rn_entry_backward_args(rn_backward_args *a, const rn_entry *e, rn_norm norm, size_t d,
                            const void *x, size_t ldx, const void *dy, size_t lddy, void *dx,
                            size_t lddx) {
  /* every field, one by one: GCC zeroes a struct this size with rep stos */
  a->norm = norm, a->dtype = e->cfg.dtype, a->d = d, a->k = stat_columns(e, norm, d);
  a->x = x, a->ldx = ldx, a->dy = dy, a->lddy = lddy, a->dx = dx, a->lddx = lddx;
  a->w = e->weight, a->eps = e->cfg.eps, a->flags = e->cfg.flags;
  a->mean = a->rstd = NULL, a->stream = RN_CACHED, a->past_l3 = 0, a->parts_fresh = 0;
  a->w_data = e->weight_data, a->dw_data = NULL;
  a->w_offset = e->cfg.flags & RMSNORM_FLAG_WEIGHT_OFFSET ? 1.0f : 0.0f;
}
