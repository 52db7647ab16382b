/* qlayout.h - a quantized format's row layout (rmsnorm_quant read and
 * checked), shared by the quantizing entry points (quant.c) and
 * rmsnorm_dequantize (dequantize.c), so that both accept the same
 * descriptors and count bytes and scales the same way. */
#ifndef RMSNORM_QLAYOUT_H
#define RMSNORM_QLAYOUT_H

#include <stddef.h>

#include "rmsnorm.h"

/* A format's row: its codes' bytes, its scales (0: none, or inside the
 * blocks) and the bytes of one scale (4: float, 1: E8M0). */
typedef struct rn_qlayout {
  size_t row_bytes, row_scales, scale_es;
} rn_qlayout;

/* The caller's descriptor q into *out (a smaller, older one gets defaults;
 * a larger one only zeros past ours), checked, and its layout for rows of d.
 * @return RMSNORM_OK, RMSNORM_ERROR_NULL_POINTER, RMSNORM_ERROR_BAD_CONFIG
 * (q's size), RMSNORM_ERROR_BAD_ARGUMENT (format, group, flags or static
 * scale combination), RMSNORM_ERROR_BAD_SIZE (d). The static scale's value
 * is the caller's to check. */
rmsnorm_status rn_qlayout_read(const rmsnorm_quant *q, size_t d, rmsnorm_quant *out,
                               rn_qlayout *l);

#endif
