/* set_avx512.c - the AVX-512 (F/BW/VL, FMA, F16C) kernel set's table:
 * dispatch.c picks it when cpu.c finds those features. */
#define RN_SET_PREFIX rn_avx512_
#define RN_KERNEL_SET rn_kernels_avx512
#define RN_ISA_NAME "avx512"
#define RN_WIDEN rn_avx2_widen /* avx2/params.c: AVX2 and F16C, which these CPUs have */
#define RN_NARROW rn_avx2_narrow
#define RN_FINITE rn_avx2_finite
/* bf16's backward reads its weight in place too (api/norm.c): 1 x 128 to
 * 1 x 8192 took 0.87-0.90 of the copy's time (AVX2: up to 1.36x) */
#define RN_BACKWARD_W_DATA ((1u << RMSNORM_F16) | (1u << RMSNORM_BF16))
#include "kernels/set.inc"
