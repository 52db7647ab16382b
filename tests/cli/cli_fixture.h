/* cli_fixture.h - what every test of the rmsnorm command shares: a scratch
 * folder, .npy files written and read back, the command run as a process, and
 * the float64 (long double) oracle its results are compared with. */
#ifndef RMSNORM_TESTS_CLI_FIXTURE_H
#define RMSNORM_TESTS_CLI_FIXTURE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../check.h"
#include "rmsnorm.h"

/* This test, and so the command it runs, built with AddressSanitizer */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

/* A setup step that failed (not a check): message, errno, exit 2. */
void die(const char *what);

/* ---- dtypes (conversions written here, independent of the library) ------- */

typedef enum tdt { TF32, TF16, TBF16, TF64 } tdt;
extern const char *const tdt_name[4];  /* f32 f16 bf16 f64 */
extern const char *const tdt_descr[4]; /* numpy's descr; bf16 travels as '<u2' */
extern const size_t tdt_size[4];
extern const rmsnorm_dtype tdt_lib[4];

double load(tdt dt, const void *p, size_t i);
void store(tdt dt, void *p, size_t i, double v); /* rounded to nearest even */

/* ---- arrays and .npy files -------------------------------------------------- */

#define MAXDIM 8

/* An array: values as doubles (exactly the dtype's values) and its bytes. */
typedef struct arr {
  tdt dt;
  int ndim;
  size_t shape[MAXDIM];
  size_t n;
  double *v;
  unsigned char *bytes;
} arr;

arr arr_new(tdt dt, int ndim, const size_t *shape); /* zeros */
void arr_free(arr *a);

/* Values exact in every dtype, from one seeded stream: k/64 (|k| <= 255), or
 * for a gain 1 + k/128 (|k| <= 32), or for an offset gain k/128. */
enum { FILL_DATA, FILL_GAIN, FILL_OFFSET_GAIN };
void arr_fill(arr *a, int kind);

/* numpy's own header (format `version`.0) for descr and shape; @return its length */
size_t npy_header_here(unsigned char *out, int version, const char *descr, int ndim,
                       const size_t *shape);
void write_npy_version(const char *path, int version, const arr *a);
void write_npy(const char *path, const arr *a); /* format 1.0, as numpy writes it */
/* A new array of dt and shape, filled as arr_fill(kind) and written to path:
 * kept (the caller frees it), or freed at once. */
arr npy_fixture(const char *path, tdt dt, int ndim, const size_t *shape, int kind);
void write_filled(const char *path, tdt dt, int ndim, const size_t *shape, int kind);
/* A .npy file of any header text: magic, format `version`.0, dict padded
 * with spaces and '\n' so that the data starts at byte data_at (0: as numpy
 * pads, at the next multiple of 64), then nb bytes of data (NULL: zeros). */
void write_npy_raw(const char *path, int version, const char *dict, size_t data_at,
                   const void *data, size_t nb);
/* big.npy: (256, 1024) float32, 1 MiB, more than a pipe holds */
void write_big(void);

/* Reads an output: its header must be numpy's for dt and shape (format 1.0)
 * and the data exactly as long as the shape says (a check). @return whether
 * *out was made (the caller frees it). */
int read_npy(const char *path, tdt dt, int ndim, const size_t *shape, arr *out);

/* ---- files --------------------------------------------------------------------- */

void write_bytes(const char *path, const void *a, size_t na, const void *b, size_t nb);
unsigned char *slurp(const char *path, size_t *n); /* the whole file (caller frees) or NULL */
int file_exists(const char *path);
int same_file(const char *a, const char *b); /* the same bytes */
void write_old(const char *path);            /* "OLD CONTENT": a file that must survive */
int old_content(const char *path);          /* still exactly "OLD CONTENT" */
void listing(char *out, size_t cap);         /* the work folder's names, sorted, one string */

/* ---- running the command ---------------------------------------------------------- */

#define CLI_TEXT_MAX (1 << 16)
/* the last finished command's standard output and error */
extern char out_text[CLI_TEXT_MAX], err_text[CLI_TEXT_MAX];

