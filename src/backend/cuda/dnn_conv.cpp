// conv2d forward, backward-data and backward-filter on cuDNN's convolution API (see dnn.hpp).
//
// One cache entry per (direction, device, dtype, layout, sizes, conv parameters, TF32 flag,
// benchmark flag, deterministic flag) holds the tensor, filter and convolution descriptors and the
// chosen algorithm with its math type and workspace size; entries are built once under the cache
// lock and never change afterwards, so concurrent calls may share them. Algorithm choice:
// in benchmark mode (dltrain::cuda::cudnn_benchmark()) cudnnFind*AlgorithmEx times every
// algorithm once on the call's own buffers and the fastest wins; otherwise the first of
// cudnnGet*Algorithm_v7's ranking (the heuristic's fastest first) that fits kMaxWorkspace, as
// PyTorch does with cudnn.deterministic off. cuda::set_cudnn_deterministic(true) restricts
// both to the algorithms cuDNN reports as deterministic (algo_policy.hpp). An f32
// convolution with TF32 switched off never takes a tensor-op algorithm and always runs FMA
// math, and no f32 convolution takes one that down-converts to f16. The workspace comes from the
// device's stream-ordered pool per call; the benchmark's is halved until it fits, on
// OutOfMemoryError only. Operand pointers below 16-byte alignment (views into
// larger buffers) are copied to fresh, aligned memory first, since some kernels need it.
#include <algorithm>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "dltrain/backend/cuda.hpp"
#include "src/backend/cuda/algo_policy.hpp"
#include "src/backend/cuda/dnn.hpp"
#include "src/backend/cuda/elementwise.hpp"
#include "src/backend/cuda/handles.hpp"
#include "src/backend/cuda/lib_check.hpp"
#include "src/backend/cuda/runtime.hpp"

