/* test_npy.c - the .npy reader and writer of tools/npy.c on their own:
 * golden files written by numpy (tests/cli/data, made by make_data.py) are
 * read back with their data, and our headers are numpy's bytes exactly;
 * every header spelling numpy accepts parses; every malformed header is
 * rejected with its message; writer -> parser round trips in all versions.
 * usage: test_cli_npy DATA_DIR */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../check.h"
#include "npy.h"

static const char *data_dir;

/* ---- element decoding (independent of the library) ---------------------- */

static double half_value(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
  return h & 0x8000 ? -v : v;
}

static double element(const npy_info *in, const void *data, size_t i) {
  const unsigned char *p = (const unsigned char *)data + i * in->elem_size;
  switch (in->dtype) {
    case NPY_F32: {
      float f;
      memcpy(&f, p, 4);
      return f;
    }
    case NPY_F64: {
      double d;
      memcpy(&d, p, 8);
      return d;
    }
    case NPY_F16: return half_value((uint16_t)(p[0] | p[1] << 8));
    case NPY_U16: { /* bf16 bits: the top half of a float */
      uint32_t u = (uint32_t)(p[0] | p[1] << 8) << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case NPY_I8:
    case NPY_U8: break; /* written only: the parser never gives them */
  }
  return NAN;
}

/* ---- golden numpy files -------------------------------------------------- */

typedef struct golden {
  const char *file;
  unsigned major;
  npy_dtype dtype;
  int ndim;
  size_t shape[4];
  int fortran_data; /* data is the (2, 3) array in Fortran order */
} golden;

static const golden goldens[] = {
  {"f4_2x3.npy", 1, NPY_F32, 2, {2, 3}, 0},
  {"f2_2x3.npy", 1, NPY_F16, 2, {2, 3}, 0},
  {"f8_2x3.npy", 1, NPY_F64, 2, {2, 3}, 0},
  {"u2_2x3.npy", 1, NPY_U16, 2, {2, 3}, 0},
  {"f4_2x3_v2.npy", 2, NPY_F32, 2, {2, 3}, 0},
  {"f4_2x3_v3.npy", 3, NPY_F32, 2, {2, 3}, 0},
  {"f8_scalar.npy", 1, NPY_F64, 0, {0}, 0},
  {"f4_5.npy", 1, NPY_F32, 1, {5}, 0},
  {"f4_0x4.npy", 1, NPY_F32, 2, {0, 4}, 0},
  {"f2_2x3x4.npy", 1, NPY_F16, 3, {2, 3, 4}, 0},
};

static const struct {
  const char *file;
  const char *message;
} golden_errors[] = {
  {"fortran_2x3.npy", "Fortran-order arrays are not supported"},
  {"be_f4_2x3.npy", "big-endian dtype '>f4' is not supported"},
  {"i4_2x3.npy", "unsupported dtype '<i4'"},
  {"object_2.npy", "object arrays (dtype '|O') are not supported"},
  {"struct_2.npy", "structured dtypes are not supported"},
};

static void test_goldens(void) {
  char path[4096], err[256];
  for (size_t g = 0; g < sizeof goldens / sizeof goldens[0]; g++) {
    const golden *want = &goldens[g];
    snprintf(path, sizeof path, "%s/%s", data_dir, want->file);
    npy_file f;
    if (!tu_check(npy_open(&f, path, err, sizeof err) == 0, "%s: %s", want->file, err)) continue;
    const npy_info *in = &f.info;
    tu_check(in->major == want->major && in->minor == 0, "%s: version %u.%u", want->file, in->major,
          in->minor);
    tu_check(in->dtype == want->dtype, "%s: dtype %s", want->file, in->descr);
    tu_check(in->ndim == want->ndim, "%s: ndim %d", want->file, in->ndim);
    size_t count = 1;
    for (int i = 0; i < want->ndim && i < in->ndim; i++) {
      tu_check(in->shape[i] == want->shape[i], "%s: shape[%d] = %zu", want->file, i, in->shape[i]);
      count *= want->shape[i];
    }
    tu_check(in->count == count && in->data_bytes == count * in->elem_size, "%s: count %zu",
          want->file, in->count);
    tu_check(f.mapped, "%s: a regular file is mapped, not copied", want->file);
    /* the data: arange(n) * 0.5 - 1 */
    for (size_t i = 0; i < in->count; i++)
      tu_check(element(in, f.data, i) == (double)i * 0.5 - 1, "%s: element %zu = %g", want->file, i,
            element(in, f.data, i));
    /* our header for this array is numpy's, byte for byte */
    unsigned char hdr[NPY_HEADER_MAX];
    size_t hlen = npy_header(hdr, sizeof hdr, (int)want->major, in->dtype, in->ndim, in->shape);
    tu_check(hlen == in->data_offset && memcmp(hdr, f.base, hlen) == 0,
          "%s: npy_header differs from numpy's header", want->file);
    npy_close(&f);
    npy_close(&f); /* twice is harmless */
  }
  for (size_t g = 0; g < sizeof golden_errors / sizeof golden_errors[0]; g++) {
    snprintf(path, sizeof path, "%s/%s", data_dir, golden_errors[g].file);
    npy_file f;
    int rc = npy_open(&f, path, err, sizeof err);
    tu_check(rc == -1 && strstr(err, golden_errors[g].message) != NULL, "%s: got '%s'",
          golden_errors[g].file, rc ? err : "accepted");
    if (rc == 0) npy_close(&f);
  }
}

/* ---- crafted headers ----------------------------------------------------- */

/* Builds a file: magic, version, the length field (or `len_override` when
 * not -1), dict text, then `data_bytes` bytes of data. */
static size_t craft(unsigned char *out, unsigned major, unsigned minor, const char *dict,
                    long long len_override, size_t data_bytes) {
  size_t pre = major == 1 ? 10 : 12, n = strlen(dict);
  unsigned long long field = len_override >= 0 ? (unsigned long long)len_override : n;
  memcpy(out, "\x93NUMPY", 6);
  out[6] = (unsigned char)major;
  out[7] = (unsigned char)minor;
  for (size_t i = 0; i < pre - 8; i++) out[8 + i] = (unsigned char)(field >> (8 * i));
  memcpy(out + pre, dict, n);
  memset(out + pre + n, 0x3c, data_bytes);
  return pre + n + data_bytes;
}

typedef struct parse_case {
  unsigned major;
  const char *dict;
  size_t data_bytes;
  const char *error; /* NULL: must parse */
  int ndim;          /* when it parses */
  size_t shape[3];
} parse_case;

static const parse_case parse_cases[] = {
  /* spellings numpy reads */
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24, NULL, 2, {2, 3}},
  {1, "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}", 24, NULL, 2, {2, 3}},
  {1, "{'shape':(2,3),'fortran_order':False,'descr':'<f8'}", 48, NULL, 2, {2, 3}},
  {1, " \t{ 'descr' : '<f2' ,\n 'fortran_order' : False ,\r\n 'shape' : ( 4 , ) , } \n  ", 8, NULL,
   1, {4}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", 24, NULL, 2, {2, 3}},
  {2, "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", 6, NULL, 1, {3}},
  {3, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3,), }", 24, NULL, 2, {2, 3}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, NULL, 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }", 0, NULL, 1, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 100, NULL, 2, {2, 3}},
  /* an empty axis makes any product 0 */
  {1, "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 4611686018427387904, 4611686018427387904), }",
   0, NULL, 3, {0, 4611686018427387904u, 4611686018427387904u}},
  /* rejected */
  {1, "", 0, "not a Python dict", 0, {0}},
  {1, "[1, 2]", 0, "not a Python dict", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), ", 24, "expected a quoted string", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3) ", 24, "expected ',' or '}'", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False}", 0, "lacks 'shape'", 0, {0}},
  {1, "{'shape': (1,), 'fortran_order': False}", 0, "lacks 'descr'", 0, {0}},
  {1, "{'shape': (1,), 'descr': '<f4'}", 0, "lacks 'fortran_order'", 0, {0}},
  {1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4, "given twice", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", 4, "unexpected key 'extra'", 0, {0}},
  {1, "{descr: '<f4'}", 0, "expected a quoted string", 0, {0}},
  {1, "{'descr' '<f4'}", 0, "expected ':'", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", 4, "True or False", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (1,)}", 4, "True or False", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3)}", 12, "must be a tuple", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}", 24, "must be a tuple", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': 6}", 24, "must be a tuple", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3)}", 0, "negative dimension", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,)}", 0, "tuple of integers", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0x10,)}", 0, "tuple of integers", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (03,)}", 0, "leading zero", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': ('2',)}", 0, "tuple of integers", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,, 3)}", 0, "tuple of integers", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", 0, "malformed 'shape'", 0, {0}},
  {3, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L,)}", 8, "tuple of integers", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", 0, "too large", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (9223372036854775808,)}", 0, "too large", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", 0, "size overflows", 0, {0}},
  {1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1152921504606846976,)}", 0, "size overflows", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 23, "data is truncated", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } x", 24, "text after the dict", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }}", 24, "text after the dict", 0, {0}},
  {1, "{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3), }", 24, "expected ',' or '}'", 0, {0}},
  {1, "{'descr': '<f4", 0, "unterminated string", 0, {0}},
  {1, "{'descr': '<\\x66\\x34', 'fortran_order': False, 'shape': (1,)}", 4, "escapes", 0, {0}},
  {1, "{'descr': '<f4\n', 'fortran_order': False, 'shape': (1,)}", 4, "control character", 0, {0}},
  {1, "{'descr': '>f8', 'fortran_order': False, 'shape': (1,)}", 8, "big-endian dtype '>f8'", 0, {0}},
  {1, "{'descr': 'O', 'fortran_order': False, 'shape': (1,)}", 8, "object arrays", 0, {0}},
  {1, "{'descr': '|u1', 'fortran_order': False, 'shape': (1,)}", 1, "unsupported dtype '|u1'", 0, {0}},
  {1, "{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}", 8, "unsupported dtype '<c8'", 0, {0}},
  {1, "{'descr': 'float32', 'fortran_order': False, 'shape': (1,)}", 4, "unsupported dtype 'float32'", 0, {0}},
  {1, "{'descr': '', 'fortran_order': False, 'shape': (1,)}", 4, "unsupported dtype ''", 0, {0}},
  {1, "{'descr': '<f4\x01\x7f\xff', 'fortran_order': False, 'shape': (1,)}", 4, "control character", 0, {0}},
  {1, "{'descr': '<f4\x80\xff', 'fortran_order': False, 'shape': (1,)}", 4, "unsupported dtype '<f4\?\?'", 0, {0}},
  {1, "{'descr': 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 'fortran_order': False, 'shape': (1,)}", 4,
   "unsupported dtype 'aaaaaaaaaaaaaaaaaaaaaaaa...'", 0, {0}},
  {1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", 4, "structured", 0, {0}},
  {1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}", 24, "Fortran-order", 0, {0}},
};

