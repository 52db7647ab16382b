/* norm_avx512_bf16.c - the AVX-512 set's bf16 kernels for CPUs that also have
 * AVX512_BF16: the same body, its fp32 -> bf16 stores made by VCVTNEPS2BF16
 * (with the fix-up of simd_avx512.h, so the bits stay the spec's). Compiled
 * with the AVX-512 flags plus -mavx512bf16; dispatch.c lays these entries
 * over the avx512 set when cpu.c finds AVX512_BF16. */
#define RN_AVX512_BF16 1
#include "simd_avx512.h"
#include "quant_avx512.h"

#define RN_KERNEL_SET rn_kernels_avx512_bf16
#define RN_ISA_NAME "avx512"
#define RN_ONLY_BF16 1
#include "kernels/instantiate.inc"
