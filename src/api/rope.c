/* rope.c - the public entry points of QK-norm + rotary position embedding:
 * the table of cos and sin, the forward (with its optional KV-cache write)
 * and the backward (ref/rope_ref.inc is the spec: formulas, derivation,
 * rounding). The rows are QK-norm's [tokens, heads] grids (api/grid.h). */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/entry.h"
#include "api/grid.h"
#include "numerics/dtype.h"

/* The descriptors' first versions end after their last fields (rmsnorm_rope's
 * `norm` came after). */
#define RN_ROPE_SIZE_V1 (offsetof(rmsnorm_rope, positions) + sizeof(const int64_t *))
#define RN_KV_CACHE_SIZE_V1 (offsetof(rmsnorm_kv_cache, ldv_head) + sizeof(size_t))

/* ---- the table ---------------------------------------------------------- */

/* Frequencies per pass over the positions (their 1/theta^(2i/rot) on the
 * stack). */
#define ROPE_TABLE_FREQS 64

rmsnorm_status rmsnorm_rope_table(void *cos_sin, rmsnorm_dtype dtype, size_t n_positions,
                                  size_t rotary_dim, double theta, double linear_factor) {
  if (!cos_sin && n_positions) return RMSNORM_ERROR_NULL_POINTER;
  if (dtype != RMSNORM_F32 && dtype != RMSNORM_F64) return RMSNORM_ERROR_BAD_DTYPE;
  if (rotary_dim == 0) return RMSNORM_ERROR_BAD_SIZE;
  if (rotary_dim % 2 || !(theta > 1 && theta <= DBL_MAX) ||
      !(linear_factor > 0 && linear_factor <= DBL_MAX))
    return RMSNORM_ERROR_BAD_ROPE;
  size_t es = rn_dtype_size(dtype), half = rotary_dim / 2;
  if (n_positions > (size_t)PTRDIFF_MAX / es / rotary_dim) return RMSNORM_ERROR_BAD_SIZE;
  double inv[ROPE_TABLE_FREQS]; /* theta_i = theta^(-2i/rot) */
  for (size_t i0 = 0; i0 < half; i0 += ROPE_TABLE_FREQS) {
    size_t n = half - i0 < ROPE_TABLE_FREQS ? half - i0 : ROPE_TABLE_FREQS;
    for (size_t i = 0; i < n; i++)
      inv[i] = pow(theta, -(double)(2 * (i0 + i)) / (double)rotary_dim);
    for (size_t p = 0; p < n_positions; p++) {
      double pos = (double)p / linear_factor;
      for (size_t i = 0; i < n; i++) {
        double angle = pos * inv[i];
        rn_store(cos_sin, dtype, p * rotary_dim + i0 + i, cos(angle));
        rn_store(cos_sin, dtype, p * rotary_dim + half + i0 + i, sin(angle));
      }
    }
  }
  return RMSNORM_OK;
}

/* ---- descriptors and checks -------------------------------------------- */

/* Reads the caller's rope (versioned by size as rmsnorm_config) and checks
 * it against head_dim: rotary_dim 0 means head_dim. */
static rmsnorm_status read_rope(const rmsnorm_rope *user, size_t hd, rmsnorm_rope *r) {
  rmsnorm_status st = rn_read_versioned(user, r, sizeof *r, RN_ROPE_SIZE_V1);
  if (st != RMSNORM_OK) return st;
  if ((r->style != RMSNORM_ROPE_NEOX && r->style != RMSNORM_ROPE_GPTJ) ||
      (r->norm != RMSNORM_ROPE_NORM_HEAD && r->norm != RMSNORM_ROPE_NORM_TOKEN))
    return RMSNORM_ERROR_BAD_ROPE;
  if (r->rotary_dim == 0) r->rotary_dim = hd;
  if (r->rotary_dim % 2 || r->rotary_dim > hd) return RMSNORM_ERROR_BAD_ROPE;
  return RMSNORM_OK;
}

/* The config (with the rounding flags only this family takes) and the
 * rope, in the order of the status codes a bad call gets. */
