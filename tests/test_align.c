/* test_align.c - every operation on buffers that start at any byte address:
 * each buffer (data, weight, bias, statistics, gradients, quantized output
 * and its scales, the linear's matrices) placed at offsets 1..7 from an
 * aligned address, for every dtype and kernel set, gives the bits of the same
 * call on aligned buffers. Run under UBSan (the sanitizer build, which has
 * -fsanitize=alignment), a misaligned typed access aborts the test. Large
 * outputs, which kernels stream past the caches when aligned, are covered
 * too. */
#include "testutil.h"

typedef struct rn_out {
  unsigned char *p;
  size_t n;
} rn_out;

static void put(rn_out *o, const void *p, size_t n) {
  o->p = realloc(o->p, o->n + n);
  if (!o->p) exit(2);
  memcpy(o->p + o->n, p, n);
  o->n += n;
}

/* A buffer of `bytes` at `off` bytes past a 64-byte-aligned address. */
typedef struct mbuf {
  unsigned char *base, *p;
  size_t bytes;
} mbuf;

static mbuf mb_new(size_t bytes, size_t off) {
  mbuf b;
  b.bytes = bytes;
  b.base = aligned_alloc(64, ((bytes + off + 63) / 64) * 64 + 64);
  if (!b.base) exit(2);
  b.p = b.base + off;
  memset(b.p, 0x5c, bytes);
  return b;
}

static mbuf mb_copy(const void *src, size_t bytes, size_t off) {
  mbuf b = mb_new(bytes, off);
  memcpy(b.p, src, bytes);
  return b;
}

static void mb_free(mbuf *b) { free(b->base); }

/* The inputs of one case, aligned, in their storage types. */
typedef struct inputs {
  rmsnorm_dtype dt, pdt;
  size_t rows, d, n, ld; /* rows x d data with row stride ld; n: the linear's width */
  tu_tensor x, dy, u, w, b, W, dz;
} inputs;

static inputs make_inputs(rmsnorm_dtype dt, rmsnorm_dtype pdt, size_t rows, size_t d, size_t n) {
  inputs in = {dt, pdt, rows, d, n, d + 1, {0}, {0}, {0}, {0}, {0}, {0}, {0}};
  rmsnorm_dtype adt = dt == RMSNORM_F64 ? RMSNORM_F64 : RMSNORM_F32;
  in.x = tu_alloc(dt, rows, d, in.ld), in.dy = tu_alloc(dt, rows, d, in.ld);
  in.u = tu_alloc(dt, rows, d, in.ld);
  in.w = tu_alloc(pdt, 1, d, d), in.b = tu_alloc(pdt, 1, d, d);
  in.W = tu_alloc(adt, d, n, n), in.dz = tu_alloc(dt, rows, n, n);
  tu_fill_normal(&in.x, 1.0), tu_fill_normal(&in.dy, 1.0), tu_fill_normal(&in.u, 0.5);
  tu_fill_normal(&in.W, 0.1), tu_fill_normal(&in.dz, 1.0), tu_fill_normal(&in.b, 0.5);
  for (size_t j = 0; j < d; j++) tu_set(&in.w, 0, j, 1 + 0.2 * tu_normal());
  if (rows > 3) /* a row for the rescue path */
    for (size_t j = 0; j < d; j++)
      tu_set(&in.x, 2, j, dt == RMSNORM_F16 ? 3000.0 : dt == RMSNORM_F64 ? 1e200 : 1e30);
  return in;
}

static void free_inputs(inputs *in) {
  tu_free(&in->x), tu_free(&in->dy), tu_free(&in->u), tu_free(&in->w), tu_free(&in->b);
  tu_free(&in->W), tu_free(&in->dz);
}

/* Buffer i of a layout sits at offset off(i): `base` for every buffer, or
 * (mixed) a different offset for each. */
static size_t off_of(size_t base, int mixed, int i) {
  return mixed ? (base + 3 * (size_t)i) % 8 : base;
}

/* Runs every operation with its buffers at the layout's offsets and returns
 * every output, in order. */
