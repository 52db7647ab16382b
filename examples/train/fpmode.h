/* fpmode.h - the floating-point control word of the calling thread. The
 * float model computes with subnormal numbers flushed to zero (results: FTZ)
 * and read as zero (inputs: DAZ), as CPU training frameworks commonly do: at
 * high learning rates softmax probabilities of about e^-87 and the products
 * made from them fall below float's normal range, and each subnormal
 * operation costs on the order of 100 cycles. x86 (SSE
 * MXCSR) only; elsewhere these do nothing. */
#ifndef TRAIN_FPMODE_H
#define TRAIN_FPMODE_H

#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
#include <xmmintrin.h>
#define TRAIN_FP_FLUSH 0x8040u /* MXCSR: FTZ (bit 15) | DAZ (bit 6) */
static inline unsigned train_fp_get(void) { return _mm_getcsr(); }
static inline void train_fp_set(unsigned mode) { _mm_setcsr(mode); }
#else
#define TRAIN_FP_FLUSH 0u
static inline unsigned train_fp_get(void) { return 0; }
static inline void train_fp_set(unsigned mode) { (void)mode; }
#endif

#endif /* TRAIN_FPMODE_H */
