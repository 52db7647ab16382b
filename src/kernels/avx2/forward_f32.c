/* forward_f32.c - the AVX2 set's fp32 forward over rows, its column split
 * of long rows and the sandwich forward (compiled with the set's ISA flags only, CMakeLists.txt). */
#include "simd_avx2.h"

#define RN_SET_PREFIX rn_avx2_
#define RN_DTYPE_F32 1
#include "kernels/instantiate.inc"
#include "kernels/forward_simd.inc"
#include "kernels/cols_simd.inc"
#include "kernels/sandwich_simd.inc"
