/* rmsnorm_mpi.c - librmsnorm_mpi: the split steps of the sharded hidden
 * dimension (rmsnorm.h) joined by MPI collectives. Per call: the whole call is
 * validated locally (shard.h, the checks of the split steps), then, with
 * checks on, one MPI_Allgather of a 16-integer record per rank decides on
 * every rank alike; then one MPI_Allreduce of rows doubles (two when a
 * backward recomputes the statistics), and for replicated weights the
 * deterministic dweight/dbias reduction (MPI_Alltoallv + MPI_Allgatherv).
 * Past the checks every rank enters every collective of the call whatever
 * happens to it locally, so no rank is left waiting. */
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rmsnorm_mpi.h"
#include "shard.h"

/* ---- checks mode ---------------------------------------------------------- */

static atomic_int checks_mode = -1;

void rmsnorm_mpi_set_checks(int mode) { atomic_store(&checks_mode, mode < 0 ? -1 : mode != 0); }

static int checks_on(void) {
  int mode = atomic_load(&checks_mode);
  if (mode >= 0) return mode;
  const char *e = getenv("RMSNORM_MPI_CHECK");
  return e && *e && strcmp(e, "0") != 0;
}

/* ---- the check record ------------------------------------------------------ */

enum {
  REC_MAGIC,    /* "RMSNMPI1": the same library on both ends */
  REC_OP,       /* 1 forward, 2 backward */
  REC_ROLE,     /* 0: the communicator that splits columns, 1: replicas */
  REC_STATUS,   /* this rank's own status */
  REC_PEER,     /* role 1: the verdict of this rank's column communicator */
  REC_ROWS,
  REC_DGLOBAL,
  REC_OFFSET,
  REC_WIDTH,
  REC_DTYPE,
  REC_PDTYPE,
  REC_FLAGS,
  REC_EPS,      /* bits of the double */
  REC_PARTIAL,  /* bits of the double */
  REC_OPTIONAL, /* OPT_* bits */
  REC_N = 16
};
#define REC_MAGIC_VALUE 0x524d534e4d504931ull
enum { OPT_STATS = 1, OPT_DWEIGHT = 2, OPT_DBIAS = 4 };
enum { OP_FORWARD = 1, OP_BACKWARD = 2 };

typedef struct call_info {
  int op;
  rmsnorm_status status;
  size_t rows, d_global, offset, width;
  const rmsnorm_config *cfg; /* may be NULL (then the status says so) */
  unsigned optional;
} call_info;

static void fill_record(uint64_t *rec, const call_info *c, int role, rmsnorm_status peer) {
  memset(rec, 0, REC_N * sizeof *rec);
  rec[REC_MAGIC] = REC_MAGIC_VALUE;
  rec[REC_OP] = (uint64_t)c->op;
  rec[REC_ROLE] = (uint64_t)role;
  rec[REC_STATUS] = (uint64_t)c->status;
  rec[REC_PEER] = (uint64_t)peer;
  rec[REC_ROWS] = c->rows;
  rec[REC_DGLOBAL] = c->d_global;
  rec[REC_OFFSET] = c->offset;
  rec[REC_WIDTH] = c->width;
  if (c->cfg) {
    rec[REC_DTYPE] = (uint64_t)c->cfg->dtype;
    rec[REC_PDTYPE] = (uint64_t)c->cfg->param_dtype;
    rec[REC_FLAGS] = c->cfg->flags;
    memcpy(&rec[REC_EPS], &c->cfg->eps, sizeof(double));
    memcpy(&rec[REC_PARTIAL], &c->cfg->partial, sizeof(double));
  }
  rec[REC_OPTIONAL] = c->optional;
}

typedef struct span64 {
  uint64_t lo, n;
} span64;

static int by_offset(const void *a, const void *b) {
  const span64 *p = a, *q = b;
  return p->lo < q->lo ? -1 : p->lo > q->lo;
}

/* Whether the non-empty shards cover [0, d) exactly once. */
static int shards_tile(const uint64_t *all, int n, uint64_t d) {
  span64 *s = malloc((size_t)n * sizeof *s);
  if (!s) return 0;
  int m = 0;
  for (int p = 0; p < n; p++)
    if (all[p * REC_N + REC_WIDTH]) {
      s[m].lo = all[p * REC_N + REC_OFFSET];
      s[m].n = all[p * REC_N + REC_WIDTH];
      m++;
    }
  qsort(s, (size_t)m, sizeof *s, by_offset);
  uint64_t at = 0;
  int ok = 1;
  for (int i = 0; i < m && ok; i++) {
    ok = s[i].lo == at && s[i].n <= d - at;
    at += s[i].n;
  }
  free(s);
  return ok && at == d;
}

