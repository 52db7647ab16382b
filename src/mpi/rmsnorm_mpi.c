/* rmsnorm_mpi.c - librmsnorm_mpi: the split steps of the sharded hidden
 * dimension (rmsnorm.h) joined by MPI collectives, and the agreement of the
 * ranks that rides on them. Per call: the whole call is validated locally
 * (shard.h, the checks of the split steps) and the first partial sums are
 * computed; then the call's first collective, always the same on every rank
 * (one MPI_Allreduce of HEAD_N doubles), carries every rank's status and what
 * the ranks must agree on with the first rows' sums, and every rank draws
 * the same verdict from it; with checks on any rank, one MPI_Allgather of
 * each rank's place in the row follows; then the other rows' sums, the
 * backward's second sums, and for replicated weights the agreement of the
 * replicas and the deterministic dweight/dbias reduction (MPI_Alltoallv +
 * MPI_Allgatherv). Which collectives a rank enters is decided only by what
 * every rank of that communicator has seen, so no rank is left waiting. */
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rmsnorm_mpi.h"
#include "api/shard.h"

/* ---- checks mode ---------------------------------------------------------- */

static atomic_int checks_mode = -1;

void rmsnorm_mpi_set_checks(int mode) { atomic_store(&checks_mode, mode < 0 ? -1 : mode != 0); }

static int checks_on(void) {
  int mode = atomic_load(&checks_mode);
  if (mode >= 0) return mode;
  const char *e = getenv("RMSNORM_MPI_CHECK");
  return e && *e && strcmp(e, "0") != 0;
}

/* ---- agreement ---------------------------------------------------------------
 *
 * A call's first collective on comm is one MPI_Allreduce (MPI_SUM) of HEAD_N
 * doubles whatever the arguments: an agreement block of AG_N doubles, then
 * the first HEAD_ROWS rows' partial sums (zeros past rows; the other rows
 * follow in a second MPI_Allreduce once the ranks agree). The block holds
 * integers whose sums stay below 2^53, so every rank gets the exact sums and
 * draws the same verdict from them:
 *   - a tally of statuses: the number of ranks whose own arguments failed,
 *     the sums of their status codes and of their squares (the verdict: their
 *     status when they all failed alike, else BAD_ARGUMENT), and the number
 *     of ranks with checks on;
 *   - what the ranks must share (a record, below), as three words: a 64-bit
 *     hash of the options (call, flags, eps, partial: BAD_ARGUMENT), one of
 *     the sizes (rows, d_global: BAD_SIZE) and the dtypes themselves
 *     (BAD_DTYPE); per 16-bit piece p of a word, the sums of p and p^2 over
 *     the n ranks: all hold the same piece exactly when sum(p) = n m and
 *     sum(p^2) = n m^2, the sum of (p - m)^2 being then 0;
 *   - per 16-bit piece of a 64-bit hash H, the sum over the non-empty shards
 *     of H(offset + width) - H(offset): when the shards chain from 0 to
 *     d_global (cover it exactly once) it telescopes to H(d_global) - H(0);
 *     any other set of shards leaves some H(v) with a nonzero count and
 *     matches only by a collision.
 * So the ranks agree exactly on statuses and dtypes, and on the rest up to
 * a collision of a 64-bit hash. With checks on any rank, every rank's record
 * is then gathered (one MPI_Allgather) and compared exactly. The replicas of
 * a backward agree the same way on a block of their own (one MPI_Allreduce of
 * AG_N doubles) before anything is written. */

/* RN_MPI_AGREEMENT=0 builds the library without the agreement (sums only,
 * as bench/mpi/bench_agreement.c measures it against); never shipped. */
#ifndef RN_MPI_AGREEMENT
#define RN_MPI_AGREEMENT 1
#endif

enum { OPT_STATS = 1, OPT_DWEIGHT = 2, OPT_DBIAS = 4 };
enum { OP_FORWARD = 1, OP_BACKWARD = 2 };
enum { ROLE_COLUMNS, ROLE_REPLICAS };

/* A call's record: what its ranks must share (and, for the columns, where
 * each shard lies). */
