/* cli_fixture.c - the shared part of the rmsnorm command's tests: dtypes,
 * .npy files, running the command as a process, the oracle (cli_fixture.h). */
#include "cli_fixture.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

void die(const char *what) {
  fprintf(stderr, "test_cli: %s: %s\n", what, strerror(errno));
  exit(2);
}

/* ---- dtypes and conversions (written here, independent of the library) -- */

const char *const tdt_name[4] = {"f32", "f16", "bf16", "f64"};
const char *const tdt_descr[4] = {"<f4", "<f2", "<u2", "<f8"};
const size_t tdt_size[4] = {4, 2, 2, 8};
const rmsnorm_dtype tdt_lib[4] = {RMSNORM_F32, RMSNORM_F16, RMSNORM_BF16, RMSNORM_F64};

static double half_to_double(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
  return h & 0x8000 ? -v : v;
}

/* Round to nearest even, straight from double. */
static uint16_t double_to_half(double v) {
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  if (isnan(v)) return sign | 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;
  if (a < ldexp(1, -14)) return sign | (uint16_t)rint(ldexp(a, 24)); /* 1024 is 2^-14: right too */
  int e;
  frexp(a, &e); /* a = f * 2^e, f in [0.5, 1): the unit bit is 2^(e-1) */
  double m = rint(ldexp(a, 11 - e)); /* 1024 .. 2048 */
  if (m == 2048) m = 1024, e++;
  if (e - 1 > 15) return sign | 0x7c00;
  return sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)(m - 1024);
}

