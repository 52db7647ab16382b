/* stream_copy.h - a finished row copied past the caches, for the kernel
 * sets that compile a reference body with memory hooks (gated_set.inc,
 * rope_set.inc): x86 with AVX2 or AVX-512 only. */
#ifndef RMSNORM_STREAM_COPY_H
#define RMSNORM_STREAM_COPY_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* n bytes from src (scratch, 64-byte aligned) to dst: plain copies up to
 * dst's first 32-byte boundary and after its last, streaming stores
 * between (they spare the destination's read for ownership). */
static inline void rn_stream_copy(void *dst, const void *src, size_t n) {
  char *d = (char *)dst;
  const char *s = (const char *)src;
  size_t head = (32 - ((uintptr_t)d & 31)) & 31;
  if (head > n) head = n;
  memcpy(d, s, head);
  size_t j = head;
  for (; j + 32 <= n; j += 32)
    _mm256_stream_si256((__m256i *)(void *)(d + j),
                        _mm256_loadu_si256((const __m256i *)(const void *)(s + j)));
  memcpy(d + j, s + j, n - j);
}

#endif
