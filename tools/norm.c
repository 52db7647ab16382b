/* norm.c - the norm subcommands (forward, backward, layernorm,
 * layernorm-backward, the fused add-forward, sandwich and linear, gated, and
 * qk-rope):
 * one option parser, parameterized by a table of what each command takes, and
 * two runners (row-wise norms; the norm followed by a matrix product). Inputs are
 * mapped, checked against each other, handed to the library, and the outputs
 * written all-or-nothing. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "npy.h"
#include "outfile.h"
#include "rmsnorm.h"

/* ---- what each command takes ------------------------------------------ */

typedef enum op_kind {
  OP_RMS_FORWARD,
  OP_RMS_BACKWARD,
  OP_LN_FORWARD,
  OP_LN_BACKWARD,
  OP_ADD_FORWARD, /* h' = h + u, y = RMSNorm(h') */
  OP_SANDWICH,    /* h' = h + post_norm(a), y = pre_norm(h') (Gemma 2/3) */
  OP_GATED,       /* y = RMSNorm(x act(z)) g, or RMSNorm(x) g act(z) */
  OP_QK_ROPE,     /* per head: y = rotate(RMSNorm(x) g, position) */
  OP_LINEAR       /* Z = RMSNorm(X) W + bias, the gain folded into W */
} op_kind;

/* option bits */
enum {
  O_OUT = 1u << 0,
  O_EPS = 1u << 1,
  O_EPS_OUTSIDE = 1u << 2,
  O_OFFSET = 1u << 3,
  O_PARTIAL = 1u << 4,
  O_WEIGHT = 1u << 5,
  O_BIAS = 1u << 6,
  O_BF16 = 1u << 7,
  O_DIMS = 1u << 8,
  O_RSTD = 1u << 9,
  O_MEAN = 1u << 10,
  O_DWEIGHT = 1u << 11,
  O_DBIAS = 1u << 12,
  O_RESIDUAL_OUT = 1u << 13,
  O_LINEAR_BIAS = 1u << 14,
  O_QUANT = 1u << 15,
  O_SCALES = 1u << 16,
  O_GROUP = 1u << 17,
  O_POW2 = 1u << 18,
  O_STATIC_SCALE = 1u << 19,
  O_PRE_WEIGHT = 1u << 20,
  O_POST_WEIGHT = 1u << 21,
  O_POST_RSTD = 1u << 22,
  O_ACT = 1u << 23,
  O_NORM_FIRST = 1u << 24,
  O_GATE_GROUP = 1u << 25,
  O_THETA = 1u << 26,
  O_LINEAR_FACTOR = 1u << 27,
  O_ROTARY_DIM = 1u << 28,
  O_STYLE = 1u << 29,
  O_START = 1u << 30
};
/* beyond int's range, so not enumerators: the option sets are 64 bits */
#define O_COS_SIN (1u << 31)
#define O_ACROSS_HEADS ((uint64_t)1 << 32)
#define O_E8M0 ((uint64_t)1 << 33)

/* The quantized formats by their names on the command line, in the order
 * --help lists them. */
typedef struct qformat_def {
  const char *name;
  rmsnorm_qformat format;
  size_t block;     /* the row length must be a multiple of it (0: any) */
  int scales;       /* 0: inside the blocks; 1: float32 scales; 2: E8M0 bytes */
  npy_dtype codes;  /* the codes file's dtype */
} qformat_def;

static const qformat_def qformat_defs[] = {
  {"int8", RMSNORM_QF_INT8, 0, 1, NPY_I8},
  {"fp8_e4m3", RMSNORM_QF_FP8_E4M3, 0, 1, NPY_U8},
  {"q8_0", RMSNORM_QF_Q8_0, 32, 0, NPY_U8},
  {"q8_1", RMSNORM_QF_Q8_1, 32, 0, NPY_U8},
  {"q8_k", RMSNORM_QF_Q8_K, 256, 0, NPY_U8},
  {"mxfp8", RMSNORM_QF_MXFP8_E4M3, 32, 2, NPY_U8},
  {"mxfp4", RMSNORM_QF_MXFP4, 32, 0, NPY_U8},
};
#define N_QFORMATS (sizeof qformat_defs / sizeof qformat_defs[0])
#define QFORMAT_NAMES "int8, fp8_e4m3, q8_0, q8_1, q8_k, mxfp8, mxfp4"

/* int8 and fp8_e4m3: the formats with per-row or per-group scales */
static int has_groups(const qformat_def *f) {
  return f->format == RMSNORM_QF_INT8 || f->format == RMSNORM_QF_FP8_E4M3;
}

typedef struct option_def {
  const char *name; /* without the leading "--" */
  uint64_t bit;
  const char *arg;  /* the value's name, NULL for a switch */
  const char *help;
} option_def;

/* In the order --help lists them. */
static const option_def option_defs[] = {
  {"output", O_OUT, "FILE", "the result (Y or DX): X's shape and dtype"},
  {"mean", O_MEAN, "FILE", "each row's mean: float32, X's leading (row) shape"},
  {"residual-out", O_RESIDUAL_OUT, "FILE", "h' = h + u: H's shape and dtype (H is not changed)"},
  {"rstd", O_RSTD, "FILE", "each row's r: float32, X's leading (row) shape"},
  {"post-rstd", O_POST_RSTD, "FILE", "post_norm's r of each row of A: float32, the row shape"},
  {"dweight", O_DWEIGHT, "FILE", "dL/dg: the normalized shape, in the weight's dtype"},
  {"dbias", O_DBIAS, "FILE", "dL/db: the normalized shape, in the weight's dtype"},
  {"weight", O_WEIGHT, "FILE", "the gain g: the normalized shape; '<f4' or X's dtype"},
  {"post-weight", O_POST_WEIGHT, "FILE", "post_norm's gain (on A): the normalized shape"},
  {"pre-weight", O_PRE_WEIGHT, "FILE", "pre_norm's gain (on h'): the same shape and dtype"},
  {"bias", O_BIAS, "FILE", "the bias b: as the weight, and in its dtype"},
  {"linear-bias", O_LINEAR_BIAS, "FILE", "added to Z: shape (N,), in the weight's dtype"},
  {"quant", O_QUANT, "FORMAT", "Y's codes to -o: int8 fp8_e4m3 q8_0 q8_1 q8_k mxfp8 mxfp4"},
  {"scales", O_SCALES, "FILE", "int8/fp8_e4m3/mxfp8 --quant: the scales (required)"},
  {"group", O_GROUP, "G", "int8/fp8_e4m3: a scale per G columns (a multiple of 32)"},
  {"pow2-scale", O_POW2, NULL, "int8/fp8_e4m3: scales rounded up to a power of two"},
  {"e8m0-scale", O_E8M0, NULL, "int8/fp8_e4m3: those scales as E8M0 bytes ('|u1')"},
  {"static-scale", O_STATIC_SCALE, "S", "int8/fp8_e4m3: one given scale for all (no --scales)"},
  {"act", O_ACT, "A", "the gate's activation act(z): silu (default) or sigmoid"},
  {"group", O_GATE_GROUP, "G", "one r per G columns, G dividing the row (default: the row)"},
  {"norm-first", O_NORM_FIRST, NULL, "y = RMSNorm(x) g act(z) (Qwen3-Next): the gate after"},
  {"style", O_STYLE, "S", "neox (rotate-half, the default) or gptj (interleaved pairs)"},
  {"rotary-dim", O_ROTARY_DIM, "R", "rotate the first R columns (even; default head_dim)"},
  {"theta", O_THETA, "T", "the base of the frequencies (default 10000)"},
  {"linear-factor", O_LINEAR_FACTOR, "F", "positions divided by F (linear scaling; default 1)"},
  {"start", O_START, "P", "the first token's position (default 0)"},
  {"cos-sin", O_COS_SIN, "FILE", "a table (positions, R): cos then sin ('<f4'; '<f8' data: '<f8')"},
  {"across-heads", O_ACROSS_HEADS, NULL, "one r per token over all its heads (OLMo 2)"},
  {"eps", O_EPS, "E", "finite, >= 0 (default: 2^-23; 2^-52 for '<f8' data)"},
  {"eps-outside", O_EPS_OUTSIDE, NULL, "r = 1/(sqrt(mean(x^2)) + eps), the paper's code"},
  {"offset", O_OFFSET, NULL, "multiply by (1 + g) instead of g (Gemma)"},
  {"partial", O_PARTIAL, "P", "pRMSNorm: mean(x^2) over the first ceil(P*d) of d"},
  {"dims", O_DIMS, "K", "normalize over the last K axes (default 1)"},
  {"bf16", O_BF16, NULL, "bfloat16 data: arrays are '<u2' of raw bf16 bits"},
};
#define N_OPTION_DEFS (sizeof option_defs / sizeof option_defs[0])

