/* test_plan.c - plans (rmsnorm.h, "Plans") against the one-shot calls they
 * prepare: the same bits for every kernel set, dtype, parameter dtype, weight
 * mode, shape, stride and in-place use, on one thread and on two (the calls
 * are tested against their oracles elsewhere); a plan run many times on new
 * data; and every misuse refused with its status and nothing written. */
#include "testutil.h"

typedef struct pcase {
  rmsnorm_plan_op op;
  rmsnorm_dtype dt, pdt;
  unsigned flags;
  double partial;
  int bias, inplace, stats;
} pcase;

static int same_bytes(const tu_tensor *a, const tu_tensor *b) {
  return a->bytes == b->bytes && memcmp(a->data, b->data, a->bytes) == 0;
}

/* The one-shot call of c into y (h: add's residual, updated). */
static rmsnorm_status one_shot(rmsnorm_context *ctx, const rmsnorm_config *cfg, const pcase *c,
                               size_t rows, size_t d, tu_tensor *x, const tu_tensor *u,
                               const void *w, const void *b, tu_tensor *y, void *mean,
                               void *rstd) {
  void *out = c->inplace ? (c->op == RMSNORM_PLAN_ADD_FORWARD ? u->data : x->data) : y->data;
  size_t ldo = c->inplace ? (c->op == RMSNORM_PLAN_ADD_FORWARD ? u->ld : x->ld) : y->ld;
  switch (c->op) {
  case RMSNORM_PLAN_FORWARD:
    return rmsnorm_forward(ctx, cfg, rows, d, x->data, x->ld, w, b, out, ldo, rstd);
  case RMSNORM_PLAN_LAYERNORM_FORWARD:
    return rmsnorm_layernorm_forward(ctx, cfg, rows, d, x->data, x->ld, w, b, out, ldo, mean,
                                     rstd);
  default:
    return rmsnorm_add_forward(ctx, cfg, rows, d, x->data, x->ld, u->data, u->ld, w, b, out,
                               ldo, rstd);
  }
}

static rmsnorm_status plan_setup(rmsnorm_plan *p, const pcase *c, tu_tensor *x,
                                 const tu_tensor *u, const void *w, const void *b,
                                 tu_tensor *y, void *mean, void *rstd) {
  void *out = c->inplace ? (c->op == RMSNORM_PLAN_ADD_FORWARD ? u->data : x->data) : y->data;
  if (c->op == RMSNORM_PLAN_ADD_FORWARD)
    return rmsnorm_plan_setup_add(p, x->data, u->data, w, b, out, rstd);
  return rmsnorm_plan_setup_forward(p, x->data, w, b, out, mean, rstd);
}

/* The config of case c. */
static void case_config(const pcase *c, rmsnorm_config *cfg) {
  TU_OK(rmsnorm_config_init(cfg, c->dt));
  cfg->param_dtype = c->pdt;
  cfg->flags = c->flags;
  cfg->partial = c->partial;
}

/* One case: the plan, set up once, run `steps` times on new x (and u), each
 * step compared with the one-shot call on a copy of the same inputs. */
