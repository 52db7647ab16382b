/* set_avx512.c - the AVX-512 (F/BW/VL, FMA, F16C) kernel set's table:
 * dispatch.c picks it when cpu.c finds those features. */
#define RN_SET_PREFIX rn_avx512_
#define RN_KERNEL_SET rn_kernels_avx512
#define RN_ISA_NAME "avx512"
#define RN_WIDEN_F16 rn_avx2_widen_f16 /* avx2/params.c: F16C, which these CPUs have */
#include "kernels/set.inc"
