// Fill kernel: writes one value into n contiguous elements of any dtype.
// Tested against the CPU fill in tests/cuda (skipped without a GPU).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "src/backend/cuda/check.hpp"
#include "src/backend/cuda/cuda_backend.hpp"

namespace dltrain::backend::cuda {

namespace {
template <class T>
__global__ void fill_kernel(T* p, int64_t n, T v) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}

template <class T>
void launch(void* p, int64_t n, T v) {
  if (n == 0) return;
  const int threads = 256;
  const int64_t blocks64 = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(blocks64 < 65535 ? blocks64 : 65535);
  fill_kernel<T><<<blocks, threads, 0, cudaStreamPerThread>>>(static_cast<T*>(p), n, v);
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
}
}  // namespace

void fill(void* p, DType dtype, int64_t n, double value, Device device) {
  DLTRAIN_CUDA_CHECK(cudaSetDevice(device.index));
  switch (dtype) {
    case DType::f32:
      return launch<float>(p, n, static_cast<float>(value));
    case DType::f64:
      return launch<double>(p, n, value);
    case DType::f16:
      return launch<__half>(p, n, __double2half(value));
    case DType::bf16:
      return launch<__nv_bfloat16>(p, n, __double2bfloat16(value));
    case DType::i32:
      return launch<int32_t>(p, n, static_cast<int32_t>(value));
    case DType::i64:
      return launch<int64_t>(p, n, static_cast<int64_t>(value));
    case DType::u8:
      return launch<uint8_t>(p, n, static_cast<uint8_t>(value));
    case DType::b8:
      return launch<bool>(p, n, value != 0.0);
  }
}

}  // namespace dltrain::backend::cuda
