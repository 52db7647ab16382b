/* rmsnorm.h - the one public header of librmsnorm.
 *
 * RMSNorm (Zhang & Sennrich, 2019) and LayerNorm over the last axis of a
 * row-major tensor viewed as `rows x d`, forward and backward, in fp32, fp16,
 * bf16 and fp64 storage. Every function returns an rmsnorm_status; none aborts,
 * exits or prints. On any status other than RMSNORM_OK nothing was written.
 */
#ifndef RMSNORM_H
#define RMSNORM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RMSNORM_VERSION_MAJOR 0
#define RMSNORM_VERSION_MINOR 1
#define RMSNORM_VERSION_PATCH 0
#define RMSNORM_VERSION_STRING "0.1.0"
/* MAJOR*10000 + MINOR*100 + PATCH, comparable with rmsnorm_version_number(). */
#define RMSNORM_VERSION_NUMBER \
  (RMSNORM_VERSION_MAJOR * 10000 + RMSNORM_VERSION_MINOR * 100 + RMSNORM_VERSION_PATCH)

#if defined(RMSNORM_STATIC_DEFINE)
#define RMSNORM_API
#elif defined(_WIN32)
#ifdef RMSNORM_BUILDING
#define RMSNORM_API __declspec(dllexport)
#else
#define RMSNORM_API __declspec(dllimport)
#endif
#else
#define RMSNORM_API __attribute__((visibility("default")))
#endif

/* Status codes. The values are pinned: they never change between versions. */
typedef enum rmsnorm_status {
  RMSNORM_OK = 0,
  RMSNORM_ERROR_NULL_POINTER = 1,  /* a required pointer (context, config, buffer) is NULL */
  RMSNORM_ERROR_BAD_SIZE = 2,      /* d == 0, or the rows x stride extent overflows size_t */
  RMSNORM_ERROR_BAD_STRIDE = 3,    /* a row stride smaller than d */
  RMSNORM_ERROR_BAD_EPS = 4,       /* eps negative, NaN or infinite */
  RMSNORM_ERROR_BAD_PARTIAL = 5,   /* partial fraction p outside (0, 1], or p < 1 for LayerNorm */
  RMSNORM_ERROR_BAD_DTYPE = 6,     /* unknown dtype, or a param dtype neither fp32 nor the data's */
  RMSNORM_ERROR_BAD_FLAGS = 7,     /* unknown flag bits, or a flag the operation does not take */
  RMSNORM_ERROR_OVERLAP = 8,       /* an output overlaps an input or another output (and is not
                                      the exact in-place view the operation allows) */
  RMSNORM_ERROR_OUT_OF_MEMORY = 9, /* scratch memory could not be allocated */
  RMSNORM_ERROR_BAD_ARGUMENT = 10, /* any other invalid argument (see the function's contract) */
  RMSNORM_ERROR_NOT_AVAILABLE = 11, /* not built in, or not supported by this CPU */
  RMSNORM_ERROR_BAD_CONFIG = 12,   /* the rmsnorm_config was not filled by rmsnorm_config_init
                                      (its size field is unknown), or sets fields this
                                      library is too old to know */
  RMSNORM_ERROR_OUT_OF_RANGE = 13, /* a position or cache slot outside its table or cache */
  RMSNORM_ERROR_BAD_ROPE = 14      /* a rotation that cannot be: an unknown style or norm
                                      mode, rotary_dim odd or above head_dim, theta <= 1
                                      or a linear factor <= 0 (or either not finite) */
} rmsnorm_status;

/* Storage types. fp16 is IEEE binary16, bf16 the top half of an IEEE binary32;
 * both are passed as uint16_t bit patterns. */
typedef enum rmsnorm_dtype {
  RMSNORM_F32 = 0,
  RMSNORM_F16 = 1,
  RMSNORM_BF16 = 2,
  RMSNORM_F64 = 3
} rmsnorm_dtype;

/* Flags for rmsnorm_config.flags (bitwise OR). */
enum {
  /* RMSNorm only: r = 1/(sqrt(mean(x^2)) + eps) (the original authors' code)
   * instead of r = 1/sqrt(mean(x^2) + eps) (PyTorch's form, the default). */
  RMSNORM_FLAG_EPS_OUTSIDE = 1u << 0,
  /* The weight is an offset from one: y = x*r*(1 + g) + b (Gemma). */
  RMSNORM_FLAG_WEIGHT_OFFSET = 1u << 1,
  /* fp16/bf16 data: round the normalized value to the data dtype before the
   * weight is applied, then round again (HF-Llama's order). Without it the
   * result is computed in fp32 and rounded once. No effect for fp32/fp64; the
   * backward treats that rounding as the identity. */
  RMSNORM_FLAG_ROUND_BEFORE_WEIGHT = 1u << 2,
  /* Backward: add dweight/dbias into what the caller holds instead of
   * overwriting it (gradient accumulation across micro-batches). */
  RMSNORM_FLAG_ACCUMULATE = 1u << 3,
  /* QK-norm + RoPE only (every other operation refuses it, as
   * RMSNORM_ERROR_BAD_FLAGS): fp16/bf16 data, the normalized value rounded
   * once to the data dtype before the rotation, n = RT((x r) w), as
   * Gemma3RMSNorm and Olmo2RMSNorm give it, then the rotation with Hugging
   * Face's roundings in the model dtype (see "QK-norm + rotary position
   * embedding" below). No effect for fp32/fp64; the backward treats the
   * roundings as the identity. */
  RMSNORM_FLAG_ROUND_BEFORE_ROTATION = 1u << 4,
  /* QK-norm + RoPE only, with RMSNORM_FLAG_ROUND_BEFORE_WEIGHT or
   * _ROUND_BEFORE_ROTATION: the rotation of the rounded n in the compute
   * type, rounded once, as HF computes it from float32 cos and sin (OLMo 2's
   * rotary embedding returns them in float32) instead of in the model
   * dtype. Without either rounding flag the rotation is already so. */
  RMSNORM_FLAG_FLOAT_ROTATION = 1u << 5
};

/* What one call computes, beyond shapes and buffers. Fill it with
 * rmsnorm_config_init(), then change what differs.
 *
 * The struct is extensible: `size` says which version of it the caller was
 * compiled with (rmsnorm_config_init sets it to sizeof(rmsnorm_config)), and
 * later versions only append fields after the end of the previous one, with
 * zero meaning their default. A library older than the caller accepts a
 * larger struct as long as the fields it does not know are all zero bytes
 * (else RMSNORM_ERROR_BAD_CONFIG); a newer library gives the fields an older
 * caller lacks their defaults. A config not filled by rmsnorm_config_init
 * (size 0 or garbage) is RMSNORM_ERROR_BAD_CONFIG in every call. */
typedef struct rmsnorm_config {
  size_t size;               /* bytes of this struct as the caller knows it: set by
                                rmsnorm_config_init, never changed by hand */
  rmsnorm_dtype dtype;       /* storage of x, y, dy, dx */
  rmsnorm_dtype param_dtype; /* storage of weight, bias, dweight, dbias: RMSNORM_F32 or dtype */
  double eps;                /* >= 0 and finite */
  double partial;            /* pRMSNorm: statistic over the first k = rmsnorm_partial_count(
                                partial, d) elements; in (0, 1]; 1 is plain RMSNorm.
                                LayerNorm requires 1. */
  unsigned flags;            /* RMSNORM_FLAG_* */
  /* new fields go here, after sizeof of the previous version */
} rmsnorm_config;

/* Opaque context: owns scratch memory (so calls do not allocate once warm),
 * the kernel set and the thread limit of the calls made with it.
 * A context may be shared between threads; calls on one context serialize,
 * except those that need neither its scratch nor its workers, which run at
 * once without its lock: rmsnorm_forward, rmsnorm_layernorm_forward,
 * rmsnorm_add_forward and rmsnorm_qk_norm_forward whose work stays on the
 * caller's thread (every decode size) and whose weight and bias are used as
 * they are (aligned fp32 without a 1 + g copy, or a weight of the data's
 * dtype that the call reads in place).
 * Use one context per thread for concurrent calls. Freeing is the exception:
 * rmsnorm_context_free neither takes the context's lock nor waits for calls,
 * so the program must order it after every call on the context has returned
 * (join the threads that use it, or their own lock or signal), and start no
 * call after it. Waiting could not make a racing free safe: a thread that
 * has the pointer but has not yet entered the call would use freed memory
 * all the same.
 * Worker threads belong to one pool per process, shared by all contexts: a
 * call runs on its own thread plus the workers idle when it starts (up to
 * its context's limit), so concurrent calls share the cores instead of
 * oversubscribing them. The pool exists while at least one context does;
 * freeing the last context joins its threads. After fork() the child may
 * use every context it inherited: the library's pthread_atfork handlers
 * wait for the calls in flight on other threads that hold a context's lock
 * to finish before the fork (those without it change nothing of the
 * library's state), and the child starts new workers when it first needs
 * them. */
typedef struct rmsnorm_context rmsnorm_context;

/* @return the version as RMSNORM_VERSION_NUMBER of the library in use. */
RMSNORM_API unsigned rmsnorm_version_number(void);
/* @return the version string of the library in use, e.g. "0.1.0". */
RMSNORM_API const char *rmsnorm_version_string(void);
/* @return a one-line English message for a status (never NULL; unknown codes
 * give "unknown status"). */
