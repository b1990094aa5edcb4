// Fused multi-tensor optimizer updates (SGD, Adam/AdamW, LARS, LAMB) and the gradient-clipping
// passes on CUDA (entry points in src/backend/cuda/optim.hpp).
//
// Updates are multi-tensor launches (kernels/multi_tensor.cuh): a table of tensors per
// launch, one block per 64K-element chunk, nothing copied to the device. The update
// arithmetic follows the CPU kernels of src/optim (sgd.cpp, adam.cpp, lars.cpp, lamb.cpp) operation
// for operation in the state's dtype (the parameter's, or f32 for f16/bf16 parameters, which are
// read and rounded back once per element), with the same host-computed coefficients (bias
// corrections per tensor, since a parameter skipped in earlier steps has its own step count); only
// fused multiply-adds may differ, by an ulp (and LARS / LAMB norms, summed in another order, by a
// few ulps). The gradient norm accumulates |g|^p in double per block and
// reduces the per-block partials in a fixed order in one block (deterministic), writing the norm
// and the clipping coefficient to device memory, where the scaling kernel reads it.
#include <cmath>
#include <map>

#include "kernels/common.cuh"
#include "kernels/multi_tensor.cuh"
#include "src/backend/cuda/optim.hpp"

namespace dltrain::backend::cuda {

namespace {

using namespace mta;

// Kernel parameters stay within the classic 4 KiB limit, next to a few scalars.
constexpr int kSgdMaxT = 36, kAdamMaxT = 24, kListMaxT = 64;
static_assert(sizeof(TensorTable<3, kSgdMaxT>) <= 3800);
static_assert(sizeof(TensorTable<5, kAdamMaxT>) <= 3800);
static_assert(sizeof(TensorTable<1, kListMaxT>) <= 3800);

// The dtype of optimizer state (and of the update arithmetic) for parameters of dtype p.
DType state_dtype(DType p) { return p == DType::f16 || p == DType::bf16 ? DType::f32 : p; }

// All parameters and gradients of a call have dtype dt and all state tensors state_dtype(dt),
// on the first one's device; returns the device index.
int common_device(const char* op, const std::vector<const Tensor*>& params,
                  const std::vector<const Tensor*>& states, DType dt) {
  const Device dev = params.front()->device();
  auto check = [&](const std::vector<const Tensor*>& ts, DType want) {
    for (const Tensor* t : ts) {
      DLTRAIN_CHECK(t->device() == dev && t->dtype() == want, op,
                    ": expected every tensor on one CUDA device with dtype ", want, " but got ",
                    t->dtype(), " on ", t->device(), " next to ", want, " on ", dev);
    }
  };
  check(params, dt);
  check(states, state_dtype(dt));
  DLTRAIN_CHECK(dev.is_cuda(), op, ": expected CUDA tensors but got tensors on ", dev);
  return dev.index;
}

// Calls f.template operator()<P, T>() with P the parameters' device type and T the state and
// arithmetic type.
template <class F>
void dispatch_param(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32:
      return f.template operator()<float, float>();
    case DType::f64:
      return f.template operator()<double, double>();
    case DType::f16:
      return f.template operator()<__half, float>();
    case DType::bf16:
      return f.template operator()<__nv_bfloat16, float>();
    default:
      DLTRAIN_FAIL(op, ": CUDA parameters must be floating-point, got ", dt);
  }
}

// --- SGD -----------------------------------------------------------------------------

template <class T>
struct SgdArgs {
  T lr, wd, momentum, one_minus_damp, sign;
  bool decay, use_momentum, nesterov;
};

// P: parameter and gradient type; T: momentum buffer and arithmetic type.
template <class P, class T>
__global__ void __launch_bounds__(kBlockThreads)
    sgd_kernel(TensorTable<3, kSgdMaxT> tt, SgdArgs<T> a) {
  int64_t start, n;
  const int t = chunk_of(tt, start, n);
  P* __restrict__ p = static_cast<P*>(tt.ptr[0][t]) + start;
  const P* __restrict__ g = static_cast<const P*>(tt.ptr[1][t]) + start;
  T* __restrict__ buf = a.use_momentum ? static_cast<T*>(tt.ptr[2][t]) + start : nullptr;
  const bool first = tt.c0[t] != 0.0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    const T pk = convert<T>(p[k]);
    T d = a.sign * convert<T>(g[k]);
    if (a.decay) d = d + a.wd * pk;
    if (a.use_momentum) {
      const T b = first ? d : a.momentum * buf[k] + a.one_minus_damp * d;
      buf[k] = b;
      d = a.nesterov ? d + a.momentum * b : b;
    }
    p[k] = convert<P>(pk - a.lr * d);
  }
}

