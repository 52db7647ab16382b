/* kernels.h - the internal contract between the API layer (src/api/) and the
 * row kernels of every ISA. The API validates, converts the weight and bias to
 * the compute type, and splits rows; a kernel only computes, and trusts its
 * arguments (it may assert). */
#ifndef RMSNORM_KERNELS_H
#define RMSNORM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "rmsnorm.h"

#define RN_NUM_DTYPES 4

/* Rows of one backward chunk: dweight/dbias partial sums are kept per chunk
 * of this many rows and added in a fixed order (consecutive chunks in at most
 * 64 groups, work.h), so the result does not depend on how rows are split
 * (across threads or otherwise). */
#define RN_BACKWARD_CHUNK_ROWS 64

/* The blocked row sums: element j of a row goes to lane j % LANES of block
 * j / BLOCK; a block's lanes accumulate in the compute type, finished blocks
 * are added into double lanes, and those are combined by halving (lane i +=
 * lane i + half). SIMD kernels keep this order, so every ISA gives the same
 * bits. */
#define RN_LANES_F32 64
#define RN_BLOCK_F32 (RN_LANES_F32 * 16)
#define RN_LANES_F64 32
#define RN_BLOCK_F64 (RN_LANES_F64 * 16)

typedef enum rn_norm { RN_RMSNORM = 0, RN_LAYERNORM = 1 } rn_norm;

/* Where a call's output goes (rn_stream_ok, runtime/work.h, decides; the
 * args structs carry it). RN_CACHED is 0, so `stream != 0` reads "streamed". */
typedef enum rn_stream {
  RN_CACHED = 0,       /* plain stores: small, aliasing an input, or misaligned */
  RN_STREAMED = 1,     /* streaming (non-temporal) stores past the caches */
  RN_STREAMED_DRAM = 2 /* streamed, and the data is DRAM-sized: fp32/fp64 kernels
                          repeat their prefetches (V_PREFETCH_REPEAT) */
} rn_stream;

/* How a SIMD kernel stores one vector of output (kernels' own use: the span
 * loops of store_simd.inc pick it per vector from the call's rn_stream). */
typedef enum rn_store_kind {
  RN_STORE_PLAIN = 0,       /* a plain store (masked for a partial vector) */
  RN_STORE_STREAM = 1,      /* a full, aligned vector streamed past the caches */
  RN_STORE_JOIN = 2,        /* a streamed span's partial head or tail, handed to the
                               join that completes its chunk */
  RN_STORE_STREAM_DRAM = 3  /* as RN_STORE_STREAM, from a DRAM-sized input: the
                               prefetch beside it is repeated */
} rn_store_kind;

/* Forward over rows [row_begin, row_end). Compute type: float for fp32, fp16
 * and bf16 data, double for fp64 data ("acc" below). */
/* Data rows (x, y, dy, dx) and per-row stats (mean, rstd) are user memory at
 * any address: kernels reach them with unaligned loads and stores. */
typedef struct rn_forward_args {
  rn_norm norm;
  rmsnorm_dtype dtype; /* storage of x and y */
  size_t d;            /* row length */
  size_t k;            /* elements in the statistic: ceil(p*d) for pRMSNorm, else d */
  const void *x;       /* x: (rows, ldx) of the data dtype */
  size_t ldx;
  void *y;             /* y: (rows, ldy), may equal x */
  size_t ldy;
  const void *w;       /* w: (d,) acc, the effective gain (1+g folded in), or NULL */
  const void *b;       /* b: (d,) acc, or NULL (w and b are aligned to the acc type:
                          the API copies misaligned ones) */
  const void *w_data;  /* in place of w (then NULL): the caller's fp16/bf16 weight of the
                          data's dtype, read as it is (w_offset + g, as the copy in the
                          acc type would hold), or NULL; a few rows, no bias, in cache
                          (rn_entry_weight_direct) */
  float w_offset;      /* with w_data: 1 for Gemma's 1 + g (RMSNORM_FLAG_WEIGHT_OFFSET), else 0 */
  double eps;
  unsigned flags;      /* RMSNORM_FLAG_EPS_OUTSIDE, RMSNORM_FLAG_ROUND_BEFORE_WEIGHT */
  void *mean;          /* mean: (rows,) acc, LayerNorm only, or NULL */
  void *rstd;          /* rstd: (rows,) acc, or NULL */
  rn_stream stream;    /* not RN_CACHED when y is large, not x, and aligned to its
                          element size: kernels may store past the caches */
  int past_l3;         /* the call's x and y are RN_PAST_L3_BYTES or more: its rows
                          come from DRAM (RN_SHORT_ROWS_FROM_DRAM) */
} rn_forward_args;

