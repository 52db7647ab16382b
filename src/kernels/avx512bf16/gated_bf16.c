/* gated_bf16.c - the AVX-512 set's VCVTNEPS2BF16 variant's bf16 gated
 * RMSNorm (kernels/gated_set.inc; compiled with the set's ISA flags only,
 * CMakeLists.txt). Its groups' sums are the full set's (rn_avx512_acc_dot_f32,
 * in the fp32 forward unit): the variant has bf16 units only. */
#define RN_AVX512_BF16 1 /* bf16 stores by VCVTNEPS2BF16 (simd_avx512.h) */
#include "../avx512/simd_avx512.h"
#include "../avx512/quant_avx512.h"

#define RN_SET_PREFIX rn_avx512bf16_
#define RN_GATED_DOT_PREFIX rn_avx512_
#define RN_DTYPE_BF16 1
#include "kernels/gated_set.inc"
