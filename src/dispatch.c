/* dispatch.c - chooses a kernel set: what the build compiled in (each ISA's
 * files get their own target flags, see CMakeLists.txt), what the CPU and OS
 * support (cpu.c), and the RMSNORM_ISA override, read once. */
#include "dispatch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

#ifdef RMSNORM_HAVE_AVX2
extern const rn_kernel_set rn_kernels_avx2;
#endif
#ifdef RMSNORM_HAVE_AVX512
extern const rn_kernel_set rn_kernels_avx512;
#endif
#ifdef RMSNORM_HAVE_NEON
extern const rn_kernel_set rn_kernels_neon;
#endif

const rn_kernel_set *rn_kernels_for(rmsnorm_isa isa) {
  unsigned f = rn_cpu_features();
  (void)f;
  switch (isa) {
    case RMSNORM_ISA_AUTO: return rn_kernels_for(rn_isa_auto());
    case RMSNORM_ISA_SCALAR: return &rn_kernels_ref;
    case RMSNORM_ISA_AVX2:
#ifdef RMSNORM_HAVE_AVX2
      if ((f & (RMSNORM_CPU_AVX2 | RMSNORM_CPU_FMA | RMSNORM_CPU_F16C)) ==
          (RMSNORM_CPU_AVX2 | RMSNORM_CPU_FMA | RMSNORM_CPU_F16C))
        return &rn_kernels_avx2;
#endif
      return NULL;
    case RMSNORM_ISA_AVX512:
#ifdef RMSNORM_HAVE_AVX512
      if ((f & (RMSNORM_CPU_AVX512F | RMSNORM_CPU_AVX512BW | RMSNORM_CPU_AVX512VL |
                RMSNORM_CPU_FMA | RMSNORM_CPU_F16C)) ==
          (RMSNORM_CPU_AVX512F | RMSNORM_CPU_AVX512BW | RMSNORM_CPU_AVX512VL | RMSNORM_CPU_FMA |
           RMSNORM_CPU_F16C))
        return &rn_kernels_avx512;
#endif
      return NULL;
    case RMSNORM_ISA_NEON:
#ifdef RMSNORM_HAVE_NEON
      if (f & RMSNORM_CPU_NEON) return &rn_kernels_neon;
#endif
      return NULL;
  }
  return NULL;
}

static rmsnorm_isa auto_isa;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void choose(void) {
  const char *env = getenv("RMSNORM_ISA");
  static const rmsnorm_isa order[] = {RMSNORM_ISA_AVX512, RMSNORM_ISA_AVX2, RMSNORM_ISA_NEON,
                                      RMSNORM_ISA_SCALAR};
  enum { n_order = sizeof order / sizeof order[0] };
  if (env) {
    for (int i = 0; i < n_order; i++)
      if (strcmp(env, rmsnorm_isa_name(order[i])) == 0 && rn_kernels_for(order[i])) {
        auto_isa = order[i];
        return;
      }
  }
  for (int i = 0; i < n_order; i++)
    if (rn_kernels_for(order[i])) {
      auto_isa = order[i];
      return;
    }
}

rmsnorm_isa rn_isa_auto(void) {
  pthread_once(&once, choose);
  return auto_isa;
}

const char *rmsnorm_isa_name(rmsnorm_isa isa) {
  switch (isa) {
    case RMSNORM_ISA_AUTO: return "auto";
    case RMSNORM_ISA_SCALAR: return "scalar";
    case RMSNORM_ISA_AVX2: return "avx2";
    case RMSNORM_ISA_AVX512: return "avx512";
    case RMSNORM_ISA_NEON: return "neon";
  }
  return "unknown";
}
