/* test_fused.c - the fused commands add-forward, sandwich and linear, and
 * gated: bit for bit with the library's calls, near an unfused oracle (for
 * gated: gated_oracle.h); in place, 1-d, no rows. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../gated_oracle.h"
#include "cli_fixture.h"

typedef struct fcase {
  norm_opts o;    /* dims: add-forward only */
  int weight;     /* 0 none, 1 in the data's dtype, 2 float32 */
  int bias;       /* add-forward: the norm's bias; linear: the linear bias (shape (N,)) */
  int stats;      /* --rstd */
  int residual;   /* add-forward: --residual-out */
} fcase;

static const fcase add_cases[] = {
  {{0, -1, 0, 0, 0}, 0, 0, 0, 0},
  {{0, 0.25, 0, 0, 0}, 1, 1, 1, 1},
  {{0, 0.25, 1, 0, 0.5}, 2, 2, 1, 1},
  {{0, 0.01, 0, 1, 0}, 1, 0, 0, 1},
  {{2, 0.25, 0, 0, 0}, 2, 0, 1, 1},
};

static const fcase linear_cases[] = {
  {{0, -1, 0, 0, 0}, 0, 0, 0, 0},
  {{0, 0.25, 0, 0, 0}, 1, 1, 1, 0},
  {{0, 0.25, 1, 0, 0.5}, 2, 2, 1, 0},
  {{0, 0.01, 0, 1, 0}, 1, 0, 1, 0},
  {{0, 0.25, 0, 0, 0}, 0, 2, 0, 0},
};

/* Checks a float32 statistics file (n values of the given shape) against the
 * library's values (float, or double rounded) and the oracle. */
static void check_stat_file(const char *label, const char *path, tdt dt, int ndim,
                            const size_t *shape, size_t rows, const unsigned char *lib,
                            const ld *oracle) {
  arr got;
  if (!read_npy(path, TF32, ndim, shape, &got)) return;
  for (size_t i = 0; i < rows; i++) {
    float want = dt == TF64 ? (float)((const double *)(const void *)lib)[i]
                            : ((const float *)(const void *)lib)[i];
    float have;
    memcpy(&have, got.bytes + 4 * i, 4);
    tu_check(memcmp(&want, &have, 4) == 0, "%s: %s[%zu] %g, library %g", label, path, i, have,
             want);
  }
  close_all(label, &got, oracle, rows, 1e-5);
  arr_free(&got);
}

static void check_rstd_file(const char *label, tdt dt, int lead, const size_t *shape, size_t rows,
                            const unsigned char *lib, const ld *oracle) {
  check_stat_file(label, "rstd.npy", dt, lead, shape, rows, lib, oracle);
}

/* add-forward H U: y and h' bit for bit as rmsnorm_add_forward gives them, and
 * against the oracle: h' = h + u rounded to the dtype, y = RMSNorm(h'). */
