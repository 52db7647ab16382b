/* test_plan_fused.c - the fused forwards' plans (sandwich, quantized, add +
 * quantized, gated) against the one-shot calls they prepare: the same bytes
 * for every kernel set, dtype, option, format, shape, stride and in-place
 * use, on one thread and on two (the calls are tested against their oracles
 * elsewhere); a plan run many times on new data; misuse refused with its
 * status and nothing written. */
#include "testutil.h"

typedef struct fcase {
  rmsnorm_plan_op op;
  rmsnorm_dtype dt, pdt;
  unsigned flags;
  double partial;
  int inplace, stats;
  rmsnorm_quant q;   /* quantized plans */
  rmsnorm_gate gate; /* gated plans */
} fcase;

/* One side's buffers: x and u (sandwich: a and h; add: h and u; gated: x and
 * z), y (x_next, y) or codes and scales, two statistics arrays. */
typedef struct side {
  tu_tensor x, u, y;
  unsigned char *codes, *scales;
  char *stats;
} side;

typedef struct shape {
  size_t rows, d, ld, ldc, lds, row_bytes, scale_bytes, nstats, as;
} shape;

static int quantized_op(rmsnorm_plan_op op) {
  return op == RMSNORM_PLAN_FORWARD_QUANTIZED || op == RMSNORM_PLAN_ADD_FORWARD_QUANTIZED;
}

static side side_alloc(const fcase *c, const shape *s) {
  side b;
  b.x = tu_alloc(c->dt, s->rows, s->d, s->ld);
  b.u = tu_alloc(c->dt, s->rows, s->d, s->ld + 1);
  b.y = tu_alloc(c->dt, s->rows, s->d, s->ld + 3);
  b.codes = malloc(s->rows * s->ldc + 1);
  b.scales = malloc(s->rows * s->lds * s->scale_bytes + 1);
  b.stats = malloc(2 * s->nstats * s->as + 1);
  return b;
}

static void side_free(side *b) {
  tu_free(&b->x), tu_free(&b->u), tu_free(&b->y);
  free(b->codes), free(b->scales), free(b->stats);
}

