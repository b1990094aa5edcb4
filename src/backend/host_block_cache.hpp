// The reuse policy of the pinned host memory pool, without CUDA types, so that the CPU tests
// exercise it (tests/core/test_host_block_cache.cpp); src/backend/cuda/runtime.cpp
// instantiates it with CUDA events as fences.
//
// A freed block enters the cache with one fence per stream whose asynchronous copies used it
// (recorded at the free point); it is handed out again only when every fence has completed,
// so a copy still reading or writing the block never sees it reused. Requests are rounded to
// size classes (steps of 1/8 of the power of two below, at least 4 KiB) and served by the
// smallest ready cached block of at least that class and at most twice it, so the last,
// smaller batch of an epoch reuses a full batch's block instead of pinning new memory. The
// cached (free) bytes are capped: past the cap, ready blocks are released, largest first;
// a block whose fences are still pending stays until they complete (the cap is then exceeded
// for that long, never violated by freeing memory a copy still uses).
//
// Not thread-safe: the owner locks.
#pragma once

#include <cstddef>
#include <functional>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

namespace dltrain::backend {

/// The pool's size class of an n-byte request (n > 0).
inline size_t host_block_class(size_t n) {
  if (n <= 4096) return 4096;
  const size_t p = size_t{1} << (63 - __builtin_clzll(n));
  const size_t step = p / 8 < 4096 ? 4096 : p / 8;
  return (n + step - 1) / step * step;
}

template <class Fence>
class HostBlockCache {
 public:
  struct Ops {
    std::function<bool(const Fence&)> done;  // has the fence completed?
    std::function<void(Fence&)> recycle;     // the fence is no longer needed
    std::function<void(void*)> release;      // give the block back to the system
  };

  HostBlockCache(Ops ops, size_t limit) : ops_(std::move(ops)), limit_(limit) {}
  HostBlockCache(const HostBlockCache&) = delete;
  HostBlockCache& operator=(const HostBlockCache&) = delete;

  /// A ready cached block for a request of class `cls`, or {nullptr, 0}; the second member is
  /// the block's own size (>= cls), which the caller gives back with it.
  std::pair<void*, size_t> take(size_t cls) {
    for (auto it = blocks_.lower_bound(cls); it != blocks_.end() && it->first <= 2 * cls; ++it) {
      if (!ready(it->second)) continue;
      const std::pair<void*, size_t> out{it->second.p, it->first};
      for (Fence& f : it->second.fences) ops_.recycle(f);
      cached_ -= it->first;
      blocks_.erase(it);
      return out;
    }
    return {nullptr, 0};
  }

  /// Caches a freed block of `size` bytes whose reuse waits for `fences`, then enforces the cap.
  void give(void* p, size_t size, std::vector<Fence> fences) {
    blocks_.emplace(size, Block{p, std::move(fences)});
    cached_ += size;
    trim(limit_);
  }

  /// Releases ready cached blocks, largest first, until at most `keep` bytes are cached (or
  /// only blocks with pending fences are left).
  void trim(size_t keep) {
    for (auto it = blocks_.end(); cached_ > keep && it != blocks_.begin();) {
      --it;
      if (!ready(it->second)) continue;
      for (Fence& f : it->second.fences) ops_.recycle(f);
      ops_.release(it->second.p);
      cached_ -= it->first;
      it = blocks_.erase(it);
    }
  }

  /// Waits for every fence with `wait` and releases every cached block (empty_cache).
  void clear(const std::function<void(const Fence&)>& wait) {
    for (auto& [size, b] : blocks_) {
      for (Fence& f : b.fences) {
        wait(f);
        ops_.recycle(f);
      }
      ops_.release(b.p);
    }
    blocks_.clear();
    cached_ = 0;
  }

  void set_limit(size_t bytes) {
    limit_ = bytes;
    trim(limit_);
  }
  size_t limit() const { return limit_; }
  /// Bytes of the blocks in the cache (freed, kept for reuse).
  size_t cached() const { return cached_; }
  size_t blocks() const { return blocks_.size(); }

 private:
  struct Block {
    void* p;
    std::vector<Fence> fences;
  };

  bool ready(const Block& b) const {
    for (const Fence& f : b.fences)
      if (!ops_.done(f)) return false;
    return true;
  }

  Ops ops_;
  size_t limit_;
  size_t cached_ = 0;
  std::multimap<size_t, Block> blocks_;
};

}  // namespace dltrain::backend
