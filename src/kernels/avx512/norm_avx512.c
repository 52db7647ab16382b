/* norm_avx512.c - RMSNorm/LayerNorm kernels for AVX-512 (F/BW/VL, FMA,
 * F16C). Compiled with those target flags only (see CMakeLists.txt) and run
 * only when cpu.c finds them. */
#include "simd_avx512.h"
#include "quant_avx512.h"

#define RN_KERNEL_SET rn_kernels_avx512
#define RN_ISA_NAME "avx512"
#include "kernels/instantiate.inc"
