/* test_errors.c - every invalid argument gets its own status and leaves every
 * output untouched; the status, version and config helpers. */
#include <float.h>

#include "testutil.h"

#define D 8
#define ROWS 3
#define LD 12 /* a wider stride some cases use */

static rmsnorm_context *ctx;
static float x[ROWS * LD], y[ROWS * LD], dy[ROWS * LD], dx[ROWS * LD];
static float w[D], b[D], dw[D], db[D], rstd[ROWS], mean[ROWS];
static float y0[ROWS * LD], dx0[ROWS * LD], dw0[D], db0[D], rstd0[ROWS], mean0[ROWS];

static void reset(void) {
  for (int i = 0; i < ROWS * LD; i++) x[i] = dy[i] = (float)(i % 7) - 3;
  for (int i = 0; i < ROWS * LD; i++) y[i] = y0[i] = dx[i] = dx0[i] = 1234.5f;
  for (int j = 0; j < D; j++) w[j] = 1, b[j] = 0, dw[j] = dw0[j] = db[j] = db0[j] = 777.f;
  for (int i = 0; i < ROWS; i++) rstd[i] = rstd0[i] = mean[i] = mean0[i] = -5.f;
}

static int untouched(void) {
  return !memcmp(y, y0, sizeof y) && !memcmp(dx, dx0, sizeof dx) && !memcmp(dw, dw0, sizeof dw) &&
         !memcmp(db, db0, sizeof db) && !memcmp(rstd, rstd0, sizeof rstd) &&
         !memcmp(mean, mean0, sizeof mean);
}

static void expect(rmsnorm_status got, rmsnorm_status want, const char *what, int line) {
  tu_check(got == want, "line %d: %s: got %s want %s", line, what, rmsnorm_status_name(got),
           rmsnorm_status_name(want));
  if (want != RMSNORM_OK) tu_check(untouched(), "line %d: %s: an output was written", line, what);
  reset();
}

#define EXPECT(call, want) expect((call), (want), #call, __LINE__)

static rmsnorm_config cfg_f32(void) {
  rmsnorm_config c;
  rmsnorm_config_init(&c, RMSNORM_F32);
  return c;
}

