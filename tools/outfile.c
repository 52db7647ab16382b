/* outfile.c - outputs written to temporaries beside their targets and
 * renamed into place together, or not at all; the signal handlers that
 * remove the temporaries when the process is killed (see outfile.h). */
#define _XOPEN_SOURCE 700 /* POSIX.1-2008 with XSI: realpath, SIGPOLL */
#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OUT_PATH_MAX 4096

/* Fixed-size storage, so that the signal handlers read nothing that is
 * being allocated or freed. */
typedef struct out_entry {
  const char *path;               /* as given, for messages */
  char target[OUT_PATH_MAX];      /* what the temporary is renamed onto */
  char tmp[OUT_PATH_MAX + 16];
  dev_t dir_dev;                  /* the target's folder, to see two names */
  ino_t dir_ino;                  /* for one file, and to sync it once */
  int dir_fd;                     /* that folder, flushed after the renames (-1: cannot be) */
  int fd;
  int direct;                     /* a device or pipe, written at commit */
  int renamed;
  unsigned char header[NPY_HEADER_MAX];
  size_t header_len;
  const void *data;
  size_t bytes;
  volatile sig_atomic_t live;     /* tmp exists and is ours to remove */
} out_entry;

/* Entries [0, n) are complete; only the main thread changes them, and only
 * with the caught signals held (hold/release), so a handler on the main
 * thread always sees a consistent set. */
struct out_set {
  out_entry e[OUT_MAX];
  volatile sig_atomic_t n;
};

static out_set the_set;
static mode_t new_file_mode = 0644;

static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

/* ---- signals ------------------------------------------------------------ */

/* Signals whose default ends the process, delivered from outside (or by a
 * timer): handled on the main thread. SIGPIPE and SIGXFSZ are ignored
 * instead (their write fails and is reported). */
static const int async_signals[] = {
  SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGALRM, SIGUSR1, SIGUSR2, SIGPROF, SIGVTALRM, SIGXCPU,
#ifdef SIGPOLL
  SIGPOLL,
#endif
#ifdef SIGSTKFLT
  SIGSTKFLT,
#endif
#ifdef SIGPWR
  SIGPWR,
#endif
};
/* Signals a thread brings on itself (a fault, abort()): handled where they
 * happen, then passed to the handler that was installed before ours. */
static const int fault_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
#define N_FAULT (sizeof fault_signals / sizeof fault_signals[0])

static sigset_t handled;      /* the asynchronous signals we handle */
static sigset_t held;         /* those and the fault signals: held during changes */
static pthread_t main_thread;
static struct sigaction fault_previous[N_FAULT];

/* Removes the temporaries; async-signal-safe. */
static void remove_temporaries(void) {
  int n = the_set.n;
  for (int i = 0; i < n && i < OUT_MAX; i++)
    if (the_set.e[i].live) unlink(the_set.e[i].tmp);
}

/* Dies of sig as if it had not been handled. */
static void die_of(int sig) {
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, NULL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, NULL);
  raise(sig);
  _exit(128 + sig); /* not reached: the default action of sig ends the process */
}

static void on_async(int sig) {
  if (!pthread_equal(pthread_self(), main_thread)) {
    /* a worker thread: the main thread may be renaming, and holds the
     * signal until it is done */
    int saved = errno;
    pthread_kill(main_thread, sig);
    errno = saved;
    return;
  }
  remove_temporaries();
  die_of(sig);
}

static void on_fault(int sig, siginfo_t *info, void *context) {
  (void)context;
  if ((info->si_code == SI_USER || info->si_code == SI_QUEUE) &&
      !pthread_equal(pthread_self(), main_thread)) {
    /* sent by another process, not a fault of this thread: to the main
     * thread, as the asynchronous ones */
    int saved = errno;
    pthread_kill(main_thread, sig);
    errno = saved;
    return;
  }
  remove_temporaries();
  for (size_t i = 0; i < N_FAULT; i++)
    if (fault_signals[i] == sig) sigaction(sig, &fault_previous[i], NULL);
  /* a fault returns to the instruction, which faults again under the
   * previous handler; a sent signal (kill, raise, abort) or a trap is sent
   * again, and delivered to it when this handler returns */
  if (info->si_code <= 0 || sig == SIGTRAP) raise(sig);
}

