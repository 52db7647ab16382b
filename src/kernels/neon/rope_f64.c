/* rope_f64.c - the neon set's f64 QK-norm + RoPE (kernels/rope_set.inc,
 * compiled with the set's ISA flags only, CMakeLists.txt). */
#include "simd_neon.h"

#define RN_SET_PREFIX rn_neon_
#define RN_DTYPE_F64 1
#include "kernels/rope_set.inc"
