/* test_batch_invariance.c - a row's outputs do not depend on its batch: the
 * bits of y, rstd, dx and the Q8_0 codes of each row are the same whatever
 * the number of rows in the call, the row's position among them, the thread
 * count and the kernel set. The reference is each row alone, scalar, one
 * thread; batches are the whole pool, the pool reversed, and shuffled subsets
 * of 1, 7 and 33 rows; rows are real-looking (an outlier channel, a quiet row,
 * ties). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define POOL 48

typedef struct outs {
  unsigned char *y, *dx, *q; /* POOL rows each */
  float *rstd;
} outs;

static size_t es_of(rmsnorm_dtype dt) { return dt == RMSNORM_F32 ? 4 : 2; }

/* x, dy rows of the pool in dtype dt */
static void fill(rmsnorm_dtype dt, size_t d, unsigned char *x, unsigned char *dy) {
  for (size_t r = 0; r < POOL; r++)
    for (size_t j = 0; j < d; j++) {
      float v = (float)tu_normal(), g = (float)tu_normal();
      if (j == 5) v *= 25;           /* an outlier channel */
      if (r % 11 == 3) v *= 1e-3f;   /* a quiet row */
      if (r % 13 == 4 && j % 3 == 0) v = 0.5f; /* ties */
      size_t at = (r * d + j) * es_of(dt);
      if (dt == RMSNORM_F32) {
        memcpy(x + at, &v, 4), memcpy(dy + at, &g, 4);
      } else {
        uint32_t a, b;
        memcpy(&a, &v, 4), memcpy(&b, &g, 4);
        uint16_t ha = (uint16_t)(a >> 16), hb = (uint16_t)(b >> 16);
        memcpy(x + at, &ha, 2), memcpy(dy + at, &hb, 2);
      }
    }
}

/* The rows idx[0..n) of the pool as one batch through every op; each row's
 * outputs are written to its pool slot in o. */
static void run_batch(rmsnorm_context *c, rmsnorm_dtype dt, size_t d, const float *w,
                      const unsigned char *x, const unsigned char *dy, const size_t *idx,
                      size_t n, size_t qbytes, outs *o) {
  size_t es = es_of(dt), rb = d * es;
  unsigned char *bx = malloc(n * rb), *bdy = malloc(n * rb), *by = malloc(n * rb);
  unsigned char *bdx = malloc(n * rb), *bq = malloc(n * qbytes);
  float *br = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    memcpy(bx + i * rb, x + idx[i] * rb, rb);
    memcpy(bdy + i * rb, dy + idx[i] * rb, rb);
  }
  rmsnorm_config cfg;
  TU_OK(rmsnorm_config_init(&cfg, dt));
  cfg.param_dtype = RMSNORM_F32;
  rmsnorm_quant q;
  rmsnorm_quant_init(&q, RMSNORM_QF_Q8_0);
  TU_OK(rmsnorm_forward(c, &cfg, n, d, bx, d, w, NULL, by, d, br));
  TU_OK(rmsnorm_backward(c, &cfg, n, d, bx, d, bdy, d, w, NULL, bdx, d, NULL, NULL));
  TU_OK(rmsnorm_forward_quantized(c, &cfg, n, d, bx, d, w, NULL, &q, bq, qbytes, NULL, 0, NULL));
  for (size_t i = 0; i < n; i++) {
    memcpy(o->y + idx[i] * rb, by + i * rb, rb);
    memcpy(o->dx + idx[i] * rb, bdx + i * rb, rb);
    memcpy(o->q + idx[i] * qbytes, bq + i * qbytes, qbytes);
    o->rstd[idx[i]] = br[i];
  }
  free(bx), free(bdy), free(by), free(bdx), free(bq), free(br);
}

static outs outs_alloc(size_t rb, size_t qbytes) {
  outs o = {calloc(POOL, rb), calloc(POOL, rb), calloc(POOL, qbytes), calloc(POOL, sizeof(float))};
  return o;
}

static void outs_free(outs *o) { free(o->y), free(o->dx), free(o->q), free(o->rstd); }

static void check_shape(rmsnorm_dtype dt, size_t d) {
  size_t es = es_of(dt), rb = d * es, qbytes, qs;
  rmsnorm_quant q;
  rmsnorm_quant_init(&q, RMSNORM_QF_Q8_0);
  TU_OK(rmsnorm_quant_row_size(&q, d, &qbytes, &qs));
  unsigned char *x = malloc(POOL * rb), *dy = malloc(POOL * rb);
  float *w = malloc(d * sizeof(float));
  fill(dt, d, x, dy);
  for (size_t j = 0; j < d; j++) w[j] = 1.0f + 0.25f * (float)tu_normal();

  rmsnorm_context *c;
  TU_OK(rmsnorm_context_create(&c));
  TU_OK(rmsnorm_context_set_isa(c, RMSNORM_ISA_SCALAR));
  TU_OK(rmsnorm_context_set_threads(c, 1));
  outs want = outs_alloc(rb, qbytes);
  for (size_t r = 0; r < POOL; r++) run_batch(c, dt, d, w, x, dy, &r, 1, qbytes, &want);

  static const rmsnorm_isa isas[] = {RMSNORM_ISA_SCALAR, RMSNORM_ISA_AVX2, RMSNORM_ISA_AVX512,
                                     RMSNORM_ISA_NEON};
  for (size_t s = 0; s < sizeof isas / sizeof isas[0]; s++) {
    if (rmsnorm_context_set_isa(c, isas[s]) != RMSNORM_OK) continue; /* not on this CPU */
    for (int threads = 1; threads <= 3; threads++) {
      TU_OK(rmsnorm_context_set_threads(c, threads));
      size_t idx[POOL];
      for (int arrangement = 0; arrangement < 5; arrangement++) {
        static const size_t sizes[] = {POOL, POOL, 1, 7, 33};
        size_t n = sizes[arrangement];
        for (size_t i = 0; i < POOL; i++) idx[i] = arrangement == 1 ? POOL - 1 - i : i;
        if (arrangement >= 2) /* a shuffled subset */
          for (size_t i = POOL - 1; i > 0; i--) {
            size_t k = tu_next() % (i + 1), t = idx[i];
            idx[i] = idx[k], idx[k] = t;
          }
        outs got = outs_alloc(rb, qbytes);
        run_batch(c, dt, d, w, x, dy, idx, n, qbytes, &got);
        for (size_t i = 0; i < n; i++) {
          size_t r = idx[i];
          int same = !memcmp(got.y + r * rb, want.y + r * rb, rb) &&
                     !memcmp(got.dx + r * rb, want.dx + r * rb, rb) &&
                     !memcmp(got.q + r * qbytes, want.q + r * qbytes, qbytes) &&
                     !memcmp(&got.rstd[r], &want.rstd[r], sizeof(float));
          tu_check(same, "%s d=%zu set %s threads %d: row %zu at %zu of %zu differs",
                   tu_dtype_name(dt), d, rmsnorm_isa_name(isas[s]), threads, r, i, n);
        }
        outs_free(&got);
      }
    }
  }
  outs_free(&want);
  rmsnorm_context_free(c);
  free(x), free(dy), free(w);
}

int main(void) {
  static const size_t ds[] = {32, 128, 4096, 5120};
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
    check_shape(RMSNORM_F32, ds[i]);
    check_shape(RMSNORM_BF16, ds[i]);
  }
  return tu_finish("batch_invariance");
}