static void test_forward_errors(void) {
  rmsnorm_config c = cfg_f32(), bad;
  EXPECT(rmsnorm_forward(NULL, &c, ROWS, D, x, D, w, b, y, D, rstd), RMSNORM_ERROR_NULL_POINTER);
  EXPECT(rmsnorm_forward(ctx, NULL, ROWS, D, x, D, w, b, y, D, rstd), RMSNORM_ERROR_NULL_POINTER);
  EXPECT(rmsnorm_forward(ctx, &c, ROWS, D, NULL, D, w, b, y, D, rstd), RMSNORM_ERROR_NULL_POINTER);
  EXPECT(rmsnorm_forward(ctx, &c, ROWS, D, x, D, w, b, NULL, D, rstd), RMSNORM_ERROR_NULL_POINTER);
  EXPECT(rmsnorm_forward(ctx, &c, ROWS, 0, x, D, w, b, y, D, rstd), RMSNORM_ERROR_BAD_SIZE);
  EXPECT(rmsnorm_forward(ctx, &c, ROWS, D, x, D - 1, w, b, y, D, rstd), RMSNORM_ERROR_BAD_STRIDE);
  EXPECT(rmsnorm_forward(ctx, &c, ROWS, D, x, D, w, b, y, 3, rstd), RMSNORM_ERROR_BAD_STRIDE);
  EXPECT(rmsnorm_forward(ctx, &c, SIZE_MAX / 4, D, x, 16, w, b, y, 16, rstd), RMSNORM_ERROR_BAD_SIZE);
  EXPECT(rmsnorm_forward(ctx, &c, 3, D, x, SIZE_MAX / 2, w, b, y, D, rstd), RMSNORM_ERROR_BAD_SIZE);

  const double bad_eps[] = {-1e-5, -0.0 - 1e-300, NAN, INFINITY, -INFINITY};
  for (int i = 0; i < 5; i++) {
    bad = c;
    bad.eps = bad_eps[i];
    EXPECT(rmsnorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, rstd), RMSNORM_ERROR_BAD_EPS);
    EXPECT(rmsnorm_layernorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, mean, rstd),
           RMSNORM_ERROR_BAD_EPS);
  }
  const double bad_p[] = {0.0, -0.5, 1.0000001, NAN, INFINITY};
  for (int i = 0; i < 5; i++) {
    bad = c;
    bad.partial = bad_p[i];
    EXPECT(rmsnorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, rstd), RMSNORM_ERROR_BAD_PARTIAL);
  }
  bad = c;
  bad.partial = 0.5;
  EXPECT(rmsnorm_layernorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, mean, rstd),
         RMSNORM_ERROR_BAD_PARTIAL);
  bad = c;
  bad.dtype = (rmsnorm_dtype)7;
  EXPECT(rmsnorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, rstd), RMSNORM_ERROR_BAD_DTYPE);
  bad = c;
  bad.dtype = (rmsnorm_dtype)-1;
  EXPECT(rmsnorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, rstd), RMSNORM_ERROR_BAD_DTYPE);
  bad = c;
  bad.param_dtype = RMSNORM_F16; /* neither fp32 nor the data's dtype */
  EXPECT(rmsnorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, rstd), RMSNORM_ERROR_BAD_DTYPE);
  bad = c;
  bad.flags = 1u << 12;
  EXPECT(rmsnorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, rstd), RMSNORM_ERROR_BAD_FLAGS);
  bad = c;
  bad.flags = RMSNORM_FLAG_EPS_OUTSIDE;
  EXPECT(rmsnorm_layernorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, mean, rstd),
         RMSNORM_ERROR_BAD_FLAGS);
  /* the rotation's rounding flags mean something to QK-norm + RoPE alone */
  const unsigned rope_flags[] = {RMSNORM_FLAG_ROUND_BEFORE_ROTATION, RMSNORM_FLAG_FLOAT_ROTATION};
  for (int i = 0; i < 2; i++) {
    bad = c;
    bad.flags = rope_flags[i];
    EXPECT(rmsnorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, rstd), RMSNORM_ERROR_BAD_FLAGS);
    EXPECT(rmsnorm_layernorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, mean, rstd),
           RMSNORM_ERROR_BAD_FLAGS);
    EXPECT(rmsnorm_qk_norm_forward(ctx, &bad, ROWS, 2, D / 2, x, D, D / 2, w, NULL, y, D, D / 2,
                                   NULL),
           RMSNORM_ERROR_BAD_FLAGS);
    EXPECT(rmsnorm_add_forward(ctx, &bad, ROWS, D, y, D, x, D, w, b, x, D, rstd),
           RMSNORM_ERROR_BAD_FLAGS);
  }

  /* overlaps: only y == x with the same stride is in place */
  EXPECT(rmsnorm_forward(ctx, &c, ROWS, D, y + 1, D, w, b, y, D, rstd), RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_forward(ctx, &c, 2, D, y, LD, w, b, y, D, rstd), RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_forward(ctx, &c, ROWS, D, x, D, w, b, y, D, y + 5), RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_forward(ctx, &c, ROWS, D, x, D, y + 2, b, y, D, rstd), RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_forward(ctx, &c, 1, D, x, D, w, b, y, D, x + 2), RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_forward(ctx, &c, ROWS, D, x, D, w, b, y, D, w), RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_layernorm_forward(ctx, &c, ROWS, D, x, D, w, b, y, D, rstd, rstd),
         RMSNORM_ERROR_OVERLAP);

  /* valid edge cases */
  EXPECT(rmsnorm_forward(ctx, &c, 0, D, NULL, D, NULL, NULL, NULL, D, NULL), RMSNORM_OK);
  tu_check(untouched(), "rows = 0 wrote something");
  EXPECT(rmsnorm_forward(ctx, &c, ROWS, D, x, D, NULL, NULL, x, D, NULL), RMSNORM_OK);
}