// --- Adam ----------------------------------------------------------------------------

template <class T>
struct AdamArgs {
  T decay_factor, wd, b1, b2, one_minus_b1, one_minus_b2, eps, sign;
  bool decoupled, decay, amsgrad;
};

// Per tensor: c0 = -lr / (1 - beta1^step), c1 = sqrt(1 - beta2^step). P: parameter and
// gradient type; T: moment and arithmetic type.
template <class P, class T>
__global__ void __launch_bounds__(kBlockThreads)
    adam_kernel(TensorTable<5, kAdamMaxT> tt, AdamArgs<T> a) {
  int64_t start, n;
  const int t = chunk_of(tt, start, n);
  P* __restrict__ p = static_cast<P*>(tt.ptr[0][t]) + start;
  const P* __restrict__ g = static_cast<const P*>(tt.ptr[1][t]) + start;
  T* __restrict__ m = static_cast<T*>(tt.ptr[2][t]) + start;
  T* __restrict__ v = static_cast<T*>(tt.ptr[3][t]) + start;
  T* __restrict__ vmax = a.amsgrad ? static_cast<T*>(tt.ptr[4][t]) + start : nullptr;
  const T neg_step_size = static_cast<T>(tt.c0[t]), bc2_sqrt = static_cast<T>(tt.c1[t]);
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    T pk = convert<T>(p[k]);
    T d = a.sign * convert<T>(g[k]);
    if (a.decoupled) {
      pk = pk * a.decay_factor;
    } else if (a.decay) {
      d = d + a.wd * pk;
    }
    const T mk = m[k] * a.b1 + a.one_minus_b1 * d;
    m[k] = mk;
    const T vk = v[k] * a.b2 + a.one_minus_b2 * d * d;
    v[k] = vk;
    T root = vk;
    if (a.amsgrad) {
      const T old = vmax[k];
      root = (vk != vk || vk > old) ? vk : old;  // NaN propagates, as torch.maximum
      vmax[k] = root;
    }
    const T denom = sqrt(root) / bc2_sqrt + a.eps;
    p[k] = convert<P>(pk + neg_step_size * (mk / denom));
  }
}

// --- gradient clipping ---------------------------------------------------------------

enum class NormKind { P, One, Two, Inf };

__device__ __forceinline__ double max_nan(double a, double b) {
  return (isnan(b) || b > a) ? b : a;
}

// Reduces v over the block (blockDim.x a multiple of 32, <= 1024) in a fixed order; thread 0
// gets the result.
__device__ __forceinline__ double block_reduce(double v, bool is_max) {
  __shared__ double part[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const double u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? max_nan(v, u) : v + u;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    v = part[0];
    for (int k = 1; k < static_cast<int>(blockDim.x) / 32; ++k)
      v = is_max ? max_nan(v, part[k]) : v + part[k];
  }
  return v;
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    norm_kernel(TensorTable<1, kListMaxT> tt, NormKind kind, double p, double* partial,
                int64_t first_block) {
  int64_t start, n;
  const int t = chunk_of(tt, start, n);
  const T* __restrict__ x = static_cast<const T*>(tt.ptr[0][t]) + start;
  double acc = 0.0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    const double a = fabs(static_cast<double>(convert<acc_t<T>>(x[k])));
    switch (kind) {
      case NormKind::Inf:
        acc = max_nan(acc, a);
        break;
      case NormKind::Two:
        acc += a * a;
        break;
      case NormKind::One:
        acc += a;
        break;
      case NormKind::P:
        acc += pow(a, p);
        break;
    }
  }
  acc = block_reduce(acc, kind == NormKind::Inf);
  if (threadIdx.x == 0) partial[first_block + blockIdx.x] = acc;
}

