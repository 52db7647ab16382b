/* blocks.h - the block and per-group quantizers of a normed fp32 row segment
 * (Q8_0, Q8_1, Q8_K, MXFP4, MXFP8 E4M3, per-group int8/e4m3): sizes, layouts and
 * the scalar reference encoders (src/ref/blocks_ref.c, which states the rules). */
#ifndef RMSNORM_BLOCKS_H
#define RMSNORM_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

/* Q8_0: 32 elements -> 34 bytes: fp16 d (little-endian), then int8 qs[32]. */
#define RN_Q8_0_BLOCK 32
#define RN_Q8_0_BYTES 34
/* Q8_1: 32 elements -> 36 bytes: fp16 d, fp16 s = d * sum(qs), int8 qs[32]. */
#define RN_Q8_1_BLOCK 32
#define RN_Q8_1_BYTES 36
/* Q8_K: 256 elements -> 292 bytes: float d, int8 qs[256], int16 bsums[16]
 * (bsums[i] = sum of qs[16i..16i+15]); all little-endian, no padding. */
#define RN_Q8_K_BLOCK 256
#define RN_Q8_K_BYTES 292
/* MXFP4 (ggml's layout): 32 elements -> 17 bytes: the E8M0 byte e, then 16
 * bytes, byte j = code(y_j) | code(y_{j+16}) << 4 (E2M1 codes, ggml's order). */
#define RN_MX_BLOCK 32
#define RN_MXFP4_BYTES 17
/* MXFP8 E4M3: 32 e4m3 codes per E8M0 scale byte, codes and scales apart. */

/* Per-group scales: the code type and how the scale is rounded. */
enum { RN_GROUP_INT8 = 0, RN_GROUP_E4M3 = 1 };
enum {
  RN_GROUP_SCALE_POW2 = 1, /* scale rounded up to a power of two in UE8M0's range */
  RN_GROUP_SCALE_E8M0 = 2  /* with POW2: the scales stored as E8M0 bytes */
};

/* Each encoder reads n fp32 values of y (n a multiple of its block, or of g)
 * and writes n / block blocks (or codes and scales); any alignment. */
void rn_ref_q8_0(const float *y, size_t n, unsigned char *blocks);
void rn_ref_q8_1(const float *y, size_t n, unsigned char *blocks);
void rn_ref_q8_k(const float *y, size_t n, unsigned char *blocks);
void rn_ref_mxfp4(const float *y, size_t n, unsigned char *blocks);
/* codes: n bytes of e4m3; scales: n / 32 E8M0 bytes. */
void rn_ref_mxfp8(const float *y, size_t n, unsigned char *codes, unsigned char *scales);
/* g in {32, 64, 128} (any g > 0 works); kind RN_GROUP_INT8 or RN_GROUP_E4M3;
 * flags 0, RN_GROUP_SCALE_POW2, or that | RN_GROUP_SCALE_E8M0. codes: n
 * bytes (int8 or e4m3); scales: n / g floats, or bytes with E8M0. */
void rn_ref_group(const float *y, size_t n, size_t g, int kind, unsigned flags,
                  unsigned char *codes, void *scales);

/* The reference encoder of the kernel sets (rn_encode_fn, kernels.h): a
 * row's y to q->format (group formats through rn_ref_group). */
struct rn_quant_args;
void rn_ref_encode(const struct rn_quant_args *q, size_t row, const float *y);

/* Building blocks the SIMD kernels will need to agree with, exposed for tests. */
/* MXFP4's E8M0 byte for a block amax (ggml's rule, see blocks_ref.c). */
uint8_t rn_mxfp4_e8m0(float amax);
/* The value ggml multiplies MXFP4's doubled E2M1 codes by: 2^(e - 128). */
float rn_e8m0_half(uint8_t e);
/* MXFP8's E8M0 byte for a block amax: floor(log2(amax)) - 8 + 127, >= 0. */
uint8_t rn_mxfp8_e8m0(float amax);

#endif