#define COMMON_OPTS (O_OUT | O_EPS | O_OFFSET | O_WEIGHT | O_BIAS | O_BF16 | O_DIMS)
#define QUANT_OPTS (O_QUANT | O_SCALES | O_GROUP | O_POW2 | O_E8M0 | O_STATIC_SCALE)

typedef struct op_spec {
  const char *name;
  op_kind kind;
  int inputs;          /* 1: X; 2: X and DY (H and U, X and W) */
  const char *in_text; /* the inputs, for the usage error */
  const char *out_text; /* the output, for the usage error */
  uint64_t options;
  const char *synopsis;
  const char *about;
} op_spec;

static const op_spec op_specs[] = {
  {"forward", OP_RMS_FORWARD, 1, "X.npy", "Y.npy",
   COMMON_OPTS | O_EPS_OUTSIDE | O_PARTIAL | O_RSTD | QUANT_OPTS,
   "X.npy -o Y.npy [--rstd R.npy] [options]\n"
   "       rmsnorm forward X.npy --quant FORMAT -o CODES.npy [--scales S.npy]\n"
   "               [--group G] [--pow2-scale | --e8m0-scale | --static-scale S]\n"
   "               [--rstd R.npy] [options]",
   "RMSNorm of each row of X (the last axis, or the last K with --dims K):\n"
   "  y = x * r * g + b,  r = 1/sqrt(mean(x^2) + eps)\n"
   "With --quant, Y is written in an 8- or 4-bit format instead: -o gets the\n"
   "codes (int8 '|i1', fp8_e4m3 and mxfp8 '|u1' E4M3 bits: X's shape; the blocks\n"
   "of q8_0, q8_1, q8_k, mxfp4: '|u1', (rows..., bytes per row)), and --scales\n"
   "the scales of int8 and fp8_e4m3 ('<f4', or '|u1' E8M0 with --e8m0-scale,\n"
   "(rows..., d/G or 1); none with --static-scale) or mxfp8 ('|u1' E8M0,\n"
   "(rows..., d/32)); the block formats keep theirs inside. The row length must\n"
   "be a multiple of the block (32; q8_k 256) or group."},
  {"backward", OP_RMS_BACKWARD, 2, "X.npy DY.npy", "DX.npy",
   COMMON_OPTS | O_EPS_OUTSIDE | O_PARTIAL | O_DWEIGHT | O_DBIAS,
   "X.npy DY.npy -o DX.npy [--dweight DG.npy] [--dbias DB.npy] [options]",
   "Gradients of RMSNorm given X and the output gradient DY (r recomputed from X):\n"
   "dx, and with --dweight / --dbias the sums over rows of dy*x*r and of dy.\n"
   "The options must be those of the forward; --bias does not change the gradients."},
  {"layernorm", OP_LN_FORWARD, 1, "X.npy", "Y.npy", COMMON_OPTS | O_MEAN | O_RSTD,
   "X.npy -o Y.npy [--mean M.npy] [--rstd R.npy] [options]",
   "LayerNorm of each row of X (the last axis, or the last K with --dims K):\n"
   "  y = (x - mean) * r * g + b,  r = 1/sqrt(var + eps), var biased (as torch)\n"
   "The default eps is 2^-23 as for RMSNorm; torch.nn.LayerNorm uses --eps 1e-5."},
  {"layernorm-backward", OP_LN_BACKWARD, 2, "X.npy DY.npy", "DX.npy",
   COMMON_OPTS | O_DWEIGHT | O_DBIAS,
   "X.npy DY.npy -o DX.npy [--dweight DG.npy] [--dbias DB.npy] [options]",
   "Gradients of LayerNorm given X and the output gradient DY (mean and r\n"
   "recomputed from X): dx, and with --dweight / --dbias the sums over rows of\n"
   "dy*xhat and of dy. --bias does not change the gradients."},
  {"add-forward", OP_ADD_FORWARD, 2, "H.npy U.npy", "Y.npy",
   COMMON_OPTS | O_EPS_OUTSIDE | O_PARTIAL | O_RSTD | O_RESIDUAL_OUT | QUANT_OPTS,
   "H.npy U.npy -o Y.npy [--residual-out H2.npy] [--rstd R.npy] [options]\n"
   "       rmsnorm add-forward H.npy U.npy --quant FORMAT -o CODES.npy\n"
   "               [--scales S.npy] [--group G]\n"
   "               [--pow2-scale | --e8m0-scale | --static-scale S]\n"
   "               [--residual-out H2.npy] [--rstd R.npy] [options]",
   "Residual add + RMSNorm in one pass (a pre-norm transformer block): the\n"
   "residual stream H plus a sub-layer's output U (same shape and dtype),\n"
   "  h' = h + u  (rounded to H's dtype),  y = RMSNorm(h')  as forward gives it.\n"
   "H.npy is read, never changed: --residual-out writes h' (naming H.npy itself\n"
   "replaces it, all-or-nothing, like every output). --quant writes Y's codes\n"
   "and scales as forward's --quant does (see 'rmsnorm forward --help')."},
  {"sandwich", OP_SANDWICH, 2, "H.npy A.npy", "Y.npy",
   O_OUT | O_EPS | O_EPS_OUTSIDE | O_OFFSET | O_PARTIAL | O_BF16 | O_DIMS | O_RSTD | O_POST_RSTD |
       O_POST_WEIGHT | O_PRE_WEIGHT | O_RESIDUAL_OUT,
   "H.npy A.npy -o Y.npy [--residual-out H2.npy] [--post-weight G1.npy]\n"
   "               [--pre-weight G2.npy] [--post-rstd R1.npy] [--rstd R2.npy] [options]",
   "Gemma 2/3's sandwich norms in one pass: the residual stream H and a\n"
   "sub-layer's output A (same shape and dtype), two RMSNorms with their own\n"
   "gains and the same options (Gemma: --offset),\n"
   "  h' = h + post_norm(a)  (rounded to H's dtype),  y = pre_norm(h')\n"
   "bit for bit 'forward A', the add, and 'forward' of h'. H.npy is read, never\n"
   "changed: --residual-out writes h' (naming H.npy itself replaces it)."},
  {"gated", OP_GATED, 2, "X.npy Z.npy", "Y.npy",
   O_OUT | O_EPS | O_OFFSET | O_WEIGHT | O_BF16 | O_DIMS | O_RSTD | O_ACT | O_GATE_GROUP |
       O_NORM_FIRST,
   "X.npy Z.npy -o Y.npy [--weight G.npy] [--act silu|sigmoid] [--group G]\n"
   "               [--norm-first] [--rstd R.npy] [options]",
   "Gated RMSNorm (Mamba2, Qwen3-Next) of X with the gate Z (same shape and\n"
   "dtype), a = act(z):\n"
   "  gate first (default):  y = RMSNorm(x * a) * g\n"
   "  --norm-first:          y = RMSNorm(x) * g * a\n"
   "with one r = 1/sqrt(mean(v^2) + eps) per group of G columns (--group G, a\n"
   "divisor of the row; default the whole row)."},
  {"qk-rope", OP_QK_ROPE, 1, "X.npy", "Y.npy",
   O_OUT | O_EPS | O_OFFSET | O_WEIGHT | O_BF16 | O_RSTD | O_STYLE | O_ROTARY_DIM | O_THETA |
       O_LINEAR_FACTOR | O_START | O_COS_SIN | O_ACROSS_HEADS,
   "X.npy -o Y.npy [--weight G.npy] [--style neox|gptj] [--rotary-dim R]\n"
   "               [--theta T] [--linear-factor F | --cos-sin TABLE.npy]\n"
   "               [--start P] [--across-heads] [--rstd R.npy] [options]",
   "QK-norm + RoPE (Qwen3, OLMo 2, Gemma 3) of Q or K, X of shape\n"
   "(..., seq, heads, head_dim): each head's row is normalized over head_dim\n"
   "with the gain g (head_dim,), then its first R columns are rotated by the\n"
   "angle of its position, start + its index along the seq axis:\n"
   "  n = x * r * g,  (a, b) -> (a cos - b sin, b cos + a sin)\n"
   "over the pairs (i, i + R/2) (neox) or (2i, 2i + 1) (gptj), frequency i at\n"
   "theta^(-2i/R) / F. --cos-sin gives the table instead: row p holds the cos of\n"
   "the R/2 frequencies at position p, then their sin. --across-heads (OLMo 2)\n"
   "normalizes each token's heads together, one r over heads*head_dim values,\n"
   "with g of (heads*head_dim,) or (heads, head_dim); each head is then rotated."},
  {"linear", OP_LINEAR, 2, "X.npy W.npy", "Z.npy",
   O_OUT | O_RSTD | O_WEIGHT | O_LINEAR_BIAS | O_EPS | O_EPS_OUTSIDE | O_OFFSET | O_PARTIAL |
       O_BF16,
   "X.npy W.npy -o Z.npy [--weight G.npy] [--linear-bias B.npy] [--rstd R.npy] [options]",
   "RMSNorm of each row of X (the last axis, d) followed by a linear layer,\n"
   "with the gain folded into the matrix (FlashNorm):\n"
   "  Z = RMSNorm(X; g) W + bias = diag(r) (X W') + bias,  W' = diag(g) W\n"
   "W: (d, N), '<f4' ('<f8' for '<f8' data), the compute type. Z: X's leading\n"
   "shape and N, in X's dtype. Needs a librmsnorm built with a BLAS."},
};

