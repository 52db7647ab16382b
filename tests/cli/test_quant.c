/* test_quant.c - forward and add-forward with --quant: every format's codes
 * and scales files (numpy's header for their dtype and shape, bytes equal to
 * the library's quantized calls), one row worked out by hand, and the usage
 * and file errors (exit code, one line naming the file, nothing left). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_fixture.h"

typedef struct qfmt {
  const char *name;
  rmsnorm_qformat format;
  const char *codes_descr;
  const char *scales_descr; /* NULL: no scales file */
  size_t scale_size;
} qfmt;

static const qfmt qfmts[] = {
  {"int8", RMSNORM_QF_INT8, "|i1", "<f4", 4},
  {"fp8_e4m3", RMSNORM_QF_FP8_E4M3, "|u1", "<f4", 4},
  {"q8_0", RMSNORM_QF_Q8_0, "|u1", NULL, 0},
  {"q8_k", RMSNORM_QF_Q8_K, "|u1", NULL, 0},
  {"mxfp8", RMSNORM_QF_MXFP8_E4M3, "|u1", "|u1", 1},
  {"mxfp4", RMSNORM_QF_MXFP4, "|u1", NULL, 0},
  {"q8_1", RMSNORM_QF_Q8_1, "|u1", NULL, 0},
};
#define N_QFMTS (sizeof qfmts / sizeof qfmts[0])

/* A case: the format and its options, and the norm's. */
typedef struct qcase {
  int fmt;        /* index in qfmts */
  size_t group;   /* --group (int8, fp8_e4m3) */
  int pow2;       /* 1: --pow2-scale, 2: --e8m0-scale (E8M0 bytes), 3: both */
  norm_opts o;
  int weight;     /* 0 none, 1 in the data's dtype, 2 float32 */
  int bias;
  int stats;      /* --rstd */
  float static_scale; /* --static-scale (int8, fp8_e4m3), 0 for none */
} qcase;

static const qcase cases[] = {
  {0, 0, 0, {0, -1, 0, 0, 0}, 0, 0, 0, 0},
  {0, 32, 0, {0, 0.25, 0, 0, 0}, 1, 1, 1, 0},
  {0, 128, 1, {0, 0.01, 1, 0, 0.5}, 2, 0, 1, 0},
  {1, 0, 1, {0, -1, 0, 1, 0}, 1, 0, 0, 0},
  {1, 64, 0, {0, 0.25, 0, 0, 0}, 2, 2, 1, 0},
  {2, 0, 0, {0, -1, 0, 0, 0}, 0, 0, 1, 0},
  {2, 0, 0, {2, 0.25, 0, 0, 0}, 1, 1, 0, 0},
  {3, 0, 0, {0, -1, 0, 0, 0}, 1, 0, 1, 0},
  {4, 0, 0, {0, 0.01, 0, 0, 0}, 2, 0, 1, 0},
  {5, 0, 0, {0, -1, 1, 0, 0}, 0, 0, 0, 0},
  {5, 0, 0, {0, 0.25, 0, 1, 0.5}, 1, 1, 1, 0},
  {0, 64, 0, {2, -1, 0, 0, 0}, 1, 0, 1, 0},
  {4, 0, 0, {2, 0.25, 0, 0, 0}, 0, 1, 0, 0},
  {0, 0, 0, {0, -1, 0, 0, 0}, 1, 0, 0, 0.03125f},
  {1, 0, 0, {2, 0.25, 1, 0, 0}, 0, 0, 1, 0.01f},
  {6, 0, 0, {0, -1, 0, 0, 0}, 1, 0, 1, 0},
  {6, 0, 0, {2, 0.25, 0, 0, 0.5}, 2, 1, 0, 0},
  {0, 32, 2, {0, 0.25, 0, 0, 0}, 1, 1, 1, 0},
  {1, 0, 3, {0, -1, 0, 1, 0}, 2, 0, 0, 0},
};

/* The file at path must be numpy's header for descr and shape (format 1.0)
 * followed by exactly the nb bytes of want. */