enum { R_KIND, R_EPS, R_PARTIAL, R_ROWS, R_DGLOBAL, R_OFFSET, R_WIDTH, R_DTYPES, R_N };

enum {
  PIECES = 4,           /* 16-bit pieces of a 64-bit word */
  TALLY_N = 3,          /* failed ranks + (checks on) << CHECKS_SHIFT, sum of codes, of squares */
  CHECKS_SHIFT = 20,    /* counts below 2^20: communicators of fewer than 2^20 ranks */
  AG_TALLY = 0,                       /* [TALLY_N] */
  AG_OPTIONS = AG_TALLY + TALLY_N,    /* [PIECES][2]: sums of p and p^2 */
  AG_SIZES = AG_OPTIONS + 2 * PIECES, /* [PIECES][2] */
  AG_DTYPES = AG_SIZES + 2 * PIECES,  /* [2]: one piece */
  AG_COVER = AG_DTYPES + 2,           /* [PIECES]: the shards' H telescoped */
  AG_N = AG_COVER + PIECES,
  HEAD_N = 32,          /* the first collective: the block, then rows (256 bytes: still
                           one small message for the transport) */
  HEAD_ROWS = HEAD_N - AG_N,
  AG_VERSION = 1        /* in the kind word: the layout of the block */
};

typedef struct call_info {
  int op, checks;
  rmsnorm_status status;     /* this rank's own */
  size_t rows, d_global, offset, width;
  const rmsnorm_config *cfg; /* the checked copy; only read when status is OK */
  unsigned optional;         /* OPT_* */
} call_info;

/* A double's value as 64 bits: 0 and -0 are the same value. */
static uint64_t value_bits(double v) {
  uint64_t u;
  if (v == 0) v = 0;
  memcpy(&u, &v, sizeof u);
  return u;
}

static void fill_record(uint64_t *r, const call_info *c, int role) {
  const rmsnorm_config *cfg = c->cfg;
  /* the columns: the same statistics given or not; the replicas: the same
   * of dweight and dbias asked for */
  unsigned opt = c->optional & (role == ROLE_COLUMNS ? OPT_STATS : OPT_DWEIGHT | OPT_DBIAS);
  r[R_KIND] = (uint64_t)c->op | (uint64_t)opt << 8 | (uint64_t)cfg->flags << 16 |
              (uint64_t)AG_VERSION << 56;
  r[R_EPS] = value_bits(cfg->eps);
  r[R_PARTIAL] = value_bits(cfg->partial);
  r[R_ROWS] = c->rows;
  r[R_DGLOBAL] = c->d_global;
  r[R_OFFSET] = c->offset;
  r[R_WIDTH] = c->width;
  r[R_DTYPES] = (uint64_t)cfg->dtype | (uint64_t)cfg->param_dtype << 8;
}

/* The record's fields the ranks share, by the status a difference gives:
 * options, sizes (the columns: the same rows of one row length; the
 * replicas: the same columns of it), dtypes. */
static const int shared_options[] = {R_KIND, R_EPS, R_PARTIAL, -1};
static const int shared_sizes[2][4] = {{R_ROWS, R_DGLOBAL, -1}, {R_DGLOBAL, R_OFFSET, R_WIDTH, -1}};

/* splitmix64's finalizer: a 64-bit mix. */
static uint64_t mix64(uint64_t v) {
  v += 0x9e3779b97f4a7c15ull;
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebull;
  return v ^ (v >> 31);
}

static uint64_t hash_fields(const uint64_t *r, const int *fields) {
  uint64_t h = 0;
  for (int i = 0; fields[i] >= 0; i++) h = mix64(h ^ mix64(r[fields[i]]));
  return h;
}

static double piece(uint64_t w, int p) { return (double)((w >> (16 * p)) & 0xffff); }

static void add_pieces(double *a, uint64_t w, int pieces) {
  for (int p = 0; p < pieces; p++) {
    a[2 * p] = piece(w, p);
    a[2 * p + 1] = piece(w, p) * piece(w, p);
  }
}

