/* gated_f32.c - the avx512 set's f32 gated RMSNorm (kernels/gated_set.inc,
 * compiled with the set's ISA flags only, CMakeLists.txt). */
#include "simd_avx512.h"
#include "quant_avx512.h"

#define RN_SET_PREFIX rn_avx512_
#define RN_DTYPE_F32 1
#include "kernels/gated_set.inc"