/* Holds the handled signals on this (the main) thread: a signal sent while
 * a temporary is created, renamed or removed waits until that is done (a
 * fault of the main thread itself in there would end the process without
 * its handler; those calls do not fault). */
static void hold(sigset_t *old) { pthread_sigmask(SIG_BLOCK, &held, old); }
static void release(const sigset_t *old) { pthread_sigmask(SIG_SETMASK, old, NULL); }

static int ignored(int sig) {
  struct sigaction now;
  return sigaction(sig, NULL, &now) == 0 && !(now.sa_flags & SA_SIGINFO) &&
         now.sa_handler == SIG_IGN;
}

void out_signals_init(void) {
  static int installed;
  if (installed) return;
  installed = 1;
  main_thread = pthread_self();
  mode_t mask = umask(0);
  umask(mask);
  new_file_mode = 0666 & ~mask;

  signal(SIGPIPE, SIG_IGN);
  signal(SIGXFSZ, SIG_IGN);

  /* which to handle: not those the parent left ignored (nohup, `cmd &`) */
  sigemptyset(&handled);
  for (size_t i = 0; i < sizeof async_signals / sizeof async_signals[0]; i++)
    if (!ignored(async_signals[i])) sigaddset(&handled, async_signals[i]);
  for (int sig = SIGRTMIN; sig <= SIGRTMAX; sig++)
    if (!ignored(sig)) sigaddset(&handled, sig);
  held = handled;
  for (size_t i = 0; i < N_FAULT; i++)
    if (!ignored(fault_signals[i])) sigaddset(&held, fault_signals[i]);

  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_async;
  sa.sa_mask = held; /* one handler at a time */
  sa.sa_flags = SA_RESTART;
  for (int sig = 1; sig <= SIGRTMAX; sig++)
    if (sigismember(&handled, sig) == 1) sigaction(sig, &sa, NULL);

  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_mask = held;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  for (size_t i = 0; i < N_FAULT; i++)
    if (sigismember(&held, fault_signals[i]) == 1)
      sigaction(fault_signals[i], &sa, &fault_previous[i]);
}

/* ---- the output set ------------------------------------------------------ */

static void close_entry(out_entry *e) {
  if (e->fd >= 0) close(e->fd);
  e->fd = -1;
  if (e->dir_fd >= 0) close(e->dir_fd);
  e->dir_fd = -1;
}

out_set *out_begin(void) {
  out_signals_init(); /* no-op when main did it */
  out_abort(&the_set);
  return &the_set;
}

/* A device or pipe: opened now (a failure shows before the work), written
 * at commit. */
static int add_direct(out_set *s, out_entry *e, char *err, size_t errlen) {
  e->fd = open(e->path, O_WRONLY | O_CLOEXEC);
  if (e->fd < 0) return fail(err, errlen, "cannot open for writing: %s", strerror(errno));
  e->direct = 1;
  sigset_t old;
  hold(&old);
  s->n++;
  release(&old);
  return s->n - 1;
}

/* The longest name a file in folder dir may have (NAME_MAX: 255 bytes on
 * the usual file systems). */
static size_t folder_name_max(const char *dir) {
  long m = pathconf(dir, _PC_NAME_MAX);
#ifdef NAME_MAX
  if (m <= 0) m = NAME_MAX;
#else
  if (m <= 0) m = 255;
#endif
  return (size_t)m;
}

/* How many bytes of the target's name `base` (len bytes) its temporary
 * ".BASE.XXXXXX" keeps: all of them when that fits in name_max, else as
 * many as fit, cut before a UTF-8 character rather than inside one (file
 * systems that hold names as UTF-8 refuse a broken one). mkstemp makes the
 * name unique either way. */
static size_t temp_keep(const char *base, size_t len, size_t name_max) {
  static const size_t extra = sizeof ".." - 1 + sizeof "XXXXXX" - 1;
  if (len + extra <= name_max) return len;
  size_t keep = name_max > extra ? name_max - extra : 0;
  while (keep > 0 && ((unsigned char)base[keep] & 0xc0) == 0x80) keep--;
  return keep;
}

