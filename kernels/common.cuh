// Shared device-side machinery of the CUDA kernels (internal header for kernels/*.cu).
//
// - Device element types: f16 is __half, bf16 is __nv_bfloat16; both compute in float
//   (acc_t), every other type in itself, as on the CPU. convert<To>(v) converts between
//   any two of them on host and device with the CPU backend's semantics (bool: v != 0).
// - cu_dispatch_{floating,numeric,all}(dtype, op, f) call f.template operator()<T>() with
//   the device type T, the CUDA twin of dltrain::dispatch_* (core/dtype.hpp).
// - make_plan(shape, {out, in...}) describes an N-operand iteration over `shape`: inputs
//   are broadcast (stride 0), size-1 dims are dropped, dims are ordered by the output's
//   memory order (so channels-last writes stay coalesced) and merged wherever every
//   operand is contiguous across them. A plan of dense, same-layout operands collapses to
//   one dimension of unit strides, which launch_map runs with 16-byte vector loads.
// - launch_map<Out, In...>(out, op, in...) runs out = op(in...) elementwise over any
//   strides on the current stream of out's device. `op` is a functor (or __device__
//   lambda) taking the raw device element types and returning Out.
//
// Offsets are 64-bit; a tensor may have at most kMaxDims dimensions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cuda/std/tuple>

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <utility>

#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/runtime.hpp"
#include "src/ops/elementwise_math.hpp"

namespace dltrain::backend::cuda {

// --- element types ---------------------------------------------------------------------

template <class T>
struct AccType {
  using type = T;
};
template <>
struct AccType<__half> {
  using type = float;
};
template <>
struct AccType<__nv_bfloat16> {
  using type = float;
};
template <class T>
using acc_t = typename AccType<T>::type;

template <class T>
inline constexpr bool is_reduced_float_v =
    std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

/// Converts between device element types with the CPU backend's semantics.
template <class To, class From>
__host__ __device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __half>) {
    return convert<To>(__half2float(v));
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return convert<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half(static_cast<float>(v));  // f64 too: through float, as the CPU's cast
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

/// Calls f.template operator()<T>() with the device type T of a floating dtype.
template <class F>
decltype(auto) cu_dispatch_floating(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::f64:
      return f.template operator()<double>();
    case DType::f16:
      return f.template operator()<__half>();
    case DType::bf16:
      return f.template operator()<__nv_bfloat16>();
    default:
      DLTRAIN_FAIL(op, ": expected a floating dtype (f32, f64, f16, bf16) but got ", t);
  }
}

/// Floating types plus i32/i64/u8 (bool excluded).
template <class F>
decltype(auto) cu_dispatch_numeric(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i32:
      return f.template operator()<int32_t>();
    case DType::i64:
      return f.template operator()<int64_t>();
    case DType::u8:
      return f.template operator()<uint8_t>();
    case DType::b8:
      DLTRAIN_FAIL(op, ": not defined for bool tensors; convert with .to(DType::u8) or similar");
    default:
      return cu_dispatch_floating(t, op, std::forward<F>(f));
  }
}

/// Every dtype.
template <class F>
decltype(auto) cu_dispatch_all(DType t, const char* op, F&& f) {
  if (t == DType::b8) return f.template operator()<bool>();
  return cu_dispatch_numeric(t, op, std::forward<F>(f));
}

// --- device math -----------------------------------------------------------------------

/// float and double overloads of the math functions the kernels use (float calls the f
/// variants, so a float kernel never computes in double by accident), and the GELU constants:
/// ew::math of src/ops/elementwise_math.hpp, shared with the host formulas.
namespace dm = ::dltrain::ew::math;

// --- iteration plans -------------------------------------------------------------------

constexpr int kMaxDims = 12;

/// Element offsets of N operands for a linear index over the iteration space.
/// Dimension 0 is the innermost (fastest varying).
template <int N>
struct OffsetCalc {
  int ndim = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims][N];

  __device__ __forceinline__ void get(int64_t linear, int64_t (&off)[N]) const {
    if (ndim == 1) {
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] = linear * strides[0][k];
      return;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = 0; d < ndim; ++d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += i * strides[d][k];
    }
  }
};

template <int N>
struct Plan {
  OffsetCalc<N> calc;
  int64_t numel = 0;
  /// One dimension and every operand has unit stride: flat indexing works.
  bool contiguous = false;
};

