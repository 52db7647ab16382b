/* test_batch_invariance.c - a row's outputs do not depend on its batch: the
 * bits of each row's (fp32, fp16, bf16, fp64) RMSNorm y and rstd, dx, LayerNorm y, mean and rstd, the
 * fused add's h' and y and rstd, and every quantized format's codes and
 * scales are the same whatever the number of rows in the call, the row's
 * position among them, the thread count and the kernel set. The reference is
 * each row alone, scalar, one thread; batches are the whole pool, the pool
 * reversed, and shuffled subsets of 1, 7 and 33 rows; rows are real-looking
 * (an outlier channel, a quiet row, ties). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/convert.h"
#include "testutil.h"

#define POOL 48
#define NFORMATS 6 /* rmsnorm_qformat: INT8 .. MXFP4 */

static size_t es_of(rmsnorm_dtype dt) {
  return dt == RMSNORM_F64 ? 8 : dt == RMSNORM_F32 ? 4 : 2;
}

/* x, dy rows of the pool in dtype dt */
static void fill(rmsnorm_dtype dt, size_t d, unsigned char *x, unsigned char *dy) {
  for (size_t r = 0; r < POOL; r++)
    for (size_t j = 0; j < d; j++) {
      float v = (float)tu_normal(), g = (float)tu_normal();
      if (j == 5) v *= 25;                     /* an outlier channel */
      if (r % 11 == 3) v *= 1e-3f;             /* a quiet row */
      if (r % 13 == 4 && j % 3 == 0) v = 0.5f; /* ties */
      size_t at = (r * d + j) * es_of(dt);
      if (dt == RMSNORM_F64) {
        double a = v, b = g;
        memcpy(x + at, &a, 8), memcpy(dy + at, &b, 8);
      } else if (dt == RMSNORM_F32) {
        memcpy(x + at, &v, 4), memcpy(dy + at, &g, 4);
      } else {
        uint16_t ha = dt == RMSNORM_F16 ? rn_f32_to_f16(v) : rn_f32_to_bf16(v);
        uint16_t hb = dt == RMSNORM_F16 ? rn_f32_to_f16(g) : rn_f32_to_bf16(g);
        memcpy(x + at, &ha, 2), memcpy(dy + at, &hb, 2);
      }
    }
}

/* The bytes of one row's outputs: a record of every op's outputs in turn. */
typedef struct layout {
  size_t rb;                                 /* bytes of a row of the dtype */
  size_t qbytes[NFORMATS], qscales[NFORMATS]; /* codes' bytes, scales per row */
  size_t record;
} layout;

static size_t scale_bytes(int f, size_t scales) {
  return f == RMSNORM_QF_MXFP8_E4M3 ? scales : scales * sizeof(float); /* E8M0 or float */
}

static void put(unsigned char *rec, size_t *at, const void *p, size_t n) {
  memcpy(rec + *at, p, n);
  *at += n;
}

/* The rows idx[0..n) of the pool as one batch through every op; each row's
 * record goes to its pool slot in out. */
static void run_batch(rmsnorm_context *c, rmsnorm_dtype dt, size_t d, const float *w,
                      const unsigned char *x, const unsigned char *dy, const size_t *idx,
                      size_t n, const layout *L, unsigned char *out) {
  size_t rb = L->rb;
  unsigned char *bx = malloc(n * rb), *bdy = malloc(n * rb), *by = malloc(n * rb);
  unsigned char *bdx = malloc(n * rb), *bln = malloc(n * rb), *bh = malloc(n * rb);
  unsigned char *bay = malloc(n * rb), *bq[NFORMATS], *bs[NFORMATS];
  /* rstd, LN mean, LN rstd, the add's rstd: float, double for fp64 data */
  size_t ss = dt == RMSNORM_F64 ? 8 : 4;
  unsigned char *st = malloc(4 * n * ss);
  for (size_t i = 0; i < n; i++) {
    memcpy(bx + i * rb, x + idx[i] * rb, rb);
    memcpy(bdy + i * rb, dy + idx[i] * rb, rb);
  }
  memcpy(bh, bx, n * rb);
  rmsnorm_config cfg;
  TU_OK(rmsnorm_config_init(&cfg, dt));
  cfg.param_dtype = RMSNORM_F32;
  TU_OK(rmsnorm_forward(c, &cfg, n, d, bx, d, w, NULL, by, d, st));
  TU_OK(rmsnorm_backward(c, &cfg, n, d, bx, d, bdy, d, w, NULL, bdx, d, NULL, NULL));
  TU_OK(rmsnorm_layernorm_forward(c, &cfg, n, d, bx, d, w, w, bln, d, st + n * ss, st + 2 * n * ss));
  TU_OK(rmsnorm_add_forward(c, &cfg, n, d, bh, d, bdy, d, w, NULL, bay, d, st + 3 * n * ss));
  for (int f = 0; f < NFORMATS; f++) {
    rmsnorm_quant q;
    rmsnorm_quant_init(&q, (rmsnorm_qformat)f);
    size_t lds = L->qscales[f];
    bq[f] = malloc(n * L->qbytes[f]);
    bs[f] = malloc(n * scale_bytes(f, lds) + 1);
    TU_OK(rmsnorm_forward_quantized(c, &cfg, n, d, bx, d, w, NULL, &q, bq[f], L->qbytes[f],
                                    lds ? bs[f] : NULL, lds, NULL));
  }
  for (size_t i = 0; i < n; i++) {
    unsigned char *rec = out + idx[i] * L->record;
    size_t at = 0;
    put(rec, &at, by + i * rb, rb);
    put(rec, &at, st + i * ss, ss);
    put(rec, &at, bdx + i * rb, rb);
    put(rec, &at, bln + i * rb, rb);
    put(rec, &at, st + (n + i) * ss, ss);
    put(rec, &at, st + (2 * n + i) * ss, ss);
    put(rec, &at, bh + i * rb, rb);
    put(rec, &at, bay + i * rb, rb);
    put(rec, &at, st + (3 * n + i) * ss, ss);
    for (int f = 0; f < NFORMATS; f++) {
      size_t sb = scale_bytes(f, L->qscales[f]);
      put(rec, &at, bq[f] + i * L->qbytes[f], L->qbytes[f]);
      put(rec, &at, bs[f] + i * sb, sb);
    }
  }
  for (int f = 0; f < NFORMATS; f++) free(bq[f]), free(bs[f]);
  free(bx), free(bdy), free(by), free(bdx), free(bln), free(bh), free(bay), free(st);
}

