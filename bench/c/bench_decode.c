/* bench_decode.c - decode-sized calls (1-64 rows, d 128-8192) against a
 * plain two-pass loop of the same SIMD set, where a call's fixed cost and
 * its speed in cache decide. Per kernel set the machine has, on one thread,
 * buffers warm in cache, fp32, bf16 and fp16 data with weights of the same
 * dtype, each case times
 *   fwd:      the loop, rmsnorm_forward, and its plan (RMSNORM_PLAN_FORWARD);
 *             for fp32 also a loop that sums in the spec's order
 *   add+fwd:  the loop (h += u rounded to the dtype, then the norm),
 *             rmsnorm_add_forward, and its plan (RMSNORM_PLAN_ADD_FORWARD)
 *   bwd:      the loop, rmsnorm_backward (r saved by a forward, dweight
 *             summed over the rows)
 * The loops are in bench_decode_loops.inc, compiled per set with its own
 * target attributes and run only where the CPU has the set. Before timing,
 * each case checks that the library's outputs agree with the loop's (a loud
 * line when not, and exit status 1); then the contenders run interleaved,
 * each round a batch of each (~200 us of calls), and the table gives the
 * medians of the per-call times and of the rounds' ratios loop/lib. The goal
 * for every decode-sized call: loop/lib >= 0.8 below 16 rows, >= 0.9 from 16.
 * usage: bench_decode [rounds] [--quick]
 *   rounds: 11 by default; --quick: rows 1, 16 and d 576, 4096 only */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rmsnorm.h"
#include "bench_stats.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BENCH_X86 1
#include <immintrin.h>
#else
#define BENCH_X86 0
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

/* ---- the loops, once per set ------------------------------------------- */