static const op_spec *find_op(const char *name) {
  for (size_t i = 0; i < sizeof op_specs / sizeof op_specs[0]; i++)
    if (!strcmp(op_specs[i].name, name)) return &op_specs[i];
  return NULL;
}

static void print_help(const op_spec *op) {
  printf("usage: rmsnorm %s %s\n\n%s\n\noptions:\n", op->name, op->synopsis, op->about);
  for (size_t i = 0; i < N_OPTION_DEFS; i++) {
    const option_def *o = &option_defs[i];
    if (!(op->options & o->bit)) continue;
    char left[40];
    snprintf(left, sizeof left, "%s--%s%s%s", o->bit == O_OUT ? "-o, " : "", o->name,
             o->arg ? " " : "", o->arg ? o->arg : "");
    const char *help = o->help;
    if (o->bit == O_OUT && op->kind == OP_LINEAR)
      help = "the result Z: X's leading shape and N, X's dtype";
    else if (o->bit == O_OUT && (op->options & O_QUANT))
      help = "Y: X's shape and dtype (with --quant: the codes)";
    else if (o->bit == O_OUT && op->kind == OP_SANDWICH)
      help = "y = pre_norm(h'): H's shape and dtype";
    else if (o->bit == O_OUT && (op->kind == OP_GATED || op->kind == OP_QK_ROPE))
      help = "the result Y: X's shape and dtype";
    else if (o->bit == O_RSTD && op->kind == OP_SANDWICH)
      help = "pre_norm's r of each row of h': float32, the row shape";
    else if (o->bit == O_RESIDUAL_OUT && op->kind == OP_SANDWICH)
      help = "h' = h + post_norm(a): H's shape and dtype (H is not changed)";
    else if (o->bit == O_RSTD && op->kind == OP_GATED)
      help = "each group's r: float32, X's row shape (and d/G with --group G)";
    else if (o->bit == O_RSTD && op->kind == OP_QK_ROPE)
      help = "each r: float32, X's shape without head_dim (--across-heads: per token)";
    else if (o->bit == O_WEIGHT && op->kind == OP_QK_ROPE)
      help = "the gain g: (head_dim,) (see --across-heads); '<f4' or X's dtype";
    printf("  %-22s %s\n", left, help);
  }
  printf("  %-22s %s\n", "-h, --help", "this help");
  printf("\nexit status: 0 success, 1 failure (file, shape, dtype, library), 2 usage error\n");
}

/* ---- parsing ------------------------------------------------------------ */

typedef struct norm_args {
  const char *in[2];
  int n_in;
  const char *out, *mean, *rstd, *dweight, *dbias, *weight, *bias, *residual_out, *linear_bias;
  const char *pre_weight, *post_weight, *post_rstd; /* sandwich */
  rmsnorm_gate_act act;                             /* gated: --act, --norm-first, --group */
  int norm_first;
  size_t gate_group;
  unsigned style;                                   /* qk-rope */
  int across_heads;
  size_t rotary_dim, start;
  double theta, linear_factor;
  int have_theta, have_factor;
  const char *cos_sin;
  int have_eps;
  double eps;
  int eps_outside, offset, bf16;
  double partial;
  int dims, have_dims;
  const qformat_def *quant; /* NULL: Y in X's dtype */
  const char *scales;
  size_t group;
  int have_group, pow2, e8m0;
  float static_scale; /* > 0 with --static-scale */
} norm_args;

static int usage_error(const op_spec *op, const char *fmt, const char *what) {
  char msg[512];
  snprintf(msg, sizeof msg, fmt, what);
  rn_cli_error("%s: %s (see 'rmsnorm %s --help')", op->name, msg, op->name);
  return RN_EXIT_USAGE;
}

/* A whole-string floating-point number. */
static int parse_double(const char *s, double *v) {
  char *end;
  errno = 0;
  *v = strtod(s, &end);
  /* overflow is out of range; underflow to (nearly) 0 is still a number */
  return *s != '\0' && *end == '\0' && !(errno == ERANGE && isinf(*v));
}

