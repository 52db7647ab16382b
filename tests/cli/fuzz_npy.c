/* fuzz_npy.c - the libFuzzer target for the .npy reader: any bytes must
 * parse or be rejected with a message, never read outside the input; what
 * parses must describe data inside the input, and re-encoding its header
 * must parse back to the same array description; the same bytes read from a
 * pipe by npy_open (the stream reader) give the same verdict, message and
 * array. Built with -fsanitize=fuzzer by `make fuzz`, and replayed by
 * fuzz_replay.c in `make test`. Checks abort (not assert), so they hold
 * under NDEBUG too. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void require(int ok) {
  if (!ok) abort();
}

/* The stream reader on these bytes, written into a pipe (inputs up to the
 * 64 KiB a pipe holds without a reader): the verdict and message of
 * npy_parse, and for an array the same description and data. */
static void check_stream(const uint8_t *data, size_t size, int parsed, const npy_info *info,
                         const char *err) {
  int fds[2];
  if (size > 65536 || pipe(fds) != 0) return;
  size_t off = 0;
  while (off < size) {
    ssize_t w = write(fds[1], data + off, size - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
  close(fds[1]);
  char path[64], err2[512];
  snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
  npy_file f;
  int rc = off == size ? npy_open(&f, path, err2, sizeof err2) : -2;
  close(fds[0]);
  if (rc == -2 || (rc == -1 && strncmp(err2, "cannot open", 11) == 0)) return; /* no /dev/fd */
  require((rc == 0) == parsed);
  if (rc != 0) {
    /* the two differences: a stream refuses a header length field over its
     * limit before reading on, and an array larger than memory before
     * reading its data (a file of these bytes has too few of them) */
    size_t hlen = 0;
    if (size >= 12 && data[6] >= 2)
      hlen = (size_t)data[8] | (size_t)data[9] << 8 | (size_t)data[10] << 16 | (size_t)data[11] << 24;
    if (hlen > NPY_STREAM_HEADER_MAX && strstr(err2, "read from a stream")) return;
    if (strstr(err, "data is truncated") && strstr(err2, "array larger than this machine's memory"))
      return;
    require(strcmp(err, err2) == 0);
    return;
  }
  require(!f.mapped && f.info.dtype == info->dtype && f.info.ndim == info->ndim &&
          f.info.count == info->count && f.info.data_offset == info->data_offset &&
          f.info.data_bytes == info->data_bytes);
  for (int i = 0; i < info->ndim; i++) require(f.info.shape[i] == info->shape[i]);
  require(info->data_bytes == 0 || memcmp(f.data, data + info->data_offset, info->data_bytes) == 0);
  npy_close(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  npy_info info;
  char err[512];
  err[0] = '\0';
  if (npy_parse(data, size, &info, err, sizeof err) != 0) {
    /* rejected: with a message, NUL-terminated within the buffer */
    require(err[0] != '\0' && memchr(err, '\0', sizeof err) != NULL);
    check_stream(data, size, 0, &info, err);
    return 0;
  }
  check_stream(data, size, 1, &info, err);
  require(info.ndim >= 0 && info.ndim <= NPY_MAX_DIMS);
  require(info.data_offset <= size && info.data_bytes <= size - info.data_offset);
  require(info.data_bytes == info.count * info.elem_size);
  require(info.elem_size == npy_dtype_size(info.dtype));
  require(strcmp(info.descr, npy_descr(info.dtype)) == 0);

  /* every data byte is readable (ASan would see an over-read) */
  unsigned sum = 0;
  for (size_t i = 0; i < info.data_bytes; i++) sum += data[info.data_offset + i];
  (void)sum;

  /* the shape in messages, at every buffer size, stays inside it */
  char text[64];
  for (size_t cap = 0; cap <= sizeof text; cap += 7) {
    memset(text, 'x', sizeof text);
    npy_format_shape(text, cap, info.ndim, info.shape);
    if (cap) require(memchr(text, '\0', cap) != NULL);
  }

  /* re-encode in each version, parse back: the same array */
  for (int version = 0; version <= 3; version++) {
    size_t cap = NPY_HEADER_MAX + info.data_bytes;
    unsigned char *buf = malloc(cap ? cap : 1);
    require(buf != NULL);
    size_t hlen = npy_header(buf, NPY_HEADER_MAX, version, info.dtype, info.ndim, info.shape);
    require(hlen > 0 && hlen % 64 == 0);
    memcpy(buf + hlen, data + info.data_offset, info.data_bytes);
    npy_info again;
    require(npy_parse(buf, hlen + info.data_bytes, &again, err, sizeof err) == 0);
    require(again.dtype == info.dtype && again.ndim == info.ndim &&
            again.count == info.count && again.data_offset == hlen &&
            again.data_bytes == info.data_bytes);
    for (int i = 0; i < info.ndim; i++) require(again.shape[i] == info.shape[i]);
    free(buf);
  }
  return 0;
}
