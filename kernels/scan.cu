// Line ops on CUDA (entry points in src/backend/cuda/scan.hpp): cumsum forward and reverse,
// the product of a line and the product of the others (prod's gradient), and nonzero's
// writing pass.
//
// Launch geometry: one thread per (outer, inner) line of a contiguous [outer, L, inner]
// tensor, consecutive threads on consecutive inner positions, so for inner > 1 every step
// of the walk along L is one coalesced load and store per warp. A reduction over the last
// dim (inner = 1) walks each line serially in one thread: simple and exact in order (the same
// order as the CPU), but uncoalesced and sequential; a block-wide scan (cub::BlockScan) for
// long last-dim lines is the follow-up if it shows up in a profile. Floating lines
// accumulate in acc_t (float for f16/bf16/f32, double for f64), integers in int64.
#include "kernels/common.cuh"
#include "src/backend/cuda/scan.hpp"

namespace dltrain::backend::cuda {

namespace {

constexpr int kThreads = 256;

struct ShapeArg {
  int64_t v[kMaxDims];
};

template <class T>
__global__ void line_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t outer, int64_t L,
                            int64_t inner, LineOp op) {
  using A = acc_t<T>;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < outer * inner;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = t / inner, j = t % inner;
    const T* xl = x + o * L * inner + j;
    T* ol = out + o * L * inner + j;
    switch (op) {
      case LineOp::CumSum: {
        A acc = A(0);
        for (int64_t l = 0; l < L; ++l) {
          acc = acc + convert<A>(xl[l * inner]);
          ol[l * inner] = convert<T>(acc);
        }
        break;
      }
      case LineOp::CumSumReverse: {
        A acc = A(0);
        for (int64_t l = L - 1; l >= 0; --l) {
          acc = acc + convert<A>(xl[l * inner]);
          ol[l * inner] = convert<T>(acc);
        }
        break;
      }
      case LineOp::Prod: {
        A acc = A(1);
        for (int64_t l = 0; l < L; ++l) acc = acc * convert<A>(xl[l * inner]);
        out[o * inner + j] = convert<T>(acc);
        break;
      }
      case LineOp::ProdOthers: {
        // Exclusive prefix products into out, then times the exclusive suffix backward (the
        // prefix is rounded to T in between, as the CPU does).
        A acc = A(1);
        for (int64_t l = 0; l < L; ++l) {
          ol[l * inner] = convert<T>(acc);
          acc = acc * convert<A>(xl[l * inner]);
        }
        acc = A(1);
        for (int64_t l = L - 1; l >= 0; --l) {
          ol[l * inner] = convert<T>(convert<A>(ol[l * inner]) * acc);
          acc = acc * convert<A>(xl[l * inner]);
        }
        break;
      }
    }
  }
}

__global__ void nonzero_kernel(const bool* __restrict__ mask, const int64_t* __restrict__ csum,
                               int64_t n, int nd, ShapeArg shape, int64_t* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!mask[i]) continue;
    int64_t* row = out + (csum[i] - 1) * nd;
    int64_t rem = i;
    for (int d = nd - 1; d >= 0; --d) {
      row[d] = rem % shape.v[d];
      rem /= shape.v[d];
    }
  }
}

}  // namespace

void line_scan(const Tensor& out, const Tensor& x, int64_t outer, int64_t L, int64_t inner,
               LineOp op) {
  const int64_t lines = outer * inner;
  if (lines == 0) return;
  const int dev = out.device().index;
  Guard guard(dev);
  auto launch = [&]<class T>() {
    line_kernel<T><<<grid_for(lines, kThreads, dev), kThreads, 0, stream(dev)>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), outer, L, inner, op);
  };
  if (x.dtype() == DType::i64)
    launch.template operator()<int64_t>();
  else
    cu_dispatch_floating(x.dtype(), "cumsum/prod", launch);
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
}

void nonzero_write(const Tensor& out, const Tensor& mask, const Tensor& csum, const Shape& shape) {
  const int64_t n = mask.numel();
  if (n == 0 || out.numel() == 0) return;
  const int nd = static_cast<int>(shape.size());
  DLTRAIN_CHECK(nd <= kMaxDims, "nonzero: CUDA kernels support at most ", kMaxDims,
                " dimensions; got shape ", shape_str(shape));
  ShapeArg s{};
  for (int d = 0; d < nd; ++d) s.v[d] = shape[d];
  const int dev = out.device().index;
  Guard guard(dev);
  nonzero_kernel<<<grid_for(n, kThreads, dev), kThreads, 0, stream(dev)>>>(
      static_cast<const bool*>(mask.data_ptr()), static_cast<const int64_t*>(csum.data_ptr()), n,
      nd, s, static_cast<int64_t*>(out.data_ptr()));
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dltrain::backend::cuda