static rmsnorm_status begin(rn_entry *e, rmsnorm_context *ctx, const rmsnorm_config **cfg,
                            unsigned refused, const rmsnorm_rope *rope, size_t hd,
                            rmsnorm_rope *r) {
  rmsnorm_status st = rn_entry_begin_own(e, ctx, cfg, RN_RMSNORM,
                                         refused | RMSNORM_FLAG_EPS_OUTSIDE, RN_ROPE_FLAGS, hd);
  if (st != RMSNORM_OK) return st;
  if ((*cfg)->partial != 1) return RMSNORM_ERROR_BAD_PARTIAL;
  return read_rope(rope, hd, r);
}

/* The table and the rows the tokens take from it (tokens > 0): a NULL table
 * is RMSNORM_ERROR_BAD_ARGUMENT, a position outside [0, n_positions)
 * RMSNORM_ERROR_OUT_OF_RANGE, a table larger than memory
 * RMSNORM_ERROR_BAD_SIZE. */
static rmsnorm_status check_positions(const rmsnorm_rope *r, size_t tokens, size_t as) {
  if (!r->cos_sin) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (r->n_positions > (size_t)PTRDIFF_MAX / as / r->rotary_dim) return RMSNORM_ERROR_BAD_SIZE;
  if (!r->positions) return tokens <= r->n_positions ? RMSNORM_OK : RMSNORM_ERROR_OUT_OF_RANGE;
  for (size_t t = 0; t < tokens; t++)
    if (r->positions[t] < 0 || (uint64_t)r->positions[t] >= (uint64_t)r->n_positions)
      return RMSNORM_ERROR_OUT_OF_RANGE;
  return RMSNORM_OK;
}

/* The statistic's values of one token (per token) or one row, the length
 * of the weight and dweight. */
static size_t norm_length(const rmsnorm_rope *r, size_t heads, size_t hd) {
  return r->norm == RMSNORM_ROPE_NORM_TOKEN ? heads * hd : hd;
}

static rn_span table_span(const rmsnorm_rope *r, size_t as) {
  return rn_vector(r->cos_sin, r->n_positions * r->rotary_dim, as);
}

/* The kernels' arguments common to both directions. */
static rn_rope_args rope_args(const rn_entry *e, const rmsnorm_rope *r, size_t heads, size_t hd,
                              const void *x, size_t ldx_t, size_t ldx_h) {
  rn_rope_args a;
  memset(&a, 0, sizeof a);
  a.dtype = e->cfg.dtype;
  a.d = hd, a.rot = r->rotary_dim, a.heads = heads;
  a.gptj = r->style == RMSNORM_ROPE_GPTJ;
  a.per_token = r->norm == RMSNORM_ROPE_NORM_TOKEN;
  a.x = x, a.ldx_t = ldx_t, a.ldx_h = ldx_h;
  a.w = e->weight;
  a.eps = e->cfg.eps;
  a.flags = e->cfg.flags;
  a.cos_sin = r->cos_sin;
  a.positions = r->positions;
  return a;
}

/* The cache's checks that need no other buffer: its grid of n_slots x heads
 * rows (the same strides for k and v), the V source's grid, the pointers,
 * and every slot below n_slots (else RMSNORM_ERROR_OUT_OF_RANGE). */
