// CPU allocation for Storage (with the block cache); CUDA allocation is delegated to the
// backend.
#include "dltrain/core/storage.hpp"

#include <malloc.h>
#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "dltrain/core/error.hpp"
#include "dltrain/core/memory.hpp"
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/core/env_switch.hpp"

namespace dltrain {

namespace {

constexpr std::align_val_t kAlign{64};
constexpr size_t kCacheMin = size_t{256} << 10;

// Size classes: a multiple of 1/8 of the largest power of two <= n (at least 64 KiB), so a
// block serves any request that rounds to its class and waste stays under 12.5%.
size_t size_class(size_t n) {
  size_t p = size_t{1} << (63 - __builtin_clzll(n));
  size_t step = std::max<size_t>(p / 8, size_t{64} << 10);
  return (n + step - 1) / step * step;
}

void* raw_alloc(size_t n) {
  try {
    return ::operator new(n, kAlign);
  } catch (const std::bad_alloc&) {
    DLTRAIN_FAIL("out of CPU memory: could not allocate ", n,
                 " bytes; reduce the batch size or the model size");
  }
}

struct BlockCache {
  std::mutex mu;
  std::multimap<size_t, void*> blocks;  // class size -> free block
  size_t cached = 0;
  size_t limit = size_t{2} << 30;

  BlockCache() {
    if (const char* env = std::getenv("DLTRAIN_CPU_CACHE_MB")) {
      try {
        limit = static_cast<size_t>(std::stoull(env)) << 20;
      } catch (const std::exception&) {
        DLTRAIN_FAIL("DLTRAIN_CPU_CACHE_MB='", env,
                     "' is not a number of MiB; unset it or set e.g. 2048 (0 disables the cache)");
      }
    }
  }

  void* take(size_t cls) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = blocks.find(cls);
    if (it == blocks.end()) return nullptr;
    void* p = it->second;
    blocks.erase(it);
    cached -= cls;
    return p;
  }

  void give(void* p, size_t cls) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (cached + cls <= limit) {
        blocks.emplace(cls, p);
        cached += cls;
        return;
      }
    }
    ::operator delete(p, kAlign);
  }

  void trim(size_t keep) {
    std::lock_guard<std::mutex> lock(mu);
    while (cached > keep && !blocks.empty()) {
      auto it = std::prev(blocks.end());  // largest first
      ::operator delete(it->second, kAlign);
      cached -= it->first;
      blocks.erase(it);
    }
  }
};

// Never destroyed: storages freed during static destruction still find it.
BlockCache& cache() {
  static BlockCache* c = new BlockCache();
  return *c;
}

// Scratch memory that is not a Storage (Eigen's GEMM packing buffers, im2col columns) comes
// from malloc, one allocation per call. With glibc's defaults, blocks over the (dynamic) mmap
// threshold are mmapped and unmapped every call and the heap top is trimmed, so each training
// step page-faults hundreds of MB of fresh memory (measured: ~145k faults per ResNet-50 step).
// Raising both thresholds once keeps those blocks in the heap for reuse. Process-wide; set
// DLTRAIN_MALLOC_TUNING=0 to keep the C library's defaults.
struct MallocTuning {
  MallocTuning() {
    if (!detail::env_switch_on("DLTRAIN_MALLOC_TUNING")) return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
};
const MallocTuning malloc_tuning;

// Version counters come from slabs of their own rather than one small heap object per
// tensor between the activation blocks: interleaved with them, small objects fragment the
// heap (measured: +28 MiB peak on a ResNet-50 step with one make_shared per Storage). A slab
// holds 1024 nodes; freed nodes go to a free list and slabs are kept for reuse.
class NodePool {
 public:
  void* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (node_ == 0) node_ = std::max(bytes, sizeof(void*));
    if (bytes > node_) return ::operator new(bytes);  // not the size the pool serves
    if (free_ == nullptr) {
      auto slab = std::make_unique<unsigned char[]>(node_ * kPerSlab);
      for (size_t i = 0; i < kPerSlab; ++i) push(slab.get() + i * node_);
      slabs_.push_back(std::move(slab));
    }
    void* p = free_;
    free_ = *static_cast<void**>(free_);
    return p;
  }
  void give(void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > node_) return ::operator delete(p);
    push(p);
  }

 private:
  static constexpr size_t kPerSlab = 1024;
  void push(void* p) {
    *static_cast<void**>(p) = free_;
    free_ = p;
  }
  std::mutex mu_;
  size_t node_ = 0;
  void* free_ = nullptr;
  std::vector<std::unique_ptr<unsigned char[]>> slabs_;
};

