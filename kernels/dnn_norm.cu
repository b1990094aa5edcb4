// Normalisation kernels of the dnn family (see src/backend/cuda/dnn.hpp): per-channel sums
// (bias gradients), the evaluation-mode batch-norm backward, and layer norm forward and
// backward. cuDNN has no layer norm in its legacy API and no backward for a batch norm that
// used running statistics, hence these.
//
// Per-channel sums view data as [N, C, S] (element (n, c, s) at (n * C + c) * S + s): NCHW is
// S = H * W, channels-last and [M, C] are S = 1 with N the number of rows. Each block sums a
// fixed slice into a partial buffer and one more kernel adds the partials in a fixed order,
// so results do not depend on timing (no atomics). Everything accumulates in acc_t (f32 for
// 16-bit types). Layer norm uses one block per row and two passes (mean, then centred
// squares), like the CPU.
#include <algorithm>

#include "kernels/common.cuh"
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/dnn.hpp"
#include "src/backend/cuda/elementwise.hpp"

namespace dltrain::backend::cuda {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// Sum of v over the block, returned to every thread. blockDim.x is a multiple of 32;
// `shared` holds 32 values and may be reused by the next call at once.
template <class A>
__device__ A block_sum(A v, A* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // every thread has read the previous call's result
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : A(0);
    v = warp_sum(v);
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  return shared[0];
}

template <class A, int K>
struct Vals {
  A v[K];
};

// --- per-channel reductions ---------------------------------------------------------------

// S == 1 layouts: a (32 x 8) block sums 32 channels over one slice of rows, lanes along the
// channels so that every warp reads one contiguous row segment.
template <int K, class A, class F>
__global__ void rows_partial_kernel(F f, int64_t M, int64_t C, int64_t per, A* partial) {
  __shared__ A sh[K][8][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t m0 = blockIdx.y * per, m1 = imin(M, m0 + per);
  A acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = A(0);
  if (c < C)
    for (int64_t m = m0 + threadIdx.y; m < m1; m += 8) {
      const Vals<A, K> v = f(m, c, 0);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] += v.v[k];
    }
#pragma unroll
  for (int k = 0; k < K; ++k) sh[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      A t = A(0);
      for (int y = 0; y < 8; ++y) t += sh[k][y][threadIdx.x];
      partial[(blockIdx.y * K + k) * C + c] = t;
    }
  }
}

// S > 1 layouts: a block sums one channel over one slice of its N * S elements.
template <int K, class A, class F>
__global__ void planar_partial_kernel(F f, int64_t N, int64_t C, int64_t S, int64_t per,
                                      A* partial) {
  __shared__ A sh[32];
  const int64_t c = blockIdx.x;
  const int64_t total = N * S, t0 = blockIdx.y * per, t1 = imin(total, t0 + per);
  A acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = A(0);
  for (int64_t t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
    const int64_t n = t / S, s = t - n * S;
    const Vals<A, K> v = f(n, c, s);
#pragma unroll
    for (int k = 0; k < K; ++k) acc[k] += v.v[k];
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const A r = block_sum(acc[k], sh);
    if (threadIdx.x == 0) partial[(blockIdx.y * K + k) * C + c] = r;
  }
}

template <int K, class A>
__global__ void partial_finish_kernel(const A* partial, int64_t G, int64_t C, A* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < K * C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = i / C, c = i - k * C;
    A t = A(0);
    for (int64_t g = 0; g < G; ++g) t += partial[(g * K + k) * C + c];
    out[i] = t;
  }
}

template <class A>
DType acc_dtype() {
  return std::is_same_v<A, double> ? DType::f64 : DType::f32;
}

