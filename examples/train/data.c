/* data.c - reading the text, the train/validation split, and batches. */
#include "data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

/* Appends a whole file to *buf. @return 0 or -1 with a message. */
static int append_file(const char *path, uint8_t **buf, size_t *len, size_t *cap, char *err,
                       size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
  }
  size_t start = *len;
  for (;;) {
    if (*cap - *len < 65536) {
      size_t ncap = *cap ? *cap * 2 : 1 << 20;
      uint8_t *nb = realloc(*buf, ncap);
      if (!nb) {
        fclose(f);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
      }
      *buf = nb;
      *cap = ncap;
    }
    size_t got = fread(*buf + *len, 1, *cap - *len, f);
    *len += got;
    if (got == 0) break;
  }
  int bad = ferror(f);
  int saved = errno;
  fclose(f);
  if (bad) {
    snprintf(err, errlen, "%s: read error: %s", path, strerror(saved));
    return -1;
  }
  if (*len == start) {
    snprintf(err, errlen, "%s: empty file", path);
    return -1;
  }
  return 0;
}

int train_text_load(const char *const *paths, int npaths, int val_every, size_t min_len,
                    train_text *text, char *err, size_t errlen) {
  memset(text, 0, sizeof *text);
  uint8_t *all = NULL;
  size_t len = 0, cap = 0;
  if (npaths < 1 || val_every < 2) {
    snprintf(err, errlen, "no data files");
    return -1;
  }
  for (int i = 0; i < npaths; i++)
    if (append_file(paths[i], &all, &len, &cap, err, errlen)) {
      free(all);
      return -1;
    }
  text->train = malloc(len);
  text->val = malloc(len);
  if (!text->train || !text->val) {
    free(all);
    train_text_free(text);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  for (size_t at = 0, block = 0; at < len; at += TRAIN_SPLIT_BLOCK, block++) {
    size_t n = len - at < TRAIN_SPLIT_BLOCK ? len - at : TRAIN_SPLIT_BLOCK;
    int to_val = block % (size_t)val_every == (size_t)val_every - 1;
    memcpy(to_val ? text->val + text->nval : text->train + text->ntrain, all + at, n);
    *(to_val ? &text->nval : &text->ntrain) += n;
  }
  free(all);
  if (text->ntrain < min_len || text->nval < min_len) {
    snprintf(err, errlen,
             "%s%s: too little text (%zu bytes: %zu for training, %zu for validation; each "
             "needs at least %zu)",
             paths[0], npaths > 1 ? " and the other files" : "", len, text->ntrain, text->nval,
             min_len);
    train_text_free(text);
    return -1;
  }
  return 0;
}

void train_text_free(train_text *text) {
  free(text->train);
  free(text->val);
  memset(text, 0, sizeof *text);
}

static void window(const uint8_t *src, int T, uint8_t *in, uint8_t *tg) {
  memcpy(in, src, (size_t)T);
  memcpy(tg, src + 1, (size_t)T);
}

void train_text_batch(const uint8_t *data, size_t n, uint64_t *rng, int B, int T, uint8_t *in,
                      uint8_t *tg) {
  size_t starts = n - (size_t)T; /* start in [0, n - T - 1] */
  for (int b = 0; b < B; b++) {
    size_t s = (size_t)(train_rand64(rng) % starts);
    window(data + s, T, in + (size_t)b * T, tg + (size_t)b * T);
  }
}

void train_text_eval_batch(const uint8_t *data, size_t n, int i, int nb, int B, int T, uint8_t *in,
                           uint8_t *tg) {
  size_t total = (size_t)nb * B, last = n - (size_t)T - 1;
  for (int b = 0; b < B; b++) {
    size_t w = (size_t)i * B + b;
    size_t s = total > 1 ? (size_t)((double)last * (double)w / (double)(total - 1)) : 0;
    window(data + s, T, in + (size_t)b * T, tg + (size_t)b * T);
  }
}