static void check_case(rmsnorm_context *ctx, const pcase *c, size_t rows, size_t d, size_t pad,
                       int steps) {
  rmsnorm_config cfg;
  case_config(c, &cfg);
  int add = c->op == RMSNORM_PLAN_ADD_FORWARD;
  size_t ld = d + pad, as = c->dt == RMSNORM_F64 ? 8 : 4;
  /* the one-shot's buffers (suffix 1) and the plan's (suffix 2) */
  tu_tensor x1 = tu_alloc(c->dt, rows, d, ld), x2 = tu_alloc(c->dt, rows, d, ld);
  tu_tensor u1 = tu_alloc(c->dt, rows, d, ld + 1), u2 = tu_alloc(c->dt, rows, d, ld + 1);
  tu_tensor y1 = tu_alloc(c->dt, rows, d, ld + 3), y2 = tu_alloc(c->dt, rows, d, ld + 3);
  tu_tensor w = tu_alloc(c->pdt, 1, d, d), b = tu_alloc(c->pdt, 1, d, d);
  tu_fill_sum4(&w, 0.5);
  tu_fill_sum4(&b, 0.1);
  char *stats1 = calloc(2 * rows + 1, as), *stats2 = calloc(2 * rows + 1, as);
  void *mean1 = c->stats && c->op == RMSNORM_PLAN_LAYERNORM_FORWARD ? stats1 : NULL;
  void *mean2 = mean1 ? stats2 : NULL;
  void *rstd1 = c->stats ? stats1 + rows * as : NULL, *rstd2 = c->stats ? stats2 + rows * as : NULL;
  const void *bias = c->bias ? b.data : NULL;

  rmsnorm_plan *p;
  TU_OK(rmsnorm_plan_create(ctx, &cfg, c->op, &p));
  /* in place, y is x (forward) or u (add), with its stride */
  size_t ldy = c->inplace ? (add ? ld + 1 : ld) : ld + 3;
  TU_OK(rmsnorm_plan_reshape(p, rows, d, ld, add ? ld + 1 : 0, ldy));
  TU_OK(plan_setup(p, c, &x2, &u2, w.data, bias, &y2, mean2, rstd2));
  for (int s = 0; s < steps; s++) {
    tu_fill_sum4(&x1, s == 1 ? 1e-3 : 1.0);
    tu_fill_sum4(&u1, 1.0);
    if (rows && d > 2) tu_set(&x1, 0, d / 2, 40.0); /* an outlier channel */
    memcpy(x2.data, x1.data, x1.bytes);
    memcpy(u2.data, u1.data, u1.bytes);
    memset(y1.data, 0x7f, y1.bytes);
    memset(y2.data, 0x7f, y2.bytes);
    TU_OK(one_shot(ctx, &cfg, c, rows, d, &x1, &u1, w.data, bias, &y1, mean1, rstd1));
    TU_OK(rmsnorm_plan_run(p));
    int ok = same_bytes(&x1, &x2) && same_bytes(&u1, &u2) && same_bytes(&y1, &y2) &&
             memcmp(stats1, stats2, 2 * rows * as) == 0;
    tu_check(ok, "op %d %s param %s flags %x partial %g bias %d inplace %d stats %d: %zu x %zu "
             "pad %zu step %d differs from the one-shot call",
             (int)c->op, tu_dtype_name(c->dt), tu_dtype_name(c->pdt), c->flags, c->partial,
             c->bias, c->inplace, c->stats, rows, d, pad, s);
  }
  rmsnorm_plan_free(p);
  free(stats1), free(stats2);
  tu_free(&x1), tu_free(&x2), tu_free(&u1), tu_free(&u2), tu_free(&y1), tu_free(&y2);
  tu_free(&w), tu_free(&b);
}

/* Every op, dtype and option on ragged and decode shapes (one thread: these
 * splits are one task). */
static void check_equal_to_one_shot(rmsnorm_context *ctx) {
  static const rmsnorm_dtype dts[] = {RMSNORM_F32, RMSNORM_F16, RMSNORM_BF16, RMSNORM_F64};
  static const size_t ds_full[] = {1, 2, 7, 31, 64, 65, 127, 128, 576, 896, 2048, 4095, 5120};
  static const size_t ds_reduced[] = {1, 7, 65, 128, 576, 4095};
  static const size_t rows_set[] = {0, 1, 3, 16, 64};
  const size_t *ds = tu_reduced() ? ds_reduced : ds_full;
  size_t nds = tu_reduced() ? sizeof ds_reduced / sizeof *ds : sizeof ds_full / sizeof *ds;
  for (int op = 0; op < 3; op++)
    for (size_t t = 0; t < 4; t++)
      for (int variant = 0; variant < 4; variant++) {
        pcase c = {(rmsnorm_plan_op)op, dts[t], dts[t], 0, 1.0, 0, 0, 0};
        if (variant == 1) c.pdt = RMSNORM_F32, c.bias = 1, c.stats = 1;
        if (variant == 2) c.flags = RMSNORM_FLAG_WEIGHT_OFFSET, c.inplace = 1;
        if (variant == 3 && op != RMSNORM_PLAN_LAYERNORM_FORWARD)
          c.flags = RMSNORM_FLAG_EPS_OUTSIDE, c.partial = op == 0 ? 0.25 : 1.0, c.stats = 1;
        for (size_t i = 0; i < nds; i++)
          for (size_t r = 0; r < sizeof rows_set / sizeof *rows_set; r++) {
            if (ds[i] >= 2048 && rows_set[r] > 16) continue;
            check_case(ctx, &c, rows_set[r], ds[i], (i + r) % 3 == 0 ? 0 : 5, 2);
          }
      }
}

