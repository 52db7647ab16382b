/* quant.c - the public entry points of RMSNorm with a quantized output: per
 * row int8 / fp8 e4m3 (a static scale or one per row), and the block and
 * per-group formats of rmsnorm_qformat, alone or after the residual add;
 * and the format's row layout (qlayout.h). The
 * kernels compute the norm in the compute type and round once to the 8-bit
 * type (ref/fused_ref.inc), or hand the row's y, rounded to float, to the
 * format's encoder (ref/blocks_ref.c is the spec of each). */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "api/entry.h"
#include "api/qlayout.h"
#include "numerics/blocks.h"
#include "numerics/dtype.h"
#include "numerics/rowmath.h"

/* ---- the descriptor ------------------------------------------------------ */

#define RN_QUANT_SIZE_V1 (offsetof(rmsnorm_quant, static_scale) + sizeof(const float *))

/* The caller's descriptor into *out, as rn_read_config reads a config: a
 * smaller (older) one gets defaults, a larger one only zeros past ours. */
static rmsnorm_status read_quant(const rmsnorm_quant *q, rmsnorm_quant *out) {
  return rn_read_versioned(q, out, sizeof *out, RN_QUANT_SIZE_V1);
}

#define RN_QUANT_FLAGS ((unsigned)(RMSNORM_QUANT_SCALE_POW2 | RMSNORM_QUANT_SCALE_E8M0))

static rmsnorm_status layout_of(const rmsnorm_quant *q, size_t d, rn_qlayout *l) {
  size_t block = 0, bytes = 0;
  *l = (rn_qlayout){0, 0, 1};
  int scalar_codes = q->format == RMSNORM_QF_INT8 || q->format == RMSNORM_QF_FP8_E4M3;
  if (q->flags & ~RN_QUANT_FLAGS) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (!scalar_codes && (q->group || q->flags || q->static_scale)) return RMSNORM_ERROR_BAD_ARGUMENT;
  switch (q->format) {
    case RMSNORM_QF_INT8:
    case RMSNORM_QF_FP8_E4M3:
      if (q->group % RN_MX_BLOCK != 0) return RMSNORM_ERROR_BAD_ARGUMENT;
      /* a static scale is the caller's float: no rounding, no E8M0 byte */
      if (q->static_scale && (q->group || q->flags)) return RMSNORM_ERROR_BAD_ARGUMENT;
      block = q->group ? q->group : d;
      bytes = block;
      *l = (rn_qlayout){0, q->static_scale ? 0 : 1,
                        q->flags & RMSNORM_QUANT_SCALE_E8M0 ? 1 : sizeof(float)};
      break;
    case RMSNORM_QF_Q8_0: block = RN_Q8_0_BLOCK, bytes = RN_Q8_0_BYTES; break;
    case RMSNORM_QF_Q8_1: block = RN_Q8_1_BLOCK, bytes = RN_Q8_1_BYTES; break;
    case RMSNORM_QF_Q8_K: block = RN_Q8_K_BLOCK, bytes = RN_Q8_K_BYTES; break;
    case RMSNORM_QF_MXFP8_E4M3: block = RN_MX_BLOCK, bytes = RN_MX_BLOCK; break;
    case RMSNORM_QF_MXFP4: block = RN_MX_BLOCK, bytes = RN_MXFP4_BYTES; break;
    default: return RMSNORM_ERROR_BAD_ARGUMENT;
  }
  if (d == 0 || d % block != 0) return RMSNORM_ERROR_BAD_SIZE;
  if (d / block > SIZE_MAX / bytes) return RMSNORM_ERROR_BAD_SIZE;
  l->row_bytes = d / block * bytes;
  if (!scalar_codes)
    *l = (rn_qlayout){l->row_bytes, q->format == RMSNORM_QF_MXFP8_E4M3 ? d / RN_MX_BLOCK : 0, 1};
  else if (q->group)
    l->row_scales = d / q->group;
  return RMSNORM_OK;
}