/* The verdict every rank draws from the same gathered records. */
static rmsnorm_status verdict(const uint64_t *all, int n, int role) {
  for (int p = 0; p < n; p++) {
    const uint64_t *r = all + (size_t)p * REC_N;
    if (r[REC_MAGIC] != REC_MAGIC_VALUE || r[REC_ROLE] != (uint64_t)role)
      return RMSNORM_ERROR_BAD_ARGUMENT;
    if (r[REC_STATUS] != RMSNORM_OK) return (rmsnorm_status)r[REC_STATUS];
    if (r[REC_PEER] != RMSNORM_OK) return (rmsnorm_status)r[REC_PEER];
  }
  const uint64_t *r0 = all;
  for (int p = 1; p < n; p++) {
    const uint64_t *r = all + (size_t)p * REC_N;
    if (r[REC_OP] != r0[REC_OP]) return RMSNORM_ERROR_BAD_ARGUMENT;
    if (r[REC_DGLOBAL] != r0[REC_DGLOBAL]) return RMSNORM_ERROR_BAD_SIZE;
    if (role == 0 && r[REC_ROWS] != r0[REC_ROWS]) return RMSNORM_ERROR_BAD_SIZE;
    if (role == 1 && (r[REC_OFFSET] != r0[REC_OFFSET] || r[REC_WIDTH] != r0[REC_WIDTH]))
      return RMSNORM_ERROR_BAD_SIZE;
    if (r[REC_DTYPE] != r0[REC_DTYPE] || r[REC_PDTYPE] != r0[REC_PDTYPE])
      return RMSNORM_ERROR_BAD_DTYPE;
    unsigned opt_mask = role == 0 ? OPT_STATS : OPT_DWEIGHT | OPT_DBIAS;
    if (r[REC_EPS] != r0[REC_EPS] || r[REC_PARTIAL] != r0[REC_PARTIAL] ||
        r[REC_FLAGS] != r0[REC_FLAGS] ||
        ((r[REC_OPTIONAL] ^ r0[REC_OPTIONAL]) & opt_mask))
      return RMSNORM_ERROR_BAD_ARGUMENT;
  }
  if (role == 0 && !shards_tile(all, n, r0[REC_DGLOBAL])) return RMSNORM_ERROR_BAD_SIZE;
  return RMSNORM_OK;
}

/* One check on a communicator: every rank's record gathered, one verdict.
 * (Without memory for the answer a rank could not take part at all; up to
 * 64 ranks the answer lives on the stack.) */
static rmsnorm_status check_on(MPI_Comm comm, const call_info *c, int role,
                               rmsnorm_status peer) {
  int n;
  if (MPI_Comm_size(comm, &n) != MPI_SUCCESS) return RMSNORM_ERROR_NOT_AVAILABLE;
  uint64_t rec[REC_N], small[64 * REC_N];
  uint64_t *all = n <= 64 ? small : malloc((size_t)n * REC_N * sizeof *all);
  if (!all) return RMSNORM_ERROR_OUT_OF_MEMORY;
  fill_record(rec, c, role, peer);
  int rc = MPI_Allgather(rec, REC_N, MPI_UINT64_T, all, REC_N, MPI_UINT64_T, comm);
  rmsnorm_status st = rc != MPI_SUCCESS ? RMSNORM_ERROR_NOT_AVAILABLE : verdict(all, n, role);
  if (all != small) free(all);
  return st;
}

/* The checks of a call: its own status first, then the column communicator's
 * verdict, then (backward) the replicas', which also carries the verdicts of
 * the replicas' column communicators. Both collectives are always entered. */
static rmsnorm_status run_checks(const call_info *c, MPI_Comm comm, MPI_Comm replicas) {
  rmsnorm_status v = check_on(comm, c, 0, RMSNORM_OK);
  if (replicas != MPI_COMM_NULL) {
    rmsnorm_status w = check_on(replicas, c, 1, v);
    if (v == RMSNORM_OK) v = w;
  }
  return c->status != RMSNORM_OK ? c->status : v;
}

/* ---- collectives ------------------------------------------------------------- */

/* Sums rows doubles over comm in place (MPI_SUM); one call below INT_MAX rows.
 * @return 0 or 1 when an MPI call failed. */
static int allreduce_rows(double *v, size_t rows, MPI_Comm comm) {
  int failed = 0;
  for (size_t i = 0; i < rows;) {
    int n = rows - i > (size_t)INT_MAX ? INT_MAX : (int)(rows - i);
    failed |= MPI_Allreduce(MPI_IN_PLACE, v + i, n, MPI_DOUBLE, MPI_SUM, comm) != MPI_SUCCESS;
    i += (size_t)n;
  }
  return failed;
}

