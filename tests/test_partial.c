/* test_partial.c - pRMSNorm's k (rmsnorm_partial_count, and what the forward
 * and backward use) against exact computations made without the library's
 * formula: integer arithmetic on decimal fractions (the grid p =
 * 0.01..0.99 x d = 10..4096, and 3- and 4-digit decimals), quotients p = K/d,
 * and a golden table written with Python's fractions (tests/data/
 * partial_k.py). Usage: test_partial PATH/partial_k.txt */
#include "testutil.h"

/* ceil(num * d / den) in integers, clamped to [1, d]. */
static size_t ceil_ratio(uint64_t num, uint64_t den, size_t d) {
  tu_u128 t = (tu_u128)num * d;
  size_t k = (size_t)((t + den - 1) / den);
  return k < 1 ? 1 : k > d ? d : k;
}

static size_t count(double p, size_t d) {
  size_t k = 0;
  rmsnorm_status st = rmsnorm_partial_count(p, d, &k);
  return st == RMSNORM_OK ? k : (size_t)-1;
}

/* p written as a decimal with `digits` places: k = ceil(N * d / 10^digits). */
static void test_decimals(void) {
  long bad = 0, naive_off = 0;
  for (int nn = 1; nn < 100; nn++) {
    char text[16];
    snprintf(text, sizeof text, "0.%02d", nn);
    double p = strtod(text, NULL);
    for (size_t d = 10; d <= 4096; d++) {
      size_t want = ceil_ratio((uint64_t)nn, 100, d);
      if (count(p, d) != want && bad++ < 5)
        tu_check(0, "%s x %zu: k = %zu, want %zu", text, d, count(p, d), want);
      naive_off += (size_t)ceil(p * (double)d) != want;
    }
  }
  tu_check(bad == 0, "two-digit grid: %ld pairs wrong", bad);
  /* the grid has pairs where ceil of the double product is one too many
   * (0.07 x 100 = 7.0000000000000007): this test would see that formula */
  tu_check(naive_off > 0 && count(0.07, 100) == 7, "0.07 x 100: k = %zu (the double ceil is off "
           "on %ld pairs of the grid)", count(0.07, 100), naive_off);
  printf("test_partial: ceil of the double product is off on %ld of 99 x 4087 pairs\n",
         naive_off);
  /* 3 and 4 decimal places, d up to a million */
  bad = 0;
  for (int places = 3; places <= 4; places++) {
    uint64_t den = places == 3 ? 1000 : 10000;
    for (uint64_t nn = 1; nn < den; nn += places == 3 ? 1 : 7) {
      char text[16];
      snprintf(text, sizeof text, "0.%0*llu", places, (unsigned long long)nn);
      double p = strtod(text, NULL);
      for (int rep = 0; rep < 20; rep++) {
        size_t d = 1 + (size_t)(tu_next() % (rep < 10 ? 5000 : 1000000));
        if (rep == 0) d = (size_t)den; /* p * d an integer */
        size_t want = ceil_ratio(nn, den, d);
        if (count(p, d) != want && bad++ < 5)
          tu_check(0, "%s x %zu: k = %zu, want %zu", text, d, count(p, d), want);
      }
    }
  }
  tu_check(bad == 0, "3- and 4-digit decimals: %ld wrong", bad);
}

/* p = K/d rounded to double gives K; the doubles just around it give K + 1
 * (above) and K (below, unless K/d is itself the smallest such double). */
static void test_quotients(void) {
  long bad = 0;
  for (int rep = 0; rep < 200000; rep++) {
    size_t d = 1 + (size_t)(tu_next() % (rep % 3 == 0 ? 64 : rep % 3 == 1 ? 100000 : (1u << 30)));
    size_t K = 1 + (size_t)(tu_next() % d);
    double p = (double)K / (double)d;
    int ok = count(p, d) == K;
    if (K < d) ok &= count(nextafter(p, 2.0), d) == K + 1;
    if (!ok && bad++ < 5) tu_check(0, "quotient %zu/%zu: k = %zu", K, d, count(p, d));
  }
  tu_check(bad == 0, "quotients: %ld wrong", bad);
}