static void check_npy_bytes(const char *label, const char *path, const char *descr, int ndim,
                            const size_t *shape, const void *want, size_t nb) {
  unsigned char head[4096];
  size_t hn = npy_header_here(head, 1, descr, ndim, shape), n = 0;
  unsigned char *got = slurp(path, &n);
  if (!tu_check(got != NULL, "%s: %s was not written", label, path)) return;
  tu_check(n == hn + nb, "%s: %s is %zu bytes, want %zu", label, path, n, hn + nb);
  if (n == hn + nb) {
    tu_check(!memcmp(got, head, hn), "%s: %s's header is not numpy's for %s: %.*s", label, path,
             descr, (int)(hn > 10 ? hn - 10 : 0), (const char *)got + 10);
    tu_check(!memcmp(got + hn, want, nb), "%s: %s's data differs from the library's", label, path);
  }
  free(got);
}

/* forward (add = 0) or add-forward (add = 1) with --quant: the files against
 * rmsnorm_forward_quantized / rmsnorm_add_forward_quantized on the same data. */
static void run_case(const qcase *c, tdt dt, int add) {
  static const size_t shape[3] = {3, 2, 256};
  const qfmt *f = &qfmts[c->fmt];
  int k = c->o.dims ? c->o.dims : 1, lead = 3 - k;
  size_t rows = 1, d = 1;
  for (int i = 0; i < lead; i++) rows *= shape[i];
  for (int i = lead; i < 3; i++) d *= shape[i];
  tdt pdt = c->weight ? (c->weight == 2 ? TF32 : dt) : c->bias ? (c->bias == 2 ? TF32 : dt) : dt;
  int scales_file = f->scales_descr && !c->static_scale;
  int e8m0 = (c->pow2 & 2) != 0;
  const char *scales_descr = e8m0 ? "|u1" : f->scales_descr;
  size_t scale_size = e8m0 ? 1 : f->scale_size;
  char label[200], group_text[32], static_text[48];
  snprintf(label, sizeof label,
           "%s --quant %s %s group=%zu%s%s static=%g dims=%d eps=%g%s%s p=%g w=%d b=%d",
           add ? "add-forward" : "forward", f->name, tdt_name[dt], c->group,
           c->pow2 & 1 ? " pow2" : "", e8m0 ? " e8m0" : "", c->static_scale, k, c->o.eps,
           c->o.eps_outside ? " eps-outside" : "", c->o.offset ? " offset" : "", c->o.partial,
           c->weight, c->bias);
  arr x = npy_fixture("x.npy", dt, 3, shape, FILL_DATA);
  arr u = npy_fixture("u.npy", dt, 3, shape, FILL_DATA);
  arr w = npy_fixture("w.npy", pdt, k, shape + lead, c->o.offset ? FILL_OFFSET_GAIN : FILL_GAIN);
  arr b = npy_fixture("b.npy", pdt, k, shape + lead, FILL_DATA);
  unlink("codes.npy"), unlink("scales.npy"), unlink("rstd.npy"), unlink("h2.npy");

  const char *args[48];
  norm_opts_text opt_text;
  int n = 0;
  args[n++] = add ? "add-forward" : "forward", args[n++] = "x.npy";
  if (add) args[n++] = "u.npy";
  args[n++] = "--quant", args[n++] = f->name, args[n++] = "-o", args[n++] = "codes.npy";
  if (scales_file) args[n++] = "--scales", args[n++] = "scales.npy";
  if (c->static_scale) {
    snprintf(static_text, sizeof static_text, "%.9g", c->static_scale);
    args[n++] = "--static-scale", args[n++] = static_text;
  }
  if (c->group) {
    snprintf(group_text, sizeof group_text, "--group=%zu", c->group);
    args[n++] = group_text;
  }
  if (c->pow2 & 1) args[n++] = "--pow2-scale";
  if (e8m0) args[n++] = "--e8m0-scale";
  if (c->stats) args[n++] = "--rstd", args[n++] = "rstd.npy";
  if (add) args[n++] = "--residual-out", args[n++] = "h2.npy";
  if (c->weight) args[n++] = "--weight", args[n++] = "w.npy";
  if (c->bias) args[n++] = "--bias", args[n++] = "b.npy";
  norm_opts_args(&c->o, dt, args, n, &opt_text);
  int ok = run_ok(label, args);

  /* the library, directly */
  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  rmsnorm_quant q;
  size_t row_bytes = 0, row_scales = 0;
  rmsnorm_context_create(&ctx);
  norm_opts_config(&c->o, dt, pdt, &cfg);
  rmsnorm_quant_init(&q, f->format);
  q.group = c->group;
  q.flags = (c->pow2 & 1 ? RMSNORM_QUANT_SCALE_POW2 : 0u) | (e8m0 ? RMSNORM_QUANT_SCALE_E8M0 : 0u);
  if (c->static_scale) q.static_scale = &c->static_scale;
  rmsnorm_status st = rmsnorm_quant_row_size(&q, d, &row_bytes, &row_scales);
  tu_check(st == RMSNORM_OK, "%s: row size: %s", label, rmsnorm_status_name(st));
  unsigned char *codes = calloc(rows * row_bytes + 1, 1);
  unsigned char *scales = scales_file ? calloc(rows * row_scales + 1, scale_size) : NULL;
  unsigned char *r = calloc(rows + 1, 8), *h = malloc(x.n * tdt_size[dt]);
  memcpy(h, x.bytes, x.n * tdt_size[dt]);
  const void *wp = c->weight ? w.bytes : NULL, *bp = c->bias ? b.bytes : NULL;
  if (st == RMSNORM_OK && add)
    st = rmsnorm_add_forward_quantized(ctx, &cfg, rows, d, h, d, u.bytes, d, wp, bp, &q, codes,
                                       row_bytes, scales, row_scales, r);
  else if (st == RMSNORM_OK)
    st = rmsnorm_forward_quantized(ctx, &cfg, rows, d, x.bytes, d, wp, bp, &q, codes, row_bytes,
                                   scales, row_scales, r);
  rmsnorm_context_free(ctx);
  tu_check(st == RMSNORM_OK, "%s: library: %s", label, rmsnorm_status_name(st));

  if (ok && st == RMSNORM_OK) {
    /* codes: X's shape for one code per element (the formats with scales
     * apart), else (rows..., row_bytes); scales (rows..., row_scales) */
    size_t qshape[3];
    memcpy(qshape, shape, sizeof qshape);
    qshape[lead] = row_bytes;
    int elementwise = f->scales_descr != NULL;
    tu_check(!elementwise || row_bytes == d, "%s: %zu code bytes per row", label, row_bytes);
    check_npy_bytes(label, "codes.npy", f->codes_descr, elementwise ? 3 : lead + 1,
                    elementwise ? shape : qshape, codes, rows * row_bytes);
    if (scales_file) {
      qshape[lead] = row_scales;
      tu_check(row_scales == (c->group ? d / c->group : f->scale_size == 1 ? d / 32 : 1),
               "%s: %zu scales per row", label, row_scales);
      check_npy_bytes(label, "scales.npy", scales_descr, lead + 1, qshape, scales,
                      rows * row_scales * scale_size);
    } else {
      tu_check(!file_exists("scales.npy"), "%s: a scales file for %s", label, f->name);
    }
    if (c->stats) {
      float *rf = (float *)(void *)r;
      if (dt == TF64)
        for (size_t i = 0; i < rows; i++) rf[i] = (float)((const double *)(const void *)r)[i];
      check_npy_bytes(label, "rstd.npy", "<f4", lead, shape, rf, rows * 4);
    }
    if (add) check_npy_bytes(label, "h2.npy", tdt_descr[dt], 3, shape, h, x.n * tdt_size[dt]);
  }
  free(codes), free(scales), free(r), free(h);
  arr_free(&x), arr_free(&u), arr_free(&w), arr_free(&b);
}