static void run_add_case(const fcase *c, tdt dt) {
  static const size_t shape[3] = {3, 5, 8};
  int k = c->o.dims ? c->o.dims : 1, lead = 3 - k;
  size_t rows = 1, d = 1;
  for (int i = 0; i < lead; i++) rows *= shape[i];
  for (int i = lead; i < 3; i++) d *= shape[i];
  tdt pdt = c->weight ? (c->weight == 2 ? TF32 : dt) : c->bias ? (c->bias == 2 ? TF32 : dt) : dt;
  char label[160];
  snprintf(label, sizeof label, "add-forward %s dims=%d eps=%g%s%s p=%g w=%d b=%d", tdt_name[dt],
           k, c->o.eps, c->o.eps_outside ? " eps-outside" : "", c->o.offset ? " offset" : "",
           c->o.partial, c->weight, c->bias);
  arr h = npy_fixture("h.npy", dt, 3, shape, FILL_DATA);
  arr u = npy_fixture("u.npy", dt, 3, shape, FILL_DATA);
  arr w = npy_fixture("w.npy", pdt, k, shape + lead, c->o.offset ? FILL_OFFSET_GAIN : FILL_GAIN);
  arr b = npy_fixture("b.npy", pdt, k, shape + lead, FILL_DATA);
  unlink("out.npy"), unlink("h2.npy"), unlink("rstd.npy");

  const char *args[40];
  norm_opts_text opt_text;
  int n = 0;
  args[n++] = "add-forward", args[n++] = "h.npy", args[n++] = "u.npy";
  args[n++] = "-o", args[n++] = "out.npy";
  if (c->residual) args[n++] = "--residual-out", args[n++] = "h2.npy";
  if (c->stats) args[n++] = "--rstd", args[n++] = "rstd.npy";
  if (c->weight) args[n++] = "--weight", args[n++] = "w.npy";
  if (c->bias) args[n++] = "--bias", args[n++] = "b.npy";
  norm_opts_args(&c->o, dt, args, n, &opt_text);
  if (!run_ok(label, args)) goto done;

  /* the library on a copy of h (it updates h in place) */
  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  rmsnorm_context_create(&ctx);
  norm_opts_config(&c->o, dt, pdt, &cfg);
  unsigned char *lh = malloc(h.n * tdt_size[dt]), *ly = calloc(h.n, tdt_size[dt]),
                *lr = calloc(rows + 1, 8);
  memcpy(lh, h.bytes, h.n * tdt_size[dt]);
  rmsnorm_status st = rmsnorm_add_forward(ctx, &cfg, rows, d, lh, d, u.bytes, d,
                                          c->weight ? w.bytes : NULL, c->bias ? b.bytes : NULL,
                                          ly, d, lr);
  rmsnorm_context_free(ctx);
  tu_check(st == RMSNORM_OK, "%s: library: %s", label, rmsnorm_status_name(st));

  /* the oracle: h' rounded to the dtype (exactly representable inputs, so the
   * double sum is exact), then the textbook RMSNorm of it */
  arr hp = arr_new(dt, 3, shape);
  for (size_t i = 0; i < h.n; i++) {
    store(dt, hp.bytes, i, h.v[i] + u.v[i]);
    hp.v[i] = load(dt, hp.bytes, i);
  }
  oracle_cfg oc = norm_opts_oracle(&c->o, dt, 0);
  ld *oy = calloc(h.n, sizeof(ld)), *om = calloc(rows + 1, sizeof(ld)),
     *orr = calloc(rows + 1, sizeof(ld));
  oracle_forward(&oc, rows, d, hp.v, c->weight ? w.v : NULL, c->bias ? b.v : NULL, oy, om, orr);

  arr got;
  if (read_npy("out.npy", dt, 3, shape, &got)) {
    tu_check(!memcmp(got.bytes, ly, h.n * tdt_size[dt]), "%s: y differs from the library", label);
    close_all(label, &got, oy, h.n, tol_of(dt));
    arr_free(&got);
  }
  if (!c->residual) {
    tu_check(!file_exists("h2.npy"), "%s: h2.npy written unasked", label);
  } else if (read_npy("h2.npy", dt, 3, shape, &got)) {
    tu_check(!memcmp(got.bytes, lh, h.n * tdt_size[dt]), "%s: h' differs from the library", label);
    tu_check(!memcmp(got.bytes, hp.bytes, h.n * tdt_size[dt]), "%s: h' is not h + u rounded", label);
    arr_free(&got);
  }
  if (c->stats) check_rstd_file(label, dt, lead, shape, rows, lr, orr);
  /* the input is read, never changed */
  arr h_again;
  if (read_npy("h.npy", dt, 3, shape, &h_again)) {
    tu_check(!memcmp(h_again.bytes, h.bytes, h.n * tdt_size[dt]), "%s: h.npy was changed", label);
    arr_free(&h_again);
  }
  free(lh), free(ly), free(lr), free(oy), free(om), free(orr);
  arr_free(&hp);
done:
  arr_free(&h), arr_free(&u), arr_free(&w), arr_free(&b);
}

/* sandwich H A: y, h' and both rstds bit for bit as rmsnorm_sandwich_forward
 * gives them, and against the oracle: h' = h + post(a) (post(a) rounded to
 * the dtype, then the sum), y = pre(h'). */
typedef struct scase {
  norm_opts o;
  int wpost, wpre; /* 0 none, 1 in the data's dtype, 2 float32 (one dtype for both) */
  int stats;       /* --rstd and --post-rstd */
  int residual;    /* --residual-out */
} scase;

static const scase sandwich_cases[] = {
  {{0, -1, 0, 1, 0}, 2, 2, 1, 1},   /* Gemma: 1 + g, float32 gains */
  {{0, -1, 0, 0, 0}, 0, 0, 0, 0},
  {{0, 0.25, 1, 0, 0.5}, 1, 1, 1, 1},
  {{0, 0.01, 0, 1, 0}, 0, 2, 0, 1}, /* the pre weight alone */
  {{2, 0.25, 0, 1, 0}, 1, 0, 1, 1}, /* the post weight alone, two axes */
};