RMSNORM_API const char *rmsnorm_status_message(rmsnorm_status status);
/* @return the enumerator name of a status, e.g. "RMSNORM_ERROR_BAD_EPS". */
RMSNORM_API const char *rmsnorm_status_name(rmsnorm_status status);

/* Creates a context: the kernel set chosen at run time (see rmsnorm_isa) and
 * a limit of as many threads as online CPUs (workers start on first use, only
 * for work large enough to gain). @return RMSNORM_OK,
 * RMSNORM_ERROR_NULL_POINTER (ctx NULL), RMSNORM_ERROR_OUT_OF_MEMORY. */
RMSNORM_API rmsnorm_status rmsnorm_context_create(rmsnorm_context **ctx);
/* Frees a context and its scratch (and the pool's threads with the last
 * context); NULL is accepted. It does not wait for calls on ctx: every call
 * on it, from any thread, must have returned before the free begins (the
 * program orders the two, e.g. by joining the calling thread), and none may
 * begin after; a free that races with a call on ctx is undefined behaviour.
 * Creating and freeing other contexts, calls on them, and fork() may run on
 * other threads meanwhile. */
RMSNORM_API void rmsnorm_context_free(rmsnorm_context *ctx);

/* Gives the context's scratch memory back to the system; the next call that
 * needs scratch allocates what it needs again. Scratch is bounded by the
 * shapes, not the row count (docs/kernels.md, "Contexts").
 * @return RMSNORM_OK, RMSNORM_ERROR_NULL_POINTER. */
RMSNORM_API rmsnorm_status rmsnorm_context_trim(rmsnorm_context *ctx);
/* @return RMSNORM_OK and in *bytes the scratch memory the context holds,
 * RMSNORM_ERROR_NULL_POINTER. */
RMSNORM_API rmsnorm_status rmsnorm_context_get_scratch_bytes(const rmsnorm_context *ctx,
                                                              size_t *bytes);

/* Kernel sets. AUTO is the best the CPU supports, unless the environment
 * variable RMSNORM_ISA (scalar, avx2, avx512 or neon) names a supported one.
 * Every set gives the scalar reference's bits. */
typedef enum rmsnorm_isa {
  RMSNORM_ISA_AUTO = 0,
  RMSNORM_ISA_SCALAR = 1, /* the portable reference kernels */
  RMSNORM_ISA_AVX2 = 2,   /* AVX2 + FMA + F16C */
  RMSNORM_ISA_AVX512 = 3, /* AVX-512 F/BW/VL (+ BF16 conversions when present) */
  RMSNORM_ISA_NEON = 4    /* AArch64 Advanced SIMD (aarch64 builds only) */
} rmsnorm_isa;

/* CPU features, as reported by rmsnorm_cpu_features (OS support checked). */
enum {
  RMSNORM_CPU_AVX2 = 1u << 0,
  RMSNORM_CPU_FMA = 1u << 1,
  RMSNORM_CPU_F16C = 1u << 2,
  RMSNORM_CPU_AVX512F = 1u << 3,
  RMSNORM_CPU_AVX512BW = 1u << 4,
  RMSNORM_CPU_AVX512VL = 1u << 5,
  RMSNORM_CPU_AVX512BF16 = 1u << 6,
  RMSNORM_CPU_NEON = 1u << 7,    /* AArch64: Advanced SIMD (HWCAP_ASIMD) */
  RMSNORM_CPU_NEON_FP16 = 1u << 8 /* AArch64: FEAT_FP16 half arithmetic (HWCAP_ASIMDHP);
                                     reported only: the kernels need no more than NEON */
};

/* @return RMSNORM_OK and the features in *features, RMSNORM_ERROR_NULL_POINTER. */
RMSNORM_API rmsnorm_status rmsnorm_cpu_features(unsigned *features);
/* @return the name of a kernel set ("auto", "scalar", "avx2", "avx512",
 * "neon"), or "unknown". */
RMSNORM_API const char *rmsnorm_isa_name(rmsnorm_isa isa);
/* Chooses the kernel set of a context; AUTO re-applies the run-time choice.
 * @return RMSNORM_OK, RMSNORM_ERROR_NULL_POINTER, RMSNORM_ERROR_BAD_ARGUMENT
 * (unknown value), RMSNORM_ERROR_NOT_AVAILABLE (this CPU or build lacks it). */
RMSNORM_API rmsnorm_status rmsnorm_context_set_isa(rmsnorm_context *ctx, rmsnorm_isa isa);
/* The kernel set a context runs (never AUTO). @return RMSNORM_OK,
 * RMSNORM_ERROR_NULL_POINTER. */
RMSNORM_API rmsnorm_status rmsnorm_context_get_isa(const rmsnorm_context *ctx, rmsnorm_isa *isa);
/* Sets the most threads a call may use (the caller's thread counts as one);
 * 0 restores the default, the number of online CPUs. Results are bitwise the
 * same for any thread count. It does not govern a BLAS's own threads (see
 * rmsnorm_linear_forward). @return RMSNORM_OK, RMSNORM_ERROR_NULL_POINTER,
 * RMSNORM_ERROR_BAD_ARGUMENT (negative or above 1024). */
RMSNORM_API rmsnorm_status rmsnorm_context_set_threads(rmsnorm_context *ctx, int threads);
/* @return RMSNORM_OK and the thread count in *threads, RMSNORM_ERROR_NULL_POINTER. */
RMSNORM_API rmsnorm_status rmsnorm_context_get_threads(const rmsnorm_context *ctx, int *threads);

/* The eps torch uses when eps is None: the machine epsilon of the computation
 * type, 2^-23 (float32) for fp32, fp16 and bf16 data, 2^-52 for fp64.
 * @return RMSNORM_OK, RMSNORM_ERROR_NULL_POINTER, RMSNORM_ERROR_BAD_DTYPE. */
RMSNORM_API rmsnorm_status rmsnorm_default_eps(rmsnorm_dtype dtype, double *eps);

/* Fills the first `size` bytes of *cfg for the caller's version of the
 * struct: size = `size`, dtype, param_dtype = dtype, eps =
 * rmsnorm_default_eps(dtype), partial = 1, flags = 0, every other byte zero.
 * Fields past `size` (a caller older than the library) are not written.
 * Callers in C use rmsnorm_config_init below; bindings through a foreign
 * function interface call this with their struct's size.
 * @return RMSNORM_OK, RMSNORM_ERROR_NULL_POINTER, RMSNORM_ERROR_BAD_DTYPE,
 * RMSNORM_ERROR_BAD_CONFIG (size below the first version's or above 1024). */
RMSNORM_API rmsnorm_status rmsnorm_config_init_size(rmsnorm_config *cfg, size_t size,
                                                    rmsnorm_dtype dtype);

/* rmsnorm_config_init_size(cfg, sizeof(rmsnorm_config), dtype): compiled into
 * the caller, so the size is the one of the header it was built with. */
static inline rmsnorm_status rmsnorm_config_init(rmsnorm_config *cfg, rmsnorm_dtype dtype) {
  return rmsnorm_config_init_size(cfg, sizeof(rmsnorm_config), dtype);
}

/* pRMSNorm's statistic length for a partial fraction p of a row of d: the
 * smallest k in [1, d] such that k/d, rounded to the nearest double, is >= p.
 * This is ceil(p*d) with p read as the number the caller meant rather than
 * its binary approximation: a p written as a decimal P (0.07) for which P*d
 * is an integer K (7 for d = 100) gives exactly K (a binary 0.07 times 100
 * is 7.0000000000000007, whose ceiling is 8), and p = (double)K / d gives K.
 * Where P*d is not an integer, k = ceil(P*d) for any P of up to
 * 15 - log10(d) significant digits. (The authors' pRMSNorm code uses
 * int(d*p), a floor: see docs/numerics.md, "pRMSNorm's k".)
 * @return RMSNORM_OK, RMSNORM_ERROR_NULL_POINTER, RMSNORM_ERROR_BAD_SIZE
 * (d == 0), RMSNORM_ERROR_BAD_PARTIAL (p outside (0, 1]). */
RMSNORM_API rmsnorm_status rmsnorm_partial_count(double partial, size_t d, size_t *k);

/* Buffers, for all four operations:
 *   x, y, dy, dx: rows x d elements of cfg->dtype, row i starting at
 *                 ptr + i*ld (ld in elements, >= d). Any alignment.
 *   weight, bias, dweight, dbias: d elements of cfg->param_dtype, or NULL.
 *   mean, rstd:   one value per row, float for fp32/fp16/bf16 data and
 *                 double for fp64 data, or NULL.
 * rows == 0 succeeds and touches nothing (NULL buffers are then accepted).
 * In place: y may be x, and dx may be dy or x, with the same ld. Any other
 * overlap between an output and another buffer is RMSNORM_ERROR_OVERLAP. */