static rmsnorm_status check_cache(const rmsnorm_kv_cache *c, size_t tokens, size_t heads,
                                  size_t hd, size_t es) {
  rmsnorm_status st;
  if (c->n_slots &&
      (st = rn_check_grid(c->n_slots, heads, hd, c->ld_slot, c->ld_head, es)) != RMSNORM_OK)
    return st;
  if (c->v && (st = rn_check_grid(tokens, heads, hd, c->ldv_token, c->ldv_head, es)) != RMSNORM_OK)
    return st;
  if (!c->k || !c->slots || (c->v && !c->v_src)) return RMSNORM_ERROR_NULL_POINTER;
  for (size_t t = 0; t < tokens; t++)
    if (c->slots[t] >= 0 && (uint64_t)c->slots[t] >= (uint64_t)c->n_slots)
      return RMSNORM_ERROR_OUT_OF_RANGE;
  return RMSNORM_OK;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Whether two tokens have the same (non-negative) slot: the slots sorted in
 * `buf` (tokens values). */
static int slots_repeat(const int64_t *slots, size_t tokens, int64_t *buf) {
  size_t n = 0;
  for (size_t t = 0; t < tokens; t++)
    if (slots[t] >= 0) buf[n++] = slots[t];
  qsort(buf, n, sizeof *buf, cmp_i64);
  for (size_t i = 1; i < n; i++)
    if (buf[i] == buf[i - 1]) return 1;
  return 0;
}

/* ---- forward ------------------------------------------------------------ */

typedef struct rope_fwd_job {
  rn_rope_fwd_fn kernel;
  rn_rope_args args;
  size_t task_bytes;
  char *task_scratch;
  const rmsnorm_kv_cache *cache; /* the V copy: cache->v NULL for none */
  size_t row_bytes, es;
} rope_fwd_job;

/* Tokens [t0, t1): the kernel, then each token's V heads into its slot. */
static void rope_fwd_tokens(const void *p, size_t t0, size_t t1, int task) {
  const rope_fwd_job *job = p;
  job->kernel(&job->args, t0, t1, job->task_scratch + (size_t)task * job->task_bytes);
  const rmsnorm_kv_cache *c = job->cache;
  if (!c || !c->v) return;
  for (size_t t = t0; t < t1; t++) {
    if (c->slots[t] < 0) continue;
    size_t s = (size_t)c->slots[t];
    for (size_t h = 0; h < job->args.heads; h++)
      memcpy((char *)c->v + (s * c->ld_slot + h * c->ld_head) * job->es,
             (const char *)c->v_src + (t * c->ldv_token + h * c->ldv_head) * job->es,
             job->row_bytes);
  }
}

rmsnorm_status rmsnorm_qk_norm_rope_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                            size_t tokens, size_t heads, size_t head_dim,
                                            const void *x, size_t ldx_token, size_t ldx_head,
                                            const void *weight, const rmsnorm_rope *rope,
                                            const rmsnorm_kv_cache *cache, void *y,
                                            size_t ldy_token, size_t ldy_head, void *rstd) {
  rn_entry e;
  rmsnorm_rope r;
  rmsnorm_kv_cache kv;
  size_t rows;
  int flat;
  rmsnorm_status st = begin(&e, ctx, &cfg, RMSNORM_FLAG_ACCUMULATE, rope, head_dim, &r);
  if (st == RMSNORM_OK && cache)
    st = rn_read_versioned(cache, &kv, sizeof kv, RN_KV_CACHE_SIZE_V1);
  if (st != RMSNORM_OK) return st;
  if (tokens == 0 || heads == 0) return RMSNORM_OK;
  size_t es = e.es;
  size_t *const ld[2][2] = {{&ldx_token, &ldx_head}, {&ldy_token, &ldy_head}};
  if ((st = rn_check_grids(tokens, heads, head_dim, es, ld, y ? 2 : 1, &rows, &flat)) !=
      RMSNORM_OK)
    return st;
  if (cache && (st = check_cache(&kv, tokens, heads, head_dim, es)) != RMSNORM_OK)
    return st;
  if (!x || (!y && !cache)) return RMSNORM_ERROR_NULL_POINTER;
  if ((st = check_positions(&r, tokens, e.as)) != RMSNORM_OK) return st;
  size_t n_slots = cache ? kv.n_slots : 0, nparam = norm_length(&r, heads, head_dim);
  int per_token = r.norm == RMSNORM_ROPE_NORM_TOKEN;
  rn_buffers b = {
      .in = {rn_inplace(rn_grid(x, tokens, ldx_token, heads, ldx_head, head_dim, es)),
             table_span(&r, e.as), rn_vector(r.positions, tokens, sizeof(int64_t)),
             cache ? rn_vector(kv.slots, tokens, sizeof(int64_t)) : (rn_span){0},
             cache && kv.v ? rn_grid(kv.v_src, tokens, kv.ldv_token, heads, kv.ldv_head,
                                     head_dim, es)
                           : (rn_span){0}},
      .out = {y ? rn_grid(y, tokens, ldy_token, heads, ldy_head, head_dim, es) : (rn_span){0},
              rn_vector(rstd, per_token ? tokens : rows, e.as),
              n_slots ? rn_grid(kv.k, n_slots, kv.ld_slot, heads, kv.ld_head, head_dim, es)
                      : (rn_span){0},
              n_slots && kv.v
                  ? rn_grid(kv.v, n_slots, kv.ld_slot, heads, kv.ld_head, head_dim, es)
                  : (rn_span){0}},
      .weight = weight, .nparam = nparam};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;

  /* scratch: [weight copy][each task's row scratch][the sorted slots] */
  rn_entry_lock(&e);
  size_t cache_bytes = n_slots ? rows * head_dim * es * (kv.v ? 3 : 1) : 0;
  rn_split sp = rn_split_for(ctx, rows, rows * head_dim * 2 * es + cache_bytes, tokens);
  rope_fwd_job job;
  job.task_bytes = per_token ? RN_ROPE_TOKEN_SCRATCH(nparam, head_dim) : RN_ROPE_SCRATCH(head_dim);
  size_t tasks_bytes = (size_t)sp.tasks * job.task_bytes;
  if (!(job.task_scratch =
            rn_entry_scratch(&e, tasks_bytes + (cache ? tokens * sizeof(int64_t) : 0))))
    return rn_entry_unlock(&e, RMSNORM_ERROR_OUT_OF_MEMORY);
  if (cache && slots_repeat(kv.slots, tokens, (int64_t *)(job.task_scratch + tasks_bytes)))
    return rn_entry_unlock(&e, RMSNORM_ERROR_OVERLAP); /* two tokens, one cache row */
  job.kernel = e.kernels->rope_forward[cfg->dtype];
  job.args = rope_args(&e, &r, heads, head_dim, x, ldx_token, ldx_head);
  job.args.y = y, job.args.ldy_t = ldy_token, job.args.ldy_h = ldy_head;
  job.args.stream =
      !per_token && y && y != x && rn_stream_ok(1, y, es, rows * head_dim * es) != RN_CACHED;
  job.args.prefetch = 2 * rows * head_dim * es >= RN_DRAM_BYTES;
  job.args.past_l3 = 2 * rows * head_dim * es >= RN_PAST_L3_BYTES;
  job.args.rstd = rstd;
  if (cache) {
    job.args.k = kv.k, job.args.ldk_slot = kv.ld_slot, job.args.ldk_h = kv.ld_head;
    job.args.slots = kv.slots;
  }
  job.cache = cache ? &kv : NULL;
  job.row_bytes = head_dim * es;
  job.es = es;
  rn_run_rows(ctx, sp, tokens, rope_fwd_tokens, &job);
  return rn_entry_unlock(&e, RMSNORM_OK);
}

