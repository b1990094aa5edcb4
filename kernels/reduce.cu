// Reductions on CUDA: sums over any dim set, max/min with first-extreme indices, and the
// max/min gradient scatter.
//
// A reduction is planned as a Geom: x's dims with size > 1, ordered by x's memory order
// (broadcast dims outermost) and merged where contiguous, split into kept dims (one output
// each) and reduced dims. Two kernels cover every layout:
// - row: the innermost memory dim is reduced, so a group of threads (a warp, or the whole
//   block for long rows) reduces one output reading consecutive addresses;
// - column: the innermost memory dim is kept (or rows are short), so consecutive threads own
//   consecutive outputs and read coalesced, with up to 8 threads per output splitting the
//   reduced range and combining through shared memory.
// When the outputs alone cannot fill the GPU, the reduced range is also split across
// blockIdx.y; each split writes a partial result and a second kernel combines the partials
// (a warp per output). Every combination runs in a fixed order (no atomics), so a result is
// deterministic for a given device. Sums accumulate in float (f16/bf16/f32), double (f64) or
// int64 (integers); max/min combine (value, index) pairs with a commutative, associative rule
// (NaN first, then the extreme value, then the lower index), which reproduces the CPU's
// sequential "first extreme, NaN wins" scan in any order.
#include <algorithm>
#include <climits>

#include "kernels/common.cuh"
#include "src/backend/cuda/reduce.hpp"

namespace dltrain::backend::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxSplits = 1024;

// --- geometry --------------------------------------------------------------------------

template <class I>
__device__ __forceinline__ int64_t offset_of(I q, int n, const int64_t* size,
                                             const int64_t* stride) {
  int64_t off = 0;
  for (int d = 0; d + 1 < n; ++d) {
    const I s = static_cast<I>(size[d]);
    const I i = q % s;
    q /= s;
    off += static_cast<int64_t>(i) * stride[d];
  }
  if (n > 0) off += static_cast<int64_t>(q) * stride[n - 1];
  return off;
}

struct Geom {
  int nk = 0, nr = 0;
  int64_t M = 1, R = 1;
  bool small = true;  // M and R fit 32-bit index math
  // Kept dims, innermost first: sizes, input strides, output strides.
  int64_t ksize[kMaxDims], kin[kMaxDims], kout[kMaxDims];
  // Reduced dims, innermost first: sizes, input strides.
  int64_t rsize[kMaxDims], rin[kMaxDims];

  __device__ __forceinline__ int64_t kept_in(int64_t m) const {
    return small ? offset_of<uint32_t>(static_cast<uint32_t>(m), nk, ksize, kin)
                 : offset_of<uint64_t>(static_cast<uint64_t>(m), nk, ksize, kin);
  }
  __device__ __forceinline__ int64_t kept_out(int64_t m) const {
    return small ? offset_of<uint32_t>(static_cast<uint32_t>(m), nk, ksize, kout)
                 : offset_of<uint64_t>(static_cast<uint64_t>(m), nk, ksize, kout);
  }
  __device__ __forceinline__ int64_t reduced(int64_t r) const {
    if (nr == 1) return r * rin[0];
    return small ? offset_of<uint32_t>(static_cast<uint32_t>(r), nr, rsize, rin)
                 : offset_of<uint64_t>(static_cast<uint64_t>(r), nr, rsize, rin);
  }
};