static double bf16_to_double(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t double_to_bf16(double v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

double load(tdt dt, const void *p, size_t i) {
  const unsigned char *b = (const unsigned char *)p + i * tdt_size[dt];
  uint16_t h;
  float f;
  double d;
  switch (dt) {
    case TF32: memcpy(&f, b, 4); return f;
    case TF64: memcpy(&d, b, 8); return d;
    case TF16: memcpy(&h, b, 2); return half_to_double(h);
    case TBF16: memcpy(&h, b, 2); return bf16_to_double(h);
  }
  return NAN;
}

void store(tdt dt, void *p, size_t i, double v) {
  unsigned char *b = (unsigned char *)p + i * tdt_size[dt];
  uint16_t h;
  float f;
  switch (dt) {
    case TF32: f = (float)v; memcpy(b, &f, 4); break;
    case TF64: memcpy(b, &v, 8); break;
    case TF16: h = double_to_half(v); memcpy(b, &h, 2); break;
    case TBF16: h = double_to_bf16(v); memcpy(b, &h, 2); break;
  }
}

/* ---- arrays and .npy files ---------------------------------------------- */

static uint64_t rng_state = 12345;
static uint64_t rng(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* an integer in [-k, k] */
static int rand_int(int k) { return (int)(rng() % (uint64_t)(2 * k + 1)) - k; }

arr arr_new(tdt dt, int ndim, const size_t *shape) {
  arr a = {dt, ndim, {0}, 1, NULL, NULL};
  for (int i = 0; i < ndim; i++) a.n *= a.shape[i] = shape[i];
  a.v = calloc(a.n + 1, sizeof(double));
  a.bytes = calloc(a.n + 1, tdt_size[dt]);
  if (!a.v || !a.bytes) die("calloc");
  return a;
}

void arr_free(arr *a) {
  free(a->v);
  free(a->bytes);
  a->v = NULL;
  a->bytes = NULL;
}

/* k/64 with |k| <= 255 has 8 significant bits: exact in every dtype */
void arr_fill(arr *a, int kind) {
  for (size_t i = 0; i < a->n; i++) {
    double v = kind == FILL_DATA ? rand_int(255) / 64.0
               : kind == FILL_GAIN ? 1 + rand_int(32) / 128.0
                                   : rand_int(32) / 128.0;
    a->v[i] = v;
    store(a->dt, a->bytes, i, v);
  }
}

/* numpy's header, built here by the spec: the dict, 21 - len(str(shape[0]))
 * spaces, padding so that the data starts at a multiple of 64 (a whole 64
 * more when it already would), '\n'. */
size_t npy_header_here(unsigned char *out, int version, const char *descr, int ndim,
                       const size_t *shape) {
  char dict[2048];
  int len = sprintf(dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (int i = 0; i < ndim; i++) len += sprintf(dict + len, i ? ", %zu" : "%zu", shape[i]);
  len += sprintf(dict + len, "%s), }", ndim == 1 ? "," : "");
  if (ndim > 0) {
    char first[32];
    int digits = sprintf(first, "%zu", shape[0]);
    for (int i = digits; i < 21; i++) dict[len++] = ' ';
  }
  size_t pre = version == 1 ? 10 : 12, body = (size_t)len + 1;
  size_t total = ((pre + body) / 64 + 1) * 64;
  memcpy(out, "\x93NUMPY", 6);
  out[6] = (unsigned char)version;
  out[7] = 0;
  for (size_t i = 0; i < pre - 8; i++) out[8 + i] = (unsigned char)((total - pre) >> (8 * i));
  memcpy(out + pre, dict, (size_t)len);
  memset(out + pre + len, ' ', total - pre - (size_t)len - 1);
  out[total - 1] = '\n';
  return total;
}

void write_bytes(const char *path, const void *a, size_t na, const void *b, size_t nb) {
  FILE *f = fopen(path, "wb");
  if (!f) die(path);
  if ((na && fwrite(a, 1, na, f) != na) || (nb && fwrite(b, 1, nb, f) != nb) || fclose(f) != 0)
    die(path);
}

void write_npy_version(const char *path, int version, const arr *a) {
  unsigned char hdr[4096];
  size_t h = npy_header_here(hdr, version, tdt_descr[a->dt], a->ndim, a->shape);
  write_bytes(path, hdr, h, a->bytes, a->n * tdt_size[a->dt]);
}
void write_npy(const char *path, const arr *a) { write_npy_version(path, 1, a); }

arr npy_fixture(const char *path, tdt dt, int ndim, const size_t *shape, int kind) {
  arr a = arr_new(dt, ndim, shape);
  arr_fill(&a, kind);
  write_npy(path, &a);
  return a;
}

void write_filled(const char *path, tdt dt, int ndim, const size_t *shape, int kind) {
  arr a = npy_fixture(path, dt, ndim, shape, kind);
  arr_free(&a);
}

void write_npy_raw(const char *path, int version, const char *dict, size_t data_at,
                   const void *data, size_t nb) {
  size_t pre = version == 1 ? 10 : 12, n = strlen(dict);
  if (!data_at) data_at = ((pre + n + 1) / 64 + 1) * 64;
  if (data_at < pre + n + 1) die("write_npy_raw: data offset inside the header");
  unsigned char *buf = calloc(data_at + nb + 1, 1);
  if (!buf) die("calloc");
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (unsigned char)version;
  for (size_t i = 0; i < pre - 8; i++) buf[8 + i] = (unsigned char)((data_at - pre) >> (8 * i));
  memcpy(buf + pre, dict, n);
  memset(buf + pre + n, ' ', data_at - pre - n - 1);
  buf[data_at - 1] = '\n';
  if (data && nb) memcpy(buf + data_at, data, nb);
  write_bytes(path, buf, data_at + nb, NULL, 0);
  free(buf);
}

void write_big(void) {
  static const size_t shape[2] = {256, 1024};
  write_filled("big.npy", TF32, 2, shape, FILL_DATA);
}

/* Reads a whole file. @return its bytes (caller frees) or NULL. */
unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, len = 0;
  unsigned char *buf = malloc(cap);
  while (buf) {
    len += fread(buf + len, 1, cap - len, f);
    if (len < cap) break;
    unsigned char *g = realloc(buf, cap *= 2);
    if (!g) free(buf);
    buf = g;
  }
  fclose(f);
  *n = len;
  return buf;
}

/* Reads an output: its header must be numpy's own for this dtype and shape
 * (format 1.0), and the data exactly as long as the shape says. */
int read_npy(const char *path, tdt dt, int ndim, const size_t *shape, arr *out) {
  size_t n;
  unsigned char *file = slurp(path, &n);
  if (!tu_check(file != NULL, "%s: not written", path)) return 0;
  unsigned char hdr[4096];
  size_t h = npy_header_here(hdr, 1, tdt_descr[dt], ndim, shape);
  *out = arr_new(dt, ndim, shape);
  int ok = tu_check(n == h + out->n * tdt_size[dt] && memcmp(file, hdr, h) == 0,
                    "%s: header or size differs from numpy's for %s shape ndim %d", path,
                    tdt_descr[dt], ndim);
  if (ok) {
    memcpy(out->bytes, file + h, out->n * tdt_size[dt]);
    for (size_t i = 0; i < out->n; i++) out->v[i] = load(dt, out->bytes, i);
  }
  free(file);
  return ok;
}

int file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

int same_file(const char *a, const char *b) {
  size_t na, nb;
  unsigned char *fa = slurp(a, &na), *fb = slurp(b, &nb);
  int same = fa && fb && na == nb && !memcmp(fa, fb, na);
  free(fa);
  free(fb);
  return same;
}

void write_old(const char *path) { write_bytes(path, "OLD CONTENT", 11, NULL, 0); }

int old_content(const char *path) {
  size_t n;
  unsigned char *old = slurp(path, &n);
  int same = old && n == 11 && !memcmp(old, "OLD CONTENT", 11);
  free(old);
  return same;
}

static int compare_names(const void *a, const void *b) { return strcmp(a, b); }

void listing(char *out, size_t cap) {
  char names[64][256];
  int n = 0;
  DIR *dir = opendir(".");
  struct dirent *e;
  while (dir && (e = readdir(dir)) != NULL && n < 64)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      snprintf(names[n++], sizeof names[0], "%s", e->d_name);
  if (dir) closedir(dir);
  qsort(names, (size_t)n, sizeof names[0], compare_names);
  out[0] = '\0';
  for (int i = 0; i < n; i++) {
    strncat(out, names[i], cap - strlen(out) - 2);
    strncat(out, " ", cap - strlen(out) - 1);
  }
}

/* ---- running the command -------------------------------------------------- */

static const char *bin;
static char base[4096];                    /* the scratch folder */
static char cap_out[4200], cap_err[4200]; /* capture files, outside the work folder */
char out_text[CLI_TEXT_MAX], err_text[CLI_TEXT_MAX];

/* Runs bin with argv in this (forked) process. RMSNORM_TEST_EXEC_WRAPPER, when
 * set, is a command put in front of it, its words split at spaces: the
 * aarch64 build's ctest runs the command under qemu-aarch64 that way (a
 * program under user-mode emulation cannot exec another aarch64 program
 * without binfmt_misc; it can exec the host's emulator). */
static void exec_command(char **argv) {
  const char *wrap = getenv("RMSNORM_TEST_EXEC_WRAPPER");
  if (!wrap || !*wrap) {
    execv(bin, argv);
    return;
  }
  static char words[1024];
  char *all[64];
  int n = 0;
  snprintf(words, sizeof words, "%s", wrap);
  for (char *t = strtok(words, " "); t && n < 32; t = strtok(NULL, " ")) all[n++] = t;
  all[n++] = (char *)bin;
  for (int i = 1; argv[i] && n < 63; i++) all[n++] = argv[i];
  all[n] = NULL;
  execv(all[0], all);
}

static void read_capture(const char *path, char *text, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(text, 1, cap - 1, f) : 0;
  text[n] = '\0';
  if (f) fclose(f);
}

/* Writes all of buf to fd; @return 0, or -1 when the reader is gone. */
static int put_all(int fd, const void *buf, size_t n) {
  const unsigned char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* In a helper process: closes every descriptor but 0-2 and keep, so that
 * the pipes it does not use see their ends go away (EOF, EPIPE). */
void close_others(int keep) {
  for (int fd = 3; fd < 1024; fd++)
    if (fd != keep) close(fd);
}

/* A process that writes the file at path (and then zeros forever, if
 * zeros) into fd, or into the FIFO `fifo` when fd < 0, and exits when done
 * or when the reader goes away. */
pid_t start_feeder(int fd, const char *fifo, const char *path, int zeros) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid > 0) return pid;
  close_others(fd);
  signal(SIGPIPE, SIG_IGN);
  if (fd < 0 && (fd = open(fifo, O_WRONLY)) < 0) _exit(1);
  size_t n = 0;
  unsigned char *data = path ? slurp(path, &n) : NULL;
  if (data && put_all(fd, data, n) == 0 && zeros) {
    static const unsigned char block[65536];
    while (put_all(fd, block, sizeof block) == 0) {
    }
  }
  _exit(0);
}

/* A process that reads `bytes` bytes from fd and exits (`head -c`). */
static pid_t start_reader(int fd, long bytes) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid > 0) return pid;
  close_others(fd);
  char buf[4096];
  while (bytes > 0) {
    ssize_t r = read(fd, buf, bytes < (long)sizeof buf ? (size_t)bytes : sizeof buf);
    if (r <= 0) break;
    bytes -= r;
  }
  _exit(0);
}

