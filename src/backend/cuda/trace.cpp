// Op tracing's CUDA side (see trace.hpp): NVTX3 ranges (header-only, from the CUDA toolkit) and
// pooled CUDA events. Errors never escape into the op being traced: a failed record yields a
// null mark, which the profiler reports as "no CUDA time", and clears CUDA's last error.
#include "src/backend/cuda/trace.hpp"

#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include <mutex>
#include <vector>

#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/runtime.hpp"

namespace dltrain::backend::cuda::trace {

namespace {
struct Pool {
  std::mutex mu;
  std::vector<cudaEvent_t> free;
};
Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: events may be recycled during exit
  return *p;
}
}  // namespace

bool usable() { return device_count() > 0; }

int current_device() {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return d;
}

void range_push(const char* name) { nvtxRangePushA(name); }
void range_pop() { nvtxRangePop(); }

Mark mark() {
  cudaEvent_t e = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool().mu);
    if (!pool().free.empty()) {
      e = pool().free.back();
      pool().free.pop_back();
    }
  }
  if (!e && cudaEventCreate(&e) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  if (cudaEventRecord(e, stream(current_device())) != cudaSuccess) {
    (void)cudaGetLastError();
    recycle(e);
    return nullptr;
  }
  return e;
}

double elapsed_ms(Mark from, Mark to) {
  if (!from || !to) return -1;
  auto a = static_cast<cudaEvent_t>(from), b = static_cast<cudaEvent_t>(to);
  float ms = 0;
  if (cudaEventSynchronize(b) != cudaSuccess || cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return ms;
}

void recycle(Mark m) {
  if (!m) return;
  std::lock_guard<std::mutex> lock(pool().mu);
  pool().free.push_back(static_cast<cudaEvent_t>(m));
}

}  // namespace dltrain::backend::cuda::trace