// Plans reducing x into out (out: x's rank, each dim x's or 1). Sets `row` when the innermost
// memory dim is reduced and rows are long enough for a warp.
Geom make_geom(const Tensor& out, const Tensor& x, bool& row, const char* op) {
  const int64_t nd = x.dim();
  DLTRAIN_CHECK(out.dim() == nd, op, " (cuda): output rank ", out.dim(),
                " differs from input rank ", nd);
  struct D {
    int64_t size, in, out;
    bool red;
  };
  std::vector<D> dims;
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t s = x.shape()[d];
    DLTRAIN_CHECK(out.shape()[d] == s || out.shape()[d] == 1, op, " (cuda): output shape ",
                  shape_str(out.shape()), " does not match input shape ", shape_str(x.shape()));
    if (s == 1) continue;
    const bool red = out.shape()[d] == 1;
    dims.push_back({s, x.strides()[d], red ? 0 : out.strides()[d], red});
  }
  // x's memory order, outermost first; broadcast (stride 0) dims go outermost.
  auto key = [](const D& d) { return d.in == 0 ? INT64_MAX : d.in; };
  std::stable_sort(dims.begin(), dims.end(),
                   [&](const D& a, const D& b) { return key(a) > key(b); });
  std::vector<D> merged;
  for (const D& d : dims) {
    if (!merged.empty()) {
      D& o = merged.back();
      if (o.red == d.red && o.in == d.in * d.size && o.out == d.out * d.size) {
        o.size *= d.size;
        o.in = d.in;
        o.out = d.out;
        continue;
      }
    }
    merged.push_back(d);
  }
  DLTRAIN_CHECK(merged.size() <= static_cast<size_t>(kMaxDims), op, " (cuda): at most ", kMaxDims,
                " dimensions are supported; got shape ", shape_str(x.shape()));
  Geom g;
  for (auto it = merged.rbegin(); it != merged.rend(); ++it) {  // innermost first
    if (it->red) {
      g.rsize[g.nr] = it->size;
      g.rin[g.nr] = it->in;
      g.R *= it->size;
      ++g.nr;
    } else {
      g.ksize[g.nk] = it->size;
      g.kin[g.nk] = it->in;
      g.kout[g.nk] = it->out;
      g.M *= it->size;
      ++g.nk;
    }
  }
  g.small = g.M <= static_cast<int64_t>(UINT32_MAX) && g.R <= static_cast<int64_t>(UINT32_MAX);
  row = !merged.empty() && merged.back().red && g.R >= 16;
  return g;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// --- reduction operators ---------------------------------------------------------------

template <class T>
using sum_acc_t = std::conditional_t<std::is_floating_point_v<acc_t<T>>, acc_t<T>, int64_t>;

__device__ __forceinline__ float shfl_down(float v, int d) {
  return __shfl_down_sync(0xffffffffu, v, d);
}
__device__ __forceinline__ double shfl_down(double v, int d) {
  return __shfl_down_sync(0xffffffffu, v, d);
}
__device__ __forceinline__ int64_t shfl_down(int64_t v, int d) {
  return static_cast<int64_t>(__shfl_down_sync(0xffffffffu, static_cast<long long>(v), d));
}
__device__ __forceinline__ int32_t shfl_down(int32_t v, int d) {
  return __shfl_down_sync(0xffffffffu, v, d);
}
__device__ __forceinline__ uint8_t shfl_down(uint8_t v, int d) {
  return static_cast<uint8_t>(__shfl_down_sync(0xffffffffu, static_cast<int>(v), d));
}

template <class T>
struct SumOp {
  using Acc = sum_acc_t<T>;
  using Out = std::conditional_t<std::is_floating_point_v<acc_t<T>>, T, int64_t>;
  Out* out;
  __device__ __forceinline__ Acc identity() const { return Acc(0); }
  __device__ __forceinline__ Acc load(T v, int64_t) const {
    return static_cast<Acc>(convert<acc_t<T>>(v));
  }
  __device__ __forceinline__ Acc combine(Acc a, Acc b) const { return a + b; }
  __device__ __forceinline__ Acc shfl(Acc a, int d) const { return shfl_down(a, d); }
  __device__ __forceinline__ void store(int64_t off, Acc a) const { out[off] = convert<Out>(a); }
};

template <class V>
struct ArgAcc {
  V v;
  int64_t i;  // -1: no element yet
};

template <class T, bool IsMax>
struct ArgOp {
  using V = acc_t<T>;
  using Acc = ArgAcc<V>;
  T* values;
  int64_t* indices;
  __device__ __forceinline__ Acc identity() const { return {V(0), -1}; }
  __device__ __forceinline__ Acc load(T v, int64_t r) const { return {convert<V>(v), r}; }
  __device__ __forceinline__ static bool is_nan(V v) {
    if constexpr (std::is_floating_point_v<V>)
      return v != v;
    else
      return false;
  }
  __device__ __forceinline__ Acc combine(Acc a, Acc b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    const bool an = is_nan(a.v), bn = is_nan(b.v);
    if (an || bn) {
      if (an && bn) return a.i < b.i ? a : b;
      return an ? a : b;
    }
    if (a.v == b.v) return a.i < b.i ? a : b;
    if constexpr (IsMax)
      return a.v > b.v ? a : b;
    else
      return a.v < b.v ? a : b;
  }
  __device__ __forceinline__ Acc shfl(Acc a, int d) const {
    return {shfl_down(a.v, d), shfl_down(a.i, d)};
  }
  __device__ __forceinline__ void store(int64_t off, Acc a) const {
    values[off] = convert<T>(a.v);
    indices[off] = a.i;
  }
};