/* One row of 32 float32 values with mean(x^2) = 1 exactly (seven +-2,
 * sixteen +-1/2, nine +-0, the odd ones negative), eps 0, no weight: r = 1
 * and y = x exactly, so each format's bytes follow by hand. */
static void test_by_hand(void) {
  float x[32];
  for (int j = 0; j < 32; j++) {
    float v = j < 7 ? 2.0f : j < 23 ? 0.5f : 0.0f;
    x[j] = j % 2 ? -v : v;
  }
  static const size_t xs[2] = {1, 32};
  arr a = arr_new(TF32, 2, xs);
  for (int j = 0; j < 32; j++) store(TF32, a.bytes, (size_t)j, x[j]), a.v[j] = x[j];
  write_npy("row.npy", &a);
  arr_free(&a);

  /* Q8_0: d = 2/127, stored as fp16 0x2408 (2^-6 * (1 + 8/1024), the
   * nearest to 0.0157480); q = roundf(y * 127/2): 2 -> 127, 1/2 -> 31.75 -> 32 */
  unsigned char q80[34] = {0x08, 0x24};
  for (int j = 0; j < 32; j++) {
    int v = j < 7 ? 127 : j < 23 ? 32 : 0;
    q80[2 + j] = (unsigned char)(signed char)(j % 2 ? -v : v);
  }
  static const size_t row1[2] = {1, 34};
  unlink("c.npy");
  if (run_ok("q8_0 by hand", (const char *const[]){"forward", "row.npy", "--quant", "q8_0", "-o",
                                                   "c.npy", "--eps", "0", NULL}))
    check_npy_bytes("q8_0 by hand", "c.npy", "|u1", 2, row1, q80, 34);

  /* int8 per row: s = 2/127 in float, the same codes as Q8_0's (no tie) */
  signed char i8[32];
  memcpy(i8, q80 + 2, 32);
  float s = 2.0f / 127.0f;
  static const size_t c32[2] = {1, 32}, s1[2] = {1, 1};
  unlink("c.npy"), unlink("s.npy");
  if (run_ok("int8 by hand", (const char *const[]){"forward", "row.npy", "--quant", "int8", "-o",
                                                   "c.npy", "--scales", "s.npy", "--eps", "0",
                                                   NULL})) {
    check_npy_bytes("int8 by hand", "c.npy", "|i1", 2, c32, i8, 32);
    check_npy_bytes("int8 by hand", "s.npy", "<f4", 2, s1, &s, 4);
  }

  /* MXFP8: amax 2, X = 2^(1 - 8) (E8M0 byte 127 - 7 = 120); y / X is 256 =
   * 2^8 (e4m3 0x78, exponent field 15) or 64 = 2^6 (0x68), sign bit 0x80,
   * which the odd zeros (-0.0) keep */
  unsigned char m8[32], e8 = 120;
  for (int j = 0; j < 32; j++) {
    unsigned char v = j < 7 ? 0x78 : j < 23 ? 0x68 : 0x00;
    m8[j] = (unsigned char)(v | (j % 2 ? 0x80 : 0));
  }
  unlink("c.npy"), unlink("s.npy");
  if (run_ok("mxfp8 by hand", (const char *const[]){"forward", "row.npy", "--quant", "mxfp8", "-o",
                                                    "c.npy", "--scales", "s.npy", "--eps", "0",
                                                    NULL})) {
    check_npy_bytes("mxfp8 by hand", "c.npy", "|u1", 2, c32, m8, 32);
    check_npy_bytes("mxfp8 by hand", "s.npy", "|u1", 2, s1, &e8, 1);
  }
  unlink("c.npy"), unlink("s.npy"), unlink("row.npy");
}