/* Whether the n ranks' pieces summed in a (sums of p and p^2) are equal. */
static int pieces_equal(const double *a, int pieces, int n) {
  for (int p = 0; p < pieces; p++) {
    uint64_t s1 = (uint64_t)a[2 * p], s2 = (uint64_t)a[2 * p + 1], m = s1 / (uint64_t)n;
    if (s1 != m * (uint64_t)n || s2 != m * m * (uint64_t)n) return 0;
  }
  return 1;
}

/* A tally of statuses (t: TALLY_N doubles). */
static void tally_add(double *t, rmsnorm_status st) {
  if (st == RMSNORM_OK) return;
  t[0] += 1;
  t[1] += (double)st;
  t[2] += (double)st * (double)st;
}

static void tally_checks(double *t) { t[0] += (double)(1u << CHECKS_SHIFT); }

static uint64_t tally_checks_on(const double *t) { return (uint64_t)t[0] >> CHECKS_SHIFT; }

/* The failed ranks' status when they all failed alike, else BAD_ARGUMENT. */
static rmsnorm_status tally_status(const double *t) {
  uint64_t n = (uint64_t)t[0] & ((1u << CHECKS_SHIFT) - 1);
  if (!n) return RMSNORM_OK;
  uint64_t s1 = (uint64_t)t[1], s2 = (uint64_t)t[2], m = s1 / n;
  return s1 == m * n && s2 == m * m * n ? (rmsnorm_status)m : RMSNORM_ERROR_BAD_ARGUMENT;
}

/* This rank's agreement block (a: AG_N doubles). With a status of its own it
 * counts that alone: the verdict is then an error whatever the rest. */
static void fill_block(double *a, const call_info *c, int role, rmsnorm_status status) {
  memset(a, 0, AG_N * sizeof *a);
  if (status != RMSNORM_OK) {
    tally_add(a + AG_TALLY, status);
    return;
  }
  if (c->checks) tally_checks(a + AG_TALLY);
  uint64_t r[R_N];
  fill_record(r, c, role);
  add_pieces(a + AG_OPTIONS, hash_fields(r, shared_options), PIECES);
  add_pieces(a + AG_SIZES, hash_fields(r, shared_sizes[role]), PIECES);
  add_pieces(a + AG_DTYPES, r[R_DTYPES], 1);
  if (role == ROLE_COLUMNS && c->width) {
    uint64_t hi = mix64(c->offset + c->width), lo = mix64(c->offset);
    for (int p = 0; p < PIECES; p++) a[AG_COVER + p] = piece(hi, p) - piece(lo, p);
  }
}

/* The verdict of the summed blocks of n ranks: the same on every rank (it
 * reads c only for what the ranks have then been found to share). */
static rmsnorm_status block_verdict(const double *a, int n, const call_info *c, int role) {
  if (n >= 1 << CHECKS_SHIFT) return RMSNORM_ERROR_BAD_SIZE;
  rmsnorm_status st = tally_status(a + AG_TALLY);
  if (st != RMSNORM_OK) return st;
  if (!pieces_equal(a + AG_OPTIONS, PIECES, n)) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (!pieces_equal(a + AG_SIZES, PIECES, n)) return RMSNORM_ERROR_BAD_SIZE;
  if (!pieces_equal(a + AG_DTYPES, 1, n)) return RMSNORM_ERROR_BAD_DTYPE;
  if (role == ROLE_COLUMNS) {
    uint64_t hi = mix64(c->d_global), lo = mix64(0);
    for (int p = 0; p < PIECES; p++)
      if (a[AG_COVER + p] != piece(hi, p) - piece(lo, p)) return RMSNORM_ERROR_BAD_SIZE;
  }
  return RMSNORM_OK;
}

typedef struct span64 {
  uint64_t lo, n;
} span64;

static int by_offset(const void *a, const void *b) {
  const span64 *p = a, *q = b;
  return p->lo < q->lo ? -1 : p->lo > q->lo;
}

