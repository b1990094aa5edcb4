// Gathers and scatter-adds by index on CUDA (entry points in src/backend/cuda/indexing.hpp):
// row takes and row adds over [outer, L, inner] views (index_select, embedding,
// segment_sum and their gradients), torch.gather / scatter_add along a dim over any strides,
// scatter_reduce's amax/amin, one_hot and segment counts.
//
// Invariants: index tensors are contiguous int64 on the output's device; one thread per
// output (gathers) or per source element (scatters), consecutive threads on consecutive
// innermost elements so loads and stores coalesce. Indices are checked on the device, not
// on the host (no sync): a gather with an out-of-range index writes NaN (floating) or 0,
// a scatter drops the element. Scatters accumulate with atomicAdd in the element type
// (native for f32, f64, i32, i64, and for f16 from sm_70 and bf16 from sm_80; a
// compare-and-swap loop on the enclosing 32-bit word otherwise and for u8), so each addition
// rounds to the element type as on the CPU, but repeated indices add in an unspecified order.
#include "kernels/common.cuh"
#include "src/backend/cuda/indexing.hpp"

namespace dltrain::backend::cuda {

namespace {

constexpr int kThreads = 256;

template <class T>
const T* cptr(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}
template <class T>
T* mptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

void check_launch() { DLTRAIN_CUDA_CHECK(cudaGetLastError()); }

// What a gather writes for an out-of-range index.
template <class T>
__device__ __forceinline__ T invalid_value() {
  if constexpr (std::is_floating_point_v<T> || is_reduced_float_v<T>)
    return convert<T>(__longlong_as_double(0x7ff8000000000000ll));
  else
    return T(0);
}

// Adds v to the 16-bit value at p with a compare-and-swap on the enclosing aligned word.
template <class T>
__device__ __forceinline__ void atomic_add_16(T* p, T v) {
  unsigned int* word =
      reinterpret_cast<unsigned int*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{3});
  const unsigned shift = (reinterpret_cast<uintptr_t>(p) & 2u) * 8u;
  unsigned old = *word, assumed;
  do {
    assumed = old;
    const unsigned short bits = static_cast<unsigned short>((assumed >> shift) & 0xffffu);
    T cur;
    memcpy(&cur, &bits, 2);
    const T sum = convert<T>(convert<float>(cur) + convert<float>(v));
    unsigned short nb;
    memcpy(&nb, &sum, 2);
    old = atomicCAS(word, assumed,
                    (assumed & ~(0xffffu << shift)) | (static_cast<unsigned>(nb) << shift));
  } while (assumed != old);
}

__device__ __forceinline__ void atomic_add_u8(uint8_t* p, uint8_t v) {
  unsigned int* word =
      reinterpret_cast<unsigned int*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{3});
  const unsigned shift = (reinterpret_cast<uintptr_t>(p) & 3u) * 8u;
  unsigned old = *word, assumed;
  do {
    assumed = old;
    const unsigned byte = ((assumed >> shift) + v) & 0xffu;
    old = atomicCAS(word, assumed, (assumed & ~(0xffu << shift)) | (byte << shift));
  } while (assumed != old);
}

template <class T>
__device__ __forceinline__ void atomic_add(T* p, T v) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    atomicAdd(p, v);
  } else if constexpr (std::is_same_v<T, __half>) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700
    atomicAdd(p, v);
#else
    atomic_add_16(p, v);
#endif
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    atomicAdd(p, v);
#else
    atomic_add_16(p, v);
#endif
  } else if constexpr (std::is_same_v<T, int32_t>) {
    atomicAdd(reinterpret_cast<int*>(p), static_cast<int>(v));
  } else if constexpr (std::is_same_v<T, int64_t>) {
    // Two's complement: an unsigned add is the signed add.
    atomicAdd(reinterpret_cast<unsigned long long*>(p),
              static_cast<unsigned long long>(static_cast<long long>(v)));
  } else {
    static_assert(std::is_same_v<T, uint8_t>, "atomic_add: unsupported element type");
    atomic_add_u8(p, v);
  }
}

#define DLTRAIN_GRID_STRIDE(i, n)                                                        \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <class T>
__global__ void take_rows_kernel(const T* __restrict__ x, const int64_t* __restrict__ index,
                                 T* __restrict__ out, int64_t outer, int64_t L, int64_t K,
                                 int64_t inner) {
  DLTRAIN_GRID_STRIDE(e, outer * K * inner) {
    const int64_t j = e % inner, k = (e / inner) % K, o = e / (inner * K);
    const int64_t r = index[k];
    out[e] = (r >= 0 && r < L) ? x[(o * L + r) * inner + j] : invalid_value<T>();
  }
}

template <class T>
__global__ void index_add_rows_kernel(T* __restrict__ dst, const T* __restrict__ src,
                                      const int64_t* __restrict__ index, int64_t outer, int64_t L,
                                      int64_t K, int64_t inner, int64_t skip) {
  DLTRAIN_GRID_STRIDE(e, outer * K * inner) {
    const int64_t j = e % inner, k = (e / inner) % K, o = e / (inner * K);
    const int64_t r = index[k];
    if (r == skip || r < 0 || r >= L) continue;
    atomic_add(dst + (o * L + r) * inner + j, src[e]);
  }
}

