/* test_outputs.c - how outputs are written: links, FIFOs, standard output,
 * file modes, names of 255 bytes, readers that go away. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_fixture.h"

/* Outputs that are not plain files: a symbolic link (the file it names is
 * replaced, the link kept), a dangling link (replaced by the file), standard
 * output redirected to a file, and a pipe (written in place, not replaced). */
static void test_special_outputs(void) {
  static const size_t shape[2] = {3, 4};
  write_filled("x.npy", TF32, 2, shape, FILL_DATA);
  int rc = RUN("forward", "x.npy", "-o", "ref.npy");
  tu_check(rc == 0, "reference: %s", err_text);

  write_old("named.npy");
  unlink("link.npy");
  if (symlink("named.npy", "link.npy") == 0) {
    rc = RUN("forward", "x.npy", "-o", "link.npy");
    struct stat st;
    tu_check(rc == 0 && lstat("link.npy", &st) == 0 && S_ISLNK(st.st_mode) &&
              same_file("named.npy", "ref.npy"),
          "through a symbolic link: %d %s", rc, err_text);
  }
  unlink("link.npy"), unlink("named.npy");
  if (symlink("nowhere.npy", "dangling.npy") == 0) {
    rc = RUN("forward", "x.npy", "-o", "dangling.npy");
    struct stat st;
    tu_check(rc == 0 && lstat("dangling.npy", &st) == 0 && S_ISREG(st.st_mode) &&
              same_file("dangling.npy", "ref.npy") && !file_exists("nowhere.npy"),
          "dangling link: %d %s", rc, err_text);
  }
  unlink("dangling.npy");

  if (file_exists("/dev/stdout")) {
    run_opts redirected = {.stdout_path = "stdout.npy"};
    rc = RUN_WITH(&redirected, "forward", "x.npy", "-o", "/dev/stdout");
    tu_check(rc == 0 && same_file("stdout.npy", "ref.npy"), "-o /dev/stdout: %d %s", rc, err_text);
    unlink("stdout.npy");
  }

  /* a pipe: a reader copies what comes through it into a file */
  unlink("fifo");
  if (mkfifo("fifo", 0600) == 0) {
    fflush(NULL);
    pid_t reader = fork();
    if (reader == 0) {
      int in = open("fifo", O_RDONLY), out = open("from_fifo.npy", O_WRONLY | O_CREAT | O_TRUNC, 0644);
      char buf[4096];
      ssize_t n;
      while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n) _exit(1);
      _exit(0);
    }
    rc = RUN("forward", "x.npy", "-o", "fifo", "--rstd", "r.npy");
    int status;
    waitpid(reader, &status, 0);
    struct stat st;
    tu_check(rc == 0 && same_file("from_fifo.npy", "ref.npy") && lstat("fifo", &st) == 0 &&
              S_ISFIFO(st.st_mode) && file_exists("r.npy"),
          "-o FIFO: %d %s", rc, err_text);
    unlink("fifo"), unlink("from_fifo.npy"), unlink("r.npy");
  }
  unlink("ref.npy");
}

/* The output file's permissions: a new file follows the umask, a replaced
 * one keeps its mode. */
static void test_modes(void) {
  static const size_t shape[2] = {2, 4};
  write_filled("x.npy", TF32, 2, shape, FILL_DATA);
  unlink("out.npy");
  mode_t old = umask(022);
  int rc = RUN("forward", "x.npy", "-o", "out.npy");
  struct stat st;
  tu_check(rc == 0 && stat("out.npy", &st) == 0 && (st.st_mode & 0777) == 0644, "new file mode %o",
        (unsigned)(st.st_mode & 0777));
  chmod("out.npy", 0600);
  rc = RUN("forward", "x.npy", "-o", "out.npy");
  tu_check(rc == 0 && stat("out.npy", &st) == 0 && (st.st_mode & 0777) == 0600, "kept mode %o",
        (unsigned)(st.st_mode & 0777));
  umask(old);
  unlink("out.npy");
}

/* The names in folder dir other than . and ..: how many, and how many of
 * them start with a dot (a temporary). */
static int folder_names(const char *dir, int *dot_names) {
  int n = 0;
  *dot_names = 0;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    n++;
    if (e->d_name[0] == '.') ++*dot_names;
  }
  if (d) closedir(d);
  return n;
}

/* "long/" then a name of `bytes` bytes: `unit` repeated, one 'x' per byte
 * left over, then ".npy" (unit may be a multi-byte UTF-8 character). */
static void long_name(char *out, size_t cap, size_t bytes, const char *unit) {
  size_t k = (size_t)snprintf(out, cap, "long/"), u = strlen(unit), end = k + bytes - 4;
  while (k + u <= end && k + u < cap) memcpy(out + k, unit, u), k += u;
  while (k < end && k < cap) out[k++] = 'x';
  snprintf(out + k, cap - k, ".npy");
}

/* Output names as long as a file name may be (255 bytes on the usual file
 * systems): the temporary beside them fits whatever their length, the run
 * leaves the outputs and nothing else, and a run that fails still replaces
 * nothing and leaves no temporary. */
