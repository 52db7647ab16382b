/* test_quantized.c - rmsnorm_forward_quantized and rmsnorm_add_forward_quantized
 * (the block and per-group formats, float and E8M0 scales): every kernel
 * set and thread count gives the scalar reference's bytes; the bytes are the
 * reference encoders' (ref/blocks_ref.c, held to gguf-py and numpy by the
 * blocks-oracle test) of the fp32 forward's y; chosen y rows (ties, powers
 * of two, subnormal and zero blocks, zero rows, both signs of a block's
 * max, NaN/Inf) fed through the weight; a non-finite weight or bias at each
 * position of short rows; rescue rows; strides and gaps; the fused add; the
 * error statuses, with nothing written. */
#include <float.h>

#include "numerics/blocks.h"
#include "testutil.h"

static const rmsnorm_isa isas[] = {RMSNORM_ISA_SCALAR, RMSNORM_ISA_AVX2, RMSNORM_ISA_AVX512,
                                   RMSNORM_ISA_NEON};
#define NISAS (sizeof isas / sizeof isas[0])

typedef struct fmt {
  const char *name;
  rmsnorm_qformat format;
  size_t group;
  unsigned flags;
} fmt;

static const fmt fmts[] = {
    {"q8_0", RMSNORM_QF_Q8_0, 0, 0},
    {"q8_1", RMSNORM_QF_Q8_1, 0, 0},
    {"q8_k", RMSNORM_QF_Q8_K, 0, 0},
    {"mxfp4", RMSNORM_QF_MXFP4, 0, 0},
    {"mxfp8", RMSNORM_QF_MXFP8_E4M3, 0, 0},
    {"int8/32", RMSNORM_QF_INT8, 32, 0},
    {"int8/64 pow2", RMSNORM_QF_INT8, 64, RMSNORM_QUANT_SCALE_POW2},
    {"e4m3/128", RMSNORM_QF_FP8_E4M3, 128, 0},
    {"e4m3/32 pow2", RMSNORM_QF_FP8_E4M3, 32, RMSNORM_QUANT_SCALE_POW2},
    {"int8/row pow2", RMSNORM_QF_INT8, 0, RMSNORM_QUANT_SCALE_POW2},
    {"e4m3/row", RMSNORM_QF_FP8_E4M3, 0, 0},
    {"int8/32 e8m0", RMSNORM_QF_INT8, 32, RMSNORM_QUANT_SCALE_E8M0},
    {"e4m3/128 pow2 e8m0", RMSNORM_QF_FP8_E4M3, 128,
     RMSNORM_QUANT_SCALE_POW2 | RMSNORM_QUANT_SCALE_E8M0},
    {"int8/row e8m0", RMSNORM_QF_INT8, 0, RMSNORM_QUANT_SCALE_E8M0},
    {"e4m3/row pow2", RMSNORM_QF_FP8_E4M3, 0, RMSNORM_QUANT_SCALE_POW2},
    /* groups of 256 and 1024: fewer groups than lanes in a batch */
    {"int8/256 pow2", RMSNORM_QF_INT8, 256, RMSNORM_QUANT_SCALE_POW2},
    {"e4m3/1024", RMSNORM_QF_FP8_E4M3, 1024, 0},
    /* a group of 4096: more than a batch holds (its own path) */
    {"int8/4096 pow2", RMSNORM_QF_INT8, 4096, RMSNORM_QUANT_SCALE_POW2},
    {"e4m3/row e8m0", RMSNORM_QF_FP8_E4M3, 0, RMSNORM_QUANT_SCALE_E8M0},
};
#define NFMTS (sizeof fmts / sizeof fmts[0])

static rmsnorm_quant desc_of(const fmt *f) {
  rmsnorm_quant q;
  rmsnorm_quant_init(&q, f->format);
  q.group = f->group;
  q.flags = f->flags;
  return q;
}

/* Bytes of one scale: E8M0 bytes for MXFP8 and with the E8M0 flag, else floats. */
static size_t scale_es_of(const fmt *f) {
  return f->format == RMSNORM_QF_MXFP8_E4M3 || (f->flags & RMSNORM_QUANT_SCALE_E8M0) ? 1 : 4;
}