static void test_parse_cases(void) {
  static unsigned char buf[1 << 12];
  char err[256];
  for (size_t c = 0; c < sizeof parse_cases / sizeof parse_cases[0]; c++) {
    const parse_case *pc = &parse_cases[c];
    size_t n = craft(buf, pc->major, 0, pc->dict, -1, pc->data_bytes);
    npy_info in;
    err[0] = '\0';
    int rc = npy_parse(buf, n, &in, err, sizeof err);
    if (pc->error) {
      tu_check(rc == -1 && strstr(err, pc->error) != NULL, "case %zu (%s): want '%s', got '%s'", c,
            pc->dict, pc->error, rc ? err : "accepted");
      continue;
    }
    if (!tu_check(rc == 0, "case %zu (%s): %s", c, pc->dict, err)) continue;
    tu_check(in.ndim == pc->ndim, "case %zu: ndim %d", c, in.ndim);
    for (int i = 0; i < pc->ndim && i < 3; i++)
      tu_check(in.shape[i] == pc->shape[i], "case %zu: shape[%d] = %zu", c, i, in.shape[i]);
    tu_check(in.data_offset == (pc->major == 1 ? 10u : 12u) + strlen(pc->dict), "case %zu: offset", c);
  }

  /* 64 dimensions parse; 65 do not */
  char dict[1024];
  for (int nd = 64; nd <= 65; nd++) {
    int len = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    for (int i = 0; i < nd; i++) len += snprintf(dict + len, sizeof dict - (size_t)len, "1, ");
    snprintf(dict + len, sizeof dict - (size_t)len, "), }");
    size_t n = craft(buf, 1, 0, dict, -1, 4);
    npy_info in;
    int rc = npy_parse(buf, n, &in, err, sizeof err);
    if (nd == 64)
      tu_check(rc == 0 && in.ndim == 64 && in.count == 1, "64 dims: %s", err);
    else
      tu_check(rc == -1 && strstr(err, "more than 64 dimensions"), "65 dims: %s", err);
  }
}

