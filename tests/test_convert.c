/* test_convert.c - fp16/bf16 conversions against a slow, obviously correct
 * rounding: exhaustive over every 16-bit pattern, and over a dense sweep of
 * fp32 patterns including every tie. */
#include "runtime/cpu.h"
#include "runtime/work.h"
#include "testutil.h"

#if defined(__x86_64__) || defined(_M_X64)
#define RN_TEST_X86 1
extern const rn_kernel_set rn_kernels_avx2;
#else
#define RN_TEST_X86 0
#endif

/* Value of an fp16 pattern, from the format's definition. */
static double f16_value(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  double v = exp == 0 ? ldexp(man, -24) : exp == 31 ? (man ? NAN : INFINITY)
                                                     : ldexp(1024 + man, exp - 25);
  return sign ? -v : v;
}

/* Nearest (ties to even) pattern among finite patterns of a 16-bit format,
 * by bisection on the ordered magnitudes; overflow as IEEE says. */
static uint16_t slow_round(double v, int bf16) {
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  uint16_t maxfin = bf16 ? 0x7f7f : 0x7bff;
  double top = bf16 ? (double)rn_bf16_to_f32(maxfin) : f16_value(maxfin);
  double ulp_top = bf16 ? ldexp(1, 127 - 7) : ldexp(1, 15 - 10);
  if (a >= top + ulp_top / 2) return sign | (bf16 ? 0x7f80 : 0x7c00);
  uint16_t lo = 0, hi = maxfin;
  while (hi - lo > 1) {
    uint16_t mid = (uint16_t)((lo + hi) / 2);
    double m = bf16 ? (double)rn_bf16_to_f32(mid) : f16_value(mid);
    if (m <= a) lo = mid; else hi = mid;
  }
  double vl = bf16 ? (double)rn_bf16_to_f32(lo) : f16_value(lo);
  double vh = bf16 ? (double)rn_bf16_to_f32(hi) : f16_value(hi);
  uint16_t r;
  if (a - vl < vh - a) r = lo;
  else if (a - vl > vh - a) r = hi;
  else r = (lo & 1) ? hi : lo;
  if (a == vl) r = lo;
  return sign | r;
}

/* The bf16 forward's stores on one kernel set: rows of x = +-1 and eps 0
 * make r = 1 and y_j = RNE(+-w_j), so the fp32 weights `w` (n of them) are
 * rounded by every store path of the set (plain and streaming stores, pairs
 * in either order, with and without the NaN test) and compared with the
 * scalar rounding checked above. Rows of d at an element offset and stride
 * ldy; x in place of y when in_place. */
static void forward_store_case(rmsnorm_context *ctx, rmsnorm_isa isa, const float *w, size_t n,
                               size_t rows, size_t off, size_t ldy, int in_place) {
  const size_t d = 4096;
  rmsnorm_config cfg;
  rmsnorm_config_init(&cfg, RMSNORM_BF16);
  cfg.param_dtype = RMSNORM_F32;
  cfg.eps = 0;
  uint16_t *x = malloc((rows * d) * 2), *y = malloc((off + rows * ldy) * 2);
  float *wd = malloc(d * sizeof *wd);
  if (!x || !y || !wd) abort();
  for (size_t c = 0; c < n; c += d) {
    for (size_t j = 0; j < d; j++) wd[j] = w[(c + j) % n];
    for (size_t i = 0; i < rows; i++)
      for (size_t j = 0; j < d; j++) x[i * d + j] = i % 2 ? 0xbf80 : 0x3f80; /* -1, +1 */
    uint16_t *out = in_place ? x : y + off;
    size_t ld = in_place ? d : ldy;
    TU_OK(rmsnorm_forward(ctx, &cfg, rows, d, x, d, wd, NULL, out, ld, NULL));
    for (size_t i = 0; i < rows; i++) {
      volatile float sign = i % 2 ? -1.0f : 1.0f; /* the product as the kernels form it */
      for (size_t j = 0; j < d; j++) {
        uint16_t want = rn_f32_to_bf16(sign * wd[j]), got = out[i * ld + j];
        tu_check(got == want, "%s bf16 forward, %zu rows at offset %zu, ld %zu%s: row %zu "
                 "column %zu, w %08x -> %04x want %04x", rmsnorm_isa_name(isa), rows, off, ld,
                 in_place ? " in place" : "", i, j, rn_f32_bits(wd[j]), got, want);
      }
    }
  }
  free(x);
  free(y);
  free(wd);
}

