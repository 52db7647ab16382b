/* simd_neon.h - the vector vocabulary of the shared SIMD bodies
 * (instantiate.inc) for AArch64 Advanced SIMD (NEON): 4 floats or 2 doubles a
 * vector. Everything here is in the base ARMv8-A instruction set: FMLA/FMLS
 * are fused like x86's FMA, fp16 <-> fp32 is FCVTN/FCVTL (round to nearest
 * even, quiet NaNs kept, with the default FPCR that Linux gives a thread),
 * bf16 is rounded with integer ops as on x86. Tails go through a small zero-
 * filled buffer. */
#ifndef RMSNORM_SIMD_NEON_H
#define RMSNORM_SIMD_NEON_H

#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/tail_buffer.h"

#define VF_W 4
#define VD_W 2
/* store_simd.inc's element-wise loops (RN_SPAN_LOOP), 4 vectors a pass */
#if defined(__clang__)
#define RN_SPAN_UNROLL _Pragma("unroll 4")
#else
#define RN_SPAN_UNROLL _Pragma("GCC unroll 4")
#endif

typedef float32x4_t vf;
typedef float64x2_t vd;

/* The arithmetic of a compute type's vector V of scalars S, by the suffix of
 * its intrinsics (f32, f64): V_zero, V_set1, V_add, V_sub, V_mul, V_fma
 * (a * b + c, FMLA) and V_fnma (c - a * b, FMLS), the last two rounded once. */
#define V_ARITH(V, S, sfx)                                                         \
  static inline V V##_zero(void) { return vdupq_n_##sfx((S)0); }                   \
  static inline V V##_set1(S a) { return vdupq_n_##sfx(a); }                       \
  static inline V V##_add(V a, V b) { return vaddq_##sfx(a, b); }                  \
  static inline V V##_sub(V a, V b) { return vsubq_##sfx(a, b); }                  \
  static inline V V##_mul(V a, V b) { return vmulq_##sfx(a, b); }                  \
  static inline V V##_fma(V a, V b, V c) { return vfmaq_##sfx(c, a, b); }          \
  static inline V V##_fnma(V a, V b, V c) { return vfmsq_##sfx(c, a, b); }

/* ---- float compute ---- */
V_ARITH(vf, float, f32)
static inline uint32x4_t lanes_below_f(size_t n) {
  static const uint32_t iota[4] = {0, 1, 2, 3};
  return vcltq_u32(vld1q_u32(iota), vdupq_n_u32((uint32_t)n));
}
static inline vf vf_zero_from(vf v, size_t n) {
  return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), lanes_below_f(n)));
}

/* the two halves of a float vector, widened to double (exact) */
static inline vd vf_cvt_lo(vf v) { return vcvt_f64_f32(vget_low_f32(v)); }
static inline vd vf_cvt_hi(vf v) { return vcvt_high_f64_f32(v); }

static inline vf vf_load_f32(const float *p) { return vld1q_f32(p); }
static inline void vf_store_f32(float *p, vf v) { vst1q_f32(p, v); }
V_BUFFERED_TAILS(vf, f32, float, VF_W)
/* AArch64 has no non-temporal store of one vector register through the
 * intrinsics (STNP stores pairs): "streaming" stores are plain stores. */
static inline void vf_stream_f32(float *p, vf v) { vst1q_f32(p, v); }

/* A 16-bit storage type's accessors, from its widening to and narrowing from
 * a float vector: load, load of the first n, store, store of the first n,
 * "streaming" store (a plain one, as vf_stream_f32), and the round trip (the
 * value the stored bits hold). */
#define VF_HALF_ACCESSORS(T, widen, narrow)                                        \
  static inline vf vf_load_##T(const uint16_t *p) { return widen(vld1_u16(p)); }  \
  static inline void vf_store_##T(uint16_t *p, vf v) { vst1_u16(p, narrow(v)); }  \
  V_BUFFERED_TAILS(vf, T, uint16_t, VF_W)                                          \
  static inline void vf_stream_##T(uint16_t *p, vf v) { vf_store_##T(p, v); }      \
  static inline vf vf_round_##T(vf v) { return widen(narrow(v)); }