static int same(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

static int sides_equal(const side *a, const side *b, const shape *s) {
  return same(a->x.data, b->x.data, a->x.bytes) && same(a->u.data, b->u.data, a->u.bytes) &&
         same(a->y.data, b->y.data, a->y.bytes) &&
         same(a->codes, b->codes, s->rows * s->ldc) &&
         same(a->scales, b->scales, s->rows * s->lds * s->scale_bytes) &&
         same(a->stats, b->stats, 2 * s->nstats * s->as);
}

/* A side's outputs for case c: y, or in place over x (sandwich: a; gated:
 * x) or u (gated: z), with its stride; the statistics (two arrays) where
 * the case keeps them; the scales where the format has them. */
typedef struct outs {
  void *y, *r1, *r2, *scales;
  size_t ldy;
} outs;

static outs outs_of(const fcase *c, const shape *s, side *b) {
  outs o;
  const tu_tensor *t = c->inplace == 1 ? &b->x : c->inplace == 2 ? &b->u : &b->y;
  o.y = t->data, o.ldy = t->ld;
  o.r1 = c->stats ? b->stats : NULL;
  o.r2 = c->stats ? b->stats + s->nstats * s->as : NULL;
  o.scales = s->lds ? b->scales : NULL;
  return o;
}

static rmsnorm_status one_shot(rmsnorm_context *ctx, const rmsnorm_config *cfg, const fcase *c,
                               const shape *s, side *b, const void *w, const void *w2) {
  outs o = outs_of(c, s, b);
  switch (c->op) {
  case RMSNORM_PLAN_SANDWICH_FORWARD:
    return rmsnorm_sandwich_forward(ctx, cfg, s->rows, s->d, b->x.data, b->x.ld, b->u.data,
                                    b->u.ld, w, w2, o.y, o.ldy, o.r1, o.r2);
  case RMSNORM_PLAN_FORWARD_QUANTIZED:
    return rmsnorm_forward_quantized(ctx, cfg, s->rows, s->d, b->x.data, b->x.ld, w, w2, &c->q,
                                     b->codes, s->ldc, o.scales, s->lds, o.r1);
  case RMSNORM_PLAN_ADD_FORWARD_QUANTIZED:
    return rmsnorm_add_forward_quantized(ctx, cfg, s->rows, s->d, b->x.data, b->x.ld, b->u.data,
                                         b->u.ld, w, w2, &c->q, b->codes, s->ldc, o.scales,
                                         s->lds, o.r1);
  default:
    return rmsnorm_gated_forward(ctx, cfg, &c->gate, s->rows, s->d, b->x.data, b->x.ld,
                                 b->u.data, b->u.ld, w, o.y, o.ldy, o.r1);
  }
}

static rmsnorm_status plan_setup(rmsnorm_plan *p, const fcase *c, const shape *s, side *b,
                                 const void *w, const void *w2) {
  outs o = outs_of(c, s, b);
  switch (c->op) {
  case RMSNORM_PLAN_SANDWICH_FORWARD:
    return rmsnorm_plan_setup_sandwich(p, b->x.data, b->u.data, w, w2, o.y, o.r1, o.r2);
  case RMSNORM_PLAN_FORWARD_QUANTIZED:
    return rmsnorm_plan_setup_quantized(p, b->x.data, w, w2, &c->q, b->codes, s->ldc, o.scales,
                                        s->lds, o.r1);
  case RMSNORM_PLAN_ADD_FORWARD_QUANTIZED:
    return rmsnorm_plan_setup_add_quantized(p, b->x.data, b->u.data, w, w2, &c->q, b->codes,
                                            s->ldc, o.scales, s->lds, o.r1);
  default:
    return rmsnorm_plan_setup_gated(p, &c->gate, b->x.data, b->u.data, w, o.y, o.r1);
  }
}

/* One case: the plan, set up once, run `steps` times on new inputs, each
 * step compared with the one-shot call on a copy of the same inputs. */
static void check_case(rmsnorm_context *ctx, const fcase *c, size_t rows, size_t d, size_t pad,
                       int steps) {
  rmsnorm_config cfg;
  TU_OK(rmsnorm_config_init(&cfg, c->dt));
  cfg.param_dtype = c->pdt;
  cfg.flags = c->flags;
  cfg.partial = c->partial;
  shape s = {rows, d, d + pad, 0, 0, 0, 1, rows, c->dt == RMSNORM_F64 ? 8 : 4};
  int quantized = quantized_op(c->op);
  if (quantized) {
    TU_OK(rmsnorm_quant_row_size(&c->q, d, &s.row_bytes, &s.lds));
    s.ldc = s.row_bytes + pad;
    s.scale_bytes = c->q.flags & RMSNORM_QUANT_SCALE_E8M0 || c->q.format == RMSNORM_QF_MXFP8_E4M3
                        ? 1 : 4;
    if (s.lds) s.lds += pad;
  }
  if (c->op == RMSNORM_PLAN_GATED_FORWARD && c->gate.group) s.nstats = rows * (d / c->gate.group);
  side b1 = side_alloc(c, &s), b2 = side_alloc(c, &s);
  tu_tensor w = tu_alloc(c->pdt, 1, d, d), w2 = tu_alloc(c->pdt, 1, d, d);
  tu_fill_sum4(&w, 0.5);
  tu_fill_sum4(&w2, 0.3);
  /* sandwich: weight_pre; quantized: the bias (every other case) */
  const void *second = c->op == RMSNORM_PLAN_SANDWICH_FORWARD || (quantized && (rows + d) % 2)
                           ? w2.data : NULL;

  rmsnorm_plan *p;
  TU_OK(rmsnorm_plan_create(ctx, &cfg, c->op, &p));
  size_t ldo = outs_of(c, &s, &b2).ldy;
  int second_input = c->op != RMSNORM_PLAN_FORWARD_QUANTIZED;
  TU_OK(rmsnorm_plan_reshape(p, rows, d, s.ld, second_input ? s.ld + 1 : 0, quantized ? 0 : ldo));
  TU_OK(plan_setup(p, c, &s, &b2, w.data, second));
  for (int step = 0; step < steps; step++) {
    tu_fill_sum4(&b1.x, step == 1 ? 1e-3 : 1.0);
    tu_fill_sum4(&b1.u, 2.0);
    if (rows && d > 2) tu_set(&b1.x, 0, d / 2, 40.0); /* an outlier channel */
    memcpy(b2.x.data, b1.x.data, b1.x.bytes);
    memcpy(b2.u.data, b1.u.data, b1.u.bytes);
    side *bs[2] = {&b1, &b2};
    for (int k = 0; k < 2; k++) {
      memset(bs[k]->y.data, 0x7f, bs[k]->y.bytes);
      memset(bs[k]->codes, 0x5a, s.rows * s.ldc + 1);
      memset(bs[k]->scales, 0x5a, s.rows * s.lds * s.scale_bytes + 1);
      memset(bs[k]->stats, 0x5a, 2 * s.nstats * s.as + 1);
    }
    TU_OK(one_shot(ctx, &cfg, c, &s, &b1, w.data, second));
    TU_OK(rmsnorm_plan_run(p));
    tu_check(sides_equal(&b1, &b2, &s),
             "op %d %s param %s flags %x partial %g inplace %d stats %d format %d group %zu "
             "qflags %x act %d gate group %zu gflags %x: %zu x %zu pad %zu step %d differs "
             "from the one-shot call",
             (int)c->op, tu_dtype_name(c->dt), tu_dtype_name(c->pdt), c->flags, c->partial,
             c->inplace, c->stats, (int)c->q.format, c->q.group, c->q.flags, (int)c->gate.act,
             c->gate.group, c->gate.flags, rows, d, pad, step);
  }
  rmsnorm_plan_free(p);
  side_free(&b1), side_free(&b2);
  tu_free(&w), tu_free(&w2);
}

static const rmsnorm_dtype dts[] = {RMSNORM_F32, RMSNORM_F16, RMSNORM_BF16, RMSNORM_F64};
static const size_t rows_set[] = {0, 1, 3, 16, 64};

static fcase base(rmsnorm_plan_op op, rmsnorm_dtype dt) {
  fcase c;
  memset(&c, 0, sizeof c);
  c.op = op, c.dt = c.pdt = dt, c.partial = 1.0;
  rmsnorm_quant_init(&c.q, RMSNORM_QF_Q8_0);
  rmsnorm_gate_init(&c.gate, RMSNORM_GATE_SILU);
  return c;
}

static void check_sandwich(rmsnorm_context *ctx) {
  static const size_t ds_full[] = {1, 7, 64, 65, 128, 576, 2048, 4095};
  static const size_t ds_reduced[] = {7, 128, 576};
  const size_t *ds = tu_reduced() ? ds_reduced : ds_full;
  size_t nds = tu_reduced() ? 3 : sizeof ds_full / sizeof *ds_full;
  for (size_t t = 0; t < 4; t++)
    for (int variant = 0; variant < 3; variant++) {
      fcase c = base(RMSNORM_PLAN_SANDWICH_FORWARD, dts[t]);
      /* Gemma: fp32 weights, 1 + g, x_next over a; pRMSNorm (the
       * block-by-block path) with the statistics */
      if (variant == 1) c.pdt = RMSNORM_F32, c.flags = RMSNORM_FLAG_WEIGHT_OFFSET, c.inplace = 1;
      if (variant == 2) c.partial = 0.5, c.stats = 1;
      for (size_t i = 0; i < nds; i++)
        for (size_t r = 0; r < sizeof rows_set / sizeof *rows_set; r++)
          check_case(ctx, &c, rows_set[r], ds[i], (i + r) % 3 == 0 ? 0 : 5, 2);
    }
}

static void check_quantized(rmsnorm_context *ctx) {
  static const size_t ds_full[] = {256, 512, 2048, 4096};
  static const size_t ds_reduced[] = {256, 2048};
  const size_t *ds = tu_reduced() ? ds_reduced : ds_full;
  size_t nds = tu_reduced() ? 2 : sizeof ds_full / sizeof *ds_full;
  static const float static_scale = 0.05f;
  for (int add = 0; add < 2; add++)
    for (size_t t = 0; t < 4; t++)
      for (int f = 0; f < 10; f++) {
        fcase c = base(add ? RMSNORM_PLAN_ADD_FORWARD_QUANTIZED : RMSNORM_PLAN_FORWARD_QUANTIZED,
                       dts[t]);
        static const rmsnorm_qformat formats[] = {
            RMSNORM_QF_Q8_0,  RMSNORM_QF_Q8_1,      RMSNORM_QF_Q8_K, RMSNORM_QF_MXFP8_E4M3,
            RMSNORM_QF_MXFP4, RMSNORM_QF_INT8,      RMSNORM_QF_INT8, RMSNORM_QF_FP8_E4M3,
            RMSNORM_QF_INT8,  RMSNORM_QF_FP8_E4M3};
        rmsnorm_quant_init(&c.q, formats[f]);
        if (f == 6) c.q.group = 32, c.q.flags = RMSNORM_QUANT_SCALE_E8M0;
        if (f == 7) c.q.group = 128, c.q.flags = RMSNORM_QUANT_SCALE_POW2;
        if (f == 8) c.q.static_scale = &static_scale;
        if (f % 2) c.pdt = RMSNORM_F32, c.stats = 1;
        if (f == 9) c.flags = RMSNORM_FLAG_WEIGHT_OFFSET;
        for (size_t i = 0; i < nds; i++)
          for (size_t r = 0; r < sizeof rows_set / sizeof *rows_set; r++)
            check_case(ctx, &c, rows_set[r], ds[i], (i + r + (size_t)f) % 3 == 0 ? 0 : 3, 2);
      }
}

static void check_gated(rmsnorm_context *ctx) {
  static const size_t ds_full[] = {8, 64, 128, 576, 2048, 4096};
  static const size_t ds_reduced[] = {64, 576};
  const size_t *ds = tu_reduced() ? ds_reduced : ds_full;
  size_t nds = tu_reduced() ? 2 : sizeof ds_full / sizeof *ds_full;
  for (size_t t = 0; t < 4; t++)
    for (int variant = 0; variant < 4; variant++) {
      fcase c = base(RMSNORM_PLAN_GATED_FORWARD, dts[t]);
      /* Mamba2 (group d / 4, y over x), norm first with sigmoid (y over
       * z), an fp32 weight under 1 + g with the statistics */
      if (variant == 1) c.gate.group = 0, c.inplace = 1; /* group set per d below */
      if (variant == 2)
        rmsnorm_gate_init(&c.gate, RMSNORM_GATE_SIGMOID), c.gate.flags = RMSNORM_GATE_NORM_FIRST,
            c.inplace = 2;
      if (variant == 3) c.pdt = RMSNORM_F32, c.flags = RMSNORM_FLAG_WEIGHT_OFFSET, c.stats = 1;
      for (size_t i = 0; i < nds; i++) {
        if (variant == 1) c.gate.group = ds[i] / 4;
        for (size_t r = 0; r < sizeof rows_set / sizeof *rows_set; r++)
          check_case(ctx, &c, rows_set[r], ds[i], (i + r) % 3 == 0 ? 0 : 5, 2);
      }
    }
}

/* Splits of several tasks (two threads): each plan's own scratch per task. */
static void check_threads(rmsnorm_context *ctx) {
  fcase c = base(RMSNORM_PLAN_SANDWICH_FORWARD, RMSNORM_BF16);
  check_case(ctx, &c, 512, 4096, 0, 2);
  c.op = RMSNORM_PLAN_FORWARD_QUANTIZED;
  check_case(ctx, &c, 512, 4096, 0, 2);
  c.op = RMSNORM_PLAN_ADD_FORWARD_QUANTIZED, c.dt = c.pdt = RMSNORM_F32;
  check_case(ctx, &c, 512, 4096, 0, 2);
  c.op = RMSNORM_PLAN_GATED_FORWARD, c.stats = 1;
  check_case(ctx, &c, 256, 4096, 0, 2);
}

/* Misuse: each refused with its status, nothing written. */
static void check_errors(rmsnorm_context *ctx) {
  rmsnorm_config cfg;
  TU_OK(rmsnorm_config_init(&cfg, RMSNORM_F32));
  rmsnorm_plan *p = NULL;
  cfg.flags = RMSNORM_FLAG_ACCUMULATE;
  for (int op = RMSNORM_PLAN_SANDWICH_FORWARD; op <= RMSNORM_PLAN_GATED_FORWARD; op++)
    tu_check(rmsnorm_plan_create(ctx, &cfg, (rmsnorm_plan_op)op, &p) == RMSNORM_ERROR_BAD_FLAGS &&
                 p == NULL, "op %d refuses ACCUMULATE", op);
  cfg.flags = RMSNORM_FLAG_EPS_OUTSIDE;
  tu_check(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_GATED_FORWARD, &p) ==
               RMSNORM_ERROR_BAD_FLAGS, "gated refuses EPS_OUTSIDE");
  cfg.flags = 0, cfg.partial = 0.5;
  tu_check(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_GATED_FORWARD, &p) ==
               RMSNORM_ERROR_BAD_PARTIAL, "gated refuses a partial norm");
  cfg.partial = 1.0;

  float x[64 * 2], h[64], y[64], w[32];
  unsigned char codes[2 * 34 + 8];
  for (int i = 0; i < 128; i++) x[i] = (float)i;
  for (int i = 0; i < 64; i++) h[i] = 1, y[i] = -1;
  for (int i = 0; i < 32; i++) w[i] = 1;
  memset(codes, 0x5a, sizeof codes);
  rmsnorm_quant q;
  rmsnorm_quant_init(&q, RMSNORM_QF_Q8_0);
  rmsnorm_gate g;
  rmsnorm_gate_init(&g, RMSNORM_GATE_SILU);

  /* quantized: the codes' stride comes at setup, with the format */
  TU_OK(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_FORWARD_QUANTIZED, &p));
  tu_check(rmsnorm_plan_setup_quantized(p, x, w, NULL, &q, codes, 34, NULL, 0, NULL) ==
               RMSNORM_ERROR_BAD_ARGUMENT, "setup before reshape");
  tu_check(rmsnorm_plan_reshape(p, 2, 32, 32, 0, 34) == RMSNORM_ERROR_BAD_ARGUMENT,
           "a quantized plan's ldy is 0");
  tu_check(rmsnorm_plan_reshape(p, 2, 32, 32, 32, 0) == RMSNORM_ERROR_BAD_ARGUMENT,
           "no u without the add");
  TU_OK(rmsnorm_plan_reshape(p, 2, 32, 64, 0, 0));
  tu_check(rmsnorm_plan_setup_quantized(p, x, w, NULL, NULL, codes, 34, NULL, 0, NULL) ==
               RMSNORM_ERROR_NULL_POINTER, "NULL format");
  tu_check(rmsnorm_plan_setup_quantized(p, x, w, NULL, &q, codes, 33, NULL, 0, NULL) ==
               RMSNORM_ERROR_BAD_STRIDE, "ldc below the row's bytes");
  tu_check(rmsnorm_plan_setup_quantized(p, x, w, NULL, &q, codes, 34, y, 1, NULL) ==
               RMSNORM_ERROR_BAD_ARGUMENT, "scales for Q8_0");
  tu_check(rmsnorm_plan_setup_forward(p, x, w, NULL, y, NULL, NULL) ==
               RMSNORM_ERROR_BAD_ARGUMENT, "the forward's setup on a quantized plan");
  tu_check(rmsnorm_plan_run(p) == RMSNORM_ERROR_BAD_ARGUMENT, "run after failed setups");
  rmsnorm_quant_init(&q, RMSNORM_QF_Q8_K);
  tu_check(rmsnorm_plan_setup_quantized(p, x, w, NULL, &q, codes, 34, NULL, 0, NULL) ==
               RMSNORM_ERROR_BAD_SIZE, "d not a multiple of Q8_K's block");
  rmsnorm_quant_init(&q, RMSNORM_QF_Q8_0);
  tu_check(rmsnorm_plan_setup_quantized(p, x, w, NULL, &q, (unsigned char *)x + 8, 34, NULL, 0,
                                        NULL) == RMSNORM_ERROR_OVERLAP, "codes over x");
  rmsnorm_plan_free(p);

  TU_OK(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_ADD_FORWARD_QUANTIZED, &p));
  TU_OK(rmsnorm_plan_reshape(p, 2, 32, 32, 32, 0));
  tu_check(rmsnorm_plan_setup_quantized(p, h, w, NULL, &q, codes, 34, NULL, 0, NULL) ==
               RMSNORM_ERROR_BAD_ARGUMENT, "the plain setup on an add plan");
  tu_check(rmsnorm_plan_setup_add_quantized(p, h, NULL, w, NULL, &q, codes, 34, NULL, 0, NULL) ==
               RMSNORM_ERROR_NULL_POINTER, "NULL u");
  rmsnorm_plan_free(p);

  TU_OK(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_SANDWICH_FORWARD, &p));
  TU_OK(rmsnorm_plan_reshape(p, 2, 32, 32, 32, 32));
  tu_check(rmsnorm_plan_setup_sandwich(p, x, h, w, w, h, NULL, NULL) == RMSNORM_ERROR_OVERLAP,
           "x_next over h");
  tu_check(rmsnorm_plan_setup_sandwich(p, x, NULL, w, w, y, NULL, NULL) ==
               RMSNORM_ERROR_NULL_POINTER, "NULL h");
  tu_check(rmsnorm_plan_setup_gated(p, &g, x, h, w, y, NULL) == RMSNORM_ERROR_BAD_ARGUMENT,
           "the gated setup on a sandwich plan");
  rmsnorm_plan_free(p);

  TU_OK(rmsnorm_plan_create(ctx, &cfg, RMSNORM_PLAN_GATED_FORWARD, &p));
  TU_OK(rmsnorm_plan_reshape(p, 2, 32, 32, 32, 32));
  g.group = 5;
  tu_check(rmsnorm_plan_setup_gated(p, &g, x, h, w, y, NULL) == RMSNORM_ERROR_BAD_SIZE,
           "a group that does not divide d");
  g.group = 0, g.act = (rmsnorm_gate_act)9;
  tu_check(rmsnorm_plan_setup_gated(p, &g, x, h, w, y, NULL) == RMSNORM_ERROR_BAD_ARGUMENT,
           "an unknown act");
  tu_check(rmsnorm_plan_setup_gated(p, NULL, x, h, w, y, NULL) == RMSNORM_ERROR_NULL_POINTER,
           "NULL gate");
  rmsnorm_plan_free(p);

  for (int i = 0; i < 128; i++) tu_check(x[i] == (float)i, "x unchanged");
  for (int i = 0; i < 64; i++) tu_check(h[i] == 1 && y[i] == -1, "nothing written");
  for (size_t i = 0; i < sizeof codes; i++) tu_check(codes[i] == 0x5a, "no codes written");
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
    check_sandwich(ctx);
    check_quantized(ctx);
    check_gated(ctx);
    check_threads(ctx);
    tu_check(rmsnorm_context_set_threads(ctx, 2) == RMSNORM_OK, "two threads");
    check_threads(ctx);
  }
  rmsnorm_context_free(ctx);
  return tu_finish("test_plan_fused");
}
