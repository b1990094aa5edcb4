// Softmax, log_softmax, the fused cross-entropy, nll_loss, the elementwise pieces of
// binary_cross_entropy_with_logits and dropout on CUDA (entry points in
// src/backend/cuda/loss.hpp).
//
// Softmax-like ops see a contiguous tensor as [outer, L, inner] around the reduced dim L.
// Rows (inner == 1) are reduced by one warp per row (L <= 1024, 8 rows per block) or one
// block per row; columns (inner > 1) by one thread per column walking L with stride inner
// (coalesced across neighbouring columns), after a transpose to rows when there are too few
// columns to fill the GPU. Everything accumulates in acc_t (float for f16/bf16); the
// cross-entropy sums over classes and samples in double, as the CPU does, and saves the
// per-sample log-sum-exp (in acc_t) so that backward is one kernel. Reductions never sync the
// host: each block of the per-sample kernel writes its partial loss and weight sums, and a
// one-block kernel divides on the device and keeps the summed weight for backward. Targets
// are not range-checked (that would need a sync): an out-of-range target other than
// ignore_index gives its sample a NaN loss and gradient. Dropout draws the CPU's mask bit
// for bit: element i (row-major) uses the same Philox-4x32-10 words as rand() (counter
// base + i / 2, lanes (i % 2) * 2 and + 1), converted to the same uniform in the same
// precision, and its backward reuses the saved u8 mask.
#include <cmath>

#include "kernels/common.cuh"
#include "src/backend/cuda/loss.hpp"
#include "src/core/philox.hpp"

namespace dltrain::backend::cuda {

namespace {

// --- math and reductions -------------------------------------------------------------

template <class A>
__device__ __forceinline__ A neg_inf() {
  return -static_cast<A>(INFINITY);
}

__device__ __forceinline__ double nan_d() { return __longlong_as_double(0x7ff8000000000000ll); }

struct MaxOp {
  template <class V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return a < b ? b : a;
  }
};
struct SumOp {
  template <class V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return a + b;
  }
};

template <class V, class Op>
__device__ __forceinline__ V warp_all_reduce(V v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduces v over the kThreads threads (threadIdx.x) that share a row; every one of them gets
// the result. kThreads > 32 needs blockDim.y == 1 (the whole block is the group) and uses
// `scratch` (32 slots of V) and __syncthreads, so all threads of the block must call it.
template <int kThreads, class V, class Op>
__device__ __forceinline__ V group_all_reduce(V v, Op op, V* scratch) {
  v = warp_all_reduce(v, op);
  if constexpr (kThreads > 32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // the previous reduction's readers are done with scratch
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[0];
#pragma unroll
    for (int k = 1; k < kThreads / 32; ++k) v = op(v, scratch[k]);
  }
  return v;
}

// Sums a and b over the whole block (blockDim.x * blockDim.y a multiple of 32, <= 1024), in a
// fixed order; thread (0, 0) gets the totals. Every thread of the block must call it.
__device__ __forceinline__ void block_sum2(double& a, double& b) {
  __shared__ double sa[32], sb[32];
  a = warp_all_reduce(a, SumOp{});
  b = warp_all_reduce(b, SumOp{});
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int warps = (blockDim.x * blockDim.y + 31) / 32;
  __syncthreads();
  if ((tid & 31) == 0) {
    sa[tid >> 5] = a;
    sb[tid >> 5] = b;
  }
  __syncthreads();
  if (tid == 0) {
    a = sa[0];
    b = sb[0];
    for (int k = 1; k < warps; ++k) {
      a += sa[k];
      b += sb[k];
    }
  }
}

// Threads per row for a row length L, and the launch shape that goes with it.
struct RowLaunch {
  int threads;  // per row
  dim3 block;
  unsigned grid;
};

RowLaunch row_launch(int64_t rows, int64_t L, int dev) {
  RowLaunch r;
  r.threads = L <= 1024 ? 32 : (L <= 8192 ? 256 : 1024);
  const int per_block = r.threads == 32 ? 8 : 1;
  r.block = dim3(r.threads, per_block);
  const int64_t need = (rows + per_block - 1) / per_block;
  const int64_t cap = static_cast<int64_t>(sm_count(dev)) * (r.threads == 1024 ? 2 : 8);
  r.grid = static_cast<unsigned>(std::max<int64_t>(1, std::min(need, cap)));
  return r;
}

// Calls f.template operator()<kThreads>() with the compile-time threads per row.
template <class F>
void with_row_threads(int threads, F&& f) {
  if (threads == 32) {
    f.template operator()<32>();
  } else if (threads == 256) {
    f.template operator()<256>();
  } else {
    f.template operator()<1024>();
  }
}

constexpr int kThreads = 256;

template <class T>
const T* cptr(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}
template <class T>
T* mptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}
template <class T>
const T* cptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}

