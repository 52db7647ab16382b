/* cpu.h - the CPU features the OS lets us use (RMSNORM_CPU_* bits), detected
 * once and cached. */
#ifndef RMSNORM_CPU_H
#define RMSNORM_CPU_H

#include "rmsnorm.h"

/* Bits beyond the public RMSNORM_CPU_* ones, for the library's own use
 * (rmsnorm_cpu_features leaves them out). */
#define RN_CPU_AVX512DQ (1u << 31)

unsigned rn_cpu_features(void);

#endif