/* A few rows of fp16/bf16 with a weight of the same dtype, which the forward
 * reads as it is (no copy in fp32): every 16-bit weight pattern, with and
 * without Gemma's 1 + g, must give what the copy would, RNE(+-(off + g))
 * with off added in float (-0 becomes +0, NaNs quiet), on every set. */
static void forward_direct_weight(rmsnorm_context *ctx, rmsnorm_isa isa) {
  const size_t d = 4096;
  for (int bf16 = 0; bf16 <= 1; bf16++)
    for (int offset = 0; offset <= 1; offset++)
      for (size_t rows = 1; rows <= 3; rows++) {
        rmsnorm_dtype dt = bf16 ? RMSNORM_BF16 : RMSNORM_F16;
        rmsnorm_config cfg;
        rmsnorm_config_init(&cfg, dt);
        cfg.eps = 0;
        cfg.flags = offset ? RMSNORM_FLAG_WEIGHT_OFFSET : 0;
        uint16_t x[3 * 4096], y[3 * 4096], w[4096];
        uint16_t one = bf16 ? 0x3f80 : 0x3c00;
        for (size_t i = 0; i < rows * d; i++) x[i] = (uint16_t)(i / d % 2 ? one | 0x8000 : one);
        for (uint32_t c = 0; c < 65536; c += (uint32_t)d) {
          for (size_t j = 0; j < d; j++) w[j] = (uint16_t)(c + j);
          TU_OK(rmsnorm_forward(ctx, &cfg, rows, d, x, d, w, NULL, y, d, NULL));
          volatile float off = (float)offset;
          for (size_t i = 0; i < rows; i++) {
            volatile float sign = i % 2 ? -1.0f : 1.0f;
            for (size_t j = 0; j < d; j++) {
              float g = off + (bf16 ? rn_bf16_to_f32(w[j]) : rn_f16_to_f32(w[j]));
              uint16_t want = bf16 ? rn_f32_to_bf16(sign * g) : rn_f32_to_f16(sign * g);
              tu_check(y[i * d + j] == want,
                       "%s %s forward, %zu rows, weight %04x%s, row %zu: %04x want %04x",
                       rmsnorm_isa_name(isa), bf16 ? "bf16" : "f16", rows, w[j],
                       offset ? " (1 + g)" : "", i, y[i * d + j], want);
            }
          }
        }
      }
}

static void forward_stores(void) {
  /* every bf16 tie and its two neighbours, a sweep of all patterns, NaNs,
   * infinities and the largest float */
  size_t sweep = (size_t)((0x100000000ull + 65520) / 65521), nnans = 8;
  size_t cap = 3 * 0x7f7f + sweep + nnans, n = 0;
  float *w = malloc(cap * sizeof *w);
  if (!w) abort();
  for (uint32_t h = 0; h < 0x7f7f; h++) {
    uint32_t tie = (h << 16) | 0x8000u;
    w[n++] = rn_bits_f32(tie);
    w[n++] = rn_bits_f32(tie - 1);
    w[n++] = rn_bits_f32(tie + 1);
  }
  for (uint64_t u = 0; u < 0x100000000ull; u += 65521) w[n++] = rn_bits_f32((uint32_t)u);
  static const uint32_t nans[8] = {0x7f800001u, 0xffc00000u, 0x7fbfffffu, 0x7fff8000u,
                                   0xffffffffu, 0x7f7fffffu, 0x7f800000u, 0xff800000u};
  for (size_t i = 0; i < nnans; i++) w[n++] = rn_bits_f32(nans[i]);
  if (n != cap) abort();
  static const rmsnorm_isa isas[] = {RMSNORM_ISA_SCALAR, RMSNORM_ISA_AVX2, RMSNORM_ISA_AVX512,
                                     RMSNORM_ISA_NEON};
  for (size_t s = 0; s < sizeof isas / sizeof *isas; s++) {
    rmsnorm_context *ctx;
    TU_OK(rmsnorm_context_create(&ctx));
    if (rmsnorm_context_set_isa(ctx, isas[s]) == RMSNORM_OK) {
      /* in cache: rows at a vector boundary, 3 elements off with a stride
       * that starts the 8 rows at 8 offsets to a 16-value pair, few rows
       * (no reordered weight), in place; past RN_STREAM_BYTES: streaming
       * stores */
      forward_store_case(ctx, isas[s], w, n, 8, 0, 4096, 0);
      forward_store_case(ctx, isas[s], w, n, 8, 3, 4096 + 5, 0);
      forward_store_case(ctx, isas[s], w, n, 3, 1, 4096, 0);
      forward_store_case(ctx, isas[s], w, n, 6, 0, 4096, 1);
      forward_store_case(ctx, isas[s], w, 4096 * 4, 160, 0, 4096, 0);
      forward_store_case(ctx, isas[s], w + n - 4096, 4096, 160, 8, 4096, 0);
      forward_direct_weight(ctx, isas[s]);
    }
    rmsnorm_context_free(ctx);
  }
  free(w);
}