__global__ void __launch_bounds__(1024)
    norm_finalize_kernel(const double* __restrict__ partial, int64_t blocks, NormKind kind,
                         double p, double max_norm, double* __restrict__ norm,
                         double* __restrict__ coef) {
  const bool is_max = kind == NormKind::Inf;
  double acc = 0.0;
  for (int64_t k = threadIdx.x; k < blocks; k += blockDim.x)
    acc = is_max ? max_nan(acc, partial[k]) : acc + partial[k];
  acc = block_reduce(acc, is_max);
  if (threadIdx.x == 0) {
    const double total = is_max ? acc : (kind == NormKind::Two ? sqrt(acc) : pow(acc, 1.0 / p));
    *norm = total;
    const double c = max_norm / (total + 1e-6);
    *coef = isnan(total) ? total : (1.0 < c ? 1.0 : c);
  }
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    scale_kernel(TensorTable<1, kListMaxT> tt, const double* __restrict__ coef) {
  using A = acc_t<T>;
  int64_t start, n;
  const int t = chunk_of(tt, start, n);
  T* __restrict__ x = static_cast<T*>(tt.ptr[0][t]) + start;
  const A c = convert<A>(convert<T>(*coef));
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) x[k] = convert<T>(convert<A>(x[k]) * c);
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    clamp_kernel(TensorTable<1, kListMaxT> tt, acc_t<T> lo, acc_t<T> hi) {
  using A = acc_t<T>;
  int64_t start, n;
  const int t = chunk_of(tt, start, n);
  T* __restrict__ x = static_cast<T*>(tt.ptr[0][t]) + start;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    const A v = convert<A>(x[k]);
    x[k] = convert<T>(v < lo ? lo : (hi < v ? hi : v));
  }
}

// Elementwise versions for gradients that are not dense (launch_map handles the strides).
template <class T>
struct ScaleOp {
  const double* coef;
  __device__ __forceinline__ T operator()(T v) const {
    using A = acc_t<T>;
    return convert<T>(convert<A>(v) * convert<A>(convert<T>(*coef)));
  }
};

template <class T>
struct ClampOp {
  acc_t<T> lo, hi;
  __device__ __forceinline__ T operator()(T x) const {
    const acc_t<T> v = convert<acc_t<T>>(x);
    return convert<T>(v < lo ? lo : (hi < v ? hi : v));
  }
};

// --- LARS and LAMB -------------------------------------------------------------------
//
// Both need each tensor's norms before its update. A first multi-tensor pass writes, per
// block (= per 64K-element chunk, numbered over the whole call as multi_tensor_apply numbers
// them: first_block + blockIdx.x), two partial sums of squares to `partial`; the update pass
// cuts the same tensors into the same chunks, so a block finds its tensor's partials at
// [its number - its chunk index, + the tensor's chunk count) and thread 0 sums them in chunk
// order: every block of a tensor gets the same bits, and no host synchronisation is needed.

// Sums a and b over the block in a fixed order; thread 0 gets both.
__device__ __forceinline__ void block_reduce2(double& a, double& b) {
  a = block_reduce(a, false);
  __syncthreads();  // block_reduce's shared scratch is reused
  b = block_reduce(b, false);
}

// The two sums of squares of this block's tensor (thread 0 only).
template <class Table>
__device__ __forceinline__ void tensor_sums(const Table& tt, int t, const double* partial,
                                            int64_t first_block, double& s0, double& s1) {
  const int64_t base = first_block + blockIdx.x - tt.block_chunk[blockIdx.x];
  const int64_t chunks = (tt.numel[t] + kChunk - 1) / kChunk;
  s0 = 0.0;
  s1 = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    s0 += partial[2 * (base + c)];
    s1 += partial[2 * (base + c) + 1];
  }
}

