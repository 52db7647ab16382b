/* npy.c - .npy header parsing (strict, bounds-checked: it reads untrusted
 * files and is fuzzed), numpy-identical header writing, and input files
 * (mapped read-only, or read from a stream exactly up to the data's end).
 * Format: magic "\x93NUMPY", major and minor version bytes, the header
 * length (2 bytes little-endian in 1.0, 4 in 2.0/3.0), then a Python dict
 * literal {'descr': ..., 'fortran_order': ..., 'shape': (...), } padded with
 * spaces and ended by '\n'; the raw array follows. */
#define _POSIX_C_SOURCE 200809L
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* numpy leaves this many digits of room after the dict, so the first axis
 * can grow in place (numpy.lib.format.GROWTH_AXIS_MAX_DIGITS). */
#define NPY_GROWTH_DIGITS 21
#define NPY_ALIGN 64

static int fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

const char *npy_descr(npy_dtype dt) {
  switch (dt) {
    case NPY_F32: return "<f4";
    case NPY_F16: return "<f2";
    case NPY_F64: return "<f8";
    case NPY_U16: return "<u2";
    case NPY_I8: return "|i1";
    case NPY_U8: return "|u1";
  }
  return "?";
}

size_t npy_dtype_size(npy_dtype dt) {
  switch (dt) {
    case NPY_F64: return 8;
    case NPY_F32: return 4;
    case NPY_F16:
    case NPY_U16: return 2;
    case NPY_I8:
    case NPY_U8: return 1;
  }
  return 1;
}

void npy_format_shape(char *out, size_t cap, int ndim, const size_t *shape) {
  size_t n = 0;
  if (cap == 0) return;
  out[0] = '\0';
  int w = snprintf(out, cap, "(");
  if (w < 0) return;
  n = (size_t)w;
  for (int i = 0; i < ndim && n < cap; i++) {
    w = snprintf(out + n, cap - n, "%s%zu", i ? ", " : "", shape[i]);
    if (w < 0) return;
    n += (size_t)w;
  }
  if (n < cap) {
    w = snprintf(out + n, cap - n, ndim == 1 ? ",)" : ")");
    if (w < 0) return;
    n += (size_t)w;
  }
  if (n >= cap && cap >= 5) memcpy(out + cap - 5, "...)", 5); /* cut, still closed */
}

/* ---- parsing ------------------------------------------------------------ */

/* A cursor over the header text [p, end). */
typedef struct cursor {
  const char *p, *end;
} cursor;