/* Starts `rmsnorm ARGS...` as a shell would (signals at their defaults
 * unless o says otherwise, nothing blocked, no core files). */
proc spawn(const run_opts *o, const char *const *args) {
  static const run_opts none;
  if (!o) o = &none;
  proc p = {-1, -1, -1, o, args[0] ? args[0] : ""};
  char *argv[64];
  int argc = 0;
  argv[argc++] = (char *)bin;
  for (int i = 0; args[i] && argc < 63; i++) argv[argc++] = (char *)args[i];
  argv[argc] = NULL;
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if (o->stdin_file && pipe(in) != 0) die("pipe");
  if (o->stdout_pipe && pipe(out) != 0) die("pipe");
  if (o->stdin_file) p.feeder = start_feeder(in[1], NULL, o->stdin_file, o->stdin_zeros);
  if (o->stdout_pipe && o->stdout_read > 0) p.reader = start_reader(out[0], o->stdout_read);
  if (out[0] >= 0) close(out[0]); /* the only reader now is the reader process, if any */
  fflush(NULL);
  /* signals held across fork: the child must not run this harness's
   * handlers before it has reset them */
  sigset_t all, old_mask;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &old_mask);
  p.pid = fork();
  if (p.pid < 0) die("fork");
  if (p.pid == 0) {
    int fo = o->stdout_pipe ? out[1]
                            : open(o->stdout_path ? o->stdout_path : cap_out,
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fe = open(cap_err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fi = o->stdin_file ? in[0] : open("/dev/null", O_RDONLY);
    if (fo < 0 || fe < 0 || fi < 0) _exit(126);
    dup2(fo, 1);
    dup2(fe, 2);
    dup2(fi, 0);
    if (in[1] >= 0) close(in[1]);
    for (int sig = 1; sig < 32; sig++)
      if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
    if (o->ignore_signal) signal(o->ignore_signal, SIG_IGN);
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    struct rlimit core = {0, 0};
    setrlimit(RLIMIT_CORE, &core);
    if (o->fsize_limit) {
      struct rlimit rl = {(rlim_t)o->fsize_limit, (rlim_t)o->fsize_limit};
      setrlimit(RLIMIT_FSIZE, &rl);
    }
    if (o->isa_env) setenv("RMSNORM_ISA", o->isa_env, 1);
    if (o->mem_limit_mb) {
#ifdef UNDER_ASAN /* its shadow memory needs a vast address space: cap the RSS instead */
      char opts[512];
      const char *old = getenv("ASAN_OPTIONS");
      snprintf(opts, sizeof opts, "%s%srss_limit_mb=%ld", old ? old : "", old ? ":" : "",
               o->mem_limit_mb);
      setenv("ASAN_OPTIONS", opts, 1);
#else
      struct rlimit as = {(rlim_t)o->mem_limit_mb << 20, (rlim_t)o->mem_limit_mb << 20};
      setrlimit(RLIMIT_AS, &as);
#endif
    }
    exec_command(argv);
    _exit(127);
  }
  sigprocmask(SIG_SETMASK, &old_mask, NULL);
  if (in[0] >= 0) close(in[0]), close(in[1]);
  if (out[1] >= 0) close(out[1]);
  return p;
}

static volatile sig_atomic_t alarm_rang;
static void on_alarm(int sig) {
  (void)sig;
  alarm_rang = 1;
}

/* Waits for a spawned command (killing it after the hang guard's time).
 * @return the exit code (128 + signal if killed); stdout and stderr in
 * out_text and err_text. */
int finish(proc *p) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm; /* no SA_RESTART: waitpid returns EINTR */
  sigaction(SIGALRM, &sa, NULL);
  alarm_rang = 0;
  alarm((unsigned)(p->o->timeout_s ? p->o->timeout_s : 300));
  int status, hung = 0;
  while (waitpid(p->pid, &status, 0) < 0) {
    if (errno != EINTR) die("waitpid");
    if (alarm_rang && !hung) {
      hung = 1;
      kill(p->pid, SIGKILL);
    }
  }
  alarm(0);
  /* the helpers end once the command has: its pipes have no other end */
  if (p->feeder > 0) waitpid(p->feeder, NULL, 0);
  if (p->reader > 0) waitpid(p->reader, NULL, 0);
  read_capture(p->o->stdout_path || p->o->stdout_pipe ? "/dev/null" : cap_out, out_text,
               sizeof out_text);
  read_capture(cap_err, err_text, sizeof err_text);
  tu_check(!hung, "'%s' did not finish within %d s (killed): %s", p->name,
        p->o->timeout_s ? p->o->timeout_s : 300, err_text);
  /* a sanitizer report is a failure whatever the exit code */
  tu_check(!strstr(err_text, "Sanitizer") && !strstr(err_text, "runtime error"),
        "sanitizer report running %s: %s", p->name, err_text);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Runs `rmsnorm ARGS...` to the end. */
int run_with(const run_opts *o, const char *const *args) {
  proc p = spawn(o, args);
  return finish(&p);
}

/* ---- the float64 oracle ---------------------------------------------------- */

/* pRMSNorm's k = ceil(p*d), the product in double as the contract says. */
static size_t partial_k(double p, size_t d) {
  if (p >= 1) return d;
  double kd = ceil(p * (double)d);
  size_t k = kd < 1 ? 1 : (size_t)kd;
  return k > d ? d : k;
}

/* One row's statistics: mean (0 for RMSNorm), r, and for eps-outside the
 * RMS rho itself. */
static void oracle_stats(const oracle_cfg *c, const double *x, size_t d, ld *mean, ld *r, ld *rho) {
  ld s = 0;
  *mean = 0;
  if (c->layernorm) {
    for (size_t j = 0; j < d; j++) s += x[j];
    *mean = s / d;
    ld v = 0;
    for (size_t j = 0; j < d; j++) v += (x[j] - *mean) * (x[j] - *mean);
    ld den = sqrtl(v / d + c->eps);
    *r = den > 0 ? 1 / den : 0;
    *rho = 0;
    return;
  }
  size_t k = partial_k(c->partial, d);
  for (size_t j = 0; j < k; j++) s += (ld)x[j] * x[j];
  *rho = sqrtl(s / k);
  ld den = c->eps_outside ? *rho + c->eps : sqrtl(s / k + c->eps);
  *r = den > 0 ? 1 / den : 0;
}

static ld gain(const oracle_cfg *c, const double *w, size_t j) {
  return w ? (c->offset ? 1 + (ld)w[j] : w[j]) : 1;
}

void oracle_forward(const oracle_cfg *c, size_t rows, size_t d, const double *x,
                           const double *w, const double *b, ld *y, ld *mean, ld *rstd) {
  for (size_t i = 0; i < rows; i++) {
    ld m, r, rho;
    oracle_stats(c, x + i * d, d, &m, &r, &rho);
    for (size_t j = 0; j < d; j++)
      y[i * d + j] = (x[i * d + j] - m) * r * gain(c, w, j) + (b ? b[j] : 0);
    mean[i] = m;
    rstd[i] = r;
  }
}

/* The gradients, unnormalized and term by term:
 *   RMSNorm  y_j = x_j r w_j + b_j, r depending on x_0..x_{k-1}:
 *     dx_j = r w_j dy_j + [j < k] (sum_i dy_i w_i x_i) dr/dx_j
 *     dr/dx_j = -r^3 x_j / k            (r = (ms + eps)^-1/2)
 *             = -r^2 x_j / (k rho)      (r = (rho + eps)^-1, rho = sqrt(ms))
 *   LayerNorm xhat = (x - mean) r:
 *     dx_j = r (g_j - mean(g) - xhat_j mean(g xhat)),  g = dy w
 *   dweight_j = sum over rows of dy_j * xhat_j (xhat = x r for RMSNorm),
 *   dbias_j = sum over rows of dy_j. */
void oracle_backward(const oracle_cfg *c, size_t rows, size_t d, const double *x,
                            const double *dy, const double *w, ld *dx, ld *dw, ld *db) {
  for (size_t j = 0; j < d; j++) dw[j] = db[j] = 0;
  for (size_t i = 0; i < rows; i++) {
    const double *xr = x + i * d, *gr = dy + i * d;
    ld m, r, rho;
    oracle_stats(c, xr, d, &m, &r, &rho);
    ld s_gx = 0, s_g = 0, s_gh = 0;
    for (size_t j = 0; j < d; j++) {
      ld g = gr[j] * gain(c, w, j);
      s_gx += g * xr[j];
      s_g += g;
      s_gh += g * (xr[j] - m) * r;
    }
    size_t k = c->layernorm ? d : partial_k(c->partial, d);
    for (size_t j = 0; j < d; j++) {
      ld g = gr[j] * gain(c, w, j);
      if (c->layernorm) {
        dx[i * d + j] = r * (g - s_g / d - (xr[j] - m) * r * s_gh / d);
      } else {
        ld drdx = 0;
        if (j < k)
          drdx = c->eps_outside ? (rho > 0 ? -r * r * xr[j] / (k * rho) : 0)
                                : -r * r * r * xr[j] / k;
        dx[i * d + j] = r * g + s_gx * drdx;
      }
      dw[j] += gr[j] * (xr[j] - m) * r;
      db[j] += gr[j];
    }
  }
}

/* got is close to want: within tol times the largest |want| of the array
 * (the scale the rounding errors of sums are relative to). */
int close_all(const char *what, const arr *got, const ld *want, size_t n, double tol) {
  ld scale = 0;
  for (size_t i = 0; i < n; i++) scale = fmaxl(scale, fabsl(want[i]));
  if (scale == 0) scale = 1;
  for (size_t i = 0; i < n; i++) {
    if (!(fabsl(got->v[i] - want[i]) <= tol * scale))
      return tu_check(0, "%s[%zu]: got %.9g, oracle %.9Lg (tol %g x %Lg)", what, i, got->v[i],
                   want[i], tol, scale);
  }
  return tu_check(1, "");
}

double tol_of(tdt dt) {
  return dt == TF64 ? 1e-12 : dt == TF32 ? 1e-5 : dt == TF16 ? 2e-3 : 1.6e-2;
}

/* ---- a test program's frame ---------------------------------------------------- */

static void remove_tree(const char *path) {
  DIR *dir = opendir(path);
  if (dir) {
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char sub[4200];
      snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
      struct stat st;
      if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode))
        remove_tree(sub);
      else
        unlink(sub);
    }
    closedir(dir);
  }
  rmdir(path);
}

