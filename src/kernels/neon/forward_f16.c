/* forward_f16.c - the NEON set's fp16 forward over rows, and its column split
 * of long rows (compiled with the set's ISA flags only, CMakeLists.txt). */
#include "simd_neon.h"

#define RN_SET_PREFIX rn_neon_
#define RN_DTYPE_F16 1
#include "kernels/instantiate.inc"
#include "kernels/forward_simd.inc"
#include "kernels/cols_simd.inc"