/* A backward case (op RMSNORM_PLAN_BACKWARD or _LAYERNORM_BACKWARD): the
 * plan set up once and run `steps` times on new x and dy, each run compared
 * with the one-shot call on copies of the same inputs: dx, and dweight and
 * dbias where given (with RMSNORM_FLAG_ACCUMULATE both add into outputs that
 * start from the same values, run after run). c->stats: mean and rstd saved
 * by a forward (else recomputed); c->bias: dbias; c->inplace: dx is dy;
 * `grads` 0: dx alone (no weight when c->partial < 1). */
static void check_backward_case(rmsnorm_context *ctx, const pcase *c, size_t rows, size_t d,
                                size_t pad, int steps, int grads) {
  rmsnorm_config cfg;
  case_config(c, &cfg);
  int ln = c->op == RMSNORM_PLAN_LAYERNORM_BACKWARD;
  size_t ld = d + pad, as = c->dt == RMSNORM_F64 ? 8 : 4;
  tu_tensor x1 = tu_alloc(c->dt, rows, d, ld), x2 = tu_alloc(c->dt, rows, d, ld);
  tu_tensor dy1 = tu_alloc(c->dt, rows, d, ld + 1), dy2 = tu_alloc(c->dt, rows, d, ld + 1);
  tu_tensor dx1 = tu_alloc(c->dt, rows, d, ld + 3), dx2 = tu_alloc(c->dt, rows, d, ld + 3);
  tu_tensor w = tu_alloc(c->pdt, 1, d, d), y = tu_alloc(c->dt, rows, d, d);
  /* dweight and dbias at an odd element offset too (d + 1 elements, from 1) */
  tu_tensor g1 = tu_alloc(c->pdt, 2, d + 1, d + 1), g2 = tu_alloc(c->pdt, 2, d + 1, d + 1);
  tu_fill_sum4(&w, 0.5);
  tu_fill_sum4(&g1, 1.0);
  memcpy(g2.data, g1.data, g1.bytes);
  size_t off = (rows + d) % 2, ps = rn_dtype_size(c->pdt);
  char *dw1 = grads ? (char *)g1.data + off * ps : NULL;
  char *dw2 = grads ? (char *)g2.data + off * ps : NULL;
  char *db1 = grads && c->bias ? (char *)g1.data + (d + 1) * ps : NULL;
  char *db2 = db1 ? (char *)g2.data + (d + 1) * ps : NULL;
  const void *weight = grads || c->partial == 1.0 ? w.data : NULL;
  char *stats = calloc(2 * rows + 1, as);
  void *mean = c->stats && ln ? stats : NULL, *rstd = c->stats ? stats + rows * as : NULL;

  rmsnorm_plan *p;
  TU_OK(rmsnorm_plan_create(ctx, &cfg, c->op, &p));
  size_t lddx = c->inplace ? ld + 1 : ld + 3;
  TU_OK(rmsnorm_plan_reshape(p, rows, d, ld, ld + 1, lddx));
  TU_OK(rmsnorm_plan_setup_backward(p, x2.data, dy2.data, weight, mean, rstd,
                                    c->inplace ? dy2.data : dx2.data, dw2, db2));
  for (int s = 0; s < steps; s++) {
    tu_fill_sum4(&x1, s == 1 ? 1e-3 : 1.0);
    tu_fill_sum4(&dy1, 1.0);
    if (rows && d > 2) tu_set(&x1, 0, d / 2, 40.0); /* an outlier channel */
    if (rows > 2 && d > 2) tu_set(&dy1, rows - 1, 1, s == 2 ? INFINITY : 3.0); /* rescued */
    memcpy(x2.data, x1.data, x1.bytes);
    memcpy(dy2.data, dy1.data, dy1.bytes);
    memset(dx1.data, 0x7f, dx1.bytes);
    memset(dx2.data, 0x7f, dx2.bytes);
    if (c->stats) { /* the forward's statistics of this step's x */
      rmsnorm_config fcfg = cfg;
      fcfg.flags &= ~RMSNORM_FLAG_ACCUMULATE;
      rmsnorm_status st =
          ln ? rmsnorm_layernorm_forward(ctx, &fcfg, rows, d, x1.data, ld, w.data, NULL, y.data,
                                         d, mean, rstd)
             : rmsnorm_forward(ctx, &fcfg, rows, d, x1.data, ld, w.data, NULL, y.data, d, rstd);
      TU_OK(st);
    }
    void *out1 = c->inplace ? dy1.data : dx1.data;
    rmsnorm_status st =
        ln ? rmsnorm_layernorm_backward(ctx, &cfg, rows, d, x1.data, ld, dy1.data, ld + 1, weight,
                                        mean, rstd, out1, lddx, dw1, db1)
           : rmsnorm_backward(ctx, &cfg, rows, d, x1.data, ld, dy1.data, ld + 1, weight, rstd,
                              out1, lddx, dw1, db1);
    TU_OK(st);
    TU_OK(rmsnorm_plan_run(p));
    int ok = same_bytes(&x1, &x2) && same_bytes(&dy1, &dy2) && same_bytes(&dx1, &dx2) &&
             same_bytes(&g1, &g2);
    tu_check(ok, "op %d %s param %s flags %x partial %g dbias %d inplace %d stats %d grads %d: "
             "%zu x %zu pad %zu step %d differs from the one-shot call",
             (int)c->op, tu_dtype_name(c->dt), tu_dtype_name(c->pdt), c->flags, c->partial,
             c->bias, c->inplace, c->stats, grads, rows, d, pad, s);
  }
  rmsnorm_plan_free(p);
  free(stats);
  tu_free(&x1), tu_free(&x2), tu_free(&dy1), tu_free(&dy2), tu_free(&dx1), tu_free(&dx2);
  tu_free(&w), tu_free(&y), tu_free(&g1), tu_free(&g2);
}