namespace dltrain::backend::cuda {

namespace {

constexpr size_t kMaxWorkspace = size_t(1) << 30;

enum class Dir : int64_t { Forward = 0, BackwardData = 1, BackwardFilter = 2 };

const char* dir_name(Dir d) {
  switch (d) {
    case Dir::Forward:
      return "conv2d forward";
    case Dir::BackwardData:
      return "conv2d backward (input gradient)";
    case Dir::BackwardFilter:
      return "conv2d backward (weight gradient)";
  }
  return "conv2d";
}

// True for NHWC: every operand is channels-last dense and one of them is not NCHW-contiguous
// (size-1 dims make some tensors both); false for NCHW; throws otherwise.
bool is_nhwc(const char* op, std::initializer_list<const Tensor*> ts) {
  bool all_nchw = true, all_nhwc = true;
  for (const Tensor* t : ts) {
    DLTRAIN_CHECK(t->dim() == 4, op, " on CUDA: expected 4-d operands but got shape ",
                  shape_str(t->shape()));
    all_nchw = all_nchw && t->is_contiguous();
    all_nhwc = all_nhwc && t->is_contiguous(MemoryFormat::ChannelsLast);
  }
  if (all_nchw) return false;
  DLTRAIN_CHECK(all_nhwc, op,
                " on CUDA: operands must all be contiguous NCHW or all channels-last (internal "
                "error: the caller should have converted them)");
  return true;
}

// `t`, or a copy of it in fresh (256-byte aligned) memory when its address is not 16-byte
// aligned.
Tensor aligned(const Tensor& t, bool nhwc) {
  if (address_alignment(t.data_ptr()) >= 16) return t;
  return t.clone(nhwc ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
}

int to_int(int64_t v, const char* what) {
  DLTRAIN_CHECK(v >= 0 && v <= INT_MAX, "conv2d on CUDA: ", what, " = ", v,
                " exceeds cuDNN's 32-bit limit; split the batch");
  return static_cast<int>(v);
}

struct Geometry {
  int64_t N, C, H, W, K, kh, kw, Ho, Wo;
  ConvParams p;
  DType dtype;
  bool nhwc;
};

struct Entry {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;
  size_t workspace = 0;
};

struct Cache {
  std::mutex mu;
  std::map<std::vector<int64_t>, std::unique_ptr<Entry>> entries;
};
Cache& cache() {
  static auto* c = new Cache;  // process lifetime: entries hold library descriptors
  return *c;
}

cudnnTensorDescriptor_t tensor_desc(cudnnDataType_t type, bool nhwc, int64_t n, int64_t c,
                                    int64_t h, int64_t w) {
  DLTRAIN_CHECK(n * c * h * w <= INT_MAX, "conv2d on CUDA: a tensor of [", n, ", ", c, ", ", h,
                ", ", w, "] has more than 2^31-1 elements, beyond cuDNN's limit; split the batch");
  cudnnTensorDescriptor_t d = nullptr;
  DLTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
  DLTRAIN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                                 type, to_int(n, "N"), to_int(c, "C"),
                                                 to_int(h, "H"), to_int(w, "W")));
  return d;
}

// May the algorithm run with this math type for this dtype and TF32 setting?
bool math_ok(const Geometry& g, cudnnMathType_t m) {
  if (g.dtype != DType::f32) return true;
  if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;  // would round to f16
  return dltrain::cuda::allow_tf32() || m != CUDNN_TENSOR_OP_MATH;
}

// Picks from a perf list in cuDNN's order (the heuristic's ranking, or benchmark results
// sorted by time): the first usable one within `limit` bytes, deterministic only when
// cuda::cudnn_deterministic() (choose_algorithm).
template <class Perf>
const Perf* pick(const Geometry& g, const Perf* perf, int n, size_t limit) {
  const int i = choose_algorithm(
      n,
      [&](int k) {
        return perf[k].status == CUDNN_STATUS_SUCCESS && perf[k].memory <= limit &&
               math_ok(g, perf[k].mathType);
      },
      [&](int k) { return perf[k].determinism == CUDNN_DETERMINISTIC; },
      dltrain::cuda::cudnn_deterministic());
  return i < 0 ? nullptr : &perf[i];
}

// A workspace of at most `want` bytes for cudnnFind*Ex: halves the request while the pool
// reports out-of-memory (halving_allocation).
Tensor find_workspace(size_t want, Device dev, size_t& got) {
  return halving_allocation(
      want,
      [&](size_t size) {
        return empty({static_cast<int64_t>(size)}, TensorOptions(DType::u8).with_device(dev));
      },
      got);
}

std::string geometry_str(const Geometry& g) {
  return detail::cat("x [", g.N, ", ", g.C, ", ", g.H, ", ", g.W, "] ", g.nhwc ? "NHWC" : "NCHW",
                     " ", dtype_name(g.dtype), ", weight [", g.K, ", ", g.C / g.p.groups, ", ",
                     g.kh, ", ", g.kw, "], stride (", g.p.stride.h, ", ", g.p.stride.w,
                     "), padding (", g.p.padding.h, ", ", g.p.padding.w, "), dilation (",
                     g.p.dilation.h, ", ", g.p.dilation.w, "), groups ", g.p.groups);
}

// The three buffers of a call (x, w, y roles; for the backward ones the gradient buffers).
struct Buffers {
  const void* x;
  const void* w;
  const void* y;
  void* out;  // the one written: y, dx or dw
};

// Builds descriptors and chooses the algorithm for one direction.
void build(Entry& e, Dir dir, const Geometry& g, const Buffers& buf, int dev,
           cudnnHandle_t handle) {
  const cudnnDataType_t type = cudnn_data_type(g.dtype, "conv2d");
  e.x = tensor_desc(type, g.nhwc, g.N, g.C, g.H, g.W);
  e.y = tensor_desc(type, g.nhwc, g.N, g.K, g.Ho, g.Wo);
  DLTRAIN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&e.w));
  DLTRAIN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(
      e.w, type, g.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, to_int(g.K, "C_out"),
      to_int(g.C / g.p.groups, "C_in/groups"), to_int(g.kh, "kH"), to_int(g.kw, "kW")));
  DLTRAIN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&e.conv));
  const cudnnDataType_t compute = g.dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  DLTRAIN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      e.conv, to_int(g.p.padding.h, "padding"), to_int(g.p.padding.w, "padding"),
      to_int(g.p.stride.h, "stride"), to_int(g.p.stride.w, "stride"),
      to_int(g.p.dilation.h, "dilation"), to_int(g.p.dilation.w, "dilation"),
      CUDNN_CROSS_CORRELATION, compute));
  DLTRAIN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(e.conv, to_int(g.p.groups, "groups")));
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  if (g.dtype == DType::f16 || g.dtype == DType::bf16) math = CUDNN_TENSOR_OP_MATH;
  if (g.dtype == DType::f32 && !dltrain::cuda::allow_tf32()) math = CUDNN_FMA_MATH;
  DLTRAIN_CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, math));

  const bool bench = dltrain::cuda::cudnn_benchmark();
  const Device device = Device::cuda(dev);
  // Runs the Get_v7 ranking or (benchmark) the Find timing for one perf type, then commits
  // the pick: math type, algorithm, workspace size.
  auto choose = [&](auto* perf, int count, auto&& get, auto&& find, auto&& ws_size) {
    int returned = 0;
    DLTRAIN_CUDNN_CHECK(get(count, &returned, perf));
    using Perf = std::remove_pointer_t<decltype(perf)>;
    const Perf* chosen = nullptr;
    if (bench) {
      size_t want = 0;
      for (int i = 0; i < returned; ++i)
        if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= kMaxWorkspace)
          want = std::max(want, perf[i].memory);
      size_t got = 0;
      Tensor ws = find_workspace(want, device, got);
      int found = 0;
      DLTRAIN_CUDNN_CHECK(find(count, &found, perf, got > 0 ? ws.data_ptr() : nullptr, got));
      chosen = pick(g, perf, found, got);
    } else {
      chosen = pick(g, perf, returned, kMaxWorkspace);
    }
    DLTRAIN_CHECK(chosen != nullptr, dir_name(dir), " on CUDA: cuDNN offers no ",
                  dltrain::cuda::cudnn_deterministic() ? "deterministic " : "", "algorithm for ",
                  geometry_str(g),
                  " within a workspace of 1 GiB; try another memory format or dtype",
                  dltrain::cuda::cudnn_deterministic()
                      ? ", or allow non-deterministic ones (cuda::set_cudnn_deterministic(false))"
                      : "");
    // f32 without TF32 runs FMA math whatever the ranking reported (cuDNN's default math may
    // use TF32); everything else runs the math type the algorithm was ranked with.
    const bool fma_only = g.dtype == DType::f32 && !dltrain::cuda::allow_tf32();
    DLTRAIN_CUDNN_CHECK(
        cudnnSetConvolutionMathType(e.conv, fma_only ? CUDNN_FMA_MATH : chosen->mathType));
    e.algo = static_cast<int>(chosen->algo);
    size_t ws = 0;
    DLTRAIN_CUDNN_CHECK(ws_size(chosen->algo, &ws));
    e.workspace = std::max(ws, chosen->memory);
  };

  switch (dir) {
    case Dir::Forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      choose(
          perf, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
          [&](int n, int* r, cudnnConvolutionFwdAlgoPerf_t* p) {
            return cudnnGetConvolutionForwardAlgorithm_v7(handle, e.x, e.w, e.conv, e.y, n, r, p);
          },
          [&](int n, int* r, cudnnConvolutionFwdAlgoPerf_t* p, void* ws, size_t wss) {
            return cudnnFindConvolutionForwardAlgorithmEx(handle, e.x, buf.x, e.w, buf.w, e.conv,
                                                          e.y, buf.out, n, r, p, ws, wss);
          },
          [&](cudnnConvolutionFwdAlgo_t a, size_t* s) {
            return cudnnGetConvolutionForwardWorkspaceSize(handle, e.x, e.w, e.conv, e.y, a, s);
          });
      break;
    }
    case Dir::BackwardData: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      choose(
          perf, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
          [&](int n, int* r, cudnnConvolutionBwdDataAlgoPerf_t* p) {
            return cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, e.w, e.y, e.conv, e.x, n, r,
                                                               p);
          },
          [&](int n, int* r, cudnnConvolutionBwdDataAlgoPerf_t* p, void* ws, size_t wss) {
            return cudnnFindConvolutionBackwardDataAlgorithmEx(
                handle, e.w, buf.w, e.y, buf.y, e.conv, e.x, buf.out, n, r, p, ws, wss);
          },
          [&](cudnnConvolutionBwdDataAlgo_t a, size_t* s) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, e.w, e.y, e.conv, e.x, a,
                                                                s);
          });
      break;
    }
    case Dir::BackwardFilter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      choose(
          perf, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
          [&](int n, int* r, cudnnConvolutionBwdFilterAlgoPerf_t* p) {
            return cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, e.x, e.y, e.conv, e.w, n,
                                                                 r, p);
          },
          [&](int n, int* r, cudnnConvolutionBwdFilterAlgoPerf_t* p, void* ws, size_t wss) {
            return cudnnFindConvolutionBackwardFilterAlgorithmEx(
                handle, e.x, buf.x, e.y, buf.y, e.conv, e.w, buf.out, n, r, p, ws, wss);
          },
          [&](cudnnConvolutionBwdFilterAlgo_t a, size_t* s) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, e.x, e.y, e.conv, e.w, a,
                                                                  s);
          });
      break;
    }
  }
}

