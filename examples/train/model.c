/* model.c - the model's layout and life cycle: shape checks, the parameter
 * tensors and their initialization, activation offsets, the library context,
 * the flat parameter view for tests, and dispatch to the float or double
 * build of model_body.inc. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "fpmode.h"
#include "model_impl.h"

static const char *const norm_names[] = {"none", "layer", "rms", "prms"};

const char *train_norm_name(train_norm norm) {
  return (unsigned)norm < 4 ? norm_names[norm] : "?";
}

int train_norm_parse(const char *name, train_norm *norm) {
  for (int i = 0; i < 4; i++)
    if (strcmp(name, norm_names[i]) == 0) {
      *norm = (train_norm)i;
      return 0;
    }
  return -1;
}

void train_shape_default(train_shape *s) {
  s->batch = 16;
  s->seq_len = 128;
  s->layers = 4;
  s->dim = 128;
  s->heads = 4;
  s->norm = TRAIN_NORM_RMS;
  s->partial = 0.0625;
  s->eps = 1e-5;
}

double train_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double train_cpu_now(void) {
  struct timespec t;
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t)) return 0;
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void tm_fail(train_model *m, const char *what, rmsnorm_status st) {
  if (m->error) return;
  snprintf(m->error_buf, sizeof m->error_buf, "%s: %s", what, rmsnorm_status_message(st));
  m->error = m->error_buf;
}

/* A standard normal draw (Box-Muller on two uniforms in (0, 1)). */
static double normal(uint64_t *rng) {
  double u1 = ((double)(train_rand64(rng) >> 11) + 0.5) * 0x1p-53;
  double u2 = ((double)(train_rand64(rng) >> 11) + 0.5) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static int check_shape(const train_shape *s, char *err, size_t errlen) {
  const char *bad = NULL;
  if (s->batch < 1 || s->batch > 4096) bad = "batch must be 1..4096";
  else if (s->seq_len < 1 || s->seq_len > 4096) bad = "sequence length must be 1..4096";
  else if (s->layers < 1 || s->layers > 256) bad = "layers must be 1..256";
  else if (s->dim < 1 || s->dim > 8192) bad = "dim must be 1..8192";
  else if (s->heads < 1 || s->dim % s->heads != 0) bad = "heads must divide dim";
  else if ((unsigned)s->norm > TRAIN_NORM_PRMS) bad = "unknown norm";
  else if (!(s->eps >= 0) || !isfinite(s->eps)) bad = "eps must be finite and >= 0";
  else if (s->norm == TRAIN_NORM_PRMS && !(s->partial > 0 && s->partial <= 1))
    bad = "partial must be in (0, 1]";
  else {
    /* every BLAS dimension and leading dimension must fit an int */
    double n = (double)s->batch * s->seq_len;
    if (n * 4.0 * s->dim > 2147483647.0) bad = "batch * seq_len * 4 * dim too large";
  }
  if (bad) snprintf(err, errlen, "%s", bad);
  return bad ? -1 : 0;
}

static void add_tensor(train_model *m, const char *name, size_t size, int decay, int used,
                       int init, double std) {
  tm_tensor *t = &m->tensors[m->ntensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->offset = m->nparams;
  t->size = size;
  t->decay = decay;
  t->used = used;
  t->init = init;
  t->std = std;
  m->nparams += size;
  if (used) m->nparams_used += size;
}

/* The tensors in storage order. Gains are used by every norm but none;
 * biases of norms only by LayerNorm (RMSNorm has a gain only, as in the
 * paper). */
static void build_tensors(train_model *m) {
  const train_shape *s = &m->s;
  size_t C = (size_t)s->dim;
  int gain = s->norm != TRAIN_NORM_NONE, bias = s->norm == TRAIN_NORM_LAYER;
  double std = 0.02, res_std = 0.02 / sqrt(2.0 * s->layers);
  char name[24];
  add_tensor(m, "wte", TRAIN_VOCAB * C, 1, 1, 2, std);
  add_tensor(m, "wpe", (size_t)s->seq_len * C, 1, 1, 2, std);
  for (int l = 0; l < s->layers; l++) {
#define T(suffix, size, decay, used, init, sd)                 \
  snprintf(name, sizeof name, "l%d.%s", l, suffix);           \
  add_tensor(m, name, size, decay, used, init, sd)
    T("norm1.gain", C, 0, gain, 1, 0);
    T("norm1.bias", C, 0, bias, 0, 0);
    T("attn.qkv.w", C * 3 * C, 1, 1, 2, std);
    T("attn.qkv.b", 3 * C, 0, 1, 0, 0);
    T("attn.out.w", C * C, 1, 1, 2, res_std);
    T("attn.out.b", C, 0, 1, 0, 0);
    T("norm2.gain", C, 0, gain, 1, 0);
    T("norm2.bias", C, 0, bias, 0, 0);
    T("mlp.fc.w", C * 4 * C, 1, 1, 2, std);
    T("mlp.fc.b", 4 * C, 0, 1, 0, 0);
    T("mlp.proj.w", 4 * C * C, 1, 1, 2, res_std);
    T("mlp.proj.b", C, 0, 1, 0, 0);
#undef T
  }
  add_tensor(m, "normf.gain", C, 0, gain, 1, 0);
  add_tensor(m, "normf.bias", C, 0, bias, 0, 0);
}

/* Normal draws go tensor by tensor in storage order and are the same for
 * every norm (norm tensors take no draws), computed in double and rounded to
 * the model's type. */
static void init_params(train_model *m, uint64_t seed) {
  uint64_t rng = seed * 0x2545f4914f6cdd1dull + 0x1234567ull;
  for (int k = 0; k < m->ntensors; k++) {
    const tm_tensor *t = &m->tensors[k];
    for (size_t i = 0; i < t->size; i++) {
      double v = t->init == 2 ? t->std * normal(&rng) : (double)t->init;
      if (m->f64) ((double *)m->params)[t->offset + i] = v;
      else ((float *)m->params)[t->offset + i] = (float)v;
    }
  }
}

/* Lays out the saved activations: x0, then per block, then the final norm
 * and the logits. @return the element count. */
static size_t layout_acts(train_model *m) {
  const train_shape *s = &m->s;
  size_t N = (size_t)s->batch * s->seq_len, C = (size_t)s->dim, T = (size_t)s->seq_len;
  size_t at = 0;
#define TAKE(field, n) (field = at, at += (n))
  TAKE(m->x0, N * C);
  for (int l = 0; l < s->layers; l++) {
    tm_layer *L = &m->layer[l];
    TAKE(L->n1_y, N * C);
    TAKE(L->n1_mean, N);
    TAKE(L->n1_rstd, N);
    TAKE(L->qkv, N * 3 * C);
    TAKE(L->att, (size_t)s->batch * s->heads * T * T);
    TAKE(L->atty, N * C);
    TAKE(L->mid, N * C);
    TAKE(L->n2_y, N * C);
    TAKE(L->n2_mean, N);
    TAKE(L->n2_rstd, N);
    TAKE(L->fch, N * 4 * C);
    TAKE(L->fcg, N * 4 * C);
    TAKE(L->out, N * C);
  }
  TAKE(m->nf_y, N * C);
  TAKE(m->nf_mean, N);
  TAKE(m->nf_rstd, N);
  TAKE(m->logits, N * TRAIN_VOCAB);
  return at;
}

static size_t layout_scratch(train_model *m) {
  const train_shape *s = &m->s;
  size_t N = (size_t)s->batch * s->seq_len, C = (size_t)s->dim, T = (size_t)s->seq_len;
  size_t at = 0;
  TAKE(m->g_res, N * C);
  TAKE(m->g_y, N * C);
  TAKE(m->g_qkv, N * 3 * C);
  TAKE(m->g_atty, N * C);
  TAKE(m->g_fc, N * 4 * C);
  TAKE(m->g_att, (size_t)s->batch * s->heads * T * T);
#undef TAKE
  return at;
}

/* AdamW's tasks: each used tensor in chunks of at most TM_ADAM_CHUNK. */
static int build_chunks(train_model *m) {
  size_t n = 0;
  for (int k = 0; k < m->ntensors; k++)
    if (m->tensors[k].used) n += (m->tensors[k].size + TM_ADAM_CHUNK - 1) / TM_ADAM_CHUNK;
  size_t rows = (size_t)m->s.batch * m->s.seq_len;
  size_t nparts = n > rows / TM_ROWS + 1 ? n : rows / TM_ROWS + 1;
  m->adam = calloc(n, sizeof *m->adam);
  m->partials = calloc(nparts, sizeof *m->partials);
  if (!m->adam || !m->partials) return -1;
  for (int k = 0; k < m->ntensors; k++) {
    const tm_tensor *t = &m->tensors[k];
    if (!t->used) continue;
    for (size_t at = 0; at < t->size; at += TM_ADAM_CHUNK) {
      tm_chunk *c = &m->adam[m->nadam++];
      c->offset = t->offset + at;
      c->size = t->size - at < TM_ADAM_CHUNK ? t->size - at : TM_ADAM_CHUNK;
      c->decay = t->decay;
    }
  }
  return 0;
}

int train_model_create(const train_shape *shape, int use_f64, uint64_t seed, train_model **model,
                       char *err, size_t errlen) {
  *model = NULL;
  if (check_shape(shape, err, errlen)) return -1;
  train_model *m = calloc(1, sizeof *m);
  if (!m) goto oom;
  m->s = *shape;
  m->f64 = use_f64 != 0;
  m->esize = m->f64 ? sizeof(double) : sizeof(float);
  m->tensors = calloc((size_t)(4 + TM_PER_LAYER * shape->layers), sizeof *m->tensors);
  m->layer = calloc((size_t)shape->layers, sizeof *m->layer);
  if (!m->tensors || !m->layer) goto oom;
  build_tensors(m);
  size_t nacts = layout_acts(m), nscratch = layout_scratch(m);
  size_t N = (size_t)shape->batch * shape->seq_len;
  m->params = calloc(m->nparams, m->esize);
  m->grads = calloc(m->nparams, m->esize);
  m->adam_m = calloc(m->nparams, m->esize);
  m->adam_v = calloc(m->nparams, m->esize);
  m->acts = calloc(nacts, m->esize);
  m->scratch = calloc(nscratch, m->esize);
  m->inputs = calloc(N, 1);
  m->targets = calloc(N, 1);
  if (!m->params || !m->grads || !m->adam_m || !m->adam_v || !m->acts || !m->scratch ||
      !m->inputs || !m->targets)
    goto oom;
  init_params(m, seed);
  if (build_chunks(m)) goto oom;

  rmsnorm_status st = rmsnorm_context_create(&m->ctx);
  if (st == RMSNORM_OK) st = rmsnorm_config_init(&m->cfg, m->f64 ? RMSNORM_F64 : RMSNORM_F32);
  if (st != RMSNORM_OK) {
    snprintf(err, errlen, "librmsnorm: %s", rmsnorm_status_message(st));
    train_model_free(m);
    return -1;
  }
  m->cfg.eps = shape->eps;
  if (shape->norm == TRAIN_NORM_PRMS) m->cfg.partial = shape->partial;
  /* one thread until train_model_set_threads; the BLAS always runs on the
   * thread of the task that calls it */
#ifdef TRAIN_HAVE_OPENBLAS
  openblas_set_num_threads(1);
#endif
  if (train_model_set_threads(m, 1, 1)) {
    snprintf(err, errlen, "%s", m->error);
    train_model_free(m);
    return -1;
  }
  *model = m;
  return 0;
oom:
  snprintf(err, errlen, "out of memory");
  train_model_free(m);
  return -1;
}

void train_model_free(train_model *m) {
  if (!m) return;
  rmsnorm_context_free(m->ctx);
  train_pool_free(m->pool);
  free(m->adam);
  free(m->partials);
  free(m->tensors);
  free(m->layer);
  free(m->params);
  free(m->grads);
  free(m->adam_m);
  free(m->adam_v);
  free(m->acts);
  free(m->scratch);
  free(m->inputs);
  free(m->targets);
  free(m);
}

int train_model_set_threads(train_model *m, int threads, int norm_threads) {
  if (threads < 1 || threads > 1024 || norm_threads < 0 || norm_threads > 1024) {
    tm_fail(m, "train_model_set_threads", RMSNORM_ERROR_BAD_ARGUMENT);
    return -1;
  }
  if (!norm_threads) norm_threads = threads;
  rmsnorm_status st = rmsnorm_context_set_threads(m->ctx, norm_threads);
  if (st != RMSNORM_OK) {
    tm_fail(m, "rmsnorm_context_set_threads", st);
    return -1;
  }
  m->norm_threads = norm_threads;
  train_pool_free(m->pool);
  m->pool = NULL;
  if (threads > 1 && !(m->pool = train_pool_create(threads))) {
    snprintf(m->error_buf, sizeof m->error_buf, "could not start %d threads", threads);
    m->error = m->error_buf;
    return -1;
  }
  return 0;
}

long train_model_worker_tasks(const train_model *m) { return train_pool_worker_tasks(m->pool); }

/* The float model runs with subnormals flushed to zero (fpmode.h), the
 * double model in the caller's mode; the caller's mode is restored. */
static unsigned fp_enter(const train_model *m) {
  unsigned saved = train_fp_get();
  if (!m->f64) train_fp_set(saved | TRAIN_FP_FLUSH);
  return saved;
}

double train_model_forward(train_model *m, const uint8_t *inputs, const uint8_t *targets) {
  if (m->error) return NAN;
  unsigned saved = fp_enter(m);
  double loss = m->f64 ? tm_forward_f64(m, inputs, targets) : tm_forward_f32(m, inputs, targets);
  train_fp_set(saved);
  return loss;
}

int train_model_backward(train_model *m) {
  if (m->error) return -1;
  unsigned saved = fp_enter(m);
  int rc = m->f64 ? tm_backward_f64(m) : tm_backward_f32(m);
  train_fp_set(saved);
  return rc;
}

double train_model_step(train_model *m, double lr, double wd, double clip) {
  unsigned saved = fp_enter(m);
  double norm = m->f64 ? tm_step_f64(m, lr, wd, clip) : tm_step_f32(m, lr, wd, clip);
  train_fp_set(saved);
  return norm;
}

size_t train_model_num_params(const train_model *m) { return m->nparams_used; }

/* Flat index over the used tensors -> element of the parameter vector. */
static size_t flat_to_element(const train_model *m, size_t i, int *tensor) {
  for (int k = 0; k < m->ntensors; k++) {
    const tm_tensor *t = &m->tensors[k];
    if (!t->used) continue;
    if (i < t->size) {
      if (tensor) *tensor = k;
      return t->offset + i;
    }
    i -= t->size;
  }
  if (tensor) *tensor = -1;
  return (size_t)-1;
}

static double load(const train_model *m, const void *buf, size_t e) {
  return m->f64 ? ((const double *)buf)[e] : (double)((const float *)buf)[e];
}

double train_model_param(const train_model *m, size_t i) {
  size_t e = flat_to_element(m, i, NULL);
  return e == (size_t)-1 ? NAN : load(m, m->params, e);
}

void train_model_set_param(train_model *m, size_t i, double value) {
  size_t e = flat_to_element(m, i, NULL);
  if (e == (size_t)-1) return;
  if (m->f64) ((double *)m->params)[e] = value;
  else ((float *)m->params)[e] = (float)value;
}

double train_model_grad(const train_model *m, size_t i) {
  size_t e = flat_to_element(m, i, NULL);
  return e == (size_t)-1 ? NAN : load(m, m->grads, e);
}

const char *train_model_param_name(const train_model *m, size_t i) {
  int k;
  flat_to_element(m, i, &k);
  return k < 0 ? "?" : m->tensors[k].name;
}

double train_model_take_norm_seconds(train_model *m, double *cpu_seconds) {
  double s = m->norm_seconds;
  if (cpu_seconds) *cpu_seconds = m->norm_cpu_seconds;
  m->norm_seconds = m->norm_cpu_seconds = 0;
  return s;
}

const char *train_model_error(const train_model *m) { return m->error; }
