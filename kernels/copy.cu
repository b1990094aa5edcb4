// Strided, converting, broadcasting copy on one CUDA device (Tensor::copy_, contiguous(),
// to(dtype) and every layout change). Same-dtype dense copies with equal layouts are a
// cudaMemcpyAsync; everything else is one launch_map.
#include "kernels/common.cuh"
#include "src/backend/cuda/elementwise.hpp"

namespace dltrain::backend::cuda {

namespace {
template <class D, class S>
struct ConvertOp {
  __device__ __forceinline__ D operator()(S v) const { return convert<D>(v); }
};
// The product rounded to S first, as mul(src, scale) then copy_ would (and the CPU does).
template <class D, class S>
struct ScaledConvertOp {
  acc_t<S> scale;
  __device__ __forceinline__ D operator()(S v) const {
    return convert<D>(convert<S>(convert<acc_t<S>>(v) * scale));
  }
};
}  // namespace

void copy(const Tensor& dst, const Tensor& src) {
  DLTRAIN_CHECK(dst.device().is_cuda() && dst.device() == src.device(),
                "cuda copy: expected both tensors on one CUDA device but got ", dst.device(),
                " and ", src.device());
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.shape() == src.shape() && dst.strides() == src.strides() &&
      dst.is_contiguous(dst.suggest_memory_format())) {
    Guard g(dst.device());
    DLTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(),
                                       static_cast<size_t>(dst.numel()) * dst.element_size(),
                                       cudaMemcpyDeviceToDevice, stream(dst.device())));
    return;
  }
  cu_dispatch_all(dst.dtype(), "copy", [&]<class D>() {
    cu_dispatch_all(src.dtype(), "copy",
                    [&]<class S>() { launch_map<D, S>(dst, ConvertOp<D, S>{}, src); });
  });
}

void copy_scaled(const Tensor& dst, const Tensor& src, double scale) {
  DLTRAIN_CHECK(dst.device().is_cuda() && dst.device() == src.device(),
                "cuda copy_scaled: expected both tensors on one CUDA device but got ", dst.device(),
                " and ", src.device());
  if (dst.numel() == 0) return;
  cu_dispatch_floating(dst.dtype(), "copy_scaled_", [&]<class D>() {
    cu_dispatch_floating(src.dtype(), "copy_scaled_", [&]<class S>() {
      // The scale as mul_ would see it: rounded to S, then in S's compute type.
      const acc_t<S> s = convert<acc_t<S>>(convert<S>(scale));
      launch_map<D, S>(dst, ScaledConvertOp<D, S>{s}, src);
    });
  });
}

}  // namespace dltrain::backend::cuda
