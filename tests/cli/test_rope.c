/* test_rope.c - the qk-rope command: Y (and rstd) bit for bit as
 * rmsnorm_qk_norm_rope_forward gives them, near a long double oracle written
 * here from the textbook formulas (normalize each head, or with
 * --across-heads each token's heads together, then rotate its pairs by
 * angle = position * theta^(-2i/R) / F), for a table built by the command
 * and one given with --cos-sin; in place; no tokens; its errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_fixture.h"

typedef struct rcase {
  norm_opts o;      /* eps, offset */
  int weight;       /* 0 none, 1 in the data's dtype, 2 float32 */
  int gptj;
  size_t rot;       /* --rotary-dim (0: not given) */
  size_t start;
  double theta, factor; /* 0: not given */
  int table;        /* --cos-sin from a file */
  int stats;
  int across;       /* --across-heads: 1 with a (heads*head_dim,) weight, 2 (heads, head_dim) */
} rcase;

static const rcase cases[] = {
  {{0, -1, 0, 0, 0}, 0, 0, 0, 0, 0, 0, 0, 0, 0},
  {{0, 0.25, 0, 0, 0}, 1, 0, 0, 3, 0, 0, 0, 1, 0},
  {{0, 0.01, 0, 1, 0}, 2, 1, 0, 0, 500, 0, 0, 1, 0},
  {{0, -1, 0, 0, 0}, 2, 0, 4, 7, 1e6, 8, 0, 1, 0},
  {{0, 0.25, 0, 1, 0}, 1, 1, 6, 2, 0, 0, 1, 1, 0},
  {{0, -1, 0, 0, 0}, 0, 0, 8, 0, 0, 0, 1, 0, 0},
  {{0, 0.25, 0, 0, 0}, 1, 0, 0, 3, 0, 0, 0, 1, 1},
  {{0, 0.01, 0, 1, 0}, 2, 1, 6, 0, 500, 0, 0, 1, 2},
  {{0, -1, 0, 0, 0}, 0, 0, 0, 1, 0, 0, 1, 1, 1},
};

/* The oracle of nh heads' rows normalized together (one head: its own
 * row): n = x r w over the nh * hd values, then each head's pairs rotated. */
static void oracle_row(const double *x, const ld *w, size_t nh, size_t hd, size_t rot, int gptj,
                       ld eps, ld pos, ld theta, ld factor, ld *y, ld *r) {
  ld ss = 0;
  size_t n_all = nh * hd;
  for (size_t j = 0; j < n_all; j++) ss += (ld)x[j] * x[j];
  *r = 1 / sqrtl(ss / n_all + eps);
  ld *n = malloc(n_all * sizeof *n);
  for (size_t j = 0; j < n_all; j++) n[j] = x[j] * *r * w[j], y[j] = n[j];
  for (size_t h = 0; h < nh; h++)
    for (size_t i = 0; i < rot / 2; i++) {
      ld ang = pos / factor * powl(theta, -(ld)(2 * i) / rot);
      size_t a = h * hd + (gptj ? 2 * i : i), b = h * hd + (gptj ? 2 * i + 1 : i + rot / 2);
      y[a] = n[a] * cosl(ang) - n[b] * sinl(ang);
      y[b] = n[b] * cosl(ang) + n[a] * sinl(ang);
    }
  free(n);
}