/* Stores one option's value. @return 0 or an exit code. */
static int set_option(const op_spec *op, norm_args *a, const option_def *o, const char *v) {
  switch (o->bit) {
    case O_OUT: a->out = v; break;
    case O_MEAN: a->mean = v; break;
    case O_RSTD: a->rstd = v; break;
    case O_DWEIGHT: a->dweight = v; break;
    case O_DBIAS: a->dbias = v; break;
    case O_WEIGHT: a->weight = v; break;
    case O_BIAS: a->bias = v; break;
    case O_RESIDUAL_OUT: a->residual_out = v; break;
    case O_LINEAR_BIAS: a->linear_bias = v; break;
    case O_PRE_WEIGHT: a->pre_weight = v; break;
    case O_POST_WEIGHT: a->post_weight = v; break;
    case O_POST_RSTD: a->post_rstd = v; break;
    case O_NORM_FIRST: a->norm_first = 1; break;
    case O_ACT:
      if (!strcmp(v, "silu"))
        a->act = RMSNORM_GATE_SILU;
      else if (!strcmp(v, "sigmoid"))
        a->act = RMSNORM_GATE_SIGMOID;
      else
        return usage_error(op, "--act must be silu or sigmoid, not '%s'", v);
      break;
    case O_GATE_GROUP: {
      char *end;
      errno = 0;
      unsigned long long g = strtoull(v, &end, 10);
      if (*v < '0' || *v > '9' || *end != '\0' || errno || g > SIZE_MAX)
        return usage_error(op, "--group must be a whole number (0: the whole row), not '%s'", v);
      a->gate_group = (size_t)g;
      break;
    }
    case O_STYLE:
      if (!strcmp(v, "neox"))
        a->style = RMSNORM_ROPE_NEOX;
      else if (!strcmp(v, "gptj"))
        a->style = RMSNORM_ROPE_GPTJ;
      else
        return usage_error(op, "--style must be neox or gptj, not '%s'", v);
      break;
    case O_ROTARY_DIM:
    case O_START: {
      char *end;
      errno = 0;
      unsigned long long n = strtoull(v, &end, 10);
      if (*v < '0' || *v > '9' || *end != '\0' || errno || n > SIZE_MAX ||
          (o->bit == O_ROTARY_DIM && (n == 0 || n % 2)))
        return usage_error(op, o->bit == O_START ? "--start must be a whole number, not '%s'"
                                                 : "--rotary-dim must be even and > 0, not '%s'",
                           v);
      *(o->bit == O_START ? &a->start : &a->rotary_dim) = (size_t)n;
      break;
    }
    case O_THETA:
      if (!parse_double(v, &a->theta) || !(a->theta > 1) || !isfinite(a->theta))
        return usage_error(op, "--theta must be a finite number > 1, not '%s'", v);
      a->have_theta = 1;
      break;
    case O_LINEAR_FACTOR:
      if (!parse_double(v, &a->linear_factor) || !(a->linear_factor > 0) ||
          !isfinite(a->linear_factor))
        return usage_error(op, "--linear-factor must be a finite number > 0, not '%s'", v);
      a->have_factor = 1;
      break;
    case O_COS_SIN: a->cos_sin = v; break;
    case O_ACROSS_HEADS: a->across_heads = 1; break;
    case O_EPS_OUTSIDE: a->eps_outside = 1; break;
    case O_OFFSET: a->offset = 1; break;
    case O_BF16: a->bf16 = 1; break;
    case O_SCALES: a->scales = v; break;
    case O_POW2: a->pow2 = 1; break;
    case O_E8M0: a->e8m0 = 1; break;
    case O_STATIC_SCALE: {
      double sv;
      /* the library takes a float: it must stay finite and > 0 as one */
      if (!parse_double(v, &sv) || !(sv > 0) || !((float)sv > 0) || !isfinite((float)sv))
        return usage_error(op, "--static-scale must be a number > 0 that a float holds, not '%s'",
                           v);
      a->static_scale = (float)sv;
      break;
    }
    case O_QUANT:
      a->quant = NULL;
      for (size_t k = 0; k < N_QFORMATS; k++)
        if (!strcmp(qformat_defs[k].name, v)) a->quant = &qformat_defs[k];
      if (!a->quant)
        return usage_error(op, "--quant must be one of " QFORMAT_NAMES ", not '%s'", v);
      break;
    case O_GROUP: {
      char *end;
      errno = 0;
      unsigned long long g = strtoull(v, &end, 10);
      if (*v < '0' || *v > '9' || *end != '\0' || errno || g % 32 != 0 || g > SIZE_MAX)
        return usage_error(op, "--group must be a multiple of 32 (0: one scale per row), not '%s'",
                           v);
      a->group = (size_t)g;
      a->have_group = 1;
      break;
    }
    case O_EPS:
      if (!parse_double(v, &a->eps) || !(a->eps >= 0 && isfinite(a->eps)))
        return usage_error(op, "--eps must be a finite number >= 0, not '%s'", v);
      a->have_eps = 1;
      break;
    case O_PARTIAL:
      if (!parse_double(v, &a->partial) || !(a->partial > 0 && a->partial <= 1))
        return usage_error(op, "--partial must be a number in (0, 1], not '%s'", v);
      break;
    case O_DIMS: {
      char *end;
      errno = 0;
      long k = strtol(v, &end, 10);
      if (*v == '\0' || *end != '\0' || errno || k < 1 || k > NPY_MAX_DIMS)
        return usage_error(op, "--dims must be an integer from 1 to 64, not '%s'", v);
      a->dims = (int)k;
      a->have_dims = 1;
      break;
    }
    default: break;
  }
  return 0;
}

/* Parses argv[1..argc) into a. @return 0, or -1 after --help (exit 0), or
 * an exit code. Options and inputs may come in any order; "--" ends options. */
static int parse_args(const op_spec *op, int argc, char **argv, norm_args *a) {
  memset(a, 0, sizeof *a);
  a->partial = 1.0;
  a->act = RMSNORM_GATE_SILU;
  a->style = RMSNORM_ROPE_NEOX;
  a->theta = 10000.0;
  a->linear_factor = 1.0;
  int options_done = 0;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (options_done || arg[0] != '-' || arg[1] == '\0') {
      if (a->n_in == op->inputs) return usage_error(op, "unexpected argument '%s'", arg);
      a->in[a->n_in++] = arg;
      continue;
    }
    if (!strcmp(arg, "--")) {
      options_done = 1;
      continue;
    }
    if (rn_cli_is_help(arg)) {
      print_help(op);
      return -1;
    }
    const option_def *o = NULL;
    const char *value = NULL;
    if (arg[1] == 'o') { /* -o FILE or -oFILE */
      o = &option_defs[0];
      value = arg[2] ? arg + 2 : NULL;
    } else if (arg[1] == '-') {
      const char *name = arg + 2, *eq = strchr(name, '=');
      size_t len = eq ? (size_t)(eq - name) : strlen(name);
      for (size_t k = 0; k < N_OPTION_DEFS; k++)
        if (strlen(option_defs[k].name) == len && !memcmp(option_defs[k].name, name, len) &&
            (op->options & option_defs[k].bit))
          o = &option_defs[k];
      if (o && eq) {
        if (!o->arg) return usage_error(op, "option '%s' takes no value", arg);
        value = eq + 1;
      }
    }
    if (!o) return usage_error(op, "unknown option '%s'", arg);
    if (o->arg && !value) {
      if (i + 1 == argc) return usage_error(op, "option '%s' needs a value", arg);
      value = argv[++i];
    }
    int rc = set_option(op, a, o, value);
    if (rc) return rc;
  }
  if (a->n_in < op->inputs) return usage_error(op, "missing input file (%s)", op->in_text);
  if (!a->out) return usage_error(op, "missing the output: -o %s", op->out_text);
  if (a->dweight && !a->weight)
    return usage_error(op, "%s needs --weight (the gradient of which weight?)", "--dweight");
  /* the quantized output's options: each only where the format has it */
  const char *qopt = a->scales         ? "--scales"
                     : a->have_group   ? "--group"
                     : a->pow2         ? "--pow2-scale"
                     : a->e8m0         ? "--e8m0-scale"
                     : a->static_scale ? "--static-scale"
                                       : NULL;
  if (qopt && !a->quant) return usage_error(op, "%s needs --quant", qopt);
  if (a->cos_sin && (a->have_theta || a->have_factor))
    return usage_error(op, "%s: the table fixes the angles (no --cos-sin with it)",
                       a->have_theta ? "--theta" : "--linear-factor");
  if (a->quant) {
    const char *name = a->quant->name;
    char msg[160];
    if (!has_groups(a->quant) && (a->have_group || a->pow2 || a->e8m0 || a->static_scale)) {
      snprintf(msg, sizeof msg, "%s is for int8 and fp8_e4m3 (%s's scales are fixed by its blocks)",
               a->have_group ? "--group"
               : a->pow2     ? "--pow2-scale"
               : a->e8m0     ? "--e8m0-scale"
                             : "--static-scale",
               name);
      return usage_error(op, "%s", msg);
    }
    if (a->static_scale && (a->group || a->pow2 || a->e8m0 || a->scales)) {
      snprintf(msg, sizeof msg, "--static-scale is one scale for every row: not with %s",
               a->group  ? "--group"
               : a->pow2 ? "--pow2-scale"
               : a->e8m0 ? "--e8m0-scale"
                         : "--scales");
      return usage_error(op, "%s", msg);
    }
    if (a->quant->scales && !a->scales && !a->static_scale) {
      snprintf(msg, sizeof msg,
               "--quant %s needs --scales FILE (its codes mean nothing without them)", name);
      return usage_error(op, "%s", msg);
    }
    if (!a->quant->scales && a->scales) {
      snprintf(msg, sizeof msg, "--quant %s keeps its scales in its blocks: no --scales", name);
      return usage_error(op, "%s", msg);
    }
  }
  /* two outputs with one name would leave only one of them */
  const char *outs[] = {a->out,   a->mean,         a->rstd,   a->dweight,
                        a->dbias, a->residual_out, a->scales, a->post_rstd};
  size_t n_outs = sizeof outs / sizeof outs[0];
  for (size_t i = 0; i < n_outs; i++)
    for (size_t j = i + 1; j < n_outs; j++)
      if (outs[i] && outs[j] && !strcmp(outs[i], outs[j]))
        return usage_error(op, "'%s' is named by two outputs", outs[i]);
  return 0;
}

/* ---- running -------------------------------------------------------------- */

/* Products of shape[lo..hi), checked: the dims of an empty array can
 * multiply past SIZE_MAX. @return 0 on overflow. */
static int shape_product(const size_t *shape, int lo, int hi, size_t *out) {
  size_t p = 1;
  for (int i = lo; i < hi; i++) {
    if (shape[i] && p > SIZE_MAX / shape[i]) return 0;
    p *= shape[i];
  }
  *out = p;
  return 1;
}