static void test_long_names(void) {
  static const size_t shape[2] = {3, 4}, big[2] = {64, 64};
  write_filled("x.npy", TF32, 2, shape, FILL_DATA);
  write_filled("bigx.npy", TF32, 2, big, FILL_DATA);
  int rc = RUN("forward", "x.npy", "-o", "ref.npy", "--rstd", "refr.npy");
  tu_check(rc == 0, "reference: %s", err_text);
  if (mkdir("long", 0755) != 0) die("mkdir long");
  if (pathconf("long", _PC_NAME_MAX) != 255) {
    printf("cli_commands_outputs: long output names not tried (the scratch folder's limit on a name is "
           "not 255 bytes)\n");
    rmdir("long");
    unlink("ref.npy"), unlink("refr.npy"), unlink("bigx.npy");
    return;
  }

  static const struct {
    size_t bytes;
    const char *unit;
  } names[] = {{247, "n"}, {248, "n"}, {250, "n"}, {254, "n"}, {255, "n"},
               {255, "\xc3\xa9"} /* é */, {255, "\xe2\x82\xac"} /* € */};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char out[300], r[300];
    long_name(out, sizeof out, names[i].bytes, names[i].unit);
    long_name(r, sizeof r, names[i].bytes, "r");
    int dots, n;
    rc = RUN("forward", "x.npy", "-o", out, "--rstd", r);
    n = folder_names("long", &dots);
    tu_check(rc == 0 && same_file(out, "ref.npy") && same_file(r, "refr.npy"),
             "output name of %zu bytes: exit %d %s", names[i].bytes, rc, err_text);
    tu_check(n == 2 && dots == 0, "output name of %zu bytes: %d names, %d temporaries left",
             names[i].bytes, n, dots);

    /* a write that fails half-way: the old content stays, no temporary */
    write_old(out);
    unlink(r);
    run_opts limited = {.fsize_limit = 8192};
    rc = RUN_WITH(&limited, "forward", "bigx.npy", "--rstd", r, "-o", out);
    n = folder_names("long", &dots);
    tu_check(rc == 1 && strstr(err_text, "cannot write: File too large") && old_content(out),
             "output name of %zu bytes, failing write: exit %d %s", names[i].bytes, rc, err_text);
    tu_check(n == 1 && dots == 0, "output name of %zu bytes, failing write: %d names, %d temporaries",
             names[i].bytes, n, dots);
    unlink(out), unlink(r);
  }

  /* one byte more than a name may have: refused, nothing made */
  char over[300];
  long_name(over, sizeof over, 256, "n");
  rc = RUN("forward", "x.npy", "-o", over);
  int dots, n = folder_names("long", &dots);
  tu_check(rc == 1 && strstr(err_text, "File name too long") && n == 0,
           "output name of 256 bytes: exit %d, %d names: %s", rc, n, err_text);
  rmdir("long");
  unlink("ref.npy"), unlink("refr.npy"), unlink("bigx.npy");
}

/* A reader that goes away: `rmsnorm ... -o /dev/stdout | head -c 10`, and
 * standard output of demo, info and --help into a closed pipe. Exit 1, one
 * line, no temporary, existing outputs untouched. */
static void test_closed_pipes(void) {
  char before[4096], after[4096];
  write_big();
  for (int pass = 0; pass < 2; pass++) {
    for (long take = 0; take <= 10; take += 10) {
      unlink("r.npy");
      if (pass) write_old("r.npy");
      listing(before, sizeof before);
      run_opts o = {.stdout_pipe = 1, .stdout_read = take};
      int rc = RUN_WITH(&o, "forward", "big.npy", "-o", "/dev/stdout", "--rstd", "r.npy");
      listing(after, sizeof after);
      tu_check(rc == 1 && !strcmp(err_text, "rmsnorm: /dev/stdout: cannot write: Broken pipe\n"),
            "reader gone after %ld bytes: %d %s", take, rc, err_text);
      tu_check(!strcmp(before, after), "reader gone after %ld bytes: folder changed:\n  before: %s\n  after:  %s",
            take, before, after);
      tu_check(!pass || old_content("r.npy"), "reader gone: r.npy was touched");
    }
  }
  unlink("r.npy");

  /* the same through a FIFO whose reader takes 10 bytes */
  unlink("fifo");
  if (mkfifo("fifo", 0600) == 0) {
    fflush(NULL);
    pid_t reader = fork();
    if (reader == 0) {
      close_others(-1);
      int in = open("fifo", O_RDONLY);
      char buf[10];
      _exit(in >= 0 && read(in, buf, sizeof buf) > 0 ? 0 : 1);
    }
    listing(before, sizeof before);
    int rc = RUN("forward", "big.npy", "-o", "fifo", "--rstd", "r.npy");
    listing(after, sizeof after);
    waitpid(reader, NULL, 0);
    tu_check(rc == 1 && !strcmp(err_text, "rmsnorm: fifo: cannot write: Broken pipe\n"),
          "FIFO reader gone: %d %s", rc, err_text);
    tu_check(!strcmp(before, after), "FIFO reader gone: folder changed:\n  before: %s\n  after:  %s",
          before, after);
    unlink("fifo");
  }

  /* text on standard output */
  const char *const cmds[][3] = {{"demo", NULL}, {"info", NULL}, {"--help", NULL}, {"forward", "--help", NULL}};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    run_opts o = {.stdout_pipe = 1, .stdout_read = 0};
    int rc = run_with(&o, cmds[i]);
    tu_check(rc == 1 && !strcmp(err_text, "rmsnorm: cannot write to standard output: Broken pipe\n"),
          "'%s' into a closed pipe: %d %s", cmds[i][0], rc, err_text);
  }
  unlink("big.npy");
}

int main(int argc, char **argv) {
  cli_begin(argc, argv);
  test_modes();
  test_special_outputs();
  test_long_names();
  test_closed_pipes();
  return cli_end("cli_commands_outputs");
}
