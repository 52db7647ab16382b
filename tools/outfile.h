/* outfile.h - all-or-nothing output, and the signals that would break it.
 * Every output of a command is written to a temporary file beside its target
 * (".NAME.XXXXXX", NAME cut short where the whole would be longer than a
 * file name may be), flushed to disk, and the temporaries are renamed into
 * place only once all of them are complete: the others first, the first one
 * added (the command's main result) last, each folder flushed after its
 * renames. On failure, and on any signal that can be caught, the temporaries
 * are removed and existing targets are untouched. A target that is a device
 * or a pipe (-o /dev/stdout) cannot be replaced: it is written in place, at
 * commit, before any file is renamed. docs/cli.md ("Files") states what a
 * reader may see. */
#ifndef RMSNORM_TOOLS_OUTFILE_H
#define RMSNORM_TOOLS_OUTFILE_H

#include <stddef.h>

#include "npy.h"

/* At most this many outputs per command (y or z or the codes, mean, rstd,
 * dweight, dbias, the residual, the scales: no command writes more than four). */
#define OUT_MAX 5

typedef struct out_set out_set;

/* Called once, first thing in main, on the main thread:
 * - SIGPIPE and SIGXFSZ are ignored, so a reader that goes away or a file
 *   size limit (ulimit -f) is a failing write (EPIPE, EFBIG) that the
 *   command reports and cleans up after, exit 1;
 * - every other signal whose default is to end the process gets a handler
 *   that removes the temporaries and then dies of the signal as if unhandled
 *   (so the exit status still says which signal). Signals the parent left
 *   ignored (nohup) stay ignored. A handler that runs on another thread (the
 *   library's workers) passes the signal on to the main thread, which holds
 *   it while a temporary is being created, renamed or removed; crashes
 *   (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, ...) clean up where they
 *   happen and then go to the handler that was there before (a
 *   sanitizer's). SIGKILL cannot be caught: it may leave temporaries. */
void out_signals_init(void);

/* The one output set of this process (the signal handlers need to find it),
 * emptied. */
out_set *out_begin(void);

/* Checks that path can be an output (not a directory, not named by an
 * earlier output of the set) and creates its temporary beside it (beside
 * the file a symbolic link points to, so the link is kept), or opens it
 * when it is a device or a pipe (which, for a FIFO, waits for a reader).
 * The first output added is the main one, renamed last.
 * @return the output's index, or -1 with a reason in err. */
int out_add(out_set *s, const char *path, char *err, size_t errlen);

/* Writes output i as a .npy file (format 1.0, or 2.0 if the header needs it)
 * of dtype dt and the given shape with `bytes` bytes of data, and flushes it
 * to disk. For a device or pipe, only remembers what to write: data must
 * then stay valid until out_commit. @return 0, or -1 with a reason in err. */
int out_write_npy(out_set *s, int i, npy_dtype dt, int ndim, const size_t *shape,
                  const void *data, size_t bytes, char *err, size_t errlen);

/* Writes the devices and pipes; then, with the caught signals held, renames
 * every other temporary into place and flushes their folders, then the main
 * output's, and flushes its folder. @return 0, or -1 with a reason in err
 * (which names the outputs already renamed, if any) and the path that failed
 * in *failed; the temporaries not yet renamed are removed. */
int out_commit(out_set *s, const char **failed, char *err, size_t errlen);

/* Removes every temporary not yet renamed and closes what is open. Safe to
 * call more than once. */
void out_abort(out_set *s);

#endif
