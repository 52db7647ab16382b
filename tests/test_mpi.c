/* test_mpi.c - librmsnorm_mpi under mpirun (ctest runs it on 2 and 3 ranks).
 * Every rank builds the same tensors from the same seed, computes the
 * unsharded result with rmsnorm_forward/backward, and checks its own columns
 * of rmsnorm_mpi_forward/backward against it (bits where docs/sharding.md promises
 * them, else the stated bounds: tests/shardcmp.h), for every dtype and the
 * main options, over even, uneven, block-aligned and rank-reversed cuts with a
 * width-0 shard; then replicas (rows split across ranks): dweight/dbias the
 * same bits on every rank and equal to the documented rank-order sum; then,
 * with checks on every rank, on none and on rank 0 only, ranks that disagree
 * get an error on every rank and nothing is written, while equal arguments
 * written differently (eps 0 and -0) agree; and the statistics recomputed in
 * the backward give the same bits as saved ones. */
#include <mpi.h>

#include "rmsnorm_mpi.h"
#include "shardcmp.h"
#include "testutil.h"

static rmsnorm_context *ctx;
static int rank, nranks;

/* ---- layouts --------------------------------------------------------------------- */

enum { LAY_EVEN, LAY_ALIGNED, LAY_ZERO, LAY_REVERSED, LAY_KINDS };
static const char *lay_names[] = {"even", "aligned", "rank 0 empty", "reversed"};

/* Cuts of [0, d) into nranks shards (c[0..nranks]) and the shard each rank
 * holds. */
static void layout(int kind, size_t d, rmsnorm_dtype dt, size_t *c, int *shard_of) {
  for (int p = 0; p <= nranks; p++) c[p] = d * (size_t)p / (size_t)nranks;
  for (int p = 0; p < nranks; p++) shard_of[p] = p;
  if (kind == LAY_ALIGNED) /* block multiples, the rest to the last rank */
    for (int p = 1; p < nranks; p++) {
      size_t at = block_of(dt) * (size_t)p;
      c[p] = at < d ? at : d;
    }
  if (kind == LAY_ZERO) c[1] = 0; /* rank 0 holds no column */
  if (kind == LAY_REVERSED)
    for (int p = 0; p < nranks; p++) shard_of[p] = nranks - 1 - p;
}

/* Whether every rank holds the same bytes. */
static int same_on_all_ranks(const void *p, size_t bytes) {
  unsigned char *mine = malloc(bytes ? bytes : 1), *lo = malloc(bytes ? bytes : 1);
  memcpy(mine, p, bytes);
  MPI_Allreduce(mine, lo, (int)bytes, MPI_UNSIGNED_CHAR, MPI_MIN, MPI_COMM_WORLD);
  int same = memcmp(mine, lo, bytes) == 0, all;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  free(mine);
  free(lo);
  return all;
}

/* ---- the sharded hidden dimension against the unsharded library ---------------- */

typedef struct mcase {
  rmsnorm_dtype dt, pdt;
  size_t rows, d;
  int weight, bias, outside, round_first, accumulate, inplace, lay;
  double eps, partial;
} mcase;

