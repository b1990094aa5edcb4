// interpolate (nearest, bilinear) and reflect/replicate pad on CUDA: forward and backward
// of a 2-d resize or pad (pad: the same scheme with one tap, pad_index).
//
// Forward: one thread per output element in the output's memory order (NCHW or
// channels-last, so writes coalesce in either layout), reading its one or four taps through
// the input's strides and blending in acc_t. Backward: one thread per gradient element,
// atomically adding its share into an f32 (f64) accumulator the caller converts afterwards
// (PyTorch's scheme; the order of the adds, so the last bits, may vary between runs). Taps
// and weights are computed per thread with the CPU's own functions
// (src/ops/resample_index.hpp): no index tables, no host synchronisation.
#include "kernels/common.cuh"
#include "src/backend/cuda/resample.hpp"
#include "src/ops/resample_index.hpp"

namespace dltrain::backend::cuda {

namespace {

struct Geo {
  int64_t N, C, H, W, Ho, Wo;
  bool bilinear, align_corners;
  double scale_h, scale_w, ratio_h, ratio_w;
  int64_t sn, sc, sh, sw;  // strides of the strided operand (x forward, gy backward)
  bool channels_last;      // layout of the dense operand (y forward, acc backward)
};

// (n, c, h, w) of linear index i in a dense [N, C, h_size, w_size] tensor of the given layout.
__device__ __forceinline__ void coords(int64_t i, int64_t C, int64_t hs, int64_t ws, bool cl,
                                       int64_t& n, int64_t& c, int64_t& h, int64_t& w) {
  if (cl) {
    c = i % C;
    i /= C;
    w = i % ws;
    i /= ws;
    h = i % hs;
    n = i / hs;
  } else {
    w = i % ws;
    i /= ws;
    h = i % hs;
    i /= hs;
    c = i % C;
    n = i / C;
  }
}

template <class T>
__global__ void upsample_forward_kernel(T* __restrict__ y, const T* __restrict__ x, Geo g,
                                        int64_t total) {
  using A = acc_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, oh, ow;
    coords(i, g.C, g.Ho, g.Wo, g.channels_last, n, c, oh, ow);
    const T* p = x + n * g.sn + c * g.sc;
    if (!g.bilinear) {
      const int64_t ih = resample::nearest_index(oh, g.H, g.Ho, g.scale_h);
      const int64_t iw = resample::nearest_index(ow, g.W, g.Wo, g.scale_w);
      y[i] = p[ih * g.sh + iw * g.sw];
      continue;
    }
    int64_t h0, h1, w0, w1;
    double lh, lw;
    resample::linear_taps(oh, g.H, g.Ho, g.align_corners, g.ratio_h, h0, h1, lh);
    resample::linear_taps(ow, g.W, g.Wo, g.align_corners, g.ratio_w, w0, w1, lw);
    const A a1 = static_cast<A>(lh), a0 = A(1) - a1, b1 = static_cast<A>(lw), b0 = A(1) - b1;
    const A v = a0 * (b0 * convert<A>(p[h0 * g.sh + w0 * g.sw]) +
                      b1 * convert<A>(p[h0 * g.sh + w1 * g.sw])) +
                a1 * (b0 * convert<A>(p[h1 * g.sh + w0 * g.sw]) +
                      b1 * convert<A>(p[h1 * g.sh + w1 * g.sw]));
    y[i] = convert<T>(v);
  }
}

// Iterates gy in its logical NCHW order; acc is dense in g.channels_last's layout.
template <class T>
__global__ void upsample_backward_kernel(acc_t<T>* __restrict__ acc, const T* __restrict__ gy,
                                         Geo g, int64_t total) {
  using A = acc_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, oh, ow;
    coords(i, g.C, g.Ho, g.Wo, false, n, c, oh, ow);
    const A v = convert<A>(gy[n * g.sn + c * g.sc + oh * g.sh + ow * g.sw]);
    // Dense accumulator offsets of (n, c, h, w).
    const int64_t base = g.channels_last ? n * g.H * g.W * g.C + c : (n * g.C + c) * g.H * g.W;
    const int64_t rs = g.channels_last ? g.W * g.C : g.W, cs = g.channels_last ? g.C : 1;
    if (!g.bilinear) {
      const int64_t ih = resample::nearest_index(oh, g.H, g.Ho, g.scale_h);
      const int64_t iw = resample::nearest_index(ow, g.W, g.Wo, g.scale_w);
      atomicAdd(acc + base + ih * rs + iw * cs, v);
      continue;
    }
    int64_t h0, h1, w0, w1;
    double lh, lw;
    resample::linear_taps(oh, g.H, g.Ho, g.align_corners, g.ratio_h, h0, h1, lh);
    resample::linear_taps(ow, g.W, g.Wo, g.align_corners, g.ratio_w, w0, w1, lw);
    const A a1 = static_cast<A>(lh), a0 = A(1) - a1, b1 = static_cast<A>(lw), b0 = A(1) - b1;
    atomicAdd(acc + base + h0 * rs + w0 * cs, a0 * b0 * v);
    atomicAdd(acc + base + h0 * rs + w1 * cs, a0 * b1 * v);
    atomicAdd(acc + base + h1 * rs + w0 * cs, a1 * b0 * v);
    atomicAdd(acc + base + h1 * rs + w1 * cs, a1 * b1 * v);
  }
}

