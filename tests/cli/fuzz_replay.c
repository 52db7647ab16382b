/* fuzz_replay.c - runs LLVMFuzzerTestOneInput on every file of the given
 * folders (or on the given files) without libFuzzer: `make test` replays
 * the seeds and past crashes with any compiler, and the sanitizer build
 * does so under ASan and UBSan. Each input is copied into a buffer of its
 * exact size, so an over-read is an ASan report. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return -1;
  }
  size_t cap = 4096, n = 0;
  uint8_t *buf = malloc(cap);
  for (;;) {
    if (!buf) {
      fclose(f);
      fprintf(stderr, "%s: out of memory\n", path);
      return -1;
    }
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap) break;
    uint8_t *grown = realloc(buf, cap * 2);
    if (!grown) free(buf);
    buf = grown;
    cap *= 2;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    fprintf(stderr, "%s: read error\n", path);
    return -1;
  }
  /* an exact-size copy: any read past the input lands outside it */
  uint8_t *exact = malloc(n ? n : 1);
  if (!exact) {
    free(buf);
    return -1;
  }
  memcpy(exact, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 0;
}

int main(int argc, char **argv) {
  long replayed = 0, errors = 0;
  if (argc < 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      perror(argv[i]);
      errors++;
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      errors += replay_file(argv[i]) != 0;
      replayed++;
      continue;
    }
    DIR *dir = opendir(argv[i]);
    if (!dir) {
      perror(argv[i]);
      errors++;
      continue;
    }
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
      if (e->d_name[0] == '.') continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
      errors += replay_file(path) != 0;
      replayed++;
    }
    closedir(dir);
  }
  printf("fuzz_replay: %ld inputs replayed, %ld passed, %ld failed\n", replayed,
         replayed - errors, errors);
  return errors || replayed == 0 ? 1 : 0;
}
