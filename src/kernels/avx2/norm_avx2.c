/* norm_avx2.c - RMSNorm/LayerNorm kernels for AVX2 + FMA + F16C. Compiled
 * with those target flags only (see CMakeLists.txt) and run only when cpu.c
 * finds them. */
#include "simd_avx2.h"
#include "quant_avx2.h"

#define RN_KERNEL_SET rn_kernels_avx2
#define RN_ISA_NAME "avx2"
#include "kernels/instantiate.inc"