/* Columns [begin(s), begin(s+1)) of n are summed by replica rank s. */
static size_t slice_begin(size_t n, int s, int nranks) {
  return (size_t)((uint64_t)n * (uint64_t)s / (uint64_t)nranks);
}

/* The deterministic sum of v (n doubles) over replicas: every value's terms are
 * added in double in replica rank order, by the rank that owns its slice, and
 * the slices are shared; v is replaced by the sums, the same bits on every
 * replica. work: nranks * (n / nranks + 1) doubles; counts: 4 * nranks ints.
 * @return 0 or 1 when an MPI call failed. */
static int reduce_replicas(double *v, size_t n, MPI_Comm replicas, int nranks, double *work,
                           int *counts) {
  int me;
  if (nranks == 1) return 0;
  if (MPI_Comm_rank(replicas, &me) != MPI_SUCCESS) return 1;
  int *displs = counts + nranks, *rcounts = counts + 2 * nranks, *rdispls = counts + 3 * nranks;
  for (int s = 0; s < nranks; s++) {
    displs[s] = (int)slice_begin(n, s, nranks);
    counts[s] = (int)(slice_begin(n, s + 1, nranks) - (size_t)displs[s]);
  }
  int mine = counts[me];
  for (int p = 0; p < nranks; p++) {
    rcounts[p] = mine;
    rdispls[p] = p * mine;
  }
  if (MPI_Alltoallv(v, counts, displs, MPI_DOUBLE, work, rcounts, rdispls, MPI_DOUBLE,
                    replicas) != MPI_SUCCESS)
    return 1;
  double *out = v + displs[me];
  for (int i = 0; i < mine; i++) {
    double t = work[i];
    for (int p = 1; p < nranks; p++) t += work[(size_t)p * (size_t)mine + (size_t)i];
    out[i] = t;
  }
  return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v, counts, displs, MPI_DOUBLE,
                        replicas) != MPI_SUCCESS;
}

/* ---- forward --------------------------------------------------------------- */

/* Everything rmsnorm_shard_stats and rmsnorm_shard_forward would refuse, and
 * stats as an output, before anything is written or sent. */
static rmsnorm_status check_forward(const rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                    size_t rows, size_t d_global, size_t offset, size_t width,
                                    const void *x, size_t ldx, const void *weight,
                                    const void *bias, const void *y, size_t ldy,
                                    const double *stats, const void *rstd, MPI_Comm comm) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  if (comm == MPI_COMM_NULL) return RMSNORM_ERROR_BAD_ARGUMENT;
  rn_shard sh;
  size_t lds[2] = {ldx, ldy};
  rmsnorm_config cfg_copy;
  rmsnorm_status st = rn_shard_check(&cfg, &cfg_copy, &sh, rows, d_global, offset, width, lds, 2);
  if (st != RMSNORM_OK || rows == 0) return st;
  if (width && (!x || !y)) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  rn_span s[6] = {rn_shard_span(x, rows, &sh, ldx, es, 0),
                  rn_shard_span(y, rows, &sh, ldy, es, 1),
                  rn_shard_vector(weight, &sh, ps, 0),
                  rn_shard_vector(bias, &sh, ps, 0),
                  rn_vector_span(stats, rows, sizeof(double), 1),
                  rn_vector_span(rstd, rows, rn_acc_size(cfg->dtype), 1)};
  return rn_check_overlaps(s, 6, 1, 0, 0);
}

rmsnorm_status rmsnorm_mpi_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows,
                                   size_t d_global, size_t offset, size_t width, const void *x,
                                   size_t ldx, const void *weight, const void *bias, void *y,
                                   size_t ldy, double *stats, void *rstd, MPI_Comm comm) {
  call_info c = {OP_FORWARD, RMSNORM_OK, rows, d_global, offset, width, cfg, 0};
  c.status = check_forward(ctx, cfg, rows, d_global, offset, width, x, ldx, weight, bias, y,
                           ldy, stats, rstd, comm);
  double *owned = NULL, *s = stats;
  if (c.status == RMSNORM_OK && rows && !stats) {
    s = owned = rows <= SIZE_MAX / sizeof(double) ? malloc(rows * sizeof(double)) : NULL;
    if (!owned) c.status = RMSNORM_ERROR_OUT_OF_MEMORY;
  }
  rmsnorm_status st = c.status;
  if (checks_on() && comm != MPI_COMM_NULL) st = run_checks(&c, comm, MPI_COMM_NULL);
  if (st != RMSNORM_OK || rows == 0) {
    free(owned);
    return st;
  }
  /* past the checks: the collective is entered whatever happens here */
  st = rmsnorm_shard_stats(ctx, cfg, rows, d_global, offset, width, x, ldx, s);
  if (st != RMSNORM_OK) memset(s, 0, rows * sizeof(double));
  if (allreduce_rows(s, rows, comm) && st == RMSNORM_OK) st = RMSNORM_ERROR_NOT_AVAILABLE;
  if (st == RMSNORM_OK)
    st = rmsnorm_shard_forward(ctx, cfg, rows, d_global, offset, width, x, ldx, weight, bias, s,
                               y, ldy, rstd);
  free(owned);
  return st;
}

