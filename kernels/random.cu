// rand/randn drawn on the GPU: one thread per element (grid-stride), each computing its value
// with the CPU's own formula (src/core/philox.hpp) in double and rounding once, so a draw on
// a GPU equals the CPU's draw from the same generator state. The output is contiguous; the
// element index is the row-major logical index.
#include "kernels/common.cuh"
#include "src/backend/cuda/random.hpp"
#include "src/core/philox.hpp"

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

}  // namespace

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