static int is_space(int ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static void skip_space(cursor *c) {
  while (c->p < c->end && is_space((unsigned char)*c->p)) c->p++;
}

/* The next non-space character, or -1 at the end. */
static int peek(cursor *c) {
  skip_space(c);
  return c->p < c->end ? (unsigned char)*c->p : -1;
}

static int accept(cursor *c, char ch) {
  if (peek(c) != (unsigned char)ch) return 0;
  c->p++;
  return 1;
}

/* Copies s (up to n bytes) into out for a message: printable ASCII kept,
 * anything else shown as '?', cut with "..." past 24 characters. */
static void sanitize(char *out, size_t cap, const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n && k + 1 < cap; i++) {
    if (i == 24 && n > 27) {
      for (int j = 0; j < 3 && k + 1 < cap; j++) out[k++] = '.';
      break;
    }
    unsigned char ch = (unsigned char)s[i];
    out[k++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
  }
  out[k] = '\0';
}

/* A Python string literal without escapes, 'text' or "text": sets *s, *n to
 * its contents (inside the header). @return 0, or -1 if there is none. */
static int parse_string(cursor *c, const char **s, size_t *n, char *err, size_t errlen) {
  int q = peek(c);
  if (q != '\'' && q != '"') return fail(err, errlen, "malformed header: expected a quoted string");
  const char *start = ++c->p;
  while (c->p < c->end && *c->p != (char)q) {
    unsigned char ch = (unsigned char)*c->p;
    if (ch == '\\') return fail(err, errlen, "malformed header: escapes in strings are not supported");
    if (ch < 0x20) return fail(err, errlen, "malformed header: control character in a string");
    c->p++;
  }
  if (c->p == c->end) return fail(err, errlen, "malformed header: unterminated string");
  *s = start;
  *n = (size_t)(c->p - start);
  c->p++;
  return 0;
}

static int str_is(const char *s, size_t n, const char *lit) {
  return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

/* A non-negative decimal integer as Python writes it (no leading zeros),
 * optionally with Python 2's 'L' suffix in format 1.0 and 2.0 files, as
 * numpy accepts; at most PTRDIFF_MAX (numpy's npy_intp). */
static int parse_dim(cursor *c, unsigned major, size_t *v, char *err, size_t errlen) {
  int ch = peek(c);
  if (ch == '-') return fail(err, errlen, "negative dimension in 'shape'");
  if (ch < '0' || ch > '9') return fail(err, errlen, "'shape' must be a tuple of integers");
  const char *start = c->p;
  uint64_t acc = 0;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
    unsigned digit = (unsigned)(*c->p - '0');
    if (acc > ((uint64_t)PTRDIFF_MAX - digit) / 10)
      return fail(err, errlen, "dimension in 'shape' is too large");
    acc = acc * 10 + digit;
    c->p++;
  }
  if (*start == '0' && c->p - start > 1)
    return fail(err, errlen, "malformed integer in 'shape' (leading zero)");
  if (major <= 2 && c->p < c->end && (*c->p == 'L' || *c->p == 'l')) c->p++;
  if (c->p < c->end && (((*c->p | 0x20) >= 'a' && (*c->p | 0x20) <= 'z') || *c->p == '_' ||
                        *c->p == '.'))
    return fail(err, errlen, "'shape' must be a tuple of integers");
  *v = (size_t)acc; /* <= PTRDIFF_MAX, so it fits */
  return 0;
}

/* (), (n,), (n, m, ...) with an optional trailing comma; (n) is not a
 * tuple in Python, and numpy rejects it, so do we. */
static int parse_shape(cursor *c, unsigned major, npy_info *info, char *err, size_t errlen) {
  if (!accept(c, '(')) return fail(err, errlen, "'shape' must be a tuple");
  info->ndim = 0;
  if (accept(c, ')')) return 0;
  int commas = 0;
  for (;;) {
    if (info->ndim == NPY_MAX_DIMS)
      return fail(err, errlen, "'shape' has more than %d dimensions", NPY_MAX_DIMS);
    if (parse_dim(c, major, &info->shape[info->ndim], err, errlen)) return -1;
    info->ndim++;
    if (accept(c, ',')) {
      commas++;
      if (accept(c, ')')) return 0;
      continue;
    }
    if (accept(c, ')')) {
      if (commas == 0) return fail(err, errlen, "'shape' must be a tuple (one axis needs a trailing comma)");
      return 0;
    }
    return fail(err, errlen, "malformed 'shape' tuple");
  }
}

static int parse_bool(cursor *c, int *v, char *err, size_t errlen) {
  peek(c);
  size_t left = (size_t)(c->end - c->p);
  if (left >= 4 && memcmp(c->p, "True", 4) == 0) {
    *v = 1;
    c->p += 4;
  } else if (left >= 5 && memcmp(c->p, "False", 5) == 0) {
    *v = 0;
    c->p += 5;
  } else {
    return fail(err, errlen, "'fortran_order' must be True or False");
  }
  if (c->p < c->end && (((*c->p | 0x20) >= 'a' && (*c->p | 0x20) <= 'z') || *c->p == '_' ||
                        (*c->p >= '0' && *c->p <= '9')))
    return fail(err, errlen, "'fortran_order' must be True or False");
  return 0;
}

/* Classifies the dtype string; anything but the four accepted ones is an
 * error that says what it was. */
static int classify_descr(const char *s, size_t n, npy_info *info, char *err, size_t errlen) {
  static const npy_dtype all[] = {NPY_F32, NPY_F16, NPY_F64, NPY_U16};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    if (str_is(s, n, npy_descr(all[i]))) {
      info->dtype = all[i];
      info->elem_size = npy_dtype_size(all[i]);
      memcpy(info->descr, s, n);
      info->descr[n] = '\0';
      return 0;
    }
  }
  char shown[32];
  sanitize(shown, sizeof shown, s, n);
  if (n >= 2 && s[0] == '>' && s[1] != 'O')
    return fail(err, errlen, "big-endian dtype '%s' is not supported (save it little-endian)", shown);
  if ((n >= 1 && s[0] == 'O') || (n >= 2 && s[1] == 'O'))
    return fail(err, errlen, "object arrays (dtype '%s') are not supported", shown);
  return fail(err, errlen,
              "unsupported dtype '%s' (supported: '<f4', '<f2', '<f8', and '<u2' holding bf16 bits)",
              shown);
}