static void run_case(const rcase *c, tdt dt) {
  /* (batch 2, seq 3, heads 4, head_dim 8) */
  static const size_t shape[4] = {2, 3, 4, 8};
  const size_t tokens = 6, seq = 3, heads = 4, hd = 8, rows = 24;
  size_t rot = c->rot ? c->rot : hd, npos = c->start + seq;
  double theta = c->theta ? c->theta : 10000, factor = c->factor ? c->factor : 1;
  tdt pdt = c->weight == 2 ? TF32 : dt, tt = dt == TF64 ? TF64 : TF32;
  char label[200];
  snprintf(label, sizeof label, "qk-rope %s eps=%g%s w=%d %s rot=%zu start=%zu theta=%g F=%g%s%s",
           tdt_name[dt], c->o.eps, c->o.offset ? " offset" : "", c->weight,
           c->gptj ? "gptj" : "neox", rot, c->start, theta, factor, c->table ? " table" : "",
           c->across ? " across-heads" : "");
  arr x = npy_fixture("x.npy", dt, 4, shape, FILL_DATA);
  /* the gain: (head_dim,), or across heads (heads*head_dim,) or (heads, head_dim) */
  size_t flat = heads * hd, nh = c->across ? heads : 1, nstat = c->across ? tokens : rows;
  arr w = c->across == 1 ? npy_fixture("w.npy", pdt, 1, &flat,
                                       c->o.offset ? FILL_OFFSET_GAIN : FILL_GAIN)
                         : npy_fixture("w.npy", pdt, c->across ? 2 : 1,
                                       c->across ? shape + 2 : shape + 3,
                                       c->o.offset ? FILL_OFFSET_GAIN : FILL_GAIN);
  /* the table the command would build, through the library (bit for bit),
   * written as a file for --cos-sin */
  size_t tshape[2] = {npos, rot};
  arr tab = arr_new(tt, 2, tshape);
  rmsnorm_status st = rmsnorm_rope_table(tab.bytes, tt == TF64 ? RMSNORM_F64 : RMSNORM_F32, npos,
                                         rot, theta, factor);
  tu_check(st == RMSNORM_OK, "%s: rmsnorm_rope_table: %s", label, rmsnorm_status_name(st));
  if (c->table) write_npy("t.npy", &tab);
  unlink("out.npy"), unlink("rstd.npy");

  const char *args[48];
  norm_opts_text opt_text;
  char rot_text[32], start_text[32], theta_text[64], factor_text[64];
  int n = 0;
  args[n++] = "qk-rope", args[n++] = "x.npy", args[n++] = "-o", args[n++] = "out.npy";
  if (c->weight) args[n++] = "--weight", args[n++] = "w.npy";
  if (c->gptj) args[n++] = "--style", args[n++] = "gptj";
  if (c->rot) snprintf(rot_text, sizeof rot_text, "%zu", c->rot), args[n++] = "--rotary-dim",
              args[n++] = rot_text;
  if (c->start) snprintf(start_text, sizeof start_text, "--start=%zu", c->start),
                args[n++] = start_text;
  if (c->theta) snprintf(theta_text, sizeof theta_text, "%.17g", c->theta),
                args[n++] = "--theta", args[n++] = theta_text;
  if (c->factor) snprintf(factor_text, sizeof factor_text, "%.17g", c->factor),
                 args[n++] = "--linear-factor", args[n++] = factor_text;
  if (c->table) args[n++] = "--cos-sin", args[n++] = "t.npy";
  if (c->stats) args[n++] = "--rstd", args[n++] = "rstd.npy";
  if (c->across) args[n++] = "--across-heads";
  norm_opts_args(&c->o, dt, args, n, &opt_text);
  if (!run_ok(label, args)) goto done;

  /* the library on the same rows: one call, positions start + t % seq */
  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  rmsnorm_context_create(&ctx);
  norm_opts_config(&c->o, dt, pdt, &cfg);
  int64_t pos[6];
  for (size_t t = 0; t < tokens; t++) pos[t] = (int64_t)(c->start + t % seq);
  rmsnorm_rope rope;
  rmsnorm_rope_init(&rope, c->gptj ? RMSNORM_ROPE_GPTJ : RMSNORM_ROPE_NEOX);
  rope.rotary_dim = rot;
  rope.cos_sin = tab.bytes;
  rope.n_positions = npos;
  rope.positions = pos;
  rope.norm = c->across ? RMSNORM_ROPE_NORM_TOKEN : RMSNORM_ROPE_NORM_HEAD;
  size_t es = tdt_size[dt];
  unsigned char *ly = calloc(x.n, es), *lr = calloc(rows, 8);
  st = rmsnorm_qk_norm_rope_forward(ctx, &cfg, tokens, heads, hd, x.bytes, heads * hd, hd,
                                    c->weight ? w.bytes : NULL, &rope, NULL, ly, heads * hd, hd,
                                    lr);
  rmsnorm_context_free(ctx);
  tu_check(st == RMSNORM_OK, "%s: library: %s", label, rmsnorm_status_name(st));

  oracle_cfg oc = norm_opts_oracle(&c->o, dt, 0);
  ld *oy = calloc(x.n, sizeof(ld)), *orr = calloc(rows, sizeof(ld)), wr[32];
  for (size_t j = 0; j < nh * hd; j++) wr[j] = c->weight ? (c->o.offset ? 1 : 0) + (ld)w.v[j] : 1;
  for (size_t i = 0; i < nstat; i++) /* a head's row, or a token's */
    oracle_row(x.v + i * nh * hd, wr, nh, hd, rot, c->gptj, oc.eps,
               (ld)pos[c->across ? i : i / heads], theta, factor, oy + i * nh * hd, orr + i);
  arr got;
  if (read_npy("out.npy", dt, 4, shape, &got)) {
    tu_check(!memcmp(got.bytes, ly, x.n * es), "%s: y differs from the library", label);
    close_all(label, &got, oy, x.n, 2 * tol_of(dt));
    arr_free(&got);
  }
  if (c->stats && read_npy("rstd.npy", TF32, c->across ? 2 : 3, shape, &got)) {
    for (size_t i = 0; i < nstat; i++) {
      float want = dt == TF64 ? (float)((const double *)(const void *)lr)[i]
                              : ((const float *)(const void *)lr)[i];
      tu_check(!memcmp(&want, got.bytes + 4 * i, 4), "%s: rstd[%zu] differs from the library",
               label, i);
    }
    close_all(label, &got, orr, nstat, 1e-5);
    arr_free(&got);
  }
  free(ly), free(lr), free(oy), free(orr);
done:
  unlink("t.npy");
  arr_free(&x), arr_free(&w), arr_free(&tab);
}

