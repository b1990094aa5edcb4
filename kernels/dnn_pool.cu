// Pooling kernels of the dnn family (see src/backend/cuda/dnn.hpp): max (with flat or
// in-window indices), average and adaptive average, forward and backward.
//
// Why not cuDNN: its pooling has no dilation and no ceil_mode, and its max-pool backward
// re-reads x and y and leaves ties to an unspecified rule, while these kernels match the
// CPU's rules exactly (first maximum, NaN wins, -inf padding, PyTorch's average divisors)
// and keep one byte per output for the backward of max_pool2d.
//
// Every kernel runs one thread per element of the tensor it writes, enumerated in that
// tensor's memory order (NCHW: w fastest; channels-last: c fastest), so writes are coalesced
// and neighbouring threads read neighbouring inputs in both layouts; operands are addressed
// through their own strides. Backward kernels gather: each input element visits the few
// windows that can contain it and sums what they route to it, so there are no atomics and
// results are deterministic. Sums and divisions run in acc_t (f32 for 16-bit types).
#include <cmath>

#include "kernels/common.cuh"
#include "src/backend/cuda/dnn.hpp"

namespace dltrain::backend::cuda {

namespace {

// Sizes and element strides of a 4-d operand.
struct Dims {
  int64_t N, C, H, W;
  int64_t sn, sc, sh, sw;
  __device__ __forceinline__ int64_t at(int64_t n, int64_t c, int64_t h, int64_t w) const {
    return n * sn + c * sc + h * sh + w * sw;
  }
};

Dims dims_of(const Tensor& t) {
  return {t.size(0),   t.size(1),   t.size(2),   t.size(3),
          t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// Channels-last memory order (and not also plain contiguous): enumerate c fastest.
bool channels_fastest(const Tensor& t) {
  return t.is_contiguous(MemoryFormat::ChannelsLast) && !t.is_contiguous();
}

struct Window {
  int kh, kw, sh, sw, ph, pw, dh, dw;
};

Window window_of(const PoolParams& p) {
  return {static_cast<int>(p.kernel.h),   static_cast<int>(p.kernel.w),
          static_cast<int>(p.stride.h),   static_cast<int>(p.stride.w),
          static_cast<int>(p.padding.h),  static_cast<int>(p.padding.w),
          static_cast<int>(p.dilation.h), static_cast<int>(p.dilation.w)};
}

struct Pos {
  int64_t n, c, h, w;
};

// The i-th element of a [N, C, H, W] tensor in NCHW or channels-last memory order.
__device__ __forceinline__ Pos decompose(int64_t i, const Dims& d, bool cl) {
  Pos p;
  if (cl) {
    p.c = i % d.C;
    i /= d.C;
    p.w = i % d.W;
    i /= d.W;
    p.h = i % d.H;
    p.n = i / d.H;
  } else {
    p.w = i % d.W;
    i /= d.W;
    p.h = i % d.H;
    i /= d.H;
    p.c = i % d.C;
    p.n = i / d.C;
  }
  return p;
}

__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

#define DLTRAIN_GRID_LOOP(i, n)                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

constexpr int kThreads = 256;

// --- max ----------------------------------------------------------------------------------

// Local: indices are uint8 positions i * kw + j inside the window (255: empty window);
// otherwise int64 flat positions h * W + w in the plane (-1: empty window).
template <class T, class I, bool Local>
__global__ void max_fwd_kernel(const T* x, Dims xd, T* y, Dims yd, I* idx, Dims id, Window k,
                               bool cl, int64_t total) {
  using A = acc_t<T>;
  DLTRAIN_GRID_LOOP(e, total) {
    const Pos o = decompose(e, yd, cl);
    const int64_t hs = o.h * k.sh - k.ph, ws = o.w * k.sw - k.pw;
    const T* xp = x + o.n * xd.sn + o.c * xd.sc;
    A best = static_cast<A>(-INFINITY);
    int64_t bi = Local ? 255 : -1;
    bool found = false;
    for (int i = 0; i < k.kh; ++i) {
      const int64_t h = hs + static_cast<int64_t>(i) * k.dh;
      if (h < 0 || h >= xd.H) continue;
      for (int j = 0; j < k.kw; ++j) {
        const int64_t w = ws + static_cast<int64_t>(j) * k.dw;
        if (w < 0 || w >= xd.W) continue;
        const A v = convert<A>(xp[h * xd.sh + w * xd.sw]);
        // The first element starts the scan; later ones win when larger or NaN (the CPU rule).
        if (!found || v > best || v != v) {
          best = v;
          bi = Local ? static_cast<int64_t>(i * k.kw + j) : h * xd.W + w;
          found = true;
        }
      }
    }
    y[yd.at(o.n, o.c, o.h, o.w)] = convert<T>(best);
    idx[id.at(o.n, o.c, o.h, o.w)] = static_cast<I>(bi);
  }
}

template <class T, class I, bool Local>
__global__ void max_bwd_kernel(const T* gy, Dims gyd, const I* idx, Dims id, T* gx, Dims gxd,
                               Window k, bool cl, int64_t total) {
  using A = acc_t<T>;
  DLTRAIN_GRID_LOOP(e, total) {
    const Pos p = decompose(e, gxd, cl);
    const int64_t span_h = static_cast<int64_t>(k.kh - 1) * k.dh + 1;
    const int64_t span_w = static_cast<int64_t>(k.kw - 1) * k.dw + 1;
    const int64_t oh0 = p.h + k.ph < span_h ? 0 : (p.h + k.ph - span_h) / k.sh + 1;
    const int64_t oh1 = imin((p.h + k.ph) / k.sh + 1, gyd.H);
    const int64_t ow0 = p.w + k.pw < span_w ? 0 : (p.w + k.pw - span_w) / k.sw + 1;
    const int64_t ow1 = imin((p.w + k.pw) / k.sw + 1, gyd.W);
    const int64_t flat = p.h * gxd.W + p.w;
    A acc = A(0);
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const int64_t di = p.h - (oh * k.sh - k.ph);
      if (Local && (di < 0 || di % k.dh != 0 || di / k.dh >= k.kh)) continue;
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t stored = static_cast<int64_t>(idx[id.at(p.n, p.c, oh, ow)]);
        bool match;
        if constexpr (Local) {
          const int64_t dj = p.w - (ow * k.sw - k.pw);
          match = dj >= 0 && dj % k.dw == 0 && dj / k.dw < k.kw &&
                  stored == (di / k.dh) * k.kw + dj / k.dw;
        } else {
          match = stored == flat;
        }
        if (match) acc += convert<A>(gy[gyd.at(p.n, p.c, oh, ow)]);
      }
    }
    gx[gxd.at(p.n, p.c, p.h, p.w)] = convert<T>(acc);
  }
}

// --- average ----------------------------------------------------------------------------

struct AvgWin {
  int64_t hs, he, ws, we, div;
};

// The window of output (oh, ow) clipped to the input, and its divisor (src/ops/pool.cpp).
__device__ __forceinline__ AvgWin avg_window(int64_t oh, int64_t ow, int64_t H, int64_t W,
                                             const Window& k, bool cip) {
  int64_t hs = oh * k.sh - k.ph, ws = ow * k.sw - k.pw;
  int64_t he = imin(hs + k.kh, H + k.ph), we = imin(ws + k.kw, W + k.pw);
  const int64_t pool = (he - hs) * (we - ws);
  hs = imax(hs, 0);
  ws = imax(ws, 0);
  he = imin(he, H);
  we = imin(we, W);
  const int64_t inside = imax(he - hs, 0) * imax(we - ws, 0);
  return {hs, he, ws, we, cip ? pool : inside};
}

template <class T>
__global__ void avg_fwd_kernel(const T* x, Dims xd, T* y, Dims yd, Window k, bool cip, bool cl,
                               int64_t total) {
  using A = acc_t<T>;
  DLTRAIN_GRID_LOOP(e, total) {
    const Pos o = decompose(e, yd, cl);
    const AvgWin w = avg_window(o.h, o.w, xd.H, xd.W, k, cip);
    const T* xp = x + o.n * xd.sn + o.c * xd.sc;
    A acc = A(0);
    for (int64_t h = w.hs; h < w.he; ++h)
      for (int64_t ww = w.ws; ww < w.we; ++ww) acc += convert<A>(xp[h * xd.sh + ww * xd.sw]);
    y[yd.at(o.n, o.c, o.h, o.w)] = convert<T>(w.div > 0 ? acc / static_cast<A>(w.div) : A(0));
  }
}

template <class T>
__global__ void avg_bwd_kernel(const T* gy, Dims gyd, T* gx, Dims gxd, Window k, bool cip, bool cl,
                               int64_t total) {
  using A = acc_t<T>;
  DLTRAIN_GRID_LOOP(e, total) {
    const Pos p = decompose(e, gxd, cl);
    const int64_t oh0 = p.h + k.ph < k.kh ? 0 : (p.h + k.ph - k.kh) / k.sh + 1;
    const int64_t oh1 = imin((p.h + k.ph) / k.sh + 1, gyd.H);
    const int64_t ow0 = p.w + k.pw < k.kw ? 0 : (p.w + k.pw - k.kw) / k.sw + 1;
    const int64_t ow1 = imin((p.w + k.pw) / k.sw + 1, gyd.W);
    A acc = A(0);
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const AvgWin w = avg_window(oh, ow, gxd.H, gxd.W, k, cip);
        if (w.div <= 0 || p.h < w.hs || p.h >= w.he || p.w < w.ws || p.w >= w.we) continue;
        acc += convert<A>(gy[gyd.at(p.n, p.c, oh, ow)]) / static_cast<A>(w.div);
      }
    gx[gxd.at(p.n, p.c, p.h, p.w)] = convert<T>(acc);
  }
}

// --- adaptive average ----------------------------------------------------------------------

__device__ __forceinline__ int64_t start_index(int64_t o, int64_t in, int64_t out) {
  return (o * in) / out;
}
__device__ __forceinline__ int64_t end_index(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

template <class T>
__global__ void adaptive_fwd_kernel(const T* x, Dims xd, T* y, Dims yd, bool cl, int64_t total) {
  using A = acc_t<T>;
  DLTRAIN_GRID_LOOP(e, total) {
    const Pos o = decompose(e, yd, cl);
    const int64_t hs = start_index(o.h, xd.H, yd.H), he = end_index(o.h, xd.H, yd.H);
    const int64_t ws = start_index(o.w, xd.W, yd.W), we = end_index(o.w, xd.W, yd.W);
    const T* xp = x + o.n * xd.sn + o.c * xd.sc;
    A acc = A(0);
    for (int64_t h = hs; h < he; ++h)
      for (int64_t w = ws; w < we; ++w) acc += convert<A>(xp[h * xd.sh + w * xd.sw]);
    y[yd.at(o.n, o.c, o.h, o.w)] = convert<T>(acc / static_cast<A>((he - hs) * (we - ws)));
  }
}

// The global pool [N, C, H, W] -> [N, C, 1, 1] of planar inputs: one warp per plane, lanes
// along the plane (the per-output kernel would read each plane with a single thread).
template <class T>
__global__ void global_avg_planar_kernel(const T* x, Dims xd, T* y, Dims yd) {
  using A = acc_t<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int64_t HW = xd.H * xd.W, planes = xd.N * xd.C;
  for (int64_t pl = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
       pl < planes; pl += warps) {
    const int64_t n = pl / xd.C, c = pl % xd.C;
    const T* xp = x + n * xd.sn + c * xd.sc;
    A acc = A(0);
    for (int64_t i = lane; i < HW; i += 32) {
      const int64_t h = i / xd.W, w = i - h * xd.W;
      acc += convert<A>(xp[h * xd.sh + w * xd.sw]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if (lane == 0) y[n * yd.sn + c * yd.sc] = convert<T>(acc / static_cast<A>(HW));
  }
}

template <class T>
__global__ void adaptive_bwd_kernel(const T* gy, Dims gyd, T* gx, Dims gxd, bool cl,
                                    int64_t total) {
  using A = acc_t<T>;
  DLTRAIN_GRID_LOOP(e, total) {
    const Pos p = decompose(e, gxd, cl);
    // Windows containing h: o in [floor(h * Out / In), ceil((h + 1) * Out / In)).
    const int64_t oh0 = start_index(p.h, gyd.H, gxd.H), oh1 = end_index(p.h, gyd.H, gxd.H);
    const int64_t ow0 = start_index(p.w, gyd.W, gxd.W), ow1 = end_index(p.w, gyd.W, gxd.W);
    A acc = A(0);
    for (int64_t oh = oh0; oh < imin(oh1, gyd.H); ++oh) {
      const int64_t hs = start_index(oh, gxd.H, gyd.H), he = end_index(oh, gxd.H, gyd.H);
      if (p.h < hs || p.h >= he) continue;
      for (int64_t ow = ow0; ow < imin(ow1, gyd.W); ++ow) {
        const int64_t ws = start_index(ow, gxd.W, gyd.W), we = end_index(ow, gxd.W, gyd.W);
        if (p.w < ws || p.w >= we) continue;
        acc += convert<A>(gy[gyd.at(p.n, p.c, oh, ow)]) / static_cast<A>((he - hs) * (we - ws));
      }
    }
    gx[gxd.at(p.n, p.c, p.h, p.w)] = convert<T>(acc);
  }
}

void check_operands(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  for (const Tensor* t : ts)
    DLTRAIN_CHECK(t->dim() == 4 && t->device().is_cuda() && t->device() == first.device(), op,
                  " on CUDA: expected 4-d tensors on one CUDA device but got shape ",
                  shape_str(t->shape()), " on ", t->device());
}

void check_window(const char* op, const PoolParams& p) {
  const int64_t v[8] = {p.kernel.h,  p.kernel.w,  p.stride.h,   p.stride.w,
                        p.padding.h, p.padding.w, p.dilation.h, p.dilation.w};
  for (int64_t x : v)
    DLTRAIN_CHECK(x >= 0 && x <= (int64_t(1) << 30), op,
                  " on CUDA: window parameters beyond 2^30 are not supported");
}

}  // namespace

void max_pool2d_forward(const Tensor& y, const Tensor& indices, const Tensor& x,
                        const PoolParams& p) {
  check_operands("max_pool2d", {&y, &indices, &x});
  check_window("max_pool2d", p);
  const int64_t total = y.numel();
  if (total == 0) return;
  const int d = y.device().index;
  Guard guard(d);
  const bool local = indices.dtype() == DType::u8;
  DLTRAIN_CHECK(local || indices.dtype() == DType::i64,
                "max_pool2d on CUDA: internal error: indices must be u8 or i64");
  DLTRAIN_CHECK(!local || p.kernel.h * p.kernel.w < 255,
                "max_pool2d on CUDA: internal error: in-window indices need kH * kW < 255");
  const bool cl = channels_fastest(y);
  cu_dispatch_floating(x.dtype(), "max_pool2d", [&]<class T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    const unsigned grid = grid_for(total, kThreads, d);
    if (local)
      max_fwd_kernel<T, uint8_t, true><<<grid, kThreads, 0, stream(d)>>>(
          xp, dims_of(x), yp, dims_of(y), static_cast<uint8_t*>(indices.data_ptr()),
          dims_of(indices), window_of(p), cl, total);
    else
      max_fwd_kernel<T, int64_t, false><<<grid, kThreads, 0, stream(d)>>>(
          xp, dims_of(x), yp, dims_of(y), static_cast<int64_t*>(indices.data_ptr()),
          dims_of(indices), window_of(p), cl, total);
    DLTRAIN_CUDA_CHECK(cudaGetLastError());
  });
}

void max_pool2d_backward(const Tensor& gx, const Tensor& gy, const Tensor& indices,
                         const PoolParams& p) {
  check_operands("max_pool2d backward", {&gx, &gy, &indices});
  check_window("max_pool2d backward", p);
  const int64_t total = gx.numel();
  if (total == 0) return;
  const int d = gx.device().index;
  Guard guard(d);
  const bool local = indices.dtype() == DType::u8;
  const bool cl = channels_fastest(gx);
  cu_dispatch_floating(gx.dtype(), "max_pool2d backward", [&]<class T>() {
    const T* gp = static_cast<const T*>(gy.data_ptr());
    T* op = static_cast<T*>(gx.data_ptr());
    const unsigned grid = grid_for(total, kThreads, d);
    if (local)
      max_bwd_kernel<T, uint8_t, true><<<grid, kThreads, 0, stream(d)>>>(
          gp, dims_of(gy), static_cast<const uint8_t*>(indices.data_ptr()), dims_of(indices), op,
          dims_of(gx), window_of(p), cl, total);
    else
      max_bwd_kernel<T, int64_t, false><<<grid, kThreads, 0, stream(d)>>>(
          gp, dims_of(gy), static_cast<const int64_t*>(indices.data_ptr()), dims_of(indices), op,
          dims_of(gx), window_of(p), cl, total);
    DLTRAIN_CUDA_CHECK(cudaGetLastError());
  });
}

void avg_pool2d_forward(const Tensor& y, const Tensor& x, const PoolParams& p,
                        bool count_include_pad) {
  check_operands("avg_pool2d", {&y, &x});
  check_window("avg_pool2d", p);
  const int64_t total = y.numel();
  if (total == 0) return;
  const int d = y.device().index;
  Guard guard(d);
  const bool cl = channels_fastest(y);
  cu_dispatch_floating(x.dtype(), "avg_pool2d", [&]<class T>() {
    avg_fwd_kernel<T><<<grid_for(total, kThreads, d), kThreads, 0, stream(d)>>>(
        static_cast<const T*>(x.data_ptr()), dims_of(x), static_cast<T*>(y.data_ptr()), dims_of(y),
        window_of(p), count_include_pad, cl, total);
    DLTRAIN_CUDA_CHECK(cudaGetLastError());
  });
}

void avg_pool2d_backward(const Tensor& gx, const Tensor& gy, const PoolParams& p,
                         bool count_include_pad) {
  check_operands("avg_pool2d backward", {&gx, &gy});
  check_window("avg_pool2d backward", p);
  const int64_t total = gx.numel();
  if (total == 0) return;
  const int d = gx.device().index;
  Guard guard(d);
  const bool cl = channels_fastest(gx);
  cu_dispatch_floating(gx.dtype(), "avg_pool2d backward", [&]<class T>() {
    avg_bwd_kernel<T><<<grid_for(total, kThreads, d), kThreads, 0, stream(d)>>>(
        static_cast<const T*>(gy.data_ptr()), dims_of(gy), static_cast<T*>(gx.data_ptr()),
        dims_of(gx), window_of(p), count_include_pad, cl, total);
    DLTRAIN_CUDA_CHECK(cudaGetLastError());
  });
}

void adaptive_avg_pool2d_forward(const Tensor& y, const Tensor& x) {
  check_operands("adaptive_avg_pool2d", {&y, &x});
  const int64_t total = y.numel();
  if (total == 0) return;
  const int d = y.device().index;
  Guard guard(d);
  const bool cl = channels_fastest(y);
  const bool global_planar = y.size(2) == 1 && y.size(3) == 1 && !channels_fastest(x);
  cu_dispatch_floating(x.dtype(), "adaptive_avg_pool2d", [&]<class T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    if (global_planar) {
      const int64_t planes = x.size(0) * x.size(1);
      global_avg_planar_kernel<T><<<grid_for(planes * 32, kThreads, d), kThreads, 0, stream(d)>>>(
          xp, dims_of(x), yp, dims_of(y));
    } else {
      adaptive_fwd_kernel<T><<<grid_for(total, kThreads, d), kThreads, 0, stream(d)>>>(
          xp, dims_of(x), yp, dims_of(y), cl, total);
    }
    DLTRAIN_CUDA_CHECK(cudaGetLastError());
  });
}

void adaptive_avg_pool2d_backward(const Tensor& gx, const Tensor& gy) {
  check_operands("adaptive_avg_pool2d backward", {&gx, &gy});
  const int64_t total = gx.numel();
  if (total == 0) return;
  const int d = gx.device().index;
  Guard guard(d);
  const bool cl = channels_fastest(gx);
  cu_dispatch_floating(gx.dtype(), "adaptive_avg_pool2d backward", [&]<class T>() {
    adaptive_bwd_kernel<T><<<grid_for(total, kThreads, d), kThreads, 0, stream(d)>>>(
        static_cast<const T*>(gy.data_ptr()), dims_of(gy), static_cast<T*>(gx.data_ptr()),
        dims_of(gx), cl, total);
    DLTRAIN_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace dltrain::backend::cuda