/* ---- backward ----------------------------------------------------------- */

typedef struct rope_bwd_job {
  rn_rope_bwd_fn kernel;
  rn_rope_args args;
  size_t task_bytes;
  char *task_scratch;
} rope_bwd_job;

static void rope_bwd_chunk(void *p, size_t t0, size_t t1, void *dw_part, void *db_part,
                           int task) {
  const rope_bwd_job *job = p;
  (void)db_part;
  job->kernel(&job->args, t0, t1, dw_part, job->task_scratch + (size_t)task * job->task_bytes);
}

rmsnorm_status rmsnorm_qk_norm_rope_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                             size_t tokens, size_t heads, size_t head_dim,
                                             const void *x, size_t ldx_token, size_t ldx_head,
                                             const void *dy, size_t lddy_token,
                                             size_t lddy_head, const void *weight,
                                             const rmsnorm_rope *rope, const void *rstd,
                                             void *dx, size_t lddx_token, size_t lddx_head,
                                             void *dweight) {
  rn_entry e;
  rmsnorm_rope r;
  size_t rows;
  int flat;
  rmsnorm_status st = begin(&e, ctx, &cfg, 0, rope, head_dim, &r);
  if (st != RMSNORM_OK) return st;
  if (dweight && !weight) return RMSNORM_ERROR_BAD_ARGUMENT;
  if (tokens == 0 || heads == 0) return RMSNORM_OK;
  size_t es = e.es;
  size_t *const ld[3][2] = {
      {&ldx_token, &ldx_head}, {&lddy_token, &lddy_head}, {&lddx_token, &lddx_head}};
  if ((st = rn_check_grids(tokens, heads, head_dim, es, ld, 3, &rows, &flat)) != RMSNORM_OK)
    return st;
  if (!x || !dy || !dx) return RMSNORM_ERROR_NULL_POINTER;
  if ((st = check_positions(&r, tokens, e.as)) != RMSNORM_OK) return st;
  size_t nparam = norm_length(&r, heads, head_dim);
  int per_token = r.norm == RMSNORM_ROPE_NORM_TOKEN;
  rn_buffers b = {
      .in = {rn_inplace(rn_grid(x, tokens, ldx_token, heads, ldx_head, head_dim, es)),
             rn_inplace(rn_grid(dy, tokens, lddy_token, heads, lddy_head, head_dim, es)),
             rn_vector(rstd, per_token ? tokens : rows, e.as), table_span(&r, e.as),
             rn_vector(r.positions, tokens, sizeof(int64_t))},
      .out = {rn_grid(dx, tokens, lddx_token, heads, lddx_head, head_dim, es),
              rn_vector(dweight, nparam, e.ps)},
      .weight = weight, .nparam = nparam};
  if ((st = rn_entry_check(&e, &b)) != RMSNORM_OK) return st;

  /* chunks of whole tokens as rmsnorm_qk_norm_backward's; per token, a
   * token is a row of the norm, chunked as rmsnorm_backward's rows (so its
   * dweight is that of rmsnorm_backward over [tokens, heads*head_dim]
   * rows, bit for bit); scratch: [weight copy][the reduction's sums][each
   * task's row scratch] */
  size_t nchunks, chunk_tokens = rn_token_chunks(tokens, per_token ? 1 : heads, &nchunks);
  rn_entry_lock(&e);
  rn_grad_plan plan;
  size_t task_bytes =
      per_token ? RN_ROPE_TOKEN_SCRATCH(nparam, head_dim) : RN_ROPE_SCRATCH(head_dim);
  char *sums = rn_entry_grad_scratch(&e, &plan, tokens, chunk_tokens, nparam, dweight, NULL,
                                     rn_split_for(ctx, rows, rows * head_dim * 3 * es, nchunks),
                                     task_bytes);
  if (!sums) return rn_entry_unlock(&e, RMSNORM_ERROR_OUT_OF_MEMORY);
  rope_bwd_job job;
  job.kernel = e.kernels->rope_backward[cfg->dtype];
  job.args = rope_args(&e, &r, heads, head_dim, x, ldx_token, ldx_head);
  job.args.dy = dy, job.args.lddy_t = lddy_token, job.args.lddy_h = lddy_head;
  job.args.dx = dx, job.args.lddx_t = lddx_token, job.args.lddx_h = lddx_head;
  job.args.stream =
      dx != x && dx != dy && rn_stream_ok(1, dx, es, rows * head_dim * es) != RN_CACHED;
  job.args.prefetch = 3 * rows * head_dim * es >= RN_DRAM_BYTES;
  job.args.rstd = (void *)(uintptr_t)rstd; /* read only in the backward */
  job.task_bytes = task_bytes;
  job.task_scratch = sums + plan.bytes;
  rn_grad_run(ctx, &plan, sums, rope_bwd_chunk, &job);
  return rn_entry_unlock(&e, RMSNORM_OK);
}