/// Plans an iteration over `shape` for operands ops[0] (the output: its shape must be
/// `shape`) and ops[1..] (broadcast to `shape`). See the file comment.
template <int N>
Plan<N> make_plan(const Shape& shape, const std::array<const Tensor*, N>& ops) {
  const int nd = static_cast<int>(shape.size());
  DLTRAIN_CHECK(nd <= kMaxDims, "CUDA kernels support at most ", kMaxDims,
                " dimensions; got shape ", shape_str(shape));
  Plan<N> plan;
  plan.numel = shape_numel(shape);
  // Per dim (outermost first): size and each operand's stride (0 where broadcast).
  struct Dim {
    int64_t size;
    std::array<int64_t, N> stride;
  };
  std::vector<Dim> dims;
  for (int i = 0; i < nd; ++i) {
    if (shape[i] == 1) continue;
    Dim d{shape[i], {}};
    for (int k = 0; k < N; ++k) {
      const Tensor& t = *ops[k];
      const int j = i - (nd - static_cast<int>(t.dim()));
      d.stride[k] = (j < 0 || t.shape()[j] == 1) ? 0 : t.strides()[j];
    }
    dims.push_back(d);
  }
  // Output memory order: largest output stride outermost (stable, so ties keep order).
  std::stable_sort(dims.begin(), dims.end(),
                   [](const Dim& a, const Dim& b) { return a.stride[0] > b.stride[0]; });
  // Merge an outer dim into the next inner one where every operand is contiguous across.
  std::vector<Dim> merged;
  for (const Dim& d : dims) {
    if (!merged.empty()) {
      Dim& outer = merged.back();
      bool ok = true;
      for (int k = 0; k < N; ++k) ok = ok && outer.stride[k] == d.stride[k] * d.size;
      if (ok) {
        outer.size *= d.size;
        outer.stride = d.stride;
        continue;
      }
    }
    merged.push_back(d);
  }
  if (merged.empty()) merged.push_back(Dim{1, {}});
  plan.calc.ndim = static_cast<int>(merged.size());
  for (int d = 0; d < plan.calc.ndim; ++d) {
    const Dim& src = merged[merged.size() - 1 - d];  // innermost first
    plan.calc.sizes[d] = src.size;
    for (int k = 0; k < N; ++k) plan.calc.strides[d][k] = src.stride[k];
  }
  plan.contiguous = plan.calc.ndim == 1;
  for (int k = 0; k < N; ++k)
    plan.contiguous = plan.contiguous && (plan.calc.strides[0][k] == 1 || plan.numel <= 1);
  return plan;
}

// --- elementwise maps ------------------------------------------------------------------

constexpr int kMapThreads = 256;
constexpr int kVec = 4;

template <class T, int V>
struct alignas(sizeof(T) * V) VecT {
  T v[V];
};

template <class Out, class... In, class Op, size_t... I>
__device__ __forceinline__ void map_one(Out* out, const void* const* in, const int64_t* off,
                                        const Op& op, std::index_sequence<I...>) {
  out[off[0]] = op(static_cast<const In*>(in[I])[off[I + 1]]...);
}

template <class Op, class Out, class... In>
__global__ void map_strided_kernel(OffsetCalc<1 + sizeof...(In)> calc, int64_t n, Out* out,
                                   std::array<const void*, sizeof...(In) + 1> in, Op op) {
  constexpr int N = 1 + sizeof...(In);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[N];
    calc.get(i, off);
    map_one<Out, In...>(out, in.data(), off, op, std::index_sequence_for<In...>{});
  }
}

template <class Out, class... In, class Op, size_t... I>
__device__ __forceinline__ void map_vec(Out* out, const void* const* in, int64_t base, const Op& op,
                                        std::index_sequence<I...>) {
  // Vector loads of every input, then one vector store of the output.
  ::cuda::std::tuple<VecT<In, kVec>...> loads{
      *reinterpret_cast<const VecT<In, kVec>*>(static_cast<const In*>(in[I]) + base)...};
  VecT<Out, kVec> r;
#pragma unroll
  for (int j = 0; j < kVec; ++j) r.v[j] = op(::cuda::std::get<I>(loads).v[j]...);
  *reinterpret_cast<VecT<Out, kVec>*>(out + base) = r;
}

template <class Op, class Out, class... In>
__global__ void map_contiguous_kernel(int64_t n, Out* out,
                                      std::array<const void*, sizeof...(In) + 1> in, Op op,
                                      bool vectorize) {
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t done = 0;
  if (vectorize) {
    const int64_t nvec = n / kVec;
    for (int64_t v = tid; v < nvec; v += stride)
      map_vec<Out, In...>(out, in.data(), v * kVec, op, std::index_sequence_for<In...>{});
    done = nvec * kVec;
  }
  for (int64_t i = done + tid; i < n; i += stride) {
    int64_t off[1 + sizeof...(In)];
#pragma unroll
    for (int k = 0; k < 1 + static_cast<int>(sizeof...(In)); ++k) off[k] = i;
    map_one<Out, In...>(out, in.data(), off, op, std::index_sequence_for<In...>{});
  }
}

inline bool aligned_for_vec(const void* p, size_t elem) {
  return reinterpret_cast<uintptr_t>(p) % (elem * kVec) == 0;
}

template <class>
using TensorRef = const Tensor&;

/// out = op(in...) elementwise; inputs broadcast to out's shape; any strides. The inputs
/// must already hold the device types In (convert dtypes first) and live on out's device.
/// Enqueued on the current stream of out's device.
template <class Out, class... In, class Op>
void launch_map(const Tensor& out, Op op, TensorRef<In>... in) {
  constexpr int N = 1 + sizeof...(In);
  const int64_t n = out.numel();
  if (n == 0) return;
  const int dev = out.device().index;
  Guard g(dev);
  const Plan<N> plan = make_plan<N>(out.shape(), {&out, &in...});
  const std::array<const void*, N> ptrs{in.data_ptr()..., nullptr};
  Out* o = static_cast<Out*>(out.data_ptr());
  cudaStream_t s = stream(dev);
  if (plan.contiguous) {
    bool vec = n >= kVec && aligned_for_vec(o, sizeof(Out));
    ((vec = vec && aligned_for_vec(in.data_ptr(), sizeof(In))), ...);
    const int64_t work = vec ? (n + kVec - 1) / kVec : n;
    map_contiguous_kernel<Op, Out, In...>
        <<<grid_for(work, kMapThreads, dev), kMapThreads, 0, s>>>(n, o, ptrs, op, vec);
  } else {
    map_strided_kernel<Op, Out, In...>
        <<<grid_for(n, kMapThreads, dev), kMapThreads, 0, s>>>(plan.calc, n, o, ptrs, op);
  }
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dltrain::backend::cuda