/* The header dict: exactly the keys descr, fortran_order and shape, each
 * once, in any order, with any Python whitespace and an optional trailing
 * comma; nothing but whitespace after it. */
static int parse_dict(cursor *c, unsigned major, npy_info *info, char *err, size_t errlen) {
  const char *descr = NULL;
  size_t descr_len = 0;
  int fortran = -1, have_shape = 0;
  if (!accept(c, '{')) return fail(err, errlen, "malformed header: not a Python dict");
  if (!accept(c, '}')) {
    for (;;) {
      const char *key;
      size_t key_len;
      if (parse_string(c, &key, &key_len, err, errlen)) return -1;
      if (!accept(c, ':')) return fail(err, errlen, "malformed header: expected ':' after a key");
      if (str_is(key, key_len, "descr")) {
        if (descr) return fail(err, errlen, "malformed header: 'descr' given twice");
        int ch = peek(c);
        if (ch == '[' || ch == '(' || ch == '{')
          return fail(err, errlen, "structured dtypes are not supported");
        if (parse_string(c, &descr, &descr_len, err, errlen)) return -1;
      } else if (str_is(key, key_len, "fortran_order")) {
        if (fortran >= 0) return fail(err, errlen, "malformed header: 'fortran_order' given twice");
        if (parse_bool(c, &fortran, err, errlen)) return -1;
      } else if (str_is(key, key_len, "shape")) {
        if (have_shape) return fail(err, errlen, "malformed header: 'shape' given twice");
        if (parse_shape(c, major, info, err, errlen)) return -1;
        have_shape = 1;
      } else {
        char shown[32];
        sanitize(shown, sizeof shown, key, key_len);
        return fail(err, errlen, "malformed header: unexpected key '%s'", shown);
      }
      if (accept(c, '}')) break;
      if (!accept(c, ',')) return fail(err, errlen, "malformed header: expected ',' or '}'");
      if (accept(c, '}')) break;
    }
  }
  if (peek(c) != -1) return fail(err, errlen, "malformed header: text after the dict");
  if (!descr) return fail(err, errlen, "header lacks 'descr'");
  if (fortran < 0) return fail(err, errlen, "header lacks 'fortran_order'");
  if (!have_shape) return fail(err, errlen, "header lacks 'shape'");
  if (classify_descr(descr, descr_len, info, err, errlen)) return -1;
  if (fortran)
    return fail(err, errlen, "Fortran-order arrays are not supported (save a C-order copy)");
  return 0;
}

/* The fixed prefix: magic, version, header length. Checks what of it is in
 * buf[0..len), so a wrong magic fails on its first bytes. @return 0 with
 * *prefix (10 or 12) and *hlen set, or -1 with a reason. */
static int parse_prefix(const unsigned char *b, size_t len, npy_info *info, size_t *prefix,
                        size_t *hlen, char *err, size_t errlen) {
  if (len == 0) return fail(err, errlen, "empty file, not a .npy file");
  if (memcmp(b, npy_magic, len < 6 ? len : 6) != 0)
    return fail(err, errlen, "not a .npy file (no \\x93NUMPY magic)");
  if (len < 8) return fail(err, errlen, "truncated header (%zu bytes)", len);
  info->major = b[6];
  info->minor = b[7];
  if (info->major < 1 || info->major > 3 || info->minor != 0)
    return fail(err, errlen, "unsupported .npy format version %u.%u (1.0, 2.0 and 3.0 are read)",
                info->major, info->minor);
  *prefix = info->major == 1 ? 10 : 12;
  if (len < *prefix) return fail(err, errlen, "truncated header (%zu bytes)", len);
  *hlen = (size_t)b[8] | (size_t)b[9] << 8;
  if (info->major > 1) *hlen |= (size_t)b[10] << 16 | (size_t)b[11] << 24;
  return 0;
}

/* The prefix and the header dict in buf[0..len); fills *info, data_bytes
 * included, without asking for the data to be there. */