static void run_case(const mcase *c) {
  char what[256];
  snprintf(what, sizeof what, "rank %d/%d: %s pdt=%s rows=%zu d=%zu %s w=%d b=%d out=%d p=%g "
           "rf=%d acc=%d ip=%d", rank, nranks, tu_dtype_name(c->dt), tu_dtype_name(c->pdt),
           c->rows, c->d, lay_names[c->lay], c->weight, c->bias, c->outside, c->partial,
           c->round_first, c->accumulate, c->inplace);
  rmsnorm_dtype dt = c->dt, pdt = c->pdt;
  size_t rows = c->rows, d = c->d, ps = rn_dtype_size(pdt);
  size_t as = rn_acc_size(dt);
  size_t cuts[8];
  int shard_of[8];
  layout(c->lay, d, dt, cuts, shard_of);
  size_t o = cuts[shard_of[rank]], wd = cuts[shard_of[rank] + 1] - o;
  int bitwise = promises_bits(dt, cuts, (size_t)nranks + 1);

  /* the same tensors on every rank */
  tu_tensor x = tu_alloc(dt, rows, d, d), dy = tu_alloc(dt, rows, d, d);
  tu_fill_normal(&x, 1.0);
  for (size_t i = 0; i < rows; i++) tu_set(&x, i, (5 * d) / 7, 30 * tu_normal());
  tu_fill_normal(&dy, 1.0);
  tu_tensor w = tu_alloc(pdt, 1, d, d), b = tu_alloc(pdt, 1, d, d), g0 = tu_alloc(pdt, 2, d, d);
  double *weff = malloc(d * sizeof(double));
  for (size_t j = 0; j < d; j++) {
    tu_set(&w, 0, j, c->weight == 2 ? 0.1 * tu_normal() : 1 + 0.3 * tu_normal());
    tu_set(&b, 0, j, 0.5 * tu_normal());
    tu_set(&g0, 0, j, c->accumulate ? tu_normal() : 0);
    tu_set(&g0, 1, j, c->accumulate ? tu_normal() : 0);
    weff[j] = (c->weight == 2 ? 1 : 0) + tu_get(&w, 0, j);
  }
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, dt);
  cfg.param_dtype = pdt;
  cfg.eps = 1e-5;
  cfg.partial = c->partial;
  cfg.flags = (c->outside ? RMSNORM_FLAG_EPS_OUTSIDE : 0) |
              (c->weight == 2 ? RMSNORM_FLAG_WEIGHT_OFFSET : 0) |
              (c->round_first ? RMSNORM_FLAG_ROUND_BEFORE_WEIGHT : 0) |
              (c->accumulate ? RMSNORM_FLAG_ACCUMULATE : 0);
  const void *wp = c->weight ? w.data : NULL, *bp = c->bias ? b.data : NULL;

  /* unsharded */
  tu_tensor y0 = tu_alloc(dt, rows, d, d), dx0 = tu_alloc(dt, rows, d, d);
  tu_tensor g1 = tu_alloc(pdt, 2, d, d); /* dweight row 0, dbias row 1 */
  memcpy(g1.data, g0.data, g0.bytes);
  void *r0 = malloc(rows * as), *r1 = malloc(rows * as);
  TU_OK(rmsnorm_forward(ctx, &cfg, rows, d, x.data, d, wp, bp, y0.data, d, r0));
  TU_OK(rmsnorm_backward(ctx, &cfg, rows, d, x.data, d, dy.data, d, wp, NULL, dx0.data, d,
                         wp ? g0.data : NULL, (char *)g0.data + d * ps));

  /* this rank's shard: its own copies of its columns (ld = width + 1) */
  size_t ld = wd + 1;
  tu_tensor xs = tu_alloc(dt, rows, wd, ld), dys = tu_alloc(dt, rows, wd, ld);
  tu_tensor ys = tu_alloc(dt, rows, wd, ld), dxs = tu_alloc(dt, rows, wd, ld);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < wd; j++) {
      tu_set(&xs, i, j, tu_get(&x, i, o + j));
      tu_set(&dys, i, j, tu_get(&dy, i, o + j));
    }
  if (c->inplace) memcpy(ys.data, xs.data, xs.bytes), memcpy(dxs.data, dys.data, dys.bytes);
  tu_tensor gs = tu_alloc(pdt, 2, wd, wd ? wd : 1);
  for (size_t j = 0; j < wd; j++)
    tu_set(&gs, 0, j, tu_get(&g1, 0, o + j)), tu_set(&gs, 1, j, tu_get(&g1, 1, o + j));
  double *stats = malloc(rows * sizeof(double));
  const void *ws = wp ? (const char *)wp + o * ps : NULL, *bs = bp ? (const char *)bp + o * ps : NULL;
  void *dws = wp ? gs.data : NULL, *dbs = (char *)gs.data + wd * ps;
  TU_OK(rmsnorm_mpi_forward(ctx, &cfg, rows, d, o, wd, c->inplace ? ys.data : xs.data, ld, ws, bs,
                            ys.data, ld, stats, r1, MPI_COMM_WORLD));
  TU_OK(rmsnorm_mpi_backward(ctx, &cfg, rows, d, o, wd, xs.data, ld,
                             c->inplace ? dxs.data : dys.data, ld, ws, stats, dxs.data, ld, dws,
                             dbs, MPI_COMM_WORLD, MPI_COMM_NULL));

  tu_check(same_on_all_ranks(stats, rows * sizeof(double)) &&
           same_on_all_ranks(r1, rows * as), "%s: statistics or rstd differ between ranks", what);
  if (cmp_rstd(what, dt, bitwise, rows, r0, r1) &&
      cmp_y(what, dt, bitwise, c->round_first, c->bias, rows, o, o + wd, x.data, d,
            c->weight ? weff : NULL, r0, y0.data, d, ys.data, ld) &&
      cmp_grad(what, "dx", dt, bitwise, rows, o, o + wd, dx0.data, d, dxs.data, ld,
               grad_scale(dt, rows, d, dx0.data, d))) {
    if (wp)
      cmp_grad(what, "dweight", pdt, bitwise, 1, o, o + wd, g0.data, d, gs.data, wd,
               grad_scale(pdt, 1, d, g0.data, d));
    cmp_grad(what, "dbias", pdt, bitwise, 1, o, o + wd, (char *)g0.data + d * ps, d, dbs, wd,
             grad_scale(pdt, 1, d, (char *)g0.data + d * ps, d));
  }

  /* the backward without saved statistics recomputes the same ones */
  if (!c->inplace && !c->accumulate) {
    tu_tensor dx2 = tu_alloc(dt, rows, wd, ld);
    TU_OK(rmsnorm_mpi_backward(ctx, &cfg, rows, d, o, wd, xs.data, ld, dys.data, ld, ws, NULL,
                               dx2.data, ld, NULL, NULL, MPI_COMM_WORLD, MPI_COMM_NULL));
    tu_check(memcmp(dx2.data, dxs.data, dxs.bytes) == 0, "%s: dx with recomputed statistics "
             "differs", what);
    tu_free(&dx2);
  }
  free(stats), free(weff), free(r0), free(r1);
  tu_free(&x), tu_free(&dy), tu_free(&w), tu_free(&b), tu_free(&g0), tu_free(&g1);
  tu_free(&y0), tu_free(&dx0), tu_free(&xs), tu_free(&dys), tu_free(&ys), tu_free(&dxs);
  tu_free(&gs);
}