/* ---- backward -------------------------------------------------------------- */

static rmsnorm_status check_backward(const rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                     size_t rows, size_t d_global, size_t offset, size_t width,
                                     const void *x, size_t ldx, const void *dy, size_t lddy,
                                     const void *weight, const double *stats, const void *dx,
                                     size_t lddx, const void *dweight, const void *dbias,
                                     MPI_Comm comm, MPI_Comm replicas) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  if (comm == MPI_COMM_NULL) return RMSNORM_ERROR_BAD_ARGUMENT;
  rn_shard sh;
  size_t lds[3] = {ldx, lddy, lddx};
  rmsnorm_config cfg_copy;
  rmsnorm_status st = rn_shard_check(&cfg, &cfg_copy, &sh, rows, d_global, offset, width, lds, 3);
  if (st != RMSNORM_OK) return st;
  if (dweight && !weight) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (replicas != MPI_COMM_NULL && width > (size_t)INT_MAX / 2) return RMSNORM_ERROR_BAD_SIZE;
  if (rows == 0) return RMSNORM_OK;
  if (width && (!x || !dy || !dx)) return RMSNORM_ERROR_NULL_POINTER;
  size_t es = rn_dtype_size(cfg->dtype), ps = rn_dtype_size(cfg->param_dtype);
  rn_span s[7] = {rn_shard_span(x, rows, &sh, ldx, es, 0),
                  rn_shard_span(dy, rows, &sh, lddy, es, 0),
                  rn_shard_span(dx, rows, &sh, lddx, es, 1),
                  rn_shard_vector(weight, &sh, ps, 0),
                  rn_vector_span(stats, rows, sizeof(double), 0),
                  rn_shard_vector(dweight, &sh, ps, 1),
                  rn_shard_vector(dbias, &sh, ps, 1)};
  return rn_check_overlaps(s, 7, 2, 0, 1);
}

/* What a backward allocates, all before its checks (an allocation failure is
 * then an argument error like any other, seen by every rank). */
typedef struct bwd_buffers {
  double *stats, *dots;   /* (rows,) each; stats only when not handed in */
  void *w, *grads;        /* replicas: weight in the compute type (width), the
                             local dweight|dbias sums in the compute type */
  double *sums, *work;    /* replicas: the values reduced, the exchange */
  int *counts;            /* replicas: 4 * nranks */
} bwd_buffers;

static void free_buffers(bwd_buffers *b) {
  free(b->stats);
  free(b->dots);
  free(b->w);
  free(b->grads);
  free(b->sums);
  free(b->work);
  free(b->counts);
}

static void *alloc_n(size_t n, size_t size, int *failed) {
  void *p = n <= SIZE_MAX / size ? calloc(n ? n : 1, size) : NULL;
  if (!p) *failed = 1;
  return p;
}