struct PadGeo {
  int64_t N, C, H, W, Ho, Wo, top, left;
  bool reflect;
  int64_t sn, sc, sh, sw;  // strides of the strided operand (x forward, gy backward)
  bool channels_last;      // layout of the dense operand (y forward, acc backward)
};

template <class T>
__global__ void pad_forward_kernel(T* __restrict__ y, const T* __restrict__ x, PadGeo g,
                                   int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, oh, ow;
    coords(i, g.C, g.Ho, g.Wo, g.channels_last, n, c, oh, ow);
    const int64_t ih = resample::pad_index(oh, g.H, g.top, g.reflect);
    const int64_t iw = resample::pad_index(ow, g.W, g.left, g.reflect);
    y[i] = x[n * g.sn + c * g.sc + ih * g.sh + iw * g.sw];
  }
}

template <class T>
__global__ void pad_backward_kernel(acc_t<T>* __restrict__ acc, const T* __restrict__ gy, PadGeo g,
                                    int64_t total) {
  using A = acc_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, oh, ow;
    coords(i, g.C, g.Ho, g.Wo, false, n, c, oh, ow);
    const int64_t ih = resample::pad_index(oh, g.H, g.top, g.reflect);
    const int64_t iw = resample::pad_index(ow, g.W, g.left, g.reflect);
    const int64_t off = g.channels_last ? ((n * g.H + ih) * g.W + iw) * g.C + c
                                        : ((n * g.C + c) * g.H + ih) * g.W + iw;
    atomicAdd(acc + off, convert<A>(gy[n * g.sn + c * g.sc + oh * g.sh + ow * g.sw]));
  }
}

PadGeo pad_geometry(const Pad2d& p, const Tensor& strided, bool channels_last) {
  return {p.N,
          p.C,
          p.H,
          p.W,
          p.Ho,
          p.Wo,
          p.top,
          p.left,
          p.reflect,
          strided.stride(0),
          strided.stride(1),
          strided.stride(2),
          strided.stride(3),
          channels_last};
}

Geo geometry(const Upsample2d& p, const Tensor& strided, bool channels_last) {
  return {p.N,
          p.C,
          p.H,
          p.W,
          p.Ho,
          p.Wo,
          p.bilinear,
          p.align_corners,
          p.scale_h,
          p.scale_w,
          resample::linear_ratio(p.H, p.Ho, p.align_corners, p.scale_h),
          resample::linear_ratio(p.W, p.Wo, p.align_corners, p.scale_w),
          strided.stride(0),
          strided.stride(1),
          strided.stride(2),
          strided.stride(3),
          channels_last};
}

