/* runtime.cpp - per-thread contexts and the cache of large output blocks
 * (see runtime.h for the contracts). */
#include "runtime.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string_view>
#include <utility>
#include <vector>

namespace rnpy {

/* ---- contexts ------------------------------------------------------------ */

namespace {

/* A forked child keeps the forking thread's context: the library's atfork
 * handlers leave it unlocked and its pool starts new workers when needed. */
struct ThreadContext {
  rmsnorm_context *ctx = nullptr;
  int threads = -1;  // what rmsnorm_context_set_threads was last given
  ~ThreadContext() { rmsnorm_context_free(ctx); }
};

thread_local ThreadContext t_context;

}  // namespace

rmsnorm_status thread_context(int threads, rmsnorm_context **out) {
  ThreadContext &tc = t_context;
  if (!tc.ctx) {
    rmsnorm_context *c = nullptr;
    rmsnorm_status st = rmsnorm_context_create(&c);
    if (st != RMSNORM_OK) return st;
    tc.ctx = c;
  }
  if (threads != tc.threads) {
    rmsnorm_status st = rmsnorm_context_set_threads(tc.ctx, threads);
    if (st != RMSNORM_OK) return st;
    tc.threads = threads;
  }
  *out = tc.ctx;
  return RMSNORM_OK;
}

int thread_context_threads() { return t_context.ctx ? t_context.threads : -1; }

/* ---- the output cache ------------------------------------------------------ */

struct Block {
  void *data;       // 2 MiB-aligned
  std::size_t size; // a multiple of 2 MiB
};

namespace {

constexpr std::size_t kHuge = std::size_t(2) << 20;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

/* "123", "512M", "1G", "64k": bytes. @return false for anything else. */
bool parse_bytes(const char *s, std::size_t *out) {
  char *end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || errno) return false;
  unsigned shift = 0;
  switch (std::toupper(static_cast<unsigned char>(*end))) {
    case 0: break;
    case 'K': shift = 10; ++end; break;
    case 'M': shift = 20; ++end; break;
    case 'G': shift = 30; ++end; break;
    default: return false;
  }
  if (*end != 0 && !(std::toupper(static_cast<unsigned char>(*end)) == 'B' && end[1] == 0))
    return false;
  if (shift && v > (~0ull >> shift)) return false;
  *out = static_cast<std::size_t>(v << shift);
  return true;
}

std::size_t default_limit() {
  std::size_t limit = std::size_t(1) << 30;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) limit = std::min(limit, std::size_t(pages) * std::size_t(page) / 4);
  const char *env = std::getenv("RMSNORM_CACHE_LIMIT");
  std::size_t v;
  if (env && *env && parse_bytes(env, &v)) limit = v;
  return limit;
}

bool huge_pages_wanted() {
  const char *env = std::getenv("RMSNORM_NO_HUGEPAGES");
  return !(env && *env && std::string_view(env) != "0");
}

/* Maps size bytes (a multiple of 2 MiB) at a 2 MiB-aligned address. */
void *map_aligned(std::size_t size) {
  std::size_t span = size + kHuge;
  void *p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto base = reinterpret_cast<std::uintptr_t>(p);
  std::uintptr_t aligned = (base + kHuge - 1) & ~(std::uintptr_t(kHuge) - 1);
  std::size_t head = aligned - base, tail = span - head - size;
  if (head) munmap(p, head);
  if (tail) munmap(reinterpret_cast<void *>(aligned + size), tail);
  return reinterpret_cast<void *>(aligned);
}

class Cache {
 public:
  Cache() : limit_(default_limit()), huge_(huge_pages_wanted()) {}

