// Runtime helpers for the CUDA backend's own sources (internal header, CUDA types allowed):
// the current stream of a device, a device guard, launch sizing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dltrain/core/device.hpp"
#include "src/backend/cuda/check.hpp"

namespace dltrain::backend::cuda {

/// The calling thread's current stream on `device` (the device's compute stream by default).
cudaStream_t stream(int device);
inline cudaStream_t stream(Device d) { return stream(d.index); }

/// Makes `device` current for a scope (cheap when it already is).
class Guard {
 public:
  explicit Guard(int device);
  explicit Guard(Device d) : Guard(d.index) {}
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  int previous_;
};

/// Number of SMs of `device` (cached), for sizing grid-stride launches.
int sm_count(int device);

/// Blocks for a grid-stride loop over n items with `threads` per block: enough to fill the GPU
/// a few times over, never more than needed.
inline unsigned grid_for(int64_t n, int threads, int device) {
  const int64_t need = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sm_count(device)) * 32;
  const int64_t b = need < cap ? need : cap;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

}  // namespace dltrain::backend::cuda
