/* fused_f32.c - the NEON set's fp32 fusions (residual add, r alone, quantized
 * output) and column-shard sums (compiled with the set's ISA flags only,
 * CMakeLists.txt). */
#include "simd_neon.h"
#include "quant_neon.h"

#define RN_SET_PREFIX rn_neon_
#define RN_DTYPE_F32 1
#include "kernels/instantiate.inc"
#include "kernels/fused_simd.inc"
#include "kernels/shard_simd.inc"
