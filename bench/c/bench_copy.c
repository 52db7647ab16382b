/* bench_copy.c - the copies `rmsnorm bench` measures the ops against: glibc's
 * memcpy and plain non-temporal store loops (AVX2, AVX-512). For buffers far
 * larger than the caches a streaming copy skips the destination's read for
 * ownership and can beat memcpy by 1.6x, so the copy limit is the best of
 * them. The SIMD loops carry their own target attributes (never the whole
 * tool) and run only where the CPU and OS support them. */
#include "bench_copy.h"

#include <stdint.h>
#include <string.h>

#include "rmsnorm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define RN_HAVE_X86_STREAMS 1
#else
#define RN_HAVE_X86_STREAMS 0
#endif

static void copy_memcpy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }

#if RN_HAVE_X86_STREAMS
/* Bytes before dst + i is `align`-aligned, at most n. */
static size_t head_bytes(const char *dst, size_t align, size_t n) {
  size_t h = (align - ((uintptr_t)dst & (align - 1))) & (align - 1);
  return h < n ? h : n;
}

/* Four vectors per step keep enough stores in flight; the head and tail that
 * are not whole aligned vectors go through memcpy. The fence orders the
 * weakly-ordered stores before the caller's barrier. */
__attribute__((target("avx2"))) static void copy_stream_avx2(void *dst, const void *src,
                                                              size_t n) {
  char *d = dst;
  const char *s = src;
  size_t h = head_bytes(d, 32, n);
  memcpy(d, s, h);
  size_t i = h;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
    __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
    __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
    __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
    _mm256_stream_si256((__m256i *)(d + i), a);
    _mm256_stream_si256((__m256i *)(d + i + 32), b);
    _mm256_stream_si256((__m256i *)(d + i + 64), c);
    _mm256_stream_si256((__m256i *)(d + i + 96), e);
  }
  for (; i + 32 <= n; i += 32)
    _mm256_stream_si256((__m256i *)(d + i), _mm256_loadu_si256((const __m256i *)(s + i)));
  _mm_sfence();
  memcpy(d + i, s + i, n - i);
}

__attribute__((target("avx512f"))) static void copy_stream_avx512(void *dst, const void *src,
                                                                   size_t n) {
  char *d = dst;
  const char *s = src;
  size_t h = head_bytes(d, 64, n);
  memcpy(d, s, h);
  size_t i = h;
  for (; i + 256 <= n; i += 256) {
    __m512i a = _mm512_loadu_si512(s + i);
    __m512i b = _mm512_loadu_si512(s + i + 64);
    __m512i c = _mm512_loadu_si512(s + i + 128);
    __m512i e = _mm512_loadu_si512(s + i + 192);
    _mm512_stream_si512((__m512i *)(d + i), a);
    _mm512_stream_si512((__m512i *)(d + i + 64), b);
    _mm512_stream_si512((__m512i *)(d + i + 128), c);
    _mm512_stream_si512((__m512i *)(d + i + 192), e);
  }
  for (; i + 64 <= n; i += 64) _mm512_stream_si512((__m512i *)(d + i), _mm512_loadu_si512(s + i));
  _mm_sfence();
  memcpy(d + i, s + i, n - i);
}
#endif

static const rn_copy_kind kinds[] = {
    {"memcpy", copy_memcpy, 0},
#if RN_HAVE_X86_STREAMS
    {"nt-avx2", copy_stream_avx2, RMSNORM_CPU_AVX2},
    {"nt-avx512", copy_stream_avx512, RMSNORM_CPU_AVX512F},
#endif
};

int rn_copy_kinds(const rn_copy_kind **out, int max) {
  unsigned features = 0;
  rmsnorm_cpu_features(&features); /* OS support (XGETBV) included */
  int n = 0;
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds && n < max; i++)
    if ((features & kinds[i].needs) == kinds[i].needs) out[n++] = &kinds[i];
  return n;
}
