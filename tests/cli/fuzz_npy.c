/* fuzz_npy.c - the libFuzzer target for the .npy reader: any bytes must
 * parse or be rejected with a message, never read outside the input; what
 * parses must describe data inside the input, and re-encoding its header
 * must parse back to the same array description. Built with
 * -fsanitize=fuzzer by `make fuzz`, and replayed by fuzz_replay.c in
 * `make test`. Checks abort (not assert), so they hold under NDEBUG too. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void require(int ok) {
  if (!ok) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  npy_info info;
  char err[160];
  err[0] = '\0';
  if (npy_parse(data, size, &info, err, sizeof err) != 0) {
    /* rejected: with a message, NUL-terminated within the buffer */
    require(err[0] != '\0' && memchr(err, '\0', sizeof err) != NULL);
    return 0;
  }
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