static void run_sandwich_case(const scase *c, tdt dt) {
  static const size_t shape[3] = {3, 5, 8};
  int k = c->o.dims ? c->o.dims : 1, lead = 3 - k;
  size_t rows = 1, d = 1;
  for (int i = 0; i < lead; i++) rows *= shape[i];
  for (int i = lead; i < 3; i++) d *= shape[i];
  int wkind = c->wpost ? c->wpost : c->wpre;
  tdt pdt = wkind == 2 ? TF32 : dt;
  char label[160];
  snprintf(label, sizeof label, "sandwich %s dims=%d eps=%g%s%s p=%g w=%d/%d", tdt_name[dt], k,
           c->o.eps, c->o.eps_outside ? " eps-outside" : "", c->o.offset ? " offset" : "",
           c->o.partial, c->wpost, c->wpre);
  int gain = c->o.offset ? FILL_OFFSET_GAIN : FILL_GAIN;
  arr h = npy_fixture("h.npy", dt, 3, shape, FILL_DATA);
  arr a = npy_fixture("a.npy", dt, 3, shape, FILL_DATA);
  arr w1 = npy_fixture("w1.npy", pdt, k, shape + lead, gain);
  arr w2 = npy_fixture("w2.npy", pdt, k, shape + lead, gain);
  unlink("out.npy"), unlink("h2.npy"), unlink("rstd.npy"), unlink("prstd.npy");

  const char *args[40];
  norm_opts_text opt_text;
  int n = 0;
  args[n++] = "sandwich", args[n++] = "h.npy", args[n++] = "a.npy";
  args[n++] = "-o", args[n++] = "out.npy";
  if (c->residual) args[n++] = "--residual-out", args[n++] = "h2.npy";
  if (c->stats) args[n++] = "--rstd", args[n++] = "rstd.npy";
  if (c->stats) args[n++] = "--post-rstd", args[n++] = "prstd.npy";
  if (c->wpost) args[n++] = "--post-weight", args[n++] = "w1.npy";
  if (c->wpre) args[n++] = "--pre-weight", args[n++] = "w2.npy";
  norm_opts_args(&c->o, dt, args, n, &opt_text);
  if (!run_ok(label, args)) goto done;

  /* the library on a copy of h (it updates h in place) */
  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  rmsnorm_context_create(&ctx);
  norm_opts_config(&c->o, dt, pdt, &cfg);
  size_t es = tdt_size[dt];
  unsigned char *lh = malloc(h.n * es), *ly = calloc(h.n, es), *lr = calloc(rows + 1, 8),
                *lrp = calloc(rows + 1, 8);
  memcpy(lh, h.bytes, h.n * es);
  rmsnorm_status st = rmsnorm_sandwich_forward(ctx, &cfg, rows, d, a.bytes, d, lh, d,
                                               c->wpost ? w1.bytes : NULL,
                                               c->wpre ? w2.bytes : NULL, ly, d, lrp, lr);
  rmsnorm_context_free(ctx);
  tu_check(st == RMSNORM_OK, "%s: library: %s", label, rmsnorm_status_name(st));

  /* the oracle: post(a) rounded to the dtype, h' = h + it rounded, y = pre(h') */
  oracle_cfg oc = norm_opts_oracle(&c->o, dt, 0);
  ld *op = calloc(h.n, sizeof(ld)), *oy = calloc(h.n, sizeof(ld)), *ohp = calloc(h.n, sizeof(ld));
  ld *om = calloc(rows + 1, sizeof(ld)), *orp = calloc(rows + 1, sizeof(ld)),
     *orr = calloc(rows + 1, sizeof(ld));
  oracle_forward(&oc, rows, d, a.v, c->wpost ? w1.v : NULL, NULL, op, om, orp);
  arr hp = arr_new(dt, 3, shape);
  for (size_t i = 0; i < h.n; i++) {
    store(dt, hp.bytes, i, (double)op[i]);
    store(dt, hp.bytes, i, h.v[i] + load(dt, hp.bytes, i));
    hp.v[i] = load(dt, hp.bytes, i);
    ohp[i] = hp.v[i];
  }
  oracle_forward(&oc, rows, d, hp.v, c->wpre ? w2.v : NULL, NULL, oy, om, orr);

  arr got;
  if (read_npy("out.npy", dt, 3, shape, &got)) {
    tu_check(!memcmp(got.bytes, ly, h.n * es), "%s: y differs from the library", label);
    close_all(label, &got, oy, h.n, 2 * tol_of(dt));
    arr_free(&got);
  }
  if (!c->residual) {
    tu_check(!file_exists("h2.npy"), "%s: h2.npy written unasked", label);
  } else if (read_npy("h2.npy", dt, 3, shape, &got)) {
    tu_check(!memcmp(got.bytes, lh, h.n * es), "%s: h' differs from the library", label);
    close_all(label, &got, ohp, h.n, tol_of(dt));
    arr_free(&got);
  }
  if (c->stats) {
    check_stat_file(label, "rstd.npy", dt, lead, shape, rows, lr, orr);
    check_stat_file(label, "prstd.npy", dt, lead, shape, rows, lrp, orp);
  }
  /* the inputs are read, never changed */
  arr again;
  if (read_npy("h.npy", dt, 3, shape, &again)) {
    tu_check(!memcmp(again.bytes, h.bytes, h.n * es), "%s: h.npy was changed", label);
    arr_free(&again);
  }
  free(lh), free(ly), free(lr), free(lrp), free(op), free(oy), free(ohp), free(om), free(orp),
      free(orr);
  arr_free(&hp);
done:
  arr_free(&h), arr_free(&a), arr_free(&w1), arr_free(&w2);
}