static void test_against_unsharded(void) {
  static const size_t sizes[] = {1000, 4096, 5120};
  size_t n = 0;
  for (int dt = 0; dt < 4; dt++)
    for (size_t si = 0; si < 3; si++)
      for (int lay = 0; lay < LAY_KINDS; lay++)
        for (int v = 0; v < 3; v++) {
          n++;
          int pd = n % 3 == 0 && dt != RMSNORM_F32;
          mcase c = {(rmsnorm_dtype)dt, pd ? RMSNORM_F32 : (rmsnorm_dtype)dt, 17, sizes[si],
                     (int)(n % 3), v != 1, v == 2, v == 1 && dt != 0 && dt != 3, n % 4 == 1,
                     n % 5 == 2, lay, 1e-5, v == 2 ? 0.5 : 1.0};
          run_case(&c);
        }
  /* row counts around the rows the first collective carries with the
   * agreement (the others follow in a second one), and rows 0 */
  static const size_t row_counts[] = {0, 1, 5, 6, 7, 8, 9, 52, 130, 300};
  for (size_t i = 0; i < sizeof row_counts / sizeof *row_counts; i++, n++) {
    mcase c = {i % 2 ? RMSNORM_BF16 : RMSNORM_F32, RMSNORM_F32, row_counts[i], 2048,
               1, 1, 0, 0, 0, i % 3 == 2, (int)(i % LAY_KINDS), 1e-5, 1.0};
    run_case(&c);
  }
  if (rank == 0) {
    printf("against unsharded: %zu cases on %d ranks; largest differences where bits are not "
           "promised (rstd, y without bias, in ulps):", n, nranks);
    for (int dt = 0; dt < 4; dt++)
      printf(" %s %g, %g;", tu_dtype_name((rmsnorm_dtype)dt), cmp_worst_r[dt], cmp_worst_y[dt]);
    printf("\n");
  }
}