/* Whether the n records' non-empty shards cover [0, d) exactly once. */
static int shards_tile(const uint64_t *all, int n, uint64_t d, span64 *s) {
  int m = 0;
  for (int p = 0; p < n; p++)
    if (all[(size_t)p * R_N + R_WIDTH]) {
      s[m].lo = all[(size_t)p * R_N + R_OFFSET];
      s[m++].n = all[(size_t)p * R_N + R_WIDTH];
    }
  qsort(s, (size_t)m, sizeof *s, by_offset);
  uint64_t at = 0;
  for (int i = 0; i < m; i++) {
    if (s[i].lo != at || s[i].n > d - at) return 0;
    at += s[i].n;
  }
  return at == d;
}

/* The exact verdict of the n ranks' gathered records, in the block's order
 * of precedence. spans: n. */
static rmsnorm_status records_verdict(const uint64_t *all, int n, int role, span64 *spans) {
  const int *sizes = shared_sizes[role];
  for (int p = 1; p < n; p++) {
    const uint64_t *r = all + (size_t)p * R_N;
    for (int i = 0; shared_options[i] >= 0; i++)
      if (r[shared_options[i]] != all[shared_options[i]]) return RMSNORM_ERROR_BAD_ARGUMENT;
  }
  for (int p = 1; p < n; p++)
    for (int i = 0; sizes[i] >= 0; i++)
      if (all[(size_t)p * R_N + sizes[i]] != all[sizes[i]]) return RMSNORM_ERROR_BAD_SIZE;
  for (int p = 1; p < n; p++)
    if (all[(size_t)p * R_N + R_DTYPES] != all[R_DTYPES]) return RMSNORM_ERROR_BAD_DTYPE;
  if (role == ROLE_COLUMNS && !shards_tile(all, n, all[R_DGLOBAL], spans))
    return RMSNORM_ERROR_BAD_SIZE;
  return RMSNORM_OK;
}

/* Room for the exact check's records, taken before the first collective so
 * that a rank without it fails like any other (up to 64 ranks on the stack). */
typedef struct gathered {
  uint64_t small[64 * R_N], *all;
  span64 small_spans[64], *spans;
} gathered;

static rmsnorm_status gathered_init(gathered *g, int n) {
  g->all = g->small;
  g->spans = g->small_spans;
  if (n <= 64) return RMSNORM_OK;
  g->all = malloc((size_t)n * R_N * sizeof *g->all);
  g->spans = malloc((size_t)n * sizeof *g->spans);
  return g->all && g->spans ? RMSNORM_OK : RMSNORM_ERROR_OUT_OF_MEMORY;
}

static void gathered_free(gathered *g) {
  if (g->all != g->small) free(g->all);
  if (g->spans != g->small_spans) free(g->spans);
}

/* The agreement of a communicator: this rank's block filled at a (the head:
 * `count` doubles, rows' sums after the block), one MPI_Allreduce of it, the
 * verdict, and with checks on any rank the exact check of the gathered
 * records. @return this rank's own status, else the verdict: the same on
 * every rank (but where an MPI call fails). */
static rmsnorm_status agree(double *a, int count, const call_info *c, rmsnorm_status own,
                            int role, MPI_Comm comm) {
  int n;
  if (MPI_Comm_size(comm, &n) != MPI_SUCCESS) return RMSNORM_ERROR_NOT_AVAILABLE;
  gathered g;
  if (gathered_init(&g, n) != RMSNORM_OK && own == RMSNORM_OK) own = RMSNORM_ERROR_OUT_OF_MEMORY;
  fill_block(a, c, role, own);
  rmsnorm_status v = RMSNORM_ERROR_NOT_AVAILABLE;
  if (MPI_Allreduce(MPI_IN_PLACE, a, count, MPI_DOUBLE, MPI_SUM, comm) == MPI_SUCCESS)
    v = block_verdict(a, n, c, role);
  if (v == RMSNORM_OK && tally_checks_on(a + AG_TALLY)) {
    uint64_t mine[R_N];
    fill_record(mine, c, role);
    v = MPI_Allgather(mine, R_N, MPI_UINT64_T, g.all, R_N, MPI_UINT64_T, comm) != MPI_SUCCESS
            ? RMSNORM_ERROR_NOT_AVAILABLE
            : records_verdict(g.all, n, role, g.spans);
  }
  gathered_free(&g);
  return own != RMSNORM_OK ? own : v;
}

