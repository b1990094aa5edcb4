// Line ops on CUDA (entry points in src/backend/cuda/scan.hpp): cumsum forward and reverse,
// the product of a line and the product of the others (prod's gradient), and nonzero's
// writing pass.
//
// Launch geometry: one thread per (outer, inner) line of a contiguous [outer, L, inner]
// tensor, consecutive threads on consecutive inner positions, so for inner > 1 every step
// of the walk along L is one coalesced load and store per warp. Cumulative sums over the last
// dim (inner = 1) of long lines (L >= kLongLine) would be one serial thread per line, so they
// take CUB instead: one line of f32/f64/int64 (a 1-d cumsum, nonzero's mask) is one
// device-wide cub::DeviceScan::InclusiveSum (reversed through thrust's reverse_iterator for
// the gradient), several lines (or a 16-bit line) one block per line running cub::BlockScan
// over chunks with a carry. Products and short lines keep the serial walk. Floating lines
// accumulate in acc_t (float for f16/bf16/f32, double for f64), integers in int64.
#include <thrust/iterator/reverse_iterator.h>

#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include "kernels/common.cuh"
#include "src/backend/cuda/scan.hpp"

namespace dltrain::backend::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 256;
constexpr int64_t kLongLine = 512;

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

// Inclusive (or reverse inclusive) sums of lines of L contiguous elements, one block per line.
template <class T>
__global__ void block_scan_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t lines,
                                  int64_t L, bool reverse) {
  using A = acc_t<T>;
  using BlockScan = cub::BlockScan<A, kScanThreads>;
  __shared__ typename BlockScan::TempStorage tmp;
  for (int64_t line = blockIdx.x; line < lines; line += gridDim.x) {
    const T* xl = x + line * L;
    T* ol = out + line * L;
    A carry = A(0);
    for (int64_t base = 0; base < L; base += kScanThreads) {
      const int64_t k = base + threadIdx.x;
      const int64_t pos = reverse ? L - 1 - k : k;
      const A v = k < L ? convert<A>(xl[pos]) : A(0);
      A incl, total;
      BlockScan(tmp).InclusiveSum(v, incl, total);
      if (k < L) ol[pos] = convert<T>(carry + incl);
      carry = carry + total;
      __syncthreads();  // tmp is reused by the next chunk
    }
  }
}

// One line of n elements scanned by CUB's device-wide scan; temporary storage from the pool.
template <class T>
void device_scan(const Tensor& out, const T* x, T* o, int64_t n, bool reverse, int dev) {
  auto call = [&](void* tmp, size_t& bytes) {
    if (reverse)
      return cub::DeviceScan::InclusiveSum(tmp, bytes, thrust::make_reverse_iterator(x + n),
                                           thrust::make_reverse_iterator(o + n), n, stream(dev));
    return cub::DeviceScan::InclusiveSum(tmp, bytes, x, o, n, stream(dev));
  };
  size_t bytes = 0;
  DLTRAIN_CUDA_CHECK(call(nullptr, bytes));
  Tensor tmp =
      empty({static_cast<int64_t>(bytes) + 1}, TensorOptions(DType::u8).with_device(out.device()));
  DLTRAIN_CUDA_CHECK(call(tmp.data_ptr(), bytes));
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
  const bool sum = op == LineOp::CumSum || op == LineOp::CumSumReverse;
  const bool reverse = op == LineOp::CumSumReverse;
  auto launch = [&]<class T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op_ = static_cast<T*>(out.data_ptr());
    if (sum && inner == 1 && L >= kLongLine) {
      if constexpr (std::is_same_v<acc_t<T>, T>) {
        if (outer == 1) {
          device_scan<T>(out, xp, op_, L, reverse, dev);
          return;
        }
      }
      const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(outer, 65535));
      block_scan_kernel<T><<<blocks, kScanThreads, 0, stream(dev)>>>(xp, op_, outer, L, reverse);
      return;
    }
    line_kernel<T><<<grid_for(lines, kThreads, dev), kThreads, 0, stream(dev)>>>(xp, op_, outer, L,
                                                                                 inner, op);
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
