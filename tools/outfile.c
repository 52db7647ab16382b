/* outfile.c - outputs written to temporaries beside their targets and
 * renamed into place together, or not at all (see outfile.h). */
#define _XOPEN_SOURCE 700 /* POSIX.1-2008 with XSI: realpath */
#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OUT_PATH_MAX 4096

/* Fixed-size storage, so that the signal handler reads nothing that is
 * being allocated or freed. */
typedef struct out_entry {
  const char *path;               /* as given, for messages */
  char target[OUT_PATH_MAX];      /* what the temporary is renamed onto */
  char tmp[OUT_PATH_MAX + 16];
  dev_t dir_dev;                  /* the target's folder, to see two names */
  ino_t dir_ino;                  /* for one file */
  int fd;
  int direct;                     /* a device or pipe, written at commit */
  unsigned char header[NPY_HEADER_MAX];
  size_t header_len;
  const void *data;
  size_t bytes;
  volatile sig_atomic_t live;     /* tmp exists and is ours to remove */
} out_entry;

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

/* Removes the temporaries, then dies of the signal as if unhandled. */
static void on_signal(int sig) {
  for (int i = 0; i < the_set.n && i < OUT_MAX; i++)
    if (the_set.e[i].live) unlink(the_set.e[i].tmp);
  signal(sig, SIG_DFL);
  raise(sig);
}

out_set *out_begin(void) {
  static int installed;
  if (!installed) {
    mode_t mask = umask(0);
    umask(mask);
    new_file_mode = 0666 & ~mask;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
    installed = 1;
  }
  out_abort(&the_set);
  the_set.n = 0;
  return &the_set;
}

/* A device or pipe: opened now (a failure shows before the work), written
 * at commit. */
static int add_direct(out_set *s, out_entry *e, char *err, size_t errlen) {
  e->fd = open(e->path, O_WRONLY | O_CLOEXEC);
  if (e->fd < 0) return fail(err, errlen, "cannot open for writing: %s", strerror(errno));
  e->direct = 1;
  e->live = 0;
  e->dir_dev = 0;
  e->dir_ino = 0;
  return s->n++;
}

int out_add(out_set *s, const char *path, char *err, size_t errlen) {
  if (s->n >= OUT_MAX) return fail(err, errlen, "too many outputs");
  out_entry *e = &s->e[s->n];
  memset(e, 0, sizeof *e);
  e->path = path;
  e->fd = -1;
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
  int n = snprintf(e->tmp, sizeof e->tmp, "%s/.%s.XXXXXX", dir, base);
  if (n < 0 || (size_t)n >= sizeof e->tmp) return fail(err, errlen, "file name too long");
  e->dir_dev = st.st_dev;
  e->dir_ino = st.st_ino;
  s->n++; /* visible to the signal handler, which skips it until live */
  e->fd = mkstemp(e->tmp);
  if (e->fd < 0) {
    int errnum = errno;
    s->n--;
    return fail(err, errlen, "cannot create a file in %s: %s", dir, strerror(errnum));
  }
  e->live = 1;
  if (fchmod(e->fd, mode) != 0) {
    int errnum = errno;
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
  for (int i = 0; i < s->n; i++) {
    out_entry *e = &s->e[i];
    if (!e->live) continue;
    if (rename(e->tmp, e->target) != 0) {
      int errnum = errno;
      *failed = e->path;
      out_abort(s);
      return fail(err, errlen, "cannot rename into place: %s", strerror(errnum));
    }
    e->live = 0;
  }
  s->n = 0;
  return 0;
}

void out_abort(out_set *s) {
  for (int i = 0; i < s->n; i++) {
    out_entry *e = &s->e[i];
    if (e->fd >= 0) close(e->fd);
    e->fd = -1;
    if (e->live) unlink(e->tmp);
    e->live = 0;
  }
}
