/* validate.h - the argument checks every public entry point shares: config,
 * matrix extents, and the overlap rule (every output disjoint from every
 * other buffer on the bytes the call touches, except the exact in-place views
 * an operation allows).
 * Checks only read their arguments; nothing here writes user memory. */
#ifndef RMSNORM_VALIDATE_H
#define RMSNORM_VALIDATE_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "numerics/dtype.h"
#include "kernels/kernels.h"
#include "rmsnorm.h"

/* The flags every operation knows (each may still refuse some: `refused`),
 * and those only one family takes (`own` in rn_check_config_own): every
 * other operation refuses them as unknown. */
#define RN_KNOWN_FLAGS                                                           \
  (RMSNORM_FLAG_EPS_OUTSIDE | RMSNORM_FLAG_WEIGHT_OFFSET |                       \
   RMSNORM_FLAG_ROUND_BEFORE_WEIGHT | RMSNORM_FLAG_ACCUMULATE)
#define RN_ROPE_FLAGS (RMSNORM_FLAG_ROUND_BEFORE_ROTATION | RMSNORM_FLAG_FLOAT_ROTATION)

/* The config sizes a library accepts (see rmsnorm_config in the header): at
 * least the end of the first version's last field, at most RN_CONFIG_MAX. */
#define RN_CONFIG_SIZE_V1 (offsetof(rmsnorm_config, flags) + sizeof(unsigned))
#define RN_CONFIG_MAX ((size_t)1024)

/* Reads a caller's versioned struct (its first field the size_t `size` its
 * version has; rmsnorm_config, rmsnorm_quant, rmsnorm_gate) into out, a
 * struct of this library's version of out_size bytes: the fields the
 * caller's version has, zero (their defaults) for the rest. A size below
 * size_v1 (the end of the first version's last field) or above RN_CONFIG_MAX,
 * or a larger struct whose bytes past ours are not all zero, is
 * RMSNORM_ERROR_BAD_CONFIG. out's size field keeps the caller's value. */
static inline rmsnorm_status rn_read_versioned(const void *user, void *out, size_t out_size,
                                               size_t size_v1) {
  size_t size;
  if (!user) return RMSNORM_ERROR_NULL_POINTER;
  memcpy(&size, user, sizeof size);
  if (size < size_v1 || size > RN_CONFIG_MAX) return RMSNORM_ERROR_BAD_CONFIG;
  memset(out, 0, out_size);
  memcpy(out, user, size < out_size ? size : out_size);
  for (size_t i = out_size; i < size; i++)
    if (((const unsigned char *)user)[i] != 0) return RMSNORM_ERROR_BAD_CONFIG;
  return RMSNORM_OK;
}

/* Reads the caller's config into *out, a full struct of this library's
 * version: the fields the caller's version has, defaults (zero) for the rest.
 * A larger caller struct is accepted when the bytes this library does not know
 * are all zero. */
static inline rmsnorm_status rn_read_config(const rmsnorm_config *cfg, rmsnorm_config *out) {
  size_t size;
  if (!cfg) return RMSNORM_ERROR_NULL_POINTER;
  memcpy(&size, cfg, sizeof size);
  if (size == sizeof *out) { /* the caller's version is this library's */
    memcpy(out, cfg, sizeof *out);
    return RMSNORM_OK;
  }
  rmsnorm_status st = rn_read_versioned(cfg, out, sizeof *out, RN_CONFIG_SIZE_V1);
  if (st != RMSNORM_OK) return st;
  out->size = sizeof *out;
  return RMSNORM_OK;
}

/* Reads the caller's config into *out (rn_read_config) and checks its dtypes,
 * flags (RN_KNOWN_FLAGS and the family's `own`, minus `refused`, which the
 * operation does not take), eps and partial for `norm`. Entry points then
 * use *out only. */
static inline rmsnorm_status rn_check_config_own(const rmsnorm_config *user,
                                                 rmsnorm_config *out, rn_norm norm,
                                                 unsigned refused, unsigned own) {
  rmsnorm_status st = rn_read_config(user, out);
  if (st != RMSNORM_OK) return st;
  const rmsnorm_config *cfg = out;
  if (!rn_dtype_valid((int)cfg->dtype) || !rn_dtype_valid((int)cfg->param_dtype) ||
      (cfg->param_dtype != RMSNORM_F32 && cfg->param_dtype != cfg->dtype))
    return RMSNORM_ERROR_BAD_DTYPE;
  if ((cfg->flags & ~(unsigned)(RN_KNOWN_FLAGS | own)) || (cfg->flags & refused) ||
      (norm == RN_LAYERNORM && (cfg->flags & RMSNORM_FLAG_EPS_OUTSIDE)))
    return RMSNORM_ERROR_BAD_FLAGS;
  if (!(cfg->eps >= 0 && cfg->eps <= DBL_MAX)) return RMSNORM_ERROR_BAD_EPS;
  if (!(cfg->partial > 0 && cfg->partial <= 1) || (norm == RN_LAYERNORM && cfg->partial != 1))
    return RMSNORM_ERROR_BAD_PARTIAL;
  return RMSNORM_OK;
}