void check_launch() { DLTRAIN_CUDA_CHECK(cudaGetLastError()); }

// --- softmax -------------------------------------------------------------------------

template <class T, int kT>
__global__ void __launch_bounds__(kT == 32 ? 256 : kT)
    softmax_rows_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t L,
                        bool log) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows;
       r += step) {
    const T* xr = x + r * L;
    T* yr = y + r * L;
    A mx = neg_inf<A>();
    for (int64_t l = threadIdx.x; l < L; l += kT) mx = MaxOp{}(mx, convert<A>(xr[l]));
    mx = group_all_reduce<kT>(mx, MaxOp{}, scratch);
    A s = A(0);
    for (int64_t l = threadIdx.x; l < L; l += kT) s += dm::exp(convert<A>(xr[l]) - mx);
    s = group_all_reduce<kT>(s, SumOp{}, scratch);
    if (log) {
      const A lse = mx + dm::log(s);
      for (int64_t l = threadIdx.x; l < L; l += kT) yr[l] = convert<T>(convert<A>(xr[l]) - lse);
    } else {
      const A inv = A(1) / s;
      for (int64_t l = threadIdx.x; l < L; l += kT)
        yr[l] = convert<T>(dm::exp(convert<A>(xr[l]) - mx) * inv);
    }
  }
}

template <class T>
__global__ void softmax_cols_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer,
                                    int64_t L, int64_t inner, bool log) {
  using A = acc_t<T>;
  const int64_t cols = outer * inner;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < cols;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = (u / inner) * L * inner + u % inner;
    const T* xc = x + base;
    T* yc = y + base;
    A mx = neg_inf<A>();
    for (int64_t l = 0; l < L; ++l) mx = MaxOp{}(mx, convert<A>(xc[l * inner]));
    A s = A(0);
    for (int64_t l = 0; l < L; ++l) s += dm::exp(convert<A>(xc[l * inner]) - mx);
    if (log) {
      const A lse = mx + dm::log(s);
      for (int64_t l = 0; l < L; ++l) yc[l * inner] = convert<T>(convert<A>(xc[l * inner]) - lse);
    } else {
      const A inv = A(1) / s;
      for (int64_t l = 0; l < L; ++l)
        yc[l * inner] = convert<T>(dm::exp(convert<A>(xc[l * inner]) - mx) * inv);
    }
  }
}

template <class T, int kT>
__global__ void __launch_bounds__(kT == 32 ? 256 : kT)
    softmax_rows_backward_kernel(const T* __restrict__ g, const T* __restrict__ y,
                                 T* __restrict__ dx, int64_t rows, int64_t L, bool log) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows;
       r += step) {
    const T* gr = g + r * L;
    const T* yr = y + r * L;
    T* dr = dx + r * L;
    A t = A(0);
    for (int64_t l = threadIdx.x; l < L; l += kT)
      t += log ? convert<A>(gr[l]) : convert<A>(gr[l]) * convert<A>(yr[l]);
    t = group_all_reduce<kT>(t, SumOp{}, scratch);
    for (int64_t l = threadIdx.x; l < L; l += kT) {
      dr[l] = log ? convert<T>(convert<A>(gr[l]) - dm::exp(convert<A>(yr[l])) * t)
                  : convert<T>(convert<A>(yr[l]) * (convert<A>(gr[l]) - t));
    }
  }
}

template <class T>
__global__ void softmax_cols_backward_kernel(const T* __restrict__ g, const T* __restrict__ y,
                                             T* __restrict__ dx, int64_t outer, int64_t L,
                                             int64_t inner, bool log) {
  using A = acc_t<T>;
  const int64_t cols = outer * inner;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < cols;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = (u / inner) * L * inner + u % inner;
    A t = A(0);
    for (int64_t l = 0; l < L; ++l) {
      const int64_t i = base + l * inner;
      t += log ? convert<A>(g[i]) : convert<A>(g[i]) * convert<A>(y[i]);
    }
    for (int64_t l = 0; l < L; ++l) {
      const int64_t i = base + l * inner;
      dx[i] = log ? convert<T>(convert<A>(g[i]) - dm::exp(convert<A>(y[i])) * t)
                  : convert<T>(convert<A>(y[i]) * (convert<A>(g[i]) - t));
    }
  }
}

// Too few columns for one thread each to fill the GPU, and long lines: transposing to rows
// (two copies) beats a handful of threads walking L serially.
bool transpose_columns(int64_t outer, int64_t L, int64_t inner, int dev) {
  return inner > 1 && outer * inner < static_cast<int64_t>(sm_count(dev)) * 64 && L >= 64;
}

