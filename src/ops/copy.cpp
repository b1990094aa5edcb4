// copy_, clone, contiguous and the to() conversions (dtype, device, layout).
// All are differentiable: their gradient is the incoming gradient converted
// back to the input's dtype and device.
#include <cstring>

#include "dltrain/autograd/node.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "src/backend/cpu/cast.hpp"
#include "src/backend/cpu/loops.hpp"
#include "src/backend/cuda/cuda_backend.hpp"

namespace dltrain {

namespace {

// dst[...] = cast(src[...]) on CPU, src broadcast to dst.
void cpu_convert(const Tensor& dst, const Tensor& src) {
  dispatch_all(dst.dtype(), [&]<class D>() {
    dispatch_all(src.dtype(), [&]<class S>() {
      backend::cpu::unary_map<D, S>(dst, src, [](S v) { return backend::cpu::cast<D>(v); });
    });
  });
}

MemoryFormat resolve(MemoryFormat fmt, const Tensor& t) {
  return fmt == MemoryFormat::Preserve ? t.suggest_memory_format() : fmt;
}

}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  checked();
  DLTRAIN_CHECK(src.defined(), "copy_: source tensor is undefined");
  DLTRAIN_CHECK(!(requires_grad() && is_leaf() && autograd::grad_mode_enabled()),
                "copy_(): in-place change of a leaf that requires grad; wrap it in NoGradGuard");
  DLTRAIN_CHECK(broadcast_shapes(shape(), src.shape(), "copy_") == shape(), "copy_: source shape ",
                shape_str(src.shape()), " does not broadcast to destination shape ",
                shape_str(shape()));
  if (device().is_cpu() && src.device().is_cpu()) {
    cpu_convert(*this, src);
    return *this;
  }
  // Cross-device or device-local: move contiguous bytes of the right dtype.
  Tensor s = src;
  if (s.device().is_cuda() &&
      (s.dtype() != dtype() || !s.is_contiguous() || s.shape() != shape())) {
    // Bring the source's whole storage to the host in one copy and view it there with the
    // source's shape, strides and offset (s.to(cpu) would come back here: endless recursion).
    Storage host(s.storage().nbytes(), Device::cpu());
    backend::cuda::copy_bytes(host.data(), Device::cpu(), s.storage().data(), s.device(),
                              s.storage().nbytes());
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = host;
    impl->shape = s.shape();
    impl->strides = s.strides();
    impl->offset = s.storage_offset();
    impl->dtype = s.dtype();
    s = Tensor(impl);
  }
  if (s.device().is_cpu()) {
    Tensor staged = empty(shape(), TensorOptions(dtype()));
    cpu_convert(staged, s);
    s = staged;
  }
  DLTRAIN_CHECK(is_contiguous(), "copy_: non-contiguous CUDA destinations (shape ",
                shape_str(shape()),
                ") are not supported by this build; copy into a contiguous tensor");
  backend::cuda::copy_bytes(data_ptr(), device(), s.data_ptr(), s.device(),
                            numel() * element_size());
  return *this;
}

Tensor Tensor::clone(MemoryFormat fmt) const {
  checked();
  Tensor out = empty(shape(), resolve(fmt, *this), options());
  {
    NoGradGuard g;
    out.copy_(*this);
  }
  autograd::record("clone", {*this}, {out},
                   [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor Tensor::contiguous(MemoryFormat fmt) const {
  if (is_contiguous(resolve(fmt, *this))) return *this;
  return clone(resolve(fmt, *this));
}

Tensor Tensor::to(MemoryFormat fmt) const { return contiguous(fmt); }

Tensor Tensor::to(DType dt) const {
  checked();
  if (dt == dtype()) return *this;
  Tensor out = empty(shape(), suggest_memory_format(), options().with_dtype(dt));
  {
    NoGradGuard g;
    out.copy_(*this);
  }
  if (is_floating(dt)) {
    const DType from = dtype();
    autograd::record("to_dtype", {*this}, {out}, [from](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].to(from)};
    });
  }
  return out;
}

Tensor Tensor::to(Device dev, bool /*non_blocking*/) const {
  checked();
  if (dev == device()) return *this;
  Tensor src = contiguous();
  Tensor out = empty(shape(), TensorOptions(dtype()).with_device(dev));
  {
    NoGradGuard g;
    out.copy_(src);
  }
  const Device from = device();
  autograd::record("to_device", {*this}, {out}, [from](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].to(from)};
  });
  return out;
}

}  // namespace dltrain