static int block_of(const fmt *f) {
  return f->format == RMSNORM_QF_Q8_K ? 256 : f->group ? (int)f->group : 32;
}

/* One call's outputs: codes (ldc = row bytes + 3, the gaps checked), scales
 * (lds = row scales + 1) and rstd, as bytes. */
typedef struct out {
  unsigned char *codes, *scales;
  size_t ldc, lds, scale_es, row_bytes, row_scales, codes_bytes, scales_bytes;
  double rstd[64]; /* room for 64 floats or doubles */
} out;

static void out_free(out *o) {
  free(o->codes);
  free(o->scales);
}

/* Runs the call on ctx: plain, or the fused add (h = x - u then h + u). */
static rmsnorm_status run(rmsnorm_context *ctx, const rmsnorm_config *cfg, const fmt *f,
                          const tu_tensor *x, const void *w, int add, out *o) {
  rmsnorm_quant q = desc_of(f);
  size_t rows = x->rows, d = x->d;
  memset(o, 0, sizeof *o);
  if (rmsnorm_quant_row_size(&q, d, &o->row_bytes, &o->row_scales) != RMSNORM_OK)
    return RMSNORM_ERROR_BAD_SIZE;
  o->scale_es = scale_es_of(f);
  o->ldc = o->row_bytes + 3;
  o->lds = o->row_scales + 1;
  o->codes_bytes = rows * o->ldc;
  o->scales_bytes = rows * o->lds * o->scale_es;
  o->codes = malloc(o->codes_bytes);
  o->scales = malloc(o->scales_bytes + 1);
  memset(o->codes, 0xcd, o->codes_bytes);
  memset(o->scales, 0xcd, o->scales_bytes + 1);
  void *sc = o->row_scales ? o->scales : NULL;
  if (!add)
    return rmsnorm_forward_quantized(ctx, cfg, rows, d, x->data, x->ld, w, NULL, &q, o->codes,
                                     o->ldc, sc, o->lds, rows <= 64 ? o->rstd : NULL);
  /* h + u with u = x / 2 and h = x - u (exact for these values in fp32/fp64;
   * for fp16/bf16 the add rounds, and the comparison is against the scalar
   * set's same call) */
  tu_tensor h = tu_alloc(x->dt, rows, d, x->ld), u = tu_alloc(x->dt, rows, d, d);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < d; j++) {
      double v = tu_get(x, i, j);
      tu_set(&u, i, j, v / 2);
      tu_set(&h, i, j, v - tu_get(&u, i, j));
    }
  rmsnorm_status st = rmsnorm_add_forward_quantized(ctx, cfg, rows, d, h.data, h.ld, u.data, d, w,
                                                    NULL, &q, o->codes, o->ldc, sc, o->lds,
                                                    rows <= 64 ? o->rstd : NULL);
  tu_free(&h);
  tu_free(&u);
  return st;
}

static int same(const out *a, const out *b) {
  return !memcmp(a->codes, b->codes, a->codes_bytes) &&
         !memcmp(a->scales, b->scales, a->scales_bytes + 1) &&
         !memcmp(a->rstd, b->rstd, sizeof a->rstd);
}

/* ---- every set and thread count: the scalar reference's bytes ---------- */

static void fill_real(tu_tensor *x, int v) {
  tu_fill_normal(x, 1.0);
  for (size_t i = 0; i < x->rows; i++) {
    if (v & 1) tu_set(x, i, (i * 7) % x->d, 25.0 * (i % 2 ? -1 : 1)); /* an outlier channel */
    if ((v & 2) && x->d >= 64)                                        /* a zero block */
      for (size_t j = 32; j < 64; j++) tu_set(x, i, j, 0.0);
    if ((v & 4) && i % 3 == 1) /* a block of tiny values beside normal ones */
      for (size_t j = 0; j < 32 && j < x->d; j++) tu_set(x, i, j, 1e-30 * tu_normal());
  }
  if (v & 8 && x->rows > 2) { /* rescue rows: NaN, Inf, and an overflowing sum */
    tu_set(x, 0, 1, NAN);
    tu_set(x, 1, 0, INFINITY);
    for (size_t j = 0; j < x->d; j++) tu_set(x, 2, j, x->dt == RMSNORM_F64 ? 1e300 : 6e4);
  }
}

