/* test_info.c - the commands that print: demo (its numbers against the
 * oracle, its 8-bit Z within the bound of Q8_0's rounding), info, --help,
 * help, --version, and bench. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_fixture.h"

/* Parses the numbers after `label` on the line that starts with it. */
static int numbers_after(const char *text, const char *label, double *v, int max) {
  char key[64];
  snprintf(key, sizeof key, "\n     %s ", label);
  const char *p = strstr(text, key);
  if (!p) return 0;
  p += strlen(key);
  int n = 0;
  while (n < max) {
    char *end;
    double d = strtod(p, &end);
    if (end == p) break;
    v[n++] = d;
    p = end;
    if (*p == '\n') break;
  }
  return n;
}

/* Step 6 of the demo: the Q8_0 blocks of Y's rows and W's columns (d, and
 * the codes of the 4 real values), then the 8-bit Z. Each value v codes as
 * d q with |v - d q| <= E = (1/2 + 127 * 2^-11) d / (1 - 2^-11): half a step
 * of the unrounded d, plus the fp16 rounding of d (2^-11 relative) times
 * |q| <= 127. So |y w - d_y q_y d_w q_w| <= E_y |w| + E_w |y| + E_y E_w per
 * term, summed over the 4; 1e-5 more covers the printed decimals. */
static void test_demo_q8(double y[2][4], double w[4][3], double z[2][3]) {
  const char *p = strstr(out_text, "\n6. The same Z in 8 bits");
  if (!tu_check(p != NULL, "demo: no 8-bit step")) return;
  p = strstr(p, "\n     y1 "); /* past the text, which says "d = " too */
  if (!tu_check(p != NULL, "demo: no Q8_0 block of y1")) return;
  double d[5], c = (0.5 + 127 * 0x1p-11) / (1 - 0x1p-11);
  int q[5][4], lines = 0;
  for (; lines < 5 && (p = strstr(p, " d = ")) != NULL; lines++) {
    char *end;
    d[lines] = strtod(p + 5, &end);
    const char *qs = strstr(end, "q =");
    if (!qs) break;
    qs += 3;
    for (int j = 0; j < 4; j++) q[lines][j] = (int)strtol(qs, &end, 10), qs = end;
    p = qs;
  }
  if (!tu_check(lines == 5, "demo: %d of the 5 Q8_0 blocks found", lines)) return;
  /* the codes are v / d rounded: rows 0, 1 are Y's, 2..4 W's columns */
  for (int b = 0; b < 5; b++)
    for (int j = 0; j < 4; j++) {
      double v = b < 2 ? y[b][j] : w[j][b - 2];
      tu_check(fabs(v - d[b] * q[b][j]) <= c * d[b] + 1e-6 && abs(q[b][j]) <= 127,
               "demo Q8_0 block %d [%d]: %g codes as %g * %d", b, j, v, d[b], q[b][j]);
    }
  double z8[2][3];
  if (!tu_check(numbers_after(out_text, "z1 Q8_0", z8[0], 3) == 3 &&
                    numbers_after(out_text, "z2 Q8_0", z8[1], 3) == 3,
                "demo: the 8-bit Z not found"))
    return;
  for (int i = 0; i < 2; i++)
    for (int o = 0; o < 3; o++) {
      double dot = 0, bound = 1e-5, ey = c * d[i], ew = c * d[2 + o];
      for (int j = 0; j < 4; j++) {
        dot += (double)q[i][j] * q[2 + o][j];
        bound += ey * fabs(w[j][o]) + ew * fabs(y[i][j]) + ey * ew;
      }
      tu_check(fabs(z8[i][o] - d[i] * d[2 + o] * dot) <= 1e-5,
               "demo z%d Q8_0[%d] %g is not d_y d_w sum(q_y q_w) = %g", i + 1, o, z8[i][o],
               d[i] * d[2 + o] * dot);
      tu_check(fabs(z8[i][o] - z[i][o]) <= bound, "demo z%d Q8_0[%d] %g, z %g: past the bound %g",
               i + 1, o, z8[i][o], z[i][o], bound);
    }
  tu_check(strstr(out_text, "largest difference") && strstr(out_text, "% of the largest |z|"),
           "demo: no 8-bit difference line");
}