/* The sums of n doubles over comm in place (MPI_SUM), in calls below INT_MAX
 * values. @return 0 or 1 when an MPI call failed. */
static int allreduce_sum(double *v, size_t n, MPI_Comm comm) {
  int failed = 0;
  for (size_t i = 0; i < n;) {
    int k = n - i > (size_t)INT_MAX ? INT_MAX : (int)(n - i);
    failed |= MPI_Allreduce(MPI_IN_PLACE, v + i, k, MPI_DOUBLE, MPI_SUM, comm) != MPI_SUCCESS;
    i += (size_t)k;
  }
  return failed;
}

/* The first collective of a call on comm, and the rest of its rows. sums:
 * AG_N + max(rows, HEAD_ROWS) doubles, this rank's partial sums at
 * sums + AG_N (zeros past rows; anything when its status is not OK); on
 * RMSNORM_OK they hold the sums over comm there.
 * @return as agree(). */
static rmsnorm_status agree_on_comm(double *sums, const call_info *c, MPI_Comm comm) {
  if (!RN_MPI_AGREEMENT) /* the sums alone */
    return c->status != RMSNORM_OK ? c->status
           : allreduce_sum(sums + AG_N, c->rows, comm) ? RMSNORM_ERROR_NOT_AVAILABLE
                                                      : RMSNORM_OK;
  rmsnorm_status v = agree(sums, HEAD_N, c, c->status, ROLE_COLUMNS, comm);
  if (v == RMSNORM_OK && c->rows > HEAD_ROWS &&
      allreduce_sum(sums + HEAD_N, c->rows - HEAD_ROWS, comm))
    v = RMSNORM_ERROR_NOT_AVAILABLE;
  return v;
}

/* The replicas' agreement (a backward's first collective on replicas): on
 * the call's columns, options and dtypes, and on every replica's status so
 * far (its own, or its columns' verdict). @return as agree(). */
static rmsnorm_status agree_on_replicas(const call_info *c, rmsnorm_status so_far,
                                        MPI_Comm replicas) {
  double a[AG_N];
  if (!RN_MPI_AGREEMENT) return so_far;
  return agree(a, AG_N, c, so_far, ROLE_REPLICAS, replicas);
}

/* Sums over comm after the ranks agreed (the backward's dots after
 * recomputed statistics), with every rank's status since: buf = a tally
 * (TALLY_N doubles), then n values. @return own when not OK, else the
 * tally's status (the same on every rank). */
enum { STATUS_N = TALLY_N };
static rmsnorm_status sums_with_status(double *buf, size_t n, rmsnorm_status own,
                                       MPI_Comm comm) {
  if (!RN_MPI_AGREEMENT)
    return own != RMSNORM_OK ? own
           : allreduce_sum(buf + STATUS_N, n, comm) ? RMSNORM_ERROR_NOT_AVAILABLE
                                                   : RMSNORM_OK;
  memset(buf, 0, STATUS_N * sizeof *buf);
  tally_add(buf, own);
  if (allreduce_sum(buf, STATUS_N + n, comm)) return RMSNORM_ERROR_NOT_AVAILABLE;
  return own != RMSNORM_OK ? own : tally_status(buf);
}

/* n doubles: `stack` (cap of them) when they fit, else from the heap (NULL
 * when out of memory). */
static double *doubles(double *stack, size_t cap, size_t n) {
  if (n <= cap) return stack;
  return n <= SIZE_MAX / sizeof(double) ? malloc(n * sizeof(double)) : NULL;
}

/* ---- replicas: the deterministic dweight/dbias sum -------------------------- */

/* Columns [begin(s), begin(s+1)) of n are summed by replica rank s. */
static size_t slice_begin(size_t n, int s, int nranks) {
  return (size_t)((uint64_t)n * (uint64_t)s / (uint64_t)nranks);
}

