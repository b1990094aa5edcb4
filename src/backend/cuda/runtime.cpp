// CUDA runtime glue: devices, streams, events, device memory, pinned host memory.
//
// device_count() never throws: without a driver (CI) cudaGetDeviceCount fails with
// "insufficient driver" and we report 0 devices, so a CUDA-enabled build runs CPU work
// anywhere. Device memory comes from each device's default stream-ordered pool
// (cudaMallocAsync) with its release threshold raised to "keep everything", so steady-state
// training never returns memory to the driver; a block is freed on the stream it was
// allocated on. memory_allocated counts the bytes of live blocks (the pool's own
// statistics count its reservations, not what tensors hold). Pinned host blocks are kept
// in a size-class cache; a freed block is reused only once the work enqueued on the
// current stream when it was freed (its async copy) has completed.
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "dltrain/backend/cuda.hpp"
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/runtime.hpp"

namespace dltrain::backend::cuda {

namespace {
constexpr int kMaxDevices = 64;

struct DeviceState {
  std::once_flag init;
  cudaStream_t compute = nullptr;
  int sms = 0;
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
};
std::array<DeviceState, kMaxDevices>& devices() {
  static std::array<DeviceState, kMaxDevices> d;
  return d;
}

thread_local std::array<cudaStream_t, kMaxDevices> tls_stream{};

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
  });
  return s;
}

int resolve(int device) { return device < 0 ? dltrain::cuda::current_device() : device; }

// --- pinned host memory ---------------------------------------------------------------
struct PinnedBlock {
  void* p;
  cudaEvent_t freed;  // recorded when the block came back; reuse waits for it
  int device;         // the device of `freed` (an event records only on its device's streams)
};
struct PinnedPool {
  std::mutex mu;
  std::map<size_t, std::vector<PinnedBlock>> free;
  std::map<int, std::vector<cudaEvent_t>> spare_events;  // per device
};
PinnedPool& pinned_pool() {
  static auto* p = new PinnedPool;  // never destroyed: blocks may come back during exit
  return *p;
}
size_t pinned_class(size_t n) { return (n + 4095) / 4096 * 4096; }

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
  cudaStream_t t = tls_stream[device];
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
  cudaStream_t s = stream(device.index);
  void* p = nullptr;
  const cudaError_t err = cudaMallocAsync(&p, nbytes == 0 ? 1 : nbytes, s);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    DLTRAIN_FAIL(
        "CUDA out of memory on ", device, ": tried to allocate ", nbytes, " bytes; tensors hold ",
        st.allocated.load(), " bytes (peak ", st.peak.load(), "), the device has ", free_b, " of ",
        total_b,
        " bytes free; reduce the batch size, or train in mixed precision (amp::autocast with f16 "
        "or bf16 halves activation memory; --amp in the examples)");
  }
  DLTRAIN_CUDA_CHECK(err);
  const int64_t now =
      st.allocated.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  int64_t peak = st.peak.load();
  while (now > peak && !st.peak.compare_exchange_weak(peak, now)) {
  }
  const int dev = device.index;
  return std::shared_ptr<void>(p, [dev, s, nbytes](void* q) {
    devices()[dev].allocated.fetch_sub(static_cast<int64_t>(nbytes));
    cudaFreeAsync(q, s);  // no throw from a deleter; same stream as the allocation
  });
}

std::shared_ptr<void> allocate_pinned(size_t nbytes) {
  DLTRAIN_CHECK(device_count() > 0,
                "pinned host memory needs a CUDA device; none is visible on this machine");
  const size_t cls = pinned_class(nbytes == 0 ? 1 : nbytes);
  PinnedPool& pool = pinned_pool();
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    auto it = pool.free.find(cls);
    if (it != pool.free.end()) {
      auto& list = it->second;
      for (size_t i = 0; i < list.size(); ++i) {
        if (cudaEventQuery(list[i].freed) != cudaSuccess) continue;
        p = list[i].p;
        pool.spare_events[list[i].device].push_back(list[i].freed);
        list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
  }
  (void)cudaGetLastError();  // cudaEventQuery's "not ready" is not an error
  if (p == nullptr) {
    const cudaError_t err = cudaHostAlloc(&p, cls, cudaHostAllocDefault);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      DLTRAIN_FAIL("cudaHostAlloc of ", cls,
                   " bytes of pinned memory failed: ", cudaGetErrorString(err),
                   "; lower num_workers/prefetch_factor or pin less");
    }
  }
  return std::shared_ptr<void>(p, [cls](void* q) {
    // The event marks the work enqueued on the current stream of the current device so far
    // (the async copies that read or write this block). Nothing here may throw.
    PinnedPool& pool = pinned_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    int dev = 0;
    cudaStream_t s = nullptr;
    try {
      DLTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
      s = stream(dev);
    } catch (...) {
      (void)cudaGetLastError();
      cudaFreeHost(q);  // no event to order a reuse with: give the block back instead
      return;
    }
    auto& spare = pool.spare_events[dev];
    cudaEvent_t ev = nullptr;
    if (!spare.empty()) {
      ev = spare.back();
      spare.pop_back();
    } else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
      (void)cudaGetLastError();
      cudaFreeHost(q);
      return;
    }
    if (cudaEventRecord(ev, s) != cudaSuccess) {
      (void)cudaGetLastError();
      cudaEventDestroy(ev);
      cudaFreeHost(q);
      return;
    }
    pool.free[cls].push_back({q, ev, dev});
  });
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

Stream Stream::compute(int device) {
  const int d = bk::resolve(device);
  Stream out;
  out.handle_ = std::shared_ptr<void>(bk::state(d).compute, [](void*) {});
  out.device_ = d;
  return out;
}

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

Stream current_stream(int device) {
  const int d = bk::resolve(device);
  return Stream::external(bk::stream(d), d);
}

void set_current_stream(const Stream& s) {
  bk::check_device(s.device());
  cudaStream_t raw = static_cast<cudaStream_t>(s.handle());
  bk::tls_stream[s.device()] = raw == bk::state(s.device()).compute ? nullptr : raw;
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
  for (auto& [cls, list] : pp.free)
    for (auto& b : list) {
      cudaEventSynchronize(b.freed);
      cudaFreeHost(b.p);
      cudaEventDestroy(b.freed);
    }
  pp.free.clear();
}

}  // namespace dltrain::cuda
