/* test_inputs.c - how inputs reach the command: .npy format versions, pipes,
 * FIFOs, endless devices, streams cut short, in place, odd data offsets. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_fixture.h"

/* The same array through every way in: .npy format 2.0 and 3.0, a pipe, as
 * the output's own file, a name after "--"; and a float32 weight with
 * half-precision data. */
static void test_versions_and_sources(void) {
  static const size_t shape[2] = {4, 6}, wshape[1] = {6};
  for (int dt = TF32; dt <= TF64; dt++) {
    arr x = npy_fixture("x.npy", (tdt)dt, 2, shape, FILL_DATA);
    arr w = npy_fixture("w.npy", (tdt)dt, 1, wshape, FILL_GAIN);
    const char *bf = dt == TBF16 ? "--bf16" : "--eps=0";
    int rc = RUN("forward", "x.npy", "-o", "ref.npy", "--weight", "w.npy", bf);
    tu_check(rc == 0, "%s reference run: %s", tdt_name[dt], err_text);
    /* the same array in format 2.0 and 3.0 (data and weight) gives the same bytes */
    for (int version = 2; version <= 3; version++) {
      write_npy_version("xv.npy", version, &x);
      write_npy_version("wv.npy", version, &w);
      rc = RUN("forward", "xv.npy", "-o", "out.npy", "--weight", "wv.npy", bf);
      tu_check(rc == 0 && same_file("out.npy", "ref.npy"), "%s from format %d.0: %s", tdt_name[dt],
            version, err_text);
    }
    /* read from a pipe, not mapped */
    run_opts piped = {.stdin_file = "x.npy"};
    rc = RUN_WITH(&piped, "forward", "/dev/stdin", "-oout.npy", "--weight", "w.npy", bf);
    tu_check(rc == 0 && same_file("out.npy", "ref.npy"), "%s from a pipe: %s", tdt_name[dt], err_text);
    /* the output replacing its own input */
    rc = RUN("forward", "x.npy", "--output", "x.npy", "--weight", "w.npy", bf);
    tu_check(rc == 0 && same_file("x.npy", "ref.npy"), "%s in place: %s", tdt_name[dt], err_text);
    /* options after "--" are file names */
    write_npy("-x.npy", &x);
    rc = RUN("forward", "-o", "out.npy", "--weight", "w.npy", bf, "--", "-x.npy");
    tu_check(rc == 0 && same_file("out.npy", "ref.npy"), "%s after --: %s", tdt_name[dt], err_text);
    unlink("-x.npy");
    arr_free(&x);
    arr_free(&w);
  }
  unlink("xv.npy"), unlink("wv.npy"), unlink("ref.npy"), unlink("out.npy");

  /* a float32 weight with fp16 and bf16 data; dweight comes back in float32 */
  for (int dt = TF16; dt <= TBF16; dt++) {
    static const size_t xs[2] = {3, 4}, ws[1] = {4};
    arr x = npy_fixture("x.npy", (tdt)dt, 2, xs, FILL_DATA);
    arr w = npy_fixture("w.npy", TF32, 1, ws, FILL_GAIN);
    write_npy("dy.npy", &x);
    int rc = RUN("backward", "x.npy", "dy.npy", "-o", "out.npy", "--weight", "w.npy", "--dweight",
                 "dw.npy", dt == TBF16 ? "--bf16" : "--eps=0");
    arr got;
    if (tu_check(rc == 0, "f32 weight with %s data: %s", tdt_name[dt], err_text) &&
        read_npy("dw.npy", TF32, 1, ws, &got))
      arr_free(&got);
    arr_free(&x);
    arr_free(&w);
  }
  unlink("dw.npy"), unlink("out.npy");
}

/* Writes a as a .npy file whose data starts at byte `offset`: the header
 * padded with spaces to that length, which numpy reads (it asks for no
 * alignment), e.g. an odd one. */