void cli_begin(int argc, char **argv) {
  if (argc != 3 || argv[1][0] != '/') {
    fprintf(stderr, "usage: %s /ABSOLUTE/PATH/TO/rmsnorm SCRATCH_PARENT_DIR\n", argv[0]);
    exit(2);
  }
  bin = argv[1];
  snprintf(base, sizeof base, "%s/cli-test-XXXXXX", argv[2]);
  if (!mkdtemp(base)) die("mkdtemp");
  snprintf(cap_out, sizeof cap_out, "%s/stdout", base);
  snprintf(cap_err, sizeof cap_err, "%s/stderr", base);
  char work[4200];
  snprintf(work, sizeof work, "%s/work", base);
  /* the harness writes into pipes whose readers may be gone; commands
   * start with SIGPIPE at its default all the same (spawn resets it) */
  signal(SIGPIPE, SIG_IGN);
  if (mkdir(work, 0755) != 0 || chdir(work) != 0) die(work);
}

void cli_add_counts(long checks, long failures) {
  tu_checks += checks;
  tu_failures += failures;
}

int cli_finish(const char *name) {
  if (chdir("/") != 0) die("chdir");
  if (tu_failures == 0)
    remove_tree(base);
  else
    fprintf(stderr, "scratch files kept in %s\n", base);
  return tu_summary(name);
}

