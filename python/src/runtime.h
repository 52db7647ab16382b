/* runtime.h - what the two Python extension modules (_native for numpy,
 * _torch for torch) share at run time, in one shared library so that a
 * process has one copy: an rmsnorm_context per OS thread, and the cache of
 * large output blocks. Neither part touches Python; both are thread-safe. */
#ifndef RMSNORM_PY_RUNTIME_H
#define RMSNORM_PY_RUNTIME_H

#include <cstddef>
#include <cstdint>

#include <rmsnorm.h>

#define RNPY_API __attribute__((visibility("default")))

namespace rnpy {

/* The calling thread's context (created on first use, freed when the thread
 * exits), set to run at most `threads` threads (0: the library's default).
 * A forked child keeps using the forking thread's context (the library's
 * atfork handlers make that safe). @return RMSNORM_OK, or the status of rmsnorm_context_create /
 * rmsnorm_context_set_threads (then *ctx is untouched). */
RNPY_API rmsnorm_status thread_context(int threads, rmsnorm_context **ctx);

/* The thread count the calling thread's context was last set to (-1: it has
 * no context yet). For tests. */
RNPY_API int thread_context_threads();

/* ---- the output cache ----------------------------------------------------
 * Outputs of at least kCacheMinBytes are placed in blocks of whole 2 MiB
 * pages, mapped 2 MiB-aligned and advised onto transparent huge pages. A freed
 * block is kept, already faulted in, for the next output of about its size
 * (a block is reused for requests from its size down to 4/5 of it), so a loop
 * that makes and drops outputs of one shape touches no fresh page after its
 * first call. Kept blocks total at most the limit (default: 1 GiB or a quarter
 * of physical memory, whichever is smaller; the environment variable
 * RMSNORM_CACHE_LIMIT sets bytes, with an optional K, M or G suffix); the
 * least recently freed go first. */
constexpr std::size_t kCacheMinBytes = std::size_t(1) << 20;

struct Block;  // opaque: pass it back to block_free

/* A block of at least nbytes (nbytes >= kCacheMinBytes), its memory at
 * block_data() (2 MiB-aligned). @return NULL when memory is exhausted. */
RNPY_API Block *block_alloc(std::size_t nbytes);
RNPY_API void *block_data(const Block *b);
/* Gives a block back to the cache (or to the system, beyond the limit). */
RNPY_API void block_free(Block *b);

struct CacheInfo {
  std::size_t limit;        // most bytes of free blocks kept
  std::size_t cached_bytes; // bytes in free blocks now
  std::size_t cached_blocks;
  std::size_t live_bytes;   // bytes in blocks that back live outputs
  std::size_t live_blocks;
  std::uint64_t hits;       // allocations served from a free block
  std::uint64_t misses;     // allocations that mapped fresh memory
};
RNPY_API CacheInfo cache_info();
/* Sets the limit (bytes) and trims the free blocks to it; 0 keeps none (every
 * freed block goes back to the system). @return the previous limit. */
RNPY_API std::size_t cache_set_limit(std::size_t bytes);
/* Returns every free block to the system (live outputs are not affected). */
RNPY_API void cache_release();

}  // namespace rnpy

#endif