/* Backward over rows [row_begin, row_end), adding this block's dweight/dbias
 * contributions into dw_part/db_part ((d,) acc, or NULL): zeroed by the
 * caller, or with parts_fresh holding nothing yet (the kernel writes them
 * from +0, with the same bits). */
typedef struct rn_backward_args {
  rn_norm norm;
  rmsnorm_dtype dtype; /* storage of x, dy and dx */
  size_t d, k;
  const void *x;       /* x: (rows, ldx) */
  size_t ldx;
  const void *dy;      /* dy: (rows, lddy) */
  size_t lddy;
  void *dx;            /* dx: (rows, lddx), may equal dy or x */
  size_t lddx;
  const void *w;       /* w: (d,) acc effective gain, or NULL */
  double eps;
  unsigned flags;
  const void *mean;    /* saved stats (rows,) acc; used only when both are present */
  const void *rstd;    /*   (RMSNorm: rstd alone) */
  rn_stream stream;    /* not RN_CACHED when dx is large and aliases nothing: may
                          store past the caches */
  int past_l3;         /* x, dy and dx are RN_PAST_L3_BYTES or more (as the forward's) */
  int parts_fresh;     /* the partials hold nothing yet: their first terms are stored,
                          as added to +0, without the caller's pass to zero them */
  float w_offset;      /* with w_data: 1 for Gemma's 1 + g, else 0 */
  const void *w_data;  /* in place of w (then NULL): the caller's fp16/bf16 weight of the
                          data's dtype, read as it is (w_offset + g), where the set's
                          backward_w_data has the dtype; RMSNorm over whole rows, 1-3
                          rows in cache, one task, no dbias (api/norm.c) */
  void *dw_data;       /* with w_data, or NULL: the caller's dweight, which the last
                          row stores rounded (the partial is then not reduced:
                          rn_grad_plan.dw_stored). rn_entry_backward_args sets every
                          field: a new one goes there too */
} rn_backward_args;

typedef void (*rn_forward_fn)(const rn_forward_args *a, size_t row_begin, size_t row_end);
typedef void (*rn_backward_fn)(const rn_backward_args *a, size_t row_begin, size_t row_end,
                               void *dw_part, void *db_part);

/* Element-wise sum over rows [row_begin, row_end) (the residual add):
 * out_j = a_j + b_j in the compute type, rounded to the storage dtype. */
typedef struct rn_add_args {
  rmsnorm_dtype dtype; /* storage of a, b and out */
  size_t d;
  const void *a;       /* a: (rows, lda) */
  size_t lda;
  const void *b;       /* b: (rows, ldb) */
  size_t ldb;
  void *out;           /* out: (rows, ldo), may equal a or b */
  size_t ldo;
} rn_add_args;

/* RMSNorm with a quantized output: the forward's y in the compute type
 * (never rounded to the data dtype) divided by a scale and rounded to int8 or
 * fp8 e4m3 (formulas in ref/fused_ref.inc). */