/* ---- replicas: rows split across ranks, dweight/dbias summed over them -------- */

/* comm = each rank alone (the whole row), replicas = every rank: rank p holds
 * rows [rows*p/n, rows*(p+1)/n). The result must be the same bits on every
 * rank, equal to the documented order rebuilt here: each replica's sums in
 * the compute type (rmsnorm_backward with an fp32 / fp64 param dtype on its
 * rows), added in double in rank order, rounded once to the param dtype. */
static void test_replicas(void) {
  const size_t rows = 300, d = 777;
  for (int dt = 0; dt < 4; dt++)
    for (int acc = 0; acc < 2; acc++) {
      char what[128];
      snprintf(what, sizeof what, "rank %d: replicas %s acc=%d", rank,
               tu_dtype_name((rmsnorm_dtype)dt), acc);
      rmsnorm_dtype pdt = (rmsnorm_dtype)dt;
      size_t ps = rn_dtype_size(pdt);
      tu_tensor x = tu_alloc(pdt, rows, d, d), dy = tu_alloc(pdt, rows, d, d);
      tu_tensor dx = tu_alloc(pdt, rows, d, d), w = tu_alloc(pdt, 1, d, d);
      tu_tensor g = tu_alloc(pdt, 2, d, d), g0 = tu_alloc(pdt, 2, d, d);
      tu_fill_normal(&x, 1.0);
      tu_fill_normal(&dy, 1.0);
      for (size_t j = 0; j < d; j++) {
        tu_set(&w, 0, j, 1 + 0.3 * tu_normal());
        tu_set(&g0, 0, j, acc ? tu_normal() : 0);
        tu_set(&g0, 1, j, acc ? tu_normal() : 0);
      }
      memcpy(g.data, g0.data, g0.bytes);
      rmsnorm_config cfg;
      rmsnorm_config_init(&cfg, pdt);
      cfg.flags = acc ? RMSNORM_FLAG_ACCUMULATE : 0;
      size_t r0 = rows * (size_t)rank / (size_t)nranks, r1 = rows * (size_t)(rank + 1) / (size_t)nranks;
      const char *xr = (const char *)x.data + r0 * d * ps, *dyr = (const char *)dy.data + r0 * d * ps;
      TU_OK(rmsnorm_mpi_backward(ctx, &cfg, r1 - r0, d, 0, d, xr, d, dyr, d, w.data, NULL,
                                 dx.data, d, g.data, (char *)g.data + d * ps, MPI_COMM_SELF,
                                 MPI_COMM_WORLD));
      tu_check(same_on_all_ranks(g.data, 2 * d * ps), "%s: dweight/dbias differ between ranks",
               what);

      /* the documented order, rebuilt from the unsharded library */
      rmsnorm_config local = cfg;
      local.param_dtype = dt == RMSNORM_F64 ? RMSNORM_F64 : RMSNORM_F32;
      local.flags = 0;
      size_t ls = rn_dtype_size(local.param_dtype);
      tu_tensor wl = tu_alloc(local.param_dtype, 1, d, d), gl = tu_alloc(local.param_dtype, 2, d, d);
      for (size_t j = 0; j < d; j++) tu_set(&wl, 0, j, tu_get(&w, 0, j));
      double *sum = calloc(2 * d, sizeof(double));
      tu_tensor scratch = tu_alloc(pdt, rows, d, d);
      for (int p = 0; p < nranks; p++) {
        size_t a = rows * (size_t)p / (size_t)nranks, e = rows * (size_t)(p + 1) / (size_t)nranks;
        TU_OK(rmsnorm_backward(ctx, &local, e - a, d, (const char *)x.data + a * d * ps, d,
                               (const char *)dy.data + a * d * ps, d, wl.data, NULL,
                               scratch.data, d, gl.data, (char *)gl.data + d * ls));
        for (size_t j = 0; j < 2 * d; j++) {
          double v = rn_load(gl.data, local.param_dtype, j);
          sum[j] = p == 0 ? v : sum[j] + v;
        }
      }
      int exact = 1;
      for (size_t j = 0; j < 2 * d; j++) {
        double t = sum[j];
        if (acc) t += tu_get(&g0, j / d, j % d);
        double want; /* storage for one value of any dtype */
        rn_store(&want, pdt, 0, t);
        exact &= same_bits(&want, (char *)g.data + j * ps, ps);
      }
      tu_check(exact, "%s: not the rank-order sum of the replicas' sums", what);

      /* and within the backward bound of the unsharded library on all rows */
      TU_OK(rmsnorm_backward(ctx, &cfg, rows, d, x.data, d, dy.data, d, w.data, NULL,
                             scratch.data, d, g0.data, (char *)g0.data + d * ps));
      cmp_grad(what, "dweight", pdt, 0, 1, 0, d, g0.data, d, g.data, d,
               grad_scale(pdt, 1, d, g0.data, d));
      cmp_grad(what, "dbias", pdt, 0, 1, 0, d, (char *)g0.data + d * ps, d,
               (char *)g.data + d * ps, d, grad_scale(pdt, 1, d, (char *)g0.data + d * ps, d));
      free(sum);
      tu_free(&x), tu_free(&dy), tu_free(&dx), tu_free(&w), tu_free(&g), tu_free(&g0);
      tu_free(&wl), tu_free(&gl), tu_free(&scratch);
    }
}