/* The deterministic sum of v (n doubles) over replicas: every value's terms are
 * added in double in replica rank order, by the rank that owns its slice, and
 * the slices are shared; v is replaced by the sums, the same bits on every
 * replica. Each slice travels with its sender's status (own), so every
 * replica sees every status and all skip the sharing alike when one failed.
 * send: n + nranks doubles; work: nranks * (n / nranks + 2) doubles; counts:
 * 4 * nranks ints. @return own when not OK, else the tally of the replicas'
 * statuses (RMSNORM_ERROR_NOT_AVAILABLE when an MPI call failed). */
static rmsnorm_status reduce_replicas(double *v, size_t n, rmsnorm_status own, MPI_Comm replicas,
                                      int nranks, double *send, double *work, int *counts) {
  int me;
  if (nranks == 1) return own;
  if (MPI_Comm_rank(replicas, &me) != MPI_SUCCESS) return RMSNORM_ERROR_NOT_AVAILABLE;
  int *displs = counts + nranks, *rcounts = counts + 2 * nranks, *rdispls = counts + 3 * nranks;
  /* to replica s: [own status, v's slice s] */
  for (int s = 0; s < nranks; s++) {
    size_t b = slice_begin(n, s, nranks), e = slice_begin(n, s + 1, nranks);
    displs[s] = (int)(b + (size_t)s);
    counts[s] = (int)(e - b) + 1;
    send[displs[s]] = (double)own;
    memcpy(send + displs[s] + 1, v + b, (e - b) * sizeof *v);
  }
  int mine = counts[me];
  for (int p = 0; p < nranks; p++) {
    rcounts[p] = mine;
    rdispls[p] = p * mine;
  }
  if (MPI_Alltoallv(send, counts, displs, MPI_DOUBLE, work, rcounts, rdispls, MPI_DOUBLE,
                    replicas) != MPI_SUCCESS)
    return RMSNORM_ERROR_NOT_AVAILABLE;
  double tally[TALLY_N] = {0, 0, 0};
  for (int p = 0; p < nranks; p++)
    tally_add(tally, (rmsnorm_status)work[(size_t)p * (size_t)mine]);
  rmsnorm_status st = tally_status(tally);
  if (st != RMSNORM_OK) return own != RMSNORM_OK ? own : st;
  /* the owner's sums, in replica rank order, then shared */
  for (int s = 0; s < nranks; s++) {
    displs[s] -= s;
    counts[s] -= 1;
  }
  double *out = v + displs[me];
  for (int i = 1; i < mine; i++) {
    double t = work[i];
    for (int p = 1; p < nranks; p++) t += work[(size_t)p * (size_t)mine + (size_t)i];
    out[i - 1] = t;
  }
  return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v, counts, displs, MPI_DOUBLE,
                        replicas) != MPI_SUCCESS
             ? RMSNORM_ERROR_NOT_AVAILABLE
             : RMSNORM_OK;
}

/* ---- forward --------------------------------------------------------------- */

/* Everything rmsnorm_shard_stats and rmsnorm_shard_forward would refuse, and
 * stats as an output, before anything is written or sent; *cfgp is then the
 * checked copy (in *copy). */