/* RMSNorm forward, per row:
 *   k    = rmsnorm_partial_count(partial, d)   (ceil(partial * d); d when partial = 1)
 *   ms   = (1/k) * sum_{j<k} x_j^2
 *   r    = 1/sqrt(ms + eps)             or 1/(sqrt(ms) + eps) with RMSNORM_FLAG_EPS_OUTSIDE
 *   y_j  = x_j * r * w_j + b_j          for all j < d
 * with w_j = g_j, 1 + g_j (RMSNORM_FLAG_WEIGHT_OFFSET) or 1 (weight NULL), and
 * b_j = bias_j or 0. When ms + eps (or sqrt(ms) + eps) is 0, that is a row of
 * zeros with eps = 0, r is taken as 0 so the row gives b, not NaN.
 * NaN and infinite inputs give what these formulas give in IEEE arithmetic,
 * as torch does, in every operation of this header, forward and backward: a
 * NaN among x_0..x_{k-1} makes the row NaN; an infinity there makes ms
 * infinite and r = 0, so y_j = (+-0) w_j + b_j for a finite x_j and NaN for
 * an infinite one (docs/numerics.md, "Non-finite inputs"). Finite rows whose
 * sums overflow the compute type are computed exactly all the same.
 * rstd (optional) receives r; it may lose range for rows whose r lies outside
 * float's normal range, which the backward detects and recomputes.
 * @return RMSNORM_OK or an error status (nothing written). */
RMSNORM_API rmsnorm_status rmsnorm_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                           size_t rows, size_t d,
                                           const void *x, size_t ldx,
                                           const void *weight, const void *bias,
                                           void *y, size_t ldy, void *rstd);

/* RMSNorm backward. Given x, dy, the weight (NULL for none) and optionally the
 * rstd saved by the forward (NULL: recomputed from x), writes dx and, when
 * non-NULL, dweight = sum over rows of dy_j * x_j * r and dbias = sum over rows
 * of dy_j (overwritten, or added to with RMSNORM_FLAG_ACCUMULATE). dweight is
 * the gradient of g in both weight modes. The formulas are derived in
 * src/ref/norm_ref.inc.
 * @return RMSNORM_OK or an error status (nothing written). dweight with a NULL
 * weight is RMSNORM_ERROR_BAD_ARGUMENT. */
RMSNORM_API rmsnorm_status rmsnorm_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                            size_t rows, size_t d,
                                            const void *x, size_t ldx,
                                            const void *dy, size_t lddy,
                                            const void *weight, const void *rstd,
                                            void *dx, size_t lddx,
                                            void *dweight, void *dbias);

/* LayerNorm forward, per row: mean = (1/d) sum x_j, var = (1/d) sum (x_j - mean)^2
 * (biased, as torch), rstd = 1/sqrt(var + eps), y_j = (x_j - mean) * rstd * w_j + b_j.
 * Takes RMSNORM_FLAG_WEIGHT_OFFSET and RMSNORM_FLAG_ROUND_BEFORE_WEIGHT;
 * RMSNORM_FLAG_EPS_OUTSIDE is RMSNORM_ERROR_BAD_FLAGS and partial != 1 is
 * RMSNORM_ERROR_BAD_PARTIAL. mean and rstd are optional outputs.
 * @return RMSNORM_OK or an error status (nothing written). */
RMSNORM_API rmsnorm_status rmsnorm_layernorm_forward(rmsnorm_context *ctx,
                                                     const rmsnorm_config *cfg,
                                                     size_t rows, size_t d,
                                                     const void *x, size_t ldx,
                                                     const void *weight, const void *bias,
                                                     void *y, size_t ldy,
                                                     void *mean, void *rstd);

/* LayerNorm backward: dx, and optionally dweight = sum dy_j * xhat_j and
 * dbias = sum dy_j. The saved mean and rstd are used when both are non-NULL,
 * otherwise both are recomputed from x.
 * @return RMSNORM_OK or an error status (nothing written). */
RMSNORM_API rmsnorm_status rmsnorm_layernorm_backward(rmsnorm_context *ctx,
                                                      const rmsnorm_config *cfg,
                                                      size_t rows, size_t d,
                                                      const void *x, size_t ldx,
                                                      const void *dy, size_t lddy,
                                                      const void *weight,
                                                      const void *mean, const void *rstd,
                                                      void *dx, size_t lddx,
                                                      void *dweight, void *dbias);

/* ---- Inside a transformer block: fused operations ----------------------
 * The same config, dtypes, strides, status rules and in-place rules as above
 * unless a function says otherwise; all take RMSNorm configs (weight modes,
 * bias, eps inside/outside, partial). The formulas and their derivations are
 * in src/ref/fused_ref.inc and the entry points in src/api/; docs/fusions.md
 * has the overview. */

/* Residual add + RMSNorm forward, one pass over memory. Per row:
 *   h'_j = h_j + u_j   computed in the compute type and rounded to cfg->dtype
 *                      (for fp16/bf16 the correctly rounded sum, as h + u in a
 *                      framework), written back into h;
 *   y    = RMSNorm(h') bit for bit what rmsnorm_forward gives on the rounded h'
 *          (rstd, optional, as rmsnorm_forward's).
 * h, u, y: rows x d of cfg->dtype, strides ldh, ldu, ldy. y may be u (same
 * ld: the sub-layer output is consumed in place), never h.
 * RMSNORM_FLAG_ACCUMULATE is RMSNORM_ERROR_BAD_FLAGS.
 * @return RMSNORM_OK or an error status (nothing written, h included). */
RMSNORM_API rmsnorm_status rmsnorm_add_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                               size_t rows, size_t d,
                                               void *h, size_t ldh,
                                               const void *u, size_t ldu,
                                               const void *weight, const void *bias,
                                               void *y, size_t ldy, void *rstd);

/* Residual add + RMSNorm backward. h holds h' (as the forward left it), dy
 * the gradient of y, dres the gradient arriving on the residual stream h'
 * (NULL: zero). Writes dh = dres + dx, the gradient of both h and u, where dx
 * is rmsnorm_backward(h', dy) rounded to cfg->dtype and the sum is rounded
 * once more: bit for bit rmsnorm_backward followed by an element-wise add in
 * cfg->dtype (the autograd composition). dweight, dbias, rstd and the flags
 * as rmsnorm_backward. dh may be dy or dres (same ld).
 * @return RMSNORM_OK or an error status (nothing written). */
RMSNORM_API rmsnorm_status rmsnorm_add_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                                size_t rows, size_t d,
                                                const void *h, size_t ldh,
                                                const void *dy, size_t lddy,
                                                const void *dres, size_t lddres,
                                                const void *weight, const void *rstd,
                                                void *dh, size_t lddh,
                                                void *dweight, void *dbias);

/* Output codes of rmsnorm_forward_quant. */
typedef enum rmsnorm_qtype {
  RMSNORM_Q_INT8 = 0,    /* int8_t, symmetric (no zero point) */
  RMSNORM_Q_FP8_E4M3 = 1 /* uint8_t codes of OCP fp8 E4M3FN: bias 7, max 448,
                            no infinities, NaN = 0x7f/0xff */
} rmsnorm_qtype;

/* RMSNorm forward with an 8-bit output. Per row, y_j is the forward's value
 * in the compute type (before any rounding to cfg->dtype), then
 *   dynamic (static_scale NULL): s = (float)(max_j |y_j| / QMAX), QMAX = 127
 *            (int8) or 448 (e4m3), the division in the compute type, or NaN
 *            when a y_j is NaN (the row's codes are then 0, and it
 *            dequantizes to NaN); written to scale[row] (scale: rows floats,
 *            required);
 *   static:  s = *static_scale (finite, > 0; scale must be NULL);
 *   t_j = y_j * inv, inv = 1/s rounded to the compute type once per row
 *         (for 2^-126 <= s <= 2^126; y_j / s for other s > 0; 0 when s = 0
 *         or NaN),
 *   int8: q_j = round-half-even(clamp(t_j, -128, 127)), NaN -> 0;
 *   e4m3: q_j = e4m3((float)t_j): round to nearest even, saturate to +-448,
 *         NaN -> 0x7f with t's sign.
 * Dequantize with y ~ s * q. q: rows x d bytes with stride ldq (>= d). rstd
 * optional, as rmsnorm_forward's. Rows the double-precision rescue path
 * computes (overflowing/underflowing sums, NaN/Inf) quantize y as rounded to
 * cfg->dtype. RMSNORM_FLAG_ACCUMULATE is RMSNORM_ERROR_BAD_FLAGS.
 * @return RMSNORM_OK or an error status (nothing written); an unknown qtype
 * or a bad static scale is RMSNORM_ERROR_BAD_ARGUMENT. */
RMSNORM_API rmsnorm_status rmsnorm_forward_quant(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                                 size_t rows, size_t d,
                                                 const void *x, size_t ldx,
                                                 const void *weight, const void *bias,
                                                 rmsnorm_qtype qtype, const float *static_scale,
                                                 void *q, size_t ldq, float *scale, void *rstd);

/* Output formats of rmsnorm_forward_quantized: the layouts the 8- and 4-bit
 * matmuls of CPU engines read (docs/quantized.md has each byte). Every format
 * but per-row INT8/FP8_E4M3 encodes y rounded to float (as ggml's quantizers
 * take an fp32 row); the values are pinned. */