static rn_out run_all(rmsnorm_context *c, const inputs *in, size_t off, int mixed) {
  rn_out out = {NULL, 0};
  rmsnorm_dtype dt = in->dt;
  size_t rows = in->rows, d = in->d, n = in->n, ld = in->ld;
  size_t es = rn_dtype_size(dt), as = rn_acc_size(dt), ps = rn_dtype_size(in->pdt);
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = in->pdt;
  cfg.eps = 1e-5;
  int k = 0;
  mbuf x = mb_copy(in->x.data, in->x.bytes, off_of(off, mixed, k++));
  mbuf dy = mb_copy(in->dy.data, in->dy.bytes, off_of(off, mixed, k++));
  mbuf w = mb_copy(in->w.data, in->w.bytes, off_of(off, mixed, k++));
  mbuf b = mb_copy(in->b.data, in->b.bytes, off_of(off, mixed, k++));
  mbuf y = mb_new(rows * d * es, off_of(off, mixed, k++));
  mbuf mean = mb_new(rows * as, off_of(off, mixed, k++));
  mbuf rstd = mb_new(rows * as, off_of(off, mixed, k++));
  mbuf dx = mb_new(rows * ld * es, off_of(off, mixed, k++));
  mbuf dw = mb_new(d * ps, off_of(off, mixed, k++)), db = mb_new(d * ps, off_of(off, mixed, k++));
  rmsnorm_status st;
#define RECORD(call, ...)                                   \
  do {                                                      \
    st = (call);                                            \
    put(&out, &st, sizeof st);                              \
    const mbuf *bufs_[] = {__VA_ARGS__};                    \
    for (size_t i_ = 0; i_ < sizeof bufs_ / sizeof *bufs_; i_++) \
      put(&out, bufs_[i_]->p, bufs_[i_]->bytes);            \
  } while (0)

  for (int ln = 0; ln < 2; ln++) {
    rmsnorm_config f = cfg;
    if (!ln) f.flags = RMSNORM_FLAG_WEIGHT_OFFSET, f.partial = 0.75;
    RECORD(ln ? rmsnorm_layernorm_forward(c, &f, rows, d, x.p, ld, w.p, b.p, y.p, d, mean.p, rstd.p)
              : rmsnorm_forward(c, &f, rows, d, x.p, ld, w.p, b.p, y.p, d, rstd.p),
           &y, &mean, &rstd);
    /* backward with the saved statistics (misaligned too), and without */
    for (int saved = 0; saved < 2; saved++)
      RECORD(ln ? rmsnorm_layernorm_backward(c, &f, rows, d, x.p, ld, dy.p, ld, w.p,
                                             saved ? mean.p : NULL, saved ? rstd.p : NULL, dx.p,
                                             ld, dw.p, db.p)
                : rmsnorm_backward(c, &f, rows, d, x.p, ld, dy.p, ld, w.p, saved ? rstd.p : NULL,
                                   dx.p, ld, dw.p, db.p),
             &dx, &dw, &db);
  }
  /* in place: y = x */
  mbuf xi = mb_copy(in->x.data, in->x.bytes, off_of(off, mixed, k++));
  RECORD(rmsnorm_forward(c, &cfg, rows, d, xi.p, ld, w.p, NULL, xi.p, ld, rstd.p), &xi, &rstd);
  mb_free(&xi);

  /* residual add + RMSNorm, forward and backward */
  mbuf h = mb_copy(in->x.data, in->x.bytes, off_of(off, mixed, k++));
  mbuf u = mb_copy(in->u.data, in->u.bytes, off_of(off, mixed, k++));
  RECORD(rmsnorm_add_forward(c, &cfg, rows, d, h.p, ld, u.p, ld, w.p, b.p, y.p, d, rstd.p), &h,
         &y, &rstd);
  RECORD(rmsnorm_add_backward(c, &cfg, rows, d, h.p, ld, dy.p, ld, u.p, ld, w.p, rstd.p, dx.p, ld,
                              dw.p, db.p),
         &dx, &dw, &db);

  /* 8-bit outputs, dynamic (misaligned scales) and static (a misaligned scale) */
  mbuf q = mb_new(rows * d, off_of(off, mixed, k++));
  mbuf sc = mb_new(rows * 4, off_of(off, mixed, k++));
  float s0 = 0.02f;
  mbuf ss = mb_copy(&s0, 4, off_of(off, mixed, k++));
  for (int fp8 = 0; fp8 < 2; fp8++) {
    rmsnorm_qtype qt = fp8 ? RMSNORM_Q_FP8_E4M3 : RMSNORM_Q_INT8;
    /* the API's float pointers may be misaligned like every other buffer */
    RECORD(rmsnorm_forward_quant(c, &cfg, rows, d, x.p, ld, w.p, b.p, qt, NULL, q.p, d,
                                 (float *)(void *)sc.p, rstd.p),
           &q, &sc, &rstd);
    RECORD(rmsnorm_forward_quant(c, &cfg, rows, d, x.p, ld, w.p, NULL, qt,
                                 (const float *)(const void *)ss.p, q.p, d, NULL, NULL),
           &q);
  }
  mb_free(&q), mb_free(&sc), mb_free(&ss);

  /* QK-norm: every row as 2 heads of d/2 */
  if (d % 2 == 0) {
    size_t hd = d / 2;
    RECORD(rmsnorm_qk_norm_forward(c, &cfg, rows, 2, hd, x.p, ld, hd, w.p, b.p, y.p, d, hd,
                                   rstd.p),
           &y);
    RECORD(rmsnorm_qk_norm_backward(c, &cfg, rows, 2, hd, x.p, ld, hd, dy.p, ld, hd, w.p, NULL,
                                    dx.p, ld, hd, dw.p, db.p),
           &dx, &dw, &db);
  }

  /* RMSNorm + linear: W, W', Z, dZ, dX, dW at the layout's offsets */
  if (rmsnorm_linear_available() == RMSNORM_OK) {
    rmsnorm_config lc = cfg;
    lc.param_dtype = RMSNORM_F32;
    mbuf W = mb_copy(in->W.data, in->W.bytes, off_of(off, mixed, k++));
    mbuf Wf = mb_new(in->W.bytes, off_of(off, mixed, k++));
    mbuf g = mb_new(d * 4, off_of(off, mixed, k++));
    for (size_t j = 0; j < d; j++) rn_st_f32(g.p, j, (float)tu_get(&in->w, 0, j));
    mbuf z = mb_new(rows * n * es, off_of(off, mixed, k++));
    mbuf dz = mb_copy(in->dz.data, in->dz.bytes, off_of(off, mixed, k++));
    mbuf dW = mb_new(in->W.bytes, off_of(off, mixed, k++));
    mbuf dg = mb_new(d * 4, off_of(off, mixed, k++));
    mbuf dbias = mb_new(n * 4, off_of(off, mixed, k++));
    RECORD(rmsnorm_fold_weight(&lc, d, n, g.p, W.p, n, Wf.p, n), &Wf);
    RECORD(rmsnorm_linear_forward(c, &lc, rows, d, n, x.p, ld, Wf.p, n, NULL, z.p, n, rstd.p), &z,
           &rstd);
    RECORD(rmsnorm_linear_backward(c, &lc, rows, d, n, x.p, ld, g.p, W.p, n, Wf.p, n, dz.p, n, dx.p,
                                   ld, dg.p, dW.p, n, dbias.p),
           &dx, &dg, &dW, &dbias);
    mb_free(&W), mb_free(&Wf), mb_free(&g), mb_free(&z), mb_free(&dz), mb_free(&dW), mb_free(&dg);
    mb_free(&dbias);
  }
#undef RECORD
  mb_free(&x), mb_free(&dy), mb_free(&w), mb_free(&b), mb_free(&y), mb_free(&mean);
  mb_free(&rstd), mb_free(&dx), mb_free(&dw), mb_free(&db), mb_free(&h), mb_free(&u);
  return out;
}

