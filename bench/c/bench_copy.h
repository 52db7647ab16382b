/* bench_copy.h - the copies that set `rmsnorm bench`'s copy limit: memcpy
 * and non-temporal store loops, each usable only where the CPU has it. */
#ifndef RMSNORM_TOOLS_BENCH_COPY_H
#define RMSNORM_TOOLS_BENCH_COPY_H

#include <stddef.h>

typedef struct rn_copy_kind {
  const char *name;                                     /* "memcpy", "nt-avx2", ... */
  void (*copy)(void *dst, const void *src, size_t n);   /* dst and src do not overlap */
  unsigned needs;                                       /* RMSNORM_CPU_* bits it needs */
} rn_copy_kind;

/* Fills out[] with the copies this CPU can run (memcpy first).
 * @return how many, at most max. */
int rn_copy_kinds(const rn_copy_kind **out, int max);

#endif
