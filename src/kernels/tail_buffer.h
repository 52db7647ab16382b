/* tail_buffer.h - the partial-vector load and store of the ISAs without
 * masked moves (AVX2, NEON): the first n elements pass through a buffer. */
#ifndef RMSNORM_TAIL_BUFFER_H
#define RMSNORM_TAIL_BUFFER_H

#include <stddef.h>
#include <string.h>

/* V##_loadn_##T and V##_storen_##T (the first n < W elements, of type E,
 * of a vector V holding W), from the whole-vector V##_load_##T and
 * V##_store_##T: the load reads n elements into a zero-filled buffer, the
 * store writes the vector to a buffer and copies n out, so neither touches
 * memory past the n elements. */
#define V_BUFFERED_TAILS(V, T, E, W)                                                \
  static inline V V##_loadn_##T(const E *p, size_t n) {                            \
    E buf[W] = {0};                                                                \
    memcpy(buf, p, n * sizeof *p);                                                 \
    return V##_load_##T(buf);                                                      \
  }                                                                                \
  static inline void V##_storen_##T(E *p, V v, size_t n) {                         \
    E buf[W];                                                                      \
    V##_store_##T(buf, v);                                                         \
    memcpy(p, buf, n * sizeof *p);                                                 \
  }

#endif
