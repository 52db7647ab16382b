/* model_impl.h - the model's insides, shared by model.c (layout, setup,
 * dispatch) and model_body.inc (the arithmetic, built once per REAL type).
 * Buffers are untyped here; offsets count elements of the model's REAL. */
#ifndef TRAIN_MODEL_IMPL_H
#define TRAIN_MODEL_IMPL_H

#include "model.h"
#include "pool.h"
#include "rmsnorm.h"

/* The fixed cut of a step into tasks (model_body.inc): rows per task, and
 * the side of a weight-gradient block. */
#define TM_ROWS 128
#define TM_TILE 64
#define TM_ADAM_CHUNK 16384

/* The parameter tensors of one block, in storage order. A norm's gain is
 * always followed by its bias. */
enum {
  TM_NORM1_GAIN, TM_NORM1_BIAS,
  TM_QKV_W, TM_QKV_B,   /* (C, 3C), (3C): q | k | v, each head's hd columns together */
  TM_ATTO_W, TM_ATTO_B, /* (C, C), (C): attention output projection */
  TM_NORM2_GAIN, TM_NORM2_BIAS,
  TM_FC_W, TM_FC_B,     /* (C, 4C), (4C) */
  TM_PROJ_W, TM_PROJ_B, /* (4C, C), (C) */
  TM_PER_LAYER
};
/* Tensor index: 0 wte (256, C), 1 wpe (T, C), then L blocks, then the final
 * norm's gain and bias. */
#define TM_WTE 0
#define TM_WPE 1
#define TM_LAYER(l, k) (2 + (l) * TM_PER_LAYER + (k))
#define TM_FINAL_GAIN(L) (2 + (L) * TM_PER_LAYER)

typedef struct tm_tensor {
  char name[24];
  size_t offset, size; /* in elements of the parameter vector */
  int decay;           /* AdamW weight decay applies (matrices) */
  int used;            /* takes part in this norm's model */
  int init;            /* 0: zeros, 1: ones, 2: normal(0, std) */
  double std;
} tm_tensor;

/* A piece of the parameter vector that one AdamW task updates. */
typedef struct tm_chunk {
  size_t offset, size;
  int decay;
} tm_chunk;

/* Offsets of one block's saved activations (N = B*T rows). */
typedef struct tm_layer {
  size_t n1_y, n1_mean, n1_rstd; /* norm1 output (N, C), statistics (N) */
  size_t qkv;                    /* (N, 3C) */
  size_t att;                    /* (B, H, T, T) softmax probabilities, 0 above the diagonal */
  size_t atty;                   /* (N, C) attention output before projection */
  size_t mid;                    /* (N, C) a_l = x_l + attention (the projection lands here) */
  size_t n2_y, n2_mean, n2_rstd;
  size_t fch, fcg;               /* (N, 4C) before and after GELU */
  size_t out;                    /* (N, C) x_{l+1} = a_l + MLP (the projection lands here) */
} tm_layer;

struct train_model {
  train_shape s;
  int f64;
  size_t esize; /* sizeof(REAL) */
  int ntensors;
  tm_tensor *tensors;
  size_t nparams;      /* all tensors, used or not */
  size_t nparams_used; /* the flat vector of train_model_param */
  void *params, *grads, *adam_m, *adam_v;
  long adam_t;
  void *acts;          /* every saved activation */
  size_t x0, nf_y, nf_mean, nf_rstd, logits; /* x0 (N, C); final norm; logits (N, 256) */
  tm_layer *layer;
  void *scratch;       /* backward's working buffers */
  size_t g_res, g_y, g_qkv, g_atty, g_fc; /* (N,C) (N,C) (N,3C) (N,C) (N,4C) */
  size_t g_att;                           /* (B, H, T, T): dS of every head */
  tm_chunk *adam;      /* the used tensors in chunks of at most TM_ADAM_CHUNK */
  int nadam;
  double *partials;    /* per-task sums (loss, squared gradient), added in order */
  train_pool *pool;    /* NULL: one thread */
  int norm_threads;    /* librmsnorm's threads, and the norm sites' adds' */
  uint8_t *inputs, *targets; /* the last forward's batch, N each */
  rmsnorm_context *ctx;
  rmsnorm_config cfg;
  double norm_seconds, norm_cpu_seconds; /* at the norm sites: wall, process CPU */
  const char *error;
  char error_buf[160];
};

/* Records the first library error (later ones keep the first message). */
void tm_fail(train_model *m, const char *what, rmsnorm_status st);

double tm_forward_f32(train_model *m, const uint8_t *inputs, const uint8_t *targets);
double tm_forward_f64(train_model *m, const uint8_t *inputs, const uint8_t *targets);
int tm_backward_f32(train_model *m);
int tm_backward_f64(train_model *m);
double tm_step_f32(train_model *m, double lr, double wd, double clip);
double tm_step_f64(train_model *m, double lr, double wd, double clip);

#endif /* TRAIN_MODEL_IMPL_H */
