/* model_f64.c - the model's arithmetic in double (for gradient checks and
 * --f64 runs), with libm's exp and tanh. */
#include <cblas.h>
#include <math.h>

#define REAL double
#define FN(name) name##_f64
#define GEMM cblas_dgemm
#define EXP exp
#define TANH tanh
#include "model_body.inc"
