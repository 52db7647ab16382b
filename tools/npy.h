/* npy.h - the NumPy .npy format, as far as the rmsnorm command needs it:
 * a strict header parser over bytes in memory (the fuzzed surface), a
 * header writer that produces numpy's own bytes, and input files (mapped
 * read-only, or read from a stream up to the data's last byte).
 * Depends on libc only, so the fuzz target builds it alone. */
#ifndef RMSNORM_TOOLS_NPY_H
#define RMSNORM_TOOLS_NPY_H

#include <stddef.h>
#include <stdint.h>

/* numpy allows 64 dimensions (32 before numpy 2); so do we. */
#define NPY_MAX_DIMS 64
/* Room for any header npy_header() writes with up to NPY_MAX_DIMS dims. */
#define NPY_HEADER_MAX 4096

/* The element types the command reads (the first four; the parser rejects
 * everything else with a message saying what was found) and writes (all:
 * the byte types only for quantized outputs, never accepted as input). */
typedef enum npy_dtype {
  NPY_F32 = 0, /* '<f4' */
  NPY_F16 = 1, /* '<f2' */
  NPY_F64 = 2, /* '<f8' */
  NPY_U16 = 3, /* '<u2', raw bf16 bits by the command's --bf16 convention */
  NPY_I8 = 4,  /* '|i1', int8 codes (written only) */
  NPY_U8 = 5   /* '|u1', raw bytes: blocks, e4m3 codes, E8M0 scales (written only) */
} npy_dtype;

/* What a header says. `descr` is the dtype string as written in the file. */
typedef struct npy_info {
  unsigned major, minor;      /* format version: 1.0, 2.0 or 3.0 */
  npy_dtype dtype;
  size_t elem_size;           /* bytes per element */
  char descr[8];
  int ndim;                   /* 0 (a scalar) .. NPY_MAX_DIMS */
  size_t shape[NPY_MAX_DIMS];
  size_t count;               /* product of shape (1 for ndim 0) */
  size_t data_offset;         /* bytes from the file start to the data */
  size_t data_bytes;          /* count * elem_size, all present in the file */
} npy_info;

/* Parses the .npy header at buf[0..len) and checks that the data it
 * announces lies within len (trailing bytes after it are ignored, as numpy
 * does). Never reads outside buf.
 * @return 0 and *info filled, or -1 with a one-line reason in err (no file
 * name; at most errlen bytes, NUL-terminated). */
int npy_parse(const void *buf, size_t len, npy_info *info, char *err, size_t errlen);

/* @return the dtype string written for dt: "<f4", "<f2", "<f8", "<u2", "|i1"
 * or "|u1". */
const char *npy_descr(npy_dtype dt);
/* @return bytes per element of dt. */
size_t npy_dtype_size(npy_dtype dt);

/* Formats a shape as Python prints a tuple: "()", "(8,)", "(2, 3)". The
 * text is cut (and ends in "...)") if cap is too small. */
void npy_format_shape(char *out, size_t cap, int ndim, const size_t *shape);

/* Writes into out the header numpy's np.save writes for a C-order array of
 * dtype dt and this shape: magic, version, length, the dict, the growth
 * spaces numpy leaves after it, padding to a multiple of 64 bytes and '\n'.
 * version 0 picks 1.0, or 2.0 when the header does not fit 1.0's 16-bit
 * length; 1, 2 or 3 force that version (3.0 differs from 2.0 only by
 * allowing UTF-8, which this header never needs).
 * @return the header length in bytes (the data starts there), or 0 if ndim
 * is out of range, version is unknown or cap is too small. */
size_t npy_header(void *out, size_t cap, int version, npy_dtype dt, int ndim,
                  const size_t *shape);

/* The longest header read from a stream: 65535 bytes, the most a format 1.0
 * header holds (numpy writes 2.0 only beyond it, which no array this reader
 * accepts needs; np.load itself refuses more than 10000 by default). */
#define NPY_STREAM_HEADER_MAX 65535

/* An input file: mapped read-only when it is a regular file; otherwise (a
 * pipe, FIFO or device) read as a stream: the magic and version first, then
 * the header, then exactly the data's bytes, nothing after them. */
typedef struct npy_file {
  const char *path;
  npy_info info;
  const void *data;  /* info.data_bytes bytes (never NULL, even when empty) */
  void *base;        /* the mapping or buffer holding the whole file */
  size_t base_len;
  int mapped;
} npy_file;

/* Opens and parses path. A stream that does not start with the magic and a
 * known version fails after its first 8 bytes, one whose header is longer
 * than NPY_STREAM_HEADER_MAX, malformed, or announces more data than the
 * machine's memory fails once the header is read, and one that ends early
 * fails with npy_parse's message for the bytes that came; a stream is never
 * read past the data. @return 0, or -1 with a
 * reason in err (as npy_parse, or the system's reason for an open/read
 * failure). */
int npy_open(npy_file *f, const char *path, char *err, size_t errlen);
/* Releases what npy_open acquired; safe on a zeroed or closed npy_file. */
void npy_close(npy_file *f);

#endif
