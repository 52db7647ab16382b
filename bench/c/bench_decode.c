/* bench_decode.c - decode-sized calls (1-64 rows, d 128-8192) against a
 * plain two-pass loop of the same SIMD set, where a call's fixed cost and
 * its speed in cache decide. Per kernel set the machine has, on one thread,
 * buffers warm in cache, weights of the data's dtype, each case times
 *   fwd:      the loop, rmsnorm_forward, and its plan (RMSNORM_PLAN_FORWARD);
 *             for fp32 also a loop that sums in the spec's order
 *   add+fwd:  the loop (h += u rounded to the dtype, then the norm),
 *             rmsnorm_add_forward, and its plan (RMSNORM_PLAN_ADD_FORWARD)
 *   bwd:      the loop, rmsnorm_backward (r saved by a forward, dweight
 *             summed over the rows), and its plan (RMSNORM_PLAN_BACKWARD);
 *             for fp32 also a loop that sums in the spec's order
 * in fp32, bf16 and fp16 at d 128, 576, 896, 2048, 4096, 8192, and the
 * fused ops in fp32 and bf16, with their plans but QK-norm's:
 *   qk:       the loop over the q and k heads of packed QKV tokens (a weight
 *             of head_dim each), rmsnorm_qk_norm_forward called for Q, then
 *             K; rows are tokens, d is head_dim, one head layout each:
 *             Qwen3-8B's 32 q + 8 kv heads of 128, Gemma 3 4B's 8 + 4 of 256
 *   gated:    the loop (u = x silu(z), then the norm of u) and
 *             rmsnorm_gated_forward, gate first (Mamba2's default), SiLU,
 *             one group a row (RMSNORM_PLAN_GATED_FORWARD)
 *   sandwich: the loop (h += RMSNorm(a) w_post rounded to the dtype, then
 *             RMSNorm(h) w_pre) and rmsnorm_sandwich_forward
 *             (RMSNORM_PLAN_SANDWICH_FORWARD)
 *   q8_0:     the loop (the forward's y in float, then ggml's Q8_0 blocks of
 *             32 by the operations of src/ref/blocks_ref.c) and
 *             rmsnorm_forward_quantized with RMSNORM_QF_Q8_0
 *             (RMSNORM_PLAN_FORWARD_QUANTIZED)
 * at d 128, 576, 2048, 4096 (qk: its two layouts); and an order table: the
 * fp32 forward's plain loop against the spec-order loop and the order
 * docs/numerics.md proposes for short rows (r in double, and in float), at
 * rows 1, 16, 64 x d 128, 256, 576, 1024. Every loop takes a row's
 * statistics in one pass (four fp32 FMA accumulators), then writes its
 * outputs. The loops are in bench_decode_loops.inc, compiled per set with
 * its own target attributes and run only where the CPU has the set. Before
 * timing, each case checks that the library's outputs agree with the loop's
 * (a loud line when not, and exit status 1; Q8_0's blocks as check_q8_0
 * says); then the contenders run interleaved, each round a batch of each
 * (~200 us of calls), and the table gives the medians of the per-call times
 * and of the rounds' ratios loop/lib. The goal for every decode-sized call:
 * loop/lib >= 0.8 below 16 rows, >= 0.9 from 16.
 * usage: bench_decode [rounds] [--quick]
 *   rounds: 11 by default; --quick: rows 1, 16 and d 576, 4096 only (qk:
 *   both layouts; the order table: one row of 128 and 576) */
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
/* bf16 rounded to nearest even: u + 0x7fff + (bit 16 of u), its top half;
 * rt: kept in fp32 lanes (the stores shift instead of masking: a mask the
 * compiler keeps costs the store loops an instruction) */
