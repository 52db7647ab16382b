/* blas.c - the BLAS binding: cblas_sgemm/cblas_dgemm when the build found a
 * BLAS (RMSNORM_HAVE_BLAS), else a stub that is never called (the API checks
 * rn_blas_available first). */
#include "runtime/blas.h"

#ifdef RMSNORM_HAVE_BLAS
#include <cblas.h>

int rn_blas_available(void) { return 1; }

void rn_gemm(int f64, int trans_a, int trans_b, size_t m, size_t n, size_t k, double alpha,
             const void *a, size_t lda, const void *b, size_t ldb, double beta, void *c,
             size_t ldc) {
  enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if (f64)
    cblas_dgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb,
                beta, c, (int)ldc);
  else
    cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, (float)alpha, a, (int)lda, b,
                (int)ldb, (float)beta, c, (int)ldc);
}

#else

int rn_blas_available(void) { return 0; }

void rn_gemm(int f64, int trans_a, int trans_b, size_t m, size_t n, size_t k, double alpha,
             const void *a, size_t lda, const void *b, size_t ldb, double beta, void *c,
             size_t ldc) {
  (void)f64, (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a;
  (void)lda, (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
}

#endif