static void write_npy_at(const char *path, const arr *a, size_t offset) {
  char dict[512];
  int len = sprintf(dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", tdt_descr[a->dt]);
  for (int i = 0; i < a->ndim; i++) len += sprintf(dict + len, i ? ", %zu" : "%zu", a->shape[i]);
  sprintf(dict + len, "%s), }", a->ndim == 1 ? "," : "");
  write_npy_raw(path, 1, dict, offset, a->bytes, a->n * tdt_size[a->dt]);
}

static int message_is(const char *want_line) {
  char want[600];
  snprintf(want, sizeof want, "rmsnorm: %s\n", want_line);
  return !strcmp(err_text, want);
}

/* Inputs that are not regular files: devices that never end are refused
 * after their first bytes; FIFOs and pipes are read up to the data's last
 * byte and no further; a stream that ends early gets the message a file of
 * the same bytes gets. */
static void test_stream_inputs(void) {
  static const size_t shape[2] = {4, 6};
  arr x = npy_fixture("x.npy", TF32, 2, shape, FILL_DATA);
  arr dy = npy_fixture("dy.npy", TF32, 2, shape, FILL_DATA);
  int rc = RUN("forward", "x.npy", "-o", "ref.npy", "--rstd", "refr.npy");
  tu_check(rc == 0, "stream reference: %s", err_text);

  /* /dev/zero and /dev/urandom (as X, DY or the weight): at once, and no
   * out.npy made */
  unlink("out.npy");
  run_opts guard = {.timeout_s = 60, .mem_limit_mb = 2048};
  const char *const devices[] = {"/dev/zero", "/dev/urandom"};
  for (int i = 0; i < 2; i++) {
    const char *dev = devices[i];
    if (!file_exists(dev)) continue;
    char want[128];
    snprintf(want, sizeof want, "%s: not a .npy file (no \\x93NUMPY magic)", dev);
    rc = RUN_WITH(&guard, "forward", dev, "-o", "out.npy");
    tu_check(rc == 1 && message_is(want), "forward %s: %d %s", dev, rc, err_text);
    rc = RUN_WITH(&guard, "backward", "x.npy", dev, "-o", "out.npy");
    tu_check(rc == 1 && message_is(want), "backward x.npy %s: %d %s", dev, rc, err_text);
    rc = RUN_WITH(&guard, "forward", "x.npy", "-o", "out.npy", "--weight", dev);
    tu_check(rc == 1 && message_is(want), "--weight %s: %d %s", dev, rc, err_text);
    tu_check(!file_exists("out.npy"), "%s: wrote an output", dev);
  }
  rc = RUN_WITH(&guard, "forward", "/dev/null", "-o", "out.npy");
  tu_check(rc == 1 && message_is("/dev/null: empty file, not a .npy file"), "/dev/null: %d %s", rc,
        err_text);

  /* a FIFO, and standard input, carrying the file and then endless zeros:
   * read up to the data's end, the same result as the file */
  unlink("in.fifo");
  if (mkfifo("in.fifo", 0600) != 0) die("mkfifo");
  for (int zeros = 0; zeros < 2; zeros++) {
    pid_t feeder = start_feeder(-1, "in.fifo", "x.npy", zeros);
    rc = RUN_WITH(&guard, "forward", "in.fifo", "-o", "out.npy", "--rstd", "r.npy");
    kill(feeder, SIGKILL); /* in case the command never opened the FIFO */
    waitpid(feeder, NULL, 0);
    tu_check(rc == 0 && same_file("out.npy", "ref.npy") && same_file("r.npy", "refr.npy"),
          "from a FIFO%s: %d %s", zeros ? " with zeros after the array" : "", rc, err_text);
    run_opts piped = {.stdin_file = "x.npy", .stdin_zeros = zeros, .timeout_s = 60,
                      .mem_limit_mb = 2048};
    rc = RUN_WITH(&piped, "forward", "/dev/stdin", "-o", "out.npy", "--rstd", "r.npy");
    tu_check(rc == 0 && same_file("out.npy", "ref.npy") && same_file("r.npy", "refr.npy"),
          "from standard input%s: %d %s", zeros ? " with zeros after the array" : "", rc, err_text);
  }
  unlink("in.fifo");

  /* two arrays one after the other on one pipe: X, then DY */
  size_t nx, ndy;
  unsigned char *fx = slurp("x.npy", &nx), *fdy = slurp("dy.npy", &ndy);
  if (!fx || !fdy) die("slurp");
  write_bytes("xdy.npy", fx, nx, fdy, ndy);
  rc = RUN("backward", "x.npy", "dy.npy", "-o", "refdx.npy");
  run_opts both = {.stdin_file = "xdy.npy", .timeout_s = 60};
  int rc2 = RUN_WITH(&both, "backward", "/dev/stdin", "/dev/stdin", "-o", "out.npy");
  tu_check(rc == 0 && rc2 == 0 && same_file("out.npy", "refdx.npy"), "X and DY on one pipe: %d %s",
        rc2, err_text);

  /* a stream that ends early: the message a file of those bytes gets */
  size_t cuts[] = {0, 1, 5, 7, 9, 40, nx - 96 - 1, nx - 96, nx - 1};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    write_bytes("cut.npy", fx, cuts[i], NULL, 0);
    rc = RUN("forward", "cut.npy", "-o", "out.npy");
    static char from_file[sizeof err_text];
    snprintf(from_file, sizeof from_file, "%s", err_text);
    run_opts cut = {.stdin_file = "cut.npy", .timeout_s = 60};
    rc2 = RUN_WITH(&cut, "forward", "/dev/stdin", "-o", "out.npy");
    const char *a = strstr(from_file, "cut.npy: "), *b = strstr(err_text, "/dev/stdin: ");
    tu_check(rc == 1 && rc2 == 1 && a && b && !strcmp(a + 9, b + 12),
          "cut at %zu: file '%s', stream '%s'", cuts[i], from_file, err_text);
  }

  /* a bad header, then endless zeros: fails once the header is read */
  struct {
    const char *name, *message;
    unsigned char bytes[160];
    size_t n;
  } bad[] = {
    {"bad magic", "not a .npy file (no \\x93NUMPY magic)", "\x93NUMPZ\x01\x00\x10\x00", 10},
    {"bad version", "unsupported .npy format version 9.0 (1.0, 2.0 and 3.0 are read)",
     "\x93NUMPY\x09\x00\x10\x00", 10},
    {"long header", "header length 70000 is more than the 65535 bytes read from a stream",
     "\x93NUMPY\x02\x00\x70\x11\x01\x00", 12},
    {"malformed", "malformed header: unexpected key 'x'",
     "\x93NUMPY\x01\x00\x30\x00{'descr': '<f4', 'x': 1}                       \n", 58},
    /* 4 PiB: no machine this runs on has that much memory */
    {"vast", "array larger than this machine's memory: shape (1099511627776, 1024) of '<f4' "
     "needs 4503599627370496 bytes, the machine has ",
     "\x93NUMPY\x01\x00\x4b\x00{'descr': '<f4', 'fortran_order': False, 'shape': "
     "(1099511627776, 1024), }\n", 85},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_bytes("bad.npy", bad[i].bytes, bad[i].n, NULL, 0);
    run_opts o = {.stdin_file = "bad.npy", .stdin_zeros = 1, .timeout_s = 60,
                  .mem_limit_mb = 2048};
    rc = RUN_WITH(&o, "forward", "/dev/stdin", "-o", "out.npy");
    char want[300];
    snprintf(want, sizeof want, "rmsnorm: /dev/stdin: %s", bad[i].message);
    tu_check(rc == 1 && !strncmp(err_text, want, strlen(want)) && strchr(err_text, '\n') &&
              strchr(err_text, '\n')[1] == '\0',
          "%s, then zeros: %d %s", bad[i].name, rc, err_text);
  }
  /* that long header is fine in a regular file (mapped, not streamed) */
  {
    write_npy_raw("long.npy", 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), }",
                  12 + 70000, x.bytes, x.n * 4);
    rc = RUN("forward", "long.npy", "-o", "out.npy", "--rstd", "r.npy");
    tu_check(rc == 0 && same_file("out.npy", "ref.npy"), "70000-byte header in a file: %d %s", rc,
          err_text);
  }
  free(fx);
  free(fdy);
  arr_free(&x);
  arr_free(&dy);
  const char *junk[] = {"x.npy", "dy.npy", "xdy.npy", "ref.npy", "refr.npy", "refdx.npy", "out.npy",
                        "r.npy", "cut.npy", "bad.npy", "long.npy"};
  for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) unlink(junk[i]);
}

