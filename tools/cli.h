/* cli.h - what the parts of the rmsnorm command share: exit codes, the
 * error line, and the subcommands' entry points. Each subcommand is called
 * as run(argc, argv) with argv[0] its own name (as `git` does), and returns
 * the process exit code. Only the command may exit; the library never does. */
#ifndef RMSNORM_TOOLS_CLI_H
#define RMSNORM_TOOLS_CLI_H

/* Exit codes (the contract in docs/cli.md): */
enum {
  RN_EXIT_OK = 0,      /* success */
  RN_EXIT_FAILURE = 1, /* a file, shape, dtype or library problem */
  RN_EXIT_USAGE = 2    /* unknown command or option, missing or out-of-range argument */
};

/* Prints "rmsnorm: <message>\n" to stderr, one line. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
void rn_cli_error(const char *fmt, ...);

/* @return 1 if arg is -h or --help. */
int rn_cli_is_help(const char *arg);

/* forward, backward, layernorm, layernorm-backward, add-forward, sandwich,
 * gated, qk-rope, linear (chosen by argv[0]). */
int rn_cli_norm(int argc, char **argv);
/* demo: the worked example. */
int rn_cli_demo(int argc, char **argv);
/* info: version, CPU features, kernel set, default threads. */
int rn_cli_info(int argc, char **argv);
#ifdef RMSNORM_CLI_HAVE_BENCH
/* bench: defined in bench/c/bench.c, built in when that file exists. */
int rn_cli_bench(int argc, char **argv);
#endif

#endif