const Entry& entry_for(Dir dir, const Geometry& g, const Buffers& buf, int dev,
                       cudnnHandle_t handle) {
  const std::vector<int64_t> key{static_cast<int64_t>(dir),
                                 dev,
                                 static_cast<int64_t>(g.dtype),
                                 g.nhwc,
                                 g.N,
                                 g.C,
                                 g.H,
                                 g.W,
                                 g.K,
                                 g.kh,
                                 g.kw,
                                 g.p.stride.h,
                                 g.p.stride.w,
                                 g.p.padding.h,
                                 g.p.padding.w,
                                 g.p.dilation.h,
                                 g.p.dilation.w,
                                 g.p.groups,
                                 dltrain::cuda::allow_tf32(),
                                 dltrain::cuda::cudnn_benchmark(),
                                 dltrain::cuda::cudnn_deterministic()};
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  std::unique_ptr<Entry>& slot = c.entries[key];
  if (!slot) {
    auto e = std::make_unique<Entry>();
    build(*e, dir, g, buf, dev, handle);
    slot = std::move(e);
  }
  return *slot;
}

Geometry geometry(const Tensor& x, const Tensor& w, const Tensor& y, const ConvParams& p,
                  bool nhwc) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), w.size(0), w.size(2),
          w.size(3), y.size(2), y.size(3), p,         x.dtype(), nhwc};
}