// Row-major iteration over the index's shape with the strides of up to two other tensors.
struct DimGeom {
  int nd = 0;
  int dim = 0;
  int64_t limit = 0;  // size of the indexed dim of the indexed tensor
  int64_t sizes[kMaxDims];
  int64_t a[kMaxDims];  // strides of the indexed tensor (gather: x; scatter: dst)
  int64_t b[kMaxDims];  // strides of the other one (scatter: src)
};

DimGeom dim_geom(const char* op, const Tensor& index, int64_t dim, const Tensor& indexed,
                 const Tensor* other) {
  const int nd = static_cast<int>(index.dim());
  DLTRAIN_CHECK(nd <= kMaxDims, op, ": CUDA kernels support at most ", kMaxDims,
                " dimensions; got index of shape ", shape_str(index.shape()));
  DimGeom g;
  g.nd = nd;
  g.dim = static_cast<int>(dim);
  g.limit = indexed.size(dim);
  for (int d = 0; d < nd; ++d) {
    g.sizes[d] = index.size(d);
    g.a[d] = indexed.stride(d);
    g.b[d] = other ? other->stride(d) : 0;
  }
  return g;
}

template <class T>
__global__ void gather_kernel(DimGeom g, const T* __restrict__ x, const int64_t* __restrict__ index,
                              T* __restrict__ out, int64_t n) {
  DLTRAIN_GRID_STRIDE(i, n) {
    const int64_t r = index[i];
    if (r < 0 || r >= g.limit) {
      out[i] = invalid_value<T>();
      continue;
    }
    int64_t rem = i, off = 0;
    for (int d = g.nd - 1; d >= 0; --d) {
      const int64_t c = rem % g.sizes[d];
      rem /= g.sizes[d];
      off += (d == g.dim ? r : c) * g.a[d];
    }
    out[i] = x[off];
  }
}

template <class T>
__global__ void scatter_add_kernel(DimGeom g, T* __restrict__ dst,
                                   const int64_t* __restrict__ index, const T* __restrict__ src,
                                   int64_t n) {
  DLTRAIN_GRID_STRIDE(i, n) {
    const int64_t r = index[i];
    if (r < 0 || r >= g.limit) continue;
    int64_t rem = i, doff = 0, soff = 0;
    for (int d = g.nd - 1; d >= 0; --d) {
      const int64_t c = rem % g.sizes[d];
      rem /= g.sizes[d];
      doff += (d == g.dim ? r : c) * g.a[d];
      soff += c * g.b[d];
    }
    atomic_add(dst + doff, src[soff]);
  }
}

// dst = max (or min) of dst and v, NaN winning, by a compare-and-swap on the value's bits
// (CUDA has no floating atomicMax). The result does not depend on the order of the updates.
template <class T>
__device__ __forceinline__ void atomic_extreme(T* p, T v, bool is_max) {
  using U = std::conditional_t<sizeof(T) == 4, unsigned int, unsigned long long>;
  U* addr = reinterpret_cast<U*>(p);
  U old = *addr, assumed;
  do {
    assumed = old;
    T cur;
    memcpy(&cur, &assumed, sizeof(T));
    if (cur != cur) return;
    if (!(v != v || (is_max ? v > cur : v < cur))) return;
    U bits;
    memcpy(&bits, &v, sizeof(T));
    old = atomicCAS(addr, assumed, bits);
  } while (assumed != old);
}

template <class T>
__global__ void scatter_extreme_kernel(DimGeom g, T* __restrict__ dst,
                                       const int64_t* __restrict__ index, const T* __restrict__ src,
                                       int64_t n, bool is_max) {
  DLTRAIN_GRID_STRIDE(i, n) {
    const int64_t r = index[i];
    if (r < 0 || r >= g.limit) continue;
    int64_t rem = i, doff = 0, soff = 0;
    for (int d = g.nd - 1; d >= 0; --d) {
      const int64_t c = rem % g.sizes[d];
      rem /= g.sizes[d];
      doff += (d == g.dim ? r : c) * g.a[d];
      soff += c * g.b[d];
    }
    atomic_extreme(dst + doff, src[soff], is_max);
  }
}

__global__ void one_hot_kernel(const int64_t* __restrict__ index, int64_t n, int64_t C,
                               int64_t* __restrict__ out) {
  DLTRAIN_GRID_STRIDE(i, n) {
    const int64_t r = index[i];
    if (r >= 0 && r < C) out[i * C + r] = 1;
  }
}

__global__ void count_kernel(const int64_t* __restrict__ ids, int64_t n, int64_t S,
                             unsigned long long* __restrict__ count) {
  DLTRAIN_GRID_STRIDE(e, n) {
    const int64_t r = ids[e];
    if (r >= 0 && r < S) atomicAdd(count + r, 1ull);
  }
}

template <class T>
struct CountOp {
  __device__ __forceinline__ T operator()(int64_t c) const {
    return convert<T>(static_cast<double>(c < 1 ? 1 : c));
  }
};

}  // namespace

