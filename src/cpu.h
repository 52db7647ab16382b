/* cpu.h - the CPU features the OS lets us use (RMSNORM_CPU_* bits), detected
 * once and cached. */
#ifndef RMSNORM_CPU_H
#define RMSNORM_CPU_H

#include "rmsnorm.h"

unsigned rn_cpu_features(void);

#endif
