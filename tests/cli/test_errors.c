/* test_errors.c - every error of the command: its exit code and one-line
 * message, no output or temporary left, existing outputs untouched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_fixture.h"

typedef struct err_case {
  int code;
  const char *message; /* the whole line after "rmsnorm: " when it starts with '=', else a part */
  const char *args[24];
} err_case;

#define OUTS "out.npy", "r.npy", "m.npy", "dw.npy", "db.npy", "h2.npy"
static const char *const outputs[] = {OUTS};

static const err_case err_cases[] = {
  /* usage errors: 2 */
  {2, "unknown command 'bogus'", {"bogus"}},
  {2, "unknown option '--bogus'", {"--bogus"}},
  {2, "unknown command 'nope'", {"help", "nope"}},
  {2, "forward: unknown option '--bogus'", {"forward", "x.npy", "-o", "out.npy", "--bogus"}},
  {2, "forward: unknown option '-x'", {"forward", "x.npy", "-o", "out.npy", "-x"}},
  {2, "forward: missing the output: -o Y.npy", {"forward", "x.npy"}},
  {2, "forward: missing input file (X.npy)", {"forward", "-o", "out.npy"}},
  {2, "backward: missing input file (X.npy DY.npy)", {"backward", "x.npy", "-o", "out.npy"}},
  {2, "forward: unexpected argument 'x.npy'", {"forward", "x.npy", "x.npy", "-o", "out.npy"}},
  {2, "forward: option '--eps' needs a value", {"forward", "x.npy", "-o", "out.npy", "--eps"}},
  {2, "forward: option '-o' needs a value", {"forward", "x.npy", "-o"}},
  {2, "=forward: --eps must be a finite number >= 0, not '-1' (see 'rmsnorm forward --help')",
   {"forward", "x.npy", "-o", "out.npy", "--eps", "-1"}},
  {2, "--eps must be a finite number >= 0, not 'nan'", {"forward", "x.npy", "-o", "out.npy", "--eps", "nan"}},
  {2, "--eps must be a finite number >= 0, not 'inf'", {"forward", "x.npy", "-o", "out.npy", "--eps=inf"}},
  {2, "--eps must be a finite number >= 0, not '1e999'", {"forward", "x.npy", "-o", "out.npy", "--eps", "1e999"}},
  {2, "--eps must be a finite number >= 0, not '1e-5x'", {"forward", "x.npy", "-o", "out.npy", "--eps", "1e-5x"}},
  {2, "--eps must be a finite number >= 0, not ''", {"forward", "x.npy", "-o", "out.npy", "--eps="}},
  {2, "--eps must be a finite number >= 0, not '-0.5'", {"layernorm", "x.npy", "-o", "out.npy", "--eps", "-0.5"}},
  {2, "--partial must be a number in (0, 1], not '0'", {"forward", "x.npy", "-o", "out.npy", "--partial", "0"}},
  {2, "--partial must be a number in (0, 1], not '1.5'", {"forward", "x.npy", "-o", "out.npy", "--partial", "1.5"}},
  {2, "--partial must be a number in (0, 1], not '-0.5'", {"backward", "x.npy", "x.npy", "-o", "out.npy", "--partial", "-0.5"}},
  {2, "--partial must be a number in (0, 1], not 'nan'", {"forward", "x.npy", "-o", "out.npy", "--partial", "nan"}},
  {2, "--dims must be an integer from 1 to 64, not '0'", {"forward", "x.npy", "-o", "out.npy", "--dims", "0"}},
  {2, "--dims must be an integer from 1 to 64, not '1.5'", {"forward", "x.npy", "-o", "out.npy", "--dims", "1.5"}},
  {2, "--dims must be an integer from 1 to 64, not '65'", {"forward", "x.npy", "-o", "out.npy", "--dims", "65"}},
  {2, "=forward: --dims 3 is more than the 2 axes of x.npy (see 'rmsnorm forward --help')",
   {"forward", "x.npy", "-o", "out.npy", "--dims", "3"}},
  {2, "backward: --dweight needs --weight", {"backward", "x.npy", "x.npy", "-o", "out.npy", "--dweight", "dw.npy"}},
  {2, "layernorm: unknown option '--eps-outside'", {"layernorm", "x.npy", "-o", "out.npy", "--eps-outside"}},
  {2, "layernorm: unknown option '--partial'", {"layernorm", "x.npy", "-o", "out.npy", "--partial", "0.5"}},
  {2, "layernorm-backward: unknown option '--partial=1'", {"layernorm-backward", "x.npy", "x.npy", "-o", "out.npy", "--partial=1"}},
  {2, "forward: unknown option '--mean'", {"forward", "x.npy", "-o", "out.npy", "--mean", "m.npy"}},
  {2, "forward: unknown option '--dweight'", {"forward", "x.npy", "-o", "out.npy", "--dweight", "dw.npy"}},
  {2, "backward: unknown option '--rstd'", {"backward", "x.npy", "x.npy", "-o", "out.npy", "--rstd", "r.npy"}},
  {2, "forward: option '--bf16=1' takes no value", {"forward", "x.npy", "-o", "out.npy", "--bf16=1"}},
  {2, "forward: 'out.npy' is named by two outputs", {"forward", "x.npy", "-o", "out.npy", "--rstd", "out.npy"}},
  {2, "demo: unexpected argument 'now'", {"demo", "now"}},
  {2, "info: unexpected argument '-v'", {"info", "-v"}},
  {2, "=add-forward: missing input file (H.npy U.npy) (see 'rmsnorm add-forward --help')", {"add-forward", "x.npy", "-o", "out.npy"}},
  {2, "add-forward: missing the output: -o Y.npy", {"add-forward", "x.npy", "x.npy", "--residual-out", "h2.npy"}},
  {2, "add-forward: 'out.npy' is named by two outputs", {"add-forward", "x.npy", "x.npy", "-o", "out.npy", "--residual-out", "out.npy"}},
  {2, "add-forward: unknown option '--dweight'", {"add-forward", "x.npy", "x.npy", "-o", "out.npy", "--dweight", "dw.npy"}},
  {2, "add-forward: unexpected argument 'x.npy'", {"add-forward", "x.npy", "x.npy", "x.npy", "-o", "out.npy"}},
  {2, "--eps must be a finite number >= 0, not '-1'", {"add-forward", "x.npy", "x.npy", "-o", "out.npy", "--eps", "-1"}},
  {2, "forward: unknown option '--residual-out'", {"forward", "x.npy", "-o", "out.npy", "--residual-out", "h2.npy"}},
  {2, "forward: unknown option '--linear-bias'", {"forward", "x.npy", "-o", "out.npy", "--linear-bias", "w.npy"}},
  {2, "=linear: missing input file (X.npy W.npy) (see 'rmsnorm linear --help')", {"linear", "x.npy", "-o", "out.npy"}},
  {2, "linear: missing the output: -o Z.npy", {"linear", "x.npy", "wm.npy"}},
  {2, "linear: unknown option '--bias'", {"linear", "x.npy", "wm.npy", "-o", "out.npy", "--bias", "w.npy"}},
  {2, "linear: unknown option '--dims'", {"linear", "x.npy", "wm.npy", "-o", "out.npy", "--dims", "1"}},
  {2, "linear: unknown option '--residual-out'", {"linear", "x.npy", "wm.npy", "-o", "out.npy", "--residual-out", "h2.npy"}},
  {2, "--partial must be a number in (0, 1], not '2'", {"linear", "x.npy", "wm.npy", "-o", "out.npy", "--partial", "2"}},
  {2, "linear: 'out.npy' is named by two outputs", {"linear", "x.npy", "wm.npy", "-o", "out.npy", "--rstd", "out.npy"}},
  /* failures: 1 */
  {1, "=nope.npy: cannot open: No such file or directory", {"forward", "nope.npy", "-o", "out.npy"}},
  {1, "=adir: is a directory", {"forward", "adir", "-o", "out.npy"}},
  {1, "=empty.npy: empty file, not a .npy file", {"forward", "empty.npy", "-o", "out.npy"}},
  {1, "=text.npy: not a .npy file (no \\x93NUMPY magic)", {"forward", "text.npy", "-o", "out.npy"}},
  {1, "=short.npy: truncated header (9 bytes)", {"forward", "short.npy", "-o", "out.npy"}},
  {1, "header length 4000 runs past the end of the file", {"forward", "longhdr.npy", "-o", "out.npy"}},
  {1, "=v4.npy: unsupported .npy format version 4.0 (1.0, 2.0 and 3.0 are read)", {"forward", "v4.npy", "-o", "out.npy"}},
  {1, "garbage.npy: malformed header", {"forward", "garbage.npy", "-o", "out.npy"}},
  {1, "=cut.npy: data is truncated: shape (2, 4) of '<f4' needs 32 bytes, the file has 31",
   {"forward", "cut.npy", "-o", "out.npy"}},
  {1, "huge.npy: shape (4294967296, 4294967296) is too large (its size overflows)", {"forward", "huge.npy", "-o", "out.npy"}},
  {1, "fortran.npy: Fortran-order arrays are not supported", {"forward", "fortran.npy", "-o", "out.npy"}},
  {1, "bigend.npy: big-endian dtype '>f4' is not supported", {"forward", "bigend.npy", "-o", "out.npy"}},
  {1, "object.npy: object arrays (dtype '|O') are not supported", {"forward", "object.npy", "-o", "out.npy"}},
  {1, "int.npy: unsupported dtype '<i4'", {"forward", "int.npy", "-o", "out.npy"}},
  {1, "=u2.npy: dtype '<u2' is read as bf16 bits only with --bf16", {"forward", "u2.npy", "-o", "out.npy"}},
  {1, "=x.npy: --bf16 expects '<u2' arrays of raw bf16 bits, got '<f4'", {"forward", "x.npy", "-o", "out.npy", "--bf16"}},
  {1, "=w8.npy: weight shape (8,) does not match normalized shape (4,)", {"forward", "x.npy", "-o", "out.npy", "--weight", "w8.npy"}},
  {1, "=w8.npy: bias shape (8,) does not match normalized shape (4,)", {"layernorm", "x.npy", "-o", "out.npy", "--bias", "w8.npy"}},
  {1, "=w8.npy: weight shape (8,) does not match normalized shape (2, 4)", {"forward", "x.npy", "-o", "out.npy", "--weight", "w8.npy", "--dims", "2"}},
  {1, "=w2x4.npy: weight shape (2, 4) does not match normalized shape (8,)", {"forward", "x8.npy", "-o", "out.npy", "--weight", "w2x4.npy"}},
  {1, "=w16.npy: weight dtype '<f2' must be '<f4' or the data's dtype '<f4'", {"forward", "x.npy", "-o", "out.npy", "--weight", "w16.npy"}},
  {1, "=w64.npy: weight dtype '<f8' must be '<f4' or the data's dtype '<f4'", {"forward", "x.npy", "-o", "out.npy", "--weight", "w64.npy"}},
  {1, "=w16.npy: bias dtype '<f2' does not match the weight's dtype '<f4' (w.npy)", {"forward", "x16.npy", "-o", "out.npy", "--weight", "w.npy", "--bias", "w16.npy"}},
  {1, "=w16.npy: weight dtype '<f2' must be '<f4' or the data's dtype '<u2'", {"backward", "xb.npy", "xb.npy", "-o", "out.npy", "--weight", "w16.npy", "--bf16"}},
  {1, "=x8.npy: shape (8,) does not match x.npy's shape (2, 4)", {"backward", "x.npy", "x8.npy", "-o", "out.npy"}},
  {1, "=x16.npy: dtype '<f2' does not match x.npy's dtype '<f4'", {"backward", "x.npy", "x16.npy", "-o", "out.npy"}},
  {1, "=scalar.npy: a 0-d array has no axis to normalize", {"forward", "scalar.npy", "-o", "out.npy"}},
  {1, "=empty_axis.npy: normalized shape (0,) is empty", {"layernorm", "empty_axis.npy", "-o", "out.npy"}},
  {1, "=vast.npy: shape too large", {"forward", "vast.npy", "-o", "out.npy", "--dims", "2"}},
  {1, "=nodir/out.npy: cannot write: No such file or directory", {"forward", "x.npy", "-o", "nodir/out.npy"}},
  {1, "=adir: is a directory", {"forward", "x.npy", "-o", "adir"}},
  {1, "=adir/: is a directory", {"forward", "x.npy", "-o", "adir/"}},
  /* the second output fails after the first one's temporary exists */
  {1, "=nodir/r.npy: cannot write: No such file or directory", {"forward", "x.npy", "-o", "out.npy", "--rstd", "nodir/r.npy"}},
  {1, "=adir: is a directory", {"layernorm", "x.npy", "-o", "out.npy", "--mean", "m.npy", "--rstd", "adir"}},
  {1, "nodir/db.npy: cannot write: No such file", {"backward", "x.npy", "x.npy", "-o", "out.npy", "--weight", "w.npy", "--dweight", "dw.npy", "--dbias", "nodir/db.npy"}},
  {1, "=./out.npy: is named by two outputs", {"forward", "x.npy", "-o", "out.npy", "--rstd", "./out.npy"}},
  /* add-forward: U must match H */
  {1, "=x8.npy: shape (8,) does not match x.npy's shape (2, 4)", {"add-forward", "x.npy", "x8.npy", "-o", "out.npy"}},
  {1, "=x16.npy: dtype '<f2' does not match x.npy's dtype '<f4'", {"add-forward", "x.npy", "x16.npy", "-o", "out.npy"}},
  {1, "=w8.npy: weight shape (8,) does not match normalized shape (4,)", {"add-forward", "x.npy", "x.npy", "-o", "out.npy", "--weight", "w8.npy"}},
  {1, "=nodir/h2.npy: cannot write: No such file or directory", {"add-forward", "x.npy", "x.npy", "-o", "out.npy", "--residual-out", "nodir/h2.npy"}},
  {1, "=xb.npy: dtype '<u2' is read as bf16 bits only with --bf16", {"add-forward", "xb.npy", "xb.npy", "-o", "out.npy"}},
  /* sandwich: A must match H, both gains the normalized shape and one dtype */
  {2, "=sandwich: missing input file (H.npy A.npy) (see 'rmsnorm sandwich --help')", {"sandwich", "x.npy", "-o", "out.npy"}},
  {2, "sandwich: missing the output: -o Y.npy", {"sandwich", "x.npy", "x.npy", "--residual-out", "h2.npy"}},
  {2, "sandwich: unknown option '--weight'", {"sandwich", "x.npy", "x.npy", "-o", "out.npy", "--weight", "w.npy"}},
  {2, "sandwich: unknown option '--bias'", {"sandwich", "x.npy", "x.npy", "-o", "out.npy", "--bias", "w.npy"}},
  {2, "sandwich: 'r.npy' is named by two outputs", {"sandwich", "x.npy", "x.npy", "-o", "out.npy", "--rstd", "r.npy", "--post-rstd", "r.npy"}},
  {2, "forward: unknown option '--post-weight'", {"forward", "x.npy", "-o", "out.npy", "--post-weight", "w.npy"}},
  {1, "=x8.npy: shape (8,) does not match x.npy's shape (2, 4)", {"sandwich", "x.npy", "x8.npy", "-o", "out.npy"}},
  {1, "=x16.npy: dtype '<f2' does not match x.npy's dtype '<f4'", {"sandwich", "x.npy", "x16.npy", "-o", "out.npy"}},
  {1, "=w8.npy: post weight shape (8,) does not match normalized shape (4,)", {"sandwich", "x.npy", "x.npy", "-o", "out.npy", "--post-weight", "w8.npy"}},
  {1, "=w8.npy: pre weight shape (8,) does not match normalized shape (4,)", {"sandwich", "x.npy", "x.npy", "-o", "out.npy", "--pre-weight", "w8.npy"}},
  {1, "=w64.npy: post weight dtype '<f8' must be '<f4' or the data's dtype '<f4'", {"sandwich", "x.npy", "x.npy", "-o", "out.npy", "--post-weight", "w64.npy"}},
  {1, "=w16.npy: post weight dtype '<f2' does not match the pre weight's dtype '<f4' (w.npy)", {"sandwich", "x16.npy", "x16.npy", "-o", "out.npy", "--pre-weight", "w.npy", "--post-weight", "w16.npy"}},
  {1, "=nodir/m.npy: cannot write: No such file or directory", {"sandwich", "x.npy", "x.npy", "-o", "out.npy", "--post-rstd", "nodir/m.npy"}},
  /* gated: Z must match X; the group must divide the row */
  {2, "=gated: missing input file (X.npy Z.npy) (see 'rmsnorm gated --help')", {"gated", "x.npy", "-o", "out.npy"}},
  {2, "=gated: --act must be silu or sigmoid, not 'relu' (see 'rmsnorm gated --help')", {"gated", "x.npy", "x.npy", "-o", "out.npy", "--act", "relu"}},
  {2, "gated: --group must be a whole number (0: the whole row), not '-2'", {"gated", "x.npy", "x.npy", "-o", "out.npy", "--group", "-2"}},
  {2, "gated: --group must be a whole number (0: the whole row), not '2x'", {"gated", "x.npy", "x.npy", "-o", "out.npy", "--group=2x"}},
  {2, "gated: unknown option '--eps-outside'", {"gated", "x.npy", "x.npy", "-o", "out.npy", "--eps-outside"}},
  {2, "gated: unknown option '--partial'", {"gated", "x.npy", "x.npy", "-o", "out.npy", "--partial", "0.5"}},
  {2, "gated: unknown option '--bias'", {"gated", "x.npy", "x.npy", "-o", "out.npy", "--bias", "w.npy"}},
  {2, "gated: option '--norm-first=1' takes no value", {"gated", "x.npy", "x.npy", "-o", "out.npy", "--norm-first=1"}},
  {2, "forward: unknown option '--norm-first'", {"forward", "x.npy", "-o", "out.npy", "--norm-first"}},
  {2, "forward: --group must be a multiple of 32 (0: one scale per row), not '4'", {"forward", "x.npy", "-o", "out.npy", "--group", "4"}},
  {1, "=x.npy: normalized size 4 is not a multiple of --group 3", {"gated", "x.npy", "x.npy", "-o", "out.npy", "--group", "3"}},
  {1, "=x8.npy: shape (8,) does not match x.npy's shape (2, 4)", {"gated", "x.npy", "x8.npy", "-o", "out.npy"}},
  {1, "=w8.npy: weight shape (8,) does not match normalized shape (4,)", {"gated", "x.npy", "x.npy", "-o", "out.npy", "--weight", "w8.npy"}},
  {1, "=nodir/r.npy: cannot write: No such file or directory", {"gated", "x.npy", "x.npy", "-o", "out.npy", "--rstd", "nodir/r.npy"}},
  /* linear (these need a BLAS; without one every linear run says so) */
  {1, "=nope.npy: cannot open: No such file or directory", {"linear", "x.npy", "nope.npy", "-o", "out.npy"}},
  {1, "=w.npy: matrix shape (4,) must be (4, N): X's last axis is 4", {"linear", "x.npy", "w.npy", "-o", "out.npy"}},
  {1, "=x.npy: matrix shape (2, 4) must be (4, N): X's last axis is 4", {"linear", "x.npy", "x.npy", "-o", "out.npy"}},
  {1, "=wm0.npy: matrix shape (4, 0) has no columns", {"linear", "x.npy", "wm0.npy", "-o", "out.npy"}},
  {1, "=wm64.npy: matrix dtype '<f8' must be '<f4' for '<f4' data (the compute type)", {"linear", "x.npy", "wm64.npy", "-o", "out.npy"}},
  {1, "=wm.npy: matrix dtype '<f4' must be '<f8' for '<f8' data (the compute type)", {"linear", "x64.npy", "wm.npy", "-o", "out.npy"}},
  {1, "=w8.npy: weight shape (8,) does not match normalized shape (4,)", {"linear", "x.npy", "wm.npy", "-o", "out.npy", "--weight", "w8.npy"}},
  {1, "=w.npy: linear bias shape (4,) does not match (3,), W's columns", {"linear", "x.npy", "wm.npy", "-o", "out.npy", "--linear-bias", "w.npy"}},
  {1, "=lb16.npy: linear bias dtype '<f2' must be '<f4' or the data's dtype '<f4'", {"linear", "x.npy", "wm.npy", "-o", "out.npy", "--linear-bias", "lb16.npy"}},
  {1, "=lb.npy: linear bias dtype '<f4' does not match the weight's dtype '<f2' (w16.npy)", {"linear", "x16.npy", "wm.npy", "-o", "out.npy", "--weight", "w16.npy", "--linear-bias", "lb.npy"}},
  {1, "=x.npy: --bf16 expects '<u2' arrays of raw bf16 bits, got '<f4'", {"linear", "x.npy", "wm.npy", "-o", "out.npy", "--bf16"}},
  {1, "=scalar.npy: a 0-d array has no axis to normalize", {"linear", "scalar.npy", "wm.npy", "-o", "out.npy"}},
  {1, "=empty_axis.npy: normalized shape (0,) is empty", {"linear", "empty_axis.npy", "wm.npy", "-o", "out.npy"}},
  {1, "=nodir/r.npy: cannot write: No such file or directory", {"linear", "x.npy", "wm.npy", "-o", "out.npy", "--rstd", "nodir/r.npy"}},
};