/* ---- disagreement: an error on every rank, nothing written, no hang ------------ */

/* Checks on every rank, off on every rank, or on for rank 0 only: the ranks
 * must find every disagreement alike whatever each one's setting. */
enum { CHECKS_ALL, CHECKS_NONE, CHECKS_RANK0, CHECKS_MODES };
static const char *mode_names[] = {"checks on", "checks off", "checks on rank 0 only"};

static void set_mode(int mode) {
  rmsnorm_mpi_set_checks(mode == CHECKS_ALL || (mode == CHECKS_RANK0 && rank == 0));
}

static void test_disagreement(int mode) {
  const size_t rows = 6, d = 100;
  size_t o = d * (size_t)rank / (size_t)nranks, wd = d * (size_t)(rank + 1) / (size_t)nranks - o;
  float x[600], y[600], dy[600], dx[600], w[100], dw[100];
  double stats[6];
  for (int i = 0; i < 600; i++) x[i] = (float)tu_normal(), dy[i] = 1;
  for (int i = 0; i < 100; i++) w[i] = 1;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_F32);
  set_mode(mode);
  for (int kind = 0; kind < 14; kind++) {
    rmsnorm_config c = cfg;
    size_t r = rows, dg = d, off = o, width = wd;
    const float *xp = x;
    const double *sp = stats;
    float *dwp = dw;
    rmsnorm_status want = RMSNORM_ERROR_BAD_SIZE;
    const char *name = "";
    int last = rank == nranks - 1;
    /* backward: 8-10 and 12-13 on every rank; 11: the last rank only */
    int backward = (kind >= 8 && kind != 11) || (kind == 11 && last);
    switch (kind) {
      case 0: name = "rows differ", r = last ? rows - 1 : rows; break;
      case 1: name = "d_global differs", dg = last ? d + 1 : d; break;
      case 2: name = "widths short of d_global", width = last ? wd - 1 : wd; break;
      case 3: name = "shards overlap", off = last ? 0 : o; break;
      case 4: name = "dtype differs", want = RMSNORM_ERROR_BAD_DTYPE;
        if (last) c.dtype = c.param_dtype = RMSNORM_BF16;
        break;
      case 5: name = "eps differs", want = RMSNORM_ERROR_BAD_ARGUMENT;
        if (last) c.eps = 1e-3;
        break;
      case 6: name = "NULL x on one rank", want = RMSNORM_ERROR_NULL_POINTER;
        if (last) xp = NULL;
        break;
      case 7: name = "shard past the row", width = last ? wd + 1 : wd; break;
      case 8: name = "saved statistics on some ranks", want = RMSNORM_ERROR_BAD_ARGUMENT;
        if (last) sp = NULL;
        break;
      case 9: name = "dweight on some replicas", want = RMSNORM_ERROR_BAD_ARGUMENT;
        if (last) dwp = NULL;
        break;
      case 10: name = "rows differ (backward)", r = last ? rows - 2 : rows; break;
      case 11: name = "forward on some ranks, backward on another";
        want = RMSNORM_ERROR_BAD_ARGUMENT;
        break;
      case 12: name = "replicas disagree on the width";
        if (last) dg = d - 1; /* its own row: columns [0, d - 1) */
        break;
      default: name = "flags differ (backward)", want = RMSNORM_ERROR_BAD_ARGUMENT;
        if (last) c.flags = RMSNORM_FLAG_EPS_OUTSIDE;
        break;
    }
    memset(y, 0x55, sizeof y);
    memset(dx, 0x55, sizeof dx);
    memset(dw, 0x55, sizeof dw);
    memset(stats, 0x55, sizeof stats);
    rmsnorm_status st;
    if (!backward) {
      st = rmsnorm_mpi_forward(ctx, &c, r, dg, off, width, xp ? xp + off : NULL, d, w + off,
                               NULL, y + off, d, stats, NULL, MPI_COMM_WORLD);
    } else {
      for (int i = 0; i < 6; i++) stats[i] = 50;
      /* 9 and 12: every rank its own rows of the whole row, replicas = all */
      int reps = kind == 9 || kind == 12;
      if (reps) off = 0, width = dg;
      st = rmsnorm_mpi_backward(ctx, &c, r, dg, off, width, x + off, d, dy + off, d, w + off,
                                sp, dx + off, d, dwp, NULL, reps ? MPI_COMM_SELF : MPI_COMM_WORLD,
                                reps ? MPI_COMM_WORLD : MPI_COMM_NULL);
    }
    /* the rank whose own arguments are wrong may see its own status */
    int own = kind == 6 || kind == 7;
    int ok = st == want || (own && last && st != RMSNORM_OK);
    tu_check(ok, "rank %d, %s: %s: %s, want %s", rank, mode_names[mode], name,
             rmsnorm_status_name(st), rmsnorm_status_name(want));
    int clean = 1;
    for (int i = 0; i < 600; i++)
      clean &= rn_f32_bits(y[i]) == 0x55555555u && rn_f32_bits(dx[i]) == 0x55555555u;
    for (int i = 0; i < 100; i++) clean &= rn_f32_bits(dw[i]) == 0x55555555u;
    if (!backward) {
      double s55;
      memset(&s55, 0x55, sizeof s55);
      for (int i = 0; i < 6; i++) clean &= memcmp(&stats[i], &s55, sizeof s55) == 0;
    }
    tu_check(clean, "rank %d, %s: %s: output written on error", rank, mode_names[mode], name);
    /* and the next call works */
    st = rmsnorm_mpi_forward(ctx, &cfg, rows, d, o, wd, x + o, d, w + o, NULL, y + o, d, NULL,
                             NULL, MPI_COMM_WORLD);
    tu_check(st == RMSNORM_OK, "rank %d, %s: after %s: %s", rank, mode_names[mode], name,
             rmsnorm_status_name(st));
  }
  rmsnorm_mpi_set_checks(-1);
}

