/* model.h - a small decoder-only pre-norm transformer language model over
 * bytes, trained by hand-written forward/backward and AdamW, with every
 * normalization done by librmsnorm (public API only) and the matrix products
 * by a CBLAS (OpenBLAS). The same source is built for float and for double
 * (model_body.inc), so the gradients can be checked in fp64.
 *
 * The model, llm.c's GPT-2 in shape:
 *   x_0      = wte[token] + wpe[position]                     x: (N, C), N = B*T
 *   block l: a_l     = x_l + Attn(Norm1_l(x_l))               causal, H heads
 *            x_{l+1} = a_l + MLP(Norm2_l(a_l))                C -> 4C -> C, GELU (tanh)
 *   logits   = NormF(x_L) wte^T                               tied output, (N, 256)
 *   loss     = mean cross-entropy of the next byte
 * Norm is one of none (identity), LayerNorm (gain + bias), RMSNorm (gain) or
 * pRMSNorm (gain, statistic over the first ceil(p*C) channels). Where a norm
 * follows a residual add, RMSNorm/pRMSNorm use rmsnorm_add_forward/backward. */
#ifndef TRAIN_MODEL_H
#define TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define TRAIN_VOCAB 256 /* byte-level tokens */

typedef enum train_norm {
  TRAIN_NORM_NONE = 0,
  TRAIN_NORM_LAYER = 1,
  TRAIN_NORM_RMS = 2,
  TRAIN_NORM_PRMS = 3
} train_norm;

/* @return "none", "layer", "rms", "prms" (or "?"). */
const char *train_norm_name(train_norm norm);
/* Parses one of those names. @return 0 and *norm, or -1 for an unknown name. */
int train_norm_parse(const char *name, train_norm *norm);

/* splitmix64: the demo's one random source (initialization, batches). */
static inline uint64_t train_rand64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Everything that fixes the model's shape and arithmetic. */
typedef struct train_shape {
  int batch;      /* B: sequences per step */
  int seq_len;    /* T: bytes per sequence (the context) */
  int layers;     /* L */
  int dim;        /* C: model width */
  int heads;      /* H: attention heads, dividing C */
  train_norm norm;
  double partial; /* pRMSNorm's p (used for TRAIN_NORM_PRMS only) */
  double eps;     /* every norm's eps (inside the square root) */
} train_shape;

/* The defaults of the demo: B 16, T 128, L 4, C 128, H 4, RMSNorm, p 0.0625,
 * eps 1e-5. */
void train_shape_default(train_shape *s);

typedef struct train_model train_model;

/* Creates a model and initializes its parameters from seed: GPT-2's scheme
 * (weights N(0, 0.02), the two residual projections N(0, 0.02/sqrt(2L)),
 * biases 0, gains 1). The draws do not depend on the norm, so models that
 * differ only in norm start from the same weights. use_f64: compute in
 * double (for gradient checks) instead of float.
 * @return 0, or -1 with a message in err (bad shape, out of memory, library
 * error). */
int train_model_create(const train_shape *shape, int use_f64, uint64_t seed, train_model **model,
                       char *err, size_t errlen);
void train_model_free(train_model *model);

/* Threads (1..1024, the caller's included) for the model's own pool, and
 * for the library's norms (norm_threads; 0: the same); a new model has 1 and
 * 1. librmsnorm splits a call over its threads only for work of about 1 MiB
 * per thread or more. The model cuts each step into
 * tasks of a fixed size and runs the BLAS single-threaded inside them (with
 * OpenBLAS it sets openblas_set_num_threads(1), process-wide, at creation;
 * another threaded BLAS should be limited to one thread by its own
 * environment variable), so at most `threads` threads compute at any moment
 * and the results are the same bits for any thread count.
 * @return 0, or -1 (see train_model_error). */
int train_model_set_threads(train_model *model, int threads, int norm_threads);
/* Tasks the pool's workers (not the calling thread) have run: shows that
 * more than one thread took part. */
long train_model_worker_tasks(const train_model *model);

/* The float model's forward, backward and step compute with subnormal
 * numbers flushed to zero (x86 FTZ + DAZ, on every thread of its pool; the
 * caller's mode is restored on return); the double model in the caller's
 * mode. librmsnorm's worker threads keep the mode of the thread that started
 * them (the model's, when a model call starts them). */

/* Forward pass over one batch: inputs and targets are B*T bytes each
 * (targets[i] is the byte after inputs[i]). Keeps the activations for
 * train_model_backward. @return the mean cross-entropy in nats (NaN after a
 * library error: see train_model_error). */
double train_model_forward(train_model *model, const uint8_t *inputs, const uint8_t *targets);

/* Gradients of the last forward's loss with respect to every parameter
 * (overwritten, not accumulated). @return 0, or -1 after a library error. */
int train_model_backward(train_model *model);

/* One AdamW step (beta1 0.9, beta2 0.95, eps 1e-8) at learning rate lr, with
 * weight decay wd on the matrices (not on biases or norm gains), after
 * scaling the gradients to a global L2 norm of at most clip (clip <= 0: no
 * clipping). @return the global gradient norm before clipping. */
double train_model_step(train_model *model, double lr, double wd, double clip);

/* The parameters as one flat vector (for tests): count, read, write, and the
 * gradient from the last backward. Unused parameters (norm gains of `none`,
 * biases of RMSNorm) are not counted. */
size_t train_model_num_params(const train_model *model);
double train_model_param(const train_model *model, size_t i);
void train_model_set_param(train_model *model, size_t i, double value);
double train_model_grad(const train_model *model, size_t i);
/* @return the name of the tensor that flat parameter i belongs to, e.g.
 * "l1.norm2.gain" (static storage). */
const char *train_model_param_name(const train_model *model, size_t i);

/* Seconds spent at the norm sites (residual add + norm, forward and
 * backward: the part the norm choice changes) since the last call, which
 * resets the counters: @return wall-clock seconds; *cpu_seconds (when not
 * NULL) receives the process's CPU seconds over the same spans (all its
 * threads: on a shared machine this counts the work, not the waiting). */
double train_model_take_norm_seconds(train_model *model, double *cpu_seconds);

/* Monotonic clock, and the CPU time of the whole process (every thread),
 * in seconds: what the step and norm timings use. */
double train_now(void);
double train_cpu_now(void);

/* @return the first library error's message, or NULL when none occurred. */
const char *train_model_error(const train_model *model);

#endif /* TRAIN_MODEL_H */
