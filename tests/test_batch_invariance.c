/* test_batch_invariance.c - a row's outputs do not depend on its batch.
 *
 * The promise: every per-row output of every op has the same bits whatever
 * the number of rows in the call, the row's position among them, the thread
 * count and the kernel set. Checked here for fp32, fp16, bf16 and fp64 data:
 *   rmsnorm_forward (y, rstd) and rmsnorm_backward (dx; r recomputed, r saved);
 *   LayerNorm forward (y, mean, rstd) and backward (dx);
 *   the fused add, forward (h', y, rstd) and backward (dh, with and without dres);
 *   rmsnorm_forward_quantized and rmsnorm_add_forward_quantized, every format
 *     (codes, scales; the fused one also h' and rstd);
 *   QK-norm forward and backward, a row being one token's heads (y, rstd, dx),
 *     token-major and head-major, over any number of tokens in any order;
 *   the shard steps on two shards cut off the block grid (each shard's
 *     statistic and dot partials, y, rstd, dx);
 *   gated RMSNorm, gate first per row and norm first per group (y, rstd, dx, dz);
 *   QK-norm + RoPE, a row being one token's heads at its own position: NeoX
 *     token-major with the KV cache (y, rstd, the cache's K and V rows, dx)
 *     and GPT-J over half the head, head-major (y, rstd, dx); and with one
 *     statistic per token over its heads (OLMo 2), NeoX token-major (y,
 *     rstd, dx) and GPT-J head-major (y, dx);
 *   the sandwich norms (h', x', both rstd, da, dh; with and without dh_out);
 *   RMSNorm + linear: rstd of any row; Z and dX where the GEMMs are exact.
 *
 * What is not invariant:
 * - The parameter gradients (dweight, dbias of every backward, linear's dW)
 *   are sums over the batch's rows, so another set of rows is another sum.
 *   For the SAME batch they have the same bits on 1..3 threads and every
 *   kernel set (fixed-order sums), and that is checked.
 * - RMSNorm + linear's Z and dX in general: they are computed from the
 *   BLAS's GEMMs (X W', and G = dZ W'^T for dX), which include/rmsnorm.h
 *   does not promise bit for bit, and a BLAS may add a row's products in an
 *   order that depends on the number of rows (OpenBLAS does: fp32 rows of
 *   4096 get other bits in a batch of 48 than alone). What the library does
 *   around the GEMMs (r, Z = r (X W') + bias rounded once, dX from G, the
 *   rows it recomputes) is held to the bits on rows of small integers with
 *   W multiples of 1/2 and gains multiples of 1/4, whose GEMMs are exact in
 *   any order. Linear's dW and dweight come from a GEMM over the batch's
 *   rows: the same batch gives them the same bits where the BLAS repeats a
 *   product's bits for the same shapes (OpenBLAS does), as checked here.
 *
 * The reference of a row is the row alone, scalar kernels, one thread; of a
 * batch's sums, the batch on scalar kernels, one thread. Batches are the
 * whole pool, the pool reversed, and shuffled subsets of 1, 7 and 33 rows;
 * rows are real-looking (an outlier channel, a quiet row, ties). Rows of
 * d = 256, 4096, 5120 and 32768; the last is there for the sizes of the
 * batches' outputs and runs a reduced set (check_shape). Outputs are
 * compared through 64-bit digests of their bytes (the largest shape's would
 * take gigabytes). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define POOL 48
#define NFORMATS 7   /* rmsnorm_qformat: INT8 .. Q8_1 */
#define HEAD_DIM 128 /* QK-norm: a pool row of d is d / HEAD_DIM heads */
#define GROUP 128    /* gated RMSNorm's group in the per-group case */
#define NOUT 32      /* RMSNorm + linear: output columns */
#define MAXFIELDS 160

/* ---- digests of outputs, and what they are held against ------------------ */

/* A 64-bit digest of n bytes: four lanes of multiply-xorshift over 8-byte
 * words, then the lanes chained. Every step is a bijection of the state for a
 * given word, so inputs differing in one word always give different digests;
 * others collide with a chance of about 2^-64. */
static inline uint64_t mix(uint64_t h, uint64_t w) {
  h = (h ^ w) * 0x9e3779b97f4a7c15ull;
  return h ^ (h >> 29);
}

static uint64_t digest(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h0 = n, h1 = 1, h2 = 2, h3 = 3, w[4];
  size_t k = 0;
  for (; k + 32 <= n; k += 32) {
    memcpy(w, b + k, 32);
    h0 = mix(h0, w[0]), h1 = mix(h1, w[1]), h2 = mix(h2, w[2]), h3 = mix(h3, w[3]);
  }
  if (k < n) { /* the tail, zero-padded (n is in the digest) */
    memset(w, 0, sizeof w);
    memcpy(w, b + k, n - k);
    h0 = mix(h0, w[0]), h1 = mix(h1, w[1]), h2 = mix(h2, w[2]), h3 = mix(h3, w[3]);
  }
  return mix(mix(mix(h0, h1), h2), h3);
}

/* One output of one op: the digest of each pool row's part, as the row alone
 * gave it; or the digest of a sum over a batch, as scalar, one thread gave it. */
typedef struct field {
  char name[96];
  uint64_t row[POOL], sum;
} field;

/* ALONE: each row run alone sets its rows' references. SUMS: the batch on
 * scalar, one thread: rows are checked, sums set their references. CHECK:
 * rows and sums are checked. */
enum mode { ALONE, SUMS, CHECK };

typedef struct recorder {
  enum mode mode;
  char where[96];      /* dtype, shape, kernel set, threads */
  const size_t *idx;   /* the batch: pool rows idx[0..n) */
  size_t n;
  field rows[MAXFIELDS], sums[MAXFIELDS];
  size_t nrows, nsums;
} recorder;

