/* info.c - `rmsnorm info`: the version, the CPU features the library
 * detected, the kernel set a fresh context runs, and its default thread
 * count. Everything comes from the library's public queries. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "rmsnorm.h"

static const struct {
  unsigned bit;
  const char *name;
} cpu_feature_names[] = {
  {RMSNORM_CPU_AVX2, "avx2"},         {RMSNORM_CPU_FMA, "fma"},
  {RMSNORM_CPU_F16C, "f16c"},         {RMSNORM_CPU_AVX512F, "avx512f"},
  {RMSNORM_CPU_AVX512BW, "avx512bw"}, {RMSNORM_CPU_AVX512VL, "avx512vl"},
  {RMSNORM_CPU_AVX512BF16, "avx512bf16"}, {RMSNORM_CPU_NEON, "neon"},
  {RMSNORM_CPU_NEON_FP16, "fp16"},
};

int rn_cli_info(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (rn_cli_is_help(argv[i])) {
      printf("usage: rmsnorm info\n\n"
             "Prints the version, the CPU features detected (with OS support checked),\n"
             "the kernel set in use (RMSNORM_ISA=scalar|avx2|avx512|neon overrides the choice)\n"
             "and the default thread count. Takes no arguments.\n");
      return RN_EXIT_OK;
    }
    rn_cli_error("info: unexpected argument '%s' (see 'rmsnorm info --help')", argv[i]);
    return RN_EXIT_USAGE;
  }

  printf("version:      rmsnorm %s (library %s)\n", RMSNORM_VERSION_STRING,
         rmsnorm_version_string());

  unsigned features = 0;
  printf("cpu features:");
  if (rmsnorm_cpu_features(&features) != RMSNORM_OK) {
    printf(" unknown");
  } else {
    int any = 0;
    for (size_t i = 0; i < sizeof cpu_feature_names / sizeof cpu_feature_names[0]; i++)
      if (features & cpu_feature_names[i].bit) {
        printf(" %s", cpu_feature_names[i].name);
        any = 1;
      }
    if (!any) printf(" none of those used (avx2 fma f16c avx512f/bw/vl/bf16 neon fp16)");
  }
  printf("\n");

  rmsnorm_context *ctx = NULL;
  rmsnorm_status st = rmsnorm_context_create(&ctx);
  if (st != RMSNORM_OK) {
    rn_cli_error("info: %s (%s)", rmsnorm_status_message(st), rmsnorm_status_name(st));
    return RN_EXIT_FAILURE;
  }
  rmsnorm_isa isa = RMSNORM_ISA_AUTO;
  int threads = 0;
  rmsnorm_status st_isa = rmsnorm_context_get_isa(ctx, &isa);
  rmsnorm_status st_threads = rmsnorm_context_get_threads(ctx, &threads);
  rmsnorm_context_free(ctx);

  const char *env = getenv("RMSNORM_ISA");
  if (st_isa == RMSNORM_OK && env && strcmp(env, rmsnorm_isa_name(isa)) != 0)
    /* the library ignores a value it does not know or this CPU cannot run */
    printf("kernel set:   %s (RMSNORM_ISA=%s ignored: not scalar, avx2, avx512 or neon, or not "
           "supported here)\n", rmsnorm_isa_name(isa), env);
  else if (st_isa == RMSNORM_OK)
    printf("kernel set:   %s%s%s%s\n", rmsnorm_isa_name(isa), env ? " (RMSNORM_ISA=" : "",
           env ? env : "", env ? ")" : "");
  else
    printf("kernel set:   unknown (%s)\n", rmsnorm_status_name(st_isa));
  if (st_threads == RMSNORM_OK)
    printf("threads:      %d (default: one per online CPU)\n", threads);
  else
    printf("threads:      unknown (%s)\n", rmsnorm_status_name(st_threads));
  return RN_EXIT_OK;
}
