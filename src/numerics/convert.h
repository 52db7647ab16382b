/* convert.h - fp16 and bf16 <-> fp32 in portable C: round to nearest even,
 * NaNs kept quiet (and their sign), overflow to infinity. The SIMD kernels'
 * hardware conversions give the same bits. */
#ifndef RMSNORM_CONVERT_H
#define RMSNORM_CONVERT_H

#include <stdint.h>
#include <string.h>

static inline uint32_t rn_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float rn_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline float rn_bf16_to_f32(uint16_t h) { return rn_bits_f32((uint32_t)h << 16); }

static inline uint16_t rn_f32_to_bf16(float f) {
  uint32_t u = rn_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and payload top, force quiet */
    return (uint16_t)((u >> 16) | 0x0040u);
  /* round to nearest even on the 16 dropped bits; carries into the exponent
   * give the right result, up to infinity */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float rn_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1fu) /* inf or NaN (quiet bit set, as hardware does) */
    return rn_bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0u));
  if (exp == 0) {
    if (man == 0) return rn_bits_f32(sign);
    /* subnormal: man * 2^-24, exact in fp32 */
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
  }
  return rn_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

/* The conversions above without branches, the same bits, so that loops over
 * a row of them run in vector lanes (the parameters' conversion and the
 * dweight/dbias outputs, runtime/work.c): every candidate result is formed
 * and one is selected. No operation takes a subnormal operand whose value
 * matters, so a caller's flush-to-zero mode changes nothing. */
static inline float rn_f16_to_f32_lanes(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t normal = ((exp + 112u) << 23) | (man << 13);
  uint32_t special = 0x7f800000u | (man << 13) | ((uint32_t)(man != 0) << 22);
  uint32_t sub = rn_f32_bits((float)(int32_t)man * 0x1p-24f);
  uint32_t is_sub = 0u - (uint32_t)(exp == 0), is_special = 0u - (uint32_t)(exp == 0x1fu);
  return rn_bits_f32(sign | (sub & is_sub) | (special & is_special) |
                     (normal & ~(is_sub | is_special)));
}

static inline uint16_t rn_f32_to_bf16_lanes(float f) {
  uint32_t u = rn_f32_bits(f);
  uint32_t is_nan = 0u - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
  uint32_t quiet = (u >> 16) | 0x0040u, rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (uint16_t)((quiet & is_nan) | (rounded & ~is_nan));
}

static inline uint16_t rn_f32_to_f16_lanes(float f) {
  uint32_t u = rn_f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  uint32_t nan = sign | 0x7e00u | ((a >> 13) & 0x3ffu), inf = sign | 0x7c00u;
  /* below 2^-14 (a tiny a is a subnormal operand, but any a below 2^-25
   * rounds to zero, which flushing it gives too) */
  uint32_t sub = sign | (rn_f32_bits(rn_bits_f32(a) + 0.5f) - rn_f32_bits(0.5f));
  uint32_t m = a - (112u << 23);
  m += 0xfffu + ((m >> 13) & 1u);
  uint32_t normal = sign | (m >> 13);
  uint32_t is_nan = 0u - (uint32_t)(a > 0x7f800000u);
  uint32_t is_inf = ~is_nan & (0u - (uint32_t)(a >= 0x477ff000u));
  uint32_t is_sub = 0u - (uint32_t)(a < 0x38800000u);
  uint32_t r = (nan & is_nan) | (inf & is_inf) | (sub & is_sub) |
               (normal & ~(is_nan | is_inf | is_sub));
  return (uint16_t)r;
}

static inline uint16_t rn_f32_to_f16(float f) {
  uint32_t u = rn_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) /* NaN: quiet, keep top payload bits */
    return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) /* >= 65520 rounds to infinity */
    return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) { /* below 2^-14: subnormal or zero in fp16 */
    /* value / 2^-24 rounded to nearest even: adding 0.5 (2^-1 in these units)
     * in fp32 does the rounding for us, exactly */
    float v = rn_bits_f32(a) + 0.5f;
    return (uint16_t)(sign | (uint16_t)(rn_f32_bits(v) - rn_f32_bits(0.5f)));
  }
  /* normal: rebias exponent, round 13 dropped bits to nearest even */
  uint32_t m = a - (112u << 23);
  m += 0xfffu + ((m >> 13) & 1u);
  return (uint16_t)(sign | (m >> 13));
}

#endif
