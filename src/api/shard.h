/* shard.h - a column shard of rows (the sharded hidden dimension) and the
 * argument checks its entry points share: src/api/shard.c (the split steps) and
 * src/mpi/rmsnorm_mpi.c, which validates a whole call before its first
 * collective. Header-only, on validate.h; nothing here writes user memory. */
#ifndef RMSNORM_SHARD_H
#define RMSNORM_SHARD_H

#include <stddef.h>

#include "numerics/dtype.h"
#include "numerics/rowmath.h"
#include "numerics/validate.h"

/* Columns [offset, offset + width) of rows of d_global columns. */
typedef struct rn_shard {
  size_t d_global, offset, width;
  size_t k;       /* the statistic's columns: ceil(partial * d_global) */
  size_t k_local; /* of them in this shard: its columns [0, k_local) */
} rn_shard;

/* The config (RMSNorm), the shard's place in the row, and the strides of
 * its matrices (none to check for width 0); fills *sh. The caller's config is
 * read into *copy (rn_check_config) and *cfgp is pointed at it, so the
 * caller goes on with the checked copy only. */
static inline rmsnorm_status rn_shard_check(const rmsnorm_config **cfgp, rmsnorm_config *copy,
                                            rn_shard *sh, size_t rows, size_t d_global,
                                            size_t offset, size_t width, const size_t *lds,
                                            size_t nld) {
  rmsnorm_status st = rn_check_config(*cfgp, copy, RN_RMSNORM, 0);
  if (st != RMSNORM_OK) return st;
  const rmsnorm_config *cfg = *cfgp = copy;
  if (d_global == 0 || offset > d_global || width > d_global - offset)
    return RMSNORM_ERROR_BAD_SIZE;
  sh->d_global = d_global;
  sh->offset = offset;
  sh->width = width;
  sh->k = rn_partial_k(cfg->partial, d_global);
  sh->k_local = sh->k <= offset ? 0 : sh->k - offset < width ? sh->k - offset : width;
  if (width == 0) return RMSNORM_OK;
  size_t es = rn_dtype_size(cfg->dtype);
  for (size_t i = 0; i < nld; i++)
    if ((st = rn_check_matrix(rows, width, lds[i], es)) != RMSNORM_OK) return st;
  return RMSNORM_OK;
}

/* A rows x width matrix of the shard (rows > 0) as a span; none for width 0. */
static inline rn_span rn_shard_matrix(const void *p, size_t rows, const rn_shard *sh, size_t ld,
                                      size_t es) {
  return rn_matrix(sh->width ? p : NULL, rows, sh->width, ld, es);
}

/* A per-shard vector (weight, bias, dweight, dbias: width elements). */
static inline rn_span rn_shard_param(const void *p, const rn_shard *sh, size_t es) {
  return rn_vector(sh->width ? p : NULL, sh->width, es);
}

/* The same with the role given, for spans listed by hand for
 * rn_check_overlaps (src/mpi). */
static inline rn_span rn_shard_span(const void *p, size_t rows, const rn_shard *sh, size_t ld,
                                    size_t es, int output) {
  return rn_with_role(rn_shard_matrix(p, rows, sh, ld, es), output);
}
static inline rn_span rn_shard_vector(const void *p, const rn_shard *sh, size_t es, int output) {
  return rn_with_role(rn_shard_param(p, sh, es), output);
}

#endif