/* What must fail: the exit code, one line with the text, nothing written and
 * an existing output untouched. */
typedef struct qerr {
  const char *args[16];
  int code;
  const char *message;
} qerr;

static const qerr qerrs[] = {
  {{"forward", "x100.npy", "--quant", "q8_0", "-o", "out.npy"}, 1,
   "x100.npy: normalized size 100 is not a multiple of 32, the q8_0 block size"},
  {{"forward", "x100.npy", "--quant", "mxfp8", "-o", "out.npy", "--scales", "s.npy"}, 1,
   "x100.npy: normalized size 100 is not a multiple of 32, the mxfp8 block size"},
  {{"forward", "x100.npy", "--quant", "mxfp4", "-o", "out.npy", "--rstd", "r.npy"}, 1,
   "x100.npy: normalized size 100 is not a multiple of 32, the mxfp4 block size"},
  {{"forward", "x64.npy", "--quant", "q8_k", "-o", "out.npy"}, 1,
   "x64.npy: normalized size 64 is not a multiple of 256, the q8_k block size"},
  {{"forward", "x64.npy", "--quant", "int8", "--group", "128", "-o", "out.npy", "--scales",
    "s.npy"}, 1, "x64.npy: normalized size 64 is not a multiple of --group 128"},
  {{"add-forward", "x100.npy", "x100.npy", "--quant", "q8_0", "-o", "out.npy", "--residual-out",
    "h2.npy"}, 1, "x100.npy: normalized size 100 is not a multiple of 32, the q8_0 block size"},
  {{"forward", "x64.npy", "--quant", "int4", "-o", "out.npy"}, 2,
   "forward: --quant must be one of int8, fp8_e4m3, q8_0, q8_1, q8_k, mxfp8, mxfp4, not 'int4'"},
  {{"forward", "x64.npy", "--quant", "int8", "-o", "out.npy"}, 2,
   "forward: --quant int8 needs --scales FILE"},
  {{"forward", "x64.npy", "--quant", "q8_0", "-o", "out.npy", "--scales", "s.npy"}, 2,
   "forward: --quant q8_0 keeps its scales in its blocks: no --scales"},
  {{"forward", "x64.npy", "--quant", "q8_0", "--group", "32", "-o", "out.npy"}, 2,
   "forward: --group is for int8 and fp8_e4m3"},
  {{"forward", "x64.npy", "--quant", "mxfp4", "--pow2-scale", "-o", "out.npy"}, 2,
   "forward: --pow2-scale is for int8 and fp8_e4m3"},
  {{"forward", "x64.npy", "--quant", "q8_1", "--e8m0-scale", "-o", "out.npy"}, 2,
   "forward: --e8m0-scale is for int8 and fp8_e4m3"},
  {{"forward", "x64.npy", "--e8m0-scale", "-o", "out.npy"}, 2,
   "forward: --e8m0-scale needs --quant"},
  {{"forward", "x100.npy", "--quant", "q8_1", "-o", "out.npy"}, 1,
   "x100.npy: normalized size 100 is not a multiple of 32, the q8_1 block size"},
  {{"forward", "x64.npy", "--quant", "int8", "--group", "48", "-o", "out.npy", "--scales",
    "s.npy"}, 2, "forward: --group must be a multiple of 32 (0: one scale per row), not '48'"},
  {{"forward", "x64.npy", "--group", "32", "-o", "out.npy"}, 2, "forward: --group needs --quant"},
  {{"forward", "x64.npy", "--scales", "s.npy", "-o", "out.npy"}, 2,
   "forward: --scales needs --quant"},
  {{"forward", "x64.npy", "--quant", "int8", "-o", "out.npy", "--scales", "out.npy"}, 2,
   "'out.npy' is named by two outputs"},
  {{"forward", "x64.npy", "--quant", "int8", "--static-scale", "0.1", "--group", "32", "-o",
    "out.npy"}, 2, "forward: --static-scale is one scale for every row: not with --group"},
  {{"forward", "x64.npy", "--quant", "int8", "--static-scale", "0.1", "--e8m0-scale", "-o",
    "out.npy"}, 2, "forward: --static-scale is one scale for every row: not with --e8m0-scale"},
  {{"forward", "x64.npy", "--quant", "fp8_e4m3", "--static-scale", "0.1", "--scales", "s.npy",
    "-o", "out.npy"}, 2, "forward: --static-scale is one scale for every row: not with --scales"},
  {{"forward", "x64.npy", "--quant", "int8", "--static-scale", "0", "-o", "out.npy"}, 2,
   "forward: --static-scale must be a number > 0 that a float holds, not '0'"},
  {{"forward", "x64.npy", "--quant", "int8", "--static-scale", "1e39", "-o", "out.npy"}, 2,
   "forward: --static-scale must be a number > 0 that a float holds, not '1e39'"},
  {{"forward", "x64.npy", "--quant", "mxfp8", "--static-scale", "1", "-o", "out.npy"}, 2,
   "forward: --static-scale is for int8 and fp8_e4m3"},
  {{"layernorm", "x64.npy", "--quant", "int8", "-o", "out.npy"}, 2,
   "layernorm: unknown option '--quant'"},
  {{"backward", "x64.npy", "x64.npy", "--quant", "q8_0", "-o", "out.npy"}, 2,
   "backward: unknown option '--quant'"},
};

