/* norm_neon.c - RMSNorm/LayerNorm kernels for AArch64 Advanced SIMD (NEON).
 * Built only for aarch64 targets (see CMakeLists.txt), run when cpu.c finds
 * ASIMD in the auxiliary vector (every ARMv8-A Linux CPU has it). */
#include "simd_neon.h"
#include "quant_neon.h"

#define RN_KERNEL_SET rn_kernels_neon
#define RN_ISA_NAME "neon"
#include "kernels/instantiate.inc"
