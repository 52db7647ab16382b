/* testutil.h - what every C test shares: a counter of checks, a seeded
 * random source, and tensors of any dtype filled from doubles. */
#ifndef RMSNORM_TESTUTIL_H
#define RMSNORM_TESTUTIL_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/convert.h"
#include "numerics/dtype.h"
#include "rmsnorm.h"
#include "check.h"

/* Prints the summary line and gives the exit status. */
static inline int tu_finish(const char *name) {
  rmsnorm_context *c;
  rmsnorm_isa isa = RMSNORM_ISA_AUTO;
  if (rmsnorm_context_create(&c) == RMSNORM_OK) rmsnorm_context_get_isa(c, &isa);
  rmsnorm_context_free(c);
  printf("%s (default kernels: %s): %ld checks, %ld passed, %ld failed\n", name,
         rmsnorm_isa_name(isa), tu_checks, tu_checks - tu_failures, tu_failures);
  return tu_failures ? 1 : 0;
}

#define TU_OK(call)                                                                   \
  do {                                                                                \
    rmsnorm_status st_ = (call);                                                      \
    if (!tu_check(st_ == RMSNORM_OK, "%s:%d: %s -> %s", __FILE__, __LINE__, #call,    \
                  rmsnorm_status_name(st_)))                                          \
      return;                                                                         \
  } while (0)

static inline int tu_env_set(const char *name) {
  const char *e = getenv(name);
  return e && *e && strcmp(e, "0") != 0;
}
/* 1 when the suite runs under user-mode emulation: the aarch64 build's
 * ctest under qemu-aarch64 sets RMSNORM_TEST_EMULATED=1 (CMakeLists.txt,
 * rmsnorm_emulated_tests). What the emulator itself cannot run is left out. */
static inline int tu_emulated(void) { return tu_env_set("RMSNORM_TEST_EMULATED"); }
/* 1 when the suites take their reduced size sets, which still take every
 * code path (docs/arm64.md lists them): under emulation, and where
 * RMSNORM_TEST_REDUCED=1 asks for them (`make test-asan`, `make test-tsan`:
 * a sanitizer finds an over-read or a race on any size that reaches the
 * path, at several times the time of each call). */