// --- kernels ---------------------------------------------------------------------------

// Combines the elements r, r + step, ... < end of one output (four independent chains so
// that four loads are in flight per thread).
template <class Op, class T>
__device__ __forceinline__ typename Op::Acc accumulate(const Op& op, const Geom& g, const T* base,
                                                       int64_t r, int64_t end, int64_t step) {
  using Acc = typename Op::Acc;
  Acc a0 = op.identity(), a1 = a0, a2 = a0, a3 = a0;
  for (; r + 3 * step < end; r += 4 * step) {
    const T v0 = base[g.reduced(r)];
    const T v1 = base[g.reduced(r + step)];
    const T v2 = base[g.reduced(r + 2 * step)];
    const T v3 = base[g.reduced(r + 3 * step)];
    a0 = op.combine(a0, op.load(v0, r));
    a1 = op.combine(a1, op.load(v1, r + step));
    a2 = op.combine(a2, op.load(v2, r + 2 * step));
    a3 = op.combine(a3, op.load(v3, r + 3 * step));
  }
  for (; r < end; r += step) a0 = op.combine(a0, op.load(base[g.reduced(r)], r));
  return op.combine(op.combine(a0, a1), op.combine(a2, a3));
}

template <class Op>
__device__ __forceinline__ typename Op::Acc warp_reduce(const Op& op, typename Op::Acc a) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a = op.combine(a, op.shfl(a, o));
  return a;
}

// Row kernel: groups of `group` threads (32 or kThreads) each reduce one output over the
// reduced range [blockIdx.y * chunk, +chunk).
template <class Op, class T>
__global__ void __launch_bounds__(kThreads)
    reduce_row_kernel(Geom g, const T* __restrict__ x, Op op, typename Op::Acc* partial, int group,
                      int64_t chunk) {
  using Acc = typename Op::Acc;
  __shared__ alignas(16) unsigned char smem_raw[(kThreads / 32) * sizeof(Acc)];
  Acc* smem = reinterpret_cast<Acc*>(smem_raw);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % group;
  const int64_t m = static_cast<int64_t>(blockIdx.x) * (kThreads / group) + tid / group;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t r1 = r0 + chunk < g.R ? r0 + chunk : g.R;
  Acc acc = op.identity();
  if (m < g.M) acc = accumulate(op, g, x + g.kept_in(m), r0 + lane, r1, group);
  acc = warp_reduce(op, acc);
  if (group > 32) {  // combine the group's warps in order
    const int warp = tid / 32;
    if (tid % 32 == 0) smem[warp] = acc;
    __syncthreads();
    if (lane == 0)
      for (int w = 1; w < group / 32; ++w) acc = op.combine(acc, smem[warp + w]);
  }
  if (lane == 0 && m < g.M) {
    if (gridDim.y == 1)
      op.store(g.kept_out(m), acc);
    else
      partial[static_cast<int64_t>(blockIdx.y) * g.M + m] = acc;
  }
}

// Column kernel: blockDim (bx, by); thread x owns output blockIdx.x * bx + x, the by threads of
// a column split its reduced range [blockIdx.y * chunk, +chunk) and combine in order.
template <class Op, class T>
__global__ void __launch_bounds__(kThreads)
    reduce_col_kernel(Geom g, const T* __restrict__ x, Op op, typename Op::Acc* partial,
                      int64_t chunk) {
  using Acc = typename Op::Acc;
  __shared__ alignas(16) unsigned char smem_raw[kThreads * sizeof(Acc)];
  Acc* smem = reinterpret_cast<Acc*>(smem_raw);
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int bx = static_cast<int>(blockDim.x), by = static_cast<int>(blockDim.y);
  const int64_t m = static_cast<int64_t>(blockIdx.x) * bx + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t r1 = r0 + chunk < g.R ? r0 + chunk : g.R;
  Acc acc = op.identity();
  if (m < g.M) acc = accumulate(op, g, x + g.kept_in(m), r0 + ty, r1, by);
  if (by > 1) {
    smem[ty * bx + tx] = acc;
    __syncthreads();
    if (ty == 0)
      for (int k = 1; k < by; ++k) acc = op.combine(acc, smem[k * bx + tx]);
  }
  if (ty == 0 && m < g.M) {
    if (gridDim.y == 1)
      op.store(g.kept_out(m), acc);
    else
      partial[static_cast<int64_t>(blockIdx.y) * g.M + m] = acc;
  }
}

