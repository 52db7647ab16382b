/* dtype.h - element-wise access to any storage dtype through double, for the
 * code paths where speed does not matter (weight conversion, the rescue path,
 * gradient reductions), and scalar loads and stores at any address. */
#ifndef RMSNORM_DTYPE_H
#define RMSNORM_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "numerics/convert.h"
#include "rmsnorm.h"

static inline int rn_dtype_valid(int dt) { return dt >= RMSNORM_F32 && dt <= RMSNORM_F64; }

static inline size_t rn_dtype_size(rmsnorm_dtype dt) {
  return dt == RMSNORM_F64 ? 8 : dt == RMSNORM_F32 ? 4 : 2;
}

/* Compute ("acc") type of a data dtype: double for fp64, float otherwise. */
static inline int rn_acc_is_f64(rmsnorm_dtype dt) { return dt == RMSNORM_F64; }
static inline size_t rn_acc_size(rmsnorm_dtype dt) { return dt == RMSNORM_F64 ? 8 : 4; }

/* Element i of an array of float, double or uint16_t at any address: user
 * buffers carry no alignment promise, so every scalar access to them goes
 * through memcpy (one plain load or store on the machines we build for). */
static inline float rn_ld_f32(const void *p, size_t i) {
  float v;
  memcpy(&v, (const char *)p + i * sizeof v, sizeof v);
  return v;
}
static inline double rn_ld_f64(const void *p, size_t i) {
  double v;
  memcpy(&v, (const char *)p + i * sizeof v, sizeof v);
  return v;
}
static inline uint16_t rn_ld_u16(const void *p, size_t i) {
  uint16_t v;
  memcpy(&v, (const char *)p + i * sizeof v, sizeof v);
  return v;
}
static inline void rn_st_f32(void *p, size_t i, float v) {
  memcpy((char *)p + i * sizeof v, &v, sizeof v);
}
static inline void rn_st_f64(void *p, size_t i, double v) {
  memcpy((char *)p + i * sizeof v, &v, sizeof v);
}
static inline void rn_st_u16(void *p, size_t i, uint16_t v) {
  memcpy((char *)p + i * sizeof v, &v, sizeof v);
}

/* Whether p is aligned for elements of `size` bytes. */
static inline int rn_aligned(const void *p, size_t size) {
  return ((uintptr_t)p & (size - 1)) == 0;
}

static inline double rn_load(const void *p, rmsnorm_dtype dt, size_t i) {
  switch (dt) {
    case RMSNORM_F32: return rn_ld_f32(p, i);
    case RMSNORM_F16: return rn_f16_to_f32(rn_ld_u16(p, i));
    case RMSNORM_BF16: return rn_bf16_to_f32(rn_ld_u16(p, i));
    default: return rn_ld_f64(p, i);
  }
}

/* Stores v rounded to dt (fp16/bf16 via float: at most one fp16/bf16 ulp off
 * the direct rounding, only on exact ties of the first rounding). */
static inline void rn_store(void *p, rmsnorm_dtype dt, size_t i, double v) {
  switch (dt) {
    case RMSNORM_F32: rn_st_f32(p, i, (float)v); break;
    case RMSNORM_F16: rn_st_u16(p, i, rn_f32_to_f16((float)v)); break;
    case RMSNORM_BF16: rn_st_u16(p, i, rn_f32_to_bf16((float)v)); break;
    default: rn_st_f64(p, i, v); break;
  }
}

/* Rounds v to the data dtype and back (the ROUND_BEFORE_WEIGHT step). */
static inline double rn_round_to(rmsnorm_dtype dt, double v) {
  switch (dt) {
    case RMSNORM_F32: return (float)v;
    case RMSNORM_F16: return rn_f16_to_f32(rn_f32_to_f16((float)v));
    case RMSNORM_BF16: return rn_bf16_to_f32(rn_f32_to_bf16((float)v));
    default: return v;
  }
}

/* Per-row stats and gradient partials are stored in the acc type. */
static inline double rn_load_acc(const void *p, int f64, size_t i) {
  return f64 ? rn_ld_f64(p, i) : rn_ld_f32(p, i);
}
static inline void rn_store_acc(void *p, int f64, size_t i, double v) {
  if (f64)
    rn_st_f64(p, i, v);
  else
    rn_st_f32(p, i, (float)v);
}

#endif