// [K, C] tensor of acc_t sums of f(n, c, s) over n < N, s < S per channel c.
template <int K, class A, class F>
Tensor channel_reduce(const F& f, int64_t N, int64_t C, int64_t S, Device dev) {
  Tensor out = empty({K, C}, TensorOptions(acc_dtype<A>()).with_device(dev));
  if (C == 0) return out;
  if (N * S == 0) {
    fill(out.data_ptr(), out.dtype(), out.numel(), 0.0, dev);
    return out;
  }
  const int d = dev.index;
  const int64_t sms = sm_count(d);
  cudaStream_t st = stream(d);
  Tensor partial;
  int64_t G = 1;
  if (S == 1) {
    const int64_t tiles = ceil_div(C, 32);
    G = std::clamp<int64_t>(ceil_div(4 * sms, tiles), 1, std::min<int64_t>(ceil_div(N, 64), 65535));
    const int64_t per = ceil_div(N, G);
    G = ceil_div(N, per);
    partial = empty({G * K * C}, TensorOptions(acc_dtype<A>()).with_device(dev));
    rows_partial_kernel<K, A>
        <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(G)), dim3(32, 8), 0, st>>>(
            f, N, C, per, static_cast<A*>(partial.data_ptr()));
  } else {
    const int64_t total = N * S;
    G = std::clamp<int64_t>(ceil_div(4 * sms, C), 1,
                            std::min<int64_t>(ceil_div(total, 2048), 65535));
    const int64_t per = ceil_div(total, G);
    G = ceil_div(total, per);
    partial = empty({G * K * C}, TensorOptions(acc_dtype<A>()).with_device(dev));
    planar_partial_kernel<K, A>
        <<<dim3(static_cast<unsigned>(C), static_cast<unsigned>(G)), 256, 0, st>>>(
            f, N, C, S, per, static_cast<A*>(partial.data_ptr()));
  }
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
  partial_finish_kernel<K, A><<<grid_for(K * C, 256, d), 256, 0, st>>>(
      static_cast<const A*>(partial.data_ptr()), G, C, static_cast<A*>(out.data_ptr()));
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
  return out;
}

// How a dense tensor [N, C, ...] maps onto the [N, C, S] view.
struct ChannelView {
  int64_t N, C, S;
};

bool is_nhwc_only(const Tensor& t) {
  return t.dim() == 4 && t.is_contiguous(MemoryFormat::ChannelsLast) && !t.is_contiguous();
}

// `t` as an [N, C, S] view: [M, C] and channels-last 4-d are S = 1; anything else is made
// contiguous (t is replaced by the copy).
ChannelView channel_view(Tensor& t) {
  const int64_t C = t.size(1);
  if (is_nhwc_only(t)) return {t.size(0) * t.size(2) * t.size(3), C, 1};
  t = t.contiguous();
  int64_t S = 1;
  for (int64_t d = 2; d < t.dim(); ++d) S *= t.size(d);
  return {t.size(0), C, S};
}

template <class T, class A>
struct SumOp {
  const T* g;
  int64_t C, S;
  __device__ Vals<A, 1> operator()(int64_t n, int64_t c, int64_t s) const {
    return {{convert<A>(g[(n * C + c) * S + s])}};
  }
};

// {g, g * xhat} of the evaluation-mode batch norm.
template <class T, class A>
struct BnEvalOp {
  const T* g;
  const T* x;
  const A* mean;
  const A* var;
  A eps;
  int64_t C, S;
  __device__ Vals<A, 2> operator()(int64_t n, int64_t c, int64_t s) const {
    const int64_t i = (n * C + c) * S + s;
    const A gv = convert<A>(g[i]);
    const A xhat = (convert<A>(x[i]) - mean[c]) / sqrt(var[c] + eps);
    return {{gv, gv * xhat}};
  }
};

// {g * xhat, g} of layer norm; rows are n, columns c (S == 1).
template <class T, class A>
struct LnParamOp {
  const T* g;
  const T* x;
  const A* mean;
  const A* rstd;
  int64_t D;
  __device__ Vals<A, 2> operator()(int64_t r, int64_t j, int64_t) const {
    const int64_t i = r * D + j;
    const A gv = convert<A>(g[i]);
    return {{gv * (convert<A>(x[i]) - mean[r]) * rstd[r], gv}};
  }
};

template <class T, class A>
__global__ void bn_eval_dx_kernel(const T* g, const A* w, const A* var, A eps, T* dx, int64_t n,
                                  int64_t C, int64_t S) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = (i / S) % C;
    dx[i] = convert<T>(convert<A>(g[i]) * (w[c] / sqrt(var[c] + eps)));
  }
}

// --- layer norm ------------------------------------------------------------------------------