static void make_error_fixtures(void) {
  static const size_t s24[2] = {2, 4}, s8[1] = {8}, s4[1] = {4}, s2x4[2] = {2, 4};
  static const size_t s4x3[2] = {4, 3}, s3[1] = {3};
  static const struct {
    const char *name;
    tdt dt;
    int ndim;
    const size_t *shape;
  } arrays[] = {
    {"x.npy", TF32, 2, s24}, {"x8.npy", TF32, 1, s8}, {"x16.npy", TF16, 2, s24},
    {"xb.npy", TBF16, 2, s24}, {"w8.npy", TF32, 1, s8}, {"w.npy", TF32, 1, s4},
    {"w16.npy", TF16, 1, s4}, {"w2x4.npy", TF32, 2, s2x4}, {"w64.npy", TF64, 1, s4},
    /* for linear: a (4, 3) matrix in both compute types, linear biases, fp64 data */
    {"wm.npy", TF32, 2, s4x3}, {"wm64.npy", TF64, 2, s4x3}, {"lb.npy", TF32, 1, s3},
    {"lb16.npy", TF16, 1, s3}, {"x64.npy", TF64, 2, s24},
  };
  for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
    write_filled(arrays[i].name, arrays[i].dt, arrays[i].ndim, arrays[i].shape, FILL_DATA);
  mkdir("adir", 0755);
  write_bytes("empty.npy", "", 0, NULL, 0);
  write_bytes("text.npy", "hello, world\n", 13, NULL, 0);
  write_bytes("short.npy", "\x93NUMPY\x01\x00\x46", 9, NULL, 0);
  write_bytes("longhdr.npy", "\x93NUMPY\x01\x00\xa0\x0f{'descr': '<f4'", 25, NULL, 0);
  write_bytes("v4.npy", "\x93NUMPY\x04\x00\x00\x00\x00\x00{}", 14, NULL, 0);

  /* a header of any text, padded as numpy does, and `data` bytes of zeros */
  struct {
    const char *file, *dict;
    size_t data;
  } raw[] = {
    {"garbage.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), 'x': }", 32},
    {"cut.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }", 31},
    {"huge.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 0},
    {"fortran.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 4), }", 32},
    {"bigend.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 4), }", 32},
    {"object.npy", "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", 16},
    {"int.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 4), }", 32},
    {"u2.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 4), }", 16},
    {"scalar.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4},
    {"empty_axis.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 0), }", 0},
    {"wm0.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 0), }", 0},
    {"vast.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4611686018427387904, 4611686018427387904), }", 0},
  };
  for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++)
    write_npy_raw(raw[i].file, 1, raw[i].dict, 0, NULL, raw[i].data);
}

static void test_errors(void) {
  make_error_fixtures();
  char before[4096], after[4096];
  int blas = rmsnorm_linear_available() == RMSNORM_OK;
  for (size_t c = 0; c < sizeof err_cases / sizeof err_cases[0]; c++) {
    const err_case *e = &err_cases[c];
    if (!blas && e->code == 1 && !strcmp(e->args[0], "linear")) continue;
    for (int pass = 0; pass < 2; pass++) {
      /* pass 0: no outputs exist; pass 1: they exist and must survive */
      for (size_t i = 0; i < sizeof outputs / sizeof outputs[0]; i++) {
        unlink(outputs[i]);
        if (pass) write_old(outputs[i]);
      }
      listing(before, sizeof before);
      int rc = run_with(NULL, e->args);
      listing(after, sizeof after);
      char want[512];
      const char *nl = strchr(err_text, '\n');
      int one_line = nl && nl[1] == '\0' && !strncmp(err_text, "rmsnorm: ", 9);
      if (e->message[0] == '=')
        snprintf(want, sizeof want, "rmsnorm: %s\n", e->message + 1);
      tu_check(rc == e->code, "'%s %s': exit %d, want %d (%s)", e->args[0], e->args[1] ? e->args[1] : "",
            rc, e->code, err_text);
      tu_check(one_line && (e->message[0] == '=' ? !strcmp(err_text, want) : !!strstr(err_text, e->message)),
            "'%s %s': message '%s', want '%s'", e->args[0], e->args[1] ? e->args[1] : "", err_text,
            e->message);
      tu_check(out_text[0] == '\0', "'%s': wrote to stdout: %s", e->args[0], out_text);
      tu_check(!strcmp(before, after), "'%s %s': folder changed:\n  before: %s\n  after:  %s",
            e->args[0], e->args[1] ? e->args[1] : "", before, after);
      for (size_t i = 0; pass && i < sizeof outputs / sizeof outputs[0]; i++) {
        tu_check(old_content(outputs[i]), "'%s %s': %s was touched",
              e->args[0], e->args[1] ? e->args[1] : "", outputs[i]);
      }
    }
  }
  for (size_t i = 0; i < sizeof outputs / sizeof outputs[0]; i++) unlink(outputs[i]);

  /* no arguments: the usage, on stderr, exit 2 */
  const char *none[] = {NULL};
  int rc = run_with(NULL, none);
  tu_check(rc == 2 && strstr(err_text, "usage: rmsnorm COMMAND") && out_text[0] == '\0',
        "no arguments: %d %s", rc, err_text);

  /* a write that fails half-way (`ulimit -f`, SIGXFSZ at its default as a
   * shell leaves it): exit 1, one line, no output, no temporary */
  static const size_t big[2] = {64, 64};
  write_filled("bigx.npy", TF32, 2, big, FILL_DATA);
  for (int pass = 0; pass < 2; pass++) {
    unlink("out.npy"), unlink("r.npy");
    if (pass) write_old("out.npy");
    listing(before, sizeof before);
    run_opts limited = {.fsize_limit = 8192};
    rc = RUN_WITH(&limited, "forward", "bigx.npy", "--rstd", "r.npy", "-o", "out.npy");
    listing(after, sizeof after);
    tu_check(rc == 1 && strstr(err_text, "out.npy: cannot write: File too large"),
          "write failure: %d %s", rc, err_text);
    tu_check(!strcmp(before, after), "write failure left files:\n  before: %s\n  after:  %s", before,
          after);
  }
  unlink("out.npy"), unlink("bigx.npy");

  /* an unwritable folder (root may write anywhere: skipped then) */
  if (geteuid() != 0) {
    mkdir("ro", 0555);
    rc = RUN("forward", "x.npy", "-o", "ro/out.npy");
    tu_check(rc == 1 && strstr(err_text, "ro/out.npy: cannot create a file in ro: Permission denied"),
          "read-only folder: %d %s", rc, err_text);
    rmdir("ro");
  }

  /* standard output that cannot be written */
  if (file_exists("/dev/full")) {
    run_opts full = {.stdout_path = "/dev/full"};
    rc = RUN_WITH(&full, "demo");
    tu_check(rc == 1 && strstr(err_text, "rmsnorm: cannot write to standard output"),
          "demo > /dev/full: %d %s", rc, err_text);
  }
}

int main(int argc, char **argv) {
  cli_begin(argc, argv);
  test_errors();
  return cli_end("cli_commands_errors");
}
