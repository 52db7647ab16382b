/* fused_f64.c - the AVX-512 set's fp64 fusions (residual add, r alone,
 * quantized output) and column-shard sums (compiled with the set's ISA flags
 * only, CMakeLists.txt). */
#include "simd_avx512.h"
#include "quant_avx512.h"

#define RN_SET_PREFIX rn_avx512_
#define RN_DTYPE_F64 1
#include "kernels/instantiate.inc"
#include "kernels/fused_simd.inc"
#include "kernels/shard_simd.inc"