static int same(const rn_out *a, const rn_out *b, size_t *first) {
  size_t i = 0;
  while (i < a->n && i < b->n && a->p[i] == b->p[i]) i++;
  *first = i;
  return a->n == b->n && i == a->n;
}

/* Every op, dtype and param dtype at offsets 1..7 (and mixed) against the
 * aligned run, on one context. */
static void test_offsets(rmsnorm_context *c, const char *isa) {
  static const size_t ds[] = {38, 130};
  for (int dt = 0; dt < 4; dt++)
    for (int pd = 0; pd < 2; pd++)
      for (size_t di = 0; di < 2; di++) {
        rmsnorm_dtype pdt = pd ? RMSNORM_F32 : (rmsnorm_dtype)dt;
        if (pd && dt == RMSNORM_F32) continue;
        inputs in = make_inputs((rmsnorm_dtype)dt, pdt, 6, ds[di], 9);
        rn_out want = run_all(c, &in, 0, 0);
        for (size_t off = 1; off <= 8; off++) {
          int mixed = off == 8; /* 8: each buffer its own offset */
          rn_out got = run_all(c, &in, mixed ? 1 : off, mixed);
          size_t first = 0;
          tu_check(same(&want, &got, &first),
                   "%s %s pdt=%s d=%zu offset %s%zu: differs from aligned at byte %zu of %zu", isa,
                   tu_dtype_name(in.dt), tu_dtype_name(pdt), in.d, mixed ? "mixed from " : "",
                   mixed ? (size_t)1 : off, first, want.n);
          free(got.p);
        }
        free(want.p);
        free_inputs(&in);
      }
}

