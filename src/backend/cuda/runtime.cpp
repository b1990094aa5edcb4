// CUDA runtime glue: devices, streams, events, device memory, pinned host memory.
//
// device_count() never throws: without a driver (CI) cudaGetDeviceCount fails with
// "insufficient driver" and we report 0 devices, so a CUDA-enabled build runs CPU work
// anywhere. Device memory comes from each device's default stream-ordered pool
// (cudaMallocAsync) with its release threshold raised to "keep everything", so steady-state
// training never returns memory to the driver. memory_allocated counts the bytes of live
// blocks (the pool's own statistics count its reservations, not what tensors hold).
//
// Streams and memory (PyTorch's record_stream semantics):
// - A device block is freed on the stream it was allocated on (its "home"), which the block
//   keeps a share of, so a Stream::create stream outlives the blocks that will be freed on it.
// - record_stream(block, s) adds s to the block's users; at the free, the home stream waits
//   (on the GPU) for an event recorded on each user stream, then frees: the memory is handed
//   out again only after every stream that used it has passed the free point.
// - Pinned host blocks note the streams of the asynchronous copies that read or write them
//   (copy_ records them); at the free an event is recorded on each of those streams, and the
//   block is reused only when all have completed (HostBlockCache: size classes, a cap).
#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/runtime.hpp"
#include "src/backend/host_block_cache.hpp"

namespace dltrain::backend::cuda {

namespace {
constexpr int kMaxDevices = 64;
using dltrain::cuda::Stream;

struct DeviceState {
  std::once_flag init;
  cudaStream_t compute = nullptr;
  Stream compute_stream;  // a shared (non-owning) handle to `compute`, copied into blocks
  int sms = 0;
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
};
std::array<DeviceState, kMaxDevices>& devices() {
  static std::array<DeviceState, kMaxDevices> d;
  return d;
}

// The thread's current stream per device; an empty handle means the device's compute stream.
// Holding the Stream (not the raw handle) keeps a Stream::create stream alive while current.
thread_local std::array<Stream, kMaxDevices> tls_stream{};

cudaStream_t raw(const Stream& s) { return static_cast<cudaStream_t>(s.handle()); }

void check_device(int dev) {
  const int n = device_count();
  DLTRAIN_CHECK(dev >= 0 && dev < n, "CUDA device ", dev, " does not exist: ", n,
                " device(s) are visible",
                n == 0 ? " (no GPU or no driver on this machine); use Device::cpu()" : "");
  DLTRAIN_CHECK(dev < kMaxDevices, "dltrain supports at most ", kMaxDevices, " CUDA devices");
}

DeviceState& state(int dev) {
  check_device(dev);
  DeviceState& s = devices()[dev];
  std::call_once(s.init, [dev, &s] {
    Guard g(dev);
    cudaMemPool_t pool;
    DLTRAIN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t threshold = UINT64_MAX;
    DLTRAIN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    DLTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&s.compute, cudaStreamNonBlocking));
    DLTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&s.sms, cudaDevAttrMultiProcessorCount, dev));
    s.compute_stream = Stream::external(s.compute, dev);
  });
  return s;
}

int resolve(int device) { return device < 0 ? dltrain::cuda::current_device() : device; }

// The calling thread's current stream on `dev` as a shared handle.
Stream current(int dev) {
  DeviceState& s = state(dev);
  const Stream& t = tls_stream[dev];
  return t.handle() != nullptr ? t : s.compute_stream;
}

// Clears the error a failed call in a deleter left behind, so that it does not surface as the
// error of an unrelated later call (deleters cannot throw).
void clear_if(cudaError_t e) {
  if (e != cudaSuccess) (void)cudaGetLastError();
}

// Makes `dev` current without throwing (deleters); restores the previous device.
class QuietGuard {
 public:
  explicit QuietGuard(int dev) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != dev) clear_if(cudaSetDevice(dev));
  }
  ~QuietGuard() {
    if (previous_ >= 0) clear_if(cudaSetDevice(previous_));
  }
  QuietGuard(const QuietGuard&) = delete;
  QuietGuard& operator=(const QuietGuard&) = delete;

 private:
  int previous_ = -1;
};