/* The backward's ops, dtypes and options on ragged and decode shapes (one
 * thread). The 1-3 row fp16/bf16 calls that read their weight in place and
 * store dweight in the kernel come with variant 0. */
static void check_backward_equal_to_one_shot(rmsnorm_context *ctx) {
  static const rmsnorm_dtype dts[] = {RMSNORM_F32, RMSNORM_F16, RMSNORM_BF16, RMSNORM_F64};
  static const size_t ds_full[] = {1, 2, 7, 31, 64, 65, 127, 128, 576, 896, 2048, 4095, 5120};
  static const size_t ds_reduced[] = {1, 7, 65, 128, 576, 4095};
  static const size_t rows_set[] = {0, 1, 2, 3, 16, 64};
  const size_t *ds = tu_reduced() ? ds_reduced : ds_full;
  size_t nds = tu_reduced() ? sizeof ds_reduced / sizeof *ds : sizeof ds_full / sizeof *ds;
  for (int op = RMSNORM_PLAN_BACKWARD; op <= RMSNORM_PLAN_LAYERNORM_BACKWARD; op++)
    for (size_t t = 0; t < 4; t++)
      for (int variant = 0; variant < 4; variant++) {
        pcase c = {(rmsnorm_plan_op)op, dts[t], dts[t], 0, 1.0, 0, 0, 0};
        int grads = 1;
        if (variant == 1) c.pdt = RMSNORM_F32, c.bias = 1, c.stats = 1;
        if (variant == 2)
          c.flags = RMSNORM_FLAG_WEIGHT_OFFSET | RMSNORM_FLAG_ACCUMULATE, c.inplace = 1;
        if (variant == 3) {
          grads = 0;
          if (op == RMSNORM_PLAN_BACKWARD)
            c.flags = RMSNORM_FLAG_EPS_OUTSIDE, c.partial = 0.25, c.stats = 1;
        }
        for (size_t i = 0; i < nds; i++)
          for (size_t r = 0; r < sizeof rows_set / sizeof *rows_set; r++) {
            if (ds[i] >= 2048 && rows_set[r] > 3) continue;
            check_backward_case(ctx, &c, rows_set[r], ds[i], (i + r) % 3 == 0 ? 0 : 5, 3, grads);
          }
      }
}