rmsnorm_status rmsnorm_mpi_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                    size_t rows, size_t d_global, size_t offset, size_t width,
                                    const void *x, size_t ldx, const void *dy, size_t lddy,
                                    const void *weight, const double *stats, void *dx,
                                    size_t lddx, void *dweight, void *dbias, MPI_Comm comm,
                                    MPI_Comm replicas) {
  int reduce = replicas != MPI_COMM_NULL && (dweight || dbias);
  call_info c = {OP_BACKWARD, RMSNORM_OK, rows, d_global, offset, width, cfg,
                 (stats ? OPT_STATS : 0u) | (dweight ? OPT_DWEIGHT : 0u) |
                     (dbias ? OPT_DBIAS : 0u)};
  c.status = check_backward(ctx, cfg, rows, d_global, offset, width, x, ldx, dy, lddy, weight,
                            stats, dx, lddx, dweight, dbias, comm, replicas);
  bwd_buffers b = {0};
  int nranks = 1, failed = 0;
  size_t nvec = (dweight != NULL) + (dbias != NULL), n = width * nvec;
  if (c.status == RMSNORM_OK) {
    if (rows) {
      b.dots = alloc_n(rows, sizeof(double), &failed);
      if (!stats) b.stats = alloc_n(rows, sizeof(double), &failed);
    }
    if (reduce) {
      if (MPI_Comm_size(replicas, &nranks) != MPI_SUCCESS) c.status = RMSNORM_ERROR_NOT_AVAILABLE;
      size_t as = rn_acc_size(cfg->dtype);
      if (weight) b.w = alloc_n(width, as, &failed);
      b.grads = alloc_n(n, as, &failed);
      b.sums = alloc_n(n, sizeof(double), &failed);
      b.work = alloc_n((size_t)nranks * (n / (size_t)nranks + 1), sizeof(double), &failed);
      b.counts = alloc_n(4 * (size_t)nranks, sizeof(int), &failed);
    }
    if (failed && c.status == RMSNORM_OK) c.status = RMSNORM_ERROR_OUT_OF_MEMORY;
  }
  rmsnorm_status st = c.status;
  if (checks_on() && comm != MPI_COMM_NULL) st = run_checks(&c, comm, replicas);
  if (st != RMSNORM_OK) {
    free_buffers(&b);
    return st;
  }

  /* past the checks: every collective below is entered whatever happens here */
  const double *s = stats;
  if (rows && !stats) {
    st = rmsnorm_shard_stats(ctx, cfg, rows, d_global, offset, width, x, ldx, b.stats);
    if (st != RMSNORM_OK) memset(b.stats, 0, rows * sizeof(double));
    if (allreduce_rows(b.stats, rows, comm) && st == RMSNORM_OK) st = RMSNORM_ERROR_NOT_AVAILABLE;
    s = b.stats;
  }
  if (rows) {
    if (st == RMSNORM_OK)
      st = rmsnorm_shard_backward_dots(ctx, cfg, rows, d_global, offset, width, x, ldx, dy,
                                       lddy, weight, s, b.dots);
    if (st != RMSNORM_OK) memset(b.dots, 0, rows * sizeof(double));
    if (allreduce_rows(b.dots, rows, comm) && st == RMSNORM_OK) st = RMSNORM_ERROR_NOT_AVAILABLE;
  }
  if (!reduce) {
    if (st == RMSNORM_OK)
      st = rmsnorm_shard_backward(ctx, cfg, rows, d_global, offset, width, x, ldx, dy, lddy,
                                  weight, s, b.dots, dx, lddx, dweight, dbias);
    free_buffers(&b);
    return st;
  }

  /* replicas: this rank's sums in the compute type (weight and sums in the
   * compute type's dtype, never rounded to a 16-bit param dtype) */
  int f64 = rn_acc_is_f64(cfg->dtype);
  rmsnorm_config local = *cfg;
  local.param_dtype = f64 ? RMSNORM_F64 : RMSNORM_F32;
  local.flags &= ~(unsigned)RMSNORM_FLAG_ACCUMULATE;
  if (weight)
    for (size_t j = 0; j < width; j++)
      rn_store_acc(b.w, f64, j, rn_load(weight, cfg->param_dtype, j));
  size_t as = rn_acc_size(cfg->dtype);
  char *gw = dweight ? b.grads : NULL, *gb = dbias ? (char *)b.grads + (n - width) * as : NULL;
  if (st == RMSNORM_OK && rows)
    st = rmsnorm_shard_backward(ctx, &local, rows, d_global, offset, width, x, ldx, dy, lddy,
                                b.w, s, b.dots, dx, lddx, gw, gb);
  if (st == RMSNORM_OK)
    for (size_t i = 0; i < n; i++) b.sums[i] = rn_load_acc(b.grads, f64, i);
  if (reduce_replicas(b.sums, n, replicas, nranks, b.work, b.counts) && st == RMSNORM_OK)
    st = RMSNORM_ERROR_NOT_AVAILABLE;
  if (st == RMSNORM_OK) {
    int acc = (cfg->flags & RMSNORM_FLAG_ACCUMULATE) != 0;
    void *out[2] = {dweight, dbias};
    const double *sum = b.sums;
    for (int v = 0; v < 2; v++) {
      if (!out[v]) continue;
      for (size_t j = 0; j < width; j++) {
        double t = sum[j];
        if (acc) t += rn_load(out[v], cfg->param_dtype, j);
        rn_store(out[v], cfg->param_dtype, j, t);
      }
      sum += width;
    }
  }
  free_buffers(&b);
  return st;
}