void softmax_rows(const Tensor& y, const Tensor& x, int64_t rows, int64_t L, bool log) {
  const int dev = x.device().index;
  const RowLaunch rl = row_launch(rows, L, dev);
  cu_dispatch_floating(x.dtype(), log ? "log_softmax" : "softmax", [&]<class T>() {
    with_row_threads(rl.threads, [&]<int kT>() {
      softmax_rows_kernel<T, kT>
          <<<rl.grid, rl.block, 0, stream(dev)>>>(cptr<T>(x), mptr<T>(y), rows, L, log);
    });
  });
  check_launch();
}

void softmax_rows_backward(const Tensor& dx, const Tensor& g, const Tensor& y, int64_t rows,
                           int64_t L, bool log) {
  const int dev = y.device().index;
  const RowLaunch rl = row_launch(rows, L, dev);
  cu_dispatch_floating(
      y.dtype(), log ? "log_softmax_backward" : "softmax_backward", [&]<class T>() {
        with_row_threads(rl.threads, [&]<int kT>() {
          softmax_rows_backward_kernel<T, kT><<<rl.grid, rl.block, 0, stream(dev)>>>(
              cptr<T>(g), cptr<T>(y), mptr<T>(dx), rows, L, log);
        });
      });
  check_launch();
}

// [outer, L, inner] (contiguous) as a contiguous [outer, inner, L] copy.
Tensor to_rows(const Tensor& t, int64_t outer, int64_t L, int64_t inner) {
  return t.view({outer, L, inner}).transpose(1, 2).contiguous();
}

// --- class-index losses --------------------------------------------------------------

// The loss of one sample given its log-sum-exp `l`, the target's score `xt` and the weighted
// score sum `wx` (label smoothing only); accumulates the sample's weight into `tw`.
__device__ __forceinline__ double ce_sample_loss(int64_t t, int64_t C, int64_t ignore,
                                                 const double* w, const double* wsum, double eps,
                                                 double l, double xt, double wx, double& tw) {
  if (t == ignore) return 0.0;
  if (t < 0 || t >= C) {
    tw += nan_d();
    return nan_d();
  }
  const double wt = w ? w[t] : 1.0;
  tw += wt;
  double loss = (1.0 - eps) * wt * (l - xt);
  if (eps > 0.0) {
    const double W = wsum ? *wsum : static_cast<double>(C);
    loss += eps / static_cast<double>(C) * (W * l - wx);
  }
  return loss;
}

template <class T, int kT>
__global__ void __launch_bounds__(kT == 32 ? 256 : kT)
    ce_rows_kernel(const T* __restrict__ x, const int64_t* __restrict__ target,
                   const double* __restrict__ w, const double* __restrict__ wsum, int64_t rows,
                   int64_t C, int64_t ignore, double eps, acc_t<T>* __restrict__ lse,
                   T* __restrict__ out, double* __restrict__ partial) {
  using A = acc_t<T>;
  __shared__ double scratch[32];
  double my_loss = 0.0, my_w = 0.0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows;
       r += step) {
    const T* xr = x + r * C;
    A mx = neg_inf<A>();
    for (int64_t c = threadIdx.x; c < C; c += kT) mx = MaxOp{}(mx, convert<A>(xr[c]));
    mx = group_all_reduce<kT>(mx, MaxOp{}, reinterpret_cast<A*>(scratch));
    double se = 0.0, wx = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += kT) {
      const A v = convert<A>(xr[c]);
      se += static_cast<double>(dm::exp(v - mx));
      if (eps > 0.0) wx += (w ? w[c] : 1.0) * static_cast<double>(v);
    }
    se = group_all_reduce<kT>(se, SumOp{}, scratch);
    if (eps > 0.0) wx = group_all_reduce<kT>(wx, SumOp{}, scratch);
    if (threadIdx.x == 0) {
      const double l = static_cast<double>(mx) + dm::log(se);
      lse[r] = static_cast<A>(l);
      const int64_t t = target[r];
      const double xt = (t >= 0 && t < C) ? static_cast<double>(convert<A>(xr[t])) : 0.0;
      const double loss = ce_sample_loss(t, C, ignore, w, wsum, eps, l, xt, wx, my_w);
      if (out) out[r] = convert<T>(loss);
      my_loss += loss;
    }
  }
  if (partial) {
    block_sum2(my_loss, my_w);
    if (threadIdx.x == 0 && threadIdx.y == 0) {
      partial[2 * blockIdx.x] = my_loss;
      partial[2 * blockIdx.x + 1] = my_w;
    }
  }
}

