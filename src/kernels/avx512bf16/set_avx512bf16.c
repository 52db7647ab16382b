/* set_avx512bf16.c - the AVX-512 set's bf16 entries again, their fp32 -> bf16
 * stores made by VCVTNEPS2BF16 (with the fix-up of simd_avx512.h, so the bits
 * stay the spec's): dispatch.c lays them over the avx512 set when cpu.c finds
 * AVX512_BF16 and AVX512DQ. */
#define RN_SET_PREFIX rn_avx512bf16_
#define RN_KERNEL_SET rn_kernels_avx512_bf16
#define RN_ISA_NAME "avx512"
#define RN_ONLY_BF16 1
#include "kernels/set.inc"