static void test_errors(void) {
  static const size_t s100[2] = {2, 100}, s64[2] = {2, 64};
  write_filled("x100.npy", TF32, 2, s100, FILL_DATA);
  write_filled("x64.npy", TF32, 2, s64, FILL_DATA);
  static const char *const outputs[] = {"out.npy", "s.npy", "r.npy", "h2.npy"};
  char before[4096], after[4096];
  for (size_t c = 0; c < sizeof qerrs / sizeof qerrs[0]; c++) {
    const qerr *e = &qerrs[c];
    for (int pass = 0; pass < 2; pass++) {
      /* pass 0: no outputs exist; pass 1: they exist and must survive */
      for (size_t i = 0; i < 4; i++) {
        unlink(outputs[i]);
        if (pass) write_old(outputs[i]);
      }
      listing(before, sizeof before);
      int rc = run_with(NULL, e->args);
      listing(after, sizeof after);
      const char *nl = strchr(err_text, '\n');
      int one_line = nl && nl[1] == '\0' && !strncmp(err_text, "rmsnorm: ", 9);
      tu_check(rc == e->code, "'%s': exit %d, want %d (%s)", e->message, rc, e->code, err_text);
      tu_check(one_line && strstr(err_text, e->message), "message '%s', want '%s'", err_text,
               e->message);
      tu_check(out_text[0] == '\0', "'%s': wrote to stdout: %s", e->message, out_text);
      tu_check(!strcmp(before, after), "'%s': folder changed:\n  before: %s\n  after:  %s",
               e->message, before, after);
      for (size_t i = 0; pass && i < 4; i++)
        tu_check(old_content(outputs[i]), "'%s': %s was touched", e->message, outputs[i]);
    }
  }
  for (size_t i = 0; i < 4; i++) unlink(outputs[i]);
  unlink("x100.npy"), unlink("x64.npy");
}