template <class T, class A>
__global__ void layer_norm_fwd_kernel(const T* x, const A* w, const A* b, T* y, A* mean, A* rstd,
                                      int64_t R, int64_t D, A eps) {
  __shared__ A sh[32];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* xr = x + r * D;
    A s = A(0);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += convert<A>(xr[j]);
    const A mu = block_sum(s, sh) / static_cast<A>(D);
    A q = A(0);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const A d = convert<A>(xr[j]) - mu;
      q += d * d;
    }
    const A var = block_sum(q, sh) / static_cast<A>(D);
    const A is = A(1) / sqrt(var + eps);
    if (threadIdx.x == 0) {
      mean[r] = mu;
      rstd[r] = is;
    }
    T* yr = y + r * D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      A v = (convert<A>(xr[j]) - mu) * is;
      if (w) v = v * w[j];
      if (b) v = v + b[j];
      yr[j] = convert<T>(v);
    }
  }
}

template <class T, class A>
__global__ void layer_norm_dx_kernel(const T* x, const T* g, const A* w, const A* mean,
                                     const A* rstd, T* dx, int64_t R, int64_t D) {
  __shared__ A sh[32];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* xr = x + r * D;
    const T* gr = g + r * D;
    const A mu = mean[r], is = rstd[r];
    A s1 = A(0), s2 = A(0);  // sum(g * w), sum(g * w * xhat)
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const A gw = convert<A>(gr[j]) * (w ? w[j] : A(1));
      s1 += gw;
      s2 += gw * (convert<A>(xr[j]) - mu) * is;
    }
    const A m1 = block_sum(s1, sh) / static_cast<A>(D);
    const A m2 = block_sum(s2, sh) / static_cast<A>(D);
    T* dr = dx + r * D;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const A xhat = (convert<A>(xr[j]) - mu) * is;
      const A gw = convert<A>(gr[j]) * (w ? w[j] : A(1));
      dr[j] = convert<T>(is * (gw - m1 - xhat * m2));
    }
  }
}

int row_threads(int64_t D) {
  if (D <= 64) return 32;
  if (D <= 256) return 64;
  if (D <= 1024) return 128;
  return 256;
}

template <class A>
const A* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const A*>(t.data_ptr()) : nullptr;
}

void check_cuda(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first) first = t;
    DLTRAIN_CHECK(t->device().is_cuda() && t->device() == first->device(), op,
                  " on CUDA: expected every tensor on one CUDA device but got ", t->device(),
                  " and ", first->device());
  }
}

}  // namespace

void channel_sum(const Tensor& out, const Tensor& g0) {
  check_cuda("channel_sum", {&out, &g0});
  DLTRAIN_CHECK(g0.dim() >= 2 && out.dim() == 1 && out.size(0) == g0.size(1) && out.is_contiguous(),
                "channel_sum on CUDA: expected g [N, C, ...] and out [C] but got ",
                shape_str(g0.shape()), " and ", shape_str(out.shape()));
  Guard guard(out.device());
  Tensor g = g0;
  const ChannelView v = channel_view(g);
  cu_dispatch_floating(g.dtype(), "channel_sum", [&]<class T>() {
    using A = acc_t<T>;
    const Tensor sums = channel_reduce<1, A>(
        SumOp<T, A>{static_cast<const T*>(g.data_ptr()), v.C, v.S}, v.N, v.C, v.S, g.device());
    copy(out, sums.select(0, 0));
  });
}

