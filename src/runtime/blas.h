/* blas.h - the one place the library calls a BLAS (cblas_sgemm/dgemm, found
 * at configure time; see CMakeLists.txt). Without one, rn_blas_available()
 * is 0 and rmsnorm_linear_* report RMSNORM_ERROR_NOT_AVAILABLE. */
#ifndef RMSNORM_BLAS_H
#define RMSNORM_BLAS_H

#include <stddef.h>

int rn_blas_available(void);

/* Row-major C (m x n) = alpha * op(A) op(B) + beta * C, op(A) m x k, op(B)
 * k x n; op transposes when trans_a/trans_b. Matrices are double when f64,
 * else float. Sizes and strides fit in int (checked by the caller). */
void rn_gemm(int f64, int trans_a, int trans_b, size_t m, size_t n, size_t k, double alpha,
             const void *a, size_t lda, const void *b, size_t ldb, double beta, void *c,
             size_t ldc);

#endif
