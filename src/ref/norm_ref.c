/* norm_ref.c - instantiates the scalar reference kernels (norm_ref.inc) for
 * fp32, fp16, bf16 (float compute) and fp64 (double compute). Plain C11 with
 * no ISA flags: the portable path and the spec for every other kernel set. */
#include <math.h>
#include <stdint.h>

#include "numerics/blocks.h"
#include "numerics/convert.h"
#include "numerics/dtype.h"
#include "kernels/kernels.h"
#include "numerics/quant.h"
#include "numerics/rescue.h"
#include "numerics/rowmath.h"

/* Rows of user buffers are reached through byte offsets and loaded and stored
 * with memcpy (dtype.h): any address works. */
#define RN_ROW(p, row, ld) ((const char *)(p) + (row) * (ld) * sizeof(RN_T))
#define RN_ROW_OUT(p, row, ld) ((char *)(p) + (row) * (ld) * sizeof(RN_T))

#define RN_FMA fmaf
#define RN_A float
#define RN_LDA(p, i) rn_ld_f32((p), (i))
#define RN_STA(p, i, v) rn_st_f32((p), (i), (v))
#define RN_F64 0
#define RN_LANES RN_LANES_F32
#define RN_BLOCK RN_BLOCK_F32

#define RN_NAME(n) n##_f32
#define RN_T float
#define RN_LD(p, j) rn_ld_f32((p), (j))
#define RN_ST(p, j, v) rn_st_f32((p), (j), (v))
#define RN_RT(v) (v)
#include "norm_ref.inc"
#include "fused_ref.inc"
#include "shard_ref.inc"
#undef RN_NAME
#undef RN_T
#undef RN_LD
#undef RN_ST
#undef RN_RT

#define RN_NAME(n) n##_f16
#define RN_T uint16_t
#define RN_LD(p, j) rn_f16_to_f32(rn_ld_u16((p), (j)))
#define RN_ST(p, j, v) rn_st_u16((p), (j), rn_f32_to_f16(v))
#define RN_RT(v) rn_f16_to_f32(rn_f32_to_f16(v))
#include "norm_ref.inc"
#include "fused_ref.inc"
#include "shard_ref.inc"
#undef RN_NAME
#undef RN_T
#undef RN_LD
#undef RN_ST
#undef RN_RT

#define RN_NAME(n) n##_bf16
#define RN_T uint16_t
#define RN_LD(p, j) rn_bf16_to_f32(rn_ld_u16((p), (j)))
#define RN_ST(p, j, v) rn_st_u16((p), (j), rn_f32_to_bf16(v))
#define RN_RT(v) rn_bf16_to_f32(rn_f32_to_bf16(v))
#include "norm_ref.inc"
#include "fused_ref.inc"
#include "shard_ref.inc"
#undef RN_NAME
#undef RN_T
#undef RN_LD
#undef RN_ST
#undef RN_RT

#undef RN_FMA
#undef RN_A
#undef RN_LDA
#undef RN_STA
#undef RN_F64
#undef RN_LANES
#undef RN_BLOCK
#define RN_FMA fma
#define RN_A double
#define RN_LDA(p, i) rn_ld_f64((p), (i))
#define RN_STA(p, i, v) rn_st_f64((p), (i), (v))
#define RN_F64 1
#define RN_LANES RN_LANES_F64
#define RN_BLOCK RN_BLOCK_F64
#define RN_NAME(n) n##_f64
#define RN_T double
#define RN_LD(p, j) rn_ld_f64((p), (j))
#define RN_ST(p, j, v) rn_st_f64((p), (j), (v))
#define RN_RT(v) (v)
#include "norm_ref.inc"
#include "fused_ref.inc"
#include "shard_ref.inc"

const rn_kernel_set rn_kernels_ref = {
    "scalar",
    {forward_f32, forward_f16, forward_bf16, forward_f64},
    {backward_f32, backward_f16, backward_bf16, backward_f64},
    {add_rows_f32, add_rows_f16, add_rows_bf16, add_rows_f64},
    {rstd_rows_f32, rstd_rows_f16, rstd_rows_bf16, rstd_rows_f64},
    {quant_rows_f32, quant_rows_f16, quant_rows_bf16, quant_rows_f64},
    rn_ref_encode,
    {forward_coef_f32, forward_coef_f16, forward_coef_bf16, forward_coef_f64},
    {forward_cols_f32, forward_cols_f16, forward_cols_bf16, forward_cols_f64},
    {backward_coef_f32, backward_coef_f16, backward_coef_bf16, backward_coef_f64},
    {backward_cols_f32, backward_cols_f16, backward_cols_bf16, backward_cols_f64},
    {shard_sums_f32, shard_sums_f16, shard_sums_bf16, shard_sums_f64},
};