/* Usage and file errors: exit status, the one line, and nothing written. */
typedef struct ecase {
  int code;
  const char *message; /* '=': the whole line after "rmsnorm: " */
  const char *args[16];
} ecase;

static const ecase errors[] = {
  {2, "=qk-rope: missing the output: -o Y.npy (see 'rmsnorm qk-rope --help')", {"qk-rope", "x.npy"}},
  {2, "qk-rope: --style must be neox or gptj, not 'gpt'", {"qk-rope", "x.npy", "-o", "out.npy", "--style", "gpt"}},
  {2, "qk-rope: --rotary-dim must be even and > 0, not '3'", {"qk-rope", "x.npy", "-o", "out.npy", "--rotary-dim", "3"}},
  {2, "qk-rope: --rotary-dim must be even and > 0, not '0'", {"qk-rope", "x.npy", "-o", "out.npy", "--rotary-dim=0"}},
  {2, "qk-rope: --start must be a whole number, not '-1'", {"qk-rope", "x.npy", "-o", "out.npy", "--start", "-1"}},
  {2, "qk-rope: --theta must be a finite number > 1, not '1'", {"qk-rope", "x.npy", "-o", "out.npy", "--theta", "1"}},
  {2, "qk-rope: --linear-factor must be a finite number > 0, not '0'", {"qk-rope", "x.npy", "-o", "out.npy", "--linear-factor", "0"}},
  {2, "qk-rope: --theta: the table fixes the angles (no --cos-sin with it)", {"qk-rope", "x.npy", "-o", "out.npy", "--theta", "100", "--cos-sin", "t.npy"}},
  {2, "qk-rope: unknown option '--bias'", {"qk-rope", "x.npy", "-o", "out.npy", "--bias", "w.npy"}},
  {2, "qk-rope: unknown option '--partial'", {"qk-rope", "x.npy", "-o", "out.npy", "--partial", "0.5"}},
  {1, "=x1.npy: qk-rope needs (..., heads, head_dim), got 1 axes", {"qk-rope", "x1.npy", "-o", "out.npy"}},
  {1, "=x.npy: --rotary-dim 10 must be even and at most head_dim 8", {"qk-rope", "x.npy", "-o", "out.npy", "--rotary-dim", "10"}},
  {1, "=w4.npy: weight shape (4,) does not match normalized shape (8,)", {"qk-rope", "x.npy", "-o", "out.npy", "--weight", "w4.npy"}},
  {1, "=w4.npy: weight shape (4,) does not match normalized shape (2, 8)", {"qk-rope", "x.npy", "-o", "out.npy", "--weight", "w4.npy", "--across-heads"}},
  {2, "qk-rope: option '--across-heads=1' takes no value", {"qk-rope", "x.npy", "-o", "out.npy", "--across-heads=1"}},
  {1, "=t.npy: table shape (4, 8) must be (positions, 6): the rotary dim", {"qk-rope", "x.npy", "-o", "out.npy", "--cos-sin", "t.npy", "--rotary-dim", "6"}},
  {1, "=t64.npy: table dtype '<f8' must be '<f4' for '<f4' data", {"qk-rope", "x.npy", "-o", "out.npy", "--cos-sin", "t64.npy"}},
  {1, "=t.npy: positions up to 4 need 5 rows; the table has 4", {"qk-rope", "x.npy", "-o", "out.npy", "--cos-sin", "t.npy", "--start", "2"}},
  {1, "=nodir/r.npy: cannot write: No such file or directory", {"qk-rope", "x.npy", "-o", "out.npy", "--rstd", "nodir/r.npy"}},
};