template <class T>
__global__ void ce_cols_kernel(const T* __restrict__ x, const int64_t* __restrict__ target,
                               const double* __restrict__ w, const double* __restrict__ wsum,
                               int64_t N, int64_t C, int64_t S, int64_t ignore, double eps,
                               acc_t<T>* __restrict__ lse, T* __restrict__ out,
                               double* __restrict__ partial) {
  using A = acc_t<T>;
  double my_loss = 0.0, my_w = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N * S;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T* xc = x + (i / S) * C * S + i % S;
    A mx = neg_inf<A>();
    double wx = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const A v = convert<A>(xc[c * S]);
      mx = MaxOp{}(mx, v);
      if (eps > 0.0) wx += (w ? w[c] : 1.0) * static_cast<double>(v);
    }
    double se = 0.0;
    for (int64_t c = 0; c < C; ++c) se += static_cast<double>(dm::exp(convert<A>(xc[c * S]) - mx));
    const double l = static_cast<double>(mx) + dm::log(se);
    lse[i] = static_cast<A>(l);
    const int64_t t = target[i];
    const double xt = (t >= 0 && t < C) ? static_cast<double>(convert<A>(xc[t * S])) : 0.0;
    const double loss = ce_sample_loss(t, C, ignore, w, wsum, eps, l, xt, wx, my_w);
    if (out) out[i] = convert<T>(loss);
    my_loss += loss;
  }
  if (partial) {
    block_sum2(my_loss, my_w);
    if (threadIdx.x == 0) {
      partial[2 * blockIdx.x] = my_loss;
      partial[2 * blockIdx.x + 1] = my_w;
    }
  }
}

template <class T>
__global__ void nll_kernel(const T* __restrict__ x, const int64_t* __restrict__ target,
                           const double* __restrict__ w, int64_t N, int64_t C, int64_t S,
                           int64_t ignore, T* __restrict__ out, double* __restrict__ partial) {
  using A = acc_t<T>;
  double my_loss = 0.0, my_w = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N * S;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = target[i];
    double loss = 0.0;
    if (t != ignore) {
      if (t < 0 || t >= C) {
        loss = nan_d();
        my_w += nan_d();
      } else {
        const double wt = w ? w[t] : 1.0;
        my_w += wt;
        loss = -wt * static_cast<double>(convert<A>(x[((i / S) * C + t) * S + i % S]));
      }
    }
    if (out) out[i] = convert<T>(loss);
    my_loss += loss;
  }
  if (partial) {
    block_sum2(my_loss, my_w);
    if (threadIdx.x == 0) {
      partial[2 * blockIdx.x] = my_loss;
      partial[2 * blockIdx.x + 1] = my_w;
    }
  }
}

// Sums the per-block (loss, weight) partials in a fixed order; writes the reduced loss
// (divided by the summed weight for Mean) and the summed weight. One block.
template <class T>
__global__ void __launch_bounds__(1024)
    loss_finalize_kernel(const double* __restrict__ partial, int64_t blocks, bool mean,
                         T* __restrict__ out, double* __restrict__ total_weight) {
  double s = 0.0, tw = 0.0;
  for (int64_t k = threadIdx.x; k < blocks; k += blockDim.x) {
    s += partial[2 * k];
    tw += partial[2 * k + 1];
  }
  block_sum2(s, tw);
  if (threadIdx.x == 0) {
    out[0] = convert<T>(mean ? s / tw : s);
    if (total_weight) *total_weight = tw;
  }
}

__global__ void weight_sum_kernel(const double* __restrict__ w, int64_t C,
                                  double* __restrict__ out) {
  double s = 0.0, unused = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += w[c];
  block_sum2(s, unused);
  if (threadIdx.x == 0) *out = s;
}

// The upstream gradient of sample i: per sample (None) or the scalar, divided by the summed
// weight for Mean.
template <class T>
__device__ __forceinline__ double sample_grad(const T* g, bool per_sample, const double* total_w,
                                              int64_t i) {
  if (per_sample) return static_cast<double>(convert<acc_t<T>>(g[i]));
  double v = static_cast<double>(convert<acc_t<T>>(g[0]));
  if (total_w) v /= *total_w;
  return v;
}

// Per-sample coefficients of d loss / d x_c = p_c * ps - (es_w * w_c + [c == t] * tt) (see
// src/ops/loss.cpp), in the accumulation type; `zero` when the sample contributes nothing.
template <class A>
struct CeCoef {
  A ps, es, tt;
  bool zero, bad;
};

template <class A>
__device__ __forceinline__ CeCoef<A> ce_coef(int64_t t, double gs, int64_t C, int64_t ignore,
                                             const double* w, const double* wsum, double eps) {
  CeCoef<A> k{A(0), A(0), A(0), false, false};
  if (t == ignore || gs == 0.0) {
    k.zero = true;
    return k;
  }
  if (t < 0 || t >= C) {
    k.bad = true;
    return k;
  }
  const double es = eps / static_cast<double>(C);
  const double wt = w ? w[t] : 1.0;
  const double W = wsum ? *wsum : static_cast<double>(C);
  k.ps = static_cast<A>(((1.0 - eps) * wt + es * W) * gs);
  k.es = static_cast<A>(es * gs);
  k.tt = static_cast<A>((1.0 - eps) * wt * gs);
  return k;
}

