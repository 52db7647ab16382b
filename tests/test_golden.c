/* test_golden.c - every op, dtype and option on fixed inputs, its outputs
 * hashed and compared with tests/data/golden_hashes.txt, which was written
 * on x86-64 (docs/arm64.md): the aarch64 build under emulation must give
 * the x86 bits, and the x86 build checks the same file, so it cannot go
 * stale. Every kernel set the machine runs is checked (scalar, avx2, avx512
 * or neon; under emulation the fast set only). The inputs come from integer arithmetic only (no libm), so they
 * are the same bits on every target.
 *   test_golden FILE            check
 *   test_golden --write FILE    regenerate (on x86-64; say so in the commit) */
#include "testutil.h"

/* FNV-1a, 64 bits */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* A value with at most 21 significant bits in [-4, 4); every 37th column an
 * outlier channel 64 times larger; a few exact halfway cases for bf16/fp16 */
static double golden_value(size_t j) {
  uint64_t u = tu_next();
  double v = (double)((int64_t)(u >> 43) - (1 << 20)) * 0x1p-18;
  if (j % 37 == 5) v *= 64;
  if ((u & 0xff) == 7) v = 1.0 + 0x1p-8;  /* a bf16 tie: to even (1.0) */
  if ((u & 0xff) == 9) v = 1.0 + 0x1p-11; /* an fp16 tie: to even (1.0) */
  return v;
}

static void put(rmsnorm_dtype dt, void *p, size_t i, double v) {
  switch (dt) {
    case RMSNORM_F32: ((float *)p)[i] = (float)v; break;
    case RMSNORM_F64: ((double *)p)[i] = v; break;
    case RMSNORM_F16: ((uint16_t *)p)[i] = rn_f32_to_f16((float)v); break;
    case RMSNORM_BF16: ((uint16_t *)p)[i] = rn_f32_to_bf16((float)v); break;
  }
}

/* rows x ld elements of dt, filled (gaps too) */
static void *fill(rmsnorm_dtype dt, size_t rows, size_t ld, double scale) {
  size_t n = rows * ld > 0 ? rows * ld : 1;
  void *p = malloc(n * rn_dtype_size(dt));
  for (size_t i = 0; i < n; i++) put(dt, p, i, scale * golden_value(i % (ld ? ld : 1)));
  return p;
}

typedef struct golden {
  uint64_t h;
  rmsnorm_status st;
} golden;

static void mix(golden *g, const void *p, size_t n) { g->h = fnv(g->h, p, n); }