NodePool& counter_pool() {
  static NodePool* pool = new NodePool;  // never destroyed: storages may outlive statics
  return *pool;
}

// The allocator std::allocate_shared uses for a VersionCounter and its control block.
template <class T>
struct CounterAllocator {
  using value_type = T;
  CounterAllocator() = default;
  template <class U>
  CounterAllocator(const CounterAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) { return static_cast<T*>(counter_pool().take(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { counter_pool().give(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const CounterAllocator<U>&) const {
    return true;
  }
};

// Bytes of live CPU tensors (requested sizes, not size classes) and their peak: one relaxed
// add per allocation and per free, plus a compare-exchange only when a new peak is reached.
std::atomic<int64_t> cpu_allocated{0};
std::atomic<int64_t> cpu_peak{0};

void count_alloc(size_t nbytes) {
  const int64_t now =
      cpu_allocated.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed) +
      static_cast<int64_t>(nbytes);
  int64_t peak = cpu_peak.load(std::memory_order_relaxed);
  while (now > peak && !cpu_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
void count_free(size_t nbytes) {
  cpu_allocated.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
}

}  // namespace

template <class Deleter>
void Storage::adopt(void* data, Deleter deleter) {
  data_ = std::shared_ptr<void>(data, std::move(deleter));  // frees data if this throws
  version_ = std::allocate_shared<VersionCounter>(CounterAllocator<VersionCounter>());
}

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device.is_cpu()) {
    if (nbytes < kCacheMin) {
      adopt(raw_alloc(nbytes == 0 ? 1 : nbytes), [nbytes](void* q) {
        ::operator delete(q, kAlign);
        count_free(nbytes);
      });
      count_alloc(nbytes);
      return;
    }
    const size_t cls = size_class(nbytes);
    void* p = cache().take(cls);
    if (p == nullptr) p = raw_alloc(cls);
    adopt(p, [cls, nbytes](void* q) {
      cache().give(q, cls);
      count_free(nbytes);
    });
    count_alloc(nbytes);
  } else {
    data_ = backend::cuda::allocate(nbytes, device);
    version_ = std::allocate_shared<VersionCounter>(CounterAllocator<VersionCounter>());
  }
}

Storage Storage::pinned(size_t nbytes) {
  Storage s;
  s.data_ = backend::cuda::allocate_pinned(nbytes);
  s.version_ = std::allocate_shared<VersionCounter>(CounterAllocator<VersionCounter>());
  s.nbytes_ = nbytes;
  s.device_ = Device::cpu();
  s.pinned_ = true;
  return s;
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : nbytes_(nbytes), device_(device) {
  adopt(data, std::move(deleter));
}

size_t memory_allocated(Device device) {
  if (device.is_cuda()) return cuda::memory_allocated(device.index);
  return static_cast<size_t>(cpu_allocated.load(std::memory_order_relaxed));
}

size_t max_memory_allocated(Device device) {
  if (device.is_cuda()) return cuda::max_memory_allocated(device.index);
  return static_cast<size_t>(cpu_peak.load(std::memory_order_relaxed));
}

void reset_peak_memory_stats(Device device) {
  if (device.is_cuda()) return cuda::reset_peak_memory_stats(device.index);
  cpu_peak.store(cpu_allocated.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

size_t cpu_cached_bytes() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return cache().cached;
}

void cpu_empty_cache() { cache().trim(0); }

void set_cpu_cache_limit(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(cache().mu);
    cache().limit = bytes;
  }
  cache().trim(bytes);
}

}  // namespace dltrain