/* rn_check_config_own for the operations without flags of their own. */
static inline rmsnorm_status rn_check_config(const rmsnorm_config *user, rmsnorm_config *out,
                                             rn_norm norm, unsigned refused) {
  return rn_check_config_own(user, out, norm, refused, 0);
}

/* A buffer as the set of bytes a call touches, for the overlap checks: rows
 * of `width` bytes at p + i*s1 + h*s2 (i < n1, h < n2), as the caller laid
 * them out (a matrix: n2 = 1; a vector: one row; QK-norm's [tokens, heads]
 * grid: both). A stride whose count is 1 is never used and is kept as 0. */
typedef struct rn_span {
  const char *p; /* NULL: no buffer */
  size_t width;
  size_t n1, s1, n2, s2;
  uintptr_t lo, hi; /* the extent: first byte, one past the last */
  int output;
  int inplace; /* an input the call's main output may be exactly (api/entry.h) */
} rn_span;

/* A rows x d matrix's stride, and that its extent fits in memory. A matrix
 * of one row uses no stride, so any ld is accepted there. */
static inline rmsnorm_status rn_check_matrix(size_t rows, size_t d, size_t ld, size_t es) {
  if (rows <= 1) return d > (size_t)PTRDIFF_MAX / es ? RMSNORM_ERROR_BAD_SIZE : RMSNORM_OK;
  if (ld < d) return RMSNORM_ERROR_BAD_STRIDE;
  if ((rows - 1) > (SIZE_MAX - d) / ld) return RMSNORM_ERROR_BAD_SIZE;
  size_t extent = (rows - 1) * ld + d;
  if (extent > (size_t)PTRDIFF_MAX / es) return RMSNORM_ERROR_BAD_SIZE;
  return RMSNORM_OK;
}

/* Spans by shape: an n1 x n2 grid of rows of d elements of es bytes (strides
 * ld1, ld2 in elements), a rows x d matrix, a vector of n. Whether a span is
 * read or written is its role in the call (api/entry.h sets it). */
static inline rn_span rn_grid(const void *p, size_t n1, size_t ld1, size_t n2, size_t ld2,
                              size_t d, size_t es) {
  rn_span s = {(const char *)p, d * es, n1, n1 > 1 ? ld1 * es : 0, n2, n2 > 1 ? ld2 * es : 0,
               (uintptr_t)p, 0, 0, 0};
  s.hi = s.lo + (n1 > 1 ? (n1 - 1) * s.s1 : 0) + (n2 > 1 ? (n2 - 1) * s.s2 : 0) + s.width;
  return s;
}

static inline rn_span rn_matrix(const void *p, size_t rows, size_t d, size_t ld, size_t es) {
  return rn_grid(p, rows, ld, 1, 0, d, es);
}

static inline rn_span rn_vector(const void *p, size_t n, size_t es) {
  return rn_grid(p, 1, 0, 1, 0, n, es);
}

/* The same with the role given, for spans listed by hand for
 * rn_check_overlaps (src/mpi). */
static inline rn_span rn_with_role(rn_span s, int output) {
  s.output = output;
  return s;
}
static inline rn_span rn_matrix_span(const void *p, size_t rows, size_t d, size_t ld, size_t es,
                                     int output) {
  return rn_with_role(rn_matrix(p, rows, d, ld, es), output);
}
static inline rn_span rn_vector_span(const void *p, size_t n, size_t es, int output) {
  return rn_with_role(rn_vector(p, n, es), output);
}

/* The rows of a span in address order, as offsets from a base: n rows, row r
 * at off + (r / n2) * s1 + (r % n2) * s2, s1 the larger stride. The rows of
 * one buffer never overlap each other (the shape checks see to it). */
typedef struct rn_rows {
  size_t off, width, n, n1, s1, n2, s2;
} rn_rows;

static inline rn_rows rn_rows_of(const rn_span *s, const char *base) {
  rn_rows r = {(size_t)((uintptr_t)s->p - (uintptr_t)base), s->width, 0, s->n1, s->s1, s->n2,
               s->s2};
  if (r.n1 <= 1) r.n1 = 1, r.s1 = 0;
  if (r.n2 <= 1) r.n2 = 1, r.s2 = 0;
  if (r.n1 == 1 || (r.n2 > 1 && r.s2 > r.s1)) { /* the inner level is outermost */
    size_t n = r.n1, st = r.s1;
    r.n1 = r.n2, r.s1 = r.s2, r.n2 = n, r.s2 = st;
  }
  if (r.n2 > 1 && r.s1 == r.n2 * r.s2) /* back-to-back blocks: one level */
    r.n1 *= r.n2, r.s1 = r.s2, r.n2 = 1, r.s2 = 0;
  r.n = r.n1 * r.n2;
  return r;
}

