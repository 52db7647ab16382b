/* cpu.c - what the CPU and the OS let us run, read once. x86: CPUID for the
 * instruction sets, XGETBV for the register state the OS saves (AVX needs
 * YMM state, AVX-512 also the opmask and ZMM state). AArch64 Linux: the
 * kernel's hardware capability bits (getauxval(AT_HWCAP)). */
#include "runtime/cpu.h"

#include <pthread.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static unsigned long long read_xcr0(void) {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((unsigned long long)hi << 32) | lo;
}

static unsigned detect(void) {
  unsigned a, b, c, d, f = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  if (!osxsave || !avx) return 0;
  unsigned long long xcr0 = read_xcr0();
  int ymm_ok = (xcr0 & 0x6) == 0x6;
  int zmm_ok = ymm_ok && (xcr0 & 0xe0) == 0xe0;
  if (!ymm_ok) return 0;
  if ((c >> 12) & 1) f |= RMSNORM_CPU_FMA;
  if ((c >> 29) & 1) f |= RMSNORM_CPU_F16C;
  unsigned max_leaf = __get_cpuid_max(0, NULL);
  if (max_leaf < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  unsigned leaf7_subleafs = a;
  if ((b >> 5) & 1) f |= RMSNORM_CPU_AVX2;
  if (zmm_ok) {
    if ((b >> 16) & 1) f |= RMSNORM_CPU_AVX512F;
    if ((b >> 17) & 1) f |= RN_CPU_AVX512DQ;
    if ((b >> 30) & 1) f |= RMSNORM_CPU_AVX512BW;
    if ((b >> 31) & 1) f |= RMSNORM_CPU_AVX512VL;
    if (leaf7_subleafs >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      if ((a >> 5) & 1) f |= RMSNORM_CPU_AVX512BF16;
    }
  }
  return f;
}
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>

/* the bits of AT_HWCAP (Linux's asm/hwcap.h; spelled out so that older
 * headers do) */
#define RN_HWCAP_FP (1ul << 0)
#define RN_HWCAP_ASIMD (1ul << 1)
#define RN_HWCAP_FPHP (1ul << 9)
#define RN_HWCAP_ASIMDHP (1ul << 10)

static unsigned detect(void) {
  unsigned long hw = getauxval(AT_HWCAP);
  unsigned f = 0;
  if ((hw & (RN_HWCAP_FP | RN_HWCAP_ASIMD)) == (RN_HWCAP_FP | RN_HWCAP_ASIMD)) f |= RMSNORM_CPU_NEON;
  if ((hw & (RN_HWCAP_FPHP | RN_HWCAP_ASIMDHP)) == (RN_HWCAP_FPHP | RN_HWCAP_ASIMDHP))
    f |= RMSNORM_CPU_NEON_FP16;
  return f;
}
#else
static unsigned detect(void) { return 0; }
#endif

static unsigned features;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init(void) { features = detect(); }

unsigned rn_cpu_features(void) {
  pthread_once(&once, init);
  return features;
}

rmsnorm_status rmsnorm_cpu_features(unsigned *out) {
  if (!out) return RMSNORM_ERROR_NULL_POINTER;
  *out = rn_cpu_features() & ~RN_CPU_AVX512DQ;
  return RMSNORM_OK;
}
