/* set_neon.c - the AArch64 Advanced SIMD (NEON) kernel set's table: dispatch.c
 * picks it when cpu.c finds ASIMD (every ARMv8-A Linux CPU has it). */
#define RN_SET_PREFIX rn_neon_
#define RN_KERNEL_SET rn_kernels_neon
#define RN_ISA_NAME "neon"
#include "kernels/set.inc"