typedef enum rmsnorm_qformat {
  /* int8 codes (ldc >= d bytes) and float scales: one per row (group 0; or a
   * static scale), or one per group of `group` columns (scales: rows x
   * d/group floats, stride lds). Rules as rmsnorm_forward_quant, per group. */
  RMSNORM_QF_INT8 = 0,
  RMSNORM_QF_FP8_E4M3 = 1, /* the same with e4m3 codes (QMAX 448) */
  /* ggml block_q8_0: per 32 elements 34 bytes, fp16 d then int8 qs[32],
   * d = amax/127, q = roundf(y/d) (ties away from zero); no scales array */
  RMSNORM_QF_Q8_0 = 2,
  /* ggml block_q8_K: per 256 elements 292 bytes, float d, int8 qs[256],
   * int16 bsums[16]; d = -max/127 of the signed max, q round half even */
  RMSNORM_QF_Q8_K = 3,
  /* OCP MX v1.0 MXFP8 (E4M3): e4m3 codes (ldc >= d bytes) and one E8M0 byte
   * per 32 elements (scales: rows x d/32 bytes, stride lds), X =
   * 2^(floor(log2 amax) - 8), codes e4m3(y / X) nearest even, saturated */
  RMSNORM_QF_MXFP8_E4M3 = 4,
  /* ggml block_mxfp4: per 32 elements 17 bytes, the E8M0 byte, then 16
   * bytes of E2M1 nibbles (element j low, j + 16 high); no scales array */
  RMSNORM_QF_MXFP4 = 5,
  /* ggml block_q8_1: per 32 elements 36 bytes, fp16 d, fp16 s, int8 qs[32];
   * d and qs as Q8_0's, s = d * sum(qs) (in fp32, then fp16); no scales array */
  RMSNORM_QF_Q8_1 = 6
} rmsnorm_qformat;

/* Flags for rmsnorm_quant.flags (INT8/FP8_E4M3 with dynamic scales only). */
enum {
  /* Scales rounded up to a power of two and kept in UE8M0's range
   * [2^-127, 2^127] (as block-scaled GEMMs take them): a power of two
   * stays, an all-zero row or group gets 2^-127 (its codes are then zero),
   * a smaller one 2^-127; NaN and inf stay. The codes use that scale. */
  RMSNORM_QUANT_SCALE_POW2 = 1u << 0,
  /* The scales as E8M0 bytes, one uint8 per row or group (2^(e - 127);
   * 0xFF for a NaN or infinite scale, E8M0's NaN) instead of floats; implies
   * RMSNORM_QUANT_SCALE_POW2. */
  RMSNORM_QUANT_SCALE_E8M0 = 1u << 1
};

/* What rmsnorm_forward_quantized writes. Fill it with rmsnorm_quant_init,
 * then change what differs. Versioned as rmsnorm_config: `size` is the
 * caller's sizeof, later versions append fields that default to zero. */
typedef struct rmsnorm_quant {
  size_t size;               /* set by rmsnorm_quant_init */
  rmsnorm_qformat format;
  size_t group;              /* INT8/FP8_E4M3: 0 = one scale per row, else a
                                multiple of 32 dividing d (32, 64, 128: per
                                group); other formats: 0 */
  unsigned flags;            /* RMSNORM_QUANT_* */
  const float *static_scale; /* INT8/FP8_E4M3 with group 0: one scale for all
                                rows (finite, > 0; no scales array), or NULL */
} rmsnorm_quant;

static inline void rmsnorm_quant_init(rmsnorm_quant *q, rmsnorm_qformat format) {
  rmsnorm_quant z = {sizeof(rmsnorm_quant), format, 0, 0, (const float *)0};
  *q = z;
}

/* Bytes of one row's codes (the least ldc) and scales per row (the least
 * lds; 0 for the formats that keep their scales inside the blocks) for rows
 * of d elements. Scales count in the scale's own units, as lds does: floats
 * for INT8/FP8_E4M3, bytes for MXFP8 and with RMSNORM_QUANT_SCALE_E8M0.
 * @return RMSNORM_OK, RMSNORM_ERROR_NULL_POINTER,
 * RMSNORM_ERROR_BAD_CONFIG (q's size), RMSNORM_ERROR_BAD_ARGUMENT (unknown
 * format, group or flags), RMSNORM_ERROR_BAD_SIZE (d == 0 or not a multiple
 * of the format's block or group). Either output pointer may be NULL. */
RMSNORM_API rmsnorm_status rmsnorm_quant_row_size(const rmsnorm_quant *q, size_t d,
                                                  size_t *row_bytes, size_t *row_scales);

/* RMSNorm forward into a quantized format (rmsnorm_qformat): per row, y as
 * rmsnorm_forward computes it before any rounding to cfg->dtype, then the
 * format's encoder. codes: rows x ldc bytes (ldc >= row_bytes); scales:
 * rows x lds elements (float for INT8/FP8_E4M3, E8M0 bytes for MXFP8 and
 * with RMSNORM_QUANT_SCALE_E8M0), NULL for Q8_0, Q8_1, Q8_K, MXFP4 and
 * static scales. rstd optional. Rows the
 * double-precision rescue path computes (overflowing/underflowing sums,
 * NaN/Inf) encode y rounded to cfg->dtype. A block (group, row) whose y
 * holds a NaN gets a NaN scale and zero codes, so it dequantizes to NaN;
 * Inf as docs/quantized.md states. Bit-identical across kernel sets and
 * thread counts. RMSNORM_FLAG_ACCUMULATE is RMSNORM_ERROR_BAD_FLAGS.
 * @return RMSNORM_OK or an error status (nothing written):
 * rmsnorm_quant_row_size's, a stride below the row's size
 * (RMSNORM_ERROR_BAD_STRIDE), a bad static scale or a missing / extra
 * scales array (RMSNORM_ERROR_BAD_ARGUMENT / NULL_POINTER). */
RMSNORM_API rmsnorm_status rmsnorm_forward_quantized(rmsnorm_context *ctx,
                                                     const rmsnorm_config *cfg, size_t rows,
                                                     size_t d, const void *x, size_t ldx,
                                                     const void *weight, const void *bias,
                                                     const rmsnorm_quant *q, void *codes,
                                                     size_t ldc, void *scales, size_t lds,
                                                     void *rstd);

/* Residual add + RMSNorm into a quantized format in one pass over each row:
 * h' = h + u rounded to cfg->dtype is written to h (as rmsnorm_add_forward),
 * and the codes (and scales) of RMSNorm(h') as rmsnorm_forward_quantized.
 * @return RMSNORM_OK or an error status (nothing written). */
RMSNORM_API rmsnorm_status rmsnorm_add_forward_quantized(
    rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t rows, size_t d, void *h, size_t ldh,
    const void *u, size_t ldu, const void *weight, const void *bias, const rmsnorm_quant *q,
    void *codes, size_t ldc, void *scales, size_t lds, void *rstd);

/* The float values of codes and scales as rmsnorm_forward_quantized writes
 * them for q (format, group, flags, static scale) and rows of d elements:
 * y_j = value(code_j) * scale, the product in float, where value is the
 * int8, e4m3 (S.1111.111: NaN) or E2M1 value of the code and scale the
 * float, fp16 (Q8_0, Q8_1's d) or E8M0 one (2^(e - 127), 0xFF: NaN) of the
 * element's row, group or block (a NaN scale gives NaN throughout).
 * codes: rows x ldc bytes; scales: rows x lds elements as
 * rmsnorm_forward_quantized's (NULL where the format has none); y: rows x
 * ldy floats (ldy >= d), which must not overlap codes or scales.
 * @return RMSNORM_OK or an error status (nothing written):
 * rmsnorm_quant_row_size's, a stride below the row's size
 * (RMSNORM_ERROR_BAD_STRIDE), a bad static scale or an extra scales array
 * (RMSNORM_ERROR_BAD_ARGUMENT), a missing pointer
 * (RMSNORM_ERROR_NULL_POINTER), y overlapping the input
 * (RMSNORM_ERROR_OVERLAP). rows == 0 is RMSNORM_OK. */
RMSNORM_API rmsnorm_status rmsnorm_dequantize(const rmsnorm_quant *q, size_t rows, size_t d,
                                              const void *codes, size_t ldc, const void *scales,
                                              size_t lds, float *y, size_t ldy);

/* QK-norm: RMSNorm of every head of every token, x: [tokens, heads, head_dim]
 * with one weight (and bias) of head_dim shared by all heads. The row of
 * (token t, head h) starts at x + t*ldx_token + h*ldx_head (elements), so Q or
 * K can be read where they lie in a fused QKV buffer: for QKV of
 * [tokens, 3, heads, head_dim], Q is x = qkv, ldx_token = 3*heads*head_dim,
 * ldx_head = head_dim, and K is x = qkv + heads*head_dim (call once for Q and
 * once for K, each with its own weight). Each buffer's rows must not overlap:
 * either token-major (ld_head >= head_dim, ld_token >= (heads-1)*ld_head +
 * head_dim) or head-major (the same with the roles swapped), else
 * RMSNORM_ERROR_BAD_STRIDE. Results equal rmsnorm_forward on each row. y may
 * be x with the same two strides; overlap checks use each buffer's whole
 * extent. rstd (optional): tokens*heads values, index t*heads + h.
 * tokens == 0 or heads == 0 succeeds and touches nothing (NULL buffers are
 * then accepted), as rows == 0 does for rmsnorm_forward; so does the
 * backward, whose dweight and dbias are then not written.
 * RMSNORM_FLAG_ACCUMULATE is RMSNORM_ERROR_BAD_FLAGS.
 * @return RMSNORM_OK or an error status (nothing written). */
RMSNORM_API rmsnorm_status rmsnorm_qk_norm_forward(rmsnorm_context *ctx,
                                                   const rmsnorm_config *cfg,
                                                   size_t tokens, size_t heads, size_t head_dim,
                                                   const void *x, size_t ldx_token,
                                                   size_t ldx_head,
                                                   const void *weight, const void *bias,
                                                   void *y, size_t ldy_token, size_t ldy_head,
                                                   void *rstd);

