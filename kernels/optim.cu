// Fused multi-tensor optimizer updates (SGD, Adam/AdamW) and the gradient-clipping passes on
// CUDA (entry points in src/backend/cuda/optim.hpp).
//
// Multi-tensor apply, as PyTorch's multi_tensor_apply: the tensors of one call are cut into
// chunks of kChunk elements, one block per chunk, and a launch carries in its kernel
// parameters a table of up to kMaxT tensors (addresses, sizes, two per-tensor
// coefficients) and, per block, which tensor and chunk it works on; a call needs as many
// launches as tables it fills, and no device memory, copy or host sync. Every tensor is
// dense, and a parameter's gradient and state share its layout, so element k of the chunk
// is the same logical element in all of them. The update arithmetic follows the CPU
// kernels of src/optim (sgd.cpp, adam.cpp) operation for operation in the parameter's
// dtype, with the same host-computed coefficients (bias corrections per tensor, since a
// parameter skipped in earlier steps has its own step count); only fused multiply-adds may
// differ, by an ulp. The gradient norm accumulates |g|^p in double per block and reduces the
// per-block partials in a fixed order in one block (deterministic), writing the norm and the
// clipping coefficient to device memory, where the scaling kernel reads it.
#include <cmath>
#include <map>

#include "kernels/common.cuh"
#include "src/backend/cuda/optim.hpp"

