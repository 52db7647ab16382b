/* grid.h - the [tokens, heads] grids of rows that QK-norm and QK-norm +
 * RoPE read and write (src/api/qk.c, src/api/rope.c): their stride checks,
 * and the strides a grid never uses. */
#ifndef RMSNORM_GRID_H
#define RMSNORM_GRID_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "numerics/validate.h"
#include "rmsnorm.h"

/* A [tokens, heads] grid of rows of hd elements whose rows do not overlap:
 * token-major (heads inside a token) or head-major. A stride that is never
 * used (one head, or one token) is not checked. */
static inline rmsnorm_status rn_check_grid(size_t tokens, size_t heads, size_t hd,
                                           size_t ld_t, size_t ld_h, size_t es) {
  size_t inner;
  /* token-major: each token's heads are a heads x hd matrix of stride ld_h */
  if (rn_check_matrix(heads, hd, ld_h, es) == RMSNORM_OK &&
      (inner = heads > 1 ? (heads - 1) * ld_h + hd : hd,
       rn_check_matrix(tokens, inner, ld_t, es) == RMSNORM_OK))
    return RMSNORM_OK;
  if (rn_check_matrix(tokens, hd, ld_t, es) == RMSNORM_OK &&
      (inner = tokens > 1 ? (tokens - 1) * ld_t + hd : hd,
       rn_check_matrix(heads, inner, ld_h, es) == RMSNORM_OK))
    return RMSNORM_OK;
  /* an overflow of either layout is a size error, anything else a stride one */
  if ((heads > 1 && ld_h > SIZE_MAX / heads) || (tokens > 1 && ld_t > SIZE_MAX / tokens))
    return RMSNORM_ERROR_BAD_SIZE;
  return RMSNORM_ERROR_BAD_STRIDE;
}

/* One head (MQA/GQA K) never uses its head stride, one token its token
 * stride: such a stride is set so that the rows form one list of stride
 * ld_head (the kernels' fast path). */
static inline void rn_unused_strides(size_t tokens, size_t heads, size_t *ld_t, size_t *ld_h) {
  if (heads == 1) *ld_h = *ld_t;
  if (tokens == 1) *ld_t = heads * *ld_h;
}

/* The [tokens, heads] grids of a call's n buffers (tokens > 0): each one's
 * strides (rn_check_grid), then the row count tokens * heads into *rows; the
 * strides a grid never uses are then set by rn_unused_strides, and *flat
 * says whether every grid is then plain rows (token stride = heads * head
 * stride). */
static inline rmsnorm_status rn_check_grids(size_t tokens, size_t heads, size_t hd,
                                            size_t es, size_t *const ld[][2], size_t n,
                                            size_t *rows, int *flat) {
  rmsnorm_status st;
  for (size_t i = 0; i < n; i++)
    if ((st = rn_check_grid(tokens, heads, hd, *ld[i][0], *ld[i][1], es)) != RMSNORM_OK)
      return st;
  if (tokens > SIZE_MAX / heads) return RMSNORM_ERROR_BAD_SIZE;
  *rows = tokens * heads;
  *flat = 1;
  for (size_t i = 0; i < n; i++) {
    rn_unused_strides(tokens, heads, ld[i][0], ld[i][1]);
    *flat &= *ld[i][0] == heads * *ld[i][1];
  }
  return RMSNORM_OK;
}

/* A backward's chunks of whole tokens, about RN_BACKWARD_CHUNK_ROWS rows
 * each (heads > 0): fixed by the shape alone, so the reduction's order
 * never depends on threads. @return the tokens per chunk; *nchunks the
 * count. */
static inline size_t rn_token_chunks(size_t tokens, size_t heads, size_t *nchunks) {
  size_t chunk_tokens = (RN_BACKWARD_CHUNK_ROWS + heads - 1) / heads;
  *nchunks = (tokens + chunk_tokens - 1) / chunk_tokens;
  return chunk_tokens;
}

#endif