rmsnorm_status rn_qlayout_read(const rmsnorm_quant *q, size_t d, rmsnorm_quant *out,
                               rn_qlayout *l) {
  rmsnorm_status st = read_quant(q, out);
  return st != RMSNORM_OK ? st : layout_of(out, d, l);
}

rmsnorm_status rmsnorm_quant_row_size(const rmsnorm_quant *q, size_t d, size_t *row_bytes,
                                      size_t *row_scales) {
  rmsnorm_quant desc;
  rn_qlayout l;
  rmsnorm_status st = rn_qlayout_read(q, d, &desc, &l);
  if (st != RMSNORM_OK) return st;
  if (row_bytes) *row_bytes = l.row_bytes;
  if (row_scales) *row_scales = l.row_scales;
  return RMSNORM_OK;
}

/* ---- the run ------------------------------------------------------------- */

typedef struct quant_job {
  rn_quant_fn kernel;
  rn_quant_args args;
  rn_add_fn add_kernel; /* NULL: no residual add */
  rn_add_args add;
  size_t block, task_bytes;
  char *task_scratch;
} quant_job;

static void quant_rows(const void *p, size_t r0, size_t r1, int task) {
  const quant_job *job = p;
  void *scratch = job->task_scratch + (size_t)task * job->task_bytes;
  if (!job->add_kernel) {
    job->kernel(&job->args, r0, r1, scratch);
    return;
  }
  for (size_t r = r0; r < r1; r += job->block) {
    size_t e = r + job->block < r1 ? r + job->block : r1;
    job->add_kernel(&job->add, r, e);
    job->kernel(&job->args, r, e, scratch);
  }
}

/* Whether a converted parameter (d values of the compute type, or NULL)
 * holds a NaN or an infinity: then any row's y may hold a NaN. */
static int param_nonfinite(const rn_kernel_set *k, const void *p, size_t d, int f64) {
  if (!p) return 0;
  if (!f64 && k->finite) return !k->finite(p, d); /* the set's vectors */
  if (f64) {
    for (size_t j = 0; j < d; j++)
      if (!isfinite(rn_ld_f64(p, j))) return 1;
    return 0;
  }
  /* fp32: an all-ones exponent, found by OR-ing 8 lanes of flags without
   * a branch (a loop the compiler runs in vector lanes: the scalar test of
   * each value cost a 16 x 4096 call a tenth of its time) */
  const unsigned char *b = p;
  uint32_t any[8] = {0};
  size_t j = 0;
  for (; j + 8 <= d; j += 8)
    for (int k = 0; k < 8; k++) {
      uint32_t u;
      memcpy(&u, b + 4 * (j + (size_t)k), 4);
      any[k] |= (u & 0x7f800000u) == 0x7f800000u;
    }
  for (; j < d; j++) any[0] |= !isfinite(rn_ld_f32(p, j));
  uint32_t all = 0;
  for (int k = 0; k < 8; k++) all |= any[k];
  return all != 0;
}

/* rows x d of the dtype in, a byte each out; with the add, h read and
 * written and u read first */
RN_FUSED_STEP rn_split quantized_split(const rmsnorm_context *ctx, size_t rows, size_t d,
                                       size_t es) {
  return rn_split_for(ctx, rows, rows * d * (es + 1), rows);
}

RN_FUSED_STEP rn_split add_quantized_split(const rmsnorm_context *ctx, size_t rows, size_t d,
                                           size_t es) {
  return rn_split_for(ctx, rows, rows * d * (es * 4 + 1), rows);
}

/* Whether the call adds u to h first (its u's stride is 0 without). */
static int with_add(const rn_fused_call *c) { return c->ldu != 0; }

/* The descriptor, the codes' and scales' strides and the static scale, then
 * the buffers. With the add, c->x is h (updated) and c->u is u. */