  Block *alloc(std::size_t nbytes) {
    std::size_t size = round_up(std::max(nbytes, kCacheMinBytes), kHuge);
    {
      std::lock_guard<std::mutex> lock(mu_);
      // the smallest free block that fits without wasting more than a fifth
      std::size_t best = free_.size();
      for (std::size_t i = 0; i < free_.size(); i++) {
        std::size_t s = free_[i]->size;
        if (s >= size && s - size <= std::max(kHuge, s / 5) &&
            (best == free_.size() || s < free_[best]->size))
          best = i;
      }
      if (best != free_.size()) {
        Block *b = free_[best];
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
        cached_bytes_ -= b->size;
        live_bytes_ += b->size;
        live_blocks_++;
        hits_++;
        return b;
      }
    }
    void *p = map_aligned(size);
    if (!p) {  // give the cached blocks back and try once more
      release();
      p = map_aligned(size);
      if (!p) return nullptr;
    }
    if (huge_) madvise(p, size, MADV_HUGEPAGE);  // advice: failure is harmless
    Block *b = new (std::nothrow) Block{p, size};
    if (!b) {
      munmap(p, size);
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(mu_);
    live_bytes_ += size;
    live_blocks_++;
    misses_++;
    return b;
  }

  void free(Block *b) {
    evicting([&](std::vector<Block *> &evicted) {
      live_bytes_ -= b->size;
      live_blocks_--;
      if (b->size <= limit_) {
        free_.push_back(b);  // most recently freed last
        cached_bytes_ += b->size;
        trim_locked(&evicted);
      } else {
        evicted.push_back(b);
      }
    });
  }

  std::size_t set_limit(std::size_t bytes) {
    std::size_t old = 0;
    evicting([&](std::vector<Block *> &evicted) {
      old = std::exchange(limit_, bytes);
      trim_locked(&evicted);
    });
    return old;
  }

  void release() {
    evicting([&](std::vector<Block *> &evicted) {
      evicted.swap(free_);
      cached_bytes_ = 0;
    });
  }

  CacheInfo info() {
    std::lock_guard<std::mutex> lock(mu_);
    return CacheInfo{limit_, cached_bytes_, free_.size(), live_bytes_, live_blocks_, hits_,
                     misses_};
  }

  // fork(): the child must not inherit the mutex locked by another thread.
  void lock() { mu_.lock(); }
  void unlock() { mu_.unlock(); }

 private:
  /* Runs f(evicted) with the lock held, then unmaps the blocks it evicted (unlocked). */
  template <class F>
  void evicting(F &&f) {
    std::vector<Block *> evicted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      f(evicted);
    }
    unmap(evicted);
  }

  void trim_locked(std::vector<Block *> *evicted) {
    std::size_t drop = 0;
    while (cached_bytes_ > limit_ && drop < free_.size()) cached_bytes_ -= free_[drop++]->size;
    auto kept = free_.begin() + static_cast<std::ptrdiff_t>(drop);
    evicted->insert(evicted->end(), free_.begin(), kept);
    free_.erase(free_.begin(), kept);
  }

  static void unmap(const std::vector<Block *> &blocks) {
    for (Block *b : blocks) {
      munmap(b->data, b->size);
      delete b;
    }
  }

  std::mutex mu_;
  std::vector<Block *> free_;
  std::size_t limit_;
  bool huge_;
  std::size_t cached_bytes_ = 0, live_bytes_ = 0, live_blocks_ = 0;
  std::uint64_t hits_ = 0, misses_ = 0;
};

/* Never destroyed: outputs may be freed during interpreter shutdown, after
 * static destructors would have run. */
Cache &cache() {
  static Cache *c = new Cache();
  return *c;
}

struct AtFork {
  AtFork() {
    cache();
    pthread_atfork([] { cache().lock(); }, [] { cache().unlock(); }, [] { cache().unlock(); });
  }
} g_at_fork;

}  // namespace

Block *block_alloc(std::size_t nbytes) { return cache().alloc(nbytes); }
void *block_data(const Block *b) { return b->data; }
void block_free(Block *b) {
  if (b) cache().free(b);
}
CacheInfo cache_info() { return cache().info(); }
std::size_t cache_set_limit(std::size_t bytes) { return cache().set_limit(bytes); }
void cache_release() { cache().release(); }

}  // namespace rnpy
