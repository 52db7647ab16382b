/* check.h: how every test program counts its checks and reports failures.
 * No library headers, so the C suite (through testutil.h), the CLI tests and
 * the training demo's tests all share it. */
#ifndef RMSNORM_TESTS_CHECK_H
#define RMSNORM_TESTS_CHECK_H

#include <stdarg.h>
#include <stdio.h>

static long tu_checks, tu_failures;

/* Records one check; prints the first failures (not all: a broken kernel
 * would print millions of lines). Returns ok. */
static inline int tu_check(int ok, const char *fmt, ...) {
  tu_checks++;
  if (ok) return 1;
  if (++tu_failures <= 30) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
  }
  return 0;
}

/* Prints "<name>: N checks, P passed, F failed" and gives the exit status. */
static inline int tu_summary(const char *name) {
  printf("%s: %ld checks, %ld passed, %ld failed\n", name, tu_checks, tu_checks - tu_failures,
         tu_failures);
  return tu_failures ? 1 : 0;
}

#endif