static void test_errors(void) {
  static const size_t sx[3] = {3, 2, 8}, s1[1] = {8}, s4[1] = {4}, st[2] = {4, 8};
  write_filled("x.npy", TF32, 3, sx, FILL_DATA);
  write_filled("x1.npy", TF32, 1, s1, FILL_DATA);
  write_filled("w4.npy", TF32, 1, s4, FILL_GAIN);
  write_filled("t.npy", TF32, 2, st, FILL_DATA);
  write_filled("t64.npy", TF64, 2, st, FILL_DATA);
  char before[4096], after[4096];
  for (size_t c = 0; c < sizeof errors / sizeof errors[0]; c++) {
    const ecase *e = &errors[c];
    unlink("out.npy");
    write_old("out.npy");
    listing(before, sizeof before);
    int rc = run_with(NULL, e->args);
    listing(after, sizeof after);
    char want[512];
    snprintf(want, sizeof want, "rmsnorm: %s\n", e->message + (e->message[0] == '='));
    int match = e->message[0] == '=' ? !strcmp(err_text, want) : !!strstr(err_text, e->message);
    tu_check(rc == e->code && match, "'%s': exit %d (want %d), message '%s', want '%s'",
             e->message, rc, e->code, err_text, e->message);
    tu_check(!strcmp(before, after) && old_content("out.npy"), "'%s': files changed",
             e->message);
  }
  unlink("out.npy"), unlink("x.npy"), unlink("x1.npy"), unlink("w4.npy"), unlink("t.npy");
  unlink("t64.npy");
}

int main(int argc, char **argv) {
  cli_begin(argc, argv);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int dt = TF32; dt <= TF64; dt++) run_case(&cases[c], (tdt)dt);

  /* in place: -o X gives the same bytes as a separate output */
  static const size_t s[3] = {5, 3, 8};
  arr x = npy_fixture("x.npy", TF32, 3, s, FILL_DATA);
  int rc = RUN("qk-rope", "x.npy", "-o", "ref.npy", "--start", "4");
  tu_check(rc == 0, "qk-rope reference: %s", err_text);
  rc = RUN("qk-rope", "x.npy", "-o", "x.npy", "--start", "4");
  tu_check(rc == 0 && same_file("x.npy", "ref.npy"), "qk-rope -o X in place: %d %s", rc, err_text);
  /* no tokens: an empty Y and rstd */
  static const size_t s0[3] = {0, 3, 8};
  arr e0 = arr_new(TF32, 3, s0), got;
  write_npy("e0.npy", &e0);
  rc = RUN("qk-rope", "e0.npy", "-o", "out.npy", "--rstd", "r.npy");
  if (tu_check(rc == 0, "qk-rope no tokens: %s", err_text) &&
      read_npy("out.npy", TF32, 3, s0, &got)) {
    arr_free(&got);
    if (read_npy("r.npy", TF32, 2, s0, &got)) arr_free(&got);
  }
  unlink("x.npy"), unlink("ref.npy"), unlink("e0.npy"), unlink("out.npy"), unlink("r.npy");
  arr_free(&x), arr_free(&e0);

  test_errors();
  return cli_end("cli_commands_rope");
}
