/* fused_f16.c - the AVX2 set's fp16 fusions (residual add, r alone, quantized
 * output) and column-shard sums (compiled with the set's ISA flags only,
 * CMakeLists.txt). */
#include "simd_avx2.h"
#include "quant_avx2.h"

#define RN_SET_PREFIX rn_avx2_
#define RN_DTYPE_F16 1
#include "kernels/instantiate.inc"
#include "kernels/fused_simd.inc"
#include "kernels/shard_simd.inc"
