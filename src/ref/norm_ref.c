/* norm_ref.c - instantiates the scalar reference kernels (norm_ref.inc) for
 * fp32, fp16, bf16 (float compute) and fp64 (double compute). Plain C11 with
 * no ISA flags: the portable path and the spec for every other kernel set. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "numerics/activation.h"
#include "numerics/blocks.h"
#include "numerics/convert.h"
#include "numerics/dtype.h"
#include "kernels/kernels.h"
#include "numerics/quant.h"
#include "numerics/rescue.h"
#include "numerics/rowmath.h"

/* One body per storage type: fp32, fp16 and bf16 with float compute, fp64
 * with double (ref_types.inc defines the RN_* vocabulary for each). */
#define RN_DTYPE_F32 1
#include "ref_types.inc"
#include "norm_ref.inc"
#include "fused_ref.inc"
#include "shard_ref.inc"
#include "gated_ref.inc"
#include "rope_ref.inc"
#undef RN_DTYPE_F32

#define RN_DTYPE_F16 1
#include "ref_types.inc"
#include "norm_ref.inc"
#include "fused_ref.inc"
#include "shard_ref.inc"
#include "gated_ref.inc"
#include "rope_ref.inc"
#undef RN_DTYPE_F16

#define RN_DTYPE_BF16 1
#include "ref_types.inc"
#include "norm_ref.inc"
#include "fused_ref.inc"
#include "shard_ref.inc"
#include "gated_ref.inc"
#include "rope_ref.inc"
#undef RN_DTYPE_BF16

#define RN_DTYPE_F64 1
#include "ref_types.inc"
#include "norm_ref.inc"
#include "fused_ref.inc"
#include "shard_ref.inc"
#include "gated_ref.inc"
#include "rope_ref.inc"
#undef RN_DTYPE_F64

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
    {gated_forward_f32, gated_forward_f16, gated_forward_bf16, gated_forward_f64},
    {gated_backward_f32, gated_backward_f16, gated_backward_bf16, gated_backward_f64},
    {rope_forward_f32, rope_forward_f16, rope_forward_bf16, rope_forward_f64},
    {rope_backward_f32, rope_backward_f16, rope_backward_bf16, rope_backward_f64},
    {NULL, NULL, NULL, NULL}, /* the sandwich: the separate kernels are its spec */
    {NULL, NULL, NULL, NULL}, /* add + forward: the add, then the forward */
    NULL,                     /* parameters: the portable loops */
    NULL,                     /* parameter gradients: the portable loop */
    NULL,                     /* the parameters' finiteness: the portable loop */
    0,                        /* the forward's weight: always in the compute type */
    0,                        /* and the backward's */
};