static void check_shape(rmsnorm_dtype dt, size_t d) {
  layout L = {.rb = d * es_of(dt)};
  L.record = 5 * L.rb + 4 * (size_t)(dt == RMSNORM_F64 ? 8 : 4);
  for (int f = 0; f < NFORMATS; f++) {
    rmsnorm_quant q;
    rmsnorm_quant_init(&q, (rmsnorm_qformat)f);
    TU_OK(rmsnorm_quant_row_size(&q, d, &L.qbytes[f], &L.qscales[f]));
    L.record += L.qbytes[f] + scale_bytes(f, L.qscales[f]);
  }
  unsigned char *x = malloc(POOL * L.rb), *dy = malloc(POOL * L.rb);
  float *w = malloc(d * sizeof(float));
  fill(dt, d, x, dy);
  for (size_t j = 0; j < d; j++) w[j] = 1.0f + 0.25f * (float)tu_normal();

  rmsnorm_context *c;
  TU_OK(rmsnorm_context_create(&c));
  TU_OK(rmsnorm_context_set_isa(c, RMSNORM_ISA_SCALAR));
  TU_OK(rmsnorm_context_set_threads(c, 1));
  unsigned char *want = calloc(POOL, L.record), *got = calloc(POOL, L.record);
  for (size_t r = 0; r < POOL; r++) run_batch(c, dt, d, w, x, dy, &r, 1, &L, want);

  static const rmsnorm_isa isas[] = {RMSNORM_ISA_SCALAR, RMSNORM_ISA_AVX2, RMSNORM_ISA_AVX512,
                                     RMSNORM_ISA_NEON};
  for (size_t s = 0; s < sizeof isas / sizeof isas[0]; s++) {
    if (rmsnorm_context_set_isa(c, isas[s]) != RMSNORM_OK) continue; /* not on this CPU */
    for (int threads = 1; threads <= 3; threads++) {
      TU_OK(rmsnorm_context_set_threads(c, threads));
      for (int arrangement = 0; arrangement < 5; arrangement++) {
        static const size_t sizes[] = {POOL, POOL, 1, 7, 33};
        size_t n = sizes[arrangement], idx[POOL];
        for (size_t i = 0; i < POOL; i++) idx[i] = arrangement == 1 ? POOL - 1 - i : i;
        if (arrangement >= 2) /* a shuffled subset */
          for (size_t i = POOL - 1; i > 0; i--) {
            size_t k = tu_next() % (i + 1), t = idx[i];
            idx[i] = idx[k], idx[k] = t;
          }
        run_batch(c, dt, d, w, x, dy, idx, n, &L, got);
        for (size_t i = 0; i < n; i++) {
          size_t r = idx[i];
          tu_check(!memcmp(got + r * L.record, want + r * L.record, L.record),
                   "%s d=%zu set %s threads %d: row %zu at %zu of %zu differs",
                   tu_dtype_name(dt), d, rmsnorm_isa_name(isas[s]), threads, r, i, n);
        }
      }
    }
  }
  free(want), free(got);
  rmsnorm_context_free(c);
  free(x), free(dy), free(w);
}

int main(void) {
  /* 32768: the whole pool's outputs pass the streaming thresholds (runtime/work.h),
   * its rows alone do not */
  static const size_t ds[] = {256, 4096, 5120, 32768};
  /* under emulation (qemu) the two smallest shapes: the big ones take minutes there */
  size_t nd = tu_emulated() ? 2 : sizeof ds / sizeof ds[0];
  for (size_t i = 0; i < nd; i++) {
    static const rmsnorm_dtype dts[] = {RMSNORM_F32, RMSNORM_F16, RMSNORM_BF16, RMSNORM_F64};
    for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++) check_shape(dts[t], ds[i]);
  }
  return tu_finish("batch_invariance");
}
