/* fused_f16.c - the AVX-512 set's fp16 fusions (residual add, r alone,
 * quantized output) and column-shard sums (compiled with the set's ISA flags
 * only, CMakeLists.txt). */
#include "simd_avx512.h"
#include "quant_avx512.h"

#define RN_SET_PREFIX rn_avx512_
#define RN_DTYPE_F16 1
#include "kernels/instantiate.inc"
#include "kernels/fused_simd.inc"
#include "kernels/shard_simd.inc"