template <class T>
__device__ __forceinline__ T ce_grad(const CeCoef<acc_t<T>>& k, T xv, acc_t<T> l, int64_t c,
                                     int64_t t, const double* w) {
  using A = acc_t<T>;
  if (k.zero) return convert<T>(A(0));
  if (k.bad) return convert<T>(nan_d());
  A v = k.ps * dm::exp(convert<A>(xv) - l) - k.es * static_cast<A>(w ? w[c] : 1.0);
  if (c == t) v -= k.tt;
  return convert<T>(v);
}

template <class T, int kT>
__global__ void __launch_bounds__(kT == 32 ? 256 : kT)
    ce_rows_backward_kernel(const T* __restrict__ x, const acc_t<T>* __restrict__ lse,
                            const int64_t* __restrict__ target, const double* __restrict__ w,
                            const double* __restrict__ wsum, const T* __restrict__ g,
                            bool per_sample, const double* __restrict__ total_w, int64_t rows,
                            int64_t C, int64_t ignore, double eps, T* __restrict__ dx) {
  using A = acc_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows;
       r += step) {
    const int64_t t = target[r];
    const CeCoef<A> k =
        ce_coef<A>(t, sample_grad(g, per_sample, total_w, r), C, ignore, w, wsum, eps);
    const A l = lse[r];
    const T* xr = x + r * C;
    T* dr = dx + r * C;
    for (int64_t c = threadIdx.x; c < C; c += kT) dr[c] = ce_grad<T>(k, xr[c], l, c, t, w);
  }
}

template <class T>
__global__ void ce_cols_backward_kernel(const T* __restrict__ x, const acc_t<T>* __restrict__ lse,
                                        const int64_t* __restrict__ target,
                                        const double* __restrict__ w,
                                        const double* __restrict__ wsum, const T* __restrict__ g,
                                        bool per_sample, const double* __restrict__ total_w,
                                        int64_t N, int64_t C, int64_t S, int64_t ignore, double eps,
                                        T* __restrict__ dx) {
  using A = acc_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N * S;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = target[i];
    const CeCoef<A> k =
        ce_coef<A>(t, sample_grad(g, per_sample, total_w, i), C, ignore, w, wsum, eps);
    const A l = lse[i];
    const int64_t base = (i / S) * C * S + i % S;
    for (int64_t c = 0; c < C; ++c) dx[base + c * S] = ce_grad<T>(k, x[base + c * S], l, c, t, w);
  }
}

template <class T>
__global__ void nll_backward_kernel(const int64_t* __restrict__ target,
                                    const double* __restrict__ w, const T* __restrict__ g,
                                    bool per_sample, const double* __restrict__ total_w, int64_t N,
                                    int64_t C, int64_t S, int64_t ignore, T* __restrict__ dx) {
  const int64_t n = N * C * S;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = e % S, c = (e / S) % C, i = (e / (C * S)) * S + s;
    const int64_t t = target[i];
    double v = 0.0;
    if (t != ignore) {
      if (t < 0 || t >= C) {
        v = nan_d();
      } else if (c == t) {
        v = -(w ? w[t] : 1.0) * sample_grad(g, per_sample, total_w, i);
      }
    }
    dx[e] = convert<T>(v);
  }
}

// Runs the one-block reduction of the per-sample kernel's partials into `out`.
template <class T>
void finalize(const Tensor& out, const Tensor& total_weight, const Tensor& partial, int64_t blocks,
              bool mean, int dev) {
  loss_finalize_kernel<T>
      <<<1, 1024, 0, stream(dev)>>>(cptr<double>(partial), blocks, mean, mptr<T>(out),
                                    total_weight.defined() ? mptr<double>(total_weight) : nullptr);
  check_launch();
}

// Device scalar with the sum of the class weights (label smoothing needs it), or undefined.
Tensor weight_sum(const Tensor& weight, double eps, int dev) {
  if (!weight.defined() || eps <= 0.0) return Tensor();
  Tensor s = empty({}, TensorOptions(DType::f64).with_device(weight.device()));
  weight_sum_kernel<<<1, 256, 0, stream(dev)>>>(cptr<double>(weight), weight.numel(),
                                                mptr<double>(s));
  check_launch();
  return s;
}

// --- binary cross-entropy pieces ---------------------------------------------------------

template <class A>
__device__ __forceinline__ A softplus_neg_of(A x) {
  const A m = -x > A(0) ? -x : A(0);
  return dm::log1p(dm::exp(-dm::fabs(x))) + m;
}

template <class T>
struct BceOp {
  __device__ __forceinline__ T operator()(T xv, T yv, T pv) const {
    using A = acc_t<T>;
    const A a = convert<A>(xv), t = convert<A>(yv), p = convert<A>(pv);
    return convert<T>((A(1) - t) * a + (A(1) + (p - A(1)) * t) * softplus_neg_of(a));
  }
};