static inline uint16x4_t f32_to_f16(vf v) { return vreinterpret_u16_f16(vcvt_f16_f32(v)); }
static inline vf f16_widen(uint16x4_t h) { return vcvt_f32_f16(vreinterpret_f16_u16(h)); }
VF_HALF_ACCESSORS(f16, f16_widen, f32_to_f16)

static inline vf bf16_widen(uint16x4_t h) { return vreinterpretq_f32_u32(vshll_n_u16(h, 16)); }
/* round to nearest even on the dropped 16 bits; NaN keeps its top bits, made quiet */
static inline uint16x4_t f32_to_bf16(vf v) {
  uint32x4_t u = vreinterpretq_u32_f32(v);
  uint32x4_t hi = vshrq_n_u32(u, 16);
  uint32x4_t lsb = vandq_u32(hi, vdupq_n_u32(1));
  uint32x4_t r = vshrq_n_u32(vaddq_u32(u, vaddq_u32(lsb, vdupq_n_u32(0x7fff))), 16);
  uint32x4_t q = vorrq_u32(hi, vdupq_n_u32(0x40));
  uint32x4_t ordered = vceqq_f32(v, v); /* all ones unless NaN */
  return vmovn_u32(vbslq_u32(ordered, r, q));
}
VF_HALF_ACCESSORS(bf16, bf16_widen, f32_to_bf16)

/* ---- double compute ---- */
V_ARITH(vd, double, f64)
static inline vd vd_zero_from(vd v, size_t n) {
  static const uint64_t iota[2] = {0, 1};
  uint64x2_t keep = vcltq_u64(vld1q_u64(iota), vdupq_n_u64((uint64_t)n));
  return vreinterpretq_f64_u64(vandq_u64(vreinterpretq_u64_f64(v), keep));
}
/* lanes halved within one vector: lane 0 += lane 1 */
static inline double vd_halve(vd v) { return vgetq_lane_f64(v, 0) + vgetq_lane_f64(v, 1); }
/* vd_halve of VD_W rows at once: lane i of the result is vd_halve(v[i]) */
static inline vd vd_halve_rows(const vd *v) { return vpaddq_f64(v[0], v[1]); }
static inline vd vd_div(vd a, vd b) { return vdivq_f64(a, b); }
static inline vd vd_sqrt(vd a) { return vsqrtq_f64(a); }
/* the lanes of v where c > 0, zero elsewhere */
static inline vd vd_where_pos(vd c, vd v) {
  return vreinterpretq_f64_u64(vandq_u64(vreinterpretq_u64_f64(v), vcgtq_f64(c, vdupq_n_f64(0))));
}
static inline vd vd_load_f64(const double *p) { return vld1q_f64(p); }
static inline void vd_store_f64(double *p, vd v) { vst1q_f64(p, v); }
V_BUFFERED_TAILS(vd, f64, double, VD_W)
static inline void vd_stream_f64(double *p, vd v) { vst1q_f64(p, v); }

/* the "streaming" stores are plain stores (above): DMB ISHST orders them
 * anyway, as SFENCE does on x86, so the contract is the same */
static inline void v_store_fence(void) { __asm__ volatile("dmb ishst" ::: "memory"); }
/* a hint: the line holding p will be read soon; into L2 (PRFM PLDL2KEEP).
 * Always inlined: a call that GCC leaves out of line (past its
 * large-function-growth limit, as in the forward's entry functions) calls a
 * function without side effects, and GCC then deletes the call, prefetch
 * and all. */
static inline __attribute__((always_inline)) void v_prefetch(const void *p) {
  __builtin_prefetch(p, 0, 2);
}

#endif
