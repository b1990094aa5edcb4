// Fill kernel: writes one value into n contiguous elements of any dtype.
// Tested against the CPU fill in tests/cuda (skipped without a GPU).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "src/backend/cuda/check.hpp"
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/runtime.hpp"

namespace dltrain::backend::cuda {

namespace {
template <class T>
__global__ void fill_kernel(T* p, int64_t n, T v) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}

template <class T>
void launch(void* p, int64_t n, T v, int dev) {
  if (n == 0) return;
  const int threads = 256;
  fill_kernel<T><<<grid_for(n, threads, dev), threads, 0, stream(dev)>>>(static_cast<T*>(p), n, v);
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
}
}  // namespace

void fill(void* p, DType dtype, int64_t n, double value, Device device) {
  Guard g(device);
  const int d = device.index;
  switch (dtype) {
    case DType::f32:
      return launch<float>(p, n, static_cast<float>(value), d);
    case DType::f64:
      return launch<double>(p, n, value, d);
    case DType::f16:  // through float, as the CPU's fill
      return launch<__half>(p, n, __float2half(static_cast<float>(value)), d);
    case DType::bf16:
      return launch<__nv_bfloat16>(p, n, __float2bfloat16(static_cast<float>(value)), d);
    case DType::i32:
      return launch<int32_t>(p, n, static_cast<int32_t>(value), d);
    case DType::i64:
      return launch<int64_t>(p, n, static_cast<int64_t>(value), d);
    case DType::u8:
      return launch<uint8_t>(p, n, static_cast<uint8_t>(value), d);
    case DType::b8:
      return launch<bool>(p, n, value != 0.0, d);
  }
}

}  // namespace dltrain::backend::cuda