void batch_norm_backward_eval(const Tensor& gx, const Tensor& gweight, const Tensor& gbias,
                              const Tensor& gy0, const Tensor& x0, const Tensor& weight,
                              const Tensor& running_mean, const Tensor& running_var, double eps) {
  check_cuda("batch_norm backward",
             {&gx, &gweight, &gbias, &gy0, &x0, &weight, &running_mean, &running_var});
  Guard guard(x0.device());
  Tensor x = x0, gy = gy0;
  const ChannelView v = channel_view(x);
  const ChannelView vg = channel_view(gy);
  DLTRAIN_CHECK(v.N == vg.N && v.S == vg.S && gy.dtype() == x.dtype(),
                "batch_norm backward on CUDA: internal error: x and grad layouts differ");
  cu_dispatch_floating(x.dtype(), "batch_norm backward", [&]<class T>() {
    using A = acc_t<T>;
    DLTRAIN_CHECK(running_mean.dtype() == acc_dtype<A>() && running_var.dtype() == acc_dtype<A>() &&
                      weight.dtype() == acc_dtype<A>(),
                  "batch_norm backward on CUDA: internal error: statistics must be ",
                  acc_dtype<A>());
    const A* mean = static_cast<const A*>(running_mean.data_ptr());
    const A* var = static_cast<const A*>(running_var.data_ptr());
    const T* gp = static_cast<const T*>(gy.data_ptr());
    if (gweight.defined() || gbias.defined()) {
      const Tensor sums =
          channel_reduce<2, A>(BnEvalOp<T, A>{gp, static_cast<const T*>(x.data_ptr()), mean, var,
                                              static_cast<A>(eps), v.C, v.S},
                               v.N, v.C, v.S, x.device());
      if (gbias.defined()) copy(gbias, sums.select(0, 0));
      if (gweight.defined()) copy(gweight, sums.select(0, 1));
    }
    if (gx.defined()) {
      DLTRAIN_CHECK(gx.shape() == gy.shape() &&
                        (is_nhwc_only(gy) ? gx.is_contiguous(MemoryFormat::ChannelsLast)
                                          : gx.is_contiguous()),
                    "batch_norm backward on CUDA: internal error: grad_input layout");
      const int64_t n = gx.numel();
      if (n == 0) return;
      const int d = gx.device().index;
      bn_eval_dx_kernel<T, A><<<grid_for(n, 256, d), 256, 0, stream(d)>>>(
          gp, static_cast<const A*>(weight.data_ptr()), var, static_cast<A>(eps),
          static_cast<T*>(gx.data_ptr()), n, v.C, v.S);
      DLTRAIN_CUDA_CHECK(cudaGetLastError());
    }
  });
}

void layer_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, int64_t D, double eps) {
  check_cuda("layer_norm", {&y, &mean, &rstd, &x, &weight, &bias});
  DLTRAIN_CHECK(x.is_contiguous() && y.is_contiguous() && D > 0 && x.numel() % D == 0,
                "layer_norm on CUDA: internal error: expected contiguous rows of ", D);
  const int64_t R = x.numel() / D;
  if (R == 0) return;
  const int d = x.device().index;
  Guard guard(d);
  cu_dispatch_floating(x.dtype(), "layer_norm", [&]<class T>() {
    using A = acc_t<T>;
    const int threads = row_threads(D);
    layer_norm_fwd_kernel<T, A><<<grid_for(R, 1, d), threads, 0, stream(d)>>>(
        static_cast<const T*>(x.data_ptr()), ptr_or_null<A>(weight), ptr_or_null<A>(bias),
        static_cast<T*>(y.data_ptr()), static_cast<A*>(mean.data_ptr()),
        static_cast<A*>(rstd.data_ptr()), R, D, static_cast<A>(eps));
    DLTRAIN_CUDA_CHECK(cudaGetLastError());
  });
}

void layer_norm_backward(const Tensor& gx, const Tensor& gweight, const Tensor& gbias,
                         const Tensor& gy, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& rstd, int64_t D) {
  check_cuda("layer_norm backward", {&gx, &gweight, &gbias, &gy, &x, &weight, &mean, &rstd});
  DLTRAIN_CHECK(x.is_contiguous() && gy.is_contiguous() && (!gx.defined() || gx.is_contiguous()) &&
                    D > 0 && x.numel() % D == 0,
                "layer_norm backward on CUDA: internal error: expected contiguous rows of ", D);
  const int64_t R = x.numel() / D;
  const int d = x.device().index;
  Guard guard(d);
  cu_dispatch_floating(x.dtype(), "layer_norm backward", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* gp = static_cast<const T*>(gy.data_ptr());
    const A* mp = static_cast<const A*>(mean.data_ptr());
    const A* rp = static_cast<const A*>(rstd.data_ptr());
    if (gx.defined() && R > 0) {
      layer_norm_dx_kernel<T, A><<<grid_for(R, 1, d), row_threads(D), 0, stream(d)>>>(
          xp, gp, ptr_or_null<A>(weight), mp, rp, static_cast<T*>(gx.data_ptr()), R, D);
      DLTRAIN_CUDA_CHECK(cudaGetLastError());
    }
    if (gweight.defined() || gbias.defined()) {
      const Tensor sums =
          channel_reduce<2, A>(LnParamOp<T, A>{gp, xp, mp, rp, D}, R, D, 1, x.device());
      if (gweight.defined()) copy(gweight, sums.select(0, 0));
      if (gbias.defined()) copy(gbias, sums.select(0, 1));
    }
  });
}

}  // namespace dltrain::backend::cuda