/* The prefix: every way of being too short or not a .npy file at all. */
static void test_prefix(void) {
  static unsigned char buf[256];
  char err[256];
  npy_info in;
  const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }";
  size_t full = craft(buf, 1, 0, dict, -1, 4);

  tu_check(npy_parse(buf, 0, &in, err, sizeof err) == -1 && strstr(err, "empty file"), "empty: %s", err);
  for (size_t n = 1; n < 10; n++) /* magic, version or length cut off */
    tu_check(npy_parse(buf, n, &in, err, sizeof err) == -1 && strstr(err, "truncated header"),
          "%zu bytes: %s", n, err);
  for (size_t n = 10; n < full - 4; n++) /* the dict cut off: the length runs past the end */
    tu_check(npy_parse(buf, n, &in, err, sizeof err) == -1 && strstr(err, "runs past the end"),
          "%zu bytes: %s", n, err);
  tu_check(npy_parse(buf, full - 1, &in, err, sizeof err) == -1 && strstr(err, "data is truncated"),
        "data cut: %s", err);
  tu_check(npy_parse(buf, full, &in, err, sizeof err) == 0, "whole: %s", err);

  tu_check(npy_parse("PK\x03\x04 zip file", 14, &in, err, sizeof err) == -1 &&
            strstr(err, "not a .npy file"), "zip: %s", err);
  tu_check(npy_parse("\x93NUMPX\x01\x00", 8, &in, err, sizeof err) == -1 &&
            strstr(err, "not a .npy file"), "magic: %s", err);
  tu_check(npy_parse("\x93", 1, &in, err, sizeof err) == -1 && strstr(err, "truncated header"),
        "1 byte: %s", err);

  unsigned versions[][2] = {{0, 0}, {4, 0}, {1, 1}, {2, 5}, {255, 255}};
  for (size_t v = 0; v < sizeof versions / sizeof versions[0]; v++) {
    size_t n = craft(buf, versions[v][0] == 1 ? 1 : 2, 0, dict, -1, 4);
    buf[6] = (unsigned char)versions[v][0];
    buf[7] = (unsigned char)versions[v][1];
    char want[64];
    snprintf(want, sizeof want, "unsupported .npy format version %u.%u", versions[v][0],
             versions[v][1]);
    tu_check(npy_parse(buf, n, &in, err, sizeof err) == -1 && strstr(err, want), "%s: %s", want, err);
  }

  /* header lengths past the end, up to the largest the field holds */
  long long lens[] = {(long long)strlen(dict) + 1, 65535, 0xffffffffLL};
  for (size_t k = 0; k < 3; k++) {
    unsigned major = lens[k] > 65535 ? 2 : 1;
    size_t n = craft(buf, major, 0, dict, lens[k], 0);
    tu_check(npy_parse(buf, n, &in, err, sizeof err) == -1 && strstr(err, "runs past the end"),
          "length %lld: %s", lens[k], err);
  }

  /* a message cut to a tiny buffer is still terminated */
  char small[8];
  tu_check(npy_parse(buf, 3, &in, small, sizeof small) == -1 && memchr(small, '\0', sizeof small),
        "small message buffer");
}