typedef struct run_opts {
  const char *stdin_file;  /* fed through a pipe (not a regular file) by a feeder process */
  int stdin_zeros;         /* then endless zero bytes, until the command closes the pipe */
  const char *stdout_path; /* instead of the capture file */
  int stdout_pipe;         /* stdout is a pipe whose reader takes stdout_read bytes and */
  long stdout_read;        /* goes away (0: it is gone before the command starts) */
  long fsize_limit;        /* RLIMIT_FSIZE in bytes (`ulimit -f`), 0 for none */
  const char *isa_env;     /* RMSNORM_ISA for the child */
  int ignore_signal;       /* a signal the command starts with ignored (nohup), 0 for none */
  int timeout_s;           /* killed after this long: a hang guard (default 300) */
  long mem_limit_mb;       /* a cap on its memory, so that a regression that reads an
                              endless device cannot exhaust the machine's; 0: none */
} run_opts;

/* A command started by spawn and not yet finished. */
typedef struct proc {
  pid_t pid, feeder, reader;
  const run_opts *o;
  const char *name;
} proc;

/* Starts `rmsnorm ARGS...` (args NULL-terminated) as a shell would; o may be NULL. */
proc spawn(const run_opts *o, const char *const *args);
/* Waits for it (killed after the hang guard's time); @return the exit code,
 * 128 + signal if killed; its output in out_text and err_text. */
int finish(proc *p);
int run_with(const run_opts *o, const char *const *args); /* spawn + finish */

#define RUN(...) run_with(NULL, (const char *const[]){__VA_ARGS__, NULL})
#define RUN_WITH(opts, ...) run_with(opts, (const char *const[]){__VA_ARGS__, NULL})

/* A process that writes the file at path (then zeros forever, if zeros)
 * into fd, or into the FIFO `fifo` when fd < 0; it ends when done or when
 * the reader goes away. */
pid_t start_feeder(int fd, const char *fifo, const char *path, int zeros);
/* In a helper process: closes every descriptor but 0-2 and keep. */
void close_others(int keep);

/* ---- the float64 oracle -------------------------------------------------------------- */

typedef long double ld;

typedef struct oracle_cfg {
  int layernorm;
  ld eps;
  int eps_outside, offset;
  double partial;
} oracle_cfg;

/* RMSNorm (or LayerNorm) forward by the textbook formulas: y, and per row the
 * mean (0 for RMSNorm) and rstd. */
void oracle_forward(const oracle_cfg *c, size_t rows, size_t d, const double *x, const double *w,
                    const double *b, ld *y, ld *mean, ld *rstd);
/* The gradients dx, dweight and dbias, term by term. */
void oracle_backward(const oracle_cfg *c, size_t rows, size_t d, const double *x,
                     const double *dy, const double *w, ld *dx, ld *dw, ld *db);

/* A check: got within tol times the largest |want| of the array. */
int close_all(const char *what, const arr *got, const ld *want, size_t n, double tol);
double tol_of(tdt dt); /* tolerance against the oracle for results stored in dt */

/* ---- a case's norm options ----------------------------------------------------------- */

/* The options a norm command shares (each left at its default when unset). */
typedef struct norm_opts {
  int dims;       /* 0: the default (1) */
  double eps;     /* < 0: the default */
  int eps_outside, offset;
  double partial; /* 0: the default (1) */
} norm_opts;
typedef struct norm_opts_text { char eps[64], partial[64], dims[16]; } norm_opts_text;

/* Appends the options' arguments (and --bf16 for bf16 data) to args[0..n),
 * their texts kept in t; args ends with NULL. @return the count. */
int norm_opts_args(const norm_opts *o, tdt dt, const char **args, int n, norm_opts_text *t);
/* The library's config for the same options, data in dt, parameters in pdt. */
void norm_opts_config(const norm_opts *o, tdt dt, tdt pdt, rmsnorm_config *cfg);
/* The oracle's config for the same options (eps's default: the library's). */
oracle_cfg norm_opts_oracle(const norm_opts *o, tdt dt, int layernorm);

/* Runs the command and checks that it succeeded silently (exit 0, nothing on
 * stdout or stderr). @return whether it did. */
int run_ok(const char *label, const char *const *args);

/* ---- a test program's frame ----------------------------------------------------------- */

/* Checks the arguments (RMSNORM_BINARY SCRATCH_PARENT_DIR), makes a scratch
 * folder under the parent and enters its work folder. */
void cli_begin(int argc, char **argv);

/* check.h's counters belong to each file: the fixture's checks (hang guard,
 * sanitizer reports, read-backs, comparisons) are added to the test's own. */
void cli_add_counts(long checks, long failures);
int cli_finish(const char *name);

/* Leaves the scratch folder (removed when every check passed, else kept and
 * named) and prints the summary; @return the exit status. */
static inline int cli_end(const char *name) {
  cli_add_counts(tu_checks, tu_failures);
  return cli_finish(name);
}

#endif