constexpr int kLarsNormMaxT = 36, kLarsMaxT = kSgdMaxT, kLambMaxT = kAdamMaxT;
static_assert(sizeof(TensorTable<2, kLarsNormMaxT>) <= 3800);
static_assert(sizeof(TensorTable<4, kLambMaxT>) <= 3800);

// LARS pass 1: ||w||^2 and ||g||^2 partials in f64.
template <class P, class T>
__global__ void __launch_bounds__(kBlockThreads)
    lars_norm_kernel(TensorTable<2, kLarsNormMaxT> tt, double* __restrict__ partial,
                     int64_t first_block) {
  int64_t start, n;
  const int t = chunk_of(tt, start, n);
  const P* __restrict__ p = static_cast<const P*>(tt.ptr[0][t]) + start;
  const P* __restrict__ g = static_cast<const P*>(tt.ptr[1][t]) + start;
  double sw = 0.0, sg = 0.0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    const double w = static_cast<double>(convert<T>(p[k]));
    const double d = static_cast<double>(convert<T>(g[k]));
    sw += w * w;
    sg += d * d;
  }
  block_reduce2(sw, sg);
  if (threadIdx.x == 0) {
    partial[2 * (first_block + blockIdx.x)] = sw;
    partial[2 * (first_block + blockIdx.x) + 1] = sg;
  }
}

template <class T>
struct LarsArgs {
  double lr, wd, eta, eps;
  T wdt, momentum;
  bool adapt, decay, use_momentum;
};

// LARS pass 2 (src/optim/lars.cpp's arithmetic): local_lr from the tensor's norms, then
// v = m * v + local_lr * (g + wd * w); w -= v.
template <class P, class T>
__global__ void __launch_bounds__(kBlockThreads)
    lars_kernel(TensorTable<3, kLarsMaxT> tt, LarsArgs<T> a, const double* __restrict__ partial,
                int64_t first_block) {
  int64_t start, n;
  const int t = chunk_of(tt, start, n);
  __shared__ T local_lr_s;
  if (threadIdx.x == 0) {
    double ratio = 1.0;
    if (a.adapt) {
      double sw, sg;
      tensor_sums(tt, t, partial, first_block, sw, sg);
      const double wn = sqrt(sw), gn = sqrt(sg);
      if (wn > 0.0 && gn > 0.0) ratio = a.eta * wn / (gn + a.wd * wn + a.eps);
    }
    local_lr_s = static_cast<T>(a.lr * ratio);
  }
  __syncthreads();
  const T local_lr = local_lr_s;
  P* __restrict__ p = static_cast<P*>(tt.ptr[0][t]) + start;
  const P* __restrict__ g = static_cast<const P*>(tt.ptr[1][t]) + start;
  T* __restrict__ buf = a.use_momentum ? static_cast<T*>(tt.ptr[2][t]) + start : nullptr;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    const T pk = convert<T>(p[k]);
    T d = convert<T>(g[k]);
    if (a.decay) d = d + a.wdt * pk;
    if (a.use_momentum) {
      const T b = a.momentum * buf[k] + local_lr * d;
      buf[k] = b;
      p[k] = convert<P>(pk - b);
    } else {
      p[k] = convert<P>(pk - local_lr * d);
    }
  }
}

template <class T>
struct LambArgs {
  T b1, b2, one_minus_b1, one_minus_b2, eps, wd;
  double lr, max_trust_ratio;
  bool adapt;
};

// r of src/optim/lamb.cpp (bc1, bc2: this tensor's bias corrections).
template <class T>
__device__ __forceinline__ T lamb_r(T m, T v, T w, T bc1, T bc2, const LambArgs<T>& a) {
  return (m / bc1) / (sqrt(v / bc2) + a.eps) + a.wd * w;
}