static int same_shape(int na, const size_t *a, int nb, const size_t *b) {
  if (na != nb) return 0;
  for (int i = 0; i < na; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}

static rmsnorm_dtype dtype_of(npy_dtype dt) {
  switch (dt) {
    case NPY_F32: return RMSNORM_F32;
    case NPY_F16: return RMSNORM_F16;
    case NPY_F64: return RMSNORM_F64;
    case NPY_U16: return RMSNORM_BF16;
    case NPY_I8:
    case NPY_U8: break; /* never an input */
  }
  return RMSNORM_F32;
}

/* The data dtype of an input, under the --bf16 convention. */
static int check_data_dtype(const npy_file *f, int bf16) {
  const npy_info *in = &f->info;
  if (bf16 && in->dtype != NPY_U16) {
    rn_cli_error("%s: --bf16 expects '<u2' arrays of raw bf16 bits, got '%s'", f->path, in->descr);
    return -1;
  }
  if (!bf16 && in->dtype == NPY_U16) {
    rn_cli_error("%s: dtype '<u2' is read as bf16 bits only with --bf16", f->path);
    return -1;
  }
  return 0;
}

/* A weight or bias: the normalized shape, and '<f4' or the data's dtype. */
static int check_param(const npy_file *f, const char *role, const npy_file *x, int lead) {
  const npy_info *p = &f->info, *xi = &x->info;
  int nd = xi->ndim - lead;
  if (!same_shape(p->ndim, p->shape, nd, xi->shape + lead)) {
    char got[128], want[128];
    npy_format_shape(got, sizeof got, p->ndim, p->shape);
    npy_format_shape(want, sizeof want, nd, xi->shape + lead);
    rn_cli_error("%s: %s shape %s does not match normalized shape %s", f->path, role, got, want);
    return -1;
  }
  if (p->dtype != NPY_F32 && p->dtype != xi->dtype) {
    rn_cli_error("%s: %s dtype '%s' must be '<f4' or the data's dtype '%s'", f->path, role,
                 p->descr, xi->descr);
    return -1;
  }
  return 0;
}

/* One output file: what goes in it, and its slot in the out_set. */
typedef struct output {
  const char *path; /* NULL: not requested */
  int slot;
  npy_dtype dt;
  int ndim;
  const size_t *shape;
  void *data;
  size_t bytes;
  int stat; /* a per-row statistic: double for fp64 data, written as float32 */
} output;

/* fp64 data gives double statistics; the files hold float32. Converted in
 * place, front to back: float i (bytes 4i..4i+3) only overwrites doubles
 * already read. */
static void doubles_to_floats(void *buf, size_t n) {
  unsigned char *p = buf;
  for (size_t i = 0; i < n; i++) {
    double d;
    memcpy(&d, p + 8 * i, sizeof d);
    float f = (float)d;
    memcpy(p + 4 * i, &f, sizeof f);
  }
}

/* Reserves a temporary file for every requested output. @return 0, or -1
 * after printing the file and the problem. */
static int register_outputs(out_set *outs, output *outv, size_t n_out) {
  char err[512];
  for (size_t i = 0; i < n_out; i++) {
    if (outv[i].path && (outv[i].slot = out_add(outs, outv[i].path, err, sizeof err)) < 0) {
      rn_cli_error("%s: %s", outv[i].path, err);
      return -1;
    }
  }
  return 0;
}

/* A context, and the config the options ask for. */
static rmsnorm_status start_library(const norm_args *a, rmsnorm_dtype dt, npy_dtype param,
                                    rmsnorm_context **ctx, rmsnorm_config *cfg) {
  rmsnorm_status st = rmsnorm_context_create(ctx);
  if (st == RMSNORM_OK) st = rmsnorm_config_init(cfg, dt);
  if (st != RMSNORM_OK) return st;
  cfg->param_dtype = dtype_of(param);
  if (a->have_eps) cfg->eps = a->eps;
  cfg->partial = a->partial;
  cfg->flags = (a->eps_outside ? RMSNORM_FLAG_EPS_OUTSIDE : 0u) |
               (a->offset ? RMSNORM_FLAG_WEIGHT_OFFSET : 0u);
  return RMSNORM_OK;
}

/* Writes every requested output to its temporary file, then renames them all
 * into place. @return 0, or -1 after printing the file and the problem. */
static int write_outputs(out_set *outs, output *outv, size_t n_out, rmsnorm_dtype dt) {
  char err[512];
  for (size_t i = 0; i < n_out; i++) {
    const output *o = &outv[i];
    if (!o->path) continue;
    if (o->stat && dt == RMSNORM_F64) doubles_to_floats(o->data, o->bytes / sizeof(float));
    if (out_write_npy(outs, o->slot, o->dt, o->ndim, o->shape, o->data, o->bytes, err,
                      sizeof err) != 0) {
      rn_cli_error("%s: %s", o->path, err);
      return -1;
    }
  }
  const char *failed = NULL;
  if (out_commit(outs, &failed, err, sizeof err) != 0) {
    rn_cli_error("%s: %s", failed, err);
    return -1;
  }
  return 0;
}

/* Opens the inputs named in paths[0..n) (NULL: not given) into files[].
 * @return 0, or -1 after printing the file and the problem. */
static int open_inputs(const char *const *paths, npy_file *const *files, int n) {
  char err[512];
  for (int i = 0; i < n; i++) {
    if (paths[i] && npy_open(files[i], paths[i], err, sizeof err) != 0) {
      rn_cli_error("%s: %s", paths[i], err);
      return -1;
    }
  }
  return 0;
}

static void *alloc_bytes(size_t bytes, int zero) {
  if (bytes == 0) bytes = 1;
  return zero ? calloc(1, bytes) : malloc(bytes);
}

/* Runs one row-wise command on parsed arguments. For add-forward and sandwich
 * the second input (dy below) is U or A, and H is copied into the buffer the
 * library updates in place (h' = h + u, h' = h + post_norm(a)), which
 * --residual-out writes; sandwich's pre_norm weight takes the weight's place
 * (w) and its post_norm weight is w2. For gated the second input is Z. */
static int run(const op_spec *op, const norm_args *a) {
  int rc = RN_EXIT_FAILURE;
  npy_file x = {0}, dy = {0}, w = {0}, b = {0}, w2 = {0};
  out_set *outs = out_begin();
  void *y = NULL, *mean = NULL, *rstd = NULL, *dweight = NULL, *dbias = NULL, *h = NULL;
  void *scales = NULL, *rstd_post = NULL;
  rmsnorm_context *ctx = NULL;
  int add = op->kind == OP_ADD_FORWARD, sandwich = op->kind == OP_SANDWICH;
  int residual = add || sandwich, gated = op->kind == OP_GATED;
  const qformat_def *qf = a->quant;

  /* inputs */
  const char *paths[5] = {a->in[0], op->inputs == 2 ? a->in[1] : NULL,
                          sandwich ? a->pre_weight : a->weight, a->bias, a->post_weight};
  npy_file *files[5] = {&x, &dy, &w, &b, &w2};
  int have_w = paths[2] != NULL;
  if (open_inputs(paths, files, 5) != 0) goto done;
  if (check_data_dtype(&x, a->bf16)) goto done;

  /* rows x d: the leading axes are rows, the last K the normalized shape */
  const npy_info *xi = &x.info;
  int k = a->have_dims ? a->dims : 1;
  if (xi->ndim == 0) {
    rn_cli_error("%s: a 0-d array has no axis to normalize", x.path);
    goto done;
  }
  if (k > xi->ndim) {
    rn_cli_error("%s: --dims %d is more than the %d axes of %s (see 'rmsnorm %s --help')",
                 op->name, k, xi->ndim, x.path, op->name);
    rc = RN_EXIT_USAGE;
    goto done;
  }
  int lead = xi->ndim - k;
  size_t rows, d;
  char shape_text[128];
  npy_format_shape(shape_text, sizeof shape_text, k, xi->shape + lead);
  if (!shape_product(xi->shape, 0, lead, &rows) || !shape_product(xi->shape, lead, xi->ndim, &d)) {
    rn_cli_error("%s: shape too large", x.path);
    goto done;
  }
  if (d == 0) {
    rn_cli_error("%s: normalized shape %s is empty", x.path, shape_text);
    goto done;
  }

  if (op->inputs == 2) {
    if (check_data_dtype(&dy, a->bf16)) goto done;
    if (dy.info.dtype != xi->dtype) {
      rn_cli_error("%s: dtype '%s' does not match %s's dtype '%s'", dy.path, dy.info.descr, x.path,
                   xi->descr);
      goto done;
    }
    if (!same_shape(dy.info.ndim, dy.info.shape, xi->ndim, xi->shape)) {
      char got[128], want[128];
      npy_format_shape(got, sizeof got, dy.info.ndim, dy.info.shape);
      npy_format_shape(want, sizeof want, xi->ndim, xi->shape);
      rn_cli_error("%s: shape %s does not match %s's shape %s", dy.path, got, x.path, want);
      goto done;
    }
  }
  if (have_w && check_param(&w, sandwich ? "pre weight" : "weight", &x, lead)) goto done;
  if (a->bias && check_param(&b, "bias", &x, lead)) goto done;
  if (a->post_weight && check_param(&w2, "post weight", &x, lead)) goto done;
  if (have_w && a->bias && w.info.dtype != b.info.dtype) {
    rn_cli_error("%s: bias dtype '%s' does not match the weight's dtype '%s' (%s)", b.path,
                 b.info.descr, w.info.descr, w.path);
    goto done;
  }
  if (have_w && a->post_weight && w.info.dtype != w2.info.dtype) {
    rn_cli_error("%s: post weight dtype '%s' does not match the pre weight's dtype '%s' (%s)",
                 w2.path, w2.info.descr, w.info.descr, w.path);
    goto done;
  }
  /* weight, bias, dweight, dbias (sandwich: both weights) share one dtype:
   * the weight's, else the bias' (the post weight's), else the data's */
  npy_dtype param = have_w ? w.info.dtype : a->bias ? b.info.dtype
                    : a->post_weight             ? w2.info.dtype
                                                 : xi->dtype;
  /* gated: one r per group of gate_group columns (0: the row) */
  size_t ngroups = 1;
  if (gated && a->gate_group) {
    if (d % a->gate_group) {
      rn_cli_error("%s: normalized size %zu is not a multiple of --group %zu", x.path, d,
                   a->gate_group);
      goto done;
    }
    ngroups = d / a->gate_group;
  }
  size_t rstd_shape[NPY_MAX_DIMS + 1];
  int rstd_ndim = lead + (gated && a->gate_group ? 1 : 0);
  memcpy(rstd_shape, xi->shape, (size_t)lead * sizeof rstd_shape[0]);
  rstd_shape[lead] = ngroups;

  /* outputs: buffers, and temporaries now, so that an unwritable folder
   * fails before the work */
  rmsnorm_dtype dt = dtype_of(xi->dtype);
  size_t stat_size = dt == RMSNORM_F64 ? sizeof(double) : sizeof(float);
  size_t param_size = npy_dtype_size(param);
  if (d > SIZE_MAX / param_size) {
    rn_cli_error("%s: normalized shape %s is too large", x.path, shape_text);
    goto done;
  }

  /* with --quant, Y's codes (rows, row_bytes) take Y's place, and the
   * scales (rows, row_scales) come beside them */
  rmsnorm_quant q;
  rmsnorm_quant_init(&q, RMSNORM_QF_INT8); /* set below for --quant */
  size_t row_bytes = 0, row_scales = 0, codes_bytes = xi->data_bytes, scales_bytes = 0;
  size_t codes_shape[NPY_MAX_DIMS + 1], scales_shape[NPY_MAX_DIMS + 1];
  int codes_ndim = xi->ndim;
  if (qf) {
    size_t block = has_groups(qf) ? a->group : qf->block;
    if (block && d % block) {
      if (has_groups(qf))
        rn_cli_error("%s: normalized size %zu is not a multiple of --group %zu", x.path, d, block);
      else
        rn_cli_error("%s: normalized size %zu is not a multiple of %zu, the %s block size", x.path,
                     d, block, qf->name);
      goto done;
    }
    rmsnorm_quant_init(&q, qf->format);
    q.group = a->group;
    q.flags = (a->pow2 ? RMSNORM_QUANT_SCALE_POW2 : 0u) | (a->e8m0 ? RMSNORM_QUANT_SCALE_E8M0 : 0u);
    if (a->static_scale) q.static_scale = &a->static_scale;
    rmsnorm_status qst = rmsnorm_quant_row_size(&q, d, &row_bytes, &row_scales);
    if (qst != RMSNORM_OK) {
      rn_cli_error("%s: %s: %s (%s)", x.path, qf->name, rmsnorm_status_message(qst),
                   rmsnorm_status_name(qst));
      goto done;
    }
    size_t scale_size = qf->scales == 1 && !a->e8m0 ? sizeof(float) : 1; /* float or E8M0 */
    if ((row_bytes && rows > SIZE_MAX / row_bytes) ||
        (row_scales && rows > SIZE_MAX / scale_size / row_scales)) {
      rn_cli_error("%s: the quantized output's shape is too large", x.path);
      goto done;
    }
    codes_bytes = rows * row_bytes;
    scales_bytes = rows * row_scales * scale_size;
    memcpy(codes_shape, xi->shape, (size_t)lead * sizeof codes_shape[0]);
    memcpy(scales_shape, xi->shape, (size_t)lead * sizeof scales_shape[0]);
    codes_shape[lead] = row_bytes;
    scales_shape[lead] = row_scales;
    /* the formats with scales apart (int8, fp8_e4m3, mxfp8) have one code
     * per element: the codes keep X's shape */
    int elementwise = qf->scales != 0;
    codes_ndim = elementwise ? xi->ndim : lead + 1;
    if (elementwise) memcpy(codes_shape, xi->shape, (size_t)xi->ndim * sizeof codes_shape[0]);
    if (a->scales) scales = alloc_bytes(scales_bytes, 0);
  }
  y = alloc_bytes(codes_bytes, 0);
  if (a->mean) mean = alloc_bytes(rows * stat_size, 0);
  if (a->rstd) rstd = alloc_bytes(rows * ngroups * stat_size, 0);
  if (a->post_rstd) rstd_post = alloc_bytes(rows * stat_size, 0);
  /* zeroed: with no rows the library writes nothing, and the sums are 0 */
  if (a->dweight) dweight = alloc_bytes(d * param_size, 1);
  if (a->dbias) dbias = alloc_bytes(d * param_size, 1);
  if (residual && (h = alloc_bytes(xi->data_bytes, 0)) != NULL)
    memcpy(h, x.data, xi->data_bytes);
  if (!y || (a->mean && !mean) || (a->rstd && !rstd) || (a->dweight && !dweight) ||
      (a->dbias && !dbias) || (residual && !h) || (a->scales && !scales) ||
      (a->post_rstd && !rstd_post)) {
    rn_cli_error("%s: out of memory", op->name);
    goto done;
  }
  output outv[] = {
    {a->out, -1, xi->dtype, xi->ndim, xi->shape, y, xi->data_bytes, 0},
    {a->mean, -1, NPY_F32, lead, xi->shape, mean, rows * sizeof(float), 1},
    {a->rstd, -1, NPY_F32, rstd_ndim, rstd_shape, rstd, rows * ngroups * sizeof(float), 1},
    {a->dweight, -1, param, k, xi->shape + lead, dweight, d * param_size, 0},
    {a->dbias, -1, param, k, xi->shape + lead, dbias, d * param_size, 0},
    {a->residual_out, -1, xi->dtype, xi->ndim, xi->shape, h, xi->data_bytes, 0},
    {a->scales, -1, qf && qf->scales == 1 && !a->e8m0 ? NPY_F32 : NPY_U8, lead + 1, scales_shape, scales,
     scales_bytes, 0},
    {a->post_rstd, -1, NPY_F32, lead, xi->shape, rstd_post, rows * sizeof(float), 1},
  };
  if (qf) outv[0] = (output){a->out, -1, qf->codes, codes_ndim, codes_shape, y, codes_bytes, 0};
  size_t n_out = sizeof outv / sizeof outv[0];
  if (register_outputs(outs, outv, n_out) != 0) goto done;

  rmsnorm_config cfg;
  rmsnorm_status st = start_library(a, dt, param, &ctx, &cfg);
  if (st == RMSNORM_OK) {
    const void *wp = have_w ? w.data : NULL, *bp = a->bias ? b.data : NULL;
    /* --quant: forward and add-forward only (parse_args) */
    if (qf && add)
      st = rmsnorm_add_forward_quantized(ctx, &cfg, rows, d, h, d, dy.data, d, wp, bp, &q, y,
                                         row_bytes, scales, row_scales, rstd);
    else if (qf)
      st = rmsnorm_forward_quantized(ctx, &cfg, rows, d, x.data, d, wp, bp, &q, y, row_bytes,
                                     scales, row_scales, rstd);
    else switch (op->kind) {
      case OP_RMS_FORWARD:
        st = rmsnorm_forward(ctx, &cfg, rows, d, x.data, d, wp, bp, y, d, rstd);
        break;
      case OP_RMS_BACKWARD:
        st = rmsnorm_backward(ctx, &cfg, rows, d, x.data, d, dy.data, d, wp, NULL, y, d, dweight,
                              dbias);
        break;
      case OP_LN_FORWARD:
        st = rmsnorm_layernorm_forward(ctx, &cfg, rows, d, x.data, d, wp, bp, y, d, mean, rstd);
        break;
      case OP_LN_BACKWARD:
        st = rmsnorm_layernorm_backward(ctx, &cfg, rows, d, x.data, d, dy.data, d, wp, NULL, NULL,
                                        y, d, dweight, dbias);
        break;
      case OP_ADD_FORWARD:
        st = rmsnorm_add_forward(ctx, &cfg, rows, d, h, d, dy.data, d, wp, bp, y, d, rstd);
        break;
      case OP_SANDWICH:
        st = rmsnorm_sandwich_forward(ctx, &cfg, rows, d, dy.data, d, h, d,
                                      a->post_weight ? w2.data : NULL, wp, y, d, rstd_post, rstd);
        break;
      case OP_GATED: {
        rmsnorm_gate gate;
        rmsnorm_gate_init(&gate, a->act);
        gate.group = a->gate_group;
        gate.flags = a->norm_first ? RMSNORM_GATE_NORM_FIRST : 0u;
        st = rmsnorm_gated_forward(ctx, &cfg, &gate, rows, d, x.data, d, dy.data, d, wp, y, d,
                                   rstd);
        break;
      }
      case OP_LINEAR:
      case OP_QK_ROPE: st = RMSNORM_ERROR_BAD_ARGUMENT; break; /* run_linear's, run_rope's */
    }
  }
  if (st != RMSNORM_OK) {
    rn_cli_error("%s: %s: %s (%s)", op->name, x.path, rmsnorm_status_message(st),
                 rmsnorm_status_name(st));
    goto done;
  }

  if (write_outputs(outs, outv, n_out, dt) == 0) rc = RN_EXIT_OK;

done:
  out_abort(outs);
  rmsnorm_context_free(ctx);
  free(y);
  free(mean);
  free(rstd);
  free(dweight);
  free(dbias);
  free(h);
  free(scales);
  free(rstd_post);
  for (int i = 0; i < 5; i++) npy_close(files[i]);
  return rc;
}

/* `linear`: Z = RMSNorm(X; g) W + bias through rmsnorm_fold_weight (W' =
 * diag(g) W, once) and rmsnorm_linear_forward (Z = diag(r) (X W') + bias).
 * X's last axis is d; W is (d, N) in the compute type; Z has X's leading
 * shape and N. */
static int run_linear(const op_spec *op, const norm_args *a) {
  int rc = RN_EXIT_FAILURE;
  npy_file x = {0}, wm = {0}, g = {0}, lb = {0};
  npy_file *files[4] = {&x, &wm, &g, &lb};
  out_set *outs = out_begin();
  void *z = NULL, *rstd = NULL, *wf = NULL;
  rmsnorm_context *ctx = NULL;

  if (rmsnorm_linear_available() != RMSNORM_OK) {
    rn_cli_error("%s: not available: this librmsnorm was built without a BLAS "
                 "(cblas_sgemm; install OpenBLAS and rebuild)", op->name);
    return RN_EXIT_FAILURE;
  }
  const char *paths[4] = {a->in[0], a->in[1], a->weight, a->linear_bias};
  if (open_inputs(paths, files, 4) != 0) goto done;
  if (check_data_dtype(&x, a->bf16)) goto done;
  const npy_info *xi = &x.info, *wi = &wm.info;
  if (xi->ndim == 0) {
    rn_cli_error("%s: a 0-d array has no axis to normalize", x.path);
    goto done;
  }
  int lead = xi->ndim - 1;
  size_t rows, d = xi->shape[lead];
  if (!shape_product(xi->shape, 0, lead, &rows)) {
    rn_cli_error("%s: shape too large", x.path);
    goto done;
  }
  if (d == 0) {
    rn_cli_error("%s: normalized shape (0,) is empty", x.path);
    goto done;
  }

  /* W: (d, N), in the compute type */
  rmsnorm_dtype dt = dtype_of(xi->dtype);
  npy_dtype wdt = dt == RMSNORM_F64 ? NPY_F64 : NPY_F32;
  char wshape[128];
  npy_format_shape(wshape, sizeof wshape, wi->ndim, wi->shape);
  if (wi->ndim != 2 || wi->shape[0] != d) {
    rn_cli_error("%s: matrix shape %s must be (%zu, N): X's last axis is %zu", wm.path, wshape, d,
                 d);
    goto done;
  }
  size_t n = wi->shape[1];
  if (n == 0) {
    rn_cli_error("%s: matrix shape %s has no columns", wm.path, wshape);
    goto done;
  }
  if (wi->dtype != wdt) {
    rn_cli_error("%s: matrix dtype '%s' must be '%s' for '%s' data (the compute type)", wm.path,
                 wi->descr, npy_descr(wdt), xi->descr);
    goto done;
  }
  if (a->weight && check_param(&g, "weight", &x, lead)) goto done;
  if (a->linear_bias) {
    const npy_info *bi = &lb.info;
    if (bi->ndim != 1 || bi->shape[0] != n) {
      char got[128];
      npy_format_shape(got, sizeof got, bi->ndim, bi->shape);
      rn_cli_error("%s: linear bias shape %s does not match (%zu,), W's columns", lb.path, got, n);
      goto done;
    }
    if (bi->dtype != NPY_F32 && bi->dtype != xi->dtype) {
      rn_cli_error("%s: linear bias dtype '%s' must be '<f4' or the data's dtype '%s'", lb.path,
                   bi->descr, xi->descr);
      goto done;
    }
    if (a->weight && bi->dtype != g.info.dtype) {
      rn_cli_error("%s: linear bias dtype '%s' does not match the weight's dtype '%s' (%s)",
                   lb.path, bi->descr, g.info.descr, g.path);
      goto done;
    }
  }
  npy_dtype param = a->weight ? g.info.dtype : a->linear_bias ? lb.info.dtype : xi->dtype;

  /* Z: the leading shape and N */
  size_t zshape[NPY_MAX_DIMS], zcount, esize = npy_dtype_size(xi->dtype);
  memcpy(zshape, xi->shape, (size_t)lead * sizeof zshape[0]);
  zshape[lead] = n;
  size_t stat_size = dt == RMSNORM_F64 ? sizeof(double) : sizeof(float);
  if (!shape_product(zshape, 0, lead + 1, &zcount) || zcount > SIZE_MAX / esize ||
      n > SIZE_MAX / npy_dtype_size(wdt) / d) {
    rn_cli_error("%s: the result's shape is too large", x.path);
    goto done;
  }
  z = alloc_bytes(zcount * esize, 0);
  wf = alloc_bytes(d * n * npy_dtype_size(wdt), 0);
  if (a->rstd) rstd = alloc_bytes(rows * stat_size, 0);
  if (!z || !wf || (a->rstd && !rstd)) {
    rn_cli_error("%s: out of memory", op->name);
    goto done;
  }
  output outv[] = {
    {a->out, -1, xi->dtype, lead + 1, zshape, z, zcount * esize, 0},
    {a->rstd, -1, NPY_F32, lead, xi->shape, rstd, rows * sizeof(float), 1},
  };
  size_t n_out = sizeof outv / sizeof outv[0];
  if (register_outputs(outs, outv, n_out) != 0) goto done;

  rmsnorm_config cfg;
  rmsnorm_status st = start_library(a, dt, param, &ctx, &cfg);
  if (st == RMSNORM_OK) {
    /* W' = diag(g) W once, then Z = diag(r) (X W') + bias */
    st = rmsnorm_fold_weight(&cfg, d, n, a->weight ? g.data : NULL, wm.data, n, wf, n);
    if (st == RMSNORM_OK)
      st = rmsnorm_linear_forward(ctx, &cfg, rows, d, n, x.data, d, wf, n,
                                  a->linear_bias ? lb.data : NULL, z, n, rstd);
  }
  if (st != RMSNORM_OK) {
    rn_cli_error("%s: %s: %s (%s)", op->name, x.path, rmsnorm_status_message(st),
                 rmsnorm_status_name(st));
    goto done;
  }

  if (write_outputs(outs, outv, n_out, dt) == 0) rc = RN_EXIT_OK;

done:
  out_abort(outs);
  rmsnorm_context_free(ctx);
  free(z);
  free(wf);
  free(rstd);
  for (int i = 0; i < 4; i++) npy_close(files[i]);
  return rc;
}

/* `qk-rope`: X (..., seq, heads, head_dim), one library call over all
 * tokens (the leading axes flattened), token t at position start + t % seq.
 * The table is the caller's (--cos-sin) or built for positions
 * 0..start+seq-1 from --theta and --linear-factor. */
static int run_rope(const op_spec *op, const norm_args *a) {
  int rc = RN_EXIT_FAILURE;
  npy_file x = {0}, w = {0}, t = {0};
  npy_file *files[3] = {&x, &w, &t};
  out_set *outs = out_begin();
  void *y = NULL, *rstd = NULL, *table = NULL;
  int64_t *pos = NULL;
  rmsnorm_context *ctx = NULL;

  const char *paths[3] = {a->in[0], a->weight, a->cos_sin};
  if (open_inputs(paths, files, 3) != 0) goto done;
  if (check_data_dtype(&x, a->bf16)) goto done;
  const npy_info *xi = &x.info;
  if (xi->ndim < 2) {
    rn_cli_error("%s: qk-rope needs (..., heads, head_dim), got %d axes", x.path, xi->ndim);
    goto done;
  }
  int lead = xi->ndim - 1; /* head_dim is the normalized axis */
  size_t hd = xi->shape[lead], heads = xi->shape[lead - 1], tokens, rows;
  size_t seq = xi->ndim >= 3 ? xi->shape[xi->ndim - 3] : 1;
  if (!shape_product(xi->shape, 0, lead - 1, &tokens) || !shape_product(xi->shape, 0, lead, &rows)) {
    rn_cli_error("%s: shape too large", x.path);
    goto done;
  }
  if (hd == 0) {
    rn_cli_error("%s: head_dim (the last axis) is 0", x.path);
    goto done;
  }
  size_t rot = a->rotary_dim ? a->rotary_dim : hd;
  if (rot > hd || rot % 2) {
    rn_cli_error("%s: --rotary-dim %zu must be even and at most head_dim %zu", x.path, rot, hd);
    goto done;
  }
  /* the gain: (head_dim,), or across heads (heads*head_dim,) or (heads, head_dim) */
  if (a->weight && a->across_heads && w.info.ndim == 1 && heads <= SIZE_MAX / hd &&
      w.info.shape[0] == heads * hd) {
    if (w.info.dtype != NPY_F32 && w.info.dtype != xi->dtype) {
      rn_cli_error("%s: weight dtype '%s' must be '<f4' or the data's dtype '%s'", w.path,
                   w.info.descr, xi->descr);
      goto done;
    }
  } else if (a->weight && check_param(&w, "weight", &x, a->across_heads ? lead - 1 : lead)) {
    goto done;
  }
  npy_dtype param = a->weight ? w.info.dtype : xi->dtype;
  rmsnorm_dtype dt = dtype_of(xi->dtype);
  npy_dtype tdt = dt == RMSNORM_F64 ? NPY_F64 : NPY_F32;
  size_t tsize = npy_dtype_size(tdt), n_pos;
  if (seq && a->start > SIZE_MAX - seq) {
    rn_cli_error("%s: --start %zu is too large", x.path, a->start);
    goto done;
  }
  if (a->cos_sin) {
    const npy_info *ti = &t.info;
    char got[128];
    npy_format_shape(got, sizeof got, ti->ndim, ti->shape);
    if (ti->ndim != 2 || ti->shape[1] != rot) {
      rn_cli_error("%s: table shape %s must be (positions, %zu): the rotary dim", t.path, got, rot);
      goto done;
    }
    if (ti->dtype != tdt) {
      rn_cli_error("%s: table dtype '%s' must be '%s' for '%s' data", t.path, ti->descr,
                   npy_descr(tdt), xi->descr);
      goto done;
    }
    n_pos = ti->shape[0];
    if (tokens && a->start + seq > n_pos) {
      rn_cli_error("%s: positions up to %zu need %zu rows; the table has %zu", t.path,
                   a->start + seq - 1, a->start + seq, n_pos);
      goto done;
    }
  } else {
    n_pos = a->start + seq;
    if (n_pos > SIZE_MAX / rot / tsize || !(table = alloc_bytes(n_pos * rot * tsize, 0))) {
      rn_cli_error("%s: out of memory for the table of %zu positions", op->name, n_pos);
      goto done;
    }
  }
  size_t stat_size = dt == RMSNORM_F64 ? sizeof(double) : sizeof(float);
  y = alloc_bytes(xi->data_bytes, 0);
  pos = alloc_bytes(tokens * sizeof *pos, 0);
  size_t nstat = a->across_heads ? tokens : rows; /* one r per token, or per head */
  if (a->rstd) rstd = alloc_bytes(nstat * stat_size, 0);
  if (!y || !pos || (a->rstd && !rstd)) {
    rn_cli_error("%s: out of memory", op->name);
    goto done;
  }
  for (size_t i = 0; i < tokens; i++) pos[i] = (int64_t)(a->start + i % seq);
  output outv[] = {
    {a->out, -1, xi->dtype, xi->ndim, xi->shape, y, xi->data_bytes, 0},
    {a->rstd, -1, NPY_F32, a->across_heads ? lead - 1 : lead, xi->shape, rstd,
     nstat * sizeof(float), 1},
  };
  size_t n_out = sizeof outv / sizeof outv[0];
  if (register_outputs(outs, outv, n_out) != 0) goto done;

  rmsnorm_config cfg;
  rmsnorm_status st = start_library(a, dt, param, &ctx, &cfg);
  if (st == RMSNORM_OK && table)
    st = rmsnorm_rope_table(table, dt == RMSNORM_F64 ? RMSNORM_F64 : RMSNORM_F32, n_pos, rot,
                            a->theta, a->linear_factor);
  if (st == RMSNORM_OK) {
    rmsnorm_rope rope;
    rmsnorm_rope_init(&rope, a->style);
    rope.rotary_dim = rot;
    rope.cos_sin = table ? table : t.data;
    rope.n_positions = n_pos;
    rope.positions = pos;
    rope.norm = a->across_heads ? RMSNORM_ROPE_NORM_TOKEN : RMSNORM_ROPE_NORM_HEAD;
    st = rmsnorm_qk_norm_rope_forward(ctx, &cfg, tokens, heads, hd, x.data, heads * hd, hd,
                                      a->weight ? w.data : NULL, &rope, NULL, y, heads * hd, hd,
                                      rstd);
  }
  if (st != RMSNORM_OK) {
    rn_cli_error("%s: %s: %s (%s)", op->name, x.path, rmsnorm_status_message(st),
                 rmsnorm_status_name(st));
    goto done;
  }
  if (write_outputs(outs, outv, n_out, dt) == 0) rc = RN_EXIT_OK;

done:
  out_abort(outs);
  rmsnorm_context_free(ctx);
  free(y);
  free(rstd);
  free(table);
  free(pos);
  for (int i = 0; i < 3; i++) npy_close(files[i]);
  return rc;
}

int rn_cli_norm(int argc, char **argv) {
  const op_spec *op = find_op(argv[0]);
  if (!op) {
    rn_cli_error("unknown command '%s'", argv[0]);
    return RN_EXIT_USAGE;
  }
  norm_args a;
  int rc = parse_args(op, argc, argv, &a);
  if (rc) return rc < 0 ? RN_EXIT_OK : rc;
  if (op->kind == OP_QK_ROPE) return run_rope(op, &a);
  return op->kind == OP_LINEAR ? run_linear(op, &a) : run(op, &a);
}