/* The golden table from fractions.Fraction. */
static void test_golden(const char *path) {
  FILE *f = fopen(path, "r");
  if (!tu_check(f != NULL, "cannot open %s", path)) return;
  char hex[64], text[64];
  unsigned long long d, k;
  long rows = 0, bad = 0;
  while (fscanf(f, "%63s %63s %llu %llu", hex, text, &d, &k) == 4) {
    double p = strtod(hex, NULL); /* a hex float: exact */
    rows++;
    if (count(p, (size_t)d) != (size_t)k && bad++ < 10)
      tu_check(0, "golden: p = %s (%s), d = %llu: k = %zu, want %llu", text, hex, d,
               count(p, (size_t)d), k);
  }
  fclose(f);
  tu_check(rows > 5000 && bad == 0, "golden table: %ld rows, %ld wrong", rows, bad);
}

/* The forward and the backward use that k: with x_j = j + 1 and eps = 0 the
 * statistic is (k + 1)(2k + 1) / 6, so r names k. */
static void test_through_ops(void) {
  rmsnorm_context *ctx;
  if (rmsnorm_context_create(&ctx) != RMSNORM_OK) return;
  static const struct { const char *p; size_t d, k; } cases[] = {
      {"0.07", 100, 7}, {"0.29", 100, 29}, {"0.57", 100, 57}, {"0.07", 4000, 280},
      {"0.0625", 4096, 256}, {"0.1", 30, 3}, {"0.37", 127, 47}, {"0.9", 10, 9}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    size_t d = cases[c].d, k = cases[c].k;
    double *x = malloc(d * sizeof *x), *y = malloc(d * sizeof *y), *dx = malloc(d * sizeof *dx);
    double r = 0;
    for (size_t j = 0; j < d; j++) x[j] = (double)(j + 1);
    rmsnorm_config cfg;
    rmsnorm_config_init(&cfg, RMSNORM_F64);
    cfg.eps = 0;
    cfg.partial = strtod(cases[c].p, NULL);
    rmsnorm_status st = rmsnorm_forward(ctx, &cfg, 1, d, x, d, NULL, NULL, y, d, &r);
    long double ms = (long double)(k + 1) * (2 * k + 1) / 6;
    tu_check(st == RMSNORM_OK && fabsl(r - 1 / sqrtl(ms)) <= 1e-15L / sqrtl(ms),
             "forward p = %s d = %zu: r = %.17g, want 1/sqrt(%Lg) (k = %zu)", cases[c].p, d, r,
             ms, k);
    /* backward: dx_j for j >= k is r * dy_j exactly (outside the statistic) */
    for (size_t j = 0; j < d; j++) y[j] = 1.0;
    st = rmsnorm_backward(ctx, &cfg, 1, d, x, d, y, d, NULL, NULL, dx, d, NULL, NULL);
    int outside_ok = st == RMSNORM_OK;
    for (size_t j = k; j < d; j++) outside_ok &= fabs(dx[j] - r) <= 1e-15 * r;
    outside_ok &= k == d || fabs(dx[k - 1] - r) > 1e-9 * r; /* inside: corrected */
    tu_check(outside_ok, "backward p = %s d = %zu: the statistic's elements are the first %zu",
             cases[c].p, d, k);
    free(x), free(y), free(dx);
  }
  rmsnorm_context_free(ctx);
}

static void test_errors(void) {
  size_t k = 99;
  tu_check(rmsnorm_partial_count(0.5, 10, NULL) == RMSNORM_ERROR_NULL_POINTER &&
               rmsnorm_partial_count(0.5, 0, &k) == RMSNORM_ERROR_BAD_SIZE &&
               rmsnorm_partial_count(0.0, 10, &k) == RMSNORM_ERROR_BAD_PARTIAL &&
               rmsnorm_partial_count(1.5, 10, &k) == RMSNORM_ERROR_BAD_PARTIAL &&
               rmsnorm_partial_count(NAN, 10, &k) == RMSNORM_ERROR_BAD_PARTIAL && k == 99,
           "rmsnorm_partial_count: statuses");
  tu_check(count(1.0, 12345) == 12345 && count(5e-324, 1000) == 1 && count(0.5, 1) == 1,
           "rmsnorm_partial_count: extremes");
}

int main(int argc, char **argv) {
  tu_seed(11);
  test_errors();
  test_decimals();
  test_quotients();
  if (argc > 1) test_golden(argv[1]);
  else tu_check(0, "usage: test_partial PATH/partial_k.txt");
  test_through_ops();
  return tu_finish("test_partial");
}