// LAMB pass 1: the moments, and ||w||^2 and ||r||^2 partials. Per tensor: c0 = 1 - beta1^t,
// c1 = 1 - beta2^t.
template <class P, class T>
__global__ void __launch_bounds__(kBlockThreads)
    lamb_moments_kernel(TensorTable<4, kLambMaxT> tt, LambArgs<T> a, double* __restrict__ partial,
                        int64_t first_block) {
  int64_t start, n;
  const int t = chunk_of(tt, start, n);
  const P* __restrict__ p = static_cast<const P*>(tt.ptr[0][t]) + start;
  const P* __restrict__ g = static_cast<const P*>(tt.ptr[1][t]) + start;
  T* __restrict__ m = static_cast<T*>(tt.ptr[2][t]) + start;
  T* __restrict__ v = static_cast<T*>(tt.ptr[3][t]) + start;
  const T bc1 = static_cast<T>(tt.c0[t]), bc2 = static_cast<T>(tt.c1[t]);
  double sw = 0.0, sr = 0.0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    const T d = convert<T>(g[k]), w = convert<T>(p[k]);
    const T mk = a.b1 * m[k] + a.one_minus_b1 * d;
    const T vk = a.b2 * v[k] + a.one_minus_b2 * d * d;
    m[k] = mk;
    v[k] = vk;
    const double r = static_cast<double>(lamb_r(mk, vk, w, bc1, bc2, a));
    const double wd = static_cast<double>(w);
    sw += wd * wd;
    sr += r * r;
  }
  block_reduce2(sw, sr);
  if (threadIdx.x == 0) {
    partial[2 * (first_block + blockIdx.x)] = sw;
    partial[2 * (first_block + blockIdx.x) + 1] = sr;
  }
}

// LAMB pass 2: the trust ratio from the tensor's partials, then w -= lr * ratio * r.
template <class P, class T>
__global__ void __launch_bounds__(kBlockThreads)
    lamb_apply_kernel(TensorTable<4, kLambMaxT> tt, LambArgs<T> a,
                      const double* __restrict__ partial, int64_t first_block) {
  int64_t start, n;
  const int t = chunk_of(tt, start, n);
  __shared__ T step_s;
  if (threadIdx.x == 0) {
    double ratio = 1.0;
    if (a.adapt) {
      double sw, sr;
      tensor_sums(tt, t, partial, first_block, sw, sr);
      const double wn = sqrt(sw), rn = sqrt(sr);
      // As std::min on the CPU: a NaN ratio stays NaN.
      if (wn > 0.0 && rn > 0.0) {
        const double r = wn / rn;
        ratio = a.max_trust_ratio < r ? a.max_trust_ratio : r;
      }
    }
    step_s = static_cast<T>(a.lr * ratio);
  }
  __syncthreads();
  const T step = step_s;
  P* __restrict__ p = static_cast<P*>(tt.ptr[0][t]) + start;
  const T* __restrict__ m = static_cast<const T*>(tt.ptr[2][t]) + start;
  const T* __restrict__ v = static_cast<const T*>(tt.ptr[3][t]) + start;
  const T bc1 = static_cast<T>(tt.c0[t]), bc2 = static_cast<T>(tt.c1[t]);
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    const T w = convert<T>(p[k]);
    p[k] = convert<P>(w - step * lamb_r(m[k], v[k], w, bc1, bc2, a));
  }
}

}  // namespace