/* ---- a case's norm options ------------------------------------------------------------ */

int norm_opts_args(const norm_opts *o, tdt dt, const char **args, int n, norm_opts_text *t) {
  if (o->eps >= 0) {
    snprintf(t->eps, sizeof t->eps, "%.17g", o->eps);
    args[n++] = "--eps";
    args[n++] = t->eps;
  }
  if (o->eps_outside) args[n++] = "--eps-outside";
  if (o->offset) args[n++] = "--offset";
  if (o->partial > 0) {
    snprintf(t->partial, sizeof t->partial, "--partial=%.17g", o->partial);
    args[n++] = t->partial;
  }
  if (o->dims) {
    snprintf(t->dims, sizeof t->dims, "%d", o->dims);
    args[n++] = "--dims";
    args[n++] = t->dims;
  }
  if (dt == TBF16) args[n++] = "--bf16";
  args[n] = NULL;
  return n;
}

void norm_opts_config(const norm_opts *o, tdt dt, tdt pdt, rmsnorm_config *cfg) {
  rmsnorm_config_init(cfg, tdt_lib[dt]);
  cfg->param_dtype = tdt_lib[pdt];
  if (o->eps >= 0) cfg->eps = o->eps;
  if (o->partial > 0) cfg->partial = o->partial;
  cfg->flags = (o->eps_outside ? RMSNORM_FLAG_EPS_OUTSIDE : 0u) |
               (o->offset ? RMSNORM_FLAG_WEIGHT_OFFSET : 0u);
}

oracle_cfg norm_opts_oracle(const norm_opts *o, tdt dt, int layernorm) {
  oracle_cfg oc = {layernorm, o->eps >= 0 ? (ld)o->eps : (dt == TF64 ? 0x1p-52L : 0x1p-23L),
                   o->eps_outside, o->offset, o->partial > 0 ? o->partial : 1};
  return oc;
}

int run_ok(const char *label, const char *const *args) {
  int rc = run_with(NULL, args);
  return tu_check(rc == 0 && err_text[0] == '\0' && out_text[0] == '\0', "%s: exit %d: %s", label,
                  rc, err_text);
}
