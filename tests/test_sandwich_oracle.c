/* test_sandwich_oracle.c - holds the sandwich-norm oracle
 * (sandwich_oracle.h) to central finite differences of its own forward in
 * long double: da, dh, dw_post and dw_pre of L = sum c hn + sum e xn, with an
 * outlier channel, on ragged row lengths. */
#include <math.h>

#include "check.h"
#include "sandwich_oracle.h"

#define D_MAX 160

static unsigned long long state = 0x13198a2e03707344ull;
static sw_t uniform(void) { /* [-1, 1) */
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return (sw_t)(state >> 11) * 0x1p-52L - 1;
}

typedef struct row {
  size_t d;
  sw_t eps;
  sw_t a[D_MAX], h[D_MAX], wpost[D_MAX], wpre[D_MAX], c[D_MAX], e[D_MAX];
} row;

static sw_t loss(const row *r) {
  sw_t hn[D_MAX], xn[D_MAX], L = 0;
  sandwich_forward_row(r->a, r->h, r->wpost, r->wpre, r->d, r->eps, hn, xn);
  for (size_t j = 0; j < r->d; j++) L += r->c[j] * hn[j] + r->e[j] * xn[j];
  return L;
}

static sw_t fd(row *r, sw_t *v) {
  sw_t keep = *v, step = 1e-7L * (fabsl(keep) > 1 ? fabsl(keep) : 1);
  *v = keep + step;
  sw_t up = loss(r);
  *v = keep - step;
  sw_t down = loss(r);
  *v = keep;
  return (up - down) / (2 * step);
}

static sw_t max_abs(const sw_t *v, size_t d) {
  sw_t m = 0;
  for (size_t j = 0; j < d; j++) m = fmaxl(m, fabsl(v[j]));
  return m;
}

static void check_row(size_t d) {
  row r = {.d = d, .eps = 1e-6L};
  for (size_t j = 0; j < d; j++) {
    r.a[j] = 4 * uniform(), r.h[j] = uniform(), r.wpost[j] = 0.3L * uniform();
    r.wpre[j] = 0.3L * uniform(), r.c[j] = uniform(), r.e[j] = uniform();
  }
  r.a[d / 2] *= 25; /* an outlier channel */
  sw_t da[D_MAX], dh[D_MAX], dwpost[D_MAX] = {0}, dwpre[D_MAX] = {0};
  sandwich_backward_row(r.a, r.h, r.wpost, r.wpre, r.c, r.e, d, r.eps, da, dh, dwpost, dwpre);
  /* relative to each gradient's size, plus the difference quotient's own
   * rounding (~1e-19 |L| / step): d = 1 makes da nearly 0 */
  sw_t fl = 1e-10L * (1 + fabsl(loss(&r)));
  sw_t sa = max_abs(da, d), sh = max_abs(dh, d), sp = max_abs(dwpost, d), sq = max_abs(dwpre, d);
  for (size_t j = 0; j < d; j++) {
    tu_check(fabsl(da[j] - fd(&r, &r.a[j])) <= 1e-7L * sa + fl, "da d=%zu j=%zu", d, j);
    tu_check(fabsl(dh[j] - fd(&r, &r.h[j])) <= 1e-7L * sh + fl, "dh d=%zu j=%zu", d, j);
    tu_check(fabsl(dwpost[j] - fd(&r, &r.wpost[j])) <= 1e-7L * sp + fl, "dw_post d=%zu j=%zu", d, j);
    tu_check(fabsl(dwpre[j] - fd(&r, &r.wpre[j])) <= 1e-7L * sq + fl, "dw_pre d=%zu j=%zu", d, j);
  }
}

int main(void) {
  static const size_t ds[] = {1, 2, 3, 7, 16, 33, 64, 127, 160};
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) check_row(ds[i]);
  return tu_summary("sandwich_oracle");
}