/* QK-norm backward: dx of every row as rmsnorm_backward, and dweight/dbias
 * summed over all tokens and heads (in a fixed order: the same bits for any
 * thread count, though not the same association as one rmsnorm_backward over
 * tokens*heads rows). dx may be dy or x with the same strides.
 * @return RMSNORM_OK or an error status (nothing written). */
RMSNORM_API rmsnorm_status rmsnorm_qk_norm_backward(rmsnorm_context *ctx,
                                                    const rmsnorm_config *cfg,
                                                    size_t tokens, size_t heads, size_t head_dim,
                                                    const void *x, size_t ldx_token,
                                                    size_t ldx_head,
                                                    const void *dy, size_t lddy_token,
                                                    size_t lddy_head,
                                                    const void *weight, const void *rstd,
                                                    void *dx, size_t lddx_token, size_t lddx_head,
                                                    void *dweight, void *dbias);

/* ---- QK-norm + rotary position embedding (Qwen3, OLMo 2, Gemma 3) --------
 * Per row of a [tokens, heads, head_dim] Q or K (strided as QK-norm's):
 *   n = RMSNorm(x) * w              (r = 1/sqrt(mean(x^2) + eps))
 *   y = rotate(n, position)         (the first rotary_dim columns; the rest = n)
 * in the compute type (float; double for fp64 data), rounded once to
 * cfg->dtype. The statistic is taken per head (RMSNORM_ROPE_NORM_HEAD:
 * Qwen3, Gemma 3; the mean over the row's head_dim values, w of head_dim
 * shared by the heads) or per token (RMSNORM_ROPE_NORM_TOKEN: OLMo 2, whose
 * norm spans the whole projection; the mean over the token's heads*head_dim
 * values, its heads' rows taken in head order as one row, summed as
 * rmsnorm_forward sums a row of that length, so that with contiguous heads
 * n is rmsnorm_forward's of the [tokens, heads*head_dim] rows bit for bit;
 * w of heads*head_dim, head h scaled by w[h*head_dim ...]). With
 * half = rotary_dim / 2 and the pair (a, b) of frequency i (i < half),
 * c = cos(p theta_i), s = sin(p theta_i):
 *   RMSNORM_ROPE_NEOX (rotate-half, HF apply_rotary_pos_emb): a = n[i], b = n[i + half]
 *   RMSNORM_ROPE_GPTJ (interleaved):                          a = n[2i], b = n[2i + 1]
 *   y_a = a c - b s,   y_b = b c + a s
 * (two products and one sum each, never fused). For fp16/bf16 data the
 * flags give Hugging Face's roundings, RT() rounding to cfg->dtype:
 *   RMSNORM_FLAG_ROUND_BEFORE_WEIGHT (Qwen3RMSNorm):       n = RT(RT(x r) w)
 *   RMSNORM_FLAG_ROUND_BEFORE_ROTATION (Gemma3RMSNorm with its 1 + w,
 *     Olmo2RMSNorm):                                      n = RT((x r) w)
 * then the rotation in the model dtype, y_a = RT(RT(a c) - RT(b s)) and
 * y_b = RT(RT(b c) + RT(a s)) (HF rotates with cos and sin rounded to that
 * dtype: pass them as the table), or with RMSNORM_FLAG_FLOAT_ROTATION in
 * the compute type, rounded once (OLMo 2, whose cos and sin stay float32).
 * Bias, RMSNORM_FLAG_EPS_OUTSIDE and partial != 1 are refused;
 * RMSNORM_FLAG_WEIGHT_OFFSET (Gemma's 1 + w) is allowed. tokens == 0 or
 * heads == 0 succeeds and touches nothing (NULL buffers accepted; dweight is
 * not written, as rmsnorm_backward's with rows == 0). The formulas and the
 * backward's derivation are in src/ref/rope_ref.inc; docs/rope.md has the
 * overview. */
enum {
  RMSNORM_ROPE_NEOX = 0, /* pairs (i, i + rotary_dim/2) */
  RMSNORM_ROPE_GPTJ = 1  /* pairs (2i, 2i + 1) */
};

/* Where the statistic of rmsnorm_qk_norm_rope_* is taken (rmsnorm_rope.norm). */
enum {
  RMSNORM_ROPE_NORM_HEAD = 0, /* one r per row of head_dim; w, dweight of head_dim;
                                 rstd tokens*heads values, index t*heads + h */
  RMSNORM_ROPE_NORM_TOKEN = 1 /* one r per token over its heads*head_dim values; w,
                                 dweight of heads*head_dim; rstd tokens values */
};

/* The rotation of rmsnorm_qk_norm_rope_*. Fill it with rmsnorm_rope_init,
 * then set the table; versioned by `size` as rmsnorm_config (a caller
 * built before `norm` existed gets RMSNORM_ROPE_NORM_HEAD). cos_sin: row p
 * (p < n_positions) holds the cos of the half = rotary_dim/2 frequencies,
 * then their sin: rotary_dim values of float (double for fp64 data),
 * contiguous, rows rotary_dim apart (rmsnorm_rope_table fills one from a
 * theta). Token t uses row positions[t], or row t when positions is NULL. */
typedef struct rmsnorm_rope {
  size_t size;              /* set by rmsnorm_rope_init */
  unsigned style;           /* RMSNORM_ROPE_NEOX or RMSNORM_ROPE_GPTJ */
  size_t rotary_dim;        /* even, at most head_dim; 0 = head_dim */
  const void *cos_sin;      /* [n_positions][rotary_dim] */
  size_t n_positions;
  const int64_t *positions; /* tokens entries in [0, n_positions), or NULL */
  unsigned norm;            /* RMSNORM_ROPE_NORM_HEAD (0) or RMSNORM_ROPE_NORM_TOKEN */
} rmsnorm_rope;

static inline void rmsnorm_rope_init(rmsnorm_rope *r, unsigned style) {
  rmsnorm_rope z = {sizeof(rmsnorm_rope), style, 0, NULL, 0, NULL, RMSNORM_ROPE_NORM_HEAD};
  *r = z;
}

/* Fills cos_sin ([n_positions][rotary_dim] of dtype FP32 or FP64) for
 * positions 0..n_positions-1: frequency i has theta_i = theta^(-2i/rotary_dim)
 * and position p the angle (p / linear_factor) * theta_i, computed in double
 * and rounded once to dtype (HF computes them in float32, so its tables
 * differ in the last bits, more so at large positions). linear_factor = 1
 * is plain RoPE; > 1 is linear position interpolation (HF rope_type
 * "linear", Gemma 3's global layers use 8).
 * n_positions = 0 writes nothing (cos_sin may then be NULL).
 * @return RMSNORM_OK; RMSNORM_ERROR_NULL_POINTER; RMSNORM_ERROR_BAD_DTYPE;
 * RMSNORM_ERROR_BAD_SIZE (rotary_dim 0, or the table's size overflows);
 * RMSNORM_ERROR_BAD_ROPE (rotary_dim odd, theta <= 1, linear_factor <= 0,
 * or either not finite). */
RMSNORM_API rmsnorm_status rmsnorm_rope_table(void *cos_sin, rmsnorm_dtype dtype,
                                              size_t n_positions, size_t rotary_dim,
                                              double theta, double linear_factor);

/* Where rmsnorm_qk_norm_rope_forward also writes K (and copies V) for the
 * attention that follows: a paged or flat KV cache of cfg->dtype with rows
 * of head_dim, head h of slot s at k + s*ld_slot + h*ld_head (elements; the
 * same for v). slots: tokens entries; a negative slot skips its token
 * (vLLM's padding), another one must be < n_slots. v (optional; NULL: no V
 * copy, v_src unused): where v_src's V heads (row (t, h) at v_src +
 * t*ldv_token + h*ldv_head) are copied, bit for bit. */
typedef struct rmsnorm_kv_cache {
  size_t size;              /* set by rmsnorm_kv_cache_init */
  void *k, *v;              /* v NULL: no V copy */
  size_t n_slots, ld_slot, ld_head;
  const int64_t *slots;
  const void *v_src;
  size_t ldv_token, ldv_head;
} rmsnorm_kv_cache;

static inline void rmsnorm_kv_cache_init(rmsnorm_kv_cache *c) {
  rmsnorm_kv_cache z = {sizeof(rmsnorm_kv_cache), NULL, NULL, 0, 0, 0, NULL, NULL, 0, 0};
  *c = z;
}

/* QK-norm + RoPE forward, in one pass over each row. Arguments as
 * rmsnorm_qk_norm_forward (call once for Q and once for K, each with its
 * head count and weight: MQA/GQA), plus the rotation and an optional cache
 * (K only): the rotated row is written to y (which may be x, same strides,
 * or NULL when a cache is given) and to the cache's slot. weight: head_dim
 * values, or heads*head_dim with RMSNORM_ROPE_NORM_TOKEN (or NULL). rstd
 * (optional): one value per row (index t*heads + h), or per token with
 * RMSNORM_ROPE_NORM_TOKEN. Errors (nothing written, the cache included):
 * those of rmsnorm_qk_norm_forward; a rope or cache not filled by its init
 * RMSNORM_ERROR_BAD_CONFIG; an unknown style or norm mode, or a rotary_dim
 * odd or above head_dim RMSNORM_ERROR_BAD_ROPE; a NULL table
 * RMSNORM_ERROR_BAD_ARGUMENT; a position outside [0, n_positions) (NULL
 * positions: more tokens than n_positions) or a slot >= n_slots
 * RMSNORM_ERROR_OUT_OF_RANGE; cache (or V source) strides whose rows
 * overlap RMSNORM_ERROR_BAD_STRIDE; two tokens with the same slot, or cache
 * rows that meet each other (K and V), an input or y
 * RMSNORM_ERROR_OVERLAP; a NULL cache k or slots, v without v_src, or y
 * NULL without a cache RMSNORM_ERROR_NULL_POINTER. */