/* Equal arguments agree: eps 0 on some ranks and -0 on others is one value,
 * and gives the bits of eps 0 everywhere (forward, backward, replicas). */
static void test_signed_zero_eps(int mode) {
  const size_t rows = 5, d = 64;
  size_t o = d * (size_t)rank / (size_t)nranks, wd = d * (size_t)(rank + 1) / (size_t)nranks - o;
  float x[320], dy[320], w[64], y[2][320], dx[2][320], dw[2][64];
  double stats[2][5];
  for (int i = 0; i < 320; i++) x[i] = (float)tu_normal(), dy[i] = (float)tu_normal();
  for (int i = 0; i < 64; i++) w[i] = (float)(1 + 0.3 * tu_normal());
  memset(y, 0, sizeof y), memset(dx, 0, sizeof dx), memset(dw, 0, sizeof dw);
  set_mode(mode);
  for (int v = 0; v < 2; v++) { /* v = 0: eps +0 everywhere; v = 1: -0 on rank 0 */
    rmsnorm_config cfg;
    rmsnorm_config_init(&cfg, RMSNORM_F32);
    cfg.eps = v && rank == 0 ? -0.0 : 0.0;
    rmsnorm_status st = rmsnorm_mpi_forward(ctx, &cfg, rows, d, o, wd, x + o, d, w + o, NULL,
                                            y[v] + o, d, stats[v], NULL, MPI_COMM_WORLD);
    tu_check(st == RMSNORM_OK, "rank %d, %s: eps %g forward: %s", rank, mode_names[mode],
             cfg.eps, rmsnorm_status_name(st));
    st = rmsnorm_mpi_backward(ctx, &cfg, rows, d, o, wd, x + o, d, dy + o, d, w + o, stats[v],
                              dx[v] + o, d, NULL, NULL, MPI_COMM_WORLD, MPI_COMM_NULL);
    tu_check(st == RMSNORM_OK, "rank %d, %s: eps %g backward: %s", rank, mode_names[mode],
             cfg.eps, rmsnorm_status_name(st));
    /* replicas: every rank one row of the whole width */
    st = rmsnorm_mpi_backward(ctx, &cfg, 1, d, 0, d, x + 64 * (size_t)rank, d,
                              dy + 64 * (size_t)rank, d, w, NULL, dx[v] + 64 * (size_t)(rank + 1),
                              d, dw[v], NULL, MPI_COMM_SELF, MPI_COMM_WORLD);
    tu_check(st == RMSNORM_OK, "rank %d, %s: eps %g replicas: %s", rank, mode_names[mode],
             cfg.eps, rmsnorm_status_name(st));
  }
  tu_check(memcmp(y[0], y[1], sizeof y[0]) == 0 && memcmp(dx[0], dx[1], sizeof dx[0]) == 0 &&
           memcmp(dw[0], dw[1], sizeof dw[0]) == 0 && memcmp(stats[0], stats[1], sizeof stats[0]) == 0,
           "rank %d, %s: eps -0 on rank 0 does not give eps 0's bits", rank, mode_names[mode]);
  rmsnorm_mpi_set_checks(-1);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (nranks < 2 || nranks > 7) {
    if (rank == 0) fprintf(stderr, "test_mpi: run on 2 to 7 ranks\n");
    MPI_Finalize();
    return 2;
  }
  tu_seed(1414);
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) MPI_Abort(MPI_COMM_WORLD, 2);
  test_against_unsharded();
  test_replicas();
  for (int mode = 0; mode < CHECKS_MODES; mode++) {
    test_signed_zero_eps(mode);
    test_disagreement(mode);
  }
  rmsnorm_context_free(ctx);
  long counts[2] = {tu_checks, tu_failures}, total[2];
  MPI_Allreduce(counts, total, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  const char *check = getenv("RMSNORM_MPI_CHECK");
  if (rank == 0)
    printf("test_mpi on %d ranks (RMSNORM_MPI_CHECK=%s): %ld checks, %ld passed, %ld failed\n",
           nranks, check ? check : "unset", total[0], total[0] - total[1], total[1]);
  MPI_Finalize();
  return total[1] ? 1 : 0;
}