AVX2_FN __m256 avx2_rt_bf16(__m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i b = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd);
  return _mm256_castsi256_ps(_mm256_and_si256(b, _mm256_set1_epi32((int)0xffff0000u)));
}
AVX2_FN __m256 avx2_st_bf16(uint16_t *p, __m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i b = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
  _mm_storeu_si128((__m128i *)p,
                   _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
}
AVX2_FN __m256 avx2_rt_f16(__m256 v) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
AVX2_FN __m256 avx2_st_f16(uint16_t *p, __m256 v) {
  __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  _mm_storeu_si128((__m128i *)p, h);
  return _mm256_cvtph_ps(h);
}
AVX2_FN __m256 avx2_abs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
AVX2_FN float avx2_hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
/* 2^k from big = k + 1.5*2^23 (k in [-126, 127]): (k + 127) << 23 */
AVX2_FN __m256 avx2_pow2k(__m256 big) {
  __m256i k = _mm256_add_epi32(_mm256_castps_si256(big), _mm256_set1_epi32(127 - 0x4B400000));
  return _mm256_castsi256_ps(_mm256_slli_epi32(k, 23));
}
/* t rounded to nearest with ties away from zero (roundf), as int32 */
AVX2_FN __m256i avx2_round_away(__m256 t) {
  __m256 sign = _mm256_and_ps(t, _mm256_set1_ps(-0.0f)), a = avx2_abs(t);
  __m256 r = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  __m256 half = _mm256_cmp_ps(_mm256_sub_ps(a, r), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  r = _mm256_add_ps(r, _mm256_and_ps(half, _mm256_set1_ps(1.0f)));
  return _mm256_cvttps_epi32(_mm256_or_ps(r, sign));
}
/* 32 int8 codes from t[0..3], each rounded as roundf and saturated. The
 * packs work per 128-bit lane: the permute puts the dwords back in order. */
AVX2_FN void avx2_st_i8x32(int8_t *q, const __m256 *t) {
  __m256i ab = _mm256_packs_epi32(avx2_round_away(t[0]), avx2_round_away(t[1]));
  __m256i cd = _mm256_packs_epi32(avx2_round_away(t[2]), avx2_round_away(t[3]));
  __m256i c = _mm256_packs_epi16(ab, cd);
  c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256((__m256i *)q, c);
}
AVX2_FN uint16_t avx2_f16_bits(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
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
#define V_SUB(a, b) _mm256_sub_ps(a, b)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_DIV(a, b) _mm256_div_ps(a, b)
#define V_MIN(a, b) _mm256_min_ps(a, b)
#define V_MAX(a, b) _mm256_max_ps(a, b)
#define V_ABS(a) avx2_abs(a)
#define V_HSUM(a) avx2_hsum(a)
#define V_HMAX(a) avx2_hmax(a)
#define V_POW2K(big) avx2_pow2k(big)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_FNMA(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define V_LD_F32(p) _mm256_loadu_ps(p)
#define V_LD_BF16(p) avx2_ld_bf16(p)
#define V_LD_F16(p) avx2_ld_f16(p)
#define V_ST_F32(p, v) avx2_st_f32(p, v)
#define V_ST_BF16(p, v) avx2_st_bf16(p, v)
#define V_ST_F16(p, v) avx2_st_f16(p, v)
#define V_RT_BF16(v) avx2_rt_bf16(v)
#define V_RT_F16(v) avx2_rt_f16(v)
#define V_ST_I8X32(q, t) avx2_st_i8x32(q, t)
#define F16_BITS(f) avx2_f16_bits(f)
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
AVX512_FN __m512 avx512_rt_bf16(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i b = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd);
  return _mm512_castsi512_ps(_mm512_and_si512(b, _mm512_set1_epi32((int)0xffff0000u)));
}
AVX512_FN __m512 avx512_st_bf16(uint16_t *p, __m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i b = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
  _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(b));
  return _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
}
AVX512_FN __m512 avx512_rt_f16(__m512 v) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
AVX512_FN __m512 avx512_st_f16(uint16_t *p, __m512 v) {
  __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  _mm256_storeu_si256((__m256i *)p, h);
  return _mm512_cvtph_ps(h);
}
AVX512_FN __m512 avx512_pow2k(__m512 big) {
  __m512i k = _mm512_add_epi32(_mm512_castps_si512(big), _mm512_set1_epi32(127 - 0x4B400000));
  return _mm512_castsi512_ps(_mm512_slli_epi32(k, 23));
}
AVX512_FN __m512i avx512_round_away(__m512 t) {
  __m512i sign = _mm512_and_si512(_mm512_castps_si512(t), _mm512_set1_epi32((int)0x80000000u));
  __m512 a = _mm512_abs_ps(t), r = _mm512_roundscale_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  __mmask16 half = _mm512_cmp_ps_mask(_mm512_sub_ps(a, r), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  r = _mm512_mask_add_ps(r, half, r, _mm512_set1_ps(1.0f));
  return _mm512_cvttps_epi32(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign)));
}
AVX512_FN void avx512_st_i8x32(int8_t *q, const __m512 *t) {
  _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(avx512_round_away(t[0])));
  _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(avx512_round_away(t[1])));
}
AVX512_FN uint16_t avx512_f16_bits(float f) {
  return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
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
#define V_SUB(a, b) _mm512_sub_ps(a, b)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_DIV(a, b) _mm512_div_ps(a, b)
#define V_MIN(a, b) _mm512_min_ps(a, b)
#define V_MAX(a, b) _mm512_max_ps(a, b)
#define V_ABS(a) _mm512_abs_ps(a)
#define V_HSUM(a) _mm512_reduce_add_ps(a)
#define V_HMAX(a) _mm512_reduce_max_ps(a)
#define V_POW2K(big) avx512_pow2k(big)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_FNMA(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define V_LD_F32(p) _mm512_loadu_ps(p)
#define V_LD_BF16(p) avx512_ld_bf16(p)
#define V_LD_F16(p) avx512_ld_f16(p)
#define V_ST_F32(p, v) avx512_st_f32(p, v)
#define V_ST_BF16(p, v) avx512_st_bf16(p, v)
#define V_ST_F16(p, v) avx512_st_f16(p, v)
#define V_RT_BF16(v) avx512_rt_bf16(v)
#define V_RT_F16(v) avx512_rt_f16(v)
#define V_ST_I8X32(q, t) avx512_st_i8x32(q, t)
#define F16_BITS(f) avx512_f16_bits(f)
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
NEON_FN float32x4_t neon_rt_bf16(float32x4_t v) {
  uint32x4_t u = vreinterpretq_u32_f32(v);
  uint32x4_t odd = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
  u = vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), odd);
  return vreinterpretq_f32_u32(vandq_u32(u, vdupq_n_u32(0xffff0000u)));
}
NEON_FN float32x4_t neon_st_bf16(uint16_t *p, float32x4_t v) {
  uint32x4_t u = vreinterpretq_u32_f32(v);
  uint32x4_t odd = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
  u = vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), odd);
  vst1_u16(p, vshrn_n_u32(u, 16));
  return vreinterpretq_f32_u32(vandq_u32(u, vdupq_n_u32(0xffff0000u)));
}
NEON_FN float32x4_t neon_rt_f16(float32x4_t v) { return vcvt_f32_f16(vcvt_f16_f32(v)); }
NEON_FN float32x4_t neon_st_f16(uint16_t *p, float32x4_t v) {
  float16x4_t h = vcvt_f16_f32(v);
  vst1_u16(p, vreinterpret_u16_f16(h));
  return vcvt_f32_f16(h);
}
NEON_FN float32x4_t neon_pow2k(float32x4_t big) {
  int32x4_t k = vaddq_s32(vreinterpretq_s32_f32(big), vdupq_n_s32(127 - 0x4B400000));
  return vreinterpretq_f32_s32(vshlq_n_s32(k, 23));
}
/* vcvtaq rounds to nearest with ties away from zero, as roundf */
NEON_FN void neon_st_i8x32(int8_t *q, const float32x4_t *t) {
  for (int k = 0; k < 4; k++) {
    int16x8_t h = vcombine_s16(vqmovn_s32(vcvtaq_s32_f32(t[2 * k])),
                               vqmovn_s32(vcvtaq_s32_f32(t[2 * k + 1])));
    vst1_s8(q + 8 * k, vqmovn_s16(h));
  }
}
NEON_FN uint16_t neon_f16_bits(float f) {
  return vget_lane_u16(vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(f))), 0);
}
#define V float32x4_t
#define V_W 4
#define VD float64x2_t
#define VD_W 2
#define V_ZERO() vdupq_n_f32(0.0f)
#define V_SET1(f) vdupq_n_f32(f)
#define V_ADD(a, b) vaddq_f32(a, b)
#define V_SUB(a, b) vsubq_f32(a, b)
#define V_MUL(a, b) vmulq_f32(a, b)
#define V_DIV(a, b) vdivq_f32(a, b)
#define V_MIN(a, b) vminq_f32(a, b)
#define V_MAX(a, b) vmaxq_f32(a, b)
#define V_ABS(a) vabsq_f32(a)
#define V_HSUM(a) vaddvq_f32(a)
#define V_HMAX(a) vmaxvq_f32(a)
#define V_POW2K(big) neon_pow2k(big)
#define V_FMA(a, b, c) vfmaq_f32(c, a, b)
#define V_FNMA(a, b, c) vfmsq_f32(c, a, b)
#define V_LD_F32(p) vld1q_f32(p)
#define V_LD_BF16(p) neon_ld_bf16(p)
#define V_LD_F16(p) neon_ld_f16(p)
#define V_ST_F32(p, v) neon_st_f32(p, v)
#define V_ST_BF16(p, v) neon_st_bf16(p, v)
#define V_ST_F16(p, v) neon_st_f16(p, v)
#define V_RT_BF16(v) neon_rt_bf16(v)
#define V_RT_F16(v) neon_rt_f16(v)
#define V_ST_I8X32(q, t) neon_st_i8x32(q, t)
#define F16_BITS(f) neon_f16_bits(f)
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
  void (*forward_prop_f32)(size_t rows, size_t d, const float *x, const float *w, float *y,
                           double eps, int r_float);
  void (*backward_spec_f32)(size_t rows, size_t d, const float *x, const float *dy,
                            const float *w, const float *rstd, float *dx, float *dw,
                            float *dwacc);
  void (*qk_forward)(int dt, size_t tokens, size_t qh, size_t kvh, size_t hd, const void *qkv,
                     const void *wq, const void *wk, void *y, float eps);
  void (*gated_forward)(int dt, size_t rows, size_t d, const void *x, const void *z,
                        const void *w, void *y, float *u, float eps);
  void (*sandwich_forward)(int dt, size_t rows, size_t d, const void *a, void *h,
                           const void *wpost, const void *wpre, void *xn, float eps);
  void (*q8_0_forward)(int dt, size_t rows, size_t d, const void *x, const void *w, void *codes,
                       float eps);
} loop_set;

