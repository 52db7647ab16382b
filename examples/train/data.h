/* data.h - the training text: files read as bytes, split into train and
 * validation by blocks, and batches of (input, next byte) windows. */
#ifndef TRAIN_DATA_H
#define TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

/* The split: the text (all files concatenated in the given order) is cut
 * into blocks of TRAIN_SPLIT_BLOCK bytes and every val_every-th block (the
 * last of each group of val_every) goes to validation, so both parts sample
 * every file. */
#define TRAIN_SPLIT_BLOCK 4096

typedef struct train_text {
  uint8_t *train, *val;
  size_t ntrain, nval;
} train_text;

/* Reads and splits. min_len: each part must hold at least this many bytes
 * (seq_len + 1). @return 0, or -1 with a message in err naming the file and
 * the problem (unreadable, empty, too small). */
int train_text_load(const char *const *paths, int npaths, int val_every, size_t min_len,
                    train_text *text, char *err, size_t errlen);
void train_text_free(train_text *text);

/* A training batch: B windows of T + 1 bytes at uniform random starts drawn
 * from *rng; in[b*T + t] = w[t], tg[b*T + t] = w[t + 1]. n >= T + 1. */
void train_text_batch(const uint8_t *data, size_t n, uint64_t *rng, int B, int T, uint8_t *in,
                      uint8_t *tg);

/* Evaluation batch i of nb: the B*nb windows at evenly spaced starts over
 * the whole of data, so every evaluation sees the same bytes. */
void train_text_eval_batch(const uint8_t *data, size_t n, int i, int nb, int B, int T, uint8_t *in,
                           uint8_t *tg);

#endif /* TRAIN_DATA_H */