RN_FUSED_STEP rmsnorm_status quantized_check(rn_entry *e, rn_fused_call *c) {
  size_t rows = c->rows, d = c->d, es = e->es;
  rmsnorm_quant *q = &c->quant;
  rn_qlayout *l = &c->layout;
  rmsnorm_status st = rn_qlayout_read(c->quant_arg, d, q, l);
  if (st == RMSNORM_OK) st = rn_check_matrix(rows, l->row_bytes, c->ldy, 1);
  if (st == RMSNORM_OK && l->row_scales)
    st = rn_check_matrix(rows, l->row_scales, c->lds, l->scale_es);
  if (st != RMSNORM_OK) return st;
  float s0 = q->static_scale ? rn_ld_f32(q->static_scale, 0) : 0.0f;
  if (q->static_scale && !(s0 > 0 && s0 <= FLT_MAX)) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (!l->row_scales && c->scales) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (rows == 0) return RMSNORM_OK;
  int add = with_add(c);
  if (!c->x || (add && !c->u) || !c->y || (l->row_scales && !c->scales))
    return RMSNORM_ERROR_NULL_POINTER;
  rn_buffers b = {.in = {rn_matrix(c->u, rows, d, c->ldu, es), rn_vector(q->static_scale, 1, 4)},
                  .out = {rn_matrix(c->y, rows, l->row_bytes, c->ldy, 1),
                          rn_matrix(c->scales, rows, l->row_scales, c->lds, l->scale_es),
                          rn_vector(c->rstd, rows, e->as)},
                  .weight = c->weight, .bias = c->bias, .nparam = d};
  if (add)
    b.out[3] = rn_matrix(c->x, rows, d, c->ldx, es);
  else
    b.in[0] = rn_matrix(c->x, rows, d, c->ldx, es);
  return rn_entry_check(e, &b);
}

/* [the job][each task's row scratch] */
RN_FUSED_STEP size_t quantized_bytes(rn_entry *e, const rn_fused_call *c, rn_split split) {
  (void)e;
  return rn_align64(sizeof(quant_job)) + (size_t)split.tasks * RN_QUANT_SCRATCH(c->d);
}

RN_FUSED_STEP rn_rows_job quantized_prepare(const rn_entry *e, const rn_fused_call *c,
                                            rn_split split, char *mem) {
  (void)split;
  size_t d = c->d, es = e->es, rows = c->rows;
  rmsnorm_dtype dt = e->cfg.dtype;
  const rmsnorm_quant *q = &c->quant;
  int add = with_add(c);
  void *x = (void *)(uintptr_t)c->x; /* h, updated, with the add */
  quant_job *job = (quant_job *)(void *)mem;
  job->task_bytes = RN_QUANT_SCRATCH(d);
  job->task_scratch = mem + rn_align64(sizeof *job);
  job->kernel = e->kernels->quant[dt];
  job->add_kernel = add ? e->kernels->add[dt] : NULL;
  job->add = (rn_add_args){dt, d, x, c->ldx, c->u, c->ldu, x, c->ldx};
  job->block = rn_block_rows(d, es);
  memset(&job->args, 0, sizeof job->args);
  job->args.f = rn_entry_forward_args(e, RN_RMSNORM, d, x, c->ldx, NULL, 0);
  job->args.f.rstd = c->rstd;
  /* rn_stream_ok's tiers on the input's size (bytes: no alignment to meet);
   * kernels prefetch from 1, repeatedly from 2 (DRAM-sized). After the add,
   * the block's h is in the caches: not DRAM-sized. */
  job->args.f.stream = rn_stream_ok(1, c->y, 1, rows * d * es);
  if (add) job->args.f.stream = job->args.f.stream != 0;
  job->args.fp8 = q->format == RMSNORM_QF_FP8_E4M3;
  job->args.q = c->y;
  job->args.ldq = c->ldy;
  job->args.static_scale = q->static_scale ? rn_ld_f32(q->static_scale, 0) : 0.0f;
  job->args.e8m0 = (q->flags & RMSNORM_QUANT_SCALE_E8M0) != 0; /* implies POW2 */
  job->args.pow2 = (q->flags & RMSNORM_QUANT_SCALE_POW2) != 0 || job->args.e8m0;
  job->args.format = q->format;
  job->args.group = q->group;
  job->args.scales = c->scales;
  job->args.lds = c->lds;
  job->args.nan_rows = param_nonfinite(e->kernels, e->weight, d, rn_acc_is_f64(dt)) ||
                       param_nonfinite(e->kernels, e->bias, d, rn_acc_is_f64(dt));
  if (q->group || (q->format != RMSNORM_QF_INT8 && q->format != RMSNORM_QF_FP8_E4M3))
    job->args.encode = e->kernels->encode;
  else
    job->args.scale = c->scales; /* per row: one float (or E8M0 byte) per row, stride lds */
  return (rn_rows_job){quant_rows, job};
}