// Second pass: a warp per output combines its `splits` partials in order.
template <class Op>
__global__ void __launch_bounds__(kThreads)
    reduce_finalize_kernel(Geom g, Op op, const typename Op::Acc* __restrict__ partial,
                           int64_t splits) {
  using Acc = typename Op::Acc;
  const int64_t m = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (m >= g.M) return;  // uniform across the warp
  Acc acc = op.identity();
  for (int64_t s = lane; s < splits; s += 32) acc = op.combine(acc, partial[s * g.M + m]);
  acc = warp_reduce(op, acc);
  if (lane == 0) op.store(g.kept_out(m), acc);
}

// Launches the reduction of x (device type T) planned by g with operator op.
template <class Op, class T>
void launch_reduce(const Geom& g, bool row, const Tensor& x, const Op& op) {
  using Acc = typename Op::Acc;
  if (g.M == 0) return;
  const int dev = x.device().index;
  cudaStream_t s = stream(dev);
  const T* xp = static_cast<const T*>(x.data_ptr());
  const int64_t target = static_cast<int64_t>(sm_count(dev)) * (2048 / kThreads);  // one wave
  dim3 block, grid;
  int group = 32;
  int64_t blocks_x = 0, splits = 1;
  const int64_t R = std::max<int64_t>(g.R, 1);
  if (row) {
    group = g.R >= 1024 ? kThreads : 32;
    blocks_x = ceil_div(g.M, kThreads / group);
    if (blocks_x < target)
      splits = std::clamp<int64_t>(ceil_div(target, blocks_x), 1,
                                   std::min(kMaxSplits, ceil_div(R, group * 16)));
    block = dim3(kThreads);
  } else {
    int bx = 32;
    while (bx < kThreads && bx < g.M) bx *= 2;
    int by = kThreads / bx;
    while (by > 1 && by > g.R) by /= 2;
    blocks_x = ceil_div(g.M, bx);
    if (blocks_x < target)
      splits = std::clamp<int64_t>(ceil_div(target, blocks_x), 1,
                                   std::min(kMaxSplits, ceil_div(R, by * 16)));
    block = dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by));
  }
  // Chunks are whole multiples of the threads striding over them.
  const int64_t stride = row ? group : static_cast<int64_t>(block.y);
  int64_t chunk = ceil_div(ceil_div(R, splits), stride) * stride;
  splits = ceil_div(R, chunk);
  DLTRAIN_CHECK(blocks_x <= INT32_MAX, "reduction (cuda): ", g.M, " outputs are too many");
  grid = dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(splits));
  Tensor workspace;
  Acc* partial = nullptr;
  if (splits > 1) {
    workspace = empty({splits * g.M * static_cast<int64_t>(sizeof(Acc))},
                      TensorOptions(DType::u8).with_device(x.device()));
    partial = static_cast<Acc*>(workspace.data_ptr());
  }
  if (row)
    reduce_row_kernel<Op, T><<<grid, block, 0, s>>>(g, xp, op, partial, group, chunk);
  else
    reduce_col_kernel<Op, T><<<grid, block, 0, s>>>(g, xp, op, partial, chunk);
  DLTRAIN_CUDA_CHECK(cudaGetLastError());
  if (splits > 1) {
    const int64_t fin_blocks = ceil_div(g.M * 32, kThreads);
    DLTRAIN_CHECK(fin_blocks <= INT32_MAX, "reduction (cuda): ", g.M, " outputs are too many");
    reduce_finalize_kernel<Op>
        <<<static_cast<unsigned>(fin_blocks), kThreads, 0, s>>>(g, op, partial, splits);
    DLTRAIN_CUDA_CHECK(cudaGetLastError());
  }
}