static void test_sets(void) {
  static const size_t ds[] = {32, 64, 256, 512, 768, 4096, 5120};
  static const int threads[] = {1, 2, 3};
  rmsnorm_context *ref, *c;
  if (rmsnorm_context_create(&ref) != RMSNORM_OK || rmsnorm_context_create(&c) != RMSNORM_OK) {
    tu_check(0, "context");
    return;
  }
  rmsnorm_context_set_isa(ref, RMSNORM_ISA_SCALAR);
  rmsnorm_context_set_threads(ref, 1);
  size_t nd = tu_reduced() ? 4 : sizeof ds / sizeof ds[0];
  for (int dt = 0; dt < 4; dt++)
    for (size_t di = 0; di < nd; di++)
      for (size_t fi = 0; fi < NFMTS; fi++) {
        const fmt *f = &fmts[fi];
        size_t d = ds[di];
        if (d % (size_t)block_of(f)) continue;
        size_t rows = d >= 4096 ? 5 : 37;
        for (int v = 0; v < 16; v += tu_reduced() ? 5 : 3) {
          rmsnorm_config cfg;
          rmsnorm_config_init(&cfg, (rmsnorm_dtype)dt);
          cfg.param_dtype = RMSNORM_F32;
          tu_tensor x = tu_alloc(cfg.dtype, rows, d, d + (v & 1));
          tu_seed(1000 * di + 10 * fi + (uint64_t)v);
          fill_real(&x, v);
          float *w = malloc(d * sizeof *w);
          for (size_t j = 0; j < d; j++) w[j] = (float)(0.5 + tu_uniform());
          for (int add = 0; add < 2; add++) {
            out want, got;
            rmsnorm_status st = run(ref, &cfg, f, &x, w, add, &want);
            tu_check(st == RMSNORM_OK, "%s %s d=%zu: status %s", f->name,
                     tu_dtype_name(cfg.dtype), d, rmsnorm_status_name(st));
            for (size_t i = 0; i < NISAS; i++) {
              if (rmsnorm_context_set_isa(c, isas[i]) != RMSNORM_OK) continue;
              for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
                rmsnorm_context_set_threads(c, threads[t]);
                st = run(c, &cfg, f, &x, w, add, &got);
                tu_check(st == RMSNORM_OK && same(&want, &got),
                         "%s %s%s d=%zu v=%d isa %s threads %d: not the reference's bytes",
                         f->name, add ? "add " : "", tu_dtype_name(cfg.dtype), d, v,
                         rmsnorm_isa_name(isas[i]), threads[t]);
                out_free(&got);
              }
            }
            /* the gaps past each row's codes and scales are left as they were */
            int gaps = 1;
            for (size_t r = 0; r < rows; r++) {
              for (size_t b = want.row_bytes; b < want.ldc; b++)
                gaps &= want.codes[r * want.ldc + b] == 0xcd;
              for (size_t b = want.row_scales * want.scale_es; b < want.lds * want.scale_es; b++)
                gaps &= want.scales[r * want.lds * want.scale_es + b] == 0xcd;
            }
            tu_check(gaps, "%s d=%zu: a gap was written", f->name, d);
            out_free(&want);
          }
          free(w);
          tu_free(&x);
        }
      }
  rmsnorm_context_free(ref);
  rmsnorm_context_free(c);
}

/* ---- the bytes are the encoders' of the fp32 forward's y ---------------- */