typedef struct rn_quant_args {
  rn_forward_args f;   /* the norm (RMSNorm only); f.y, f.mean unused; f.stream:
                          the input is large (kernels prefetch ahead, and stream
                          aligned rows of codes; RN_STREAMED_DRAM: DRAM-sized) */
  int fp8;             /* 0: int8, 1: fp8 e4m3 (OCP "FN": max 448, NaN 0x7f) */
  void *q;             /* q: (rows, ldq) bytes */
  size_t ldq;
  void *scale;         /* scale: (rows, lds) floats or E8M0 bytes, written when dynamic */
  float static_scale;  /* > 0: the one scale of every row; 0: dynamic, per row */
  int pow2;            /* dynamic scales: rn_ue8m0_scale (quant.h) */
  int e8m0;            /* dynamic scales stored as E8M0 bytes (pow2 set too) */
  /* The block and per-group formats (numerics/blocks.h): when `encode` is set,
   * each row's y, rounded to float, goes to it instead of the per-row codes. */
  void (*encode)(const struct rn_quant_args *q, size_t row, const float *y);
  int format;          /* rmsnorm_qformat */
  size_t group;        /* INT8/FP8_E4M3 per-group: the group */
  void *scales;        /* (rows, lds) float or E8M0 bytes, or NULL */
  size_t lds;
  /* Every row's y may hold a NaN (the weight or bias holds a NaN or an
   * infinity), not only the rescued rows': the SIMD sets then encode every
   * row as a rescued one (y in scratch, the reference encoder, the per-row
   * scale checked for NaN), so that only the reference meets NaNs. */
  int nan_rows;
} rn_quant_args;

/* RMSNorm r of rows [row_begin, row_end) into a->rstd (nothing else written). */
typedef void (*rn_rstd_fn)(const rn_forward_args *a, size_t row_begin, size_t row_end,
                           void *row_scratch);
typedef void (*rn_add_fn)(const rn_add_args *a, size_t row_begin, size_t row_end);
/* Residual add (add: h + u into h) and RMSNorm of h' (f) over rows, in two
 * passes a row; the same bits as add then forward (api/add.c). */
typedef void (*rn_add_forward_fn)(const rn_add_args *add, const rn_forward_args *f,
                                  size_t row_begin, size_t row_end);
typedef void (*rn_quant_fn)(const rn_quant_args *a, size_t row_begin, size_t row_end,
                            void *row_scratch);
/* A row's y (float) to its codes and scales in q->format, q->encode. */
typedef void (*rn_encode_fn)(const rn_quant_args *q, size_t row, const float *y);
/* row_scratch: RN_QUANT_SCRATCH(d) bytes, 64-byte aligned, private to the
 * calling task (rescued rows and the quantizer's row of y pass through it). */
#define RN_QUANT_SCRATCH(d) ((((d) * 8 + 63) & ~(size_t)63) * 2)

/* Long rows split across threads: the row's coefficients are computed once,
 * in the spec's order, then elements [j0, j1) of the row from them, so any
 * split gives the same bits. coef: forward {mean, r}; backward {mean, r,
 * mean_gy, c} (values of the compute type). @return of the coefficient
 * functions: 0 when the row must take the rescue path instead. */
typedef int (*rn_row_coef_fn)(const rn_forward_args *a, size_t row, double coef[2]);
typedef void (*rn_row_cols_fn)(const rn_forward_args *a, size_t row, size_t j0, size_t j1,
                               const double coef[2]);
typedef int (*rn_grad_coef_fn)(const rn_backward_args *a, size_t row, double coef[4]);
typedef void (*rn_grad_cols_fn)(const rn_backward_args *a, size_t row, size_t j0, size_t j1,
                                const double coef[4], void *dw_part, void *db_part);

/* Partial row sums of a column shard (the sharded hidden dimension,
 * src/api/shard.c), in the blocked order of the whole row: element t of the shard
 * is column offset + t of the row and goes to that column's lane and block.
 * A shard that starts inside a block sums its part of that block on its own
 * (lanes halved), then the blocks from the next boundary on (the library's
 * order); the two are added in double. */
