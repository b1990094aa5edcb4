// rand/randn drawn on the GPU: one thread per element (grid-stride), each computing its value
// with the CPU's own formula (src/core/philox.hpp) in double and rounding once, so a draw on
// a GPU equals the CPU's draw from the same generator state. The output is contiguous; the
// element index is the row-major logical index.
#include "kernels/common.cuh"
#include "src/backend/cuda/random.hpp"
#include "src/core/philox.hpp"
#include "src/ops/multinomial_row.hpp"

namespace dltrain::backend::cuda {

namespace {

template <class T, bool Normal>
__global__ void random_kernel(T* __restrict__ out, int64_t n, double a, double b, uint64_t seed,
                              uint64_t base) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v =
        Normal ? philox::normal_at(seed, base, i, a, b) : philox::uniform_at(seed, base, i, a, b);
    out[i] = convert<T>(v);
  }
}

template <class T>
__global__ void multinomial_kernel(int64_t* __restrict__ out, const T* __restrict__ p, int64_t R,
                                   int64_t K, int64_t n, int64_t sr, int64_t sk, bool replacement,
                                   uint64_t seed, uint64_t base, uint8_t* __restrict__ taken) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < R;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x)
    sampling::multinomial_row(p + r * sr, sk, K, n, replacement, seed, base, r, out + r * n, 1,
                              replacement ? nullptr : taken + r * K);
}

}  // namespace

void multinomial(const Tensor& out, const Tensor& probs, bool replacement, uint64_t seed,
                 uint64_t base, const Tensor& taken) {
  const int64_t R = probs.size(0), K = probs.size(1), n = out.size(1);
  if (R == 0 || n == 0) return;
  const int dev = out.device().index;
  Guard guard(dev);
  // The per-row sampler reads plain element types: f16/bf16 probabilities come as f32.
  cu_dispatch_floating(probs.dtype(), "multinomial", [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      multinomial_kernel<T><<<grid_for(R, 128, dev), 128, 0, stream(dev)>>>(
          static_cast<int64_t*>(out.data_ptr()), static_cast<const T*>(probs.data_ptr()), R, K, n,
          probs.stride(0), probs.stride(1), replacement, seed, base,
          replacement ? nullptr : static_cast<uint8_t*>(taken.data_ptr()));
    } else {
      DLTRAIN_FAIL(
          "multinomial (cuda): 16-bit probabilities must be converted to f32 first "
          "(internal error)");
    }
  });
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
}

void random_fill(const Tensor& out, RandomKind kind, double a, double b, uint64_t seed,
                 uint64_t base) {
  DLTRAIN_CHECK(out.is_contiguous(), "random_fill (cuda): the output must be contiguous");
  const int64_t n = out.numel();
  if (n == 0) return;
  const int dev = out.device().index;
  Guard guard(dev);
  cu_dispatch_floating(out.dtype(), "rand", [&]<class T>() {
    T* p = static_cast<T*>(out.data_ptr());
    if (kind == RandomKind::Normal)
      random_kernel<T, true>
          <<<grid_for(n, 256, dev), 256, 0, stream(dev)>>>(p, n, a, b, seed, base);
    else
      random_kernel<T, false>
          <<<grid_for(n, 256, dev), 256, 0, stream(dev)>>>(p, n, a, b, seed, base);
  });
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dltrain::backend::cuda
