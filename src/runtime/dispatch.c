/* dispatch.c - chooses a kernel set: what the build compiled in (each ISA's
 * files get their own target flags, see CMakeLists.txt), what the CPU and OS
 * support (cpu.c), and the RMSNORM_ISA override, read once. */
#include "runtime/dispatch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu.h"

#ifdef RMSNORM_HAVE_AVX2
extern const rn_kernel_set rn_kernels_avx2;
#endif
#ifdef RMSNORM_HAVE_AVX512
extern const rn_kernel_set rn_kernels_avx512;
#endif
#ifdef RMSNORM_HAVE_AVX512BF16
extern const rn_kernel_set rn_kernels_avx512_bf16;

/* The avx512 set with the bf16 entries of kernels/avx512bf16/ (the same bits,
 * faster stores), for CPUs with AVX512_BF16 (and AVX512DQ, which every such
 * CPU has: its VFPCLASSPS finds the lanes to fix up); filled once. */
static rn_kernel_set avx512_bf16_set;
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;

/* RMSNORM_AVX512_BF16=0 leaves the variant out: the AVX-512 set's own bf16
 * kernels run, as on CPUs without AVX512_BF16 (tests and benchmarks reach
 * them on CPUs with it). Read once. */
static int bf16_off;
static pthread_once_t bf16_env_once = PTHREAD_ONCE_INIT;
static void read_bf16_env(void) {
  const char *v = getenv("RMSNORM_AVX512_BF16");
  bf16_off = v && strcmp(v, "0") == 0;
}
static int avx512_bf16_off(void) {
  pthread_once(&bf16_env_once, read_bf16_env);
  return bf16_off;
}

static void fill_avx512_bf16(void) {
  const rn_kernel_set *b = &rn_kernels_avx512_bf16;
  rn_kernel_set *s = &avx512_bf16_set;
  *s = rn_kernels_avx512;
  s->forward[RMSNORM_BF16] = b->forward[RMSNORM_BF16];
  s->backward[RMSNORM_BF16] = b->backward[RMSNORM_BF16];
  s->add[RMSNORM_BF16] = b->add[RMSNORM_BF16];
  s->rstd[RMSNORM_BF16] = b->rstd[RMSNORM_BF16];
  s->quant[RMSNORM_BF16] = b->quant[RMSNORM_BF16];
  s->row_coef[RMSNORM_BF16] = b->row_coef[RMSNORM_BF16];
  s->row_cols[RMSNORM_BF16] = b->row_cols[RMSNORM_BF16];
  s->grad_coef[RMSNORM_BF16] = b->grad_coef[RMSNORM_BF16];
  s->grad_cols[RMSNORM_BF16] = b->grad_cols[RMSNORM_BF16];
  s->shard_sums[RMSNORM_BF16] = b->shard_sums[RMSNORM_BF16];
  s->gated_forward[RMSNORM_BF16] = b->gated_forward[RMSNORM_BF16];
  s->gated_backward[RMSNORM_BF16] = b->gated_backward[RMSNORM_BF16];
  s->rope_forward[RMSNORM_BF16] = b->rope_forward[RMSNORM_BF16];
  s->rope_backward[RMSNORM_BF16] = b->rope_backward[RMSNORM_BF16];
}
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
           RMSNORM_CPU_F16C)) {
#ifdef RMSNORM_HAVE_AVX512BF16
        if ((f & (RMSNORM_CPU_AVX512BF16 | RN_CPU_AVX512DQ)) ==
                (RMSNORM_CPU_AVX512BF16 | RN_CPU_AVX512DQ) &&
            !avx512_bf16_off()) {
          pthread_once(&bf16_once, fill_avx512_bf16);
          return &avx512_bf16_set;
        }
#endif
        return &rn_kernels_avx512;
      }
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