/* gated X Z: y and rstd bit for bit as rmsnorm_gated_forward gives them, and
 * against gated_oracle.h. */
typedef struct gcase {
  norm_opts o;    /* eps, offset, dims (gated takes no eps-outside, no partial) */
  int weight;     /* 0 none, 1 in the data's dtype, 2 float32 */
  int sigmoid, norm_first;
  size_t group;   /* --group (0: not given) */
  int stats;
} gcase;

static const gcase gated_cases[] = {
  {{0, -1, 0, 0, 0}, 0, 0, 0, 0, 0},
  {{0, 0.25, 0, 0, 0}, 1, 0, 0, 4, 1},
  {{0, 0.01, 0, 1, 0}, 2, 1, 0, 0, 1},
  {{0, -1, 0, 0, 0}, 2, 0, 1, 2, 1},
  {{2, 0.25, 0, 1, 0}, 1, 1, 1, 20, 1},
};

static void run_gated_case(const gcase *c, tdt dt) {
  static const size_t shape[3] = {3, 5, 8};
  int k = c->o.dims ? c->o.dims : 1, lead = 3 - k;
  size_t rows = 1, d = 1;
  for (int i = 0; i < lead; i++) rows *= shape[i];
  for (int i = lead; i < 3; i++) d *= shape[i];
  size_t group = c->group ? c->group : d, ngroups = d / group;
  tdt pdt = c->weight == 2 ? TF32 : dt;
  char label[160];
  snprintf(label, sizeof label, "gated %s dims=%d eps=%g%s w=%d %s%s group=%zu", tdt_name[dt], k,
           c->o.eps, c->o.offset ? " offset" : "", c->weight, c->sigmoid ? "sigmoid" : "silu",
           c->norm_first ? " norm-first" : "", c->group);
  arr x = npy_fixture("x.npy", dt, 3, shape, FILL_DATA);
  arr z = npy_fixture("z.npy", dt, 3, shape, FILL_DATA);
  arr w = npy_fixture("w.npy", pdt, k, shape + lead, c->o.offset ? FILL_OFFSET_GAIN : FILL_GAIN);
  unlink("out.npy"), unlink("rstd.npy");

  const char *args[40];
  norm_opts_text opt_text;
  char group_text[32];
  int n = 0;
  args[n++] = "gated", args[n++] = "x.npy", args[n++] = "z.npy";
  args[n++] = "-o", args[n++] = "out.npy";
  if (c->weight) args[n++] = "--weight", args[n++] = "w.npy";
  if (c->sigmoid) args[n++] = "--act", args[n++] = "sigmoid";
  if (c->norm_first) args[n++] = "--norm-first";
  if (c->group) {
    snprintf(group_text, sizeof group_text, "--group=%zu", c->group);
    args[n++] = group_text;
  }
  if (c->stats) args[n++] = "--rstd", args[n++] = "rstd.npy";
  norm_opts_args(&c->o, dt, args, n, &opt_text);
  if (!run_ok(label, args)) goto done;

  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  rmsnorm_gate gate;
  rmsnorm_context_create(&ctx);
  norm_opts_config(&c->o, dt, pdt, &cfg);
  rmsnorm_gate_init(&gate, c->sigmoid ? RMSNORM_GATE_SIGMOID : RMSNORM_GATE_SILU);
  gate.group = c->group;
  gate.flags = c->norm_first ? RMSNORM_GATE_NORM_FIRST : 0u;
  size_t es = tdt_size[dt], nr = rows * ngroups;
  unsigned char *ly = calloc(x.n, es), *lr = calloc(nr + 1, 8);
  rmsnorm_status st = rmsnorm_gated_forward(ctx, &cfg, &gate, rows, d, x.bytes, d, z.bytes, d,
                                            c->weight ? w.bytes : NULL, ly, d, lr);
  rmsnorm_context_free(ctx);
  tu_check(st == RMSNORM_OK, "%s: library: %s", label, rmsnorm_status_name(st));

  /* the oracle, row by row, with the effective gain (1 + g with --offset) */
  oracle_cfg oc = norm_opts_oracle(&c->o, dt, 0);
  gated_opts go = {group, oc.eps, c->sigmoid, c->norm_first};
  ld *oy = calloc(x.n, sizeof(ld)), *orr = calloc(nr + 1, sizeof(ld));
  gl_t *xr = calloc(d, sizeof(gl_t)), *zr = calloc(d, sizeof(gl_t)), *wr = calloc(d, sizeof(gl_t));
  for (size_t j = 0; j < d; j++) wr[j] = c->weight ? (c->o.offset ? 1 : 0) + (gl_t)w.v[j] : 1;
  for (size_t i = 0; i < rows; i++) {
    for (size_t j = 0; j < d; j++) xr[j] = x.v[i * d + j], zr[j] = z.v[i * d + j];
    gated_forward_row(xr, zr, wr, d, &go, oy + i * d, orr + i * ngroups);
  }
  arr got;
  if (read_npy("out.npy", dt, 3, shape, &got)) {
    tu_check(!memcmp(got.bytes, ly, x.n * es), "%s: y differs from the library", label);
    close_all(label, &got, oy, x.n, 2 * tol_of(dt));
    arr_free(&got);
  }
  if (c->stats) {
    size_t rshape[3];
    memcpy(rshape, shape, (size_t)lead * sizeof rshape[0]);
    rshape[lead] = ngroups;
    check_stat_file(label, "rstd.npy", dt, lead + (c->group ? 1 : 0), rshape, nr, lr, orr);
  }
  free(ly), free(lr), free(oy), free(orr), free(xr), free(zr), free(wr);
done:
  arr_free(&x), arr_free(&z), arr_free(&w);
}