// True for a channels-last dense tensor that is not also NCHW-contiguous; throws unless dense.
bool dense_channels_last(const Tensor& t, const char* what) {
  if (t.is_contiguous()) return false;
  DLTRAIN_CHECK(t.is_contiguous(MemoryFormat::ChannelsLast), "interpolate (cuda): ", what,
                " must be dense NCHW or channels-last (internal error)");
  return true;
}

}  // namespace

void pad2d_forward(const Tensor& y, const Tensor& x, const Pad2d& p) {
  DLTRAIN_CHECK(x.dtype() == y.dtype(), "pad (cuda): input dtype ", x.dtype(),
                " differs from the output's ", y.dtype());
  const int64_t total = y.numel();
  if (total == 0) return;
  const PadGeo g = pad_geometry(p, x, dense_channels_last(y, "the output"));
  const int dev = y.device().index;
  Guard guard(dev);
  cu_dispatch_floating(y.dtype(), "pad", [&]<class T>() {
    pad_forward_kernel<T><<<grid_for(total, 256, dev), 256, 0, stream(dev)>>>(
        static_cast<T*>(y.data_ptr()), static_cast<const T*>(x.data_ptr()), g, total);
  });
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
}

void pad2d_backward(const Tensor& acc, const Tensor& gy, const Pad2d& p) {
  const int64_t total = gy.numel();
  if (total == 0) return;
  const PadGeo g = pad_geometry(p, gy, dense_channels_last(acc, "the gradient accumulator"));
  const int dev = gy.device().index;
  Guard guard(dev);
  cu_dispatch_floating(gy.dtype(), "pad_backward", [&]<class T>() {
    using A = acc_t<T>;
    DLTRAIN_CHECK(acc.dtype() == (std::is_same_v<A, double> ? DType::f64 : DType::f32),
                  "pad_backward (cuda): accumulator dtype ", acc.dtype(),
                  " is not the gradient's accumulation type (internal error)");
    pad_backward_kernel<T><<<grid_for(total, 256, dev), 256, 0, stream(dev)>>>(
        static_cast<A*>(acc.data_ptr()), static_cast<const T*>(gy.data_ptr()), g, total);
  });
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
}

void upsample2d_forward(const Tensor& y, const Tensor& x, const Upsample2d& p) {
  DLTRAIN_CHECK(x.dtype() == y.dtype(), "interpolate (cuda): input dtype ", x.dtype(),
                " differs from the output's ", y.dtype());
  const int64_t total = y.numel();
  if (total == 0) return;
  const Geo g = geometry(p, x, dense_channels_last(y, "the output"));
  const int dev = y.device().index;
  Guard guard(dev);
  cu_dispatch_floating(y.dtype(), "interpolate", [&]<class T>() {
    upsample_forward_kernel<T><<<grid_for(total, 256, dev), 256, 0, stream(dev)>>>(
        static_cast<T*>(y.data_ptr()), static_cast<const T*>(x.data_ptr()), g, total);
  });
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
}

void upsample2d_backward(const Tensor& acc, const Tensor& gy, const Upsample2d& p) {
  const int64_t total = gy.numel();
  if (total == 0) return;
  const Geo g = geometry(p, gy, dense_channels_last(acc, "the gradient accumulator"));
  const int dev = gy.device().index;
  Guard guard(dev);
  cu_dispatch_floating(gy.dtype(), "interpolate_backward", [&]<class T>() {
    using A = acc_t<T>;
    DLTRAIN_CHECK(acc.dtype() == (std::is_same_v<A, double> ? DType::f64 : DType::f32),
                  "interpolate_backward (cuda): accumulator dtype ", acc.dtype(),
                  " is not the gradient's accumulation type (internal error)");
    upsample_backward_kernel<T><<<grid_for(total, 256, dev), 256, 0, stream(dev)>>>(
        static_cast<A*>(acc.data_ptr()), static_cast<const T*>(gy.data_ptr()), g, total);
  });
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dltrain::backend::cuda