static void test_backward_errors(void) {
  rmsnorm_config c = cfg_f32(), bad;
  EXPECT(rmsnorm_backward(NULL, &c, ROWS, D, x, D, dy, D, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_NULL_POINTER);
  EXPECT(rmsnorm_backward(ctx, &c, ROWS, D, NULL, D, dy, D, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_NULL_POINTER);
  EXPECT(rmsnorm_backward(ctx, &c, ROWS, D, x, D, NULL, D, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_NULL_POINTER);
  EXPECT(rmsnorm_backward(ctx, &c, ROWS, D, x, D, dy, D, w, NULL, NULL, D, dw, db),
         RMSNORM_ERROR_NULL_POINTER);
  EXPECT(rmsnorm_backward(ctx, &c, ROWS, 0, x, D, dy, D, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_BAD_SIZE);
  EXPECT(rmsnorm_backward(ctx, &c, ROWS, D, x, D, dy, 2, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_BAD_STRIDE);
  EXPECT(rmsnorm_backward(ctx, &c, ROWS, D, x, D, dy, D, w, NULL, dx, 7, dw, db),
         RMSNORM_ERROR_BAD_STRIDE);
  EXPECT(rmsnorm_backward(ctx, &c, ROWS, D, x, D, dy, D, NULL, NULL, dx, D, dw, db),
         RMSNORM_ERROR_BAD_ARGUMENT);
  bad = c;
  bad.eps = NAN;
  EXPECT(rmsnorm_backward(ctx, &bad, ROWS, D, x, D, dy, D, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_BAD_EPS);
  bad = c;
  bad.partial = 2;
  EXPECT(rmsnorm_backward(ctx, &bad, ROWS, D, x, D, dy, D, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_BAD_PARTIAL);
  bad = c;
  bad.flags = 0x80000000u;
  EXPECT(rmsnorm_backward(ctx, &bad, ROWS, D, x, D, dy, D, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_BAD_FLAGS);
  bad = c;
  bad.flags = RMSNORM_FLAG_EPS_OUTSIDE;
  EXPECT(rmsnorm_layernorm_backward(ctx, &bad, ROWS, D, x, D, dy, D, w, NULL, NULL, dx, D, dw, db),
         RMSNORM_ERROR_BAD_FLAGS);
  bad = c;
  bad.param_dtype = RMSNORM_F64;
  EXPECT(rmsnorm_backward(ctx, &bad, ROWS, D, x, D, dy, D, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_BAD_DTYPE);
  /* overlaps */
  EXPECT(rmsnorm_backward(ctx, &c, ROWS, D, x, D, dx + 1, D, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_backward(ctx, &c, 2, D, x, D, dx, LD, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_backward(ctx, &c, ROWS, D, x, D, dy, D, w, NULL, dx, D, dw, dw + 2),
         RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_backward(ctx, &c, ROWS, D, x, D, dy, D, w, NULL, dx, D, w, db),
         RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_backward(ctx, &c, ROWS, D, x, D, dy, D, w, dx, dx, D, dw, db),
         RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_layernorm_backward(ctx, &c, ROWS, D, x, D, dy, D, w, dw, NULL, dx, D, dw, db),
         RMSNORM_ERROR_OVERLAP);
  /* in place: dx may be dy or x with the same stride */
  EXPECT(rmsnorm_backward(ctx, &c, ROWS, D, x, D, dy, D, w, NULL, dy, D, dw, db), RMSNORM_OK);
  EXPECT(rmsnorm_backward(ctx, &c, ROWS, D, x, D, dy, D, w, NULL, x, D, dw, db), RMSNORM_OK);
  EXPECT(rmsnorm_backward(ctx, &c, 0, D, NULL, D, NULL, D, NULL, NULL, NULL, D, NULL, NULL),
         RMSNORM_OK);
}

static void test_helpers(void) {
  double eps = -1;
  tu_check(rmsnorm_default_eps(RMSNORM_F32, &eps) == RMSNORM_OK && eps == FLT_EPSILON, "eps f32");
  tu_check(rmsnorm_default_eps(RMSNORM_F16, &eps) == RMSNORM_OK && eps == FLT_EPSILON, "eps f16");
  tu_check(rmsnorm_default_eps(RMSNORM_BF16, &eps) == RMSNORM_OK && eps == FLT_EPSILON, "eps bf16");
  tu_check(rmsnorm_default_eps(RMSNORM_F64, &eps) == RMSNORM_OK && eps == DBL_EPSILON, "eps f64");
  tu_check(rmsnorm_default_eps((rmsnorm_dtype)9, &eps) == RMSNORM_ERROR_BAD_DTYPE, "eps bad dtype");
  tu_check(rmsnorm_default_eps(RMSNORM_F32, NULL) == RMSNORM_ERROR_NULL_POINTER, "eps NULL");
  rmsnorm_config c;
  tu_check(rmsnorm_config_init(&c, RMSNORM_BF16) == RMSNORM_OK && c.dtype == RMSNORM_BF16 &&
               c.param_dtype == RMSNORM_BF16 && c.eps == FLT_EPSILON && c.partial == 1 &&
               c.flags == 0 && c.size == sizeof(rmsnorm_config),
           "config_init");
  tu_check(rmsnorm_config_init(NULL, RMSNORM_F32) == RMSNORM_ERROR_NULL_POINTER, "config NULL");
  tu_check(rmsnorm_config_init(&c, (rmsnorm_dtype)4) == RMSNORM_ERROR_BAD_DTYPE, "config dtype");
  tu_check(rmsnorm_context_create(NULL) == RMSNORM_ERROR_NULL_POINTER, "create NULL");
  rmsnorm_context_free(NULL);
  /* the pinned values of the statuses added after RMSNORM_ERROR_BAD_CONFIG */
  tu_check(RMSNORM_ERROR_BAD_CONFIG == 12 && RMSNORM_ERROR_OUT_OF_RANGE == 13 &&
               RMSNORM_ERROR_BAD_ROPE == 14,
           "pinned status values");
  for (int s = 0; s <= RMSNORM_ERROR_BAD_ROPE; s++) {
    const char *name = rmsnorm_status_name((rmsnorm_status)s);
    tu_check(strncmp(name, "RMSNORM_", 8) == 0, "status %d name %s", s, name);
    tu_check(strcmp(rmsnorm_status_message((rmsnorm_status)s), "unknown status") != 0,
             "status %d message", s);
  }
  tu_check(strcmp(rmsnorm_status_message((rmsnorm_status)99), "unknown status") == 0, "unknown");
  tu_check(rmsnorm_version_number() == RMSNORM_VERSION_NUMBER, "version number");
  tu_check(strcmp(rmsnorm_version_string(), RMSNORM_VERSION_STRING) == 0, "version string");
}

/* Overlap is decided on the elements a call touches, and a stride that is
 * never used is not checked. The expectation for random layouts comes from
 * marking every touched element in a bitmap. */
static float pool[4096];

/* Marks rows of w elements at off + i*ld1 + h*ld2 (i < n1, h < n2) in m;
 * returns 0 if a row leaves the pool. */
static int mark(unsigned char *m, size_t off, size_t n1, size_t ld1, size_t n2, size_t ld2,
                size_t w) {
  for (size_t i = 0; i < n1; i++)
    for (size_t h = 0; h < n2; h++)
      for (size_t j = 0; j < w; j++) {
        size_t e = off + i * ld1 + h * ld2 + j;
        if (e >= 4096) return 0;
        m[e] = 1;
      }
  return 1;
}

static int bitmaps_meet(const unsigned char *a, const unsigned char *b) {
  for (size_t e = 0; e < 4096; e++)
    if (a[e] && b[e]) return 1;
  return 0;
}

static void test_touched_overlap(void) {
  rmsnorm_config c = cfg_f32();
  const size_t d = 8;
  /* interleaved views: x = buf[:, :d], y = buf[:, d:2d], dy = buf[:, 2d:] */
  float buf[5 * 3 * 8], xs[5 * 8], ys[5 * 8], dxs[5 * 8], dys[5 * 8];
  for (size_t i = 0; i < 5 * 3 * d; i++) buf[i] = (float)((i * 7) % 11) - 5;
  for (size_t i = 0; i < 5; i++)
    for (size_t j = 0; j < d; j++)
      xs[i * d + j] = buf[i * 3 * d + j], dys[i * d + j] = buf[i * 3 * d + 2 * d + j];
  tu_check(rmsnorm_forward(ctx, &c, 5, d, buf, 3 * d, w, b, buf + d, 3 * d, NULL) == RMSNORM_OK &&
               rmsnorm_forward(ctx, &c, 5, d, xs, d, w, b, ys, d, NULL) == RMSNORM_OK,
           "interleaved views x = buf[:, :d], y = buf[:, d:2d]: accepted");
  int same = 1;
  for (size_t i = 0; i < 5; i++)
    same &= !memcmp(buf + i * 3 * d + d, ys + i * d, d * sizeof(float));
  tu_check(same, "interleaved views: the result of separate buffers");
  tu_check(rmsnorm_backward(ctx, &c, 5, d, buf, 3 * d, buf + 2 * d, 3 * d, w, NULL, buf + d,
                            3 * d, NULL, NULL) == RMSNORM_OK &&
               rmsnorm_backward(ctx, &c, 5, d, xs, d, dys, d, w, NULL, dxs, d, NULL, NULL) ==
                   RMSNORM_OK,
           "interleaved x, dy and dx: accepted");
  same = 1;
  for (size_t i = 0; i < 5; i++)
    same &= !memcmp(buf + i * 3 * d + d, dxs + i * d, d * sizeof(float));
  tu_check(same, "interleaved backward: the result of separate buffers");
  EXPECT(rmsnorm_forward(ctx, &c, 5, d, buf, 3 * d, w, b, buf + d - 1, 3 * d, NULL),
         RMSNORM_ERROR_OVERLAP);
  EXPECT(rmsnorm_forward(ctx, &c, 5, d, buf, 3 * d, w, b, buf + 3 * d - 1, 3 * d, NULL),
         RMSNORM_ERROR_OVERLAP);
  /* a vector in the gap between an output's rows */
  EXPECT(rmsnorm_forward(ctx, &c, 2, d, x, D, buf + d, buf + 2 * d, buf, 3 * d, buf + 5 * d),
         RMSNORM_OK);
  EXPECT(rmsnorm_forward(ctx, &c, 2, d, x, D, buf + 2 * d + 1, NULL, buf, 3 * d, NULL),
         RMSNORM_ERROR_OVERLAP);
  /* one row: its stride is never used, so any is accepted */
  EXPECT(rmsnorm_forward(ctx, &c, 1, D, x, 0, w, b, y, 1, rstd), RMSNORM_OK);
  EXPECT(rmsnorm_backward(ctx, &c, 1, D, x, 0, dy, 3, w, NULL, dx, 0, dw, db), RMSNORM_OK);

  /* QK-norm with one head (MQA/GQA K): the head stride is never used */
  float qx[4 * 16], qy1[4 * 16], qy2[4 * 16];
  for (size_t i = 0; i < 64; i++) qx[i] = (float)((i * 5) % 13) - 6;
  tu_check(rmsnorm_qk_norm_forward(ctx, &c, 4, 1, 8, qx, 16, 0, w, NULL, qy1, 8, 3, NULL) ==
                   RMSNORM_OK &&
               rmsnorm_qk_norm_forward(ctx, &c, 4, 1, 8, qx, 16, 8, w, NULL, qy2, 8, 8, NULL) ==
                   RMSNORM_OK &&
               !memcmp(qy1, qy2, 32 * sizeof(float)),
           "QK-norm, one head: any head stride");
  tu_check(rmsnorm_qk_norm_backward(ctx, &c, 4, 1, 8, qx, 16, 1, qy1, 8, 0, w, NULL, qy2, 8, 5,
                                    NULL, NULL) == RMSNORM_OK,
           "QK-norm backward, one head: any head stride");
  tu_check(rmsnorm_qk_norm_forward(ctx, &c, 1, 3, 4, qx, 0, 4, w, NULL, qy1, 2, 5, NULL) ==
               RMSNORM_OK,
           "QK-norm, one token: any token stride");
  EXPECT(rmsnorm_qk_norm_forward(ctx, &c, 4, 1, 8, qx, 7, 0, w, NULL, qy1, 8, 8, NULL),
         RMSNORM_ERROR_BAD_STRIDE); /* the token stride is used */
  /* Q and K of one QKV buffer: K normalized into the V slot is disjoint from Q */
  float qkv[3 * 2 * 2 * 4];
  for (size_t i = 0; i < 48; i++) qkv[i] = (float)(i % 9) - 4;
  EXPECT(rmsnorm_qk_norm_forward(ctx, &c, 2, 2, 4, qkv + 8, 24, 4, w, NULL, qkv + 16, 24, 4, NULL),
         RMSNORM_OK);
  EXPECT(rmsnorm_qk_norm_forward(ctx, &c, 2, 2, 4, qkv + 8, 24, 4, w, NULL, qkv + 15, 24, 4, NULL),
         RMSNORM_ERROR_OVERLAP);

  /* random layouts: matrices, and [tokens, heads] grids of either order,
   * against the touched-element bitmaps */
  static unsigned char mx[4096], my[4096];
  long disagree = 0, overlapping = 0, accepted = 0;
  tu_seed(99);
  for (int rep = 0; rep < 4000; rep++) {
    memset(mx, 0, sizeof mx), memset(my, 0, sizeof my);
    int grid = rep % 2;
    size_t hd = 1 + tu_next() % 6, t = 1 + tu_next() % 5, h = grid ? 1 + tu_next() % 4 : 1;
    size_t lx[2], ly[2], ox = tu_next() % 64, oy = tu_next() % 64;
    for (int k = 0; k < 2; k++) { /* token-major or head-major, tight or loose */
      size_t *l = k ? ly : lx, gap = tu_next() % 3;
      int head_major = grid && tu_next() % 2;
      size_t inner = head_major ? t : h;
      size_t s_in = hd + gap, s_out = (inner - 1) * s_in + hd + tu_next() % 3;
      l[0] = head_major ? s_in : s_out;  /* token stride */
      l[1] = head_major ? s_out : s_in;  /* head stride */
    }
    if (tu_next() % 4 == 0) ly[0] = lx[0], ly[1] = lx[1]; /* same strides: more near-misses */
    if (tu_next() % 8 == 0) oy = ox;
    if (!mark(mx, ox, t, lx[0], h, lx[1], hd) || !mark(my, oy, t, ly[0], h, ly[1], hd)) continue;
    int inplace = ox == oy && (t == 1 || lx[0] == ly[0]) && (h == 1 || lx[1] == ly[1]);
    int want_overlap = bitmaps_meet(mx, my) && !inplace;
    rmsnorm_status st =
        grid ? rmsnorm_qk_norm_forward(ctx, &c, t, h, hd, pool + ox, lx[0], lx[1], NULL, NULL,
                                       pool + oy, ly[0], ly[1], NULL)
             : rmsnorm_forward(ctx, &c, t, hd, pool + ox, lx[0], NULL, NULL, pool + oy, ly[0],
                               NULL);
    overlapping += want_overlap, accepted += st == RMSNORM_OK;
    if ((st == RMSNORM_ERROR_OVERLAP) != want_overlap || (st != RMSNORM_OK && !want_overlap)) {
      if (disagree++ < 5)
        tu_check(0, "random %s t=%zu h=%zu hd=%zu x@%zu (%zu,%zu) y@%zu (%zu,%zu): %s, bitmaps %s",
                 grid ? "grid" : "matrix", t, h, hd, ox, lx[0], lx[1], oy, ly[0], ly[1],
                 rmsnorm_status_name(st), want_overlap ? "meet" : "apart");
    }
  }
  printf("test_errors: random layouts: %ld overlapping, %ld accepted\n", overlapping, accepted);
  tu_check(disagree == 0 && overlapping > 500 && accepted > 500,
           "random layouts: %ld disagree with the bitmaps (%ld overlapping, %ld accepted)",
           disagree, overlapping, accepted);
}

/* The config's size field: a struct not filled by rmsnorm_config_init is
 * refused by every entry point with nothing written; a caller compiled with a
 * newer, larger struct works as long as the fields this library does not know
 * are zero; rmsnorm_config_init_size writes nothing past the caller's size. */
typedef struct newer_config { /* what a later header might declare */
  rmsnorm_config base;
  double added;
  unsigned added_flags;
} newer_config;

static void test_config_abi(void) {
  rmsnorm_config c = cfg_f32(), bad = c;
  bad.size = 0;
  EXPECT(rmsnorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, rstd), RMSNORM_ERROR_BAD_CONFIG);
  EXPECT(rmsnorm_layernorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, mean, rstd),
         RMSNORM_ERROR_BAD_CONFIG);
  EXPECT(rmsnorm_backward(ctx, &bad, ROWS, D, x, D, dy, D, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_BAD_CONFIG);
  EXPECT(rmsnorm_layernorm_backward(ctx, &bad, ROWS, D, x, D, dy, D, w, NULL, NULL, dx, D, dw, db),
         RMSNORM_ERROR_BAD_CONFIG);
  EXPECT(rmsnorm_add_forward(ctx, &bad, ROWS, D, dx, D, x, D, w, b, y, D, rstd),
         RMSNORM_ERROR_BAD_CONFIG);
  EXPECT(rmsnorm_add_backward(ctx, &bad, ROWS, D, x, D, dy, D, NULL, D, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_BAD_CONFIG);
  EXPECT(rmsnorm_forward_quant(ctx, &bad, ROWS, D, x, D, w, b, RMSNORM_Q_INT8, NULL, y, D, rstd,
                               NULL), RMSNORM_ERROR_BAD_CONFIG);
  EXPECT(rmsnorm_qk_norm_forward(ctx, &bad, ROWS, 2, 4, x, D, 4, w, b, y, D, 4, rstd),
         RMSNORM_ERROR_BAD_CONFIG);
  EXPECT(rmsnorm_qk_norm_backward(ctx, &bad, ROWS, 2, 4, x, D, 4, dy, D, 4, w, NULL, dx, D, 4,
                                  dw, db), RMSNORM_ERROR_BAD_CONFIG);
  EXPECT(rmsnorm_fold_weight(&bad, 2, 4, w, x, 4, y, 4), RMSNORM_ERROR_BAD_CONFIG);
  if (rmsnorm_linear_available() == RMSNORM_OK) {
    EXPECT(rmsnorm_linear_forward(ctx, &bad, 2, 4, 4, x, 4, dx, 4, NULL, y, 4, rstd),
           RMSNORM_ERROR_BAD_CONFIG);
    EXPECT(rmsnorm_linear_backward(ctx, &bad, 2, 4, 4, x, 4, w, NULL, 4, dy, 4, dy + 16, 4, dx, 4,
                                   NULL, NULL, 4, NULL), RMSNORM_ERROR_BAD_CONFIG);
  }
  bad.size = (size_t)1 << 40; /* garbage: never read that far */
  EXPECT(rmsnorm_forward(ctx, &bad, ROWS, D, x, D, w, b, y, D, rstd), RMSNORM_ERROR_BAD_CONFIG);
  EXPECT(rmsnorm_forward(ctx, NULL, ROWS, D, x, D, w, b, y, D, rstd), RMSNORM_ERROR_NULL_POINTER);

  /* a newer caller: unknown fields zero -> the same result as today's struct */
  float want[ROWS * LD], got[ROWS * LD];
  c.eps = 1e-3;
  c.flags = RMSNORM_FLAG_WEIGHT_OFFSET;
  tu_check(rmsnorm_forward(ctx, &c, ROWS, D, x, D, w, b, want, D, NULL) == RMSNORM_OK,
           "abi: plain");
  newer_config n;
  memset(&n, 0x5a, sizeof n);
  tu_check(rmsnorm_config_init_size(&n.base, sizeof n, RMSNORM_F32) == RMSNORM_OK &&
               n.base.size == sizeof n && n.added == 0 && n.added_flags == 0,
           "abi: init of a newer struct zeroes its unknown fields");
  n.base.eps = 1e-3;
  n.base.flags = RMSNORM_FLAG_WEIGHT_OFFSET;
  tu_check(rmsnorm_forward(ctx, &n.base, ROWS, D, x, D, w, b, got, D, NULL) == RMSNORM_OK &&
               !memcmp(want, got, sizeof(float) * ROWS * D),
           "abi: a newer struct with its new fields zero runs as today's");
  n.added = 0.5;
  EXPECT(rmsnorm_forward(ctx, &n.base, ROWS, D, x, D, w, b, y, D, rstd), RMSNORM_ERROR_BAD_CONFIG);
  n.added = 0, n.added_flags = 1;
  EXPECT(rmsnorm_backward(ctx, &n.base, ROWS, D, x, D, dy, D, w, NULL, dx, D, dw, db),
         RMSNORM_ERROR_BAD_CONFIG);

  /* an older caller, whose struct ends with flags: everything it has is used */
  _Alignas(rmsnorm_config) unsigned char buf[sizeof(rmsnorm_config) + 16];
  size_t v1 = offsetof(rmsnorm_config, flags) + sizeof(unsigned);
  memset(buf, 0xab, sizeof buf);
  tu_check(rmsnorm_config_init_size((rmsnorm_config *)(void *)buf, v1, RMSNORM_F32) == RMSNORM_OK,
           "abi: init of the first version's size");
  int clean = 1;
  for (size_t i = v1; i < sizeof buf; i++) clean &= buf[i] == 0xab;
  tu_check(clean, "abi: rmsnorm_config_init_size wrote past the caller's size");
  rmsnorm_config *old = (rmsnorm_config *)(void *)buf;
  old->eps = 1e-3;
  old->flags = RMSNORM_FLAG_WEIGHT_OFFSET;
  tu_check(rmsnorm_forward(ctx, old, ROWS, D, x, D, w, b, got, D, NULL) == RMSNORM_OK &&
               !memcmp(want, got, sizeof(float) * ROWS * D),
           "abi: the first version's struct");
  tu_check(rmsnorm_config_init_size(&c, v1 - 1, RMSNORM_F32) == RMSNORM_ERROR_BAD_CONFIG &&
               rmsnorm_config_init_size(&c, 0, RMSNORM_F32) == RMSNORM_ERROR_BAD_CONFIG &&
               rmsnorm_config_init_size(&c, 4096, RMSNORM_F32) == RMSNORM_ERROR_BAD_CONFIG &&
               rmsnorm_config_init_size(NULL, sizeof c, RMSNORM_F32) == RMSNORM_ERROR_NULL_POINTER,
           "abi: bad sizes");
  tu_check(strcmp(rmsnorm_status_name(RMSNORM_ERROR_BAD_CONFIG), "RMSNORM_ERROR_BAD_CONFIG") == 0 &&
               RMSNORM_ERROR_BAD_CONFIG == 12,
           "abi: status name and pinned value");
}

int main(void) {
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) return 2;
  reset();
  test_forward_errors();
  test_backward_errors();
  test_helpers();
  test_touched_overlap();
  test_config_abi();
  rmsnorm_context_free(ctx);
  return tu_finish("test_errors");
}
