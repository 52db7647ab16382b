/* forward_f64.c - the AVX-512 set's fp64 forward over rows, its column split of long rows, the
 * sandwich forward and the gated norm's blocked dot (compiled with the set's ISA flags only,
 * CMakeLists.txt). */
#include "simd_avx512.h"

#define RN_SET_PREFIX rn_avx512_
#define RN_DTYPE_F64 1
#include "kernels/instantiate.inc"
#include "kernels/forward_simd.inc"
#include "kernels/cols_simd.inc"
#include "kernels/sandwich_simd.inc"
#include "kernels/acc_dot_simd.inc"