template <class T>
struct SoftplusNegOp {
  __device__ __forceinline__ T operator()(T xv) const {
    return convert<T>(softplus_neg_of(convert<acc_t<T>>(xv)));
  }
};

// --- dropout -------------------------------------------------------------------------

// Philox-4x32-10 and rand()'s uniform from two words: the CPU's own definitions
// (src/core/philox.hpp).
__device__ __forceinline__ uint4 philox4x32(uint64_t counter, uint64_t subsequence, uint64_t key) {
  const philox::Words w = philox::philox4x32_10(counter, subsequence, key);
  return make_uint4(w.w[0], w.w[1], w.w[2], w.w[3]);
}

__device__ __forceinline__ double rand_uniform(uint32_t hi, uint32_t lo) {
  return 1.0 - philox::u01(hi, lo);
}

// R: the precision rand() produced the uniform in (f32, or f64 for f64 inputs). Offsets of
// (out, x, mask) come from a row-major OffsetCalc, so element i is the i-th in logical order.
template <class T, class R>
__global__ void dropout_kernel(OffsetCalc<3> calc, int64_t n, T* __restrict__ out,
                               const T* __restrict__ x, uint8_t* __restrict__ mask, R keep,
                               acc_t<T> scale, uint64_t seed, uint64_t base) {
  using A = acc_t<T>;
  const int64_t pairs = (n + 1) / 2;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 w = philox4x32(base + static_cast<uint64_t>(j), 0, seed);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int lane = 0; lane < 2; ++lane) {
      const int64_t i = 2 * j + lane;
      if (i >= n) break;
      const R u = static_cast<R>(rand_uniform(words[2 * lane], words[2 * lane + 1]));
      const bool kept = u < keep;
      int64_t off[3];
      calc.get(i, off);
      const A s = kept ? scale : A(0);
      out[off[0]] = convert<T>(convert<A>(x[off[1]]) * s);
      mask[off[2]] = kept ? 1 : 0;
    }
  }
}

// Offsets of (out, x, mask) for the row-major linear index over `shape`.
OffsetCalc<3> row_major_calc(const Tensor& out, const Tensor& x, const Tensor& mask) {
  const int nd = static_cast<int>(x.dim());
  DLTRAIN_CHECK(nd <= kMaxDims, "dropout: CUDA kernels support at most ", kMaxDims,
                " dimensions; got shape ", shape_str(x.shape()));
  OffsetCalc<3> c;
  const bool flat = out.is_contiguous() && x.is_contiguous() && mask.is_contiguous();
  if (flat || nd == 0) {
    c.ndim = 1;
    c.sizes[0] = std::max<int64_t>(1, x.numel());
    for (int k = 0; k < 3; ++k) c.strides[0][k] = 1;
    return c;
  }
  c.ndim = nd;
  const Tensor* ops[3] = {&out, &x, &mask};
  for (int d = 0; d < nd; ++d) {
    c.sizes[d] = x.size(nd - 1 - d);
    for (int k = 0; k < 3; ++k) c.strides[d][k] = ops[k]->stride(nd - 1 - d);
  }
  return c;
}

template <class T>
struct DropoutGradOp {
  acc_t<T> scale;  // 1 / keep in the compute type: a 16-bit scale would bias every element
  __device__ __forceinline__ T operator()(T g, uint8_t m) const {
    using A = acc_t<T>;
    return convert<T>(convert<A>(g) * (m ? scale : A(0)));
  }
};

}  // namespace

// --- entry points ----------------------------------------------------------------------

void softmax_forward(const Tensor& y, const Tensor& x, int64_t outer, int64_t L, int64_t inner,
                     bool log) {
  if (x.numel() == 0) return;
  const int dev = x.device().index;
  Guard guard(dev);
  if (inner == 1) return softmax_rows(y, x, outer, L, log);
  if (transpose_columns(outer, L, inner, dev)) {
    Tensor xr = to_rows(x, outer, L, inner);
    Tensor yr = empty(xr.shape(), xr.options());
    softmax_rows(yr, xr, outer * inner, L, log);
    y.view({outer, L, inner}).copy_(yr.transpose(1, 2));
    return;
  }
  cu_dispatch_floating(x.dtype(), log ? "log_softmax" : "softmax", [&]<class T>() {
    softmax_cols_kernel<T><<<grid_for(outer * inner, kThreads, dev), kThreads, 0, stream(dev)>>>(
        cptr<T>(x), mptr<T>(y), outer, L, inner, log);
  });
  check_launch();
}