RMSNORM_API rmsnorm_status rmsnorm_qk_norm_rope_forward(
    rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t tokens, size_t heads,
    size_t head_dim, const void *x, size_t ldx_token, size_t ldx_head, const void *weight,
    const rmsnorm_rope *rope, const rmsnorm_kv_cache *cache, void *y, size_t ldy_token,
    size_t ldy_head, void *rstd);

/* QK-norm + RoPE backward: dx through the rotation's transpose and the norm
 * (dn = R^T dy per head, then rmsnorm_backward's formula with dn for dy over
 * the statistic's values: a row, or a token's heads*head_dim with
 * RMSNORM_ROPE_NORM_TOKEN), and (optional) dweight (the weight's length)
 * summed over tokens and heads in a fixed order (the same bits for any
 * thread count and kernel set; added to with RMSNORM_FLAG_ACCUMULATE).
 * rstd: the forward's or NULL (recomputed). The rounding flags are taken as
 * the identity. dx may be x or dy (same strides). dweight with a NULL
 * weight is RMSNORM_ERROR_BAD_ARGUMENT.
 * @return RMSNORM_OK or an error status (nothing written), as the forward's. */
RMSNORM_API rmsnorm_status rmsnorm_qk_norm_rope_backward(
    rmsnorm_context *ctx, const rmsnorm_config *cfg, size_t tokens, size_t heads,
    size_t head_dim, const void *x, size_t ldx_token, size_t ldx_head, const void *dy,
    size_t lddy_token, size_t lddy_head, const void *weight, const rmsnorm_rope *rope,
    const void *rstd, void *dx, size_t lddx_token, size_t lddx_head, void *dweight);

/* ---- Gated RMSNorm (Mamba2, Bamba, NemotronH, Qwen3-Next) ---------------
 * Two orders, a = act(z) with act SiLU (z * sigmoid(z)) or sigmoid, computed
 * in the compute type (float; double for fp64 data):
 *   gate first (Mamba2's norm_before_gate = False, the default):
 *       u = x * a,   y = u * r * w,   r per group of u
 *   RMSNORM_GATE_NORM_FIRST (Qwen3-Next):
 *       y = x * r * w * a,            r per group of x
 * where a row's columns form groups of `group` (0: the whole row) and each
 * group has its own r = 1/sqrt(mean over the group of v^2 + eps), v the
 * normalized input (u or x). One weight w of length d (g, 1 + g with
 * RMSNORM_FLAG_WEIGHT_OFFSET, or 1 when NULL); no bias.
 * Rounding: by default y is computed in the compute type and rounded once.
 * RMSNORM_FLAG_ROUND_BEFORE_WEIGHT gives the Hugging Face modules' roundings
 * for fp16/bf16 data: gate first, y = RT(RT(u r) w) (MambaRMSNormGated);
 * norm first, y = RT(RT(RT(x r) w) a) (Qwen3NextRMSNormGated), RT() rounding
 * to cfg->dtype. RMSNORM_FLAG_EPS_OUTSIDE is RMSNORM_ERROR_BAD_FLAGS and
 * partial != 1 RMSNORM_ERROR_BAD_PARTIAL. The formulas and the backward's
 * derivation are in src/ref/gated_ref.inc. */
typedef enum rmsnorm_gate_act {
  RMSNORM_GATE_SILU = 0,
  RMSNORM_GATE_SIGMOID = 1
} rmsnorm_gate_act;

/* Flags for rmsnorm_gate.flags. */
enum {
  RMSNORM_GATE_NORM_FIRST = 1u << 0 /* normalize x, then multiply by act(z) */
};

/* The gate of rmsnorm_gated_*. Fill it with rmsnorm_gate_init, then change
 * what differs; versioned by `size` as rmsnorm_config. */
typedef struct rmsnorm_gate {
  size_t size;          /* set by rmsnorm_gate_init */
  rmsnorm_gate_act act;
  size_t group;         /* columns per statistic: 0 = d, else a divisor of d */
  unsigned flags;       /* RMSNORM_GATE_* */
} rmsnorm_gate;

static inline void rmsnorm_gate_init(rmsnorm_gate *g, rmsnorm_gate_act act) {
  rmsnorm_gate z = {sizeof(rmsnorm_gate), act, 0, 0u};
  *g = z;
}

/* Gated RMSNorm forward. x, z, y: rows x d of cfg->dtype (strides ldx, ldz,
 * ldy); y may be x or z (same ld). rstd (optional): rows x (d / group) values
 * of the compute type, row-major, each group's r. A group that does not
 * divide d is RMSNORM_ERROR_BAD_SIZE; an unknown act or gate flag
 * RMSNORM_ERROR_BAD_ARGUMENT; a gate not filled by rmsnorm_gate_init
 * RMSNORM_ERROR_BAD_CONFIG; RMSNORM_FLAG_ACCUMULATE RMSNORM_ERROR_BAD_FLAGS.
 * @return RMSNORM_OK or an error status (nothing written). */
RMSNORM_API rmsnorm_status rmsnorm_gated_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                                 const rmsnorm_gate *gate, size_t rows, size_t d,
                                                 const void *x, size_t ldx,
                                                 const void *z, size_t ldz,
                                                 const void *weight,
                                                 void *y, size_t ldy, void *rstd);

/* Gated RMSNorm backward: dx, dz and (optional) dweight = the sum over rows
 * of dy * d y/d w, overwritten or added to with RMSNORM_FLAG_ACCUMULATE, in
 * a fixed order (the same bits for any thread count and kernel set). rstd:
 * the forward's, or NULL (recomputed). The rounding flag is taken as the
 * identity, as in rmsnorm_backward. dx may be x or dy, dz may be z (same
 * ld). dweight with a NULL weight is RMSNORM_ERROR_BAD_ARGUMENT.
 * @return RMSNORM_OK or an error status (nothing written). */
RMSNORM_API rmsnorm_status rmsnorm_gated_backward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                                  const rmsnorm_gate *gate, size_t rows, size_t d,
                                                  const void *x, size_t ldx,
                                                  const void *z, size_t ldz,
                                                  const void *dy, size_t lddy,
                                                  const void *weight, const void *rstd,
                                                  void *dx, size_t lddx,
                                                  void *dz, size_t lddz, void *dweight);

/* ---- Sandwich norms (Gemma 2 and 3) --------------------------------------
 * A Gemma 2/3 block ends each sub-layer with
 *   h' = h + post_norm(a),   x' = pre_norm(h')
 * (post_norm the sub-layer's post norm, pre_norm the next one's input norm,
 * both RMSNorm with their own weights and the same config: Gemma sets
 * RMSNORM_FLAG_WEIGHT_OFFSET). One call, one trip to memory per operand,
 * bit for bit the three separate calls: rmsnorm_forward(a) rounded to
 * cfg->dtype, the add in the compute type rounded to cfg->dtype, and
 * rmsnorm_forward(h'). h is updated in place to h'. a, h, x_next: rows x d
 * of cfg->dtype; x_next may be a (same ld), never h. rstd_post and rstd_pre
 * (optional): each norm's r per row, as rmsnorm_forward's.
 * RMSNORM_FLAG_ACCUMULATE is RMSNORM_ERROR_BAD_FLAGS.
 * @return RMSNORM_OK or an error status (nothing written, h included). */
RMSNORM_API rmsnorm_status rmsnorm_sandwich_forward(rmsnorm_context *ctx,
                                                    const rmsnorm_config *cfg,
                                                    size_t rows, size_t d,
                                                    const void *a, size_t lda,
                                                    void *h, size_t ldh,
                                                    const void *weight_post,
                                                    const void *weight_pre,
                                                    void *x_next, size_t ldxn,
                                                    void *rstd_post, void *rstd_pre);

/* Sandwich backward. h holds h' (as the forward left it); dh_out is the
 * gradient arriving on the residual stream h' (NULL: zero), dx_next that of
 * x'. With dt = dh_out + pre_norm's dx (each rounded to cfg->dtype, as two
 * calls and an add would give):
 *   dh = dt,   da = post_norm's dx from dt,
 * and dweight_pre, dweight_post (optional) as rmsnorm_backward's dweight:
 * the same bits for any thread count and kernel set, added into with
 * RMSNORM_FLAG_ACCUMULATE; a dweight whose weight is NULL is
 * RMSNORM_ERROR_BAD_ARGUMENT. dh and da are bit for bit rmsnorm_backward,
 * the add and rmsnorm_backward. rstd_post, rstd_pre: the forward's or NULL
 * (recomputed). dh may be exactly dh_out or dx_next, da exactly a or dx_next
 * (same start and ld); dh and da never meet.
 * @return RMSNORM_OK or an error status (nothing written). */
RMSNORM_API rmsnorm_status rmsnorm_sandwich_backward(rmsnorm_context *ctx,
                                                     const rmsnorm_config *cfg,
                                                     size_t rows, size_t d,
                                                     const void *a, size_t lda,
                                                     const void *h, size_t ldh,
                                                     const void *dh_out, size_t lddh_out,
                                                     const void *dx_next, size_t lddxn,
                                                     const void *weight_post,
                                                     const void *weight_pre,
                                                     const void *rstd_post, const void *rstd_pre,
                                                     void *da, size_t ldda,
                                                     void *dh, size_t lddh,
                                                     void *dweight_post, void *dweight_pre);