/* The case's outputs hashed, on ctx. variant v picks the options. */
static golden run_case(rmsnorm_context *ctx, int op, rmsnorm_dtype dt, size_t d, int v) {
  golden g = {0xcbf29ce484222325ull, RMSNORM_OK};
  tu_seed((uint64_t)op * 1000003u + (uint64_t)dt * 10007u + d * 31u + (uint64_t)v);
  size_t rows = 7, ld = d + (v & 1 ? 3 : 0), es = rn_dtype_size(dt), as = rn_acc_size(dt);
  rmsnorm_dtype pdt = v & 2 ? RMSNORM_F32 : dt;
  if (dt == RMSNORM_F64 && (v & 2)) pdt = RMSNORM_F64;
  void *x = fill(dt, rows, ld, 1), *dy = fill(dt, rows, ld, 1), *y = fill(dt, rows, ld, 0);
  void *u = fill(dt, rows, ld, 0.5), *dres = fill(dt, rows, ld, 1);
  /* row 2 out of the fast path's range: the rescue path */
  for (size_t j = 0; j < d; j++)
    put(dt, x, 2 * ld + j, dt == RMSNORM_F64 ? 1e200 : dt == RMSNORM_F16 ? 60000.0 : 3e37);
  void *w = fill(pdt, 1, d, 0.25), *b = fill(pdt, 1, d, 1);
  void *dw = fill(pdt, 1, d, 1), *db = fill(pdt, 1, d, 1);
  void *mean = calloc(rows, as), *rstd = calloc(rows, as);
  float *scale = calloc(rows, sizeof(float));
  unsigned char *q = calloc(rows * ld + 1, 1);
  double *stats = calloc(rows, sizeof(double)), *dots = calloc(rows, sizeof(double));
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = pdt;
  cfg.eps = 1e-5;
  if (v & 4) cfg.flags |= RMSNORM_FLAG_WEIGHT_OFFSET;
  int in_place = (v & 8) != 0;
  void *out = in_place ? x : y;
  size_t pbytes = d * rn_dtype_size(pdt);
  switch (op) {
    case 0: /* RMSNorm forward; v&16: eps outside + partial; v&32: round before weight */
      if (v & 16) cfg.flags |= RMSNORM_FLAG_EPS_OUTSIDE, cfg.partial = 0.7;
      if (v & 32) cfg.flags |= RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
      g.st = rmsnorm_forward(ctx, &cfg, rows, d, x, ld, w, v & 64 ? NULL : b, out, ld, rstd);
      mix(&g, rstd, rows * as);
      break;
    case 1: /* LayerNorm forward */
      if (v & 32) cfg.flags |= RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
      g.st = rmsnorm_layernorm_forward(ctx, &cfg, rows, d, x, ld, v & 64 ? NULL : w, b, out, ld,
                                       mean, rstd);
      mix(&g, mean, rows * as), mix(&g, rstd, rows * as);
      break;
    case 2: /* RMSNorm backward; v&16: saved rstd; v&32: accumulate + partial */
      if (v & 32) cfg.flags |= RMSNORM_FLAG_ACCUMULATE, cfg.partial = 0.4;
      if (v & 16) rmsnorm_forward(ctx, &cfg, rows, d, x, ld, w, NULL, y, ld, rstd);
      out = in_place ? dy : y;
      g.st = rmsnorm_backward(ctx, &cfg, rows, d, x, ld, dy, ld, v & 64 ? NULL : w,
                              v & 16 ? rstd : NULL, out, ld, v & 64 ? NULL : dw, db);
      mix(&g, dw, pbytes), mix(&g, db, pbytes);
      break;
    case 3: /* LayerNorm backward */
      if (v & 32) cfg.flags |= RMSNORM_FLAG_ACCUMULATE;
      if (v & 16) rmsnorm_layernorm_forward(ctx, &cfg, rows, d, x, ld, w, NULL, y, ld, mean, rstd);
      out = in_place ? dy : y;
      g.st = rmsnorm_layernorm_backward(ctx, &cfg, rows, d, x, ld, dy, ld, v & 64 ? NULL : w,
                                        v & 16 ? mean : NULL, v & 16 ? rstd : NULL, out, ld,
                                        v & 64 ? NULL : dw, db);
      mix(&g, dw, pbytes), mix(&g, db, pbytes);
      break;
    case 4: /* residual add + RMSNorm, forward then backward */
      out = in_place ? u : y;
      g.st = rmsnorm_add_forward(ctx, &cfg, rows, d, x, ld, u, ld, w, v & 64 ? NULL : b, out, ld,
                                 rstd);
      mix(&g, x, rows * ld * es), mix(&g, rstd, rows * as);
      if (g.st == RMSNORM_OK)
        g.st = rmsnorm_add_backward(ctx, &cfg, rows, d, x, ld, dy, ld, v & 16 ? NULL : dres, ld, w,
                                    rstd, dres, ld, dw, db);
      mix(&g, dres, rows * ld * es), mix(&g, dw, pbytes), mix(&g, db, pbytes);
      break;
    case 5: { /* 8-bit outputs: v&16 fp8, v&32 a static scale */
      float s = 0.03125f;
      if (v & 64) cfg.flags |= RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
      g.st = rmsnorm_forward_quant(ctx, &cfg, rows, d, x, ld, w, v & 8 ? b : NULL,
                                   v & 16 ? RMSNORM_Q_FP8_E4M3 : RMSNORM_Q_INT8,
                                   v & 32 ? &s : NULL, q, ld, v & 32 ? NULL : scale, rstd);
      mix(&g, q, rows * ld), mix(&g, scale, rows * sizeof(float)), mix(&g, rstd, rows * as);
      out = NULL;
      break;
    }
    case 6: { /* QK-norm: 7 tokens of 1 head, head-major strides when v&16 */
      size_t tokens = 7, heads = 1;
      g.st = rmsnorm_qk_norm_forward(ctx, &cfg, tokens, heads, d, x, ld, d, w, NULL, out, ld, d,
                                     rstd);
      mix(&g, rstd, rows * as);
      if (g.st == RMSNORM_OK)
        g.st = rmsnorm_qk_norm_backward(ctx, &cfg, tokens, heads, d, x, ld, d, dy, ld, d, w,
                                        v & 16 ? rstd : NULL, dres, ld, d, dw, db);
      mix(&g, dres, rows * ld * es), mix(&g, dw, pbytes), mix(&g, db, pbytes);
      break;
    }
    default: { /* a shard of columns [off, d) of a row of d: stats, forward, backward */
      size_t off = d / 3, width = d - off;
      const char *xs = (const char *)x + off * es, *dys = (const char *)dy + off * es;
      const char *ws = (const char *)w + off * rn_dtype_size(pdt);
      g.st = rmsnorm_shard_stats(ctx, &cfg, rows, d, off, width, xs, ld, stats);
      /* the other shard's share: this one's again (any finite sum will do) */
      for (size_t i = 0; i < rows; i++) stats[i] *= 2;
      mix(&g, stats, rows * sizeof(double));
      if (g.st == RMSNORM_OK)
        g.st = rmsnorm_shard_forward(ctx, &cfg, rows, d, off, width, xs, ld, ws, NULL, stats,
                                     (char *)y + off * es, ld, rstd);
      mix(&g, rstd, rows * as);
      if (g.st == RMSNORM_OK)
        g.st = rmsnorm_shard_backward_dots(ctx, &cfg, rows, d, off, width, xs, ld, dys, ld, ws,
                                           stats, dots);
      mix(&g, dots, rows * sizeof(double));
      if (g.st == RMSNORM_OK)
        g.st = rmsnorm_shard_backward(ctx, &cfg, rows, d, off, width, xs, ld, dys, ld, ws, stats,
                                      dots, dres, ld, dw, db);
      mix(&g, dres, rows * ld * es), mix(&g, dw, pbytes), mix(&g, db, pbytes);
      break;
    }
  }
  if (out)
    for (size_t i = 0; i < rows; i++) mix(&g, (char *)out + i * ld * es, d * es);
  free(x), free(dy), free(y), free(u), free(dres), free(w), free(b), free(dw), free(db);
  free(mean), free(rstd), free(scale), free(q), free(stats), free(dots);
  return g;
}

