/* outfile.h - all-or-nothing output: every output of a command is written to
 * a temporary file beside its target, and the temporaries are renamed into
 * place only once all of them are complete. On failure (or SIGINT, SIGTERM,
 * SIGHUP) the temporaries are removed and existing targets are untouched.
 * A target that is a device or a pipe (-o /dev/stdout) cannot be replaced:
 * it is written in place, last, just before the renames. */
#ifndef RMSNORM_TOOLS_OUTFILE_H
#define RMSNORM_TOOLS_OUTFILE_H

#include <stddef.h>

#include "npy.h"

/* At most this many outputs per command (y or z, mean, rstd, dweight, dbias,
 * the residual). */
#define OUT_MAX 5

typedef struct out_set out_set;

/* The one output set of this process (the signal handler needs to find
 * it), emptied. Installs the signal handlers on first use. */
out_set *out_begin(void);

/* Checks that path can be an output (not a directory, not named by an
 * earlier output of the set) and creates its temporary beside it (beside
 * the file a symbolic link points to, so the link is kept), or opens it
 * when it is a device or a pipe.
 * @return the output's index, or -1 with a reason in err. */
int out_add(out_set *s, const char *path, char *err, size_t errlen);

/* Writes output i as a .npy file (format 1.0, or 2.0 if the header needs it)
 * of dtype dt and the given shape with `bytes` bytes of data, and flushes it
 * to disk. For a device or pipe, only remembers what to write: data must
 * then stay valid until out_commit. @return 0, or -1 with a reason in err. */
int out_write_npy(out_set *s, int i, npy_dtype dt, int ndim, const size_t *shape,
                  const void *data, size_t bytes, char *err, size_t errlen);

/* Writes the devices and pipes, then renames every temporary into place (in
 * the order added). @return 0, or -1 with a reason in err and the path that
 * failed in *failed; the temporaries not yet renamed are removed. */
int out_commit(out_set *s, const char **failed, char *err, size_t errlen);

/* Removes every temporary not yet renamed and closes what is open. Safe to
 * call more than once. */
void out_abort(out_set *s);

#endif