static rmsnorm_status check_forward(const rmsnorm_context *ctx, const rmsnorm_config **cfgp,
                                    rmsnorm_config *copy, size_t rows, size_t d_global,
                                    size_t offset, size_t width, const void *x, size_t ldx,
                                    const void *weight, const void *bias, const void *y,
                                    size_t ldy, const double *stats, const void *rstd,
                                    MPI_Comm comm) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  if (comm == MPI_COMM_NULL) return RMSNORM_ERROR_BAD_ARGUMENT;
  rn_shard sh;
  size_t lds[2] = {ldx, ldy};
  rmsnorm_status st = rn_shard_check(cfgp, copy, &sh, rows, d_global, offset, width, lds, 2);
  if (st != RMSNORM_OK || rows == 0) return st;
  const rmsnorm_config *cfg = *cfgp;
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
  rmsnorm_config copy;
  call_info c = {OP_FORWARD, checks_on(), RMSNORM_OK, rows, d_global, offset, width, NULL,
                 stats ? OPT_STATS : 0u};
  c.status = check_forward(ctx, &cfg, &copy, rows, d_global, offset, width, x, ldx, weight,
                           bias, y, ldy, stats, rstd, comm);
  if (comm == MPI_COMM_NULL) return c.status;
  c.cfg = cfg;
  /* sums: (AG_N + rows,) the agreement block, then each row's statistic */
  double head[HEAD_N], *sums = head;
  if (c.status == RMSNORM_OK && rows > HEAD_ROWS &&
      !(sums = doubles(head, HEAD_N, AG_N + rows))) {
    sums = head;
    c.status = RMSNORM_ERROR_OUT_OF_MEMORY;
  }
  if (sums == head) memset(head + AG_N, 0, HEAD_ROWS * sizeof *head); /* zeros past rows */
  if (c.status == RMSNORM_OK && rows)
    c.status = rmsnorm_shard_stats(ctx, cfg, rows, d_global, offset, width, x, ldx, sums + AG_N);
  rmsnorm_status st = agree_on_comm(sums, &c, comm);
  if (st == RMSNORM_OK && rows) {
    if (stats) memcpy(stats, sums + AG_N, rows * sizeof *stats);
    st = rmsnorm_shard_forward(ctx, cfg, rows, d_global, offset, width, x, ldx, weight, bias,
                               sums + AG_N, y, ldy, rstd);
  }
  if (sums != head) free(sums);
  return st;
}

/* ---- backward -------------------------------------------------------------- */

