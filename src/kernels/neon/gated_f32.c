/* gated_f32.c - the neon set's f32 gated RMSNorm (kernels/gated_set.inc,
 * compiled with the set's ISA flags only, CMakeLists.txt). */
#include "simd_neon.h"
#include "quant_neon.h"

#define RN_SET_PREFIX rn_neon_
#define RN_DTYPE_F32 1
#include "kernels/gated_set.inc"