/* Work the split gives the context's threads: long rows split by columns
 * when there are fewer rows than threads, and a batch large enough to wake
 * them. */
static void check_threads(rmsnorm_context *ctx) {
  pcase c = {RMSNORM_PLAN_FORWARD, RMSNORM_F32, RMSNORM_F32, 0, 1.0, 1, 0, 1};
  check_case(ctx, &c, 1, (size_t)1 << 17, 0, 2);
  check_case(ctx, &c, 512, 4096, 0, 2);
  c.dt = c.pdt = RMSNORM_BF16;
  check_case(ctx, &c, 512, 4096, 0, 2);
  c.op = RMSNORM_PLAN_ADD_FORWARD;
  check_case(ctx, &c, 512, 4096, 0, 2);
  c.op = RMSNORM_PLAN_LAYERNORM_FORWARD;
  check_case(ctx, &c, 512, 4096, 0, 2);
  /* the backward: long rows by columns, a batch of chunks, more chunks than
   * the reduction's groups */
  pcase bc = {RMSNORM_PLAN_BACKWARD, RMSNORM_F32, RMSNORM_F32, 0, 1.0, 1, 0, 1};
  check_backward_case(ctx, &bc, 1, (size_t)1 << 17, 0, 2, 1);
  check_backward_case(ctx, &bc, 512, 4096, 0, 2, 1);
  bc.dt = bc.pdt = RMSNORM_BF16, bc.bias = 0, bc.stats = 0;
  check_backward_case(ctx, &bc, 512, 4096, 0, 2, 1);
  check_backward_case(ctx, &bc, 16384, 64, 0, 2, 1);
  bc.op = RMSNORM_PLAN_LAYERNORM_BACKWARD, bc.dt = bc.pdt = RMSNORM_F32, bc.bias = 1;
  check_backward_case(ctx, &bc, 512, 4096, 0, 2, 1);
}