/* linear X W: Z bit for bit as rmsnorm_fold_weight + rmsnorm_linear_forward
 * give it, and against the oracle of the unfused Z = RMSNorm(X; g) W + bias. */
static void run_linear_case(const fcase *c, tdt dt) {
  static const size_t xshape[3] = {3, 5, 8}, zshape[3] = {3, 5, 6};
  const size_t rows = 15, d = 8, nn = 6, wshape[2] = {8, 6}, bshape[1] = {6};
  tdt pdt = c->weight ? (c->weight == 2 ? TF32 : dt) : c->bias ? (c->bias == 2 ? TF32 : dt) : dt;
  tdt mdt = dt == TF64 ? TF64 : TF32; /* the matrix: the compute type */
  char label[160];
  snprintf(label, sizeof label, "linear %s eps=%g%s%s p=%g w=%d b=%d", tdt_name[dt], c->o.eps,
           c->o.eps_outside ? " eps-outside" : "", c->o.offset ? " offset" : "", c->o.partial,
           c->weight, c->bias);
  arr x = npy_fixture("x.npy", dt, 3, xshape, FILL_DATA);
  arr wm = npy_fixture("wm.npy", mdt, 2, wshape, FILL_DATA);
  arr g = npy_fixture("g.npy", pdt, 1, xshape + 2, c->o.offset ? FILL_OFFSET_GAIN : FILL_GAIN);
  arr lb = npy_fixture("lb.npy", pdt, 1, bshape, FILL_DATA);
  unlink("out.npy"), unlink("rstd.npy");

  const char *args[40];
  norm_opts_text opt_text;
  int n = 0;
  args[n++] = "linear", args[n++] = "x.npy", args[n++] = "wm.npy";
  args[n++] = "-o", args[n++] = "out.npy";
  if (c->stats) args[n++] = "--rstd", args[n++] = "rstd.npy";
  if (c->weight) args[n++] = "--weight", args[n++] = "g.npy";
  if (c->bias) args[n++] = "--linear-bias", args[n++] = "lb.npy";
  norm_opts_args(&c->o, dt, args, n, &opt_text);
  int rc = run_with(NULL, args);
  if (rmsnorm_linear_available() != RMSNORM_OK) {
    tu_check(rc == 1 && strstr(err_text, "linear: not available") && !file_exists("out.npy"),
          "%s without a BLAS: exit %d: %s", label, rc, err_text);
    goto done;
  }
  if (!tu_check(rc == 0 && err_text[0] == '\0' && out_text[0] == '\0', "%s: exit %d: %s", label, rc,
             err_text))
    goto done;

  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  rmsnorm_context_create(&ctx);
  norm_opts_config(&c->o, dt, pdt, &cfg);
  unsigned char *wf = calloc(d * nn, tdt_size[mdt]), *lz = calloc(rows * nn, tdt_size[dt]),
                *lr = calloc(rows, 8);
  rmsnorm_status st = rmsnorm_fold_weight(&cfg, d, nn, c->weight ? g.bytes : NULL, wm.bytes, nn,
                                          wf, nn);
  if (st == RMSNORM_OK)
    st = rmsnorm_linear_forward(ctx, &cfg, rows, d, nn, x.bytes, d, wf, nn,
                                c->bias ? lb.bytes : NULL, lz, nn, lr);
  rmsnorm_context_free(ctx);
  tu_check(st == RMSNORM_OK, "%s: library: %s", label, rmsnorm_status_name(st));

  /* the oracle, unfused: y = RMSNorm(x; g), then z = y W + bias */
  oracle_cfg oc = norm_opts_oracle(&c->o, dt, 0);
  ld *oy = calloc(x.n, sizeof(ld)), *oz = calloc(rows * nn, sizeof(ld)),
     *om = calloc(rows, sizeof(ld)), *orr = calloc(rows, sizeof(ld));
  oracle_forward(&oc, rows, d, x.v, c->weight ? g.v : NULL, NULL, oy, om, orr);
  for (size_t i = 0; i < rows; i++)
    for (size_t o = 0; o < nn; o++) {
      ld s = c->bias ? lb.v[o] : 0;
      for (size_t j = 0; j < d; j++) s += oy[i * d + j] * wm.v[j * nn + o];
      oz[i * nn + o] = s;
    }
  arr got;
  if (read_npy("out.npy", dt, 3, zshape, &got)) {
    tu_check(!memcmp(got.bytes, lz, rows * nn * tdt_size[dt]), "%s: Z differs from the library",
          label);
    close_all(label, &got, oz, rows * nn, 2 * tol_of(dt));
    arr_free(&got);
  }
  if (c->stats) check_rstd_file(label, dt, 2, xshape, rows, lr, orr);
  free(wf), free(lz), free(lr), free(oy), free(oz), free(om), free(orr);
done:
  arr_free(&x), arr_free(&wm), arr_free(&g), arr_free(&lb);
}