static const char *const op_names[] = {"forward", "ln_forward", "backward", "ln_backward",
                                       "add",     "quant",      "qk_norm",  "shard"};
enum { n_ops = 8 };
/* the kernels' paths: short rows (1..70, ragged against every vector width
 * and the 64-lane groups), one past fp64's block of 512, one past fp32's
 * block of 1024, rows of several blocks (4095, 4096, 5120). Streaming stores,
 * thread splits of long rows and many-row reductions are test_isa's. */
static const size_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 70,
                               127, 513, 1031, 4095, 4096, 5120};
enum { n_sizes = sizeof sizes / sizeof sizes[0] };
static const int variants[] = {0, 1, 2, 4, 8, 16, 32, 64, 1 + 2 + 16, 4 + 8 + 32, 2 + 16 + 32};
enum { n_variants = sizeof variants / sizeof variants[0] };

static void case_name(char *buf, size_t n, int op, int dt, size_t d, int v) {
  snprintf(buf, n, "%s-%s-d%zu-v%d", op_names[op], tu_dtype_name((rmsnorm_dtype)dt), d, v);
}

int main(int argc, char **argv) {
  int write = argc == 3 && !strcmp(argv[1], "--write");
  if (argc != 2 && !write) {
    fprintf(stderr, "usage: test_golden FILE | test_golden --write FILE\n");
    return 2;
  }
  const char *path = argv[argc - 1];
  rmsnorm_context *ctx;
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) return 2;
  rmsnorm_context_set_threads(ctx, 2);
  char name[128];
  if (write) {
    rmsnorm_context_set_isa(ctx, RMSNORM_ISA_SCALAR);
    FILE *f = fopen(path, "w");
    if (!f) return 2;
    fprintf(f, "# test_golden: FNV-1a 64 of each case's outputs (tests/test_golden.c), written\n"
               "# on x86-64 by: build/tests/test_golden --write tests/data/golden_hashes.txt\n");
    for (int op = 0; op < n_ops; op++)
      for (int dt = 0; dt < 4; dt++)
        for (int s = 0; s < n_sizes; s++)
          for (int vi = 0; vi < n_variants; vi++) {
            golden g = run_case(ctx, op, (rmsnorm_dtype)dt, sizes[s], variants[vi]);
            case_name(name, sizeof name, op, dt, sizes[s], variants[vi]);
            fprintf(f, "%s %s %016llx\n", name, rmsnorm_status_name(g.st),
                    (unsigned long long)g.h);
          }
    rmsnorm_context_free(ctx);
    return fclose(f) ? 2 : 0;
  }
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "test_golden: cannot read %s\n", path);
    return 2;
  }
  static const rmsnorm_isa isas[] = {RMSNORM_ISA_SCALAR, RMSNORM_ISA_AVX2, RMSNORM_ISA_AVX512,
                                     RMSNORM_ISA_NEON};
  long lines = 0;
  char line[256];
  for (int op = 0; op < n_ops; op++)
    for (int dt = 0; dt < 4; dt++)
      for (int s = 0; s < n_sizes; s++)
        for (int vi = 0; vi < n_variants; vi++) {
          do {
            if (!fgets(line, sizeof line, f)) line[0] = 0;
          } while (line[0] == '#');
          char want_name[128], want_st[64];
          unsigned long long want_h = 0;
          int ok = sscanf(line, "%127s %63s %llx", want_name, want_st, &want_h) == 3;
          case_name(name, sizeof name, op, dt, sizes[s], variants[vi]);
          if (!tu_check(ok && !strcmp(want_name, name), "%s: expected case %s, file has '%s'",
                        path, name, line))
            continue;
          lines++;
          for (int i = 0; i < 4; i++) {
            /* under emulation the fast set only (test_isa holds scalar to its bits) */
            if (tu_emulated() && isas[i] == RMSNORM_ISA_SCALAR) continue;
            if (rmsnorm_context_set_isa(ctx, isas[i]) != RMSNORM_OK) continue;
            golden g = run_case(ctx, op, (rmsnorm_dtype)dt, sizes[s], variants[vi]);
            tu_check(!strcmp(rmsnorm_status_name(g.st), want_st) && g.h == want_h,
                     "%s on %s: %s %016llx, golden %s %016llx", name, rmsnorm_isa_name(isas[i]),
                     rmsnorm_status_name(g.st), (unsigned long long)g.h, want_st, want_h);
          }
        }
  tu_check(!fgets(line, sizeof line, f), "%s: lines past the last case", path);
  fclose(f);
  rmsnorm_context_free(ctx);
  printf("test_golden: %ld cases from %s\n", lines, path);
  return tu_finish("test_golden");
}