// grad_in[base(m) + idx[m] * dim_stride] = grad[m] over the keepdim shape.
template <class T>
__global__ void extreme_scatter_kernel(OffsetCalc<3> calc, int64_t n, T* gin, const T* grad,
                                       const int64_t* idx, int64_t dim_stride) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[3];
    calc.get(i, off);
    gin[off[0] + idx[off[2]] * dim_stride] = grad[off[1]];
  }
}

}  // namespace

void sum(const Tensor& out, const Tensor& x) {
  DLTRAIN_CHECK(out.device() == x.device() && x.device().is_cuda(),
                "sum (cuda): expected both tensors on one CUDA device but got ", out.device(),
                " and ", x.device());
  Guard guard(x.device());
  bool row = false;
  const Geom g = make_geom(out, x, row, "sum");
  cu_dispatch_numeric(x.dtype(), "sum", [&]<class T>() {
    using Out = typename SumOp<T>::Out;
    DLTRAIN_CHECK(out.dtype() == (std::is_same_v<Out, int64_t> ? DType::i64 : x.dtype()),
                  "sum (cuda): output dtype ", out.dtype(), " does not match input dtype ",
                  x.dtype());
    launch_reduce<SumOp<T>, T>(g, row, x, SumOp<T>{static_cast<Out*>(out.data_ptr())});
  });
}

void extreme(const Tensor& values, const Tensor& indices, const Tensor& x, int64_t dim,
             bool is_max) {
  const char* op = is_max ? "max" : "min";
  DLTRAIN_CHECK(
      values.device() == x.device() && indices.device() == x.device() && x.device().is_cuda(), op,
      " (cuda): expected all tensors on one CUDA device");
  DLTRAIN_CHECK(values.dtype() == x.dtype() && indices.dtype() == DType::i64 &&
                    values.shape() == indices.shape() && values.strides() == indices.strides(),
                op,
                " (cuda): values must have the input's dtype and indices be i64, with equal "
                "shapes and strides");
  DLTRAIN_CHECK(x.numel() > 0, op, " (cuda): cannot reduce an empty tensor");
  Guard guard(x.device());
  bool row = false;
  const Geom g = make_geom(values, x, row, op);
  DLTRAIN_CHECK(g.nr <= 1 && (x.dim() == 0 || values.shape()[wrap_dim(dim, x.dim(), op)] == 1), op,
                " (cuda): expected a reduction over dimension ", dim, " only");
  cu_dispatch_numeric(x.dtype(), op, [&]<class T>() {
    T* v = static_cast<T*>(values.data_ptr());
    int64_t* ix = static_cast<int64_t*>(indices.data_ptr());
    if (is_max)
      launch_reduce<ArgOp<T, true>, T>(g, row, x, ArgOp<T, true>{v, ix});
    else
      launch_reduce<ArgOp<T, false>, T>(g, row, x, ArgOp<T, false>{v, ix});
  });
}

void extreme_backward(const Tensor& grad_in, const Tensor& grad, const Tensor& indices,
                      int64_t dim) {
  DLTRAIN_CHECK(grad_in.device() == grad.device() && indices.device() == grad.device() &&
                    grad.device().is_cuda(),
                "max/min backward (cuda): expected all tensors on one CUDA device");
  DLTRAIN_CHECK(grad_in.dtype() == grad.dtype() && indices.dtype() == DType::i64 &&
                    grad.shape() == indices.shape() && grad.dim() == grad_in.dim(),
                "max/min backward (cuda): mismatched gradient, input or index tensors");
  const int64_t n = grad.numel();
  if (n == 0) return;
  const int dev = grad.device().index;
  Guard guard(dev);
  const Tensor window = grad_in.narrow(dim, 0, 1);  // the keepdim shape with grad_in's strides
  const Plan<3> plan = make_plan<3>(grad.shape(), {&window, &grad, &indices});
  const int64_t dim_stride = grad_in.strides()[wrap_dim(dim, grad_in.dim(), "max/min backward")];
  cu_dispatch_floating(grad.dtype(), "max/min backward", [&]<class T>() {
    extreme_scatter_kernel<T><<<grid_for(n, kThreads, dev), kThreads, 0, stream(dev)>>>(
        plan.calc, n, static_cast<T*>(window.data_ptr()), static_cast<const T*>(grad.data_ptr()),
        static_cast<const int64_t*>(indices.data_ptr()), dim_stride);
    DLTRAIN_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace dltrain::backend::cuda