/* RMSNorm + linear with the gain folded into the weights (FlashNorm):
 *   Z = RMSNorm(X) W + bias = diag(r) (X W') + bias,   W' = diag(w) W,
 * w = g, 1 + g (RMSNORM_FLAG_WEIGHT_OFFSET) or 1 (weight NULL), r the per-row
 * rstd of X. The matrices W, W' (d x n) and dW are row-major in the compute
 * type: float, double for fp64 data. The GEMMs come from the BLAS found at
 * build time (cblas_sgemm/dgemm; fp16/bf16 rows are widened to float in
 * chunks); a build without one returns RMSNORM_ERROR_NOT_AVAILABLE. The
 * GEMMs run on the BLAS's own threads, set the BLAS's way (OpenBLAS:
 * OPENBLAS_NUM_THREADS or openblas_set_num_threads()), never changed by this
 * library; the library's own steps (statistics, scaling) use the context's
 * threads, and the two never run at once within a call. */

/* @return RMSNORM_OK when rmsnorm_linear_* can run (a BLAS was built in),
 * else RMSNORM_ERROR_NOT_AVAILABLE. */
RMSNORM_API rmsnorm_status rmsnorm_linear_available(void);

/* Folds the gain into the weights once: W'_jk = w_j * W_jk, computed in the
 * compute type (w_j as rmsnorm_forward forms it). weight: d of
 * cfg->param_dtype or NULL (then W' = W). W' may be W (same ld). Needs no BLAS.
 * @return RMSNORM_OK or an error status (nothing written). */
RMSNORM_API rmsnorm_status rmsnorm_fold_weight(const rmsnorm_config *cfg, size_t d, size_t n,
                                               const void *weight, const void *w, size_t ldw,
                                               void *w_folded, size_t ldwf);

/* Z = diag(r) (X W') + bias. x: rows x d of cfg->dtype; w_folded: d x n
 * (compute type, ldwf >= n); bias: n of cfg->param_dtype or NULL; z: rows x n
 * of cfg->dtype (ldz >= n), rounded once from the compute type; rstd
 * (optional) receives r as rmsnorm_forward's. Agrees with rmsnorm_forward
 * followed by a GEMM within the compute type's rounding (not bit for bit).
 * RMSNORM_FLAG_ROUND_BEFORE_WEIGHT and RMSNORM_FLAG_ACCUMULATE are
 * RMSNORM_ERROR_BAD_FLAGS (the normalized rows are never formed).
 * @return RMSNORM_OK or an error status (nothing written);
 * RMSNORM_ERROR_NOT_AVAILABLE without a BLAS; sizes above INT_MAX are
 * RMSNORM_ERROR_BAD_SIZE. */
RMSNORM_API rmsnorm_status rmsnorm_linear_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                                  size_t rows, size_t d, size_t n,
                                                  const void *x, size_t ldx,
                                                  const void *w_folded, size_t ldwf,
                                                  const void *bias,
                                                  void *z, size_t ldz, void *rstd);

/* Backward of rmsnorm_linear_forward, matching autograd of the unfused
 * Z = RMSNorm(X; g) W + bias (derivation in src/api/linear.c). Given dz (rows x n
 * of cfg->dtype), writes dx (rows x d of cfg->dtype), and when non-NULL
 * dweight (d, the gain's gradient, cfg->param_dtype), dw (d x n, the gradient
 * of the unfolded W, compute type, stride lddw) and dbias (n,
 * cfg->param_dtype); RMSNORM_FLAG_ACCUMULATE adds into them. Needs weight
 * (g, or NULL), w (the unfolded W, needed for dweight only, else may be NULL)
 * and w_folded. r is recomputed from x (one read of x, nothing beside the
 * GEMMs). dx may be x (same ld).
 * @return RMSNORM_OK or an error status (nothing written);
 * RMSNORM_ERROR_NOT_AVAILABLE without a BLAS; dweight without weight or w is
 * RMSNORM_ERROR_BAD_ARGUMENT. */
RMSNORM_API rmsnorm_status rmsnorm_linear_backward(rmsnorm_context *ctx,
                                                   const rmsnorm_config *cfg,
                                                   size_t rows, size_t d, size_t n,
                                                   const void *x, size_t ldx,
                                                   const void *weight,
                                                   const void *w, size_t ldw,
                                                   const void *w_folded, size_t ldwf,
                                                   const void *dz, size_t lddz,
                                                   void *dx, size_t lddx,
                                                   void *dweight, void *dw, size_t lddw,
                                                   void *dbias);

/* ---- Sharded hidden dimension: rows split by columns across processes ----
 * With tensor parallelism over the hidden dimension, each process holds a
 * column shard: columns [offset, offset + width) of every row of d_global
 * columns. RMSNorm then needs one sum of rows doubles over the shards in the
 * forward and one in the backward; these steps do everything else, so any
 * transport can carry the sums (librmsnorm_mpi does it with MPI, see
 * rmsnorm_mpi.h). Per call, every holder of a shard runs:
 *
 *   forward:  rmsnorm_shard_stats(x)              -> p  (rows doubles)
 *             s = the sum of p over the shards          (all-reduce)
 *             rmsnorm_shard_forward(x, s)         -> y  (keep s for the backward)
 *   backward: rmsnorm_shard_backward_dots(x, dy, s) -> q  (rows doubles)
 *             t = the sum of q over the shards          (all-reduce)
 *             rmsnorm_shard_backward(x, dy, s, t) -> dx, dweight, dbias
 *
 * s is each row's sum of x_j^2 over its first k = ceil(partial * d_global)
 * columns (pRMSNorm: only the shards holding columns below k add anything),
 * t its sum over all columns of dy_j w_j x_j r. The result is RMSNorm of the
 * whole rows, as rmsnorm_forward/backward define it, with every option they
 * take (dtypes, weight with or without the offset, bias, eps inside or
 * outside, partial, rounding before the weight, accumulation); LayerNorm is
 * not offered. weight, bias, dweight and dbias hold the shard's width
 * elements; dweight and dbias are summed over this call's rows only (see
 * rmsnorm_mpi_backward for replicas). Strides, dtypes and in-place rules are
 * those of rmsnorm_forward/backward; a shard of width 0 is valid (its partial
 * sums are 0 and its matrices may be NULL); s and t are checked to be sums of
 * squares (no negative value: RMSNORM_ERROR_BAD_ARGUMENT).
 *
 * Order of the sums: element t of the shard is added in the lane and block of
 * its global column offset + t in the library's blocked row sums (docs/sharding.md,
 * Numerics); a shard that starts inside a block adds its part of that block,
 * lanes halved, to the rest in double. With every shard boundary a multiple
 * of the block (1024 columns for fp32/fp16/bf16 data, 512 for fp64) the
 * partials consist of the unsharded row's own block sums, and only the order
 * of the final additions differs (docs/sharding.md, "Numerics", says
 * what that means for the bits). fp32/fp16/bf16 partials that the compute
 * type cannot hold (overflow, or sums below 2^-100) are recomputed in double,
 * where their squares are exact; an fp64 row whose sum of squares leaves
 * double's range (|x| above about 1e154) gives NaN outputs, and so does an
 * infinity in fp64 data (its s is the same +inf; fp32/fp16/bf16 data follow
 * rmsnorm_forward's rule for it, r = 0). */

/* Per-row partial statistic of a shard: partial[i] = sum of x_ij^2 over the
 * shard's columns below k, in the order above. x: rows x width of cfg->dtype.
 * @return RMSNORM_OK or an error status (nothing written); a shard outside
 * the row (offset + width > d_global) or d_global = 0 is
 * RMSNORM_ERROR_BAD_SIZE. */
RMSNORM_API rmsnorm_status rmsnorm_shard_stats(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                               size_t rows, size_t d_global, size_t offset,
                                               size_t width, const void *x, size_t ldx,
                                               double *partial);

/* Forward of the shard's columns from the summed statistics s (rows
 * doubles): r = 1/sqrt(s/k + eps) (or 1/(sqrt(s/k) + eps)), y_j = x_j r w_j
 * + b_j, computed as rmsnorm_forward computes a row from its sum. rstd
 * (optional) as rmsnorm_forward's. y may be x (same ldy).
 * @return RMSNORM_OK or an error status (nothing written). */
RMSNORM_API rmsnorm_status rmsnorm_shard_forward(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                                 size_t rows, size_t d_global, size_t offset,
                                                 size_t width, const void *x, size_t ldx,
                                                 const void *weight, const void *bias,
                                                 const double *stats, void *y, size_t ldy,
                                                 void *rstd);

/* Per-row partial of the backward's dot product: partial[i] = sum over the
 * shard's columns of gy_j xhat_j, gy_j = dy_j w_j, xhat_j = x_j r with r from
 * the summed statistics (the forward's stats). weight: width elements or
 * NULL, as in the forward.
 * @return RMSNORM_OK or an error status (nothing written). */
RMSNORM_API rmsnorm_status rmsnorm_shard_backward_dots(rmsnorm_context *ctx,
                                                       const rmsnorm_config *cfg, size_t rows,
                                                       size_t d_global, size_t offset,
                                                       size_t width, const void *x, size_t ldx,
                                                       const void *dy, size_t lddy,
                                                       const void *weight, const double *stats,
                                                       double *partial);

