// GradScaler's device side (entry points in src/backend/cuda/amp.hpp): the fused unscale +
// non-finite check over a list of gradients, and the scale update.
//
// Unscale is a multi-tensor launch (kernels/multi_tensor.cuh) per table of up to 64 dense
// gradients of one dtype, as PyTorch's _amp_foreach_non_finite_check_and_unscale_: each
// thread reads inv_scale from device memory, multiplies in float (double for f64) and stores
// 1.0f to found_inf when it meets an inf or NaN (every writer stores the same value, so the
// race is benign and no atomic is needed). Gradients that are not dense take the strided
// elementwise launcher with the same functor. The update is one thread: it is a handful of
// scalar operations whose inputs are already on the device, so the host never waits.
#include <cmath>

#include "kernels/common.cuh"
#include "kernels/multi_tensor.cuh"
#include "src/backend/cuda/amp.hpp"

namespace dltrain::backend::cuda {

namespace {

using namespace mta;

constexpr int kUnscaleMaxT = 64;
static_assert(sizeof(TensorTable<1, kUnscaleMaxT>) <= 3800);

template <class T>
__device__ __forceinline__ T unscale_one(T v, float inv, float* found_inf) {
  using A = acc_t<T>;
  const A a = convert<A>(v);
  if (!isfinite(a)) *found_inf = 1.0f;
  return inv == 1.0f ? v : convert<T>(a * static_cast<A>(inv));
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    unscale_kernel(TensorTable<1, kUnscaleMaxT> tt, const float* __restrict__ inv_scale,
                   float* __restrict__ found_inf) {
  int64_t start, n;
  const int t = chunk_of(tt, start, n);
  T* __restrict__ g = static_cast<T*>(tt.ptr[0][t]) + start;
  const float inv = *inv_scale;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) g[k] = unscale_one(g[k], inv, found_inf);
}

template <class T>
struct UnscaleOp {
  const float* inv_scale;
  float* found_inf;
  __device__ __forceinline__ T operator()(T v) const {
    return unscale_one(v, *inv_scale, found_inf);
  }
};

__global__ void update_scale_kernel(float* scale, int* growth_tracker, const float* found_inf,
                                    double growth_factor, double backoff_factor,
                                    int growth_interval) {
  if (*found_inf > 0.0f) {
    *scale = static_cast<float>(*scale * backoff_factor);
    *growth_tracker = 0;
    return;
  }
  const int successful = *growth_tracker + 1;
  if (successful == growth_interval) {
    const float grown = static_cast<float>(*scale * growth_factor);
    if (isfinite(grown)) *scale = grown;
    *growth_tracker = 0;
  } else {
    *growth_tracker = successful;
  }
}

void check_scalar(const char* op, const Tensor& t, DType dt, const Device& dev, const char* name) {
  DLTRAIN_CHECK(t.numel() == 1 && t.dtype() == dt && t.device() == dev, op, ": ", name,
                " must be a one-element ", dt, " tensor on ", dev, " but is ", t.dtype(), " ",
                shape_str(t.shape()), " on ", t.device());
}

}  // namespace

void amp_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf,
                 const Tensor& inv_scale) {
  const char* op = "GradScaler::unscale_";
  const Device dev = found_inf.device();
  DLTRAIN_CHECK(dev.is_cuda(), op, ": expected the found-inf flag on a CUDA device");
  check_scalar(op, found_inf, DType::f32, dev, "found_inf");
  check_scalar(op, inv_scale, DType::f32, dev, "inv_scale");
  if (grads.empty()) return;
  const DType dt = grads.front().dtype();
  std::vector<Tensor> dense_grads;
  for (const Tensor& g : grads) {
    DLTRAIN_CHECK(g.device() == dev && g.dtype() == dt, op, ": expected gradients of one dtype on ",
                  dev, " but got ", g.dtype(), " on ", g.device(), " next to ", dt);
    if (dense(g)) dense_grads.push_back(g);
  }
  Guard guard(dev);
  cudaStream_t st = stream(dev);
  const float* inv = static_cast<const float*>(inv_scale.data_ptr());
  float* found = static_cast<float*>(found_inf.data_ptr());
  cu_dispatch_floating(dt, op, [&]<class T>() {
    for (const Tensor& g : grads)
      if (!dense(g)) launch_map<T, T>(g, UnscaleOp<T>{inv, found}, g);
    std::vector<const Tensor*> ptrs;
    for (const Tensor& g : dense_grads) ptrs.push_back(&g);
    multi_tensor_apply<1, kUnscaleMaxT>(list_entries(ptrs), [&](const auto& tt, int nb, int64_t) {
      unscale_kernel<T><<<nb, kBlockThreads, 0, st>>>(tt, inv, found);
      check_launch();
    });
  });
}

void amp_update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                      double growth_factor, double backoff_factor, int64_t growth_interval) {
  const char* op = "GradScaler::update";
  const Device dev = scale.device();
  DLTRAIN_CHECK(dev.is_cuda(), op, ": expected the scale on a CUDA device");
  check_scalar(op, scale, DType::f32, dev, "the scale");
  check_scalar(op, growth_tracker, DType::i32, dev, "the growth tracker");
  check_scalar(op, found_inf, DType::f32, dev, "found_inf");
  Guard guard(dev);
  update_scale_kernel<<<1, 1, 0, stream(dev)>>>(
      static_cast<float*>(scale.data_ptr()), static_cast<int*>(growth_tracker.data_ptr()),
      static_cast<const float*>(found_inf.data_ptr()), growth_factor, backoff_factor,
      static_cast<int>(growth_interval));
  check_launch();
}

}  // namespace dltrain::backend::cuda