static void encode_ref(const fmt *f, const float *y, size_t d, unsigned char *codes,
                       unsigned char *scales) {
  switch (f->format) {
    case RMSNORM_QF_Q8_0: rn_ref_q8_0(y, d, codes); break;
    case RMSNORM_QF_Q8_1: rn_ref_q8_1(y, d, codes); break;
    case RMSNORM_QF_Q8_K: rn_ref_q8_k(y, d, codes); break;
    case RMSNORM_QF_MXFP4: rn_ref_mxfp4(y, d, codes); break;
    case RMSNORM_QF_MXFP8_E4M3: rn_ref_mxfp8(y, d, codes, scales); break;
    default:
      rn_ref_group(y, d, f->group ? f->group : d,
                   f->format == RMSNORM_QF_FP8_E4M3 ? RN_GROUP_E4M3 : RN_GROUP_INT8,
                   (f->flags ? RN_GROUP_SCALE_POW2 : 0) |
                       (f->flags & RMSNORM_QUANT_SCALE_E8M0 ? RN_GROUP_SCALE_E8M0 : 0),
                   codes, scales);
  }
}

/* y rows chosen value by value: x = 1 and eps = 0 give r = 1 exactly, so
 * y = w, which the test sets to the values each format treats specially. */
static void chosen_rows(float *w, size_t d, int kind) {
  for (size_t j = 0; j < d; j++) {
    double u = tu_uniform(), n = tu_normal();
    int k = (int)(tu_next() % 280) - 150;
    float v;
    switch (kind) {
      case 0: v = (float)(n * ldexp(1.0, k)); break;                     /* any scale */
      case 1: v = (float)((double)((int)(u * 255) - 127) + 0.5); break;  /* ties of q8 rounding */
      case 2: v = (float)(ldexp(1.0, k / 2) * (1 - u * 0x1p-12)); break; /* just below 2^k */
      case 3: /* MXFP4 midpoints and E2M1/E4M3 values */
        v = (float)(ldexp((double)((int)(u * 25)) / 2 + 0.25 * (j % 2), k % 20) * (n < 0 ? -1 : 1));
        break;
      case 4: v = j % 64 < 32 ? 0.0f : (float)(n * 1e-41); break; /* zero and subnormal blocks */
      case 5: v = u < 0.5 ? 0.0f : -0.0f; break; /* a zero row, zeros of both signs */
      case 6: v = (float)(n * 0x1p-126); break;   /* below 127 * 2^-127: the smallest UE8M0 */
      case 8: v = (float)n; break;                /* both signs of a block's max: below */
      default: /* NaN and Inf here and there */
        v = j % 37 == 5 ? NAN : j % 101 == 7 ? (j % 2 ? INFINITY : -INFINITY) : (float)n;
        break;
    }
    w[j] = v;
  }
  if (kind == 1 && d >= 32) /* amax 127: Q8_0 d = 1, so y itself is rounded */
    for (size_t b = 0; b + 32 <= d; b += 32) w[b + (size_t)(tu_next() % 32)] = (b / 32) % 2 ? 127.0f : -127.0f;
  if (kind == 8) /* +8 and -8 in every 32 values, either first: Q8_K's max is the first */
    for (size_t b = 0; b + 32 <= d; b += 32) {
      size_t i = tu_next() % 32, k = (i + 1 + tu_next() % 31) % 32;
      w[b + i] = 8.0f, w[b + k] = -8.0f;
    }
}

