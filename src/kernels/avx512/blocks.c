/* blocks.c - the AVX-512 set's encoders of the block and per-group quantized
 * formats (one per set, not per dtype: they take y in float; compiled with
 * the set's ISA flags only, CMakeLists.txt). */
#include "simd_avx512.h"
#include "quant_avx512.h"

#define RN_SET_PREFIX rn_avx512_
#include "kernels/blocks_simd.inc"
