/* main.c - the rmsnorm command: top-level options and the table of
 * subcommands it dispatches to. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "outfile.h"
#include "rmsnorm.h"

typedef struct command {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
} command;

static const command commands[] = {
  {"forward", "RMSNorm: Y from X", rn_cli_norm},
  {"backward", "RMSNorm gradients: DX (and DG, DB) from X and DY", rn_cli_norm},
  {"layernorm", "LayerNorm: Y from X", rn_cli_norm},
  {"layernorm-backward", "LayerNorm gradients: DX (and DG, DB) from X and DY", rn_cli_norm},
  {"add-forward", "residual add + RMSNorm: H' = H + U and Y from H and U", rn_cli_norm},
  {"sandwich", "Gemma's sandwich norms: H' = H + RMSNorm(A), Y = RMSNorm(H')", rn_cli_norm},
  {"gated", "gated RMSNorm: Y from X and the gate Z (Mamba2, Qwen3-Next)", rn_cli_norm},
  {"qk-rope", "QK-norm + RoPE: each head normalized, then rotated by its position", rn_cli_norm},
  {"linear", "RMSNorm + linear layer, gain folded: Z = RMSNorm(X) W", rn_cli_norm},
  {"demo", "the worked example, step by step", rn_cli_demo},
  {"info", "version, CPU features, kernel set, threads", rn_cli_info},
#ifdef RMSNORM_CLI_HAVE_BENCH
  {"bench", "measure the kernels", rn_cli_bench},
#endif
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

void rn_cli_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("rmsnorm: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

int rn_cli_is_help(const char *arg) { return !strcmp(arg, "-h") || !strcmp(arg, "--help"); }

static void usage(FILE *to) {
  fprintf(to,
          "usage: rmsnorm COMMAND [ARGS...]\n"
          "       rmsnorm COMMAND --help\n"
          "       rmsnorm --version\n"
          "\n"
          "RMSNorm and LayerNorm, forward and backward, and fused with the residual add\n"
          "or the next linear layer, on .npy files (librmsnorm %s).\n"
          "\n"
          "commands:\n",
          rmsnorm_version_string());
  for (size_t i = 0; i < N_COMMANDS; i++)
    fprintf(to, "  %-20s %s\n", commands[i].name, commands[i].summary);
  fprintf(to,
          "\n"
          "exit status: 0 success, 1 failure (file, shape, dtype, library), 2 usage error\n");
}

static const command *find(const char *name) {
  for (size_t i = 0; i < N_COMMANDS; i++)
    if (!strcmp(commands[i].name, name)) return &commands[i];
  return NULL;
}

static int dispatch(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return RN_EXIT_USAGE;
  }
  const char *arg = argv[1];
  if (rn_cli_is_help(arg)) {
    usage(stdout);
    return RN_EXIT_OK;
  }
  if (!strcmp(arg, "--version") || !strcmp(arg, "-V")) {
    printf("rmsnorm %s\n", rmsnorm_version_string());
    return RN_EXIT_OK;
  }
  if (!strcmp(arg, "help")) { /* `rmsnorm help CMD` is `rmsnorm CMD --help` */
    if (argc < 3) {
      usage(stdout);
      return RN_EXIT_OK;
    }
    const command *c = find(argv[2]);
    if (!c) {
      rn_cli_error("unknown command '%s' (see 'rmsnorm --help')", argv[2]);
      return RN_EXIT_USAGE;
    }
    char help[] = "--help";
    char *sub[] = {argv[2], help, NULL};
    return c->run(2, sub);
  }
  if (arg[0] == '-') {
    rn_cli_error("unknown option '%s' (see 'rmsnorm --help')", arg);
    return RN_EXIT_USAGE;
  }
  const command *c = find(arg);
  if (!c) {
    rn_cli_error("unknown command '%s' (see 'rmsnorm --help')", arg);
    return RN_EXIT_USAGE;
  }
  return c->run(argc - 1, argv + 1);
}

int main(int argc, char **argv) {
  /* before anything else, and before any thread exists: a closed pipe or a
   * file size limit becomes a failing write; a signal removes temporaries */
  out_signals_init();
  int rc = dispatch(argc, argv);
  /* a full disk or closed pipe on stdout is a failure, not a silent success:
   * one line, exit 1 */
  errno = 0;
  int flushed = fflush(stdout) == 0;
  if (!flushed || ferror(stdout)) {
    if (!flushed && errno)
      rn_cli_error("cannot write to standard output: %s", strerror(errno));
    else
      rn_cli_error("cannot write to standard output");
    if (rc == RN_EXIT_OK) rc = RN_EXIT_FAILURE;
  }
  return rc;
}