static field *field_named(field *f, size_t *count, const char *name) {
  for (size_t i = 0; i < *count; i++)
    if (!strcmp(f[i].name, name)) return &f[i];
  if (*count == MAXFIELDS) {
    fprintf(stderr, "test_batch_invariance: more than %d outputs\n", MAXFIELDS);
    exit(2);
  }
  field *n = &f[(*count)++];
  memset(n, 0, sizeof *n);
  snprintf(n->name, sizeof n->name, "%s", name);
  return n;
}

/* A per-row output: row i of the batch is `bytes` at p + i*stride. */
static void keep_rows(recorder *R, const char *name, const void *p, size_t bytes, size_t stride) {
  field *f = field_named(R->rows, &R->nrows, name);
  for (size_t i = 0; i < R->n; i++) {
    size_t r = R->idx[i];
    uint64_t h = digest((const unsigned char *)p + i * stride, bytes);
    if (R->mode == ALONE)
      f->row[r] = h;
    else
      tu_check(h == f->row[r], "%s: %s: row %zu, at %zu of %zu, differs from the row alone",
               R->where, name, r, i, R->n);
  }
}

/* A sum over the batch's rows (a parameter gradient) of `bytes` at p. */
static void keep_sum(recorder *R, const char *name, const void *p, size_t bytes) {
  if (R->mode == ALONE) return;
  field *f = field_named(R->sums, &R->nsums, name);
  uint64_t h = digest(p, bytes);
  if (R->mode == SUMS)
    f->sum = h;
  else
    tu_check(h == f->sum, "%s: %s over the same %zu rows differs from scalar, one thread",
             R->where, name, R->n);
}

/* ---- the pool of rows, and a batch of them ------------------------------ */

enum kind {
  ACTIVATION,  /* N(0, 1), an outlier channel, a quiet row, ties */
  GRADIENT,    /* N(0, 1) */
  INT_ACT,     /* small integers (|v| <= 8), an outlier channel (to 64), a quiet row */
  INT_GRAD     /* small integers */
};
#define NKINDS 6 /* the pool's row sets: x, dy, u, v, xe, dze (pool below) */

/* The values of one shape's pool, as floats, drawn once and rounded to each
 * dtype in turn. */
typedef struct values {
  size_t d;
  float *rows[NKINDS]; /* (POOL, d) */
  float *w, *w2, *ge;  /* (d,) */
  float *W;            /* (d, NOUT) */
} values;

static void values_make(values *V, size_t d) {
  static const enum kind kinds[NKINDS] = {ACTIVATION, GRADIENT, ACTIVATION,
                                          GRADIENT,   INT_ACT,  INT_GRAD};
  V->d = d;
  for (int a = 0; a < NKINDS; a++) {
    enum kind kind = kinds[a];
    int exact = kind == INT_ACT || kind == INT_GRAD, act = kind == ACTIVATION || kind == INT_ACT;
    float *p = V->rows[a] = malloc(POOL * d * sizeof(float));
    for (size_t r = 0; r < POOL; r++)
      for (size_t j = 0; j < d; j++) {
        double v = tu_normal();
        if (exact) v = fmax(-8, fmin(8, nearbyint(2 * v)));
        if (act && j == 5) v *= exact ? 8 : 25;                       /* an outlier channel */
        if (act && r % 11 == 3) v *= exact ? 0x1p-10 : 1e-3;          /* a quiet row */
        if (kind == ACTIVATION && r % 13 == 4 && j % 3 == 0) v = 0.5; /* ties */
        p[r * d + j] = (float)v;
      }
  }
  V->w = malloc(d * 4), V->w2 = malloc(d * 4), V->ge = malloc(d * 4);
  for (size_t j = 0; j < d; j++) {
    V->w[j] = 1.0f + 0.25f * (float)tu_normal();
    V->w2[j] = 0.5f * (float)tu_normal();
    V->ge[j] = 0.25f * (float)(2 + tu_next() % 5);
  }
  V->W = malloc(d * NOUT * sizeof(float));
  for (size_t i = 0; i < d * NOUT; i++) V->W[i] = 0.5f * ((float)(tu_next() % 5) - 2);
}

static void values_free(values *V) {
  for (int a = 0; a < NKINDS; a++) free(V->rows[a]);
  free(V->w), free(V->w2), free(V->ge), free(V->W);
}

typedef struct pool {
  rmsnorm_dtype dt;
  int streaming;            /* the shape that exists for the streaming thresholds */
  size_t d, es, rb, ss;     /* columns, element bytes, row bytes, statistic bytes
                               (float, double for fp64 data) */
  unsigned char *x, *dy;    /* (POOL, d): activations, gradients */
  unsigned char *u, *v;     /* (POOL, d): a second activation (residual branch,
                               gate, sub-layer output), a second gradient */
  unsigned char *xe, *dze;  /* (POOL, d): INT_ACT, INT_GRAD for RMSNorm + linear */
  const float *w, *w2;      /* (d,): gains (and biases) */
  const float *ge;          /* (d,): the linear's gain, multiples of 1/4 in [0.5, 1.5] */
  void *W, *Wf;             /* (d, NOUT) compute type: linear's W, multiples of 1/2
                               in [-1, 1], and W' = diag(ge) W; NULL without a BLAS */
} pool;

/* Buffers kept from batch to batch: slot k holds the k-th buffer a batch
 * takes and is reallocated only when its size changes (with the number of
 * rows), so each is exactly the size asked for (ASan sees over-reads). Every
 * batch fills its buffers with a pattern of its own first: what an op leaves
 * unwritten differs from the reference. */
#define SLOTS 128
typedef struct arena {
  void *p[SLOTS];
  size_t bytes[SLOTS];
  unsigned char pattern;
} arena;

/* Pool rows idx[0..n) gathered into contiguous (n, d) buffers, and the
 * outputs of the ops. */
typedef struct batch {
  rmsnorm_context *c;
  const pool *P;
  rmsnorm_config cfg;
  recorder *R;
  arena *A;
  size_t n, d, es, rb, ss;
  unsigned char *x, *dy, *u, *v, *xe, *dze;
  size_t taken;
} batch;