static int parse_header(const unsigned char *b, size_t len, npy_info *info, char *err,
                        size_t errlen) {
  size_t prefix, hlen;
  memset(info, 0, sizeof *info);
  if (parse_prefix(b, len, info, &prefix, &hlen, err, errlen)) return -1;
  if (hlen > len - prefix)
    return fail(err, errlen, "header length %zu runs past the end of the file (%zu bytes)", hlen,
                len);
  cursor c = {(const char *)b + prefix, (const char *)b + prefix + hlen};
  if (parse_dict(&c, info->major, info, err, errlen)) return -1;
  info->data_offset = prefix + hlen;

  /* count = product of the dims; an empty axis makes it 0 whatever the others */
  size_t count = 1;
  int empty = 0;
  for (int i = 0; i < info->ndim; i++) empty |= info->shape[i] == 0;
  for (int i = 0; i < info->ndim && !empty; i++) {
    if (count > (size_t)PTRDIFF_MAX / info->elem_size / info->shape[i]) {
      char shape[96];
      npy_format_shape(shape, sizeof shape, info->ndim, info->shape);
      return fail(err, errlen, "shape %s is too large (its size overflows)", shape);
    }
    count *= info->shape[i];
  }
  info->count = empty ? 0 : count;
  info->data_bytes = info->count * info->elem_size;
  return 0;
}

int npy_parse(const void *buf, size_t len, npy_info *info, char *err, size_t errlen) {
  if (parse_header(buf, len, info, err, errlen)) return -1;
  if (info->data_bytes > len - info->data_offset) {
    char shape[96];
    npy_format_shape(shape, sizeof shape, info->ndim, info->shape);
    return fail(err, errlen, "data is truncated: shape %s of '%s' needs %zu bytes, the file has %zu",
                shape, info->descr, info->data_bytes, len - info->data_offset);
  }
  return 0;
}

/* ---- writing ------------------------------------------------------------ */

size_t npy_header(void *out, size_t cap, int version, npy_dtype dt, int ndim,
                  const size_t *shape) {
  char dict[NPY_HEADER_MAX];
  char tuple[NPY_HEADER_MAX - 128];
  if (ndim < 0 || ndim > NPY_MAX_DIMS || version < 0 || version > 3) return 0;
  /* the dict as Python's repr writes it, keys sorted */
  npy_format_shape(tuple, sizeof tuple, ndim, shape);
  int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                   npy_descr(dt), tuple);
  if (n < 0 || (size_t)n >= sizeof dict) return 0;
  size_t hlen = (size_t)n;
  if (ndim > 0) {
    char first[24];
    int digits = snprintf(first, sizeof first, "%zu", shape[0]);
    size_t spaces = digits > 0 && digits < NPY_GROWTH_DIGITS ? (size_t)(NPY_GROWTH_DIGITS - digits) : 0;
    if (hlen + spaces >= sizeof dict) return 0;
    memset(dict + hlen, ' ', spaces);
    hlen += spaces;
  }
  hlen += 1; /* the closing '\n' */
  if (version == 0) {
    /* numpy's choice: 1.0 unless the padded length needs more than 16 bits */
    size_t pad = NPY_ALIGN - (10 + hlen) % NPY_ALIGN;
    version = hlen + pad <= 0xffff ? 1 : 2;
  }
  size_t prefix = version == 1 ? 10 : 12;
  size_t pad = NPY_ALIGN - (prefix + hlen) % NPY_ALIGN; /* numpy pads 64, not 0, when aligned */
  size_t total = prefix + hlen + pad;
  if (version == 1 && hlen + pad > 0xffff) return 0;
  if (total > cap) return 0;
  unsigned char *o = out;
  size_t field = hlen + pad;
  memcpy(o, npy_magic, 6);
  o[6] = (unsigned char)version;
  o[7] = 0;
  for (size_t i = 0; i < prefix - 8; i++) o[8 + i] = (unsigned char)(field >> (8 * i));
  memcpy(o + prefix, dict, hlen - 1);
  memset(o + prefix + hlen - 1, ' ', pad);
  o[total - 1] = '\n';
  return total;
}

/* ---- input files -------------------------------------------------------- */

/* Reads into buf[*have..want), growing it (*cap) as bytes arrive, so a
 * header that announces more than the stream holds costs only what came.
 * Stops at want or at the end of the stream. @return 0, or an errno. */
static int read_upto(int fd, unsigned char **buf, size_t *cap, size_t *have, size_t want) {
  while (*have < want) {
    if (*have == *cap) {
      size_t grown = *cap < want / 2 ? *cap * 2 : want;
      unsigned char *p = realloc(*buf, grown);
      if (!p) return ENOMEM;
      *buf = p;
      *cap = grown;
    }
    /* never past want: what follows belongs to the next reader */
    size_t chunk = (want < *cap ? want : *cap) - *have;
    if (chunk > ((size_t)1 << 30)) chunk = (size_t)1 << 30;
    ssize_t r = read(fd, *buf + *have, chunk);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) break;
    *have += (size_t)r;
  }
  return 0;
}