/* Outputs large enough to be streamed past the caches when aligned: at an
 * element-misaligned address they must not be (a streaming store there
 * faults), and the bits stay the same. */
static void test_large(rmsnorm_context *c, const char *isa) {
  static const struct { rmsnorm_dtype dt; size_t rows, off; } cases[] = {
      {RMSNORM_F32, 1030, 1}, {RMSNORM_F32, 1030, 4}, {RMSNORM_F64, 515, 4},
      {RMSNORM_F16, 2060, 1}};
  size_t d = 4100;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    rmsnorm_dtype dt = cases[i].dt;
    size_t rows = cases[i].rows, es = rn_dtype_size(dt), bytes = rows * d * es;
    rmsnorm_config cfg;
    rmsnorm_config_init(&cfg, dt);
    tu_tensor x = tu_alloc(dt, rows, d, d);
    for (size_t r = 0; r < rows; r++)
      for (size_t j = 0; j < d; j++) tu_set(&x, r, j, 4 * tu_uniform() - 2);
    mbuf ya = mb_new(bytes, 0), yb = mb_new(bytes, cases[i].off);
    mbuf dxa = mb_new(bytes, 0), dxb = mb_new(bytes, cases[i].off);
    rmsnorm_status s1 = rmsnorm_forward(c, &cfg, rows, d, x.data, d, NULL, NULL, ya.p, d, NULL);
    rmsnorm_status s2 = rmsnorm_forward(c, &cfg, rows, d, x.data, d, NULL, NULL, yb.p, d, NULL);
    rmsnorm_status s3 = rmsnorm_backward(c, &cfg, rows, d, x.data, d, ya.p, d, NULL, NULL, dxa.p,
                                         d, NULL, NULL);
    rmsnorm_status s4 = rmsnorm_backward(c, &cfg, rows, d, x.data, d, ya.p, d, NULL, NULL, dxb.p,
                                         d, NULL, NULL);
    tu_check(s1 == RMSNORM_OK && s2 == RMSNORM_OK && s3 == RMSNORM_OK && s4 == RMSNORM_OK &&
                 !memcmp(ya.p, yb.p, bytes) && !memcmp(dxa.p, dxb.p, bytes),
             "%s large %s at offset %zu: differs from aligned", isa, tu_dtype_name(dt),
             cases[i].off);
    mb_free(&ya), mb_free(&yb), mb_free(&dxa), mb_free(&dxb);
    tu_free(&x);
  }
}

int main(void) {
  static const rmsnorm_isa isas[] = {RMSNORM_ISA_SCALAR, RMSNORM_ISA_AVX2, RMSNORM_ISA_AVX512,
                                     RMSNORM_ISA_NEON};
  tu_seed(7);
  for (int i = 0; i < 4; i++) {
    rmsnorm_context *c;
    if (rmsnorm_context_create(&c) != RMSNORM_OK) return 2;
    if (rmsnorm_context_set_isa(c, isas[i]) != RMSNORM_OK) {
      printf("test_align: %s not available here, not tested\n", rmsnorm_isa_name(isas[i]));
      rmsnorm_context_free(c);
      continue;
    }
    test_offsets(c, rmsnorm_isa_name(isas[i]));
    test_large(c, rmsnorm_isa_name(isas[i]));
    rmsnorm_context_free(c);
  }
  return tu_finish("test_align");
}
