/* blocks.c - the AVX2 set's encoders of the block and per-group quantized
 * formats (one per set, not per dtype: they take y in float; compiled with
 * the set's ISA flags only, CMakeLists.txt). */
#include "simd_avx2.h"
#include "quant_avx2.h"

#define RN_SET_PREFIX rn_avx2_
#include "kernels/blocks_simd.inc"