void check_same(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  for (const Tensor* t : ts)
    DLTRAIN_CHECK(
        t->device() == first.device() && t->device().is_cuda() && t->dtype() == first.dtype(), op,
        " on CUDA: expected operands of one dtype on one CUDA device but got ", t->dtype(), " on ",
        t->device(), " and ", first.dtype(), " on ", first.device());
}

// Runs `dir` for the geometry with buffers (x, w, y) and output `out`.
template <class Run>
void run(Dir dir, const Geometry& g, const Buffers& buf, int dev, Run&& call) {
  cudnnHandle_t handle = cudnn_handle(dev);
  const Entry& e = entry_for(dir, g, buf, dev, handle);
  Tensor ws;
  if (e.workspace > 0)
    ws = empty({static_cast<int64_t>(e.workspace)},
               TensorOptions(DType::u8).with_device(Device::cuda(dev)));
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const bool dbl = g.dtype == DType::f64;
  const void* one = dbl ? static_cast<const void*>(&one_d) : &one_f;
  const void* zero = dbl ? static_cast<const void*>(&zero_d) : &zero_f;
  call(handle, e, one, zero, e.workspace > 0 ? ws.data_ptr() : nullptr, e.workspace);
}

}  // namespace

void conv2d_forward(const Tensor& y, const Tensor& x0, const Tensor& w0, const Tensor& bias,
                    const ConvParams& p) {
  check_same("conv2d", {&y, &x0, &w0});
  const bool nhwc = is_nhwc("conv2d", {&y, &x0, &w0});
  DLTRAIN_CHECK(address_alignment(y.data_ptr()) >= 16,
                "conv2d on CUDA: internal error: unaligned output buffer");
  if (y.numel() == 0) return;
  const int dev = y.device().index;
  Guard guard(dev);
  const Tensor x = aligned(x0, nhwc), w = aligned(w0, nhwc);
  const Geometry g = geometry(x, w, y, p, nhwc);
  const Buffers buf{x.data_ptr(), w.data_ptr(), y.data_ptr(), y.data_ptr()};
  run(Dir::Forward, g, buf, dev,
      [&](cudnnHandle_t h, const Entry& e, const void* one, const void* zero, void* ws,
          size_t wss) {
        DLTRAIN_CUDNN_CHECK(cudnnConvolutionForward(
            h, one, e.x, x.data_ptr(), e.w, w.data_ptr(), e.conv,
            static_cast<cudnnConvolutionFwdAlgo_t>(e.algo), ws, wss, zero, e.y, y.data_ptr()));
      });
  if (bias.defined()) {
    // y += bias broadcast over N, H, W: the elementwise kernel, in y's memory order (cuDNN's
    // cudnnAddTensor is slow on NHWC and its bf16 support is not documented).
    DLTRAIN_CHECK(bias.dtype() == y.dtype() && bias.numel() == g.K,
                  "conv2d on CUDA: bias must be [", g.K, "] of dtype ", y.dtype());
    binary(BinaryOp::Add, y, y, bias.reshape({1, g.K, 1, 1}));
  }
}

