/* gated_bf16.c - the neon set's bf16 gated RMSNorm (kernels/gated_set.inc,
 * compiled with the set's ISA flags only, CMakeLists.txt). */
#include "simd_neon.h"
#include "quant_neon.h"

#define RN_SET_PREFIX rn_neon_
#define RN_DTYPE_BF16 1
#include "kernels/gated_set.inc"