/* Legal .npy files whose data starts at odd (and other unaligned) offsets,
 * in every dtype, for every row-wise command and kernel set: the same bytes
 * as from numpy's 64-aligned files (kernel sets agree bit for bit), read
 * mapped and from a pipe. Under UBSan a misaligned typed load in the
 * library is a failure here. */
static void test_odd_offsets(void) {
  static const size_t shape[2] = {5, 12}, wshape[1] = {12};
  /* data offsets of X, DY, weight, bias: 1, 3, 5, 7 mod 8; then 2, 4, 6, 2 */
  static const size_t offs[2][4] = {{129, 131, 133, 135}, {130, 132, 134, 138}};
  for (int dt = TF32; dt <= TF64; dt++) {
    arr x = npy_fixture("x.npy", (tdt)dt, 2, shape, FILL_DATA);
    arr dy = npy_fixture("dy.npy", (tdt)dt, 2, shape, FILL_DATA);
    arr w = npy_fixture("w.npy", (tdt)dt, 1, wshape, FILL_GAIN);
    arr b = npy_fixture("b.npy", (tdt)dt, 1, wshape, FILL_DATA);
    const char *bf = dt == TBF16 ? "--bf16" : "--eps=0.25";
    const char *const runs[][14] = {
      {"forward", "X", "-o", "o1.npy", "--weight", "W", "--bias", "B", "--rstd", "o2.npy", bf},
      {"backward", "X", "DY", "-o", "o1.npy", "--weight", "W", "--dweight", "o2.npy", "--dbias", "o3.npy", bf},
      {"layernorm", "X", "-o", "o1.npy", "--weight", "W", "--bias", "B", "--mean", "o2.npy", "--rstd", "o3.npy", bf},
      {"layernorm-backward", "X", "DY", "-o", "o1.npy", "--weight", "W", "--dweight", "o2.npy", bf},
      {"add-forward", "X", "DY", "-o", "o1.npy", "--weight", "W", "--residual-out", "o2.npy", "--rstd", "o3.npy", bf},
    };
    static const char *const isas[] = {NULL, "scalar", "avx2", "avx512"};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
      for (int variant = 0; variant < 1 + 2 * 4; variant++) {
        /* 0: the aligned reference (the default kernel set); then the
         * offsets above, for each kernel set (RMSNORM_ISA; one the CPU
         * lacks falls back); the second also feeds X through a pipe */
        const char *isa = variant ? isas[(variant - 1) / 2] : NULL;
        int odd = variant ? 1 + (variant - 1) % 2 : 0;
        const char *names[4] = {"x.npy", "dy.npy", "w.npy", "b.npy"};
        const char *odd_names[4] = {"xo.npy", "dyo.npy", "wo.npy", "bo.npy"};
        const arr *arrs[4] = {&x, &dy, &w, &b};
        if (odd) {
          for (int i = 0; i < 4; i++) write_npy_at(odd_names[i], arrs[i], offs[odd - 1][i]);
          for (int i = 0; i < 4; i++) names[i] = odd_names[i];
          if (odd == 2) names[0] = "/dev/stdin";
        }
        const char *args[16];
        int n = 0;
        for (int i = 0; runs[r][i]; i++) {
          const char *a = runs[r][i];
          args[n++] = !strcmp(a, "X") ? names[0] : !strcmp(a, "DY") ? names[1]
                    : !strcmp(a, "W") ? names[2] : !strcmp(a, "B") ? names[3] : a;
        }
        args[n] = NULL;
        run_opts o = {.stdin_file = odd == 2 ? "xo.npy" : NULL, .isa_env = isa};
        int rc = run_with(&o, args);
        tu_check(rc == 0, "%s %s offsets %d, kernels %s: %d %s", runs[r][0], tdt_name[dt], odd,
              isa ? isa : "default", rc, err_text);
        for (int k = 1; k <= 3; k++) {
          char out[24], ref[24];
          snprintf(out, sizeof out, "o%d.npy", k);
          snprintf(ref, sizeof ref, "ref%d.npy", k);
          if (!file_exists(out)) continue;
          if (variant == 0)
            rename(out, ref);
          else
            tu_check(same_file(out, ref), "%s %s offsets %d, kernels %s: %s differs from the aligned run",
                  runs[r][0], tdt_name[dt], odd, isa ? isa : "default", out);
        }
      }
      for (int k = 1; k <= 3; k++) {
        char name[24];
        snprintf(name, sizeof name, "o%d.npy", k), unlink(name);
        snprintf(name, sizeof name, "ref%d.npy", k), unlink(name);
      }
    }
    arr_free(&x), arr_free(&dy), arr_free(&w), arr_free(&b);
  }
  const char *junk[] = {"x.npy", "dy.npy", "w.npy", "b.npy", "xo.npy", "dyo.npy", "wo.npy", "bo.npy"};
  for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) unlink(junk[i]);
}

int main(int argc, char **argv) {
  cli_begin(argc, argv);
  test_versions_and_sources();
  test_stream_inputs();
  test_odd_offsets();
  return cli_end("cli_commands_inputs");
}
