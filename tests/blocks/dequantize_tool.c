/* dequantize_tool.c - a test-only filter over rmsnorm_dequantize, for
 * check_dequantize.py: reads a quantized tensor's bytes from stdin (rows x
 * row bytes of codes, then rows x row scales, rows from the input's length)
 * and writes rows x d float32 values to stdout.
 *   dequantize_tool FORMAT D GROUP RULE [STATIC]
 * FORMAT int8 | fp8_e4m3 | q8_0 | q8_1 | q8_k | mxfp8 | mxfp4; RULE - | pow2 |
 * e8m0 (the scale flags); STATIC a static scale (no scales in the input). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmsnorm.h"

static const struct {
  const char *name;
  rmsnorm_qformat format;
} formats[] = {{"int8", RMSNORM_QF_INT8}, {"fp8_e4m3", RMSNORM_QF_FP8_E4M3},
               {"q8_0", RMSNORM_QF_Q8_0}, {"q8_1", RMSNORM_QF_Q8_1},
               {"q8_k", RMSNORM_QF_Q8_K}, {"mxfp8", RMSNORM_QF_MXFP8_E4M3},
               {"mxfp4", RMSNORM_QF_MXFP4}};

int main(int argc, char **argv) {
  if (argc < 5) return 2;
  rmsnorm_quant q;
  size_t nf = sizeof formats / sizeof formats[0], fi = 0;
  while (fi < nf && strcmp(argv[1], formats[fi].name)) fi++;
  if (fi == nf) return 2;
  rmsnorm_quant_init(&q, formats[fi].format);
  size_t d = (size_t)atol(argv[2]);
  q.group = (size_t)atol(argv[3]);
  q.flags = !strcmp(argv[4], "pow2")   ? RMSNORM_QUANT_SCALE_POW2
            : !strcmp(argv[4], "e8m0") ? RMSNORM_QUANT_SCALE_E8M0
                                       : 0u;
  float s0 = argc > 5 ? (float)atof(argv[5]) : 0.0f;
  if (argc > 5) q.static_scale = &s0;
  size_t row_bytes, row_scales;
  if (rmsnorm_quant_row_size(&q, d, &row_bytes, &row_scales) != RMSNORM_OK) return 2;
  size_t es = q.format == RMSNORM_QF_MXFP8_E4M3 || q.flags == RMSNORM_QUANT_SCALE_E8M0 ? 1 : 4;
  size_t cap = 1 << 16, n = 0, got;
  unsigned char *in = malloc(cap);
  while (in && (got = fread(in + n, 1, cap - n, stdin)) > 0)
    if ((n += got) == cap) in = realloc(in, cap *= 2);
  if (!in) return 3;
  size_t row_in = row_bytes + row_scales * es, rows = n / row_in;
  if (rows * row_in != n) return 2;
  float *y = malloc(rows * d * sizeof *y + 1);
  if (!y) return 3;
  rmsnorm_status st = rmsnorm_dequantize(&q, rows, d, in, row_bytes,
                                         row_scales ? in + rows * row_bytes : NULL, row_scales,
                                         y, d);
  if (st != RMSNORM_OK) {
    fprintf(stderr, "dequantize_tool: %s\n", rmsnorm_status_name(st));
    return 1;
  }
  fwrite(y, sizeof *y, rows * d, stdout);
  free(y);
  free(in);
  return 0;
}