#if BENCH_X86
/* AVX2 + FMA + F16C: 8 fp32 lanes */
#define AVX2_FN static inline __attribute__((always_inline, target("avx2,fma,f16c")))
AVX2_FN __m256 avx2_ld_bf16(const uint16_t *p) {
  __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
AVX2_FN __m256 avx2_ld_f16(const uint16_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
AVX2_FN __m256 avx2_st_f32(float *p, __m256 v) {
  _mm256_storeu_ps(p, v);
  return v;
}
/* bf16 rounded to nearest even: u + 0x7fff + (bit 16 of u), its top half */
AVX2_FN __m256 avx2_st_bf16(uint16_t *p, __m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i b = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
  _mm_storeu_si128((__m128i *)p,
                   _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
}
AVX2_FN __m256 avx2_st_f16(uint16_t *p, __m256 v) {
  __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  _mm_storeu_si128((__m128i *)p, h);
  return _mm256_cvtph_ps(h);
}
AVX2_FN float avx2_hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
AVX2_FN __m256d avx2_lo(__m256 v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
AVX2_FN __m256d avx2_hi(__m256 v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
AVX2_FN double avx2_halve(__m256d v) { /* lane i += lane i + 2, then + 1 */
  __m128d a = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(a, _mm_unpackhi_pd(a, a)));
}
#define V __m256
#define V_W 8
#define VD __m256d
#define VD_W 4
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(f) _mm256_set1_ps(f)
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_HSUM(a) avx2_hsum(a)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_FNMA(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define V_LD_F32(p) _mm256_loadu_ps(p)
#define V_LD_BF16(p) avx2_ld_bf16(p)
#define V_LD_F16(p) avx2_ld_f16(p)
#define V_ST_F32(p, v) avx2_st_f32(p, v)
#define V_ST_BF16(p, v) avx2_st_bf16(p, v)
#define V_ST_F16(p, v) avx2_st_f16(p, v)
#define VD_ZERO() _mm256_setzero_pd()
#define VD_ADD(a, b) _mm256_add_pd(a, b)
#define VD_LO(v) avx2_lo(v)
#define VD_HI(v) avx2_hi(v)
#define VD_HALVE(a) avx2_halve(a)
#define LOOP_FN static __attribute__((target("avx2,fma,f16c")))
#define LOOP_INLINE AVX2_FN
#define LOOP_NAME(n) n##_avx2
#include "bench_decode_loops.inc"

/* AVX-512 F/BW/VL + FMA + F16C: 16 fp32 lanes (512-bit vectors) */
#define AVX512_FN \
  static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,fma,f16c")))
AVX512_FN __m512 avx512_ld_bf16(const uint16_t *p) {
  __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}
AVX512_FN __m512 avx512_ld_f16(const uint16_t *p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
AVX512_FN __m512 avx512_st_f32(float *p, __m512 v) {
  _mm512_storeu_ps(p, v);
  return v;
}
AVX512_FN __m512 avx512_st_bf16(uint16_t *p, __m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i b = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
  _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(b));
  return _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
}
AVX512_FN __m512 avx512_st_f16(uint16_t *p, __m512 v) {
  __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  _mm256_storeu_si256((__m256i *)p, h);
  return _mm512_cvtph_ps(h);
}
AVX512_FN __m512d avx512_lo(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
AVX512_FN __m512d avx512_hi(__m512 v) {
  return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
AVX512_FN double avx512_halve(__m512d v) { /* lane i += lane i + 4, + 2, + 1 */
  __m256d a = _mm256_add_pd(_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd(v, 1));
  __m128d b = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  return _mm_cvtsd_f64(_mm_add_sd(b, _mm_unpackhi_pd(b, b)));
}
#define V __m512
#define V_W 16
#define VD __m512d
#define VD_W 8
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(f) _mm512_set1_ps(f)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_HSUM(a) _mm512_reduce_add_ps(a)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_FNMA(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define V_LD_F32(p) _mm512_loadu_ps(p)
#define V_LD_BF16(p) avx512_ld_bf16(p)
#define V_LD_F16(p) avx512_ld_f16(p)
#define V_ST_F32(p, v) avx512_st_f32(p, v)
#define V_ST_BF16(p, v) avx512_st_bf16(p, v)
#define V_ST_F16(p, v) avx512_st_f16(p, v)
#define VD_ZERO() _mm512_setzero_pd()
#define VD_ADD(a, b) _mm512_add_pd(a, b)
#define VD_LO(v) avx512_lo(v)
#define VD_HI(v) avx512_hi(v)
#define VD_HALVE(a) avx512_halve(a)
#define LOOP_FN static __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define LOOP_INLINE AVX512_FN
#define LOOP_NAME(n) n##_avx512
#include "bench_decode_loops.inc"
#endif /* BENCH_X86 */

#if defined(__aarch64__)
/* NEON (the AArch64 baseline): 4 fp32 lanes */
#define NEON_FN static inline __attribute__((always_inline))
NEON_FN float32x4_t neon_ld_bf16(const uint16_t *p) {
  return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}
NEON_FN float32x4_t neon_ld_f16(const uint16_t *p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}
NEON_FN float32x4_t neon_st_f32(float *p, float32x4_t v) {
  vst1q_f32(p, v);
  return v;
}
NEON_FN float32x4_t neon_st_bf16(uint16_t *p, float32x4_t v) {
  uint32x4_t u = vreinterpretq_u32_f32(v);
  uint32x4_t odd = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
  u = vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), odd);
  vst1_u16(p, vshrn_n_u32(u, 16));
  return vreinterpretq_f32_u32(vandq_u32(u, vdupq_n_u32(0xffff0000u)));
}
NEON_FN float32x4_t neon_st_f16(uint16_t *p, float32x4_t v) {
  float16x4_t h = vcvt_f16_f32(v);
  vst1_u16(p, vreinterpret_u16_f16(h));
  return vcvt_f32_f16(h);
}
#define V float32x4_t
#define V_W 4
#define VD float64x2_t
#define VD_W 2
#define V_ZERO() vdupq_n_f32(0.0f)
#define V_SET1(f) vdupq_n_f32(f)
#define V_ADD(a, b) vaddq_f32(a, b)
#define V_MUL(a, b) vmulq_f32(a, b)
#define V_HSUM(a) vaddvq_f32(a)
#define V_FMA(a, b, c) vfmaq_f32(c, a, b)
#define V_FNMA(a, b, c) vfmsq_f32(c, a, b)
#define V_LD_F32(p) vld1q_f32(p)
#define V_LD_BF16(p) neon_ld_bf16(p)
#define V_LD_F16(p) neon_ld_f16(p)
#define V_ST_F32(p, v) neon_st_f32(p, v)
#define V_ST_BF16(p, v) neon_st_bf16(p, v)
#define V_ST_F16(p, v) neon_st_f16(p, v)
#define VD_ZERO() vdupq_n_f64(0.0)
#define VD_ADD(a, b) vaddq_f64(a, b)
#define VD_LO(v) vcvt_f64_f32(vget_low_f32(v))
#define VD_HI(v) vcvt_high_f64_f32(v)
#define VD_HALVE(a) vaddvq_f64(a)
#define LOOP_FN static
#define LOOP_INLINE NEON_FN
#define LOOP_NAME(n) n##_neon
#include "bench_decode_loops.inc"
#endif

typedef struct loop_set {
  const char *name; /* NULL ends the table */
  rmsnorm_isa isa;
  unsigned needs; /* RMSNORM_CPU_* */
  void (*forward)(int dt, size_t rows, size_t d, const void *x, const void *w, void *y,
                  float eps);
  void (*add_forward)(int dt, size_t rows, size_t d, void *h, const void *u, const void *w,
                      void *y, float eps);
  void (*backward)(int dt, size_t rows, size_t d, const void *x, const void *dy, const void *w,
                   const float *rstd, void *dx, void *dw, float *dwacc);
  void (*forward_spec_f32)(size_t rows, size_t d, const float *x, const float *w, float *y,
                           double eps);
} loop_set;

static const loop_set sets[] = {
#if BENCH_X86
    {"avx2", RMSNORM_ISA_AVX2, RMSNORM_CPU_AVX2 | RMSNORM_CPU_FMA | RMSNORM_CPU_F16C,
     forward_avx2, add_forward_avx2, backward_avx2, forward_spec_f32_avx2},
    {"avx512", RMSNORM_ISA_AVX512,
     RMSNORM_CPU_AVX512F | RMSNORM_CPU_AVX512BW | RMSNORM_CPU_AVX512VL | RMSNORM_CPU_FMA |
         RMSNORM_CPU_F16C,
     forward_avx512, add_forward_avx512, backward_avx512, forward_spec_f32_avx512},
#endif
#if defined(__aarch64__)
    {"neon", RMSNORM_ISA_NEON, RMSNORM_CPU_NEON, forward_neon, add_forward_neon, backward_neon,
     forward_spec_f32_neon},
#endif
    {NULL, RMSNORM_ISA_AUTO, 0, NULL, NULL, NULL, NULL}};

/* ---- data --------------------------------------------------------------- */

#define ROWS_MAX 64
#define D_MAX 8192
#define EPS 1e-6
#define BATCH_S 200e-6 /* a contender's calls in one round */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xalloc(size_t n) {
  void *p = NULL;
  if (posix_memalign(&p, 64, n)) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  memset(p, 0, n); /* page faults stay out of the timings */
  return p;
}

static float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static uint16_t f32_to_bf16(float f) { /* nearest even; finite f */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float f16_to_f32(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? ldexpf((float)m, -24)
            : e == 31 ? (m ? NAN : INFINITY)
                      : ldexpf((float)(m | 0x400), e - 25);
  return h & 0x8000 ? -v : v;
}
static uint16_t f32_to_f16(float f) { /* nearest even below 65504; 0 below 2^-14 */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if (fabsf(f) < 0x1p-14f) return sign;
  uint32_t m = (u & 0x7fffffffu) - (112u << 23); /* exponent rebiased from 127 to 15 */
  return (uint16_t)(sign | ((m + 0xfffu + ((m >> 13) & 1u)) >> 13));
}

static size_t dt_size(int dt) { return dt == RMSNORM_F32 ? 4 : 2; }
static const char *dt_name(int dt) {
  return dt == RMSNORM_F32 ? "f32" : dt == RMSNORM_BF16 ? "bf16" : "f16";
}
static float load_dt(int dt, const void *p, size_t i) {
  if (dt == RMSNORM_F32) return ((const float *)p)[i];
  uint16_t b = ((const uint16_t *)p)[i];
  return dt == RMSNORM_BF16 ? bf16_to_f32(b) : f16_to_f32(b);
}
static void store_dt(int dt, void *p, size_t i, float v) {
  if (dt == RMSNORM_F32)
    ((float *)p)[i] = v;
  else
    ((uint16_t *)p)[i] = dt == RMSNORM_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
}

/* A magnitude in [lo, hi) with a random sign (a fixed sequence). */
static uint32_t seed = 12345;
static float signed_in(float lo, float hi) {
  seed = seed * 1664525u + 1013904223u;
  float m = lo + (hi - lo) * (float)(seed >> 9) * 0x1p-23f;
  return seed & 0x100 ? -m : m;
}

/* Every buffer holds ROWS_MAX x D_MAX elements of up to 4 bytes (a case uses
 * its first rows x d, rows contiguous); w, dw: D_MAX. The loop's outputs go
 * to the *ref buffers when a case checks them, the library's to y, h, dx,
 * dw; while timing, every contender writes y, h, dx, dw. */
typedef struct buffers {
  void *x, *h0, *u, *dy, *w;                /* inputs, of the case's dtype */
  void *y, *h, *dx, *dw;                    /* outputs (h: in and out) */
  void *yref, *href, *dxref, *dwref, *ylib; /* the loop's outputs; the library's y */
  float *dwacc, *rstd;                      /* the loop's fp32 dweight; r a row */
} buffers;

static void fill(buffers *b, int dt) {
  seed = 12345;
  for (size_t i = 0; i < (size_t)ROWS_MAX * D_MAX; i++) {
    float x = signed_in(0.25f, 2.0f);
    store_dt(dt, b->x, i, x);
    store_dt(dt, b->h0, i, signed_in(0.25f, 2.0f));
    store_dt(dt, b->u, i, signed_in(0.25e-3f, 1e-3f)); /* h stays near h0 */
    /* dy leans on x, so that the backward's term through r weighs as much as
     * g dy (with dy apart from x it would be ~1/sqrt(d) of it) */
    store_dt(dt, b->dy, i, 0.5f * x + signed_in(0.0f, 1.0f));
  }
  for (size_t j = 0; j < D_MAX; j++) store_dt(dt, b->w, j, 1.0f + 0.5f * signed_in(0.0f, 1.0f));
}

/* ---- one case ------------------------------------------------------------ */

enum { OP_FWD, OP_ADD, OP_BWD, OPS };
static const char *const op_names[OPS] = {"fwd", "add+fwd", "bwd"};
enum { C_LOOP, C_SPEC, C_LIB, C_PLAN, CONTENDERS };

typedef struct bcase {
  const loop_set *set;
  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  rmsnorm_plan *plan; /* NULL for the backward */
  buffers *b;
  int op, dt;
  size_t rows, d;
  int has[CONTENDERS];
} bcase;

/* One call of a contender. @return its status (the loops': RMSNORM_OK). */
static rmsnorm_status run(const bcase *c, int who) {
  const buffers *b = c->b;
  size_t rows = c->rows, d = c->d;
  int dt = c->dt, loop = who == C_LOOP;
  if (who == C_PLAN) return rmsnorm_plan_run(c->plan);
  if (who == C_SPEC) {
    c->set->forward_spec_f32(rows, d, b->x, b->w, b->y, EPS);
    return RMSNORM_OK;
  }
  if (c->op == OP_FWD) {
    if (!loop) return rmsnorm_forward(c->ctx, &c->cfg, rows, d, b->x, d, b->w, NULL, b->y, d, NULL);
    c->set->forward(dt, rows, d, b->x, b->w, b->y, (float)EPS);
  } else if (c->op == OP_ADD) {
    if (!loop)
      return rmsnorm_add_forward(c->ctx, &c->cfg, rows, d, b->h, d, b->u, d, b->w, NULL, b->y, d,
                                 NULL);
    c->set->add_forward(dt, rows, d, b->h, b->u, b->w, b->y, (float)EPS);
  } else {
    if (!loop)
      return rmsnorm_backward(c->ctx, &c->cfg, rows, d, b->x, d, b->dy, d, b->w, b->rstd, b->dx, d,
                              b->dw, NULL);
    c->set->backward(dt, rows, d, b->x, b->dy, b->w, b->rstd, b->dx, b->dw, b->dwacc);
  }
  return RMSNORM_OK;
}

/* Before each batch: h back to its start (the add feeds on itself). */
static void reset(const bcase *c) {
  if (c->op == OP_ADD) memcpy(c->b->h, c->b->h0, c->rows * c->d * dt_size(c->dt));
}

/* max |a_i - b_i| over n elements of dt, relative to max |b_i| (NaN: inf) */
static double rel_err(int dt, const void *a, const void *b, size_t n) {
  double diff = 0, mag = 0;
  for (size_t i = 0; i < n; i++) {
    double x = load_dt(dt, a, i), y = load_dt(dt, b, i), e = fabs(x - y);
    if (!(e <= diff)) diff = e; /* NaN sticks */
    if (fabs(y) > mag) mag = fabs(y);
  }
  return isnan(diff) ? INFINITY : diff / (mag > 0 ? mag : 1);
}

static int check(const bcase *c, const char *who, const char *what, const void *got,
                 const void *want, size_t n) {
  double tol = c->dt == RMSNORM_F32 ? 1e-5 : 1e-2, e = rel_err(c->dt, got, want, n);
  if (e <= tol) return 0;
  printf("!!! MISMATCH %s %s %s %zux%zu: the %s's %s differs from the loop's by %.2g of its "
         "largest value (tolerance %.0g)\n",
         c->set->name, op_names[c->op], dt_name(c->dt), c->rows, c->d, who, what, e, tol);
  return 1;
}

/* Runs a library contender from fresh outputs and compares it with the
 * loop's. @return the mismatches (a failed call counts as one). */
static int verify_one(const bcase *c, int who) {
  buffers *b = c->b;
  size_t n = c->rows * c->d, bytes = n * dt_size(c->dt), wbytes = c->d * dt_size(c->dt);
  const char *name = who == C_PLAN ? "plan" : "library";
  reset(c);
  memset(b->y, 0, bytes), memset(b->dx, 0, bytes), memset(b->dw, 0, wbytes);
  rmsnorm_status st = run(c, who);
  if (st != RMSNORM_OK) {
    printf("!!! FAILED %s %s %s %zux%zu: the %s's call returned %s\n", c->set->name,
           op_names[c->op], dt_name(c->dt), c->rows, c->d, name, rmsnorm_status_name(st));
    return 1;
  }
  if (c->op == OP_BWD)
    return check(c, name, "dx", b->dx, b->dxref, n) + check(c, name, "dweight", b->dw, b->dwref, c->d);
  int bad = check(c, name, "y", b->y, b->yref, n);
  if (c->op == OP_ADD) bad += check(c, name, "h", b->h, b->href, n);
  return bad;
}

/* The loop's outputs, then the library's and the plan's against them; for
 * the fp32 forward, whether the spec-order loop gives the library's bits
 * (*spec_equal). @return the mismatches. */
static int verify(const bcase *c, int *spec_equal) {
  buffers *b = c->b;
  size_t n = c->rows * c->d, bytes = n * dt_size(c->dt), wbytes = c->d * dt_size(c->dt);
  reset(c);
  run(c, C_LOOP);
  memcpy(b->yref, b->y, bytes), memcpy(b->href, b->h, bytes);
  memcpy(b->dxref, b->dx, bytes), memcpy(b->dwref, b->dw, wbytes);
  int bad = verify_one(c, C_LIB);
  if (c->has[C_SPEC]) {
    memcpy(b->ylib, b->y, bytes);
    run(c, C_SPEC);
    *spec_equal = !memcmp(b->y, b->ylib, bytes);
  }
  if (c->has[C_PLAN]) bad += verify_one(c, C_PLAN);
  return bad;
}


/* Calls of the loop in one batch: BATCH_S of them, sized from a doubling
 * run that lasts at least 20 us. */
static long batch_calls(const bcase *c) {
  for (long n = 1;; n *= 2) {
    reset(c);
    double t0 = now();
    for (long i = 0; i < n; i++) run(c, C_LOOP);
    double t = now() - t0;
    if (t >= 20e-6 || n >= (1L << 24)) {
      long m = (long)((double)n * BATCH_S / t);
      return m < 1 ? 1 : m;
    }
  }
}

typedef struct result {
  double ns[CONTENDERS]; /* median ns per call */
  double ratio[CONTENDERS]; /* median of the rounds' loop / contender */
} result;

/* The contenders interleaved: round -1 warms up, then `rounds` rounds of a
 * batch each. t: CONTENDERS x rounds scratch. */
static void time_case(const bcase *c, int rounds, double *t, double *ratio, result *res) {
  long calls = batch_calls(c);
  for (int r = -1; r < rounds; r++) {
    for (int who = 0; who < CONTENDERS; who++) {
      if (!c->has[who]) continue;
      reset(c);
      double t0 = now();
      for (long i = 0; i < calls; i++) run(c, who);
      double per = (now() - t0) / (double)calls;
      if (r >= 0) t[who * rounds + r] = per;
    }
  }
  for (int who = 0; who < CONTENDERS; who++) { /* the ratios first: bench_median() sorts */
    res->ratio[who] = NAN;
    if (!c->has[who]) continue;
    for (int r = 0; r < rounds; r++) ratio[r] = t[C_LOOP * rounds + r] / t[who * rounds + r];
    res->ratio[who] = bench_median(ratio, rounds);
  }
  for (int who = 0; who < CONTENDERS; who++)
    res->ns[who] = c->has[who] ? bench_median(t + who * rounds, rounds) * 1e9 : NAN;
}

/* ---- the table ------------------------------------------------------------ */

static void print_header(void) {
  printf("%-6s %-7s %-5s %4s %5s %9s %9s %9s %9s %8s %9s %9s %4s  %s\n", "set", "op", "dtype",
         "rows", "d", "loop ns", "spec ns", "lib ns", "plan ns", "loop/lib", "loop/plan",
         "loop/spec", "goal", "miss");
}

static void print_num(const char *fmt, int width, double v) {
  if (isnan(v))
    printf(" %*s", width, "-");
  else
    printf(fmt, v);
}

/* Misses of the goal; a library miss within 10% of the spec-order loop's
 * time is marked "(order)": the summation order bounds it there. */
static void print_row(const bcase *c, const result *res, double goal) {
  printf("%-6s %-7s %-5s %4zu %5zu", c->set->name, op_names[c->op], dt_name(c->dt), c->rows,
         c->d);
  print_num(" %9.1f", 9, res->ns[C_LOOP]);
  print_num(" %9.1f", 9, res->ns[C_SPEC]);
  print_num(" %9.1f", 9, res->ns[C_LIB]);
  print_num(" %9.1f", 9, res->ns[C_PLAN]);
  print_num(" %8.2f", 8, res->ratio[C_LIB]);
  print_num(" %9.2f", 9, res->ratio[C_PLAN]);
  print_num(" %9.2f", 9, res->ratio[C_SPEC]);
  printf(" %4.1f ", goal);
  if (res->ratio[C_LIB] < goal) {
    printf(" lib");
    if (c->has[C_SPEC] && res->ns[C_LIB] <= 1.1 * res->ns[C_SPEC]) printf("(order)");
  }
  if (c->has[C_PLAN] && res->ratio[C_PLAN] < goal) printf(" plan");
  printf("\n");
}

/* Per set and op: cases that meet the goal, and the worst ratio. */
typedef struct tally {
  int cases, met[CONTENDERS];
  double worst[CONTENDERS];
  char where[CONTENDERS][32];
  int spec_cases, spec_equal, order_bound;
} tally;

static void count(tally *s, const bcase *c, const result *res, double goal) {
  s->cases++;
  for (int who = C_LIB; who <= C_PLAN; who++) {
    if (!c->has[who]) continue;
    double r = res->ratio[who];
    if (r >= goal) s->met[who]++;
    if (!(r >= s->worst[who])) {
      s->worst[who] = r;
      snprintf(s->where[who], sizeof s->where[who], "%s %zux%zu", dt_name(c->dt), c->rows, c->d);
    }
  }
  if (c->has[C_SPEC] && res->ratio[C_LIB] < goal && res->ns[C_LIB] <= 1.1 * res->ns[C_SPEC])
    s->order_bound++;
}

static void print_tally(const char *set, int op, const tally *s) {
  printf("%s %s: lib meets the goal in %d of %d cases, worst %.2f (%s)", set, op_names[op],
         s->met[C_LIB], s->cases, s->worst[C_LIB], s->where[C_LIB]);
  if (op != OP_BWD)
    printf("; plan %d of %d, worst %.2f (%s)", s->met[C_PLAN], s->cases, s->worst[C_PLAN],
           s->where[C_PLAN]);
  printf("\n");
  if (s->spec_cases)
    printf("%s %s f32: the spec-order loop gives the library's bits in %d of %d cases; "
           "%d lib misses within 10%% of its time (order)\n",
           set, op_names[op], s->spec_equal, s->spec_cases, s->order_bound);
}

/* ---- main ------------------------------------------------------------------ */

int main(int argc, char **argv) {
  int rounds = 11, quick = 0;
  for (int i = 1; i < argc; i++) {
    char *end;
    long v = strtol(argv[i], &end, 10);
    if (!strcmp(argv[i], "--quick")) {
      quick = 1;
    } else if (*argv[i] && !*end && v >= 1 && v <= 1000) {
      rounds = (int)v;
    } else {
      fprintf(stderr, "usage: bench_decode [rounds] [--quick]\n");
      return 2;
    }
  }
  static const size_t rows_all[] = {1, 4, 16, 64}, d_all[] = {128, 576, 896, 2048, 4096, 8192};
  static const size_t rows_quick[] = {1, 16}, d_quick[] = {576, 4096};
  static const int dtypes[] = {RMSNORM_F32, RMSNORM_BF16, RMSNORM_F16};
  const size_t *rows_set = quick ? rows_quick : rows_all, *d_set = quick ? d_quick : d_all;
  size_t nrows = quick ? 2 : 4, nd = quick ? 2 : 6;

  rmsnorm_context *ctx;
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) return 2;
  rmsnorm_context_set_threads(ctx, 1);
  unsigned features = 0;
  rmsnorm_cpu_features(&features);
  setvbuf(stdout, NULL, _IOLBF, 0);

  buffers b;
  size_t big = (size_t)ROWS_MAX * D_MAX * 4, wide = (size_t)D_MAX * 4;
  void **big_bufs[] = {&b.x, &b.h0, &b.u, &b.dy, &b.y, &b.h, &b.dx, &b.yref, &b.href, &b.dxref,
                       &b.ylib};
  for (size_t i = 0; i < sizeof big_bufs / sizeof *big_bufs; i++) *big_bufs[i] = xalloc(big);
  b.w = xalloc(wide), b.dw = xalloc(wide), b.dwref = xalloc(wide);
  b.dwacc = xalloc(wide), b.rstd = xalloc(ROWS_MAX * sizeof(float));
  double *t = xalloc((size_t)CONTENDERS * (size_t)rounds * sizeof(double));
  double *ratio = xalloc((size_t)rounds * sizeof(double));

  printf("bench_decode: rmsnorm %s, one thread, %d rounds of ~%.0f us batches a contender, "
         "medians; ratio = loop time / contender time (median of the rounds'); goal 0.8 below "
         "16 rows, 0.9 from 16\n",
         rmsnorm_version_string(), rounds, BATCH_S * 1e6);
#if !defined(__aarch64__)
  printf("neon: no loop on this machine (aarch64 builds time it)\n");
#endif
  int mismatches = 0;
  for (const loop_set *set = sets; set->name; set++) {
    if ((features & set->needs) != set->needs ||
        rmsnorm_context_set_isa(ctx, set->isa) != RMSNORM_OK) {
      printf("%s: not on this CPU or not in this build, skipped\n", set->name);
      continue;
    }
    for (int op = 0; op < OPS; op++) {
      tally s;
      memset(&s, 0, sizeof s);
      for (int who = 0; who < CONTENDERS; who++) s.worst[who] = INFINITY;
      print_header();
      for (int k = 0; k < 3; k++) {
        int dt = dtypes[k];
        fill(&b, dt);
        for (size_t ri = 0; ri < nrows; ri++) {
          for (size_t di = 0; di < nd; di++) {
            bcase c;
            memset(&c, 0, sizeof c);
            c.set = set, c.ctx = ctx, c.b = &b, c.op = op, c.dt = dt;
            c.rows = rows_set[ri], c.d = d_set[di];
            rmsnorm_config_init(&c.cfg, (rmsnorm_dtype)dt);
            c.cfg.param_dtype = (rmsnorm_dtype)dt;
            c.cfg.eps = EPS;
            c.has[C_LOOP] = c.has[C_LIB] = 1;
            c.has[C_SPEC] = op == OP_FWD && dt == RMSNORM_F32;
            if (op == OP_BWD) { /* r saved by a forward, as training does */
              rmsnorm_forward(ctx, &c.cfg, c.rows, c.d, b.x, c.d, b.w, NULL, b.y, c.d, b.rstd);
            } else {
              rmsnorm_status st = rmsnorm_plan_create(
                  ctx, &c.cfg, op == OP_FWD ? RMSNORM_PLAN_FORWARD : RMSNORM_PLAN_ADD_FORWARD,
                  &c.plan);
              if (st == RMSNORM_OK)
                st = rmsnorm_plan_reshape(c.plan, c.rows, c.d, c.d, op == OP_ADD ? c.d : 0, c.d);
              if (st == RMSNORM_OK)
                st = op == OP_FWD
                         ? rmsnorm_plan_setup_forward(c.plan, b.x, b.w, NULL, b.y, NULL, NULL)
                         : rmsnorm_plan_setup_add(c.plan, b.h, b.u, b.w, NULL, b.y, NULL);
              if (st == RMSNORM_OK) {
                c.has[C_PLAN] = 1;
              } else {
                printf("!!! FAILED %s %s %s %zux%zu: the plan's setup returned %s\n", set->name,
                       op_names[op], dt_name(dt), c.rows, c.d, rmsnorm_status_name(st));
                mismatches++;
              }
            }
            int spec_equal = 0;
            mismatches += verify(&c, &spec_equal);
            if (c.has[C_SPEC]) s.spec_cases++, s.spec_equal += spec_equal;
            result res;
            time_case(&c, rounds, t, ratio, &res);
            double goal = c.rows < 16 ? 0.8 : 0.9;
            print_row(&c, &res, goal);
            count(&s, &c, &res, goal);
            rmsnorm_plan_free(c.plan);
          }
        }
      }
      print_tally(set->name, op, &s);
    }
  }
  if (mismatches)
    printf("!!! %d outputs of the library disagree with the plain loops' (see above)\n",
           mismatches);
  for (size_t i = 0; i < sizeof big_bufs / sizeof *big_bufs; i++) free(*big_bufs[i]);
  free(b.w), free(b.dw), free(b.dwref), free(b.dwacc), free(b.rstd), free(t), free(ratio);
  rmsnorm_context_free(ctx);
  return mismatches ? 1 : 0;
}