static void test_fused(void) {
  for (int dt = TF32; dt <= TF64; dt++) {
    for (size_t i = 0; i < sizeof add_cases / sizeof add_cases[0]; i++)
      run_add_case(&add_cases[i], (tdt)dt);
    for (size_t i = 0; i < sizeof linear_cases / sizeof linear_cases[0]; i++)
      run_linear_case(&linear_cases[i], (tdt)dt);
    for (size_t i = 0; i < sizeof sandwich_cases / sizeof sandwich_cases[0]; i++)
      run_sandwich_case(&sandwich_cases[i], (tdt)dt);
    for (size_t i = 0; i < sizeof gated_cases / sizeof gated_cases[0]; i++)
      run_gated_case(&gated_cases[i], (tdt)dt);
  }

  /* --residual-out naming H itself updates the residual stream in place */
  static const size_t shape[2] = {4, 6};
  arr h = npy_fixture("h.npy", TF32, 2, shape, FILL_DATA);
  arr u = npy_fixture("u.npy", TF32, 2, shape, FILL_DATA);
  int rc = RUN("add-forward", "h.npy", "u.npy", "-o", "ref_y.npy", "--residual-out", "ref_h.npy");
  tu_check(rc == 0, "add-forward reference: %s", err_text);
  rc = RUN("add-forward", "h.npy", "u.npy", "-o", "out.npy", "--residual-out", "h.npy");
  tu_check(rc == 0 && same_file("h.npy", "ref_h.npy") && same_file("out.npy", "ref_y.npy"),
        "add-forward --residual-out H in place: %d %s", rc, err_text);
  /* and Y may replace U (the sub-layer output consumed) */
  write_npy("h.npy", &h);
  rc = RUN("add-forward", "h.npy", "u.npy", "-o", "u.npy");
  tu_check(rc == 0 && same_file("u.npy", "ref_y.npy"), "add-forward -o U: %d %s", rc, err_text);
  unlink("h.npy"), unlink("u.npy"), unlink("ref_y.npy"), unlink("ref_h.npy"), unlink("out.npy");

  /* sandwich: the same in-place uses (h' over H, y over A), and no rows */
  write_npy("h.npy", &h);
  write_npy("u.npy", &u);
  rc = RUN("sandwich", "h.npy", "u.npy", "-o", "ref_y.npy", "--residual-out", "ref_h.npy",
           "--offset");
  tu_check(rc == 0, "sandwich reference: %s", err_text);
  rc = RUN("sandwich", "h.npy", "u.npy", "-o", "u.npy", "--residual-out", "h.npy", "--offset");
  tu_check(rc == 0 && same_file("h.npy", "ref_h.npy") && same_file("u.npy", "ref_y.npy"),
           "sandwich -o A --residual-out H in place: %d %s", rc, err_text);
  static const size_t s0[2] = {0, 6};
  arr e0 = arr_new(TF32, 2, s0), got0;
  write_npy("e0.npy", &e0);
  rc = RUN("sandwich", "e0.npy", "e0.npy", "-o", "out.npy", "--rstd", "r.npy");
  if (tu_check(rc == 0, "sandwich no rows: %s", err_text) &&
      read_npy("out.npy", TF32, 2, s0, &got0)) {
    arr_free(&got0);
    if (read_npy("r.npy", TF32, 1, s0, &got0)) arr_free(&got0);
  }
  unlink("h.npy"), unlink("u.npy"), unlink("ref_y.npy"), unlink("ref_h.npy"), unlink("out.npy");
  unlink("e0.npy"), unlink("r.npy");
  arr_free(&h), arr_free(&u), arr_free(&e0);

  /* a 1-d X: one row, Z of shape (N,) and a 0-d rstd; no rows: an empty Z */
  if (rmsnorm_linear_available() == RMSNORM_OK) {
    static const size_t x1[1] = {8}, w1[2] = {8, 3}, z1[1] = {3}, x0[2] = {0, 8}, z0[2] = {0, 3};
    arr x = npy_fixture("x.npy", TF32, 1, x1, FILL_DATA);
    arr wm = npy_fixture("wm.npy", TF32, 2, w1, FILL_DATA), xe = arr_new(TF32, 2, x0);
    write_npy("xe.npy", &xe);
    arr got;
    rc = RUN("linear", "x.npy", "wm.npy", "-o", "out.npy", "--rstd", "rstd.npy");
    if (tu_check(rc == 0, "linear 1-d: %s", err_text) && read_npy("out.npy", TF32, 1, z1, &got)) {
      arr_free(&got);
      if (read_npy("rstd.npy", TF32, 0, z1, &got)) arr_free(&got);
    }
    rc = RUN("linear", "xe.npy", "wm.npy", "-o", "out.npy");
    if (tu_check(rc == 0, "linear no rows: %s", err_text) && read_npy("out.npy", TF32, 2, z0, &got))
      arr_free(&got);
    unlink("x.npy"), unlink("wm.npy"), unlink("xe.npy"), unlink("out.npy"), unlink("rstd.npy");
    arr_free(&x), arr_free(&wm), arr_free(&xe);
  }
}

int main(int argc, char **argv) {
  cli_begin(argc, argv);
  test_fused();
  return cli_end("cli_commands_fused");
}
