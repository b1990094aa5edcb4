// Storage: a reference-counted, 64-byte-aligned buffer on one device.
//
// Tensors are views over a Storage (shape, strides, offset); several tensors
// may share one. The buffer is released when the last owner goes away. CPU blocks
// of 256 KiB and more go back to a size-class cache and are reused by the next
// allocation of the same class (training allocates the same activation sizes every
// step; without the cache each step pays page faults on fresh memory); smaller
// blocks come from aligned operator new. CUDA memory comes from the backend's
// stream-ordered pool (a build without CUDA raises a clear error instead).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "dltrain/core/device.hpp"

namespace dltrain {

/// How many times a buffer's contents were changed in place, and by what. Shared by every
/// tensor over the buffer (views, detach()ed copies), as PyTorch's version counter is shared by
/// a tensor and its views. Autograd records the version of each tensor a backward function
/// saved and refuses to run it when the version moved (docs/design.md, "Version counter").
struct VersionCounter {
  std::atomic<uint64_t> count{0};
  /// The op of the last change ("add_", "copy_", ...; a string literal), or null.
  std::atomic<const char*> writer{nullptr};
};

/// A shared byte buffer on a device.
class Storage {
 public:
  Storage() = default;
  /// Allocates `nbytes` on `device` (uninitialised). Throws dltrain::Error on failure.
  Storage(size_t nbytes, Device device);
  /// Wraps memory owned elsewhere; `deleter` runs when the last owner goes.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);

  /// Page-locked host memory (CPU device) from the CUDA backend's pool: host<->device copies
  /// from it run asynchronously. Throws when no CUDA device is visible.
  static Storage pinned(size_t nbytes);

  void* data() const { return data_.get(); }
  /// True for page-locked host memory from Storage::pinned.
  bool is_pinned() const { return pinned_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool defined() const { return data_ != nullptr || nbytes_ == 0; }
  /// The shared owner of the buffer (backends attach stream uses to it: cuda::record_stream).
  const std::shared_ptr<void>& block() const { return data_; }
  /// Number of owners of the buffer (for tests of view sharing).
  long use_count() const { return data_.use_count(); }

  /// Storage handles sharing this buffer (one per tensor over it: views, detach()ed copies),
  /// unlike use_count, which also counts backends' references to the block.
  long share_count() const { return version_.use_count(); }
  /// The buffer's version counter (null for a default-constructed Storage).
  VersionCounter* version_counter() const { return version_.get(); }
  /// Changes so far (0 for a new buffer).
  uint64_t version() const {
    return version_ ? version_->count.load(std::memory_order_relaxed) : 0;
  }
  /// Records a change of the contents by `op` (a string literal): every in-place op, copy_ and
  /// fill_ calls it, whatever the grad mode, and so must code that writes through data_ptr().
  void bump_version(const char* op) const {
    if (!version_) return;
    version_->writer.store(op, std::memory_order_relaxed);
    version_->count.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  /// Owns `data` (freed by `deleter` with the last Storage) and gives it a fresh version
  /// counter, taken from a slab pool rather than the heap between activation blocks
  /// (storage.cpp).
  template <class Deleter>
  void adopt(void* data, Deleter deleter);

  std::shared_ptr<void> data_;
  std::shared_ptr<VersionCounter> version_;
  size_t nbytes_ = 0;
  Device device_;
  bool pinned_ = false;
};

/// Bytes currently held in the CPU block cache (freed blocks kept for reuse).
size_t cpu_cached_bytes();
/// Returns every cached CPU block to the system.
void cpu_empty_cache();
/// Caps the CPU block cache (default 2 GiB, or DLTRAIN_CPU_CACHE_MB); 0 disables caching.
void set_cpu_cache_limit(size_t bytes);

}  // namespace dltrain