void take_rows(const Tensor& out, const Tensor& x, const Tensor& index, int64_t outer, int64_t L,
               int64_t inner) {
  const int64_t K = index.numel(), n = outer * K * inner;
  if (n == 0) return;
  const int dev = out.device().index;
  Guard guard(dev);
  cu_dispatch_all(x.dtype(), "take_rows", [&]<class T>() {
    take_rows_kernel<T><<<grid_for(n, kThreads, dev), kThreads, 0, stream(dev)>>>(
        cptr<T>(x), cptr<int64_t>(index), mptr<T>(out), outer, L, K, inner);
  });
  check_launch();
}

void index_add_rows(const Tensor& dst, const Tensor& src, const Tensor& index, int64_t outer,
                    int64_t L, int64_t inner, int64_t skip) {
  const int64_t K = index.numel(), n = outer * K * inner;
  if (n == 0) return;
  const int dev = dst.device().index;
  Guard guard(dev);
  cu_dispatch_numeric(dst.dtype(), "index_add", [&]<class T>() {
    index_add_rows_kernel<T><<<grid_for(n, kThreads, dev), kThreads, 0, stream(dev)>>>(
        mptr<T>(dst), cptr<T>(src), cptr<int64_t>(index), outer, L, K, inner, skip);
  });
  check_launch();
}

void gather_dim(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) {
  const int64_t n = index.numel();
  if (n == 0) return;
  const int dev = out.device().index;
  Guard guard(dev);
  const DimGeom g = dim_geom("gather", index, dim, x, nullptr);
  cu_dispatch_all(x.dtype(), "gather", [&]<class T>() {
    gather_kernel<T><<<grid_for(n, kThreads, dev), kThreads, 0, stream(dev)>>>(
        g, cptr<T>(x), cptr<int64_t>(index), mptr<T>(out), n);
  });
  check_launch();
}

void scatter_add_dim(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src) {
  const int64_t n = index.numel();
  if (n == 0) return;
  const int dev = dst.device().index;
  Guard guard(dev);
  const DimGeom g = dim_geom("scatter_add", index, dim, dst, &src);
  cu_dispatch_numeric(dst.dtype(), "scatter_add", [&]<class T>() {
    scatter_add_kernel<T><<<grid_for(n, kThreads, dev), kThreads, 0, stream(dev)>>>(
        g, mptr<T>(dst), cptr<int64_t>(index), cptr<T>(src), n);
  });
  check_launch();
}

void scatter_extreme_dim(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src,
                         bool is_max) {
  const int64_t n = index.numel();
  if (n == 0) return;
  const int dev = dst.device().index;
  Guard guard(dev);
  const DimGeom g = dim_geom("scatter_reduce", index, dim, dst, &src);
  auto launch = [&]<class T>() {
    scatter_extreme_kernel<T><<<grid_for(n, kThreads, dev), kThreads, 0, stream(dev)>>>(
        g, mptr<T>(dst), cptr<int64_t>(index), cptr<T>(src), n, is_max);
  };
  if (dst.dtype() == DType::f32)
    launch.template operator()<float>();
  else if (dst.dtype() == DType::f64)
    launch.template operator()<double>();
  else
    DLTRAIN_FAIL("scatter_reduce: the CUDA amax/amin kernel takes f32 or f64, not ", dst.dtype());
  check_launch();
}

void one_hot(const Tensor& out, const Tensor& index, int64_t num_classes) {
  if (out.numel() == 0) return;
  const int dev = out.device().index;
  Guard guard(dev);
  DLTRAIN_CUDA_CHECK(cudaMemsetAsync(
      out.data_ptr(), 0, static_cast<size_t>(out.numel()) * sizeof(int64_t), stream(dev)));
  const int64_t n = index.numel();
  if (n == 0) return;
  one_hot_kernel<<<grid_for(n, kThreads, dev), kThreads, 0, stream(dev)>>>(
      cptr<int64_t>(index), n, num_classes, mptr<int64_t>(out));
  check_launch();
}

void segment_counts(const Tensor& counts, const Tensor& ids, int64_t num_segments) {
  if (num_segments == 0) return;
  const int dev = counts.device().index;
  Guard guard(dev);
  Tensor c = empty({num_segments}, TensorOptions(DType::i64).with_device(counts.device()));
  DLTRAIN_CUDA_CHECK(cudaMemsetAsync(
      c.data_ptr(), 0, static_cast<size_t>(num_segments) * sizeof(int64_t), stream(dev)));
  const int64_t n = ids.numel();
  if (n > 0) {
    count_kernel<<<grid_for(n, kThreads, dev), kThreads, 0, stream(dev)>>>(
        cptr<int64_t>(ids), n, num_segments, reinterpret_cast<unsigned long long*>(c.data_ptr()));
    check_launch();
  }
  cu_dispatch_floating(counts.dtype(), "segment_mean", [&]<class T>() {
    launch_map<T, int64_t>(counts, CountOp<T>{}, c.view(counts.shape()));
  });
}

}  // namespace dltrain::backend::cuda