static void *take(batch *B, size_t bytes) {
  arena *A = B->A;
  size_t k = B->taken++;
  if (k == SLOTS) {
    fprintf(stderr, "test_batch_invariance: more than %d buffers\n", SLOTS);
    exit(2);
  }
  if (A->bytes[k] != bytes || !A->p[k]) {
    free(A->p[k]);
    if (!(A->p[k] = malloc(bytes ? bytes : 1))) {
      fprintf(stderr, "test_batch_invariance: out of memory\n");
      exit(2);
    }
    A->bytes[k] = bytes;
  }
  return memset(A->p[k], A->pattern, bytes);
}

static unsigned char *copy_of(batch *B, const unsigned char *src) {
  unsigned char *p = take(B, B->n * B->rb);
  memcpy(p, src, B->n * B->rb);
  return p;
}

/* ---- the ops, by family ---------------------------------------------- */

/* RMSNorm and LayerNorm, forward and backward. */
static void ops_norm(batch *B) {
  size_t n = B->n, d = B->d, rb = B->rb, ss = B->ss;
  const float *w = B->P->w;
  void *y = take(B, n * rb), *dx = take(B, n * rb), *r = take(B, n * ss), *m = take(B, n * ss);
  float *dw = take(B, d * 4), *db = take(B, d * 4);
  TU_OK(rmsnorm_forward(B->c, &B->cfg, n, d, B->x, d, w, NULL, y, d, r));
  keep_rows(B->R, "rmsnorm_forward y", y, rb, rb);
  keep_rows(B->R, "rmsnorm_forward rstd", r, ss, ss);
  TU_OK(rmsnorm_backward(B->c, &B->cfg, n, d, B->x, d, B->dy, d, w, NULL, dx, d, NULL, NULL));
  keep_rows(B->R, "rmsnorm_backward dx (r recomputed)", dx, rb, rb);
  TU_OK(rmsnorm_backward(B->c, &B->cfg, n, d, B->x, d, B->dy, d, w, r, dx, d, dw, db));
  keep_rows(B->R, "rmsnorm_backward dx (r saved)", dx, rb, rb);
  keep_sum(B->R, "rmsnorm_backward dweight", dw, d * 4);
  keep_sum(B->R, "rmsnorm_backward dbias", db, d * 4);

  TU_OK(rmsnorm_layernorm_forward(B->c, &B->cfg, n, d, B->x, d, w, w, y, d, m, r));
  keep_rows(B->R, "layernorm_forward y", y, rb, rb);
  keep_rows(B->R, "layernorm_forward mean", m, ss, ss);
  keep_rows(B->R, "layernorm_forward rstd", r, ss, ss);
  TU_OK(rmsnorm_layernorm_backward(B->c, &B->cfg, n, d, B->x, d, B->dy, d, w, m, r, dx, d, dw,
                                   db));
  keep_rows(B->R, "layernorm_backward dx", dx, rb, rb);
  keep_sum(B->R, "layernorm_backward dweight", dw, d * 4);
  keep_sum(B->R, "layernorm_backward dbias", db, d * 4);
}

/* Residual add + RMSNorm, forward and backward. */
static void ops_add(batch *B) {
  size_t n = B->n, d = B->d, rb = B->rb, ss = B->ss;
  const float *w = B->P->w;
  unsigned char *h = copy_of(B, B->x);
  void *y = take(B, n * rb), *dh = take(B, n * rb), *r = take(B, n * ss);
  float *dw = take(B, d * 4), *db = take(B, d * 4);
  TU_OK(rmsnorm_add_forward(B->c, &B->cfg, n, d, h, d, B->u, d, w, NULL, y, d, r));
  keep_rows(B->R, "add_forward h'", h, rb, rb);
  keep_rows(B->R, "add_forward y", y, rb, rb);
  keep_rows(B->R, "add_forward rstd", r, ss, ss);
  TU_OK(rmsnorm_add_backward(B->c, &B->cfg, n, d, h, d, B->dy, d, B->v, d, w, NULL, dh, d, dw,
                             db));
  keep_rows(B->R, "add_backward dh (dres, r recomputed)", dh, rb, rb);
  keep_sum(B->R, "add_backward dweight", dw, d * 4);
  keep_sum(B->R, "add_backward dbias", db, d * 4);
  TU_OK(rmsnorm_add_backward(B->c, &B->cfg, n, d, h, d, B->dy, d, NULL, d, w, r, dh, d, NULL,
                             NULL));
  keep_rows(B->R, "add_backward dh (no dres, r saved)", dh, rb, rb);
}

/* Every quantized format, from x (rmsnorm_forward_quantized; INT8 and FP8
 * with one scale per row) and from h + u (rmsnorm_add_forward_quantized;
 * INT8 per group of 32 with power-of-two scales, FP8 per row with E8M0
 * scale bytes). */