/* A set's loops in loop_set's order. */
#define LOOPS(s)                                                                   \
  forward_##s, add_forward_##s, backward_##s, forward_spec_f32_##s, forward_prop_f32_##s, \
      backward_spec_f32_##s, qk_forward_##s, gated_forward_##s, sandwich_forward_##s,    \
      q8_0_forward_##s

static const loop_set sets[] = {
#if BENCH_X86
    {"avx2", RMSNORM_ISA_AVX2, RMSNORM_CPU_AVX2 | RMSNORM_CPU_FMA | RMSNORM_CPU_F16C,
     LOOPS(avx2)},
    {"avx512", RMSNORM_ISA_AVX512,
     RMSNORM_CPU_AVX512F | RMSNORM_CPU_AVX512BW | RMSNORM_CPU_AVX512VL | RMSNORM_CPU_FMA |
         RMSNORM_CPU_F16C,
     LOOPS(avx512)},
#endif
#if defined(__aarch64__)
    {"neon", RMSNORM_ISA_NEON, RMSNORM_CPU_NEON, LOOPS(neon)},
#endif
    {NULL, RMSNORM_ISA_AUTO, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL}};

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
 * its first rows x d, rows contiguous; QK-norm its tokens x (qh + 2 kvh) x
 * hd, Q8_0 its rows x d/32 blocks of 34 bytes); w, w2, dw: D_MAX. The loop's
 * outputs go to the *ref buffers when a case checks them, the library's to
 * y, h, dx, dw; while timing, every contender writes y, h, dx, dw. Ops with
 * two weights take w and w2: QK-norm q and k, the sandwich post and pre. */