int main(void) {
  forward_stores();
  /* fp16 -> fp32: every pattern */
  for (uint32_t h = 0; h < 65536; h++) {
    double want = f16_value((uint16_t)h), got = rn_f16_to_f32((uint16_t)h);
    tu_check(isnan(want) ? isnan(got) : (got == want && signbit(got) == signbit(want)),
             "f16 %04x -> %g want %g", h, got, want);
    /* the branch-free form (convert.h) gives the same bits, NaNs included */
    tu_check(rn_f32_bits(rn_f16_to_f32_lanes((uint16_t)h)) == rn_f32_bits(rn_f16_to_f32((uint16_t)h)),
             "f16 %04x: lanes form differs", h);
  }
  /* f32 -> f16/bf16: a sweep with a stride coprime to everything, plus all
   * exact halfway points between 16-bit neighbours */
  for (uint64_t u = 0; u < 0x100000000ull; u += 4099) {
    float f = rn_bits_f32((uint32_t)u);
    tu_check(rn_f32_to_f16_lanes(f) == rn_f32_to_f16(f) && rn_f32_to_bf16_lanes(f) == rn_f32_to_bf16(f),
             "f32 %08x: lanes forms differ", (unsigned)u);
    if (isnan(f)) {
      tu_check((rn_f32_to_f16(f) & 0x7e00) == 0x7e00, "f16 NaN quiet %08x", (unsigned)u);
      tu_check((rn_f32_to_bf16(f) & 0x7fc0) == 0x7fc0, "bf16 NaN quiet %08x", (unsigned)u);
      continue;
    }
    tu_check(rn_f32_to_f16(f) == slow_round(f, 0), "f32 %08x -> f16 %04x want %04x",
             (unsigned)u, rn_f32_to_f16(f), slow_round(f, 0));
    tu_check(rn_f32_to_bf16(f) == slow_round(f, 1), "f32 %08x -> bf16 %04x want %04x",
             (unsigned)u, rn_f32_to_bf16(f), slow_round(f, 1));
  }
  for (uint32_t h = 0; h < 0x7bff; h++) {
    float mid = (float)((f16_value((uint16_t)h) + f16_value((uint16_t)(h + 1))) / 2);
    tu_check(rn_f32_to_f16_lanes(mid) == rn_f32_to_f16(mid) &&
                 rn_f32_to_f16_lanes(-mid) == rn_f32_to_f16(-mid), "f16 tie lanes %04x", h);
    tu_check(rn_f32_to_f16(mid) == slow_round(mid, 0), "f16 tie after %04x", h);
    tu_check(rn_f32_to_f16(-mid) == slow_round(-mid, 0), "f16 tie after -%04x", h);
  }
  for (uint32_t h = 0; h < 0x7f7f; h++) {
    float mid = (rn_bf16_to_f32((uint16_t)h) + rn_bf16_to_f32((uint16_t)(h + 1))) / 2;
    tu_check(rn_f32_to_bf16_lanes(mid) == rn_f32_to_bf16(mid), "bf16 tie lanes %04x", h);
    tu_check(rn_f32_to_bf16(mid) == slow_round(mid, 1), "bf16 tie after %04x", h);
  }
  /* the parameters' copies in the compute type (runtime/work.c converts a
   * row at a time, in vector lanes): every fp16/bf16 pattern, the weight
   * with and without Gemma's 1 + g, the same bits as one scalar conversion
   * and one float add (NaN payloads included); fp32 from an odd address */
  static uint16_t pattern[65536 + 1];
  static float copy[65536];
  for (uint32_t h = 0; h < 65536; h++) pattern[h + 1] = (uint16_t)h;
  /* the portable loops, and the AVX2 / F16C widening where the CPU has it */
#if RN_TEST_X86
  unsigned f16c = RMSNORM_CPU_AVX2 | RMSNORM_CPU_F16C;
  int nsets = (rn_cpu_features() & f16c) == f16c ? 2 : 1;
#else
  int nsets = 1;
#endif
  for (int set = 0; set < nsets; set++)
  for (int bf16 = 0; bf16 <= 1; bf16++)
    for (int offset = 0; offset <= 1; offset++) {
      rmsnorm_config cfg;
      rmsnorm_config_init(&cfg, bf16 ? RMSNORM_BF16 : RMSNORM_F16);
      cfg.flags = offset ? RMSNORM_FLAG_WEIGHT_OFFSET : 0;
#if RN_TEST_X86
      const rn_kernel_set *k = set ? &rn_kernels_avx2 : &rn_kernels_ref;
#else
      const rn_kernel_set *k = &rn_kernels_ref;
#endif
      /* odd lengths: the widening's tail */
      size_t n = 65536 - (size_t)(3 * offset);
      const float *got = rn_param_as_acc(&cfg, k, pattern + 1, 1, n, copy);
      for (uint32_t h = 0; h < n; h++) {
        float g = bf16 ? rn_bf16_to_f32((uint16_t)h) : rn_f16_to_f32((uint16_t)h);
        float want = (float)offset + g;
        tu_check(rn_f32_bits(got[h]) == rn_f32_bits(want),
                 "%s param %04x offset %d set %s: %08x want %08x", bf16 ? "bf16" : "f16", h,
                 offset, k->name, rn_f32_bits(got[h]), rn_f32_bits(want));
      }
    }
#if RN_TEST_X86
  /* the gradients' narrowing with F16C and AVX2: the sweep above, every bf16
   * and fp16 tie, NaNs of every kind, an odd count (the scalar tail) */
  if (nsets == 2) {
    size_t cap = ((size_t)1 << 32) / 4099 + 2 * 65536 + 64, n = 0;
    float *in = malloc(cap * sizeof *in);
    uint16_t *out = malloc(cap * sizeof *out + 1);
    if (!in || !out) return 2;
    for (uint64_t u = 0; u < 0x100000000ull; u += 4099) in[n++] = rn_bits_f32((uint32_t)u);
    for (uint32_t h = 0; h < 0x7f7f; h++)
      in[n++] = (rn_bf16_to_f32((uint16_t)h) + rn_bf16_to_f32((uint16_t)(h + 1))) / 2;
    for (uint32_t h = 0; h < 0x7bff; h++)
      in[n++] = (float)((f16_value((uint16_t)h) + f16_value((uint16_t)(h + 1))) / 2);
    static const uint32_t nans[] = {0x7f800001u, 0xffc00000u, 0x7fbfffffu, 0x7fe00001u, 0xff801000u};
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) in[n++] = rn_bits_f32(nans[i]);
    in[n++] = 1.0f; /* n odd */
    for (int bf16 = 0; bf16 <= 1; bf16++) {
      rmsnorm_dtype dt = bf16 ? RMSNORM_BF16 : RMSNORM_F16;
      rn_kernels_avx2.narrow(dt, in, n, (unsigned char *)out + 1); /* misaligned */
      for (size_t i = 0; i < n; i++) {
        uint16_t got;
        memcpy(&got, (unsigned char *)out + 1 + 2 * i, 2);
        uint16_t want = bf16 ? rn_f32_to_bf16(in[i]) : rn_f32_to_f16(in[i]);
        tu_check(got == want, "%s narrow %08x: %04x want %04x", bf16 ? "bf16" : "f16",
                 rn_f32_bits(in[i]), got, want);
      }
    }
    free(in);
    free(out);
  }
#endif
  {
    static unsigned char raw[4 * 1000 + 1];
    rmsnorm_config cfg;
    rmsnorm_config_init(&cfg, RMSNORM_F32);
    for (int j = 0; j < 1000; j++) {
      float g = j % 7 == 0 ? -0.0f : (float)(j - 500) * 0.37f;
      memcpy(raw + 1 + 4 * j, &g, 4);
    }
    const float *got = rn_param_as_acc(&cfg, NULL, raw + 1, 0, 1000, copy);
    for (int j = 0; j < 1000; j++) {
      float g;
      memcpy(&g, raw + 1 + 4 * j, 4);
      tu_check(rn_f32_bits(got[j]) == rn_f32_bits(0.0f + g), "f32 param %d", j);
    }
  }
  return tu_finish("test_convert");
}