/* Misuse: each refused with its status, nothing written. */
static void check_errors(rmsnorm_context *ctx) {
  rmsnorm_config cfg;
  TU_OK(rmsnorm_config_init(&cfg, RMSNORM_F32));
  rmsnorm_plan *p = (rmsnorm_plan *)&cfg;
  tu_check(rmsnorm_plan_create(ctx, &cfg, (rmsnorm_plan_op)99, &p) == RMSNORM_ERROR_BAD_ARGUMENT &&
               p == NULL,
           "unknown op");
  tu_check(rmsnorm_plan_create(NULL, &cfg, RMSNORM_PLAN_FORWARD, &p) ==
               RMSNORM_ERROR_NULL_POINTER, "NULL context");
  tu_check(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_FORWARD, NULL) ==
               RMSNORM_ERROR_NULL_POINTER, "NULL plan pointer");
  cfg.eps = -1;
  tu_check(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_FORWARD, &p) == RMSNORM_ERROR_BAD_EPS,
           "bad eps");
  cfg.eps = 1e-6;
  cfg.flags = RMSNORM_FLAG_ACCUMULATE;
  tu_check(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_ADD_FORWARD, &p) ==
               RMSNORM_ERROR_BAD_FLAGS, "add refuses ACCUMULATE");
  cfg.flags = RMSNORM_FLAG_EPS_OUTSIDE;
  tu_check(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_LAYERNORM_FORWARD, &p) ==
               RMSNORM_ERROR_BAD_FLAGS, "LayerNorm refuses EPS_OUTSIDE");
  cfg.flags = 0;

  float x[64], y[64], w[8], mean[8];
  for (int i = 0; i < 64; i++) x[i] = (float)i, y[i] = -1;
  for (int i = 0; i < 8; i++) w[i] = 1;
  TU_OK(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_FORWARD, &p));
  tu_check(rmsnorm_plan_run(p) == RMSNORM_ERROR_BAD_ARGUMENT, "run before reshape");
  tu_check(rmsnorm_plan_setup_forward(p, x, w, NULL, y, NULL, NULL) ==
               RMSNORM_ERROR_BAD_ARGUMENT, "setup before reshape");
  tu_check(rmsnorm_plan_reshape(p, 4, 0, 8, 0, 8) == RMSNORM_ERROR_BAD_SIZE, "d 0");
  tu_check(rmsnorm_plan_reshape(p, 4, 8, 7, 0, 8) == RMSNORM_ERROR_BAD_STRIDE, "ldx < d");
  tu_check(rmsnorm_plan_reshape(p, 4, 8, 8, 8, 8) == RMSNORM_ERROR_BAD_ARGUMENT,
           "ldu without u");
  TU_OK(rmsnorm_plan_reshape(p, 4, 8, 8, 0, 8));
  tu_check(rmsnorm_plan_run(p) == RMSNORM_ERROR_BAD_ARGUMENT, "run before setup");
  tu_check(rmsnorm_plan_setup_forward(p, x, w, NULL, y, mean, NULL) ==
               RMSNORM_ERROR_BAD_ARGUMENT, "mean for RMSNorm");
  tu_check(rmsnorm_plan_setup_add(p, x, x + 32, w, NULL, y, NULL) == RMSNORM_ERROR_BAD_ARGUMENT,
           "add setup on a forward plan");
  tu_check(rmsnorm_plan_setup_forward(p, NULL, w, NULL, y, NULL, NULL) ==
               RMSNORM_ERROR_NULL_POINTER, "NULL x");
  tu_check(rmsnorm_plan_setup_forward(p, x, w, NULL, x + 4, NULL, NULL) ==
               RMSNORM_ERROR_OVERLAP, "y over x, shifted");
  tu_check(rmsnorm_plan_run(p) == RMSNORM_ERROR_BAD_ARGUMENT, "run after a failed setup");
  for (int i = 0; i < 64; i++) tu_check(y[i] == -1 && x[i] == (float)i, "nothing written");
  TU_OK(rmsnorm_plan_setup_forward(p, x, w, NULL, y, NULL, NULL));
  TU_OK(rmsnorm_plan_run(p));
  tu_check(y[0] == 0 && y[1] != -1, "run writes y");
  TU_OK(rmsnorm_plan_reshape(p, 2, 8, 8, 0, 8));
  tu_check(rmsnorm_plan_run(p) == RMSNORM_ERROR_BAD_ARGUMENT, "run after reshape, no setup");
  tu_check(rmsnorm_plan_run(NULL) == RMSNORM_ERROR_NULL_POINTER, "run NULL");
  rmsnorm_plan_free(p);
  rmsnorm_plan_free(NULL);

  /* add: h is an output and must not meet y; y may be exactly u */
  TU_OK(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_ADD_FORWARD, &p));
  TU_OK(rmsnorm_plan_reshape(p, 2, 8, 8, 8, 8));
  tu_check(rmsnorm_plan_setup_forward(p, x, w, NULL, y, NULL, NULL) ==
               RMSNORM_ERROR_BAD_ARGUMENT, "forward setup on an add plan");
  tu_check(rmsnorm_plan_setup_add(p, x, x + 16, w, NULL, x, NULL) == RMSNORM_ERROR_OVERLAP,
           "y is h");
  TU_OK(rmsnorm_plan_setup_add(p, x, x + 16, w, NULL, x + 16, NULL));
  rmsnorm_plan_free(p);

  /* backward: its setup alone, its checks, nothing written on a refusal */
  float dy[64], dw[8];
  for (int i = 0; i < 64; i++) dy[i] = 1, y[i] = -1;
  for (int i = 0; i < 8; i++) dw[i] = -1;
  TU_OK(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_BACKWARD, &p));
  tu_check(rmsnorm_plan_setup_backward(p, x, dy, w, NULL, NULL, y, dw, NULL) ==
               RMSNORM_ERROR_BAD_ARGUMENT, "backward setup before reshape");
  TU_OK(rmsnorm_plan_reshape(p, 4, 8, 8, 8, 8));
  tu_check(rmsnorm_plan_setup_forward(p, x, w, NULL, y, NULL, NULL) ==
               RMSNORM_ERROR_BAD_ARGUMENT, "forward setup on a backward plan");
  tu_check(rmsnorm_plan_setup_backward(p, x, dy, w, mean, NULL, y, dw, NULL) ==
               RMSNORM_ERROR_BAD_ARGUMENT, "mean for the RMSNorm backward");
  tu_check(rmsnorm_plan_setup_backward(p, x, dy, NULL, NULL, NULL, y, dw, NULL) ==
               RMSNORM_ERROR_BAD_ARGUMENT, "dweight without a weight");
  tu_check(rmsnorm_plan_setup_backward(p, x, NULL, w, NULL, NULL, y, dw, NULL) ==
               RMSNORM_ERROR_NULL_POINTER, "NULL dy");
  tu_check(rmsnorm_plan_setup_backward(p, x, dy, w, NULL, NULL, x + 4, dw, NULL) ==
               RMSNORM_ERROR_OVERLAP, "dx over x, shifted");
  tu_check(rmsnorm_plan_setup_backward(p, x, dy, w, NULL, NULL, y, y + 4, NULL) ==
               RMSNORM_ERROR_OVERLAP, "dweight in dx");
  tu_check(rmsnorm_plan_run(p) == RMSNORM_ERROR_BAD_ARGUMENT, "backward run after a failed setup");
  for (int i = 0; i < 64; i++) tu_check(y[i] == -1 && x[i] == (float)i, "nothing written");
  for (int i = 0; i < 8; i++) tu_check(dw[i] == -1, "no dweight written");
  TU_OK(rmsnorm_plan_setup_backward(p, x, dy, w, NULL, NULL, dy, dw, NULL)); /* dx is dy */
  TU_OK(rmsnorm_plan_run(p));
  tu_check(dw[0] != -1 && dy[1] != 1, "the backward run writes dx and dweight");
  tu_check(rmsnorm_plan_reshape(p, 4, 8, 8, 7, 8) == RMSNORM_ERROR_BAD_STRIDE, "lddy < d");
  rmsnorm_plan_free(p);
  TU_OK(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_LAYERNORM_BACKWARD, &p));
  TU_OK(rmsnorm_plan_reshape(p, 0, 8, 8, 8, 8));
  TU_OK(rmsnorm_plan_setup_backward(p, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL));
  TU_OK(rmsnorm_plan_run(p)); /* no rows: nothing to do */
  rmsnorm_plan_free(p);

  /* weight values are read at setup when they are converted: a bf16 weight
   * changed after setup counts from the next setup */
  rmsnorm_config bcfg;
  TU_OK(rmsnorm_config_init(&bcfg, RMSNORM_BF16));
  uint16_t bx[8], by[8], bw[8];
  for (int i = 0; i < 8; i++) bx[i] = 0x3f80, bw[i] = 0x3f80; /* 1.0 */
  TU_OK(rmsnorm_plan_create(ctx, &bcfg, RMSNORM_PLAN_FORWARD, &p));
  TU_OK(rmsnorm_plan_reshape(p, 1, 8, 8, 0, 8));
  TU_OK(rmsnorm_plan_setup_forward(p, bx, bw, NULL, by, NULL, NULL));
  for (int i = 0; i < 8; i++) bw[i] = 0x4000; /* 2.0 */
  TU_OK(rmsnorm_plan_run(p));
  tu_check(by[0] == 0x3f80, "bf16 weight as at setup: %04x", by[0]);
  TU_OK(rmsnorm_plan_setup_forward(p, bx, bw, NULL, by, NULL, NULL));
  TU_OK(rmsnorm_plan_run(p));
  tu_check(by[0] == 0x4000, "bf16 weight after a new setup: %04x", by[0]);
  rmsnorm_plan_free(p);
}

int main(void) {
  static const rmsnorm_isa isas[] = {RMSNORM_ISA_SCALAR, RMSNORM_ISA_AVX2, RMSNORM_ISA_AVX512,
                                     RMSNORM_ISA_NEON};
  rmsnorm_context *ctx;
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) return 2;
  check_errors(ctx);
  for (size_t i = 0; i < sizeof isas / sizeof *isas; i++) {
    if (rmsnorm_context_set_isa(ctx, isas[i]) != RMSNORM_OK) continue;
    tu_check(rmsnorm_context_set_threads(ctx, 1) == RMSNORM_OK, "one thread");
    check_equal_to_one_shot(ctx);
    check_backward_equal_to_one_shot(ctx);
    check_threads(ctx);
    tu_check(rmsnorm_context_set_threads(ctx, 2) == RMSNORM_OK, "two threads");
    check_threads(ctx);
  }
  rmsnorm_context_free(ctx);
  return tu_finish("test_plan");
}