void softmax_backward(const Tensor& dx, const Tensor& g, const Tensor& y, int64_t outer, int64_t L,
                      int64_t inner, bool log) {
  if (y.numel() == 0) return;
  const int dev = y.device().index;
  Guard guard(dev);
  if (inner == 1) return softmax_rows_backward(dx, g, y, outer, L, log);
  if (transpose_columns(outer, L, inner, dev)) {
    Tensor gr = to_rows(g, outer, L, inner), yr = to_rows(y, outer, L, inner);
    Tensor dr = empty(yr.shape(), yr.options());
    softmax_rows_backward(dr, gr, yr, outer * inner, L, log);
    dx.view({outer, L, inner}).copy_(dr.transpose(1, 2));
    return;
  }
  cu_dispatch_floating(y.dtype(), log ? "log_softmax_backward" : "softmax_backward",
                       [&]<class T>() {
                         softmax_cols_backward_kernel<T>
                             <<<grid_for(outer * inner, kThreads, dev), kThreads, 0, stream(dev)>>>(
                                 cptr<T>(g), cptr<T>(y), mptr<T>(dx), outer, L, inner, log);
                       });
  check_launch();
}

void cross_entropy_forward(const Tensor& out, const Tensor& lse, const Tensor& total_weight,
                           const Tensor& logits, const Tensor& target, const Tensor& weight,
                           const ClassLoss& a, double label_smoothing) {
  const int dev = logits.device().index;
  Guard guard(dev);
  const bool reduce = a.reduction != LossReduction::None;
  const int64_t n = a.N * a.S;
  if (!reduce && n == 0) return;
  Tensor wsum = weight_sum(weight, label_smoothing, dev);
  cu_dispatch_floating(logits.dtype(), "cross_entropy", [&]<class T>() {
    using A = acc_t<T>;
    const double* w = cptr_or_null<double>(weight);
    const double* ws = cptr_or_null<double>(wsum);
    T* o = reduce ? nullptr : mptr<T>(out);
    if (a.S == 1) {
      const RowLaunch rl = row_launch(a.N, a.C, dev);
      Tensor partial;
      if (reduce)
        partial = empty({2 * static_cast<int64_t>(rl.grid)},
                        TensorOptions(DType::f64).with_device(logits.device()));
      with_row_threads(rl.threads, [&]<int kT>() {
        ce_rows_kernel<T, kT><<<rl.grid, rl.block, 0, stream(dev)>>>(
            cptr<T>(logits), cptr<int64_t>(target), w, ws, a.N, a.C, a.ignore_index,
            label_smoothing, mptr<A>(lse), o, reduce ? mptr<double>(partial) : nullptr);
      });
      check_launch();
      if (reduce)
        finalize<T>(out, total_weight, partial, rl.grid, a.reduction == LossReduction::Mean, dev);
      return;
    }
    const unsigned grid = grid_for(n, kThreads, dev);
    Tensor partial;
    if (reduce)
      partial = empty({2 * static_cast<int64_t>(grid)},
                      TensorOptions(DType::f64).with_device(logits.device()));
    ce_cols_kernel<T><<<grid, kThreads, 0, stream(dev)>>>(
        cptr<T>(logits), cptr<int64_t>(target), w, ws, a.N, a.C, a.S, a.ignore_index,
        label_smoothing, mptr<A>(lse), o, reduce ? mptr<double>(partial) : nullptr);
    check_launch();
    if (reduce)
      finalize<T>(out, total_weight, partial, grid, a.reduction == LossReduction::Mean, dev);
  });
}

void cross_entropy_backward(const Tensor& dx, const Tensor& grad, const Tensor& logits,
                            const Tensor& lse, const Tensor& total_weight, const Tensor& target,
                            const Tensor& weight, const ClassLoss& a, double label_smoothing) {
  if (dx.numel() == 0) return;
  const int dev = logits.device().index;
  Guard guard(dev);
  Tensor wsum = weight_sum(weight, label_smoothing, dev);
  const bool per_sample = a.reduction == LossReduction::None;
  const double* tw = a.reduction == LossReduction::Mean ? cptr<double>(total_weight) : nullptr;
  cu_dispatch_floating(logits.dtype(), "cross_entropy_backward", [&]<class T>() {
    using A = acc_t<T>;
    const double* w = cptr_or_null<double>(weight);
    const double* ws = cptr_or_null<double>(wsum);
    if (a.S == 1) {
      const RowLaunch rl = row_launch(a.N, a.C, dev);
      with_row_threads(rl.threads, [&]<int kT>() {
        ce_rows_backward_kernel<T, kT><<<rl.grid, rl.block, 0, stream(dev)>>>(
            cptr<T>(logits), cptr<A>(lse), cptr<int64_t>(target), w, ws, cptr<T>(grad), per_sample,
            tw, a.N, a.C, a.ignore_index, label_smoothing, mptr<T>(dx));
      });
    } else {
      ce_cols_backward_kernel<T><<<grid_for(a.N * a.S, kThreads, dev), kThreads, 0, stream(dev)>>>(
          cptr<T>(logits), cptr<A>(lse), cptr<int64_t>(target), w, ws, cptr<T>(grad), per_sample,
          tw, a.N, a.C, a.S, a.ignore_index, label_smoothing, mptr<T>(dx));
    }
    check_launch();
  });
}