static void test_demo(void) {
  int rc = RUN("demo");
  tu_check(rc == 0 && err_text[0] == '\0', "demo: exit %d: %s", rc, err_text);
  /* the worked example's numbers, as printed */
  static const char *const want[] = {
    "mean(x^2) = 3.500000", "mean(x^2) = 1.875000", "RMS = 1.870831", "RMS = 1.369310",
    "1.069043", "-0.534522", "0.000000", "1.603565", "0.365147", "1.095442", "-1.460590",
    "0.730295", "[ 0.848528,  1.131371]", "[-1.000000,  1.000000]", "chosen", "eps = 1e-5",
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    tu_check(strstr(out_text, want[i]) != NULL, "demo lacks '%s'", want[i]);
  for (int step = 1; step <= 7; step++) {
    char key[16];
    snprintf(key, sizeof key, "\n%d. ", step);
    tu_check(strstr(out_text, key) != NULL, "demo lacks step %d", step);
  }
  /* the printed g and W give the printed Y and Z (oracle, 6 decimals) */
  static const double x[2][4] = {{2.0, -1.0, 0.0, 3.0}, {0.5, 1.5, -2.0, 1.0}};
  double g[4], w[4][3], y[2][4], z[2][3];
  int ok = numbers_after(out_text, "g", g, 4) == 4 && numbers_after(out_text, "W", w[0], 3) == 3 &&
           numbers_after(out_text, "y1", y[0], 4) == 4 && numbers_after(out_text, "y2", y[1], 4) == 4 &&
           numbers_after(out_text, "z1", z[0], 3) == 3 && numbers_after(out_text, "z2", z[1], 3) == 3;
  /* W's other rows follow its first, each on a line of its own */
  const char *wline = strstr(out_text, "\n     W ");
  for (int r = 1; ok && r < 4; r++) {
    wline = strchr(wline + 1, '\n');
    char *end = (char *)wline;
    for (int c = 0; c < 3; c++) w[r][c] = strtod(end, &end);
  }
  if (tu_check(ok, "demo: g, W, Y or Z not found")) {
    for (int i = 0; i < 2; i++) {
      ld ms = 0;
      for (int j = 0; j < 4; j++) ms += (ld)x[i][j] * x[i][j];
      ld r = 1 / sqrtl(ms / 4 + 1e-5L);
      ld yy[4];
      for (int j = 0; j < 4; j++) {
        yy[j] = x[i][j] * r * g[j];
        tu_check(fabsl(yy[j] - y[i][j]) <= 1e-6, "demo y%d[%d] %g, oracle %Lg", i + 1, j, y[i][j], yy[j]);
      }
      for (int o = 0; o < 3; o++) {
        ld s = 0;
        for (int j = 0; j < 4; j++) s += yy[j] * w[j][o];
        tu_check(fabsl(s - z[i][o]) <= 2e-6, "demo z%d[%d] %g, oracle %Lg", i + 1, o, z[i][o], s);
      }
    }
  }
  /* LayerNorm rows: mean 1 and 0.25, the normalized rows */
  double ln1[4];
  if (tu_check(numbers_after(out_text, "LN(x1)", ln1, 4) == 4, "demo: LN(x1) not found")) {
    ld rr = 1 / sqrtl(2.5L + 1e-5L);
    ld want1[4] = {1 * rr, -2 * rr, -1 * rr, 2 * rr};
    for (int j = 0; j < 4; j++)
      tu_check(fabsl(ln1[j] - want1[j]) <= 1e-6, "demo LN(x1)[%d] %g", j, ln1[j]);
  }
  /* step 5 folded: W' = diag(g) W as printed, and the same Z */
  double wf[3], zf[2][3];
  if (tu_check(numbers_after(out_text, "W'", wf, 3) == 3, "demo: W' not found")) {
    for (int o = 0; o < 3; o++)
      tu_check(fabs(wf[o] - g[0] * w[0][o]) <= 1e-6, "demo W'[0][%d] %g, g0*W %g", o, wf[o], g[0] * w[0][o]);
  }
  if (rmsnorm_linear_available() == RMSNORM_OK) {
    if (tu_check(numbers_after(out_text, "z1'", zf[0], 3) == 3 && numbers_after(out_text, "z2'", zf[1], 3) == 3,
              "demo: folded z1', z2' not found"))
      for (int i = 0; i < 2; i++)
        for (int o = 0; o < 3; o++)
          tu_check(zf[i][o] == z[i][o], "demo folded z%d'[%d] %g, unfolded %g", i + 1, o, zf[i][o], z[i][o]);
    tu_check(strstr(out_text, "the same Z: largest difference from the unfolded one") != NULL,
          "demo: no difference line");
  } else {
    tu_check(strstr(out_text, "rmsnorm_linear_forward is not available") != NULL,
          "demo without a BLAS does not say so");
  }
  if (ok) test_demo_q8(y, w, z);
  rc = RUN("demo", "--help");
  tu_check(rc == 0 && !strncmp(out_text, "usage: rmsnorm demo", 19), "demo --help");
}

static void test_info_help_version(void) {
  int rc = RUN("info");
  tu_check(rc == 0 && err_text[0] == '\0', "info: exit %d %s", rc, err_text);
  char want[64];
  snprintf(want, sizeof want, "version:      rmsnorm %s", RMSNORM_VERSION_STRING);
  tu_check(strstr(out_text, want) && strstr(out_text, "cpu features:") &&
            strstr(out_text, "kernel set:") && strstr(out_text, "threads:"),
        "info output: %s", out_text);
  /* the kernel set reported is the one a context runs */
  rmsnorm_context *ctx;
  rmsnorm_isa isa;
  int threads;
  rmsnorm_context_create(&ctx);
  if (rmsnorm_context_get_isa(ctx, &isa) == RMSNORM_OK) {
    snprintf(want, sizeof want, "kernel set:   %s", rmsnorm_isa_name(isa));
    tu_check(strstr(out_text, want) != NULL, "info: want '%s' in %s", want, out_text);
  }
  if (rmsnorm_context_get_threads(ctx, &threads) == RMSNORM_OK) {
    snprintf(want, sizeof want, "threads:      %d ", threads);
    tu_check(strstr(out_text, want) != NULL, "info: want '%s' in %s", want, out_text);
  }
  rmsnorm_context_free(ctx);
  run_opts scalar = {.isa_env = "scalar"};
  rc = RUN_WITH(&scalar, "info");
  tu_check(rc == 0 && strstr(out_text, "kernel set:   scalar"), "RMSNORM_ISA=scalar info: %s", out_text);

  rc = RUN("--version");
  snprintf(want, sizeof want, "rmsnorm %s\n", RMSNORM_VERSION_STRING);
  tu_check(rc == 0 && !strcmp(out_text, want), "--version: '%s'", out_text);
  rc = RUN("--help");
  tu_check(rc == 0 && strstr(out_text, "usage: rmsnorm COMMAND") && strstr(out_text, "layernorm-backward") &&
            strstr(out_text, "add-forward") && strstr(out_text, "  linear "),
        "--help: %s", out_text);
  static const char *const cmds[] = {"forward", "backward", "layernorm", "layernorm-backward",
                                     "add-forward", "linear", "demo", "info"};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    char usage[64];
    snprintf(usage, sizeof usage, "usage: rmsnorm %s", cmds[i]);
    rc = RUN(cmds[i], "--help");
    tu_check(rc == 0 && !strncmp(out_text, usage, strlen(usage)) && err_text[0] == '\0',
          "%s --help: %d %s", cmds[i], rc, out_text);
    char help_text[sizeof out_text];
    memcpy(help_text, out_text, sizeof help_text);
    rc = RUN("help", cmds[i]);
    tu_check(rc == 0 && !strcmp(out_text, help_text), "help %s", cmds[i]);
    rc = RUN(cmds[i], "-h");
    tu_check(rc == 0 && !strcmp(out_text, help_text), "%s -h", cmds[i]);
  }
  /* each norm command's help lists exactly its options */
  rc = RUN("layernorm", "--help");
  tu_check(strstr(out_text, "--mean") && !strstr(out_text, "--eps-outside") && !strstr(out_text, "--partial"),
        "layernorm --help options");
  rc = RUN("backward", "--help");
  tu_check(strstr(out_text, "--dweight") && strstr(out_text, "--partial") && !strstr(out_text, "--rstd"),
        "backward --help options");
  rc = RUN("add-forward", "--help");
  tu_check(strstr(out_text, "--residual-out") && strstr(out_text, "--bias") && strstr(out_text, "--dims") &&
            !strstr(out_text, "--linear-bias") && !strstr(out_text, "--dweight"),
        "add-forward --help options");
  rc = RUN("linear", "--help");
  tu_check(strstr(out_text, "--linear-bias") && strstr(out_text, "--weight") && strstr(out_text, "--rstd") &&
            !strstr(out_text, "--bias ") && !strstr(out_text, "--dims") && !strstr(out_text, "--residual-out"),
        "linear --help options");
}