static void ops_quant(batch *B) {
  static const char *names[NFORMATS] = {"int8", "fp8 e4m3", "q8_0",  "q8_k",
                                        "mxfp8", "mxfp4",    "q8_1"};
  size_t n = B->n, d = B->d, rb = B->rb, ss = B->ss;
  unsigned char *h = take(B, n * rb);
  void *r = take(B, n * ss);
  for (int fused = 0; fused < 2; fused++)
    for (int f = 0; f < NFORMATS; f++) {
      rmsnorm_quant q;
      rmsnorm_quant_init(&q, (rmsnorm_qformat)f);
      if (fused && f <= RMSNORM_QF_FP8_E4M3) {
        q.group = f == RMSNORM_QF_INT8 ? 32 : 0;
        q.flags = f == RMSNORM_QF_INT8 ? RMSNORM_QUANT_SCALE_POW2 : RMSNORM_QUANT_SCALE_E8M0;
      }
      size_t cb, ns;
      TU_OK(rmsnorm_quant_row_size(&q, d, &cb, &ns));
      int bytes = f == RMSNORM_QF_MXFP8_E4M3 || (q.flags & RMSNORM_QUANT_SCALE_E8M0);
      size_t sb = bytes ? ns : ns * sizeof(float); /* E8M0 or float */
      void *codes = take(B, n * cb), *scales = ns ? take(B, n * sb) : NULL;
      char name[96];
      const char *op = fused ? "add_forward_quantized" : "forward_quantized";
      if (fused) {
        memcpy(h, B->x, n * rb);
        TU_OK(rmsnorm_add_forward_quantized(B->c, &B->cfg, n, d, h, d, B->u, d, B->P->w, NULL,
                                            &q, codes, cb, scales, ns, r));
        snprintf(name, sizeof name, "%s %s h'", op, names[f]);
        keep_rows(B->R, name, h, rb, rb);
        snprintf(name, sizeof name, "%s %s rstd", op, names[f]);
        keep_rows(B->R, name, r, ss, ss);
      } else {
        TU_OK(rmsnorm_forward_quantized(B->c, &B->cfg, n, d, B->x, d, B->P->w, NULL, &q, codes,
                                        cb, scales, ns, NULL));
      }
      snprintf(name, sizeof name, "%s %s codes", op, names[f]);
      keep_rows(B->R, name, codes, cb, cb);
      if (scales) {
        snprintf(name, sizeof name, "%s %s scales", op, names[f]);
        keep_rows(B->R, name, scales, sb, sb);
      }
    }
}

/* (n, heads, hd) token-major rows <-> (heads, n, hd) head-major, es bytes
 * an element. */
static void heads_swap(const unsigned char *src, unsigned char *dst, size_t n, size_t heads,
                       size_t hd, size_t es, int to_head_major) {
  for (size_t t = 0; t < n; t++)
    for (size_t h = 0; h < heads; h++) {
      size_t tm = (t * heads + h) * hd * es, hm = (h * n + t) * hd * es;
      memcpy(dst + (to_head_major ? hm : tm), src + (to_head_major ? tm : hm), hd * es);
    }
}

/* QK-norm: a pool row is one token's d / HEAD_DIM heads; token-major (the
 * row as it lies; no bias, r saved) and head-major (bias; r recomputed). */
static void ops_qk(batch *B) {
  size_t n = B->n, d = B->d, rb = B->rb, ss = B->ss, es = B->es, heads = d / HEAD_DIM;
  const float *w = B->P->w, *bias = B->P->w2;
  void *y = take(B, n * rb), *dx = take(B, n * rb), *r = take(B, n * heads * ss);
  float *dw = take(B, HEAD_DIM * 4), *db = take(B, HEAD_DIM * 4);
  TU_OK(rmsnorm_qk_norm_forward(B->c, &B->cfg, n, heads, HEAD_DIM, B->x, d, HEAD_DIM, w, NULL,
                                y, d, HEAD_DIM, r));
  keep_rows(B->R, "qk_norm_forward token-major y", y, rb, rb);
  keep_rows(B->R, "qk_norm_forward token-major rstd", r, heads * ss, heads * ss);
  TU_OK(rmsnorm_qk_norm_backward(B->c, &B->cfg, n, heads, HEAD_DIM, B->x, d, HEAD_DIM, B->dy, d,
                                 HEAD_DIM, w, r, dx, d, HEAD_DIM, dw, db));
  keep_rows(B->R, "qk_norm_backward token-major dx", dx, rb, rb);
  keep_sum(B->R, "qk_norm_backward token-major dweight", dw, HEAD_DIM * 4);
  keep_sum(B->R, "qk_norm_backward token-major dbias", db, HEAD_DIM * 4);

  /* head-major: a token's heads lie n * HEAD_DIM elements apart */
  unsigned char *xh = take(B, n * rb), *dyh = take(B, n * rb), *oh = take(B, n * rb);
  size_t ld_head = n * HEAD_DIM;
  heads_swap(B->x, xh, n, heads, HEAD_DIM, es, 1);
  heads_swap(B->dy, dyh, n, heads, HEAD_DIM, es, 1);
  TU_OK(rmsnorm_qk_norm_forward(B->c, &B->cfg, n, heads, HEAD_DIM, xh, HEAD_DIM, ld_head, w,
                                bias, oh, HEAD_DIM, ld_head, r));
  heads_swap(oh, y, n, heads, HEAD_DIM, es, 0);
  keep_rows(B->R, "qk_norm_forward head-major y", y, rb, rb);
  keep_rows(B->R, "qk_norm_forward head-major rstd", r, heads * ss, heads * ss);
  TU_OK(rmsnorm_qk_norm_backward(B->c, &B->cfg, n, heads, HEAD_DIM, xh, HEAD_DIM, ld_head, dyh,
                                 HEAD_DIM, ld_head, w, NULL, oh, HEAD_DIM, ld_head, dw, db));
  heads_swap(oh, dx, n, heads, HEAD_DIM, es, 0);
  keep_rows(B->R, "qk_norm_backward head-major dx", dx, rb, rb);
  keep_sum(B->R, "qk_norm_backward head-major dweight", dw, HEAD_DIM * 4);
  keep_sum(B->R, "qk_norm_backward head-major dbias", db, HEAD_DIM * 4);
}

/* RMSNorm + linear (see the top of the file for what is held to the bits):
 * rstd of the real-looking rows; Z, rstd, dX of the exact ones, and the
 * batch's dweight, dW, dbias. */