int out_add(out_set *s, const char *path, char *err, size_t errlen) {
  if (s->n >= OUT_MAX) return fail(err, errlen, "too many outputs");
  out_entry *e = &s->e[s->n]; /* not yet counted: the handlers ignore it */
  memset(e, 0, sizeof *e);
  e->path = path;
  e->fd = -1;
  e->dir_fd = -1;
  size_t len = strlen(path);
  if (len == 0) return fail(err, errlen, "empty file name");
  if (len >= OUT_PATH_MAX) return fail(err, errlen, "file name too long");
  memcpy(e->target, path, len + 1);

  /* what is there now decides how it is replaced */
  struct stat st, lst;
  mode_t mode = new_file_mode;
  if (lstat(path, &lst) == 0) {
    int is_link = S_ISLNK(lst.st_mode);
    if (is_link && stat(path, &st) != 0) {
      /* a dangling link: replaced by the file */
    } else {
      if (!is_link) st = lst;
      if (S_ISDIR(st.st_mode)) return fail(err, errlen, "is a directory");
      if (!S_ISREG(st.st_mode)) return add_direct(s, e, err, errlen);
      mode = st.st_mode & 0777; /* a replaced file keeps its mode */
      if (is_link) {            /* replace the file the link names, keep the link */
        char resolved[PATH_MAX];
        if (!realpath(path, resolved) || strlen(resolved) >= OUT_PATH_MAX)
          return fail(err, errlen, "cannot resolve the link: %s", strerror(errno));
        memcpy(e->target, resolved, strlen(resolved) + 1);
      }
    }
  } else if (path[len - 1] == '/') {
    return fail(err, errlen, "is a directory");
  }

  /* the temporary goes to the target's own folder, so rename is atomic */
  const char *slash = strrchr(e->target, '/');
  const char *base = slash ? slash + 1 : e->target;
  char dir[OUT_PATH_MAX];
  if (!slash) {
    memcpy(dir, ".", 2);
  } else if (slash == e->target) {
    memcpy(dir, "/", 2);
  } else {
    memcpy(dir, e->target, (size_t)(slash - e->target));
    dir[slash - e->target] = '\0';
  }
  if (stat(dir, &st) != 0) return fail(err, errlen, "cannot write: %s", strerror(errno));
  for (int i = 0; i < s->n; i++) {
    const out_entry *o = &s->e[i];
    const char *ob = strrchr(o->target, '/');
    if (!o->direct && o->dir_dev == st.st_dev && o->dir_ino == st.st_ino &&
        !strcmp(ob ? ob + 1 : o->target, base))
      return fail(err, errlen, "is named by two outputs");
  }
  size_t name_max = folder_name_max(dir), keep = strlen(base);
  if (keep > name_max) return fail(err, errlen, "cannot write: %s", strerror(ENAMETOOLONG));
  keep = temp_keep(base, keep, name_max);
  int n = snprintf(e->tmp, sizeof e->tmp, "%s/.%.*s.XXXXXX", dir, (int)keep, base);
  if (n < 0 || (size_t)n >= sizeof e->tmp) return fail(err, errlen, "file name too long");
  e->dir_dev = st.st_dev;
  e->dir_ino = st.st_ino;
  /* for the flush after the rename; a folder that cannot be opened for
   * reading cannot be flushed, and is not an error */
  e->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

  /* created and counted with the signals held: a handler sees the
   * temporary exactly when it exists */
  sigset_t old;
  hold(&old);
  e->fd = mkstemp(e->tmp);
  int errnum = errno;
  if (e->fd >= 0) {
    e->live = 1;
    s->n++;
  }
  release(&old);
  if (e->fd < 0) {
    close_entry(e);
    return fail(err, errlen, "cannot create a file in %s: %s", dir, strerror(errnum));
  }
  if (fchmod(e->fd, mode) != 0) {
    errnum = errno;
    out_abort(s);
    return fail(err, errlen, "cannot set permissions: %s", strerror(errnum));
  }
  return s->n - 1;
}

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    /* at most 1 GiB a call: some systems refuse larger single writes */
    size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
    ssize_t w = write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

int out_write_npy(out_set *s, int i, npy_dtype dt, int ndim, const size_t *shape,
                  const void *data, size_t bytes, char *err, size_t errlen) {
  out_entry *e = &s->e[i];
  e->header_len = npy_header(e->header, sizeof e->header, 0, dt, ndim, shape);
  if (e->header_len == 0) return fail(err, errlen, "cannot encode a .npy header for this shape");
  e->data = data;
  e->bytes = bytes;
  if (e->direct) return 0;
  if (write_all(e->fd, e->header, e->header_len) != 0 || write_all(e->fd, data, bytes) != 0 ||
      fsync(e->fd) != 0)
    return fail(err, errlen, "cannot write: %s", strerror(errno));
  int fd = e->fd;
  e->fd = -1;
  if (close(fd) != 0) return fail(err, errlen, "cannot write: %s", strerror(errno));
  return 0;
}