static void test_chosen(void) {
  const size_t d = 1024;
  rmsnorm_context *c;
  if (rmsnorm_context_create(&c) != RMSNORM_OK) return;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  cfg.eps = 0;
  float *x = malloc(d * 4), *w = malloc(d * 4);
  unsigned char *want = malloc(2 * d), *wsc = malloc(d * 4), *got = malloc(2 * d),
                *gsc = malloc(d * 4);
  for (size_t j = 0; j < d; j++) x[j] = 1.0f;
  int rounds = tu_reduced() ? 2 : 40;
  for (size_t fi = 0; fi < NFMTS; fi++)
    for (int kind = 0; kind < 9; kind++)
      for (int r = 0; r < rounds; r++) {
        const fmt *f = &fmts[fi];
        if (d % (size_t)block_of(f)) continue; /* test_sets takes the longer groups */
        tu_seed((uint64_t)(fi * 1000 + kind * 100 + r));
        chosen_rows(w, d, kind);
        rmsnorm_quant q = desc_of(f);
        size_t rb, rs;
        rmsnorm_quant_row_size(&q, d, &rb, &rs);
        encode_ref(f, w, d, want, wsc);
        for (size_t i = 0; i < NISAS; i++) {
          if (rmsnorm_context_set_isa(c, isas[i]) != RMSNORM_OK) continue;
          memset(got, 0, 2 * d);
          memset(gsc, 0, d * 4);
          rmsnorm_status st = rmsnorm_forward_quantized(c, &cfg, 1, d, x, d, w, NULL, &q, got,
                                                        rb, rs ? gsc : NULL, rs, NULL);
          size_t es = scale_es_of(f);
          int ok = st == RMSNORM_OK && !memcmp(got, want, rb) && !memcmp(gsc, wsc, rs * es);
          size_t at = 0;
          while (at < rb && got[at] == want[at]) at++;
          tu_check(ok, "chosen %s kind %d round %d isa %s: byte %zu is %#x, want %#x", f->name,
                   kind, r, rmsnorm_isa_name(isas[i]), at, at < rb ? got[at] : 0,
                   at < rb ? want[at] : 0);
        }
      }
  free(x), free(w), free(want), free(wsc), free(got), free(gsc);
  rmsnorm_context_free(c);
}

/* The fp32 forward's y, encoded by the reference, for real-looking rows. */
static void test_matches_forward(void) {
  const size_t rows = 9, d = 4096;
  rmsnorm_context *c;
  if (rmsnorm_context_create(&c) != RMSNORM_OK) return;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  tu_tensor x = tu_alloc(RMSNORM_F32, rows, d, d);
  tu_seed(7);
  fill_real(&x, 7);
  float *w = malloc(d * 4), *y = malloc(rows * d * 4);
  for (size_t j = 0; j < d; j++) w[j] = (float)(0.2 + tu_uniform());
  TU_OK(rmsnorm_forward(c, &cfg, rows, d, x.data, d, w, NULL, y, d, NULL));
  unsigned char *want = malloc(2 * d), *wsc = malloc(d * 4);
  for (size_t fi = 0; fi < NFMTS; fi++) {
    const fmt *f = &fmts[fi];
    out o;
    TU_OK(run(c, &cfg, f, &x, w, 0, &o));
    int ok = 1;
    for (size_t r = 0; r < rows; r++) {
      encode_ref(f, y + r * d, d, want, wsc);
      ok &= !memcmp(o.codes + r * o.ldc, want, o.row_bytes);
      ok &= !memcmp(o.scales + r * o.lds * o.scale_es, wsc, o.row_scales * o.scale_es);
    }
    tu_check(ok, "%s: not the encoder's bytes of rmsnorm_forward's y", f->name);
    out_free(&o);
  }
  free(w), free(y), free(want), free(wsc);
  tu_free(&x);
  rmsnorm_context_free(c);
}

/* ---- errors: a status, nothing written ---------------------------------- */

