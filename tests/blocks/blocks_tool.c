/* blocks_tool.c - a test-only filter over the block encoders of
 * src/ref/blocks_ref.c, for the Python oracle (check_blocks_oracle.py):
 * reads fp32 values from stdin and writes the encoded bytes to stdout.
 *   blocks_tool q8_0 | q8_1 | q8_k | mxfp4 -> the blocks
 *   blocks_tool mxfp8                    -> n e4m3 codes, then n/32 E8M0 bytes
 *   blocks_tool int8|e4m3 G [pow2]       -> n codes, then n/G float scales
 *   blocks_tool int8|e4m3 G e8m0         -> n codes, then n/G E8M0 bytes
 *   blocks_tool mxfp4-e8m0               -> one byte per value: rn_mxfp4_e8m0 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/blocks.h"

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  size_t cap = 1 << 16, n = 0, got;
  float *y = malloc(cap * sizeof *y);
  while (y && (got = fread(y + n, sizeof *y, cap - n, stdin)) > 0) {
    n += got;
    if (n == cap) y = realloc(y, (cap *= 2) * sizeof *y);
  }
  if (!y) return 3;
  const char *f = argv[1];
  unsigned char *out = malloc(n * 8 + 64);
  size_t bytes;
  if (!out) return 3;
  if (!strcmp(f, "q8_0")) {
    rn_ref_q8_0(y, n, out);
    bytes = n / RN_Q8_0_BLOCK * RN_Q8_0_BYTES;
  } else if (!strcmp(f, "q8_1")) {
    rn_ref_q8_1(y, n, out);
    bytes = n / RN_Q8_1_BLOCK * RN_Q8_1_BYTES;
  } else if (!strcmp(f, "q8_k")) {
    rn_ref_q8_k(y, n, out);
    bytes = n / RN_Q8_K_BLOCK * RN_Q8_K_BYTES;
  } else if (!strcmp(f, "mxfp4")) {
    rn_ref_mxfp4(y, n, out);
    bytes = n / RN_MX_BLOCK * RN_MXFP4_BYTES;
  } else if (!strcmp(f, "mxfp8")) {
    rn_ref_mxfp8(y, n, out, out + n);
    bytes = n + n / RN_MX_BLOCK;
  } else if (!strcmp(f, "mxfp4-e8m0")) {
    for (size_t i = 0; i < n; i++) out[i] = rn_mxfp4_e8m0(y[i]);
    bytes = n;
  } else if ((!strcmp(f, "int8") || !strcmp(f, "e4m3")) && argc >= 3) {
    size_t g = (size_t)atol(argv[2]);
    const char *rule = argc >= 4 ? argv[3] : "";
    unsigned flags = !strcmp(rule, "pow2")   ? RN_GROUP_SCALE_POW2
                     : !strcmp(rule, "e8m0") ? RN_GROUP_SCALE_POW2 | RN_GROUP_SCALE_E8M0
                                             : 0;
    size_t es = flags & RN_GROUP_SCALE_E8M0 ? 1 : sizeof(float);
    if (!g || n % g) return 2;
    /* the scales straight after the codes (out has room for 8 bytes each) */
    rn_ref_group(y, n, g, f[0] == 'e' ? RN_GROUP_E4M3 : RN_GROUP_INT8, flags, out, out + n);
    bytes = n + n / g * es;
  } else {
    return 2;
  }
  fwrite(out, 1, bytes, stdout);
  free(out);
  free(y);
  return 0;
}
