/* set_avx2.c - the AVX2 + FMA + F16C kernel set's table: dispatch.c picks it
 * when cpu.c finds those features. */
#define RN_SET_PREFIX rn_avx2_
#define RN_KERNEL_SET rn_kernels_avx2
#define RN_ISA_NAME "avx2"
#define RN_WIDEN rn_avx2_widen /* params.c */
#define RN_NARROW rn_avx2_narrow
#define RN_FINITE rn_avx2_finite
#include "kernels/set.inc"