/* A stream (pipe, FIFO, character device, or a file that cannot be mapped):
 * the magic and version first (a wrong one fails at once, so /dev/zero or
 * /dev/urandom is refused after 8 bytes), then the header (at most
 * NPY_STREAM_HEADER_MAX bytes), then exactly the bytes of data it announces;
 * nothing after them is read. When the stream ends early, npy_parse on what
 * came gives the same message as a file of those bytes. */
static int read_stream(npy_file *f, int fd, char *err, size_t errlen) {
  size_t cap = 4096, have = 0, want = 8, prefix, hlen;
  unsigned char *buf = malloc(cap);
  npy_info info;
  int e = buf ? 0 : ENOMEM;
  /* magic and version; what they say is the rest of the prefix */
  if (!e) e = read_upto(fd, &buf, &cap, &have, want);
  if (!e && have == 8 && !memcmp(buf, npy_magic, 6) && buf[6] >= 1 && buf[6] <= 3 && buf[7] == 0)
    e = read_upto(fd, &buf, &cap, &have, want = buf[6] == 1 ? 10 : 12);
  if (e) goto read_error;
  if (parse_prefix(buf, have, &info, &prefix, &hlen, err, errlen) != 0) goto failed;
  if (hlen > NPY_STREAM_HEADER_MAX) {
    fail(err, errlen, "header length %zu is more than the %d bytes read from a stream", hlen,
         NPY_STREAM_HEADER_MAX);
    goto failed;
  }
  /* the header, then the data */
  e = read_upto(fd, &buf, &cap, &have, want = prefix + hlen);
  if (e) goto read_error;
  if (parse_header(buf, have, &info, err, errlen) != 0) goto failed;
  /* a stream is held whole: an array larger than the machine's memory
   * fails now, not once memory is exhausted */
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0 && (uintmax_t)pages <= SIZE_MAX / (uintmax_t)page &&
      info.data_bytes > (size_t)pages * (size_t)page) {
    char shape[96];
    npy_format_shape(shape, sizeof shape, info.ndim, info.shape);
    fail(err, errlen, "array larger than this machine's memory: shape %s of '%s' needs %zu bytes, "
         "the machine has %zu", shape, info.descr, info.data_bytes, (size_t)pages * (size_t)page);
    goto failed;
  }
  e = read_upto(fd, &buf, &cap, &have, want = info.data_offset + info.data_bytes);
  if (e) goto read_error;
  if (npy_parse(buf, have, &f->info, err, errlen) != 0) goto failed;
  f->base = buf;
  f->base_len = have;
  return 0;

read_error:
  if (e == ENOMEM)
    fail(err, errlen, "cannot read: out of memory for %zu bytes", want);
  else
    fail(err, errlen, "cannot read: %s", strerror(e));
failed:
  free(buf);
  return -1;
}

int npy_open(npy_file *f, const char *path, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  f->path = path;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(err, errlen, "cannot open: %s", strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return fail(err, errlen, "cannot stat: %s", strerror(e));
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    return fail(err, errlen, "is a directory");
  }
  if (S_ISREG(st.st_mode) && st.st_size > 0 && (uintmax_t)st.st_size <= SIZE_MAX) {
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
      close(fd);
      f->base = m;
      f->base_len = (size_t)st.st_size;
      f->mapped = 1;
      if (npy_parse(f->base, f->base_len, &f->info, err, errlen) != 0) {
        npy_close(f);
        return -1;
      }
      f->data = (const char *)f->base + f->info.data_offset;
      return 0;
    }
  }
  /* a pipe, a device, a file reporting size 0 (/proc), or one that cannot
   * be mapped */
  int rc = read_stream(f, fd, err, errlen);
  close(fd);
  if (rc != 0) return -1;
  f->data = (const char *)f->base + f->info.data_offset;
  return 0;
}

void npy_close(npy_file *f) {
  if (f->base) {
    if (f->mapped)
      munmap(f->base, f->base_len);
    else
      free(f->base);
  }
  f->base = NULL;
  f->data = NULL;
  f->base_len = 0;
  f->mapped = 0;
}