// Serialises record_stream calls (their lists are read only by the deleter, after the last
// owner is gone).
std::mutex& uses_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

// Adds `s` to `uses` unless it is `home` or already there.
void add_use(std::vector<Stream>& uses, const Stream* home, const Stream& s) {
  std::lock_guard<std::mutex> lock(uses_mutex());
  if (home != nullptr && *home == s) return;
  for (const Stream& u : uses)
    if (u == s) return;
  uses.push_back(s);
}

// The deleter of a device block: waits (on the GPU) for the streams that used the block, then
// frees it on its home stream.
struct DeviceBlock {
  int dev;
  size_t nbytes;
  Stream home;
  std::vector<Stream> uses;

  void operator()(void* p) noexcept {
    devices()[dev].allocated.fetch_sub(static_cast<int64_t>(nbytes));
    if (!uses.empty()) {
      QuietGuard g(dev);
      for (const Stream& u : uses) {
        cudaEvent_t e = nullptr;
        if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess &&
            cudaEventRecord(e, raw(u)) == cudaSuccess &&
            cudaStreamWaitEvent(raw(home), e, 0) == cudaSuccess) {
          cudaEventDestroy(e);  // the wait keeps what it needs
          continue;
        }
        (void)cudaGetLastError();
        if (e != nullptr) cudaEventDestroy(e);
        clear_if(cudaStreamSynchronize(raw(u)));  // no event: order by waiting on the host
      }
    }
    clear_if(cudaFreeAsync(p, raw(home)));
  }
};

// --- pinned host memory ---------------------------------------------------------------
struct PinnedFence {
  cudaEvent_t event;
  int device;  // an event records only on its own device's streams
};

size_t pinned_limit_from_env() {
  const char* env = std::getenv("DLTRAIN_PINNED_CACHE_MB");
  if (env == nullptr) return size_t{2} << 30;
  try {
    size_t pos = 0;
    const unsigned long long mb = std::stoull(env, &pos);
    if (pos == std::string(env).size()) return static_cast<size_t>(mb) << 20;
  } catch (const std::exception&) {
  }
  DLTRAIN_FAIL("DLTRAIN_PINNED_CACHE_MB='", env,
               "' is not a number of MiB; unset it or set e.g. 2048 (0 disables the cache)");
}

struct PinnedPool {
  std::mutex mu;
  std::map<int, std::vector<cudaEvent_t>> spare_events;  // per device
  HostBlockCache<PinnedFence> cache;
  size_t in_use = 0;  // bytes of pinned blocks held by live tensors

  PinnedPool()
      : cache({[](const PinnedFence& f) {
                 const cudaError_t e = cudaEventQuery(f.event);
                 clear_if(e);  // "not ready" is not an error
                 return e == cudaSuccess;
               },
               [this](PinnedFence& f) { spare_events[f.device].push_back(f.event); },
               [](void* p) { clear_if(cudaFreeHost(p)); }},
              pinned_limit_from_env()) {}

  // An event on `dev` for a fence (a spare one when there is one); null when none can be made.
  cudaEvent_t event_on(int dev) {
    auto& spare = spare_events[dev];
    if (!spare.empty()) {
      cudaEvent_t e = spare.back();
      spare.pop_back();
      return e;
    }
    QuietGuard g(dev);
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return e;
  }
};
PinnedPool& pinned_pool() {
  static auto* p = new PinnedPool;  // never destroyed: blocks may come back during exit
  return *p;
}

// The deleter of a pinned block: fences its reuse on every stream that copied from or to it.
struct PinnedBlock {
  size_t size;
  std::vector<Stream> uses;

