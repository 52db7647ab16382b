/* validate.h - the argument checks every public entry point shares: config,
 * matrix extents, and the byte-range overlap rule (every output disjoint from
 * every other buffer, except the exact in-place views an operation allows).
 * Checks only read their arguments; nothing here writes user memory. */
#ifndef RMSNORM_VALIDATE_H
#define RMSNORM_VALIDATE_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"
#include "kernels.h"
#include "rmsnorm.h"

#define RN_KNOWN_FLAGS                                                           \
  (RMSNORM_FLAG_EPS_OUTSIDE | RMSNORM_FLAG_WEIGHT_OFFSET |                       \
   RMSNORM_FLAG_ROUND_BEFORE_WEIGHT | RMSNORM_FLAG_ACCUMULATE)

/* The config sizes a library accepts (see rmsnorm_config in the header): at
 * least the end of the first version's last field, at most RN_CONFIG_MAX. */
#define RN_CONFIG_SIZE_V1 (offsetof(rmsnorm_config, flags) + sizeof(unsigned))
#define RN_CONFIG_MAX ((size_t)1024)

/* Reads the caller's config into *out, a full struct of this library's
 * version: the fields the caller's version has, defaults (zero) for the rest.
 * A larger caller struct is accepted when the bytes this library does not know
 * are all zero. */
static inline rmsnorm_status rn_read_config(const rmsnorm_config *cfg, rmsnorm_config *out) {
  size_t size;
  if (!cfg) return RMSNORM_ERROR_NULL_POINTER;
  memcpy(&size, cfg, sizeof size);
  if (size < RN_CONFIG_SIZE_V1 || size > RN_CONFIG_MAX) return RMSNORM_ERROR_BAD_CONFIG;
  memset(out, 0, sizeof *out);
  memcpy(out, cfg, size < sizeof *out ? size : sizeof *out);
  for (size_t i = sizeof *out; i < size; i++)
    if (((const unsigned char *)cfg)[i] != 0) return RMSNORM_ERROR_BAD_CONFIG;
  out->size = sizeof *out;
  return RMSNORM_OK;
}

/* Reads the caller's config into *out (rn_read_config) and checks its dtypes,
 * flags (minus `refused`, which the operation does not take), eps and partial
 * for `norm`. Entry points then use *out only. */
static inline rmsnorm_status rn_check_config(const rmsnorm_config *user, rmsnorm_config *out,
                                             rn_norm norm, unsigned refused) {
  rmsnorm_status st = rn_read_config(user, out);
  if (st != RMSNORM_OK) return st;
  const rmsnorm_config *cfg = out;
  if (!rn_dtype_valid((int)cfg->dtype) || !rn_dtype_valid((int)cfg->param_dtype) ||
      (cfg->param_dtype != RMSNORM_F32 && cfg->param_dtype != cfg->dtype))
    return RMSNORM_ERROR_BAD_DTYPE;
  if ((cfg->flags & ~(unsigned)RN_KNOWN_FLAGS) || (cfg->flags & refused) ||
      (norm == RN_LAYERNORM && (cfg->flags & RMSNORM_FLAG_EPS_OUTSIDE)))
    return RMSNORM_ERROR_BAD_FLAGS;
  if (!(cfg->eps >= 0 && cfg->eps <= DBL_MAX)) return RMSNORM_ERROR_BAD_EPS;
  if (!(cfg->partial > 0 && cfg->partial <= 1) || (norm == RN_LAYERNORM && cfg->partial != 1))
    return RMSNORM_ERROR_BAD_PARTIAL;
  return RMSNORM_OK;
}

/* A buffer as a byte range [lo, hi), for the overlap checks. */
typedef struct rn_span {
  const char *lo, *hi;
  size_t ld;  /* row stride of a matrix, 0 for vectors */
  size_t ld2; /* second stride of a 2-D batch of rows (rmsnorm_qk_norm), else 0 */
  int output;
} rn_span;

/* A rows x d matrix's stride, and that its extent fits in memory. */
static inline rmsnorm_status rn_check_matrix(size_t rows, size_t d, size_t ld, size_t es) {
  if (ld < d) return RMSNORM_ERROR_BAD_STRIDE;
  if (rows > 1 && (rows - 1) > (SIZE_MAX - d) / ld) return RMSNORM_ERROR_BAD_SIZE;
  size_t extent = rows ? (rows - 1) * ld + d : 0;
  if (extent > (size_t)PTRDIFF_MAX / es) return RMSNORM_ERROR_BAD_SIZE;
  return RMSNORM_OK;
}

static inline rn_span rn_matrix_span(const void *p, size_t rows, size_t d, size_t ld, size_t es,
                                     int output) {
  rn_span s = {(const char *)p, (const char *)p + ((rows - 1) * ld + d) * es, ld, 0, output};
  if (!p) s.hi = NULL;
  return s;
}

static inline rn_span rn_vector_span(const void *p, size_t n, size_t es, int output) {
  rn_span s = {(const char *)p, p ? (const char *)p + n * es : NULL, 0, 0, output};
  return s;
}

/* Every output must be disjoint from every other buffer, except the exact
 * in-place views: output `inplace_out` may equal inputs inplace_in0 and
 * inplace_in1 (same start, same strides). Pass an index >= n for "none". */
static inline rmsnorm_status rn_check_overlaps(const rn_span *s, size_t n, size_t inplace_out,
                                               size_t inplace_in0, size_t inplace_in1) {
  for (size_t i = 0; i < n; i++) {
    if (!s[i].lo || !s[i].output) continue;
    for (size_t j = 0; j < n; j++) {
      if (j == i || !s[j].lo) continue;
      if (s[j].output && j < i) continue; /* pair already seen */
      if (s[i].lo >= s[j].hi || s[j].lo >= s[i].hi) continue;
      int allowed = i == inplace_out && (j == inplace_in0 || j == inplace_in1) &&
                    s[i].lo == s[j].lo && s[i].ld == s[j].ld && s[i].ld2 == s[j].ld2;
      if (!allowed) return RMSNORM_ERROR_OVERLAP;
    }
  }
  return RMSNORM_OK;
}

#endif