typedef struct rn_shard_args {
  int grad;            /* 0: sum x_t^2; 1: sum gy_t * (x_t * r), RMSNorm backward's B */
  size_t offset;       /* global column of x[0] */
  size_t n;            /* elements summed: [0, n) of the shard */
  const void *x;       /* x: (rows, ldx) of the data dtype */
  size_t ldx;
  const void *dy;      /* dy: (rows, lddy), grad only */
  size_t lddy;
  const void *w;       /* w: (n,) acc effective gain, or NULL (grad only) */
  const void *r;       /* r: (rows,) acc, each row's r (grad only) */
  double *out;         /* out: (rows,) the partial sums */
} rn_shard_args;
typedef void (*rn_shard_fn)(const rn_shard_args *a, size_t row_begin, size_t row_end);

/* Gated RMSNorm over rows [row_begin, row_end) (ref/gated_ref.inc: the
 * formulas, the backward's derivation). Every kernel set compiles that one
 * body with its own ISA flags. */
typedef struct rn_gated_args {
  rmsnorm_dtype dtype; /* storage of x, z, y, dy, dx, dz */
  size_t d, group;     /* row length; columns per statistic (divides d) */
  int sigmoid;         /* act: 0 SiLU, 1 sigmoid */
  int norm_first;      /* 0: y = RMSNorm(x act(z)) w; 1: y = RMSNorm(x) w act(z) */
  const void *x;       /* x, z: (rows, ld) */
  size_t ldx;
  const void *z;
  size_t ldz;
  void *y;             /* forward: y (rows, ldy), may equal x or z */
  size_t ldy;
  const void *dy;      /* backward: dy (rows, lddy); dx may equal x or dy, dz may equal z */
  size_t lddy;
  void *dx;
  size_t lddx;
  void *dz;
  size_t lddz;
  const void *w;       /* w: (d,) acc effective gain, or NULL */
  const void *w_data;  /* forward, in place of w (then NULL): the caller's fp16/bf16
                          weight of the data's dtype, as rn_forward_args.w_data */
  float w_offset;      /* with w_data: 1 for Gemma's 1 + g, else 0 */
  double eps;
  unsigned flags;      /* RMSNORM_FLAG_ROUND_BEFORE_WEIGHT (forward) */
  void *rstd;          /* (rows, d / group) acc, or NULL: written by the forward,
                          read (when usable) by the backward */
  int stream;          /* the outputs (y; dx and dz) are large and alias nothing:
                          sets that can stream them do */
  int prefetch;        /* the inputs are DRAM-sized: rows prefetch the next */
} rn_gated_args;
/* row_scratch: RN_GATED_SCRATCH(d) bytes (nine rows of the compute type),
 * 64-byte aligned, private to the calling task. The backward adds dweight
 * terms into dw_part ((d,) acc, zeroed by the caller, or NULL). */
#define RN_GATED_SCRATCH(d) ((((d) + 15) & ~(size_t)15) * 8 * 9)
typedef void (*rn_gated_fwd_fn)(const rn_gated_args *a, size_t row_begin, size_t row_end,
                                void *row_scratch);
typedef void (*rn_gated_bwd_fn)(const rn_gated_args *a, size_t row_begin, size_t row_end,
                                void *dw_part, void *row_scratch);

/* QK-norm + RoPE over tokens [t0, t1) of a [tokens, heads] grid of rows of
 * d (ref/rope_ref.inc: the formulas, the backward's derivation). Every
 * kernel set compiles that one body with its own ISA flags. Row (t, h) of
 * a buffer p starts at p + t*ld_t + h*ld_h elements. */