namespace dltrain::backend::cuda {

namespace {

constexpr int64_t kChunk = 65536;
constexpr int kMaxBlocks = 320;
constexpr int kBlockThreads = 512;
constexpr int kMaxDepth = 5;

template <int kDepth, int kMaxT>
struct TensorTable {
  void* ptr[kDepth][kMaxT];
  int64_t numel[kMaxT];
  double c0[kMaxT];
  double c1[kMaxT];
  int32_t block_chunk[kMaxBlocks];
  uint8_t block_tensor[kMaxBlocks];
};

// Kernel parameters stay within the classic 4 KiB limit, next to a few scalars.
constexpr int kSgdMaxT = 36, kAdamMaxT = 24, kListMaxT = 64;
static_assert(sizeof(TensorTable<3, kSgdMaxT>) <= 3800);
static_assert(sizeof(TensorTable<5, kAdamMaxT>) <= 3800);
static_assert(sizeof(TensorTable<1, kListMaxT>) <= 3800);

struct Entry {
  void* ptr[kMaxDepth] = {};
  int64_t numel = 0;
  double c0 = 0, c1 = 0;
};

// Fills tables from `entries` and calls launch(table, blocks, first_block) for each, where
// first_block counts the blocks of the earlier launches of this call.
template <int kDepth, int kMaxT, class Launch>
void multi_tensor_apply(const std::vector<Entry>& entries, Launch&& launch) {
  static_assert(kMaxT <= 256 && kDepth <= kMaxDepth);
  TensorTable<kDepth, kMaxT> tt{};
  int nt = 0, nb = 0;
  int64_t first_block = 0;
  for (const Entry& e : entries) {
    if (e.numel == 0) continue;
    for (int d = 0; d < kDepth; ++d) tt.ptr[d][nt] = e.ptr[d];
    tt.numel[nt] = e.numel;
    tt.c0[nt] = e.c0;
    tt.c1[nt] = e.c1;
    ++nt;
    const int64_t chunks = (e.numel + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      tt.block_tensor[nb] = static_cast<uint8_t>(nt - 1);
      tt.block_chunk[nb] = static_cast<int32_t>(c);
      ++nb;
      const bool last_chunk = c == chunks - 1;
      if (nb == kMaxBlocks || (nt == kMaxT && last_chunk)) {
        launch(tt, nb, first_block);
        first_block += nb;
        nb = 0;
        if (last_chunk) {
          nt = 0;
        } else {  // the tensor goes on in the next table, in slot 0
          for (int d = 0; d < kDepth; ++d) tt.ptr[d][0] = tt.ptr[d][nt - 1];
          tt.numel[0] = tt.numel[nt - 1];
          tt.c0[0] = tt.c0[nt - 1];
          tt.c1[0] = tt.c1[nt - 1];
          nt = 1;
        }
      }
    }
  }
  if (nb > 0) launch(tt, nb, first_block);
}

int64_t chunks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

// The chunk of this block: its tensor slot, first element and length.
template <class Table>
__device__ __forceinline__ int chunk_of(const Table& tt, int64_t& start, int64_t& n) {
  const int t = tt.block_tensor[blockIdx.x];
  start = static_cast<int64_t>(tt.block_chunk[blockIdx.x]) * kChunk;
  n = tt.numel[t] - start;
  if (n > kChunk) n = kChunk;
  return t;
}

template <class T>
T* at(void* p, int64_t start) {
  return static_cast<T*>(p) + start;
}

void check_launch() { DLTRAIN_CUDA_CHECK(cudaGetLastError()); }

// All tensors of a call share the first one's dtype and device; returns the device index.
int common_device(const char* op, const std::vector<const Tensor*>& ts, DType dt) {
  const Device dev = ts.front()->device();
  for (const Tensor* t : ts) {
    DLTRAIN_CHECK(t->device() == dev && t->dtype() == dt, op,
                  ": expected every tensor on one CUDA device with dtype ", dt, " but got ",
                  t->dtype(), " on ", t->device(), " next to ", dt, " on ", dev);
  }
  DLTRAIN_CHECK(dev.is_cuda(), op, ": expected CUDA tensors but got tensors on ", dev);
  return dev.index;
}

// --- SGD -----------------------------------------------------------------------------

template <class T>
struct SgdArgs {
  T lr, wd, momentum, one_minus_damp, sign;
  bool decay, use_momentum, nesterov;
};

template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    sgd_kernel(TensorTable<3, kSgdMaxT> tt, SgdArgs<T> a) {
  int64_t start, n;
  const int t = chunk_of(tt, start, n);
  T* __restrict__ p = static_cast<T*>(tt.ptr[0][t]) + start;
  const T* __restrict__ g = static_cast<const T*>(tt.ptr[1][t]) + start;
  T* __restrict__ buf = a.use_momentum ? static_cast<T*>(tt.ptr[2][t]) + start : nullptr;
  const bool first = tt.c0[t] != 0.0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    T d = a.sign * g[k];
    if (a.decay) d = d + a.wd * p[k];
    if (a.use_momentum) {
      const T b = first ? d : a.momentum * buf[k] + a.one_minus_damp * d;
      buf[k] = b;
      d = a.nesterov ? d + a.momentum * b : b;
    }
    p[k] = p[k] - a.lr * d;
  }
}

// --- Adam ----------------------------------------------------------------------------

template <class T>
struct AdamArgs {
  T decay_factor, wd, b1, b2, one_minus_b1, one_minus_b2, eps, sign;
  bool decoupled, decay, amsgrad;
};

// Per tensor: c0 = -lr / (1 - beta1^step), c1 = sqrt(1 - beta2^step).
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    adam_kernel(TensorTable<5, kAdamMaxT> tt, AdamArgs<T> a) {
  int64_t start, n;
  const int t = chunk_of(tt, start, n);
  T* __restrict__ p = static_cast<T*>(tt.ptr[0][t]) + start;
  const T* __restrict__ g = static_cast<const T*>(tt.ptr[1][t]) + start;
  T* __restrict__ m = static_cast<T*>(tt.ptr[2][t]) + start;
  T* __restrict__ v = static_cast<T*>(tt.ptr[3][t]) + start;
  T* __restrict__ vmax = a.amsgrad ? static_cast<T*>(tt.ptr[4][t]) + start : nullptr;
  const T neg_step_size = static_cast<T>(tt.c0[t]), bc2_sqrt = static_cast<T>(tt.c1[t]);
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    T pk = p[k];
    T d = a.sign * g[k];
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
    p[k] = pk + neg_step_size * (mk / denom);
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

bool dense(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims with size > 1
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) return true;
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

// Gradients grouped by dtype (order kept within a dtype), for one table per dtype.
std::map<DType, std::vector<const Tensor*>> by_dtype(const std::vector<Tensor>& ts) {
  std::map<DType, std::vector<const Tensor*>> out;
  for (const Tensor& t : ts) out[t.dtype()].push_back(&t);
  return out;
}

std::vector<Entry> list_entries(const std::vector<const Tensor*>& ts) {
  std::vector<Entry> es;
  for (const Tensor* t : ts) {
    Entry e;
    e.ptr[0] = t->data_ptr();
    e.numel = t->numel();
    es.push_back(e);
  }
  return es;
}

}  // namespace

void sgd_step(const SgdHyper& h, const std::vector<SgdTensors>& ts) {
  if (ts.empty()) return;
  const DType dt = ts.front().param.dtype();
  std::vector<const Tensor*> all;
  std::vector<Entry> es;
  const bool use_momentum = h.momentum != 0.0;
  for (const SgdTensors& s : ts) {
    all.push_back(&s.param);
    all.push_back(&s.grad);
    if (use_momentum) all.push_back(&s.momentum_buffer);
    Entry e;
    e.ptr[0] = s.param.data_ptr();
    e.ptr[1] = s.grad.data_ptr();
    e.ptr[2] = use_momentum ? s.momentum_buffer.data_ptr() : nullptr;
    e.numel = s.param.numel();
    e.c0 = s.first ? 1.0 : 0.0;
    es.push_back(e);
  }
  const int dev = common_device("SGD::step", all, dt);
  Guard guard(dev);
  cudaStream_t st = stream(dev);
  auto run = [&]<class T>() {
    const SgdArgs<T> a{static_cast<T>(h.lr),
                       static_cast<T>(h.weight_decay),
                       static_cast<T>(h.momentum),
                       static_cast<T>(1.0 - h.dampening),
                       h.maximize ? T(-1) : T(1),
                       h.weight_decay != 0.0,
                       use_momentum,
                       h.nesterov};
    multi_tensor_apply<3, kSgdMaxT>(es, [&](const auto& tt, int blocks, int64_t) {
      sgd_kernel<T><<<blocks, kBlockThreads, 0, st>>>(tt, a);
      check_launch();
    });
  };
  if (dt == DType::f32) {
    run.template operator()<float>();
  } else {
    DLTRAIN_CHECK(dt == DType::f64, "SGD::step: CUDA parameters must be f32 or f64, got ", dt);
    run.template operator()<double>();
  }
}

void adam_step(const AdamHyper& h, const std::vector<AdamTensors>& ts) {
  if (ts.empty()) return;
  const DType dt = ts.front().param.dtype();
  std::vector<const Tensor*> all;
  std::vector<Entry> es;
  for (const AdamTensors& s : ts) {
    all.insert(all.end(), {&s.param, &s.grad, &s.exp_avg, &s.exp_avg_sq});
    if (h.amsgrad) all.push_back(&s.max_exp_avg_sq);
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
  const int dev = common_device("Adam::step", all, dt);
  Guard guard(dev);
  cudaStream_t st = stream(dev);
  auto run = [&]<class T>() {
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
      adam_kernel<T><<<blocks, kBlockThreads, 0, st>>>(tt, a);
      check_launch();
    });
  };
  if (dt == DType::f32) {
    run.template operator()<float>();
  } else {
    DLTRAIN_CHECK(dt == DType::f64, "Adam::step: CUDA parameters must be f32 or f64, got ", dt);
    run.template operator()<double>();
  }
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