static void ops_linear(batch *B) {
  const pool *P = B->P;
  if (!P->W) return; /* no BLAS in this build */
  size_t n = B->n, d = B->d, rb = B->rb, ss = B->ss, zb = NOUT * B->es;
  size_t as = rn_acc_size(B->cfg.dtype);
  void *z = take(B, n * zb), *r = take(B, n * ss), *dx = take(B, n * rb);
  void *dW = take(B, d * NOUT * as);
  float *dg = take(B, d * 4), *db = take(B, NOUT * 4);
  TU_OK(rmsnorm_linear_forward(B->c, &B->cfg, n, d, NOUT, B->x, d, P->Wf, NOUT, P->w, z, NOUT,
                               r));
  keep_rows(B->R, "linear_forward rstd", r, ss, ss);
  TU_OK(rmsnorm_linear_forward(B->c, &B->cfg, n, d, NOUT, B->xe, d, P->Wf, NOUT, P->w, z, NOUT,
                               r));
  keep_rows(B->R, "linear_forward z (exact GEMM)", z, zb, zb);
  keep_rows(B->R, "linear_forward rstd (exact GEMM)", r, ss, ss);
  /* dZ: the first NOUT columns of the INT_GRAD rows */
  TU_OK(rmsnorm_linear_backward(B->c, &B->cfg, n, d, NOUT, B->xe, d, P->ge, P->W, NOUT, P->Wf,
                                NOUT, B->dze, d, dx, d, dg, dW, NOUT, db));
  keep_rows(B->R, "linear_backward dx (exact GEMM)", dx, rb, rb);
  keep_sum(B->R, "linear_backward dweight", dg, d * 4);
  keep_sum(B->R, "linear_backward dW", dW, d * NOUT * as);
  keep_sum(B->R, "linear_backward dbias", db, NOUT * 4);
}

/* The shard steps on two shards, cut 40 columns past the middle (off the
 * blocked sums' grid), the all-reduces done here in shard order. */
static void ops_shard(batch *B) {
  size_t n = B->n, d = B->d, rb = B->rb, ss = B->ss, es = B->es;
  size_t cut = d / 2 + 40, off[2] = {0, cut}, width[2] = {cut, d - cut};
  const float *w = B->P->w, *bias = B->P->w2;
  unsigned char *y = take(B, n * rb), *dx = take(B, n * rb);
  double *p[2], *q[2], *s = take(B, n * 8), *t = take(B, n * 8);
  char name[96];
  for (int k = 0; k < 2; k++) {
    p[k] = take(B, n * 8);
    TU_OK(rmsnorm_shard_stats(B->c, &B->cfg, n, d, off[k], width[k], B->x + off[k] * es, d, p[k]));
    snprintf(name, sizeof name, "shard_stats partial (shard %d)", k);
    keep_rows(B->R, name, p[k], 8, 8);
  }
  for (size_t i = 0; i < n; i++) s[i] = p[0][i] + p[1][i];
  for (int k = 0; k < 2; k++) {
    void *r = take(B, n * ss);
    TU_OK(rmsnorm_shard_forward(B->c, &B->cfg, n, d, off[k], width[k], B->x + off[k] * es, d,
                                w + off[k], bias + off[k], s, y + off[k] * es, d, r));
    snprintf(name, sizeof name, "shard_forward rstd (shard %d)", k);
    keep_rows(B->R, name, r, ss, ss);
  }
  keep_rows(B->R, "shard_forward y", y, rb, rb);
  for (int k = 0; k < 2; k++) {
    q[k] = take(B, n * 8);
    TU_OK(rmsnorm_shard_backward_dots(B->c, &B->cfg, n, d, off[k], width[k], B->x + off[k] * es,
                                      d, B->dy + off[k] * es, d, w + off[k], s, q[k]));
    snprintf(name, sizeof name, "shard_backward_dots partial (shard %d)", k);
    keep_rows(B->R, name, q[k], 8, 8);
  }
  for (size_t i = 0; i < n; i++) t[i] = q[0][i] + q[1][i];
  for (int k = 0; k < 2; k++) {
    float *dw = take(B, width[k] * 4), *db = take(B, width[k] * 4);
    TU_OK(rmsnorm_shard_backward(B->c, &B->cfg, n, d, off[k], width[k], B->x + off[k] * es, d,
                                 B->dy + off[k] * es, d, w + off[k], s, t, dx + off[k] * es, d,
                                 dw, db));
    snprintf(name, sizeof name, "shard_backward dweight (shard %d)", k);
    keep_sum(B->R, name, dw, width[k] * 4);
    snprintf(name, sizeof name, "shard_backward dbias (shard %d)", k);
    keep_sum(B->R, name, db, width[k] * 4);
  }
  keep_rows(B->R, "shard_backward dx", dx, rb, rb);
}

/* Gated RMSNorm, z = u: gate first, SiLU, one group (r saved), and norm
 * first, sigmoid, groups of GROUP (r recomputed). */
static void ops_gated(batch *B) {
  static const struct {
    rmsnorm_gate_act act;
    size_t group;
    unsigned flags;
    const char *name;
  } gates[] = {{RMSNORM_GATE_SILU, 0, 0, "gate first"},
               {RMSNORM_GATE_SIGMOID, GROUP, RMSNORM_GATE_NORM_FIRST, "norm first, groups"}};
  size_t n = B->n, d = B->d, rb = B->rb, ss = B->ss;
  void *y = take(B, n * rb), *dx = take(B, n * rb), *dz = take(B, n * rb);
  void *r = take(B, n * (d / GROUP) * ss);
  float *dw = take(B, d * 4);
  for (size_t k = 0; k < sizeof gates / sizeof gates[0]; k++) {
    rmsnorm_gate g;
    rmsnorm_gate_init(&g, gates[k].act);
    g.group = gates[k].group;
    g.flags = gates[k].flags;
    size_t rs = (g.group ? d / g.group : 1) * ss; /* bytes of a row's r */
    char name[96];
    TU_OK(rmsnorm_gated_forward(B->c, &B->cfg, &g, n, d, B->x, d, B->u, d, B->P->w, y, d, r));
    snprintf(name, sizeof name, "gated_forward (%s) y", gates[k].name);
    keep_rows(B->R, name, y, rb, rb);
    snprintf(name, sizeof name, "gated_forward (%s) rstd", gates[k].name);
    keep_rows(B->R, name, r, rs, rs);
    TU_OK(rmsnorm_gated_backward(B->c, &B->cfg, &g, n, d, B->x, d, B->u, d, B->dy, d, B->P->w,
                                 k == 0 ? r : NULL, dx, d, dz, d, dw));
    snprintf(name, sizeof name, "gated_backward (%s) dx", gates[k].name);
    keep_rows(B->R, name, dx, rb, rb);
    snprintf(name, sizeof name, "gated_backward (%s) dz", gates[k].name);
    keep_rows(B->R, name, dz, rb, rb);
    snprintf(name, sizeof name, "gated_backward (%s) dweight", gates[k].name);
    keep_sum(B->R, name, dw, d * 4);
  }
}