static inline size_t rn_row_start(const rn_rows *r, size_t i) {
  return r->off + (i / r->n2) * r->s1 + (i % r->n2) * r->s2;
}

/* The first row that ends after byte x (n when none). */
static inline size_t rn_row_seek(const rn_rows *r, size_t x) {
  if (x < r->off + r->width) return 0;
  if (r->n == 1) return 1;
  size_t t = x + 1 - r->width - r->off; /* the first row starting at >= t */
  size_t i = t / r->s1, h = 0;
  if (r->n2 > 1) {
    size_t rest = t - i * r->s1;
    h = (rest + r->s2 - 1) / r->s2;
    if (h >= r->n2) i++, h = 0;
  } else if (i * r->s1 < t) {
    i++;
  }
  return i >= r->n1 ? r->n : i * r->n2 + h;
}

/* Whether two spans share a byte among those the call touches. */
static inline int rn_spans_meet(const rn_span *a, const rn_span *b) {
  if (a->lo >= b->hi || b->lo >= a->hi) return 0; /* extents apart: the common case */
  const char *base = a->p < b->p ? a->p : b->p;
  rn_rows ra = rn_rows_of(a, base), rb = rn_rows_of(b, base);
  if (ra.n > 1 && rb.n > 1 && ra.n2 == 1 && rb.n2 == 1 && ra.s1 == rb.s1) {
    /* Rows of one stride S: row k of b starts D = q + m S after row i of a
     * (q = b's offset - a's, m = k - i), and they meet iff -wb < D < wa. As
     * wa, wb <= S only D = q mod S and q mod S - S can: O(1) for any rows. */
    ptrdiff_t S = (ptrdiff_t)ra.s1, q = (ptrdiff_t)rb.off - (ptrdiff_t)ra.off;
    ptrdiff_t rem = q % S, fl = q / S;
    if (rem < 0) rem += S, fl -= 1;
    for (int c = 0; c < 2; c++) {
      ptrdiff_t D = c ? rem - S : rem, m = c ? -fl - 1 : -fl; /* D = q + m S */
      int fits = D < (ptrdiff_t)ra.width && D > -(ptrdiff_t)rb.width;
      int in_range = m >= 0 ? (size_t)m <= rb.n - 1 : (size_t)(-m) <= ra.n - 1;
      if (fits && in_range) return 1;
    }
    return 0;
  }
  /* both row lists in address order, each jumping past the rows that end
   * before the other's current row */
  size_t i = 0, k = 0;
  while (i < ra.n && k < rb.n) {
    size_t sa = rn_row_start(&ra, i), sb = rn_row_start(&rb, k);
    if (sa + ra.width <= sb)
      i = rn_row_seek(&ra, sb);
    else if (sb + rb.width <= sa)
      k = rn_row_seek(&rb, sa);
    else
      return 1;
  }
  return 0;
}

/* Whether two spans are the same rows, row for row (an exact in-place view). */
static inline int rn_spans_same(const rn_span *a, const rn_span *b) {
  return a->p == b->p && a->width == b->width && a->n1 == b->n1 && a->s1 == b->s1 &&
         a->n2 == b->n2 && a->s2 == b->s2;
}

/* Every output must be disjoint from every other buffer, except the exact
 * in-place views: output `inplace_out` may be inputs inplace_in0 and
 * inplace_in1 (same start, same strides where they are used). Disjoint means
 * no byte in common among those the call touches: interleaved views such as
 * x = buf[:, :d] and y = buf[:, d:] with a stride of 2d are fine. Pass an
 * index >= n for "none". */
static inline rmsnorm_status rn_check_overlaps(const rn_span *s, size_t n, size_t inplace_out,
                                               size_t inplace_in0, size_t inplace_in1) {
  for (size_t i = 0; i < n; i++) {
    if (!s[i].p || !s[i].output) continue;
    for (size_t j = 0; j < n; j++) {
      if (j == i || !s[j].p) continue;
      if (s[j].output && j < i) continue; /* pair already seen */
      if (s[i].lo >= s[j].hi || s[j].lo >= s[i].hi) continue; /* extents apart */
      int allowed = i == inplace_out && (j == inplace_in0 || j == inplace_in1) &&
                    rn_spans_same(&s[i], &s[j]);
      if (!allowed && rn_spans_meet(&s[i], &s[j])) return RMSNORM_ERROR_OVERLAP;
    }
  }
  return RMSNORM_OK;
}

#endif