  void operator()(void* p) noexcept {
    PinnedPool& pool = pinned_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    pool.in_use -= size;
    std::vector<PinnedFence> fences;
    fences.reserve(uses.size());
    for (const Stream& u : uses) {
      cudaEvent_t e = pool.event_on(u.device());
      if (e != nullptr && cudaEventRecord(e, raw(u)) == cudaSuccess) {
        fences.push_back({e, u.device()});
        continue;
      }
      (void)cudaGetLastError();
      if (e != nullptr) pool.spare_events[u.device()].push_back(e);
      clear_if(cudaStreamSynchronize(raw(u)));  // no fence: wait for the stream instead
    }
    try {
      pool.cache.give(p, size, std::move(fences));
    } catch (...) {  // bad_alloc of the cache's node: give the block back instead
      clear_if(cudaFreeHost(p));
    }
  }
};

}  // namespace

bool compiled() { return true; }

int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky error of a driverless machine
      return 0;
    }
    return n;
  }();
  return count;
}

cudaStream_t stream(int device) {
  DeviceState& s = state(device);
  cudaStream_t t = raw(tls_stream[device]);
  return t ? t : s.compute;
}

Guard::Guard(int device) : previous_(-1) {
  int cur = 0;
  DLTRAIN_CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != device) {
    DLTRAIN_CUDA_CHECK(cudaSetDevice(device));
    previous_ = cur;
  }
}
Guard::~Guard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

int sm_count(int device) { return state(device).sms; }

std::shared_ptr<void> allocate(size_t nbytes, Device device) {
  DeviceState& st = state(device.index);
  Guard g(device.index);
  Stream home = current(device.index);
  void* p = nullptr;
  const cudaError_t err = cudaMallocAsync(&p, nbytes == 0 ? 1 : nbytes, raw(home));
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw OutOfMemoryError(::dltrain::detail::cat(
        "CUDA out of memory on ", device, ": tried to allocate ", nbytes, " bytes; tensors hold ",
        st.allocated.load(), " bytes (peak ", st.peak.load(), "), the device has ", free_b, " of ",
        total_b,
        " bytes free; reduce the batch size, or train in mixed precision (amp::autocast with f16 "
        "or bf16 halves activation memory; --amp in the examples)"));
  }
  DLTRAIN_CUDA_CHECK(err);
  const int64_t now =
      st.allocated.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  int64_t peak = st.peak.load();
  while (now > peak && !st.peak.compare_exchange_weak(peak, now)) {
  }
  // Should the control block's allocation throw, shared_ptr runs the deleter on p.
  return std::shared_ptr<void>(p, DeviceBlock{device.index, nbytes, std::move(home), {}});
}

std::shared_ptr<void> allocate_pinned(size_t nbytes) {
  DLTRAIN_CHECK(device_count() > 0,
                "pinned host memory needs a CUDA device; none is visible on this machine");
  const size_t cls = host_block_class(nbytes == 0 ? 1 : nbytes);
  PinnedPool& pool = pinned_pool();
  std::pair<void*, size_t> got{nullptr, 0};
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    got = pool.cache.take(cls);
    if (got.first != nullptr) pool.in_use += got.second;
  }
  if (got.first == nullptr) {
    void* p = nullptr;
    cudaError_t err = cudaHostAlloc(&p, cls, cudaHostAllocDefault);
    if (err == cudaErrorMemoryAllocation) {  // give the cache back and try once more
      (void)cudaGetLastError();
      {
        std::lock_guard<std::mutex> lock(pool.mu);
        pool.cache.trim(0);
      }
      err = cudaHostAlloc(&p, cls, cudaHostAllocDefault);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      std::lock_guard<std::mutex> lock(pool.mu);
      const std::string msg = ::dltrain::detail::cat(
          "cudaHostAlloc of ", cls, " bytes of pinned memory failed: ", cudaGetErrorString(err),
          " (", pool.in_use, " bytes pinned by live tensors, ", pool.cache.cached(),
          " cached); lower num_workers/prefetch_factor or pin less");
      if (err == cudaErrorMemoryAllocation) throw OutOfMemoryError(msg);
      throw Error(msg);
    }
    got = {p, cls};
    std::lock_guard<std::mutex> lock(pool.mu);
    pool.in_use += cls;
  }
  return std::shared_ptr<void>(got.first, PinnedBlock{got.second, {}});
}