void conv2d_backward_data(const Tensor& gx, const Tensor& gy0, const Tensor& w0,
                          const ConvParams& p) {
  check_same("conv2d backward", {&gx, &gy0, &w0});
  const bool nhwc = is_nhwc("conv2d backward", {&gx, &gy0, &w0});
  DLTRAIN_CHECK(address_alignment(gx.data_ptr()) >= 16,
                "conv2d backward on CUDA: internal error: unaligned output buffer");
  if (gx.numel() == 0) return;
  const int dev = gx.device().index;
  Guard guard(dev);
  const Tensor gy = aligned(gy0, nhwc), w = aligned(w0, nhwc);
  const Geometry g = geometry(gx, w, gy, p, nhwc);
  const Buffers buf{gx.data_ptr(), w.data_ptr(), gy.data_ptr(), gx.data_ptr()};
  run(Dir::BackwardData, g, buf, dev,
      [&](cudnnHandle_t h, const Entry& e, const void* one, const void* zero, void* ws,
          size_t wss) {
        DLTRAIN_CUDNN_CHECK(cudnnConvolutionBackwardData(
            h, one, e.w, w.data_ptr(), e.y, gy.data_ptr(), e.conv,
            static_cast<cudnnConvolutionBwdDataAlgo_t>(e.algo), ws, wss, zero, e.x, gx.data_ptr()));
      });
}

void conv2d_backward_filter(const Tensor& gw, const Tensor& gy0, const Tensor& x0,
                            const ConvParams& p) {
  check_same("conv2d backward", {&gw, &gy0, &x0});
  const bool nhwc = is_nhwc("conv2d backward", {&gw, &gy0, &x0});
  DLTRAIN_CHECK(address_alignment(gw.data_ptr()) >= 16,
                "conv2d backward on CUDA: internal error: unaligned output buffer");
  if (gw.numel() == 0) return;
  const int dev = gw.device().index;
  Guard guard(dev);
  const Tensor gy = aligned(gy0, nhwc), x = aligned(x0, nhwc);
  const Geometry g = geometry(x, gw, gy, p, nhwc);
  const Buffers buf{x.data_ptr(), gw.data_ptr(), gy.data_ptr(), gw.data_ptr()};
  run(Dir::BackwardFilter, g, buf, dev,
      [&](cudnnHandle_t h, const Entry& e, const void* one, const void* zero, void* ws,
          size_t wss) {
        DLTRAIN_CUDNN_CHECK(
            cudnnConvolutionBackwardFilter(h, one, e.x, x.data_ptr(), e.y, gy.data_ptr(), e.conv,
                                           static_cast<cudnnConvolutionBwdFilterAlgo_t>(e.algo), ws,
                                           wss, zero, e.w, gw.data_ptr()));
      });
}

}  // namespace dltrain::backend::cuda