static void test_errors(void) {
  rmsnorm_context *c;
  if (rmsnorm_context_create(&c) != RMSNORM_OK) return;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  float x[512], sc[64], one = 1.0f, bad = -1.0f;
  unsigned char codes[1024];
  for (int j = 0; j < 512; j++) x[j] = (float)j;
  rmsnorm_quant q;
  size_t rb = 0, rs = 0;
#define EXPECT(want, call)                                                                  \
  do {                                                                                      \
    memset(codes, 0xcd, sizeof codes);                                                      \
    rmsnorm_status st_ = (call);                                                            \
    int clean_ = 1;                                                                         \
    for (size_t i_ = 0; i_ < sizeof codes; i_++) clean_ &= codes[i_] == 0xcd;              \
    tu_check(st_ == (want) && (st_ == RMSNORM_OK || clean_), "line %d: %s, want %s%s",     \
             __LINE__, rmsnorm_status_name(st_), rmsnorm_status_name(want),                 \
             clean_ ? "" : " (codes written)");                                             \
  } while (0)
  rmsnorm_quant_init(&q, RMSNORM_QF_Q8_0);
  EXPECT(RMSNORM_ERROR_BAD_SIZE, rmsnorm_quant_row_size(&q, 48, &rb, &rs));
  EXPECT(RMSNORM_ERROR_BAD_SIZE, rmsnorm_forward_quantized(c, &cfg, 1, 48, x, 48, NULL, NULL, &q,
                                                           codes, 64, NULL, 0, NULL));
  EXPECT(RMSNORM_OK, rmsnorm_quant_row_size(&q, 64, &rb, &rs));
  tu_check(rb == 68 && rs == 0, "q8_0 row size %zu %zu", rb, rs);
  EXPECT(RMSNORM_ERROR_BAD_STRIDE, rmsnorm_forward_quantized(c, &cfg, 2, 64, x, 64, NULL, NULL,
                                                             &q, codes, 67, NULL, 0, NULL));
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_forward_quantized(c, &cfg, 1, 64, x, 64, NULL, NULL,
                                                               &q, codes, 68, sc, 1, NULL));
  q.flags = RMSNORM_QUANT_SCALE_POW2; /* only the scalar-code formats take it */
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_forward_quantized(c, &cfg, 1, 64, x, 64, NULL, NULL,
                                                               &q, codes, 68, NULL, 0, NULL));
  rmsnorm_quant_init(&q, RMSNORM_QF_Q8_K);
  EXPECT(RMSNORM_ERROR_BAD_SIZE, rmsnorm_forward_quantized(c, &cfg, 1, 128, x, 128, NULL, NULL,
                                                           &q, codes, 1024, NULL, 0, NULL));
  rmsnorm_quant_init(&q, RMSNORM_QF_INT8);
  q.group = 48;
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_forward_quantized(c, &cfg, 1, 96, x, 96, NULL, NULL,
                                                               &q, codes, 96, sc, 3, NULL));
  q.group = 64;
  EXPECT(RMSNORM_ERROR_BAD_SIZE, rmsnorm_forward_quantized(c, &cfg, 1, 96, x, 96, NULL, NULL, &q,
                                                           codes, 96, sc, 2, NULL));
  EXPECT(RMSNORM_ERROR_NULL_POINTER, rmsnorm_forward_quantized(c, &cfg, 1, 128, x, 128, NULL,
                                                               NULL, &q, codes, 128, NULL, 2, NULL));
  EXPECT(RMSNORM_ERROR_BAD_STRIDE, rmsnorm_forward_quantized(c, &cfg, 2, 128, x, 128, NULL, NULL,
                                                             &q, codes, 128, sc, 1, NULL));
  q.static_scale = &one; /* a static scale is one per tensor: not with groups */
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_forward_quantized(c, &cfg, 1, 128, x, 128, NULL,
                                                               NULL, &q, codes, 128, NULL, 0, NULL));
  /* E8M0 scales: one byte per group or row (row_scales and lds count bytes);
   * not with a static scale, nor for a format without a scales choice */
  rmsnorm_quant_init(&q, RMSNORM_QF_INT8);
  q.group = 32;
  q.flags = RMSNORM_QUANT_SCALE_E8M0;
  EXPECT(RMSNORM_OK, rmsnorm_quant_row_size(&q, 128, &rb, &rs));
  tu_check(rb == 128 && rs == 4, "int8/32 e8m0 row size %zu %zu", rb, rs);
  EXPECT(RMSNORM_ERROR_BAD_STRIDE, rmsnorm_forward_quantized(c, &cfg, 2, 128, x, 128, NULL, NULL,
                                                             &q, codes, 128, sc, 3, NULL));
  EXPECT(RMSNORM_OK, rmsnorm_forward_quantized(c, &cfg, 2, 128, x, 128, NULL, NULL, &q, codes,
                                               128, sc, 4, NULL));
  q.group = 0;
  EXPECT(RMSNORM_OK, rmsnorm_quant_row_size(&q, 96, &rb, &rs));
  tu_check(rb == 96 && rs == 1, "int8/row e8m0 row size %zu %zu", rb, rs);
  q.static_scale = &one;
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_forward_quantized(c, &cfg, 1, 128, x, 128, NULL,
                                                               NULL, &q, codes, 128, NULL, 0, NULL));
  q.static_scale = NULL;
  q.flags = 1u << 2; /* no such flag */
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_quant_row_size(&q, 128, &rb, &rs));
  rmsnorm_quant_init(&q, RMSNORM_QF_Q8_1);
  EXPECT(RMSNORM_OK, rmsnorm_quant_row_size(&q, 64, &rb, &rs));
  tu_check(rb == 72 && rs == 0, "q8_1 row size %zu %zu", rb, rs);
  EXPECT(RMSNORM_ERROR_BAD_SIZE, rmsnorm_quant_row_size(&q, 48, &rb, &rs));
  q.flags = RMSNORM_QUANT_SCALE_E8M0;
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_forward_quantized(c, &cfg, 1, 64, x, 64, NULL, NULL,
                                                               &q, codes, 72, NULL, 0, NULL));
  rmsnorm_quant_init(&q, RMSNORM_QF_MXFP8_E4M3);
  q.flags = RMSNORM_QUANT_SCALE_E8M0; /* its scales are E8M0 anyway: the flag is not its */
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_forward_quantized(c, &cfg, 1, 64, x, 64, NULL, NULL,
                                                               &q, codes, 64, sc, 2, NULL));
  rmsnorm_quant_init(&q, RMSNORM_QF_FP8_E4M3);
  q.static_scale = &bad;
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_forward_quantized(c, &cfg, 1, 128, x, 128, NULL,
                                                               NULL, &q, codes, 128, NULL, 0, NULL));
  q.static_scale = &one;
  EXPECT(RMSNORM_OK, rmsnorm_forward_quantized(c, &cfg, 1, 128, x, 128, NULL, NULL, &q, codes,
                                               128, NULL, 0, NULL));
  rmsnorm_quant_init(&q, (rmsnorm_qformat)7);
  EXPECT(RMSNORM_ERROR_BAD_ARGUMENT, rmsnorm_forward_quantized(c, &cfg, 1, 128, x, 128, NULL,
                                                               NULL, &q, codes, 1024, NULL, 0, NULL));
  rmsnorm_quant_init(&q, RMSNORM_QF_MXFP4);
  q.size = 3; /* not filled by rmsnorm_quant_init */
  EXPECT(RMSNORM_ERROR_BAD_CONFIG, rmsnorm_forward_quantized(c, &cfg, 1, 128, x, 128, NULL, NULL,
                                                             &q, codes, 1024, NULL, 0, NULL));
  EXPECT(RMSNORM_ERROR_NULL_POINTER, rmsnorm_forward_quantized(c, &cfg, 1, 128, x, 128, NULL,
                                                               NULL, NULL, codes, 1024, NULL, 0,
                                                               NULL));
  /* a larger (newer) descriptor: accepted when its extra bytes are zero */
  struct {
    rmsnorm_quant q;
    unsigned char more[16];
  } big;
  memset(&big, 0, sizeof big);
  rmsnorm_quant_init(&big.q, RMSNORM_QF_MXFP4);
  big.q.size = sizeof big;
  EXPECT(RMSNORM_OK, rmsnorm_forward_quantized(c, &cfg, 1, 128, x, 128, NULL, NULL, &big.q,
                                               codes, 1024, NULL, 0, NULL));
  big.more[3] = 1;
  EXPECT(RMSNORM_ERROR_BAD_CONFIG, rmsnorm_forward_quantized(c, &cfg, 1, 128, x, 128, NULL, NULL,
                                                             &big.q, codes, 1024, NULL, 0, NULL));
  /* the codes may not overlap the input */
  rmsnorm_quant_init(&q, RMSNORM_QF_MXFP4);
  EXPECT(RMSNORM_ERROR_OVERLAP, rmsnorm_forward_quantized(c, &cfg, 1, 128, x, 128, NULL, NULL, &q,
                                                          (unsigned char *)x + 8, 68, NULL, 0,
                                                          NULL));
  float h[128];
  memcpy(h, x, sizeof h);
  EXPECT(RMSNORM_ERROR_NULL_POINTER, rmsnorm_add_forward_quantized(c, &cfg, 1, 128, h, 128, NULL,
                                                                   128, NULL, NULL, &q, codes, 68,
                                                                   NULL, 0, NULL));
  tu_check(!memcmp(h, x, sizeof h), "add: h written on an error");
  cfg.flags = RMSNORM_FLAG_ACCUMULATE;
  EXPECT(RMSNORM_ERROR_BAD_FLAGS, rmsnorm_forward_quantized(c, &cfg, 1, 128, x, 128, NULL, NULL,
                                                            &q, codes, 68, NULL, 0, NULL));