/* ---- writer -> parser ------------------------------------------------------ */

static void test_round_trips(void) {
  static const size_t shapes[][5] = {
    {0}, {1, 0}, {1, 7}, {2, 2, 3}, {4, 1, 1, 1, 1}, {2, 4294967296u, 1}, {1, 18446744073709551u},
  };
  static unsigned char buf[NPY_HEADER_MAX + 64];
  char err[256];
  for (int dt = NPY_F32; dt <= NPY_U16; dt++) {
    for (int version = 0; version <= 3; version++) {
      for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int ndim = (int)shapes[s][0];
        const size_t *shape = &shapes[s][1];
        size_t hlen = npy_header(buf, sizeof buf, version, (npy_dtype)dt, ndim, shape);
        if (!tu_check(hlen > 0 && hlen % 64 == 0, "header length %zu", hlen)) continue;
        tu_check(buf[6] == (version == 0 ? 1 : version) && buf[hlen - 1] == '\n', "version byte");
        size_t count = 1;
        for (int i = 0; i < ndim; i++) count *= shape[i];
        size_t bytes = count * npy_dtype_size((npy_dtype)dt);
        npy_info in;
        int rc;
        if (bytes <= 64) {
          memset(buf + hlen, 0, bytes);
          rc = npy_parse(buf, hlen + bytes, &in, err, sizeof err);
          tu_check(rc == 0 && in.dtype == (npy_dtype)dt && in.ndim == ndim && in.count == count &&
                    in.data_offset == hlen,
                "round trip dt %d v%d shape %zu: %s", dt, version, s, rc ? err : "mismatch");
          for (int i = 0; rc == 0 && i < ndim; i++) tu_check(in.shape[i] == shape[i], "shape[%d]", i);
        } else { /* too big to hold: the parser must see that data is missing */
          rc = npy_parse(buf, hlen, &in, err, sizeof err);
          tu_check(rc == -1 && strstr(err, "data is truncated"), "big shape %zu: %s", s, err);
        }
      }
    }
  }
  /* 64 dims at the largest dimension still fit; a small buffer is refused */
  size_t big[NPY_MAX_DIMS];
  for (int i = 0; i < NPY_MAX_DIMS; i++) big[i] = (size_t)PTRDIFF_MAX;
  static unsigned char large[NPY_HEADER_MAX];
  tu_check(npy_header(large, sizeof large, 0, NPY_F64, NPY_MAX_DIMS, big) > 0, "64 huge dims");
  tu_check(npy_header(large, 100, 0, NPY_F64, 3, big) == 0, "small buffer refused");
  tu_check(npy_header(large, sizeof large, 0, NPY_F64, NPY_MAX_DIMS + 1, big) == 0, "65 dims refused");
  tu_check(npy_header(large, sizeof large, 4, NPY_F64, 1, big) == 0, "version 4 refused");
}