static inline int tu_reduced(void) {
  return tu_emulated() || tu_env_set("RMSNORM_TEST_REDUCED");
}
/* splitmix64: small, seedable, good enough for test data */
static uint64_t tu_state = 0x9e3779b97f4a7c15ull;
static inline void tu_seed(uint64_t s) { tu_state = s * 0x9e3779b97f4a7c15ull + 1; }
static inline uint64_t tu_next(void) {
  uint64_t z = (tu_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static inline double tu_uniform(void) { return (double)(tu_next() >> 11) * 0x1p-53; }
static inline double tu_normal(void) {
  double u = tu_uniform(), v = tu_uniform();
  return sqrt(-2.0 * log(u + 0x1p-60)) * cos(6.283185307179586 * v);
}

/* A rows x d tensor of dtype dt with row stride ld, plus a guard region
 * after the last element (ASan catches over-reads of exact-size buffers,
 * the guard catches over-writes in builds without it). */
typedef struct tu_tensor {
  rmsnorm_dtype dt;
  size_t rows, d, ld;
  void *data;
  size_t bytes;
} tu_tensor;

/* aligned: the data on a 64-byte boundary (as torch allocates), where
 * malloc's large blocks start 16 bytes past one. */
static inline tu_tensor tu_alloc_at(rmsnorm_dtype dt, size_t rows, size_t d, size_t ld,
                                    int aligned) {
  tu_tensor t = {dt, rows, d, ld, NULL, 0};
  t.bytes = ((rows ? rows - 1 : 0) * ld + d) * rn_dtype_size(dt);
  t.data = aligned ? aligned_alloc(64, (t.bytes / 64 + 1) * 64) : malloc(t.bytes ? t.bytes : 1);
  if (!t.data) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  memset(t.data, 0x7f, t.bytes); /* a visible pattern in the stride gaps */
  return t;
}

static inline tu_tensor tu_alloc(rmsnorm_dtype dt, size_t rows, size_t d, size_t ld) {
  return tu_alloc_at(dt, rows, d, ld, 0);
}

static inline void tu_free(tu_tensor *t) {
  free(t->data);
  t->data = NULL;
}

static inline double tu_get(const tu_tensor *t, size_t i, size_t j) {
  return rn_load(t->data, t->dt, i * t->ld + j);
}

static inline void tu_set(tu_tensor *t, size_t i, size_t j, double v) {
  rn_store(t->data, t->dt, i * t->ld + j, v);
}

/* scale * a near-normal value (the sum of four 16-bit uniforms, centred and
 * scaled to variance 1) in every element, rounded to the dtype: for tests
 * that compare two paths on the same data, where no exact distribution is
 * needed and tu_fill_normal's log and cos would be most of their time. */
static inline void tu_fill_sum4(tu_tensor *t, double scale) {
  for (size_t i = 0; i < t->rows; i++)
    for (size_t j = 0; j < t->d; j++) {
      uint64_t u = tu_next();
      double v = (double)(u & 0xffff) + (double)((u >> 16) & 0xffff) +
                 (double)((u >> 32) & 0xffff) + (double)(u >> 48);
      tu_set(t, i, j, scale * (v - 131070.0) * (1.7320508075688772 / 65536.0));
    }
}

/* Fills with scale * N(0, 1) values rounded to the dtype. */
static inline void tu_fill_normal(tu_tensor *t, double scale) {
  for (size_t i = 0; i < t->rows; i++)
    for (size_t j = 0; j < t->d; j++) tu_set(t, i, j, scale * tu_normal());
}

/* A value's position on the dtype's number line: the bit pattern read as
 * sign and magnitude, so adjacent representable values differ by 1. */
static inline int64_t tu_ordered(rmsnorm_dtype dt, double v) {
  int64_t mag;
  int neg;
  if (dt == RMSNORM_F64) {
    uint64_t u;
    memcpy(&u, &v, 8);
    mag = (int64_t)(u & 0x7fffffffffffffffull);
    neg = (int)(u >> 63);
  } else if (dt == RMSNORM_F32) {
    uint32_t u = rn_f32_bits((float)v);
    mag = u & 0x7fffffffu;
    neg = (int)(u >> 31);
  } else {
    uint16_t h = dt == RMSNORM_F16 ? rn_f32_to_f16((float)v) : rn_f32_to_bf16((float)v);
    mag = h & 0x7fff;
    neg = h >> 15;
  }
  return neg ? -mag : mag;
}

/* Distance in units in the last place of dt between a and b, both first
 * rounded to dt. NaN is at distance 0 from NaN and infinitely far otherwise. */
static inline double tu_ulps(rmsnorm_dtype dt, double a, double b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? 0 : INFINITY;
  /* the difference in unsigned 64-bit arithmetic: fp64 positions exceed
   * 2^53, so going through double first would round small distances away */
  int64_t ia = tu_ordered(dt, a), ib = tu_ordered(dt, b);
  return ia > ib ? (double)((uint64_t)ia - (uint64_t)ib) : (double)((uint64_t)ib - (uint64_t)ia);
}

/* Whether `want` lies beyond dtype dt's largest finite value and `got` is the
 * infinity of its sign (a result that cannot be represented). */
static inline int tu_overflows(rmsnorm_dtype dt, long double want, double got) {
  long double max = dt == RMSNORM_F64 ? 1.7976931348623157e308L
                    : dt == RMSNORM_F16 ? 65504.0L
                    : dt == RMSNORM_BF16 ? 3.3895313892515355e38L : 3.4028234663852886e38L;
  return fabsl(want) > max * (1 + 0x1p-7L) && isinf(got) && (got > 0) == (want > 0);
}

__extension__ typedef unsigned __int128 tu_u128;
/* pRMSNorm's k for a p the tests write as a short decimal (0.4, 0.37, ...):
 * ceil(P * d) in exact integer arithmetic, P the shortest decimal that
 * reads back as p (at most 15 significant digits here), clamped to [1, d].
 * Independent of the library's way of computing it. */
static inline size_t tu_partial_k(double p, size_t d) {
  char buf[40];
  tu_u128 mant = 0, pow10 = 1;
  for (int digits = 1; digits <= 15; digits++) {
    snprintf(buf, sizeof buf, "%.*e", digits - 1, p);
    if (strtod(buf, NULL) == p) break;
  }
  /* buf is D.DDDe[+-]XX: mantissa digits and a decimal exponent */
  int exp10 = atoi(strchr(buf, 'e') + 1), ndig = 0;
  for (const char *c = buf; *c != 'e'; c++)
    if (*c >= '0' && *c <= '9') mant = mant * 10 + (unsigned)(*c - '0'), ndig++;
  int scale = ndig - 1 - exp10; /* p = mant / 10^scale */
  if (scale < 0) return d;      /* p >= 10: not a fraction */
  if (scale > 36) return 1;     /* p < 1e-21: p * d < 1 for any d here */
  for (int i = 0; i < scale; i++) pow10 *= 10;
  tu_u128 num = mant * d;
  size_t k = (size_t)((num + pow10 - 1) / pow10);
  return k < 1 ? 1 : k > d ? d : k;
}

static inline const char *tu_dtype_name(rmsnorm_dtype dt) {
  static const char *names[] = {"f32", "f16", "bf16", "f64"};
  return rn_dtype_valid(dt) ? names[dt] : "?";
}

#endif