typedef struct buffers {
  void *x, *h0, *u, *dy, *z, *w, *w2;       /* inputs, of the case's dtype */
  void *y, *h, *dx, *dw;                    /* outputs (h: in and out) */
  void *yref, *href, *dxref, *dwref, *ylib; /* the loop's outputs; the library's y */
  void *dwlib;                              /* the library's dweight */
  float *dwacc, *rstd;                      /* the loop's fp32 dweight; r a row */
  float *urow;                              /* the gated loop's u, a row */
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
  for (size_t j = 0; j < D_MAX; j++) store_dt(dt, b->w2, j, 1.0f + 0.5f * signed_in(0.0f, 1.0f));
  for (size_t i = 0; i < (size_t)ROWS_MAX * D_MAX; i++) /* gates on both sides of 0 */
    store_dt(dt, b->z, i, signed_in(0.0f, 4.0f));
}

/* ---- one case ------------------------------------------------------------ */

enum { OP_FWD, OP_ADD, OP_BWD, OP_QK, OP_GATED, OP_SANDWICH, OP_Q8_0, OPS };
static const char *const op_names[OPS] = {"fwd", "add+fwd", "bwd", "qk", "gated", "sandwich",
                                          "q8_0"};
/* C_PROP, C_PROP_RF: the fp32 forward in the order docs/numerics.md
 * proposes for short rows, r in double and in float (the order table) */
enum { C_LOOP, C_SPEC, C_LIB, C_PLAN, C_PROP, C_PROP_RF, CONTENDERS };

/* QK-norm's head layouts: rows are tokens, d is head_dim (one layout per
 * head_dim); a case is the library's two calls, Q then K, against one loop
 * over both. */
typedef struct qk_layout {
  const char *model;
  size_t qh, kvh, hd;
} qk_layout;
static const qk_layout qk_layouts[] = {{"Qwen3-8B", 32, 8, 128}, {"Gemma 3 4B", 8, 4, 256}};
#define QK_LAYOUTS (sizeof qk_layouts / sizeof *qk_layouts)

typedef struct bcase {
  const loop_set *set;
  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  rmsnorm_plan *plan; /* NULL for QK-norm */
  rmsnorm_gate gate;   /* the gated op's: SiLU, gate first, one group a row */
  rmsnorm_quant quant; /* Q8_0's */
  buffers *b;
  int op, dt;
  size_t rows, d;
  const qk_layout *qk; /* QK-norm's heads (d = qk->hd) */
  int has[CONTENDERS];
} bcase;

/* Elements of a QK-norm token, all heads of q, k and v. */
static size_t qk_width(const bcase *c) { return (c->qk->qh + 2 * c->qk->kvh) * c->qk->hd; }
/* Bytes of a Q8_0 row. */
static size_t q8_0_row(size_t d) { return d / 32 * 34; }

/* Bytes of the case's y (dx for the backward). */
static size_t out_bytes(const bcase *c) {
  if (c->op == OP_Q8_0) return c->rows * q8_0_row(c->d);
  return c->rows * (c->op == OP_QK ? qk_width(c) : c->d) * dt_size(c->dt);
}