void sgd_step(const SgdHyper& h, const std::vector<SgdTensors>& ts) {
  if (ts.empty()) return;
  const DType dt = ts.front().param.dtype();
  std::vector<const Tensor*> params, states;
  std::vector<Entry> es;
  const bool use_momentum = h.momentum != 0.0;
  for (const SgdTensors& s : ts) {
    params.push_back(&s.param);
    params.push_back(&s.grad);
    if (use_momentum) states.push_back(&s.momentum_buffer);
    Entry e;
    e.ptr[0] = s.param.data_ptr();
    e.ptr[1] = s.grad.data_ptr();
    e.ptr[2] = use_momentum ? s.momentum_buffer.data_ptr() : nullptr;
    e.numel = s.param.numel();
    e.c0 = s.first ? 1.0 : 0.0;
    es.push_back(e);
  }
  const int dev = common_device("SGD::step", params, states, dt);
  Guard guard(dev);
  cudaStream_t st = stream(dev);
  dispatch_param(dt, "SGD::step", [&]<class P, class T>() {
    const SgdArgs<T> a{static_cast<T>(h.lr),
                       static_cast<T>(h.weight_decay),
                       static_cast<T>(h.momentum),
                       static_cast<T>(1.0 - h.dampening),
                       h.maximize ? T(-1) : T(1),
                       h.weight_decay != 0.0,
                       use_momentum,
                       h.nesterov};
    multi_tensor_apply<3, kSgdMaxT>(es, [&](const auto& tt, int blocks, int64_t) {
      sgd_kernel<P, T><<<blocks, kBlockThreads, 0, st>>>(tt, a);
      check_launch();
    });
  });
}

void adam_step(const AdamHyper& h, const std::vector<AdamTensors>& ts) {
  if (ts.empty()) return;
  const DType dt = ts.front().param.dtype();
  std::vector<const Tensor*> params, states;
  std::vector<Entry> es;
  for (const AdamTensors& s : ts) {
    params.insert(params.end(), {&s.param, &s.grad});
    states.insert(states.end(), {&s.exp_avg, &s.exp_avg_sq});
    if (h.amsgrad) states.push_back(&s.max_exp_avg_sq);
    Entry e;
    e.ptr[0] = s.param.data_ptr();
    e.ptr[1] = s.grad.data_ptr();
    e.ptr[2] = s.exp_avg.data_ptr();
    e.ptr[3] = s.exp_avg_sq.data_ptr();
    e.ptr[4] = h.amsgrad ? s.max_exp_avg_sq.data_ptr() : nullptr;
    e.numel = s.param.numel();
    // The CPU's coefficients (src/optim/adam.cpp), per tensor since steps may differ.
    const double step = static_cast<double>(s.step);
    const double bc1 = 1.0 - std::pow(h.beta1, step), bc2 = 1.0 - std::pow(h.beta2, step);
    e.c0 = -(h.lr / bc1);
    e.c1 = std::sqrt(bc2);
    es.push_back(e);
  }
  const int dev = common_device("Adam::step", params, states, dt);
  Guard guard(dev);
  cudaStream_t st = stream(dev);
  dispatch_param(dt, "Adam::step", [&]<class P, class T>() {
    const AdamArgs<T> a{static_cast<T>(1.0 - h.lr * h.weight_decay),
                        static_cast<T>(h.weight_decay),
                        static_cast<T>(h.beta1),
                        static_cast<T>(h.beta2),
                        static_cast<T>(1.0 - h.beta1),
                        static_cast<T>(1.0 - h.beta2),
                        static_cast<T>(h.eps),
                        h.maximize ? T(-1) : T(1),
                        h.decoupled,
                        h.weight_decay != 0.0,
                        h.amsgrad};
    multi_tensor_apply<5, kAdamMaxT>(es, [&](const auto& tt, int blocks, int64_t) {
      adam_kernel<P, T><<<blocks, kBlockThreads, 0, st>>>(tt, a);
      check_launch();
    });
  });
}