static rmsnorm_status check_backward(const rmsnorm_context *ctx, const rmsnorm_config **cfgp,
                                     rmsnorm_config *copy, size_t rows, size_t d_global,
                                     size_t offset, size_t width, const void *x, size_t ldx,
                                     const void *dy, size_t lddy, const void *weight,
                                     const double *stats, const void *dx, size_t lddx,
                                     const void *dweight, const void *dbias, MPI_Comm comm,
                                     MPI_Comm replicas) {
  if (!ctx) return RMSNORM_ERROR_NULL_POINTER;
  if (comm == MPI_COMM_NULL) return RMSNORM_ERROR_BAD_ARGUMENT;
  rn_shard sh;
  size_t lds[3] = {ldx, lddy, lddx};
  rmsnorm_status st = rn_shard_check(cfgp, copy, &sh, rows, d_global, offset, width, lds, 3);
  if (st != RMSNORM_OK) return st;
  const rmsnorm_config *cfg = *cfgp;
  if (dweight && !weight) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (replicas != MPI_COMM_NULL && width > (size_t)INT_MAX / 4) return RMSNORM_ERROR_BAD_SIZE;
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

/* What a backward allocates, all before its first collective (an allocation
 * failure is then a status like any other, seen by every rank). */
typedef struct bwd_buffers {
  double *first;        /* (AG_N + rows,) the agreement block, then the first sums
                           exchanged: the statistics, or the dots when stats are given */
  double *second;       /* (STATUS_N + rows,) statuses, then the dots after recomputed
                           statistics */
  void *w, *grads;      /* replicas: weight in the compute type (width), the
                           local dweight|dbias sums in the compute type */
  double *sums, *send, *work; /* replicas: the values reduced, the exchange */
  int *counts;          /* replicas: 4 * nranks */
} bwd_buffers;

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
  int has_replicas = replicas != MPI_COMM_NULL, reduce = has_replicas && (dweight || dbias);
  rmsnorm_config copy;
  call_info c = {OP_BACKWARD, checks_on(), RMSNORM_OK, rows, d_global, offset, width, NULL,
                 (stats ? OPT_STATS : 0u) | (dweight ? OPT_DWEIGHT : 0u) |
                     (dbias ? OPT_DBIAS : 0u)};
  c.status = check_backward(ctx, &cfg, &copy, rows, d_global, offset, width, x, ldx, dy, lddy,
                            weight, stats, dx, lddx, dweight, dbias, comm, replicas);
  c.cfg = cfg;
  double head[HEAD_N], tail[HEAD_N];
  bwd_buffers b = {head, tail, NULL, NULL, NULL, NULL, NULL, NULL};
  int nranks = 1, failed = 0;
  size_t nvec = (dweight != NULL) + (dbias != NULL), n = width * nvec;
  if (c.status == RMSNORM_OK) {
    if (!(b.first = doubles(head, HEAD_N, AG_N + rows))) failed = 1;
    if (!stats && !(b.second = doubles(tail, HEAD_N, STATUS_N + rows))) failed = 1;
    if (reduce) {
      if (MPI_Comm_size(replicas, &nranks) != MPI_SUCCESS) c.status = RMSNORM_ERROR_NOT_AVAILABLE;
      else if (n + (size_t)nranks > (size_t)INT_MAX) c.status = RMSNORM_ERROR_BAD_SIZE;
      size_t as = rn_acc_size(cfg->dtype);
      if (weight) b.w = alloc_n(width, as, &failed);
      b.grads = alloc_n(n, as, &failed);
      b.sums = alloc_n(n, sizeof(double), &failed);
      b.send = alloc_n(n + (size_t)nranks, sizeof(double), &failed);
      b.work = alloc_n((size_t)nranks * (n / (size_t)nranks + 2), sizeof(double), &failed);
      b.counts = alloc_n(4 * (size_t)nranks, sizeof(int), &failed);
    }
    if (failed && c.status == RMSNORM_OK) c.status = RMSNORM_ERROR_OUT_OF_MEMORY;
  }
  if (!b.first) b.first = head;
  if (!b.second) b.second = tail;
  if (b.first == head) memset(head + AG_N, 0, HEAD_ROWS * sizeof *head); /* zeros past rows */

  /* the first sums and the agreement on comm: the statistics when they are
   * recomputed, else the dots */
  rmsnorm_status st = c.status;
  double *first = b.first + AG_N;
  if (comm != MPI_COMM_NULL) {
    if (c.status == RMSNORM_OK && rows)
      c.status = stats ? rmsnorm_shard_backward_dots(ctx, cfg, rows, d_global, offset, width, x,
                                                     ldx, dy, lddy, weight, stats, first)
                       : rmsnorm_shard_stats(ctx, cfg, rows, d_global, offset, width, x, ldx,
                                             first);
    st = agree_on_comm(b.first, &c, comm);
  }
  /* the replicas agree before anything is written; the verdicts of their
   * columns are part of it */
  rmsnorm_status st_rep = has_replicas ? agree_on_replicas(&c, st, replicas) : RMSNORM_OK;
  const double *s = stats ? stats : first, *dots = first;
  if (!stats && st == RMSNORM_OK && rows) { /* every rank of comm: its verdict was theirs */
    rmsnorm_status own = rmsnorm_shard_backward_dots(ctx, cfg, rows, d_global, offset, width, x,
                                                     ldx, dy, lddy, weight, s,
                                                     b.second + STATUS_N);
    dots = b.second + STATUS_N;
    st = sums_with_status(b.second, rows, own, comm);
  }
  if (!reduce || st_rep != RMSNORM_OK) {
    if (st == RMSNORM_OK && st_rep == RMSNORM_OK && rows)
      st = rmsnorm_shard_backward(ctx, cfg, rows, d_global, offset, width, x, ldx, dy, lddy,
                                  weight, s, dots, dx, lddx, dweight, dbias);
    if (st == RMSNORM_OK) st = st_rep;
    goto done;
  }

  /* replicas (which all agreed): this rank's sums in the compute type
   * (weight and sums in the compute type's dtype, never rounded to a 16-bit
   * param dtype); each replica enters the exchange whatever happened to it
   * since, and its status travels with its sums */
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
                                b.w, s, dots, dx, lddx, gw, gb);
  if (st == RMSNORM_OK)
    for (size_t i = 0; i < n; i++) b.sums[i] = rn_load_acc(b.grads, f64, i);
  st = reduce_replicas(b.sums, n, st, replicas, nranks, b.send, b.work, b.counts);
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
done:
  if (b.first != head) free(b.first);
  if (b.second != tail) free(b.second);
  free(b.w);
  free(b.grads);
  free(b.sums);
  free(b.send);
  free(b.work);
  free(b.counts);
  return st;
}