#undef EXPECT
  rmsnorm_context_free(c);
}

/* A weight or bias that is not finite at one position j (x_j = 0 there, so
 * y_j = 0 * inf is a NaN): the call must find it, wherever it lies in the
 * vectors of its finiteness test or past them, for the row's NaN rule to
 * hold. Every set against the scalar set, per-row formats at every d up to
 * 40 and around 64 and 128, Q8_0 at 32 to 96. */
static void test_nonfinite_params(void) {
  static const size_t ds[] = {1,  2,  3,  7,  8,  9,  15, 16, 17, 23, 24, 25, 31, 32,
                              33, 39, 40, 63, 64, 65, 96, 127, 128, 129};
  static const fmt per_row[] = {{"int8/row", RMSNORM_QF_INT8, 0, 0},
                                {"e4m3/row", RMSNORM_QF_FP8_E4M3, 0, 0},
                                {"q8_0", RMSNORM_QF_Q8_0, 0, 0}};
  rmsnorm_context *c;
  if (rmsnorm_context_create(&c) != RMSNORM_OK) return;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  float x[129], w[129], b[129], sc[8], want_sc[8];
  unsigned char got[160], want[160];
  for (size_t di = 0; di < sizeof ds / sizeof *ds; di++)
    for (size_t fi = 0; fi < 3; fi++) {
      size_t d = ds[di];
      const fmt *f = &per_row[fi];
      if (f->format == RMSNORM_QF_Q8_0 && d % 32) continue;
      rmsnorm_quant q = desc_of(f);
      size_t rb, rs;
      rmsnorm_quant_row_size(&q, d, &rb, &rs);
      for (size_t j = 0; j < d; j++)
        for (int bias = 0; bias < 2; bias++) {
          for (size_t k = 0; k < d; k++) x[k] = 1.0f, w[k] = 1.0f + 0.01f * (float)k, b[k] = 0.5f;
          x[j] = 0.0f;
          (bias ? b : w)[j] = j % 2 ? INFINITY : NAN;
          const float *bp = bias ? b : NULL;
          int ok = rmsnorm_context_set_isa(c, RMSNORM_ISA_SCALAR) == RMSNORM_OK &&
                   rmsnorm_forward_quantized(c, &cfg, 1, d, x, d, w, bp, &q, want, rb,
                                             rs ? want_sc : NULL, rs, NULL) == RMSNORM_OK;
          for (size_t i = 1; ok && i < NISAS; i++) {
            if (rmsnorm_context_set_isa(c, isas[i]) != RMSNORM_OK) continue;
            memset(got, 0xee, sizeof got);
            memset(sc, 0xee, sizeof sc);
            rmsnorm_status st = rmsnorm_forward_quantized(c, &cfg, 1, d, x, d, w, bp, &q, got, rb,
                                                          rs ? sc : NULL, rs, NULL);
            tu_check(st == RMSNORM_OK && !memcmp(got, want, rb) && !memcmp(sc, want_sc, rs * 4),
                     "%s d=%zu: a %s %s at %zu not found on %s", f->name, d,
                     j % 2 ? "inf" : "NaN", bias ? "bias" : "weight", j,
                     rmsnorm_isa_name(isas[i]));
          }
          tu_check(ok, "%s d=%zu: the scalar call failed", f->name, d);
        }
    }
  rmsnorm_context_free(c);
}

int main(void) {
  test_errors();
  test_matches_forward();
  test_chosen();
  test_nonfinite_params();
  test_sets();
  return tu_finish("test_quantized");
}