typedef struct rn_rope_args {
  rmsnorm_dtype dtype;     /* storage of x, y, dy, dx and the K cache */
  size_t d, rot, heads;    /* head_dim; rotary_dim (even, <= d); rows per token */
  int gptj;                /* pairs (2i, 2i + 1); 0: (i, i + rot/2) */
  int per_token;           /* one statistic per token over its heads * d values
                              (RMSNORM_ROPE_NORM_TOKEN): w and dweight of heads * d,
                              rstd one value per token; never streamed */
  const void *x;           /* x: (tokens, heads, d) */
  size_t ldx_t, ldx_h;
  void *y;                 /* forward: y, may equal x (same strides), or NULL */
  size_t ldy_t, ldy_h;
  int stream;              /* forward: y apart from x and large: its rows are
                              streamed past the caches (rope_ref.inc);
                              backward: dx apart from x and dy and large (the
                              SIMD sets stream it: rope_simd.inc) */
  int prefetch;            /* the rows are DRAM-sized: the SIMD sets prefetch
                              the next group's (forward) or row's (backward) */
  int past_l3;             /* forward: x and y are RN_PAST_L3_BYTES or more
                              (RN_SHORT_ROWS_FROM_DRAM) */
  const void *dy;          /* backward: dy; dx may equal x or dy */
  size_t lddy_t, lddy_h;
  void *dx;
  size_t lddx_t, lddx_h;
  const void *w;           /* w: (d,) acc effective gain ((heads * d,) per token),
                              or NULL */
  double eps;
  unsigned flags;          /* RMSNORM_FLAG_ROUND_BEFORE_WEIGHT, _ROUND_BEFORE_ROTATION,
                              _FLOAT_ROTATION (forward) */
  void *rstd;              /* (tokens * heads,) acc, index t*heads + h ((tokens,) per
                              token), or NULL: written by the forward, read (when
                              usable) by the backward */
  const void *cos_sin;     /* (n_positions, rot) acc: a row's rot/2 cos, then sin */
  const int64_t *positions; /* token t's row of cos_sin, or NULL: row t */
  void *k;                 /* forward: the K cache, or NULL: row (t, h) also to
                              k + slots[t]*ldk_slot + h*ldk_h (slots[t] < 0: not) */
  size_t ldk_slot, ldk_h;
  const int64_t *slots;
} rn_rope_args;
/* row_scratch: RN_ROPE_SCRATCH(d) bytes, 64-byte aligned, private to the
 * calling task: rows of the compute type, five in the backward, and in the
 * forward two plus a group of RN_ROPE_GROUP(d) rows whose statistics are
 * computed together; per token, RN_ROPE_TOKEN_SCRATCH(heads * d, d): two
 * rows and three of a token's values. The backward adds dweight terms into
 * dw_part ((d,) acc, (heads * d,) per token, zeroed by the caller, or
 * NULL). */
#define RN_ROPE_GROUP_MAX 8
#define RN_ROPE_GROUP(d) ((d) <= 256 ? (size_t)RN_ROPE_GROUP_MAX : 1)
#define RN_ROPE_SCRATCH(d) ((((d) + 63) & ~(size_t)63) * 8 * (RN_ROPE_GROUP(d) + 4))
#define RN_ROPE_TOKEN_SCRATCH(n, d) \
  (((((n) + 63) & ~(size_t)63) * 3 + (((d) + 63) & ~(size_t)63) * 2) * 8)
typedef void (*rn_rope_fwd_fn)(const rn_rope_args *a, size_t t0, size_t t1, void *row_scratch);
typedef void (*rn_rope_bwd_fn)(const rn_rope_args *a, size_t t0, size_t t1, void *dw_part,
                               void *row_scratch);

/* Gemma's sandwich forward over rows [row_begin, row_end) (api/sandwich.c):
 * h' = h + post(a) written over h, x' = pre(h'), bit for bit the separate
 * calls. post: x = a, w, rstd, eps, flags (its y unused); pre: x = h (read,
 * then updated: the caller's writable buffer), y = x', w, rstd, stream.
 * RMSNorm without partial statistics, both weights present; row_scratch: d
 * elements of the dtype, private to the calling task. */
typedef struct rn_sandwich_args {
  rn_forward_args post, pre;
} rn_sandwich_args;
typedef void (*rn_sandwich_fn)(const rn_sandwich_args *a, size_t row_begin, size_t row_end,
                               void *row_scratch);