/* QK-norm + RoPE: a pool row is one token's d / HEAD_DIM heads at position
 * (and cache slot) its pool index, so a row's rotation never depends on its
 * batch. NeoX over the whole head, token-major, with a KV cache of POOL
 * slots (V from u; r saved in the backward); GPT-J over half the head,
 * head-major (r recomputed). */
static void ops_rope(batch *B) {
  size_t n = B->n, d = B->d, rb = B->rb, ss = B->ss, es = B->es, heads = d / HEAD_DIM;
  size_t as = rn_acc_size(B->cfg.dtype);
  const float *w = B->P->w;
  rmsnorm_dtype tdt = as == 8 ? RMSNORM_F64 : RMSNORM_F32;
  int64_t *pos = take(B, n * sizeof(int64_t));
  for (size_t i = 0; i < n; i++) pos[i] = (int64_t)B->R->idx[i];
  void *table = take(B, POOL * HEAD_DIM * as), *half_table = take(B, POOL * HEAD_DIM / 2 * as);
  TU_OK(rmsnorm_rope_table(table, tdt, POOL, HEAD_DIM, 1e6, 1));
  TU_OK(rmsnorm_rope_table(half_table, tdt, POOL, HEAD_DIM / 2, 1e4, 8));
  void *y = take(B, n * rb), *dx = take(B, n * rb), *r = take(B, n * heads * ss);
  unsigned char *kc = take(B, POOL * rb), *vc = take(B, POOL * rb), *rows = take(B, n * rb);
  float *dw = take(B, HEAD_DIM * 4);
  rmsnorm_rope rope;
  rmsnorm_rope_init(&rope, RMSNORM_ROPE_NEOX);
  rope.cos_sin = table, rope.n_positions = POOL, rope.positions = pos;
  rmsnorm_kv_cache kv;
  rmsnorm_kv_cache_init(&kv);
  kv.k = kc, kv.v = vc, kv.n_slots = POOL, kv.ld_slot = d, kv.ld_head = HEAD_DIM;
  kv.slots = pos, kv.v_src = B->u, kv.ldv_token = d, kv.ldv_head = HEAD_DIM;
  TU_OK(rmsnorm_qk_norm_rope_forward(B->c, &B->cfg, n, heads, HEAD_DIM, B->x, d, HEAD_DIM, w,
                                     &rope, &kv, y, d, HEAD_DIM, r));
  keep_rows(B->R, "qk_norm_rope_forward neox y", y, rb, rb);
  keep_rows(B->R, "qk_norm_rope_forward neox rstd", r, heads * ss, heads * ss);
  for (int c = 0; c < 2; c++) { /* the cache's rows of the batch's slots, in batch order */
    for (size_t i = 0; i < n; i++) memcpy(rows + i * rb, (c ? vc : kc) + B->R->idx[i] * rb, rb);
    keep_rows(B->R, c ? "qk_norm_rope_forward neox V cache" : "qk_norm_rope_forward neox K cache",
              rows, rb, rb);
  }
  TU_OK(rmsnorm_qk_norm_rope_backward(B->c, &B->cfg, n, heads, HEAD_DIM, B->x, d, HEAD_DIM, B->dy,
                                      d, HEAD_DIM, w, &rope, r, dx, d, HEAD_DIM, dw));
  keep_rows(B->R, "qk_norm_rope_backward neox dx", dx, rb, rb);
  keep_sum(B->R, "qk_norm_rope_backward neox dweight", dw, HEAD_DIM * 4);

  /* GPT-J on half the head, head-major */
  unsigned char *xh = take(B, n * rb), *dyh = take(B, n * rb), *oh = take(B, n * rb);
  size_t ld_head = n * HEAD_DIM;
  heads_swap(B->x, xh, n, heads, HEAD_DIM, es, 1);
  heads_swap(B->dy, dyh, n, heads, HEAD_DIM, es, 1);
  rmsnorm_rope_init(&rope, RMSNORM_ROPE_GPTJ);
  rope.rotary_dim = HEAD_DIM / 2;
  rope.cos_sin = half_table, rope.n_positions = POOL, rope.positions = pos;
  TU_OK(rmsnorm_qk_norm_rope_forward(B->c, &B->cfg, n, heads, HEAD_DIM, xh, HEAD_DIM, ld_head, w,
                                     &rope, NULL, oh, HEAD_DIM, ld_head, r));
  heads_swap(oh, y, n, heads, HEAD_DIM, es, 0);
  keep_rows(B->R, "qk_norm_rope_forward gptj half y", y, rb, rb);
  keep_rows(B->R, "qk_norm_rope_forward gptj half rstd", r, heads * ss, heads * ss);
  TU_OK(rmsnorm_qk_norm_rope_backward(B->c, &B->cfg, n, heads, HEAD_DIM, xh, HEAD_DIM, ld_head,
                                      dyh, HEAD_DIM, ld_head, w, &rope, NULL, oh, HEAD_DIM,
                                      ld_head, dw));
  heads_swap(oh, dx, n, heads, HEAD_DIM, es, 0);
  keep_rows(B->R, "qk_norm_rope_backward gptj half dx", dx, rb, rb);
  keep_sum(B->R, "qk_norm_rope_backward gptj half dweight", dw, HEAD_DIM * 4);

  /* one statistic per token over its heads (OLMo 2), the weight of the whole
   * row: NeoX token-major (r saved), GPT-J head-major (r recomputed) */
  float *dwt = take(B, d * 4);
  rmsnorm_rope_init(&rope, RMSNORM_ROPE_NEOX);
  rope.norm = RMSNORM_ROPE_NORM_TOKEN;
  rope.cos_sin = table, rope.n_positions = POOL, rope.positions = pos;
  TU_OK(rmsnorm_qk_norm_rope_forward(B->c, &B->cfg, n, heads, HEAD_DIM, B->x, d, HEAD_DIM, w,
                                     &rope, NULL, y, d, HEAD_DIM, r));
  keep_rows(B->R, "qk_norm_rope_forward per token y", y, rb, rb);
  keep_rows(B->R, "qk_norm_rope_forward per token rstd", r, ss, ss);
  TU_OK(rmsnorm_qk_norm_rope_backward(B->c, &B->cfg, n, heads, HEAD_DIM, B->x, d, HEAD_DIM, B->dy,
                                      d, HEAD_DIM, w, &rope, r, dx, d, HEAD_DIM, dwt));
  keep_rows(B->R, "qk_norm_rope_backward per token dx", dx, rb, rb);
  keep_sum(B->R, "qk_norm_rope_backward per token dweight", dwt, d * 4);
  rope.style = RMSNORM_ROPE_GPTJ;
  TU_OK(rmsnorm_qk_norm_rope_forward(B->c, &B->cfg, n, heads, HEAD_DIM, xh, HEAD_DIM, ld_head, w,
                                     &rope, NULL, oh, HEAD_DIM, ld_head, r));
  heads_swap(oh, y, n, heads, HEAD_DIM, es, 0);
  keep_rows(B->R, "qk_norm_rope_forward per token gptj y", y, rb, rb);
  TU_OK(rmsnorm_qk_norm_rope_backward(B->c, &B->cfg, n, heads, HEAD_DIM, xh, HEAD_DIM, ld_head,
                                      dyh, HEAD_DIM, ld_head, w, &rope, NULL, oh, HEAD_DIM,
                                      ld_head, dwt));
  heads_swap(oh, dx, n, heads, HEAD_DIM, es, 0);
  keep_rows(B->R, "qk_norm_rope_backward per token gptj dx", dx, rb, rb);
  keep_sum(B->R, "qk_norm_rope_backward per token gptj dweight", dwt, d * 4);
}