/* One call of a contender. @return its status (the loops': RMSNORM_OK). */
static rmsnorm_status run(const bcase *c, int who) {
  const buffers *b = c->b;
  size_t rows = c->rows, d = c->d;
  int dt = c->dt, loop = who == C_LOOP;
  if (who == C_PLAN) return rmsnorm_plan_run(c->plan);
  if (who == C_PROP || who == C_PROP_RF) {
    c->set->forward_prop_f32(rows, d, b->x, b->w, b->y, EPS, who == C_PROP_RF);
    return RMSNORM_OK;
  }
  if (who == C_SPEC && c->op == OP_BWD) {
    c->set->backward_spec_f32(rows, d, b->x, b->dy, b->w, b->rstd, b->dx, b->dw, b->dwacc);
    return RMSNORM_OK;
  }
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
  } else if (c->op == OP_BWD) {
    if (!loop)
      return rmsnorm_backward(c->ctx, &c->cfg, rows, d, b->x, d, b->dy, d, b->w, b->rstd, b->dx, d,
                              b->dw, NULL);
    c->set->backward(dt, rows, d, b->x, b->dy, b->w, b->rstd, b->dx, b->dw, b->dwacc);
  } else if (c->op == OP_QK) {
    size_t qh = c->qk->qh, kvh = c->qk->kvh, ld = qk_width(c), k0 = qh * d * dt_size(dt);
    if (loop) {
      c->set->qk_forward(dt, rows, qh, kvh, d, b->x, b->w, b->w2, b->y, (float)EPS);
      return RMSNORM_OK;
    }
    rmsnorm_status st = rmsnorm_qk_norm_forward(c->ctx, &c->cfg, rows, qh, d, b->x, ld, d, b->w,
                                                NULL, b->y, ld, d, NULL);
    if (st != RMSNORM_OK) return st;
    return rmsnorm_qk_norm_forward(c->ctx, &c->cfg, rows, kvh, d, (const char *)b->x + k0, ld, d,
                                   b->w2, NULL, (char *)b->y + k0, ld, d, NULL);
  } else if (c->op == OP_GATED) {
    if (!loop)
      return rmsnorm_gated_forward(c->ctx, &c->cfg, &c->gate, rows, d, b->x, d, b->z, d, b->w,
                                   b->y, d, NULL);
    c->set->gated_forward(dt, rows, d, b->x, b->z, b->w, b->y, b->urow, (float)EPS);
  } else if (c->op == OP_SANDWICH) {
    if (!loop)
      return rmsnorm_sandwich_forward(c->ctx, &c->cfg, rows, d, b->x, d, b->h, d, b->w, b->w2,
                                      b->y, d, NULL, NULL);
    c->set->sandwich_forward(dt, rows, d, b->x, b->h, b->w, b->w2, b->y, (float)EPS);
  } else {
    if (!loop)
      return rmsnorm_forward_quantized(c->ctx, &c->cfg, rows, d, b->x, d, b->w, NULL, &c->quant,
                                       b->y, q8_0_row(d), NULL, 0, NULL);
    c->set->q8_0_forward(dt, rows, d, b->x, b->w, b->y, (float)EPS);
  }
  return RMSNORM_OK;
}

/* The case's plan (every op but QK-norm), made and set up on its buffers. */
static rmsnorm_status make_plan(bcase *c) {
  static const rmsnorm_plan_op plan_ops[] = {
      [OP_FWD] = RMSNORM_PLAN_FORWARD,           [OP_ADD] = RMSNORM_PLAN_ADD_FORWARD,
      [OP_BWD] = RMSNORM_PLAN_BACKWARD,          [OP_GATED] = RMSNORM_PLAN_GATED_FORWARD,
      [OP_SANDWICH] = RMSNORM_PLAN_SANDWICH_FORWARD, [OP_Q8_0] = RMSNORM_PLAN_FORWARD_QUANTIZED};
  const buffers *b = c->b;
  size_t rows = c->rows, d = c->d;
  int second = c->op != OP_FWD && c->op != OP_Q8_0;
  rmsnorm_status st = rmsnorm_plan_create(c->ctx, &c->cfg, plan_ops[c->op], &c->plan);
  if (st == RMSNORM_OK)
    st = rmsnorm_plan_reshape(c->plan, rows, d, d, second ? d : 0, c->op == OP_Q8_0 ? 0 : d);
  if (st != RMSNORM_OK) return st;
  switch (c->op) {
  case OP_FWD: return rmsnorm_plan_setup_forward(c->plan, b->x, b->w, NULL, b->y, NULL, NULL);
  case OP_ADD: return rmsnorm_plan_setup_add(c->plan, b->h, b->u, b->w, NULL, b->y, NULL);
  case OP_BWD:
    return rmsnorm_plan_setup_backward(c->plan, b->x, b->dy, b->w, NULL, b->rstd, b->dx, b->dw,
                                       NULL);
  case OP_GATED:
    return rmsnorm_plan_setup_gated(c->plan, &c->gate, b->x, b->z, b->w, b->y, NULL);
  case OP_SANDWICH:
    return rmsnorm_plan_setup_sandwich(c->plan, b->x, b->h, b->w, b->w2, b->y, NULL, NULL);
  default:
    return rmsnorm_plan_setup_quantized(c->plan, b->x, b->w, NULL, &c->quant, b->y, q8_0_row(d),
                                        NULL, 0, NULL);
  }
}