/* Backward of the shard's columns from the summed statistics (stats) and
 * dot products (dots): dx_j = r (gy_j - [j < k] xhat_j c) with c = dots/k
 * (eps outside: as rmsnorm_backward), and, when non-NULL, dweight and dbias of
 * the shard's columns summed over the rows (overwritten, or added to with
 * RMSNORM_FLAG_ACCUMULATE; same fixed order as rmsnorm_backward). dx may be
 * dy or x (same ld).
 * @return RMSNORM_OK or an error status (nothing written); dweight with a
 * NULL weight is RMSNORM_ERROR_BAD_ARGUMENT. */
RMSNORM_API rmsnorm_status rmsnorm_shard_backward(rmsnorm_context *ctx,
                                                  const rmsnorm_config *cfg, size_t rows,
                                                  size_t d_global, size_t offset, size_t width,
                                                  const void *x, size_t ldx, const void *dy,
                                                  size_t lddy, const void *weight,
                                                  const double *stats, const double *dots,
                                                  void *dx, size_t lddx, void *dweight,
                                                  void *dbias);

/* ---- Plans: one call prepared once, for loops that repeat it -----------
 * A decode loop calls the same operation on the same shapes at every token,
 * where a call's fixed cost (argument checks, the overlap rule, the lock, the
 * thread decision, weight conversion) is as large as its arithmetic. A plan
 * pays it once, in XNNPACK's steps:
 *   create   the context, the config and the operation (checked; the config
 *            is copied);
 *   reshape  rows, d and the strides (checked); the kernel set and the
 *            thread split, read from the context now;
 *   setup    the buffers (checked as the one-shot call checks them); weight
 *            and bias read into the compute type now when they must be
 *            converted (another dtype, 1 + g, a misaligned address): call
 *            setup again after changing their values;
 *   run      the arithmetic: bit for bit the one-shot call's results. A run
 *            that the split keeps on the caller's thread takes no lock (a
 *            backward's reduction scratch is the plan's own).
 * Reshape again after rmsnorm_context_set_isa or _set_threads. A plan is used
 * by one thread at a time; several plans and one-shot calls may share a
 * context. Free the plans before their context. */
typedef struct rmsnorm_plan rmsnorm_plan;

typedef enum rmsnorm_plan_op {
  RMSNORM_PLAN_FORWARD = 0,           /* rmsnorm_forward */
  RMSNORM_PLAN_LAYERNORM_FORWARD = 1, /* rmsnorm_layernorm_forward */
  RMSNORM_PLAN_ADD_FORWARD = 2,       /* rmsnorm_add_forward */
  RMSNORM_PLAN_BACKWARD = 3,          /* rmsnorm_backward */
  RMSNORM_PLAN_LAYERNORM_BACKWARD = 4, /* rmsnorm_layernorm_backward */
  RMSNORM_PLAN_SANDWICH_FORWARD = 5,   /* rmsnorm_sandwich_forward */
  RMSNORM_PLAN_FORWARD_QUANTIZED = 6,  /* rmsnorm_forward_quantized */
  RMSNORM_PLAN_ADD_FORWARD_QUANTIZED = 7, /* rmsnorm_add_forward_quantized */
  RMSNORM_PLAN_GATED_FORWARD = 8       /* rmsnorm_gated_forward */
} rmsnorm_plan_op;

/* Creates a plan of op with cfg (the flags op's one-shot call takes).
 * @return RMSNORM_OK, RMSNORM_ERROR_NULL_POINTER, the config's statuses,
 * RMSNORM_ERROR_BAD_ARGUMENT (unknown op), RMSNORM_ERROR_OUT_OF_MEMORY
 * (*plan is then NULL). */
RMSNORM_API rmsnorm_status rmsnorm_plan_create(rmsnorm_context *ctx, const rmsnorm_config *cfg,
                                               rmsnorm_plan_op op, rmsnorm_plan **plan);
/* Sizes: rows x d, the strides of the one-shot call: ldx and ldy (forward:
 * x, y; add: h, y; backward: x, dx; sandwich: a, x_next; gated: x, y;
 * quantized: x or h, and 0: the codes' stride comes at setup) and ldu
 * (add's and add + quantized's u, the backward's dy, sandwich's h, gated's
 * z; 0 for the others). rows may be 0 (run then writes nothing). A failed
 * reshape leaves the plan unshaped.
 * @return RMSNORM_OK, RMSNORM_ERROR_NULL_POINTER, RMSNORM_ERROR_BAD_SIZE,
 * RMSNORM_ERROR_BAD_STRIDE, RMSNORM_ERROR_BAD_ARGUMENT (ldu set for an
 * operation without u, ldy set for a quantized plan). */
RMSNORM_API rmsnorm_status rmsnorm_plan_reshape(rmsnorm_plan *plan, size_t rows, size_t d,
                                                size_t ldx, size_t ldu, size_t ldy);
/* Buffers of a forward plan (RMSNorm or LayerNorm): as rmsnorm_forward /
 * rmsnorm_layernorm_forward (mean: LayerNorm only, NULL for RMSNorm).
 * @return RMSNORM_OK or their statuses; RMSNORM_ERROR_BAD_ARGUMENT when the
 * plan is not shaped or is of another operation, or mean is given to an
 * RMSNorm plan; RMSNORM_ERROR_OUT_OF_MEMORY. A failed setup leaves the plan
 * without buffers. */
RMSNORM_API rmsnorm_status rmsnorm_plan_setup_forward(rmsnorm_plan *plan, const void *x,
                                                      const void *weight, const void *bias,
                                                      void *y, void *mean, void *rstd);
/* Buffers of an add plan: as rmsnorm_add_forward (h updated in place each
 * run). @return as rmsnorm_plan_setup_forward. */
RMSNORM_API rmsnorm_status rmsnorm_plan_setup_add(rmsnorm_plan *plan, void *h, const void *u,
                                                  const void *weight, const void *bias,
                                                  void *y, void *rstd);
/* Buffers of a backward plan (RMSNorm or LayerNorm): as rmsnorm_backward /
 * rmsnorm_layernorm_backward (mean: LayerNorm only, NULL for RMSNorm);
 * dweight and dbias are overwritten at each run, or added to with
 * RMSNORM_FLAG_ACCUMULATE. The reduction's scratch is the plan's own, so a
 * run on the caller's thread takes no lock. @return as
 * rmsnorm_plan_setup_forward; RMSNORM_ERROR_BAD_ARGUMENT also for dweight
 * with a NULL weight. */
RMSNORM_API rmsnorm_status rmsnorm_plan_setup_backward(rmsnorm_plan *plan, const void *x,
                                                       const void *dy, const void *weight,
                                                       const void *mean, const void *rstd,
                                                       void *dx, void *dweight, void *dbias);
/* Buffers of a sandwich plan: as rmsnorm_sandwich_forward (h updated in
 * place each run; weight_pre, when converted, read at setup as weight_post
 * is). @return as rmsnorm_plan_setup_forward. */
RMSNORM_API rmsnorm_status rmsnorm_plan_setup_sandwich(rmsnorm_plan *plan, const void *a,
                                                       void *h, const void *weight_post,
                                                       const void *weight_pre, void *x_next,
                                                       void *rstd_post, void *rstd_pre);
/* Buffers and format of a quantized plan: as rmsnorm_forward_quantized
 * (the descriptor q, read now, and the codes' stride ldc with it). The
 * weight and bias are also tested for NaN and infinity here: set up again
 * after changing their values. @return as rmsnorm_plan_setup_forward, and
 * rmsnorm_forward_quantized's statuses for q, ldc, scales and lds. */
RMSNORM_API rmsnorm_status rmsnorm_plan_setup_quantized(rmsnorm_plan *plan, const void *x,
                                                        const void *weight, const void *bias,
                                                        const rmsnorm_quant *q, void *codes,
                                                        size_t ldc, void *scales, size_t lds,
                                                        void *rstd);
/* The same for an add + quantized plan: as rmsnorm_add_forward_quantized
 * (h updated in place each run). */
RMSNORM_API rmsnorm_status rmsnorm_plan_setup_add_quantized(rmsnorm_plan *plan, void *h,
                                                            const void *u, const void *weight,
                                                            const void *bias,
                                                            const rmsnorm_quant *q,
                                                            void *codes, size_t ldc,
                                                            void *scales, size_t lds,
                                                            void *rstd);
/* Buffers and gate of a gated plan: as rmsnorm_gated_forward (the gate read
 * now). @return as rmsnorm_plan_setup_forward, and the gate's statuses. */
RMSNORM_API rmsnorm_status rmsnorm_plan_setup_gated(rmsnorm_plan *plan,
                                                    const rmsnorm_gate *gate, const void *x,
                                                    const void *z, const void *weight, void *y,
                                                    void *rstd);
/* Runs the plan on its buffers. @return RMSNORM_OK, RMSNORM_ERROR_NULL_POINTER,
 * RMSNORM_ERROR_BAD_ARGUMENT (not set up since the last reshape). */
RMSNORM_API rmsnorm_status rmsnorm_plan_run(rmsnorm_plan *plan);
/* Frees a plan (NULL is accepted). */
RMSNORM_API void rmsnorm_plan_free(rmsnorm_plan *plan);

#ifdef __cplusplus
}
#endif

#endif /* RMSNORM_H */