/* `rmsnorm bench` (quick, two small shapes, one odd): every op at 1 and 2
 * threads, a positive time and % of a copy limit that names its copy. */
static void test_bench(void) {
  int rc = RUN("bench", "--quick", "--csv", "--no-scalar", "--dtype", "f32", "--threads", "2",
               "--shape", "64x128", "--shape", "3x1000", "--offset", "16");
  tu_check(rc == 0 && err_text[0] == '\0', "bench: exit %d %s", rc, err_text);
  tu_check(!strncmp(out_text, "op,dtype,rows,d,threads,median_us,", 34), "bench header: %.80s",
           out_text);
  int lines = 0;
  for (char *line = strchr(out_text, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
    char buf[256], *f[12];
    size_t len = strcspn(line + 1, "\n"), nf = 0;
    snprintf(buf, sizeof buf, "%.*s", (int)len, line + 1);
    for (char *c = buf; nf < 12; c++) { /* the 12 fields; empty ones too */
      f[nf++] = c;
      c += strcspn(c, ",");
      if (!*c) break;
      *c = '\0';
    }
    tu_check(nf == 12, "bench line has %zu fields: %s", nf, line + 1);
    if (nf != 12) break;
    lines++;
    int threads = atoi(f[4]), lim_threads = 0;
    double us = atof(f[5]), gbps = atof(f[6]), limit = atof(f[7]), pct = atof(f[8]);
    char *slash = strchr(f[11], '/');
    if (slash) *slash = '\0', lim_threads = atoi(slash + 1);
    int known_op = !strcmp(f[0], "rms_forward") || !strcmp(f[0], "rms_backward") ||
                   !strcmp(f[0], "ln_forward") || !strcmp(f[0], "ln_backward");
    tu_check(known_op && !strcmp(f[1], "f32"), "bench op %s %s", f[0], f[1]);
    tu_check((!strcmp(f[2], "64") && !strcmp(f[3], "128")) || (!strcmp(f[2], "3") && !strcmp(f[3], "1000")),
             "bench shape %sx%s", f[2], f[3]);
    tu_check(threads == 1 || threads == 2, "bench threads %d", threads);
    tu_check(us > 0 && gbps > 0 && limit > 0 && pct > 0 && pct < 10000, "bench numbers %s %s %s %s",
             f[5], f[6], f[7], f[8]);
    tu_check(!strcmp(f[11], "memcpy") || !strcmp(f[11], "nt-avx2") || !strcmp(f[11], "nt-avx512"),
             "bench limit kind %s", f[11]);
    tu_check(lim_threads >= 1 && lim_threads <= threads, "bench limit on %d threads for %d",
             lim_threads, threads);
  }
  tu_check(lines == 2 * 4 * 2, "bench: %d result lines, want 16", lines);
  rc = RUN("bench", "--shape", "0x5");
  tu_check(rc == 2 && strstr(err_text, "bench: --shape") != NULL, "bench --shape 0x5: %d %s", rc,
           err_text);
}

int main(int argc, char **argv) {
  cli_begin(argc, argv);
  test_demo();
  test_info_help_version();
  test_bench();
  return cli_end("cli_commands_info");
}