/* --help lists the options where they apply */
static void test_help(void) {
  static const char *const with[] = {"forward", "add-forward"};
  for (int i = 0; i < 2; i++) {
    int rc = RUN(with[i], "--help");
    tu_check(rc == 0 && strstr(out_text, "--quant FORMAT") && strstr(out_text, "--scales FILE") &&
                 strstr(out_text, "--group G") && strstr(out_text, "--pow2-scale") &&
                 strstr(out_text, "--e8m0-scale") && strstr(out_text, "--static-scale S") &&
                 strstr(out_text, "q8_0") && strstr(out_text, "q8_1") && strstr(out_text, "mxfp4"),
             "%s --help lacks the --quant options: %s", with[i], out_text);
  }
  static const char *const without[] = {"backward", "layernorm", "layernorm-backward", "linear"};
  for (int i = 0; i < 4; i++) {
    int rc = RUN(without[i], "--help");
    tu_check(rc == 0 && !strstr(out_text, "--quant"), "%s --help lists --quant", without[i]);
  }
}

int main(int argc, char **argv) {
  cli_begin(argc, argv);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int dt = TF32; dt <= TF64; dt++)
      for (int add = 0; add < 2; add++) run_case(&cases[c], (tdt)dt, add);
  test_by_hand();
  test_errors();
  test_help();
  return cli_end("cli_commands_quant");
}
