/* model_f32.c - the model's arithmetic in float (the training build). */
#include <cblas.h>

#include "fastexp.h"

#define REAL float
#define FN(name) name##_f32
#define GEMM cblas_sgemm
#define EXP fast_expf
#define TANH fast_tanhf
#include "model_body.inc"