/* n fp32, fp16 or bf16 (dt) values at src (any alignment) to dst as
 * offset + (float)v, the parameters' conversion (runtime/work.c). */
typedef void (*rn_widen_fn)(rmsnorm_dtype dt, const void *src, size_t n, float offset,
                            float *dst);
/* n floats to dt (fp16 or bf16) at dst (any alignment), rounded as
 * rn_f32_to_f16 / rn_f32_to_bf16: a backward's parameter gradients. */
typedef void (*rn_narrow_fn)(rmsnorm_dtype dt, const float *src, size_t n, void *dst);
/* Whether the n floats at p (any alignment) are all finite: the quantized
 * calls' test of their weight and bias. */
typedef int (*rn_finite_fn)(const float *p, size_t n);
void rn_avx2_widen(rmsnorm_dtype dt, const void *src, size_t n, float offset, float *dst);
void rn_avx2_narrow(rmsnorm_dtype dt, const float *src, size_t n, void *dst);
int rn_avx2_finite(const float *p, size_t n);

/* One ISA's kernels, indexed by rmsnorm_dtype. */
typedef struct rn_kernel_set {
  const char *name;
  rn_forward_fn forward[RN_NUM_DTYPES];
  rn_backward_fn backward[RN_NUM_DTYPES];
  /* transformer-block fusions (src/api/add.c, quant.c, qk.c, linear.c) */
  rn_add_fn add[RN_NUM_DTYPES];
  rn_rstd_fn rstd[RN_NUM_DTYPES];
  rn_quant_fn quant[RN_NUM_DTYPES];
  rn_encode_fn encode; /* the block and per-group encoders (ISA only, no dtype) */
  /* long rows split across threads (api/norm.c) */
  rn_row_coef_fn row_coef[RN_NUM_DTYPES];
  rn_row_cols_fn row_cols[RN_NUM_DTYPES];
  rn_grad_coef_fn grad_coef[RN_NUM_DTYPES];
  rn_grad_cols_fn grad_cols[RN_NUM_DTYPES];
  /* column shards of a row (shard.c) */
  rn_shard_fn shard_sums[RN_NUM_DTYPES];
  /* gated RMSNorm (api/gated.c) */
  rn_gated_fwd_fn gated_forward[RN_NUM_DTYPES];
  rn_gated_bwd_fn gated_backward[RN_NUM_DTYPES];
  /* QK-norm + RoPE (api/rope.c) */
  rn_rope_fwd_fn rope_forward[RN_NUM_DTYPES];
  rn_rope_bwd_fn rope_backward[RN_NUM_DTYPES];
  /* the sandwich forward in one pass, fp32 and fp64 (api/sandwich.c; NULL:
     the separate kernels, as the scalar reference) */
  rn_sandwich_fn sandwich_forward[RN_NUM_DTYPES];
  /* residual add + RMSNorm in two passes a row, fp32 and fp64 with a weight
     and no bias (api/add.c; NULL: the add, then the forward) */
  rn_add_forward_fn add_forward[RN_NUM_DTYPES];
  /* fp16/bf16 parameters widened to fp32 plus offset (runtime/work.c; NULL:
     the portable loops) */
  rn_widen_fn widen;
  /* float sums to fp16/bf16 parameter gradients (runtime/work.c; NULL: the
     portable loop) */
  rn_narrow_fn narrow;
  /* the float parameters' finiteness test (api/quant.c; NULL: the portable
     loop) */
  rn_finite_fn finite;
  /* the fp16/bf16 forward and gated forward read their args' w_data (the
     SIMD sets) */
  int weight_in_data;
  /* the dtypes (bit 1u << dtype) whose backward reads its args' w_data and
     stores dw_data (backward_simd.inc): fp16 on the SIMD sets, bf16 where
     its widening at each read measured cheaper than the copy (AVX-512) */
  unsigned backward_w_data;
} rn_kernel_set;

/* The scalar reference: the spec every other set is tested against. */
extern const rn_kernel_set rn_kernels_ref;

#endif
