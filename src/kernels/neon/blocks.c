/* blocks.c - the NEON set's encoders of the block and per-group quantized
 * formats (one per set, not per dtype: they take y in float; compiled with
 * the set's ISA flags only, CMakeLists.txt). */
#include "simd_neon.h"
#include "quant_neon.h"

#define RN_SET_PREFIX rn_neon_
#include "kernels/blocks_simd.inc"
