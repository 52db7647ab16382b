/* rope_bf16.c - the AVX-512 set's VCVTNEPS2BF16 variant's bf16 QK-norm +
 * RoPE (kernels/rope_set.inc; compiled with the set's ISA flags only,
 * CMakeLists.txt). */
#define RN_AVX512_BF16 1 /* bf16 stores by VCVTNEPS2BF16 (simd_avx512.h) */
#include "../avx512/simd_avx512.h"

#define RN_SET_PREFIX rn_avx512bf16_
#define RN_DTYPE_BF16 1
#include "kernels/rope_set.inc"