/* Flushes the folders of the entries in order[0..k) (each once) so that
 * their renames survive a crash. A file system that cannot flush a folder
 * (EINVAL and the like) is not an error. @return 0, or the entry whose
 * folder failed, with its errno in *errnum. */
static int sync_folders(out_set *s, const int *order, int k, int *errnum) {
  for (int a = 0; a < k; a++) {
    const out_entry *e = &s->e[order[a]];
    if (e->direct || e->dir_fd < 0) continue;
    int seen = 0;
    for (int b = 0; b < a && !seen; b++) {
      const out_entry *o = &s->e[order[b]];
      seen = !o->direct && o->dir_dev == e->dir_dev && o->dir_ino == e->dir_ino;
    }
    if (seen) continue;
    if (fsync(e->dir_fd) != 0 && errno != EINVAL && errno != EROFS && errno != EBADF &&
        errno != ENOTSUP && errno != EOPNOTSUPP) {
      *errnum = errno;
      return order[a] + 1;
    }
  }
  return 0;
}

/* "; already replaced: A, B" for the renamed entries, or "". */
static void list_renamed(const out_set *s, char *out, size_t cap) {
  size_t k = 0;
  out[0] = '\0';
  for (int i = 0; i < s->n && k < cap; i++) {
    if (!s->e[i].renamed) continue;
    int w = snprintf(out + k, cap - k, "%s%s", k ? ", " : "; already replaced: ", s->e[i].path);
    if (w < 0) break;
    k += (size_t)w;
  }
}

int out_commit(out_set *s, const char **failed, char *err, size_t errlen) {
  /* streams first: if one fails, no file has been replaced yet */
  for (int i = 0; i < s->n; i++) {
    out_entry *e = &s->e[i];
    if (!e->direct || e->fd < 0) continue;
    int bad = write_all(e->fd, e->header, e->header_len) != 0 ||
              write_all(e->fd, e->data, e->bytes) != 0;
    int errnum = errno;
    if (close(e->fd) != 0 && !bad) bad = 1, errnum = errno;
    e->fd = -1;
    if (bad) {
      *failed = e->path;
      out_abort(s);
      return fail(err, errlen, "cannot write: %s", strerror(errnum));
    }
  }

  /* then the files, the signals held until all are in place: the others
   * first, their folders flushed, then the main output (entry 0) */
  int order[OUT_MAX], k = 0;
  for (int i = 1; i < s->n; i++) order[k++] = i;
  if (s->n > 0) order[k++] = 0;
  static const char unflushed[] = "renamed into place, but its folder cannot be flushed";
  sigset_t old;
  hold(&old);
  int rc = 0, errnum = 0, bad = 0;
  const char *what = "";
  for (int a = 0; a < k && rc == 0; a++) {
    out_entry *e = &s->e[order[a]];
    if (a == k - 1 && k > 1 && (bad = sync_folders(s, order, k - 1, &errnum)) != 0) {
      rc = -1, *failed = s->e[bad - 1].path, what = unflushed;
      break;
    }
    if (!e->live) continue;
    if (rename(e->tmp, e->target) != 0) {
      rc = -1, errnum = errno, *failed = e->path, what = "cannot rename into place";
      break;
    }
    e->live = 0;
    e->renamed = 1;
  }
  if (rc == 0 && k > 0 && (bad = sync_folders(s, order + k - 1, 1, &errnum)) != 0)
    rc = -1, *failed = s->e[bad - 1].path, what = unflushed;
  if (rc != 0) {
    char done[512];
    list_renamed(s, done, sizeof done);
    fail(err, errlen, "%s: %s%s", what, strerror(errnum), done);
  }
  out_abort(s); /* closes everything; removes what was not renamed */
  release(&old);
  return rc;
}

void out_abort(out_set *s) {
  sigset_t old;
  hold(&old);
  for (int i = 0; i < s->n; i++) {
    out_entry *e = &s->e[i];
    close_entry(e);
    if (e->live) unlink(e->tmp);
    e->live = 0;
  }
  s->n = 0;
  release(&old);
}