void record_stream(const std::shared_ptr<void>& block, const Stream& s) {
  if (auto* d = std::get_deleter<DeviceBlock>(block)) {
    DLTRAIN_CHECK(s.device() == d->dev, "record_stream: the stream is on cuda:", s.device(),
                  " but the tensor's memory on cuda:", d->dev,
                  "; record a stream of the tensor's own device");
    add_use(d->uses, &d->home, s);
  } else if (auto* h = std::get_deleter<PinnedBlock>(block)) {
    add_use(h->uses, nullptr, s);
  }
  // Other memory (wrapped from elsewhere) is its owner's to keep alive.
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
                bool async) {
  if (nbytes == 0) return;
  const cudaMemcpyKind kind = dst_device.is_cpu()   ? cudaMemcpyDeviceToHost
                              : src_device.is_cpu() ? cudaMemcpyHostToDevice
                                                    : cudaMemcpyDeviceToDevice;
  const int dev = dst_device.is_cuda() ? dst_device.index : src_device.index;
  Guard g(dev);
  cudaStream_t s = stream(dev);
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    // Order the copy after the source device's pending work too.
    DLTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream(src_device.index)));
  }
  DLTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, s));
  if (!async) DLTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace dltrain::backend::cuda

// --- the public API (dltrain/backend/cuda.hpp) -----------------------------------------
namespace dltrain::cuda {

namespace bk = dltrain::backend::cuda;

bool is_available() { return bk::device_count() > 0; }
int device_count() { return bk::device_count(); }

int current_device() {
  if (bk::device_count() == 0) return 0;
  int d = 0;
  DLTRAIN_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int device) {
  bk::check_device(device);
  DLTRAIN_CUDA_CHECK(cudaSetDevice(device));
}

void synchronize(int device) {
  const int d = bk::resolve(device);
  bk::check_device(d);
  bk::Guard g(d);
  DLTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
}

DeviceGuard::DeviceGuard(int device) : previous_(current_device()) {
  bk::check_device(device);  // throws on a machine without devices too (current_device() is 0)
  if (device != previous_) DLTRAIN_CUDA_CHECK(cudaSetDevice(device));
}
DeviceGuard::~DeviceGuard() {
  if (bk::device_count() > 0) cudaSetDevice(previous_);
}

Stream Stream::create(int device, bool high_priority) {
  const int d = bk::resolve(device);
  bk::state(d);
  bk::Guard g(d);
  int lo = 0, hi = 0;
  DLTRAIN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t s = nullptr;
  DLTRAIN_CUDA_CHECK(
      cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high_priority ? hi : lo));
  Stream out;
  out.handle_ =
      std::shared_ptr<void>(s, [](void* p) { cudaStreamDestroy(static_cast<cudaStream_t>(p)); });
  out.device_ = d;
  return out;
}

Stream Stream::compute(int device) { return bk::state(bk::resolve(device)).compute_stream; }

void Stream::synchronize() const {
  DLTRAIN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle())));
}

bool Stream::query() const {
  const cudaError_t e = cudaStreamQuery(static_cast<cudaStream_t>(handle()));
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  DLTRAIN_CUDA_CHECK(e);
  return true;
}

Stream Stream::external(void* cuda_stream, int device) {
  bk::check_device(device);
  Stream out;
  out.handle_ = std::shared_ptr<void>(cuda_stream, [](void*) {});
  out.device_ = device;
  return out;
}

Stream current_stream(int device) { return bk::current(bk::resolve(device)); }

void set_current_stream(const Stream& s) {
  bk::check_device(s.device());
  const bool compute = s.handle() == bk::state(s.device()).compute;
  bk::tls_stream[s.device()] = compute ? Stream() : s;
}