/* Before each batch: h back to its start (the add and the sandwich feed on
 * it). */
static void reset(const bcase *c) {
  if (c->op == OP_ADD || c->op == OP_SANDWICH)
    memcpy(c->b->h, c->b->h0, c->rows * c->d * dt_size(c->dt));
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

/* Q8_0 blocks against the loop's. The loop sums its squares in another
 * order than the library, so y can differ in its last bits: amax / 127 can
 * round to a neighbouring fp16 d, and a code whose y_j / d lies within a
 * few ulps of a half can land one step away (id = 1/d comes from the float
 * d, so a d one fp16 ulp apart moves no code by itself). So blocks agree
 * when their bytes are equal, or when their d are at most one fp16 ulp
 * apart (the same sign) and the codes differ by at most one in at most 1%
 * of them (and one more): the dequantized values then agree within one code
 * step, and a loop that scales, truncates or rounds otherwise than the spec
 * is caught (ties, half to even against away from zero, are too rare in
 * this data to tell). @return 1 when they do not agree; *same: whether the
 * bytes are equal. */
static int check_q8_0(const bcase *c, const char *who, int *same) {
  const uint8_t *got = c->b->y, *want = c->b->yref;
  size_t blocks = c->rows * (c->d / 32), worst_d = 0, worst_q = 0, moved = 0;
  *same = !memcmp(got, want, blocks * 34);
  if (*same) return 0;
  for (size_t k = 0; k < blocks; k++, got += 34, want += 34) {
    int dg = got[0] | got[1] << 8, dw = want[0] | want[1] << 8;
    size_t e = (size_t)abs(dg - dw);
    if (e > worst_d) worst_d = e; /* fp16 ulps; opposite signs: >= 2^15 */
    for (int j = 2; j < 34; j++) {
      e = (size_t)abs((int8_t)got[j] - (int8_t)want[j]);
      if (e > worst_q) worst_q = e;
      moved += e != 0;
    }
  }
  size_t codes = blocks * 32, allowed = codes / 100 + 1;
  if (worst_d <= 1 && worst_q <= 1 && moved <= allowed) return 0;
  printf("!!! MISMATCH %s %s %s %zux%zu: the %s's blocks differ from the loop's by %zu fp16 "
         "ulps in d and up to %zu in %zu of %zu codes (tolerance: 1 ulp, 1 in at most %zu codes)\n",
         c->set->name, op_names[c->op], dt_name(c->dt), c->rows, c->d, who, worst_d, worst_q,
         moved, codes, allowed);
  return 1;
}

/* Runs a library contender from fresh outputs and compares it with the
 * loop's; *same: whether Q8_0's bytes are equal. @return the mismatches (a
 * failed call counts as one). */
static int verify_one(const bcase *c, int who, int *same) {
  buffers *b = c->b;
  size_t n = c->rows * c->d, bytes = out_bytes(c), wbytes = c->d * dt_size(c->dt);
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
  if (c->op == OP_Q8_0) return check_q8_0(c, name, same);
  /* QK-norm: the whole tokens, v's heads zero on both sides */
  int bad = check(c, name, "y", b->y, b->yref, bytes / dt_size(c->dt));
  if (c->op == OP_ADD || c->op == OP_SANDWICH) bad += check(c, name, "h", b->h, b->href, n);
  return bad;
}

/* The loop's outputs, then the library's and the plan's against them; for
 * the fp32 forward and backward, whether the spec-order loop gives the library's bits
 * (*equal), for Q8_0 whether the loop gives the library's bytes.
 * @return the mismatches. */
static int verify(const bcase *c, int *equal) {
  buffers *b = c->b;
  size_t bytes = out_bytes(c), hbytes = c->rows * c->d * dt_size(c->dt);
  size_t wbytes = c->d * dt_size(c->dt);
  reset(c);
  memset(b->y, 0, bytes);
  run(c, C_LOOP);
  memcpy(b->yref, b->y, bytes), memcpy(b->href, b->h, hbytes);
  memcpy(b->dxref, b->dx, bytes), memcpy(b->dwref, b->dw, wbytes);
  int bad = verify_one(c, C_LIB, equal);
  if (c->has[C_SPEC] && c->op == OP_BWD) { /* the library's dx and dweight */
    memcpy(b->ylib, b->dx, bytes), memcpy(b->dwlib, b->dw, wbytes);
    run(c, C_SPEC);
    *equal = !memcmp(b->dx, b->ylib, bytes) && !memcmp(b->dw, b->dwlib, wbytes);
  } else if (c->has[C_SPEC]) {
    memcpy(b->ylib, b->y, bytes);
    run(c, C_SPEC);
    *equal = !memcmp(b->y, b->ylib, bytes);
  }
  if (c->has[C_PLAN]) bad += verify_one(c, C_PLAN, equal);
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
  printf("%-6s %-8s %-5s %4s %5s %9s %9s %9s %9s %8s %9s %9s %4s  %s\n", "set", "op", "dtype",
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
  printf("%-6s %-8s %-5s %4zu %5zu", c->set->name, op_names[c->op], dt_name(c->dt), c->rows,
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
  int bytes_equal; /* Q8_0: cases where the loop gives the library's bytes */
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
  if (op != OP_QK)
    printf("; plan %d of %d, worst %.2f (%s)", s->met[C_PLAN], s->cases, s->worst[C_PLAN],
           s->where[C_PLAN]);
  printf("\n");
  if (s->spec_cases)
    printf("%s %s f32: the spec-order loop gives the library's bits in %d of %d cases; "
           "%d lib misses within 10%% of its time (order)\n",
           set, op_names[op], s->spec_equal, s->spec_cases, s->order_bound);
  if (op == OP_Q8_0)
    printf("%s %s: the loop gives the library's bytes in %d of %d cases (the others: d within "
           "an fp16 ulp, a few codes within one)\n",
           set, op_names[op], s->bytes_equal, s->cases);
}

/* ---- main ------------------------------------------------------------------ */

/* The order table: the fp32 forward's plain loop, the spec-order loop and the
 * proposed order's two loops (docs/numerics.md, "A faster order for short
 * rows") on short rows, their outputs checked against the plain loop's to
 * 1e-5. @return the mismatches. */
static int order_table(const loop_set *set, rmsnorm_context *ctx, buffers *b, int rounds,
                       int quick, double *t, double *ratio) {
  static const size_t rows_all[] = {1, 16, 64}, ds_all[] = {128, 256, 576, 1024};
  static const size_t ds_quick[] = {128, 576};
  size_t nrows = quick ? 1 : 3, nd = quick ? 2 : 4;
  const size_t *ds = quick ? ds_quick : ds_all;
  int bad = 0;
  fill(b, RMSNORM_F32);
  printf("%-6s %-8s %4s %5s %9s %9s %9s %9s %9s %9s %9s\n", "set", "order", "rows", "d",
         "loop ns", "spec ns", "prop ns", "prop-rf", "loop/spec", "loop/prop", "loop/p-rf");
  for (size_t ri = 0; ri < nrows; ri++)
    for (size_t di = 0; di < nd; di++) {
      bcase c;
      memset(&c, 0, sizeof c);
      c.set = set, c.ctx = ctx, c.b = b, c.op = OP_FWD, c.dt = RMSNORM_F32;
      c.rows = rows_all[ri], c.d = ds[di];
      rmsnorm_config_init(&c.cfg, RMSNORM_F32);
      c.has[C_LOOP] = c.has[C_SPEC] = c.has[C_PROP] = c.has[C_PROP_RF] = 1;
      size_t n = c.rows * c.d;
      run(&c, C_LOOP);
      memcpy(b->yref, b->y, n * sizeof(float));
      for (int who = C_PROP; who <= C_PROP_RF; who++) {
        memset(b->y, 0, n * sizeof(float));
        run(&c, who);
        bad += check(&c, who == C_PROP ? "proposed order" : "proposed order, r in float", "y",
                     b->y, b->yref, n);
      }
      result res;
      time_case(&c, rounds, t, ratio, &res);
      printf("%-6s %-8s %4zu %5zu %9.1f %9.1f %9.1f %9.1f %9.2f %9.2f %9.2f\n", set->name,
             "fwd f32", c.rows, c.d, res.ns[C_LOOP], res.ns[C_SPEC], res.ns[C_PROP],
             res.ns[C_PROP_RF], res.ratio[C_SPEC], res.ratio[C_PROP], res.ratio[C_PROP_RF]);
    }
  return bad;
}

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
  /* fwd, add+fwd, bwd: every d in three dtypes; the fused ops: fewer d in
   * fp32 and bf16 (QK-norm: its layouts' head_dim) */
  static const size_t rows_all[] = {1, 4, 16, 64}, d_all[] = {128, 576, 896, 2048, 4096, 8192};
  static const size_t d_fused[] = {128, 576, 2048, 4096};
  static const size_t rows_quick[] = {1, 16}, d_quick[] = {576, 4096};
  static const int dtypes[] = {RMSNORM_F32, RMSNORM_BF16, RMSNORM_F16};
  const size_t *rows_set = quick ? rows_quick : rows_all;
  size_t nrows = quick ? 2 : 4;

  rmsnorm_context *ctx;
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) return 2;
  rmsnorm_context_set_threads(ctx, 1);
  unsigned features = 0;
  rmsnorm_cpu_features(&features);
  setvbuf(stdout, NULL, _IOLBF, 0);

  buffers b;
  size_t big = (size_t)ROWS_MAX * D_MAX * 4, wide = (size_t)D_MAX * 4;
  void **big_bufs[] = {&b.x,  &b.h0,   &b.u,    &b.dy,    &b.z,   &b.y,
                       &b.h,  &b.dx,   &b.yref, &b.href,  &b.dxref, &b.ylib};
  for (size_t i = 0; i < sizeof big_bufs / sizeof *big_bufs; i++) *big_bufs[i] = xalloc(big);
  b.w = xalloc(wide), b.w2 = xalloc(wide), b.dw = xalloc(wide), b.dwref = xalloc(wide);
  b.dwacc = xalloc(wide), b.urow = xalloc(wide), b.rstd = xalloc(ROWS_MAX * sizeof(float));
  b.dwlib = xalloc(wide);
  double *t = xalloc((size_t)CONTENDERS * (size_t)rounds * sizeof(double));
  double *ratio = xalloc((size_t)rounds * sizeof(double));

  printf("bench_decode: rmsnorm %s, one thread, %d rounds of ~%.0f us batches a contender, "
         "medians; ratio = loop time / contender time (median of the rounds'); goal 0.8 below "
         "16 rows, 0.9 from 16\n",
         rmsnorm_version_string(), rounds, BATCH_S * 1e6);
#if !defined(__aarch64__)
  printf("neon: no loop on this machine (aarch64 builds time it)\n");
#endif
  printf("qk: rows = tokens, d = head_dim;");
  for (size_t l = 0; l < QK_LAYOUTS; l++)
    printf("%s d %zu: %zu q + %zu kv heads (%s)", l ? "," : "", qk_layouts[l].hd,
           qk_layouts[l].qh, qk_layouts[l].kvh, qk_layouts[l].model);
  printf("; the library's Q and K calls against one loop\n"
         "gated: gate first, SiLU, one group a row; sandwich: Gemma's post norm, add, pre norm; "
         "q8_0: blocks compared as bytes, else d within an fp16 ulp and a few codes within one\n");
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
      int fused = op > OP_BWD, ndt = fused ? 2 : 3;
      size_t d_qk[QK_LAYOUTS];
      for (size_t l = 0; l < QK_LAYOUTS; l++) d_qk[l] = qk_layouts[l].hd;
      const size_t *d_set = op == OP_QK ? d_qk : quick ? d_quick : fused ? d_fused : d_all;
      size_t nd = op == OP_QK ? QK_LAYOUTS : quick ? 2 : fused ? 4 : 6;
      print_header();
      for (int k = 0; k < ndt; k++) {
        int dt = dtypes[k];
        fill(&b, dt);
        for (size_t ri = 0; ri < nrows; ri++) {
          for (size_t di = 0; di < nd; di++) {
            bcase c;
            memset(&c, 0, sizeof c);
            c.set = set, c.ctx = ctx, c.b = &b, c.op = op, c.dt = dt;
            c.rows = rows_set[ri], c.d = d_set[di];
            if (op == OP_QK) c.qk = &qk_layouts[di];
            rmsnorm_config_init(&c.cfg, (rmsnorm_dtype)dt);
            c.cfg.param_dtype = (rmsnorm_dtype)dt;
            c.cfg.eps = EPS;
            rmsnorm_gate_init(&c.gate, RMSNORM_GATE_SILU);
            rmsnorm_quant_init(&c.quant, RMSNORM_QF_Q8_0);
            c.has[C_LOOP] = c.has[C_LIB] = 1;
            c.has[C_SPEC] = (op == OP_FWD || op == OP_BWD) && dt == RMSNORM_F32;
            if (op == OP_BWD) /* r saved by a forward, as training does */
              rmsnorm_forward(ctx, &c.cfg, c.rows, c.d, b.x, c.d, b.w, NULL, b.y, c.d, b.rstd);
            if (op != OP_QK) {
              rmsnorm_status st = make_plan(&c);
              if (st == RMSNORM_OK) {
                c.has[C_PLAN] = 1;
              } else {
                printf("!!! FAILED %s %s %s %zux%zu: the plan's setup returned %s\n", set->name,
                       op_names[op], dt_name(dt), c.rows, c.d, rmsnorm_status_name(st));
                mismatches++;
              }
            }
            int equal = 0;
            mismatches += verify(&c, &equal);
            if (c.has[C_SPEC]) s.spec_cases++, s.spec_equal += equal;
            if (op == OP_Q8_0) s.bytes_equal += equal;
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
    mismatches += order_table(set, ctx, &b, rounds, quick, t, ratio);
  }
  if (mismatches)
    printf("!!! %d outputs of the library disagree with the plain loops' (see above)\n",
           mismatches);
  for (size_t i = 0; i < sizeof big_bufs / sizeof *big_bufs; i++) free(*big_bufs[i]);
  free(b.w), free(b.w2), free(b.dw), free(b.dwref), free(b.dwacc), free(b.urow), free(b.rstd);
  free(b.dwlib);
  free(t), free(ratio);
  rmsnorm_context_free(ctx);
  return mismatches ? 1 : 0;
}