void lars_step(const LarsHyper& h, const std::vector<LarsTensors>& ts) {
  if (ts.empty()) return;
  const DType dt = ts.front().param.dtype();
  std::vector<const Tensor*> params, states;
  std::vector<Entry> es;
  const bool use_momentum = h.momentum != 0.0;
  int64_t blocks = 0;
  for (const LarsTensors& s : ts) {
    params.insert(params.end(), {&s.param, &s.grad});
    if (use_momentum) states.push_back(&s.momentum_buffer);
    Entry e;
    e.ptr[0] = s.param.data_ptr();
    e.ptr[1] = s.grad.data_ptr();
    e.ptr[2] = use_momentum ? s.momentum_buffer.data_ptr() : nullptr;
    e.numel = s.param.numel();
    blocks += chunks_of(e.numel);
    es.push_back(e);
  }
  const int dev = common_device("LARS::step", params, states, dt);
  Guard guard(dev);
  cudaStream_t st = stream(dev);
  Tensor partial;
  double* part = nullptr;
  if (h.trust_ratio && blocks > 0) {
    partial = empty({2 * blocks}, TensorOptions(DType::f64).with_device(Device::cuda(dev)));
    part = static_cast<double*>(partial.data_ptr());
  }
  dispatch_param(dt, "LARS::step", [&]<class P, class T>() {
    if (part != nullptr) {
      multi_tensor_apply<2, kLarsNormMaxT>(es, [&](const auto& tt, int nb, int64_t first) {
        lars_norm_kernel<P, T><<<nb, kBlockThreads, 0, st>>>(tt, part, first);
        check_launch();
      });
    }
    const LarsArgs<T> a{h.lr,
                        h.weight_decay,
                        h.trust_coefficient,
                        h.eps,
                        static_cast<T>(h.weight_decay),
                        static_cast<T>(h.momentum),
                        h.trust_ratio,
                        h.weight_decay != 0.0,
                        use_momentum};
    multi_tensor_apply<3, kLarsMaxT>(es, [&](const auto& tt, int nb, int64_t first) {
      lars_kernel<P, T><<<nb, kBlockThreads, 0, st>>>(tt, a, part, first);
      check_launch();
    });
  });
}

void lamb_step(const LambHyper& h, const std::vector<LambTensors>& ts) {
  if (ts.empty()) return;
  const DType dt = ts.front().param.dtype();
  std::vector<const Tensor*> params, states;
  std::vector<Entry> es;
  int64_t blocks = 0;
  for (const LambTensors& s : ts) {
    params.insert(params.end(), {&s.param, &s.grad});
    states.insert(states.end(), {&s.exp_avg, &s.exp_avg_sq});
    Entry e;
    e.ptr[0] = s.param.data_ptr();
    e.ptr[1] = s.grad.data_ptr();
    e.ptr[2] = s.exp_avg.data_ptr();
    e.ptr[3] = s.exp_avg_sq.data_ptr();
    e.numel = s.param.numel();
    // The CPU's bias corrections (src/optim/lamb.cpp), per tensor since steps may differ.
    const double step = static_cast<double>(s.step);
    e.c0 = 1.0 - std::pow(h.beta1, step);
    e.c1 = 1.0 - std::pow(h.beta2, step);
    blocks += chunks_of(e.numel);
    es.push_back(e);
  }
  const int dev = common_device("LAMB::step", params, states, dt);
  if (blocks == 0) return;
  Guard guard(dev);
  cudaStream_t st = stream(dev);
  Tensor partial = empty({2 * blocks}, TensorOptions(DType::f64).with_device(Device::cuda(dev)));
  double* part = static_cast<double*>(partial.data_ptr());
  dispatch_param(dt, "LAMB::step", [&]<class P, class T>() {
    const LambArgs<T> a{static_cast<T>(h.beta1),
                        static_cast<T>(h.beta2),
                        static_cast<T>(1.0 - h.beta1),
                        static_cast<T>(1.0 - h.beta2),
                        static_cast<T>(h.eps),
                        static_cast<T>(h.weight_decay),
                        h.lr,
                        h.max_trust_ratio,
                        h.trust_ratio};
    multi_tensor_apply<4, kLambMaxT>(es, [&](const auto& tt, int nb, int64_t first) {
      lamb_moments_kernel<P, T><<<nb, kBlockThreads, 0, st>>>(tt, a, part, first);
      check_launch();
    });
    multi_tensor_apply<4, kLambMaxT>(es, [&](const auto& tt, int nb, int64_t first) {
      lamb_apply_kernel<P, T><<<nb, kBlockThreads, 0, st>>>(tt, a, part, first);
      check_launch();
    });
  });
}