void record_stream(const Tensor& t, const Stream& s) {
  DLTRAIN_CHECK(t.defined(), "record_stream: the tensor is undefined");
  DLTRAIN_CHECK(t.device().is_cuda() || t.is_pinned(), "record_stream: the tensor is on ",
                t.device(),
                " in pageable memory, which no stream reads asynchronously; record_stream is for "
                "CUDA tensors (and pinned host tensors)");
  DLTRAIN_CHECK(s.handle() != nullptr, "record_stream: the stream is empty");
  bk::record_stream(t.storage().block(), s);
}

StreamGuard::StreamGuard(const Stream& s)
    : previous_(current_stream(s.device())), device_(s.device()) {
  set_current_stream(s);
}
StreamGuard::~StreamGuard() { set_current_stream(previous_); }

Event::Event(bool timing) {
  DLTRAIN_CHECK(bk::device_count() > 0, "cuda::Event needs a CUDA device; none is visible");
  device_ = current_device();
  cudaEvent_t e = nullptr;
  DLTRAIN_CUDA_CHECK(
      cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  handle_ =
      std::shared_ptr<void>(e, [](void* p) { cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
}

void Event::record() { record(current_stream(device_)); }
void Event::record(const Stream& s) {
  DLTRAIN_CUDA_CHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(handle()), static_cast<cudaStream_t>(s.handle())));
}
void Event::wait(const Stream& s) const {
  DLTRAIN_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(s.handle()),
                                         static_cast<cudaEvent_t>(handle()), 0));
}
void Event::synchronize() const {
  DLTRAIN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle())));
}
bool Event::query() const {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(handle()));
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  DLTRAIN_CUDA_CHECK(e);
  return true;
}
float Event::elapsed_ms(const Event& end) const {
  float ms = 0;
  DLTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle()),
                                          static_cast<cudaEvent_t>(end.handle())));
  return ms;
}

size_t memory_allocated(int device) {
  if (bk::device_count() == 0) return 0;
  return static_cast<size_t>(bk::state(bk::resolve(device)).allocated.load());
}
size_t max_memory_allocated(int device) {
  if (bk::device_count() == 0) return 0;
  return static_cast<size_t>(bk::state(bk::resolve(device)).peak.load());
}
void reset_peak_memory_stats(int device) {
  if (bk::device_count() == 0) return;
  auto& s = bk::state(bk::resolve(device));
  s.peak.store(s.allocated.load());
}
size_t memory_reserved(int device) {
  if (bk::device_count() == 0) return 0;
  const int d = bk::resolve(device);
  bk::state(d);
  cudaMemPool_t pool;
  DLTRAIN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, d));
  uint64_t v = 0;
  DLTRAIN_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v));
  return static_cast<size_t>(v);
}
void empty_cache(int device) {
  if (bk::device_count() == 0) return;
  const int d = bk::resolve(device);
  bk::state(d);
  bk::Guard g(d);
  DLTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  cudaMemPool_t pool;
  DLTRAIN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, d));
  DLTRAIN_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  bk::PinnedPool& pp = bk::pinned_pool();
  std::lock_guard<std::mutex> lock(pp.mu);
  pp.cache.clear([](const bk::PinnedFence& f) { bk::clear_if(cudaEventSynchronize(f.event)); });
}

size_t pinned_memory_allocated() {
  if (bk::device_count() == 0) return 0;
  bk::PinnedPool& pp = bk::pinned_pool();
  std::lock_guard<std::mutex> lock(pp.mu);
  return pp.in_use;
}
size_t pinned_memory_cached() {
  if (bk::device_count() == 0) return 0;
  bk::PinnedPool& pp = bk::pinned_pool();
  std::lock_guard<std::mutex> lock(pp.mu);
  return pp.cache.cached();
}
void set_pinned_cache_limit(size_t bytes) {
  if (bk::device_count() == 0) return;
  bk::PinnedPool& pp = bk::pinned_pool();
  std::lock_guard<std::mutex> lock(pp.mu);
  pp.cache.set_limit(bytes);
}

}  // namespace dltrain::cuda