/* Gemma's sandwich norms (weight offset): a = u, h = x; the backward with
 * dh_out = v and r saved, then without dh_out and r recomputed. */
static void ops_sandwich(batch *B) {
  size_t n = B->n, d = B->d, rb = B->rb, ss = B->ss;
  rmsnorm_config cfg = B->cfg;
  cfg.flags |= RMSNORM_FLAG_WEIGHT_OFFSET;
  const float *wpost = B->P->w, *wpre = B->P->w2;
  unsigned char *h = copy_of(B, B->x);
  void *xn = take(B, n * rb), *rpost = take(B, n * ss), *rpre = take(B, n * ss);
  void *da = take(B, n * rb), *dh = take(B, n * rb);
  float *dwpost = take(B, d * 4), *dwpre = take(B, d * 4);
  TU_OK(rmsnorm_sandwich_forward(B->c, &cfg, n, d, B->u, d, h, d, wpost, wpre, xn, d, rpost,
                                 rpre));
  keep_rows(B->R, "sandwich_forward h'", h, rb, rb);
  keep_rows(B->R, "sandwich_forward x'", xn, rb, rb);
  keep_rows(B->R, "sandwich_forward rstd_post", rpost, ss, ss);
  keep_rows(B->R, "sandwich_forward rstd_pre", rpre, ss, ss);
  TU_OK(rmsnorm_sandwich_backward(B->c, &cfg, n, d, B->u, d, h, d, B->v, d, B->dy, d, wpost,
                                  wpre, rpost, rpre, da, d, dh, d, dwpost, dwpre));
  keep_rows(B->R, "sandwich_backward da (dh_out, r saved)", da, rb, rb);
  keep_rows(B->R, "sandwich_backward dh (dh_out, r saved)", dh, rb, rb);
  keep_sum(B->R, "sandwich_backward dweight_post", dwpost, d * 4);
  keep_sum(B->R, "sandwich_backward dweight_pre", dwpre, d * 4);
  TU_OK(rmsnorm_sandwich_backward(B->c, &cfg, n, d, B->u, d, h, d, NULL, d, B->dy, d, wpost,
                                  wpre, NULL, NULL, da, d, dh, d, NULL, NULL));
  keep_rows(B->R, "sandwich_backward da (no dh_out, r recomputed)", da, rb, rb);
  keep_rows(B->R, "sandwich_backward dh (no dh_out, r recomputed)", dh, rb, rb);
}

/* The rows idx[0..n) of the pool as one batch through every op. */
static void run_batch(rmsnorm_context *c, const pool *P, const size_t *idx, size_t n,
                      recorder *R, arena *A) {
  /* streams: the family writes outputs with streaming stores (runtime/work.h)
   * where they are large, which only the largest shape's batches reach */
  static const struct {
    void (*run)(batch *);
    int streams;
  } families[] = {{ops_norm, 1},   {ops_add, 1},   {ops_quant, 1}, {ops_qk, 1},
                  {ops_linear, 0}, {ops_shard, 1}, {ops_gated, 0}, {ops_sandwich, 1},
                  {ops_rope, 0}};
  batch B = {.c = c, .P = P, .R = R, .A = A, .n = n, .d = P->d, .es = P->es, .rb = P->rb,
             .ss = P->ss};
  A->pattern++;
  if (rmsnorm_config_init(&B.cfg, P->dt) != RMSNORM_OK) return;
  B.cfg.param_dtype = RMSNORM_F32;
  unsigned char **in[] = {&B.x, &B.dy, &B.u, &B.v, &B.xe, &B.dze};
  const unsigned char *from[] = {P->x, P->dy, P->u, P->v, P->xe, P->dze};
  for (size_t a = 0; a < sizeof in / sizeof in[0]; a++) {
    *in[a] = take(&B, n * P->rb);
    for (size_t i = 0; i < n; i++) memcpy(*in[a] + i * P->rb, from[a] + idx[i] * P->rb, P->rb);
  }
  R->idx = idx;
  R->n = n;
  for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
    if (!P->streaming || families[f].streams) families[f].run(&B);
}