void grad_norm(const Tensor& norm, const Tensor& coef, const std::vector<Tensor>& grads,
               double norm_type, double max_norm) {
  const int dev = norm.device().index;
  Guard guard(dev);
  cudaStream_t st = stream(dev);
  const NormKind kind = std::isinf(norm_type) ? NormKind::Inf
                        : norm_type == 2.0    ? NormKind::Two
                        : norm_type == 1.0    ? NormKind::One
                                              : NormKind::P;
  int64_t blocks = 0;
  for (const Tensor& g : grads) {
    DLTRAIN_CHECK(g.device() == norm.device() && dense(g),
                  "clip_grad_norm_: expected dense gradients on ", norm.device(),
                  " but got one on ", g.device(), " with shape ", shape_str(g.shape()),
                  " and strides ", shape_str(g.strides()));
    blocks += chunks_of(g.numel());
  }
  Tensor partial =
      empty({std::max<int64_t>(1, blocks)}, TensorOptions(DType::f64).with_device(norm.device()));
  double* part = static_cast<double*>(partial.data_ptr());
  int64_t done = 0;
  for (const auto& [dt, ts] : by_dtype(grads)) {
    const std::vector<Entry> es = list_entries(ts);
    cu_dispatch_floating(dt, "clip_grad_norm_", [&]<class T>() {
      multi_tensor_apply<1, kListMaxT>(es, [&](const auto& tt, int nb, int64_t first) {
        norm_kernel<T><<<nb, kBlockThreads, 0, st>>>(tt, kind, norm_type, part, done + first);
        check_launch();
      });
    });
    for (const Tensor* t : ts) done += chunks_of(t->numel());
  }
  norm_finalize_kernel<<<1, 1024, 0, st>>>(part, blocks, kind, norm_type, max_norm,
                                           static_cast<double*>(norm.data_ptr()),
                                           static_cast<double*>(coef.data_ptr()));
  check_launch();
}

void scale_grads(const std::vector<Tensor>& grads, const Tensor& coef) {
  const int dev = coef.device().index;
  Guard guard(dev);
  cudaStream_t st = stream(dev);
  const double* c = static_cast<const double*>(coef.data_ptr());
  std::vector<Tensor> dense_grads;
  for (const Tensor& g : grads) {
    if (dense(g)) {
      dense_grads.push_back(g);
      continue;
    }
    cu_dispatch_floating(g.dtype(), "clip_grad_norm_",
                         [&]<class T>() { launch_map<T, T>(g, ScaleOp<T>{c}, g); });
  }
  for (const auto& [dt, ts] : by_dtype(dense_grads)) {
    const std::vector<Entry> es = list_entries(ts);
    cu_dispatch_floating(dt, "clip_grad_norm_", [&]<class T>() {
      multi_tensor_apply<1, kListMaxT>(es, [&](const auto& tt, int nb, int64_t) {
        scale_kernel<T><<<nb, kBlockThreads, 0, st>>>(tt, c);
        check_launch();
      });
    });
  }
}

void clamp_grads(const std::vector<Tensor>& grads, double lo, double hi) {
  if (grads.empty()) return;
  const int dev = grads.front().device().index;
  Guard guard(dev);
  cudaStream_t st = stream(dev);
  std::vector<Tensor> dense_grads;
  for (const Tensor& g : grads) {
    if (dense(g)) {
      dense_grads.push_back(g);
      continue;
    }
    cu_dispatch_floating(g.dtype(), "clip_grad_value_", [&]<class T>() {
      using A = acc_t<T>;
      launch_map<T, T>(g, ClampOp<T>{static_cast<A>(lo), static_cast<A>(hi)}, g);
    });
  }
  for (const auto& [dt, ts] : by_dtype(dense_grads)) {
    const std::vector<Entry> es = list_entries(ts);
    cu_dispatch_floating(dt, "clip_grad_value_", [&]<class T>() {
      using A = acc_t<T>;
      multi_tensor_apply<1, kListMaxT>(es, [&](const auto& tt, int nb, int64_t) {
        clamp_kernel<T><<<nb, kBlockThreads, 0, st>>>(tt, static_cast<A>(lo), static_cast<A>(hi));
        check_launch();
      });
    });
  }
}

}  // namespace dltrain::backend::cuda