void nll_loss_forward(const Tensor& out, const Tensor& total_weight, const Tensor& log_probs,
                      const Tensor& target, const Tensor& weight, const ClassLoss& a) {
  const int dev = log_probs.device().index;
  Guard guard(dev);
  const bool reduce = a.reduction != LossReduction::None;
  const int64_t n = a.N * a.S;
  if (!reduce && n == 0) return;
  const unsigned grid = grid_for(n, kThreads, dev);
  Tensor partial;
  if (reduce)
    partial = empty({2 * static_cast<int64_t>(grid)},
                    TensorOptions(DType::f64).with_device(log_probs.device()));
  cu_dispatch_floating(log_probs.dtype(), "nll_loss", [&]<class T>() {
    nll_kernel<T><<<grid, kThreads, 0, stream(dev)>>>(
        cptr<T>(log_probs), cptr<int64_t>(target), cptr_or_null<double>(weight), a.N, a.C, a.S,
        a.ignore_index, reduce ? nullptr : mptr<T>(out), reduce ? mptr<double>(partial) : nullptr);
    check_launch();
    if (reduce)
      finalize<T>(out, total_weight, partial, grid, a.reduction == LossReduction::Mean, dev);
  });
}

void nll_loss_backward(const Tensor& dx, const Tensor& grad, const Tensor& total_weight,
                       const Tensor& target, const Tensor& weight, const ClassLoss& a) {
  if (dx.numel() == 0) return;
  const int dev = dx.device().index;
  Guard guard(dev);
  const double* tw = a.reduction == LossReduction::Mean ? cptr<double>(total_weight) : nullptr;
  cu_dispatch_floating(dx.dtype(), "nll_loss_backward", [&]<class T>() {
    nll_backward_kernel<T><<<grid_for(dx.numel(), kThreads, dev), kThreads, 0, stream(dev)>>>(
        cptr<int64_t>(target), cptr_or_null<double>(weight), cptr<T>(grad),
        a.reduction == LossReduction::None, tw, a.N, a.C, a.S, a.ignore_index, mptr<T>(dx));
  });
  check_launch();
}

void bce_with_logits(const Tensor& out, const Tensor& x, const Tensor& y,
                     const Tensor& pos_weight) {
  cu_dispatch_floating(x.dtype(), "binary_cross_entropy_with_logits", [&]<class T>() {
    launch_map<T, T, T, T>(out, BceOp<T>{}, x, y, pos_weight);
  });
}

void softplus_neg(const Tensor& out, const Tensor& x) {
  cu_dispatch_floating(x.dtype(), "binary_cross_entropy_with_logits_backward",
                       [&]<class T>() { launch_map<T, T>(out, SoftplusNegOp<T>{}, x); });
}

void dropout_forward(const Tensor& out, const Tensor& mask, const Tensor& x, double keep,
                     uint64_t seed, uint64_t base) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const int dev = x.device().index;
  Guard guard(dev);
  const OffsetCalc<3> calc = row_major_calc(out, x, mask);
  const int64_t pairs = (n + 1) / 2;
  cu_dispatch_floating(x.dtype(), "dropout", [&]<class T>() {
    // 1 / keep in the compute type (float for f16/bf16): rounded to bf16, 1/0.9 would become
    // 1.109 and shrink every kept activation by 0.2%.
    const acc_t<T> scale = static_cast<acc_t<T>>(1.0 / keep);
    if constexpr (std::is_same_v<T, double>) {
      dropout_kernel<T, double><<<grid_for(pairs, kThreads, dev), kThreads, 0, stream(dev)>>>(
          calc, n, mptr<T>(out), cptr<T>(x), mptr<uint8_t>(mask), keep, scale, seed, base);
    } else {
      dropout_kernel<T, float><<<grid_for(pairs, kThreads, dev), kThreads, 0, stream(dev)>>>(
          calc, n, mptr<T>(out), cptr<T>(x), mptr<uint8_t>(mask), static_cast<float>(keep), scale,
          seed, base);
    }
  });
  check_launch();
}

void dropout_backward(const Tensor& dx, const Tensor& g, const Tensor& mask, double keep) {
  cu_dispatch_floating(dx.dtype(), "dropout_backward", [&]<class T>() {
    launch_map<T, T, uint8_t>(dx, DropoutGradOp<T>{static_cast<acc_t<T>>(1.0 / keep)}, g, mask);
  });
}

}  // namespace dltrain::backend::cuda