/* ---- the pool, and the batches made of it --------------------------------- */

static void pool_make(pool *P, rmsnorm_dtype dt, const values *V, int streaming) {
  size_t d = V->d;
  memset(P, 0, sizeof *P);
  P->dt = dt;
  P->streaming = streaming;
  P->d = d;
  P->es = rn_dtype_size(dt);
  P->rb = d * P->es;
  P->ss = rn_acc_size(dt);
  unsigned char **rows[NKINDS] = {&P->x, &P->dy, &P->u, &P->v, &P->xe, &P->dze};
  for (int a = 0; a < NKINDS; a++) {
    *rows[a] = malloc(POOL * P->rb);
    for (size_t i = 0; i < POOL * d; i++) rn_store(*rows[a], dt, i, V->rows[a][i]);
  }
  P->w = V->w, P->w2 = V->w2, P->ge = V->ge;
  if (rmsnorm_linear_available() != RMSNORM_OK) return;
  size_t as = rn_acc_size(dt);
  P->W = malloc(d * NOUT * as), P->Wf = malloc(d * NOUT * as);
  for (size_t i = 0; i < d * NOUT; i++) rn_store_acc(P->W, as == 8, i, V->W[i]);
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = RMSNORM_F32;
  tu_check(rmsnorm_fold_weight(&cfg, d, NOUT, P->ge, P->W, NOUT, P->Wf, NOUT) == RMSNORM_OK,
           "rmsnorm_fold_weight failed");
}

static void pool_free(pool *P) {
  free(P->x), free(P->dy), free(P->u), free(P->v), free(P->xe), free(P->dze);
  free(P->W), free(P->Wf);
}

/* streaming: the largest shape, there for the sizes of its batches'
 * outputs (cached, streamed, streamed from DRAM: runtime/work.h). It runs
 * the families with streaming stores only (not linear, gated, rope), leaves out
 * the pool reversed (the same sizes as the pool), and runs the scalar set on
 * one thread only: its kernels have no streaming stores, and the split
 * across threads is the same code for every set (the SIMD sets run it on
 * 1..3 threads there). */
static void check_shape(rmsnorm_dtype dt, const values *V, int streaming) {
  size_t d = V->d;
  pool P;
  pool_make(&P, dt, V, streaming);
  recorder *R = calloc(1, sizeof *R);
  arena *A = calloc(1, sizeof *A);
  rmsnorm_context *c;
  TU_OK(rmsnorm_context_create(&c));
  TU_OK(rmsnorm_context_set_isa(c, RMSNORM_ISA_SCALAR));
  TU_OK(rmsnorm_context_set_threads(c, 1));
  R->mode = ALONE;
  for (size_t r = 0; r < POOL; r++) run_batch(c, &P, &r, 1, R, A);

  static const rmsnorm_isa isas[] = {RMSNORM_ISA_SCALAR, RMSNORM_ISA_AVX2, RMSNORM_ISA_AVX512,
                                     RMSNORM_ISA_NEON};
  for (int arrangement = 0; arrangement < 5; arrangement++) {
    static const size_t sizes[] = {POOL, POOL, 1, 7, 33};
    if (streaming && arrangement == 1) continue; /* the whole pool's sizes again */
    size_t n = sizes[arrangement], idx[POOL];
    for (size_t i = 0; i < POOL; i++) idx[i] = arrangement == 1 ? POOL - 1 - i : i;
    if (arrangement >= 2) /* a shuffled subset */
      for (size_t i = POOL - 1; i > 0; i--) {
        size_t k = tu_next() % (i + 1), t = idx[i];
        idx[i] = idx[k], idx[k] = t;
      }
    /* the first run, scalar with one thread, is the reference of the sums */
    R->mode = SUMS;
    for (size_t s = 0; s < sizeof isas / sizeof isas[0]; s++) {
      if (rmsnorm_context_set_isa(c, isas[s]) != RMSNORM_OK) continue; /* not on this CPU */
      int most = streaming && isas[s] == RMSNORM_ISA_SCALAR ? 1 : 3;
      for (int threads = 1; threads <= most; threads++) {
        TU_OK(rmsnorm_context_set_threads(c, threads));
        snprintf(R->where, sizeof R->where, "%s d=%zu set %s threads %d", tu_dtype_name(dt), d,
                 rmsnorm_isa_name(isas[s]), threads);
        run_batch(c, &P, idx, n, R, A);
        R->mode = CHECK;
      }
    }
  }
  rmsnorm_context_free(c);
  for (size_t k = 0; k < SLOTS; k++) free(A->p[k]);
  free(A), free(R);
  pool_free(&P);
}

int main(void) {
  /* 32768: the whole pool's outputs pass the streaming thresholds (runtime/work.h),
   * its rows alone do not. Every d is a multiple of HEAD_DIM and GROUP. */
  static const size_t ds[] = {256, 4096, 5120, 32768};
  /* reduced (qemu, sanitizers): the two smallest shapes: the big ones take minutes there */
  size_t nd = tu_reduced() ? 2 : sizeof ds / sizeof ds[0];
  for (size_t i = 0; i < nd; i++) {
    static const rmsnorm_dtype dts[] = {RMSNORM_F32, RMSNORM_F16, RMSNORM_BF16, RMSNORM_F64};
    values V;
    values_make(&V, ds[i]);
    for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++)
      check_shape(dts[t], &V, ds[i] == 32768);
    values_free(&V);
  }
  return tu_finish("batch_invariance");
}