/* The byte dtypes of quantized outputs: written as numpy writes int8 and
 * uint8 arrays, and refused when read back (the command takes no byte input). */
static void test_byte_dtypes(void) {
  static const size_t shape[2] = {2, 34};
  static const char *const want[2] = {"|i1", "|u1"};
  static const npy_dtype dts[2] = {NPY_I8, NPY_U8};
  unsigned char buf[NPY_HEADER_MAX + 68];
  char err[256], dict[128];
  for (int i = 0; i < 2; i++) {
    tu_check(npy_dtype_size(dts[i]) == 1 && !strcmp(npy_descr(dts[i]), want[i]), "%s", want[i]);
    size_t hlen = npy_header(buf, sizeof buf, 0, dts[i], 2, shape);
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (2, 34), }",
                     want[i]);
    /* magic, 1.0, length 118, the dict, 20 growth spaces then padding, '\n' */
    int ok = hlen == 128 && !memcmp(buf, "\x93NUMPY\x01\x00\x76\x00", 10) &&
             !memcmp(buf + 10, dict, (size_t)n) && buf[127] == '\n';
    for (size_t j = 10 + (size_t)n; ok && j < 127; j++) ok = buf[j] == ' ';
    tu_check(ok, "%s header: %.*s", want[i], (int)hlen, (const char *)buf);
    memset(buf + hlen, 0, 68);
    npy_info in;
    int rc = npy_parse(buf, hlen + 68, &in, err, sizeof err);
    tu_check(rc == -1 && strstr(err, "unsupported dtype") && strstr(err, want[i]),
             "%s read back: %s", want[i], rc ? err : "accepted");
  }
}

static void test_format_shape(void) {
  char s[64];
  size_t sh[] = {2, 3, 4};
  npy_format_shape(s, sizeof s, 0, sh);
  tu_check(!strcmp(s, "()"), "() got %s", s);
  npy_format_shape(s, sizeof s, 1, sh);
  tu_check(!strcmp(s, "(2,)"), "(2,) got %s", s);
  npy_format_shape(s, sizeof s, 3, sh);
  tu_check(!strcmp(s, "(2, 3, 4)"), "(2, 3, 4) got %s", s);
  npy_format_shape(s, 8, 3, sh);
  tu_check(!strcmp(s, "(2,...)"), "cut: got %s", s);
}

/* npy_open on what is not a regular .npy file. */
static void test_open_errors(void) {
  npy_file f;
  char err[256];
  tu_check(npy_open(&f, "/nonexistent/x.npy", err, sizeof err) == -1 &&
            strstr(err, "cannot open: No such file"), "missing: %s", err);
  tu_check(npy_open(&f, data_dir, err, sizeof err) == -1 && !strcmp(err, "is a directory"),
        "dir: %s", err);
  tu_check(npy_open(&f, "/dev/null", err, sizeof err) == -1 && strstr(err, "empty file"),
        "/dev/null: %s", err);
  /* endless devices: refused after the first 8 bytes, not read to the end */
  tu_check(npy_open(&f, "/dev/zero", err, sizeof err) == -1 && strstr(err, "not a .npy file"),
        "/dev/zero: %s", err);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DATA_DIR\n", argv[0]);
    return 2;
  }
  data_dir = argv[1];
  test_goldens();
  test_parse_cases();
  test_prefix();
  test_round_trips();
  test_byte_dtypes();
  test_format_shape();
  test_open_errors();
  return tu_summary("cli_npy");
}