const rn_fused_op rn_quantized_op = {quantized_split, quantized_check, quantized_bytes,
                                     quantized_prepare};
const rn_fused_op rn_add_quantized_op = {add_quantized_split, quantized_check, quantized_bytes,
                                         quantized_prepare};

/* Both entry points: x is h (updated to h + u first) when u is given. */
static rmsnorm_status quantized(rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows,
                                size_t d, void *x, size_t ldx, int add, const void *u, size_t ldu,
                                const void *weight, const void *bias, const rmsnorm_quant *qp,
                                void *codes, size_t ldc, void *scales, size_t lds, void *rstd) {
  rn_entry e;
  rmsnorm_status st = rn_entry_begin(&e, ctx, &cfg, RN_RMSNORM, RMSNORM_FLAG_ACCUMULATE, d);
  if (st == RMSNORM_OK)
    st = add ? rn_entry_matrices(&e, rows, d, RN_LDS(ldx, ldu))
             : rn_entry_matrices(&e, rows, d, RN_LDS(ldx));
  if (st != RMSNORM_OK) return st;
  rn_fused_call c;
  rn_fused_call_init(&c, rows, d);
  c.x = x, c.ldx = ldx, c.u = (void *)(uintptr_t)u, c.ldu = add ? ldu : 0;
  c.y = codes, c.ldy = ldc, c.scales = scales, c.lds = lds, c.quant_arg = qp;
  c.weight = weight, c.bias = bias, c.rstd = rstd;
  /* each branch a constant table, so that its steps are called directly */
  return add ? rn_fused_oneshot(&e, &rn_add_quantized_op, &c)
             : rn_fused_oneshot(&e, &rn_quantized_op, &c);
}

rmsnorm_status rmsnorm_forward_quantized(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                         size_t rows, size_t d, const void *x, size_t ldx,
                                         const void *weight, const void *bias,
                                         const rmsnorm_quant *q, void *codes, size_t ldc,
                                         void *scales, size_t lds, void *rstd) {
  return quantized(ctx, cfg, rows, d, (void *)(uintptr_t)x, ldx, 0, NULL, 0, weight, bias, q,
                   codes, ldc, scales, lds, rstd);
}

rmsnorm_status rmsnorm_add_forward_quantized(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                             size_t rows, size_t d, void *h, size_t ldh,
                                             const void *u, size_t ldu, const void *weight,
                                             const void *bias, const rmsnorm_quant *q,
                                             void *codes, size_t ldc, void *scales, size_t lds,
                                             void *rstd) {
  return quantized(ctx, cfg, rows, d, h, ldh, 1, u, ldu, weight, bias, q, codes, ldc, scales,
                   lds, rstd);
}

rmsnorm_status rmsnorm_forward_quant(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                     size_t rows, size_t d, const void *x, size_t ldx,
                                     const void *weight, const void *bias, rmsnorm_qtype qtype,
                                     const float *static_scale, void *q, size_t ldq,
                                     float *scale, void *rstd) {
  rmsnorm_quant desc; /* the same numbers as the two per-row formats; others are refused */
  rmsnorm_quant_init(&desc, qtype == RMSNORM_Q_INT8      ? RMSNORM_QF_INT8
                            : qtype == RMSNORM_Q_FP8_E4M3 ? RMSNORM_QF_FP8_E4M3
                                                          : (rmsnorm_qformat)-1);
  desc.static_scale = static_scale;
  return quantized(ctx, cfg, rows, d, (void *)(uintptr_t)x, ldx, 0, NULL, 0, weight, bias, &desc,
                   q, ldq, scale, 1, rstd);
}
