// copy_, clone, contiguous and the to() conversions (dtype, device, layout).
// All are differentiable: their gradient is the incoming gradient converted
// back to the input's dtype and device.
#include <cstring>

#include "dltrain/autograd/node.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "src/backend/cpu/cast.hpp"
#include "src/backend/cpu/half_convert.hpp"
#include "src/backend/cpu/loops.hpp"
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/elementwise.hpp"
#include "src/core/layout.hpp"
#include "src/core/trace.hpp"

namespace dltrain {

namespace {

// dst[...] = Half(src[...] * scale) (f32 -> f16) or float(src[...]) (f16 -> f32; with
// scale != 1, float(Half(float(src[...]) * scale))) through the bulk loops (F16C where the CPU
// has it) on unit-stride runs, src broadcast to dst.
void cpu_convert_half(const Tensor& dst, const Tensor& src, float scale) {
  std::array<char*, 2> base{static_cast<char*>(dst.data_ptr()), static_cast<char*>(src.data_ptr())};
  const bool to_half = dst.dtype() == DType::f16;
  backend::cpu::for_each_strided<2>(
      dst.shape(), base, {dst.strides(), backend::cpu::broadcast_strides(src, dst.shape())},
      {dst.element_size(), src.element_size()},
      [&](const std::array<char*, 2>& p, const std::array<int64_t, 2>& st, int64_t n) {
        const int64_t so = st[0] / static_cast<int64_t>(dst.element_size());
        const int64_t sa = st[1] / static_cast<int64_t>(src.element_size());
        if (to_half) {
          Half* o = reinterpret_cast<Half*>(p[0]);
          const float* a = reinterpret_cast<const float*>(p[1]);
          if (so == 1 && sa == 1) return backend::cpu::f32_to_f16(a, o, n, scale);
          for (int64_t i = 0; i < n; ++i)
            backend::cpu::f32_to_f16(a + i * sa, o + i * so, 1, scale);
        } else {
          float* o = reinterpret_cast<float*>(p[0]);
          const Half* a = reinterpret_cast<const Half*>(p[1]);
          if (so == 1 && sa == 1) return backend::cpu::f16_to_f32(a, o, n, scale);
          for (int64_t i = 0; i < n; ++i)
            backend::cpu::f16_to_f32(a + i * sa, o + i * so, 1, scale);
        }
      });
}

bool half_float_pair(const Tensor& dst, const Tensor& src) {
  return (dst.dtype() == DType::f16 && src.dtype() == DType::f32) ||
         (dst.dtype() == DType::f32 && src.dtype() == DType::f16);
}

// dst[...] = cast(src[...]) on CPU, src broadcast to dst.
void cpu_convert(const Tensor& dst, const Tensor& src) {
  if (half_float_pair(dst, src)) return cpu_convert_half(dst, src, 1.0f);
  dispatch_all(dst.dtype(), [&]<class D>() {
    dispatch_all(src.dtype(), [&]<class S>() {
      backend::cpu::unary_map<D, S>(dst, src, [](S v) { return backend::cpu::cast<D>(v); });
    });
  });
}

MemoryFormat resolve(MemoryFormat fmt, const Tensor& t) {
  return fmt == MemoryFormat::Preserve ? t.suggest_memory_format() : fmt;
}

// Two dense tensors (src/core/layout.hpp) with equal shape and strides copy as bytes.
using dltrain::detail::is_dense;
bool dense(const Tensor& t) { return is_dense(t); }
bool bytes_compatible(const Tensor& dst, const Tensor& src) {
  return dst.dtype() == src.dtype() && dst.shape() == src.shape() && dense(dst) && dense(src) &&
         (dst.strides() == src.strides() || dst.numel() <= 1);
}

// A copy of `src` in fresh memory: what a copy from a source that overlaps its destination
// reads instead (the kernels, the memcpy fast path above all, assume disjoint operands).
Tensor staged_source(const Tensor& src) {
  NoGradGuard ng;
  Tensor t = empty(src.shape(), src.suggest_memory_format(), src.options());
  t.copy_(src);
  return t;
}

}  // namespace

Tensor& Tensor::copy_(const Tensor& src, bool non_blocking) {
  DLTRAIN_OP_SCOPE("copy_", *this, src);
  checked();
  DLTRAIN_CHECK(src.defined(), "copy_: source tensor is undefined");
  DLTRAIN_CHECK(!(requires_grad() && is_leaf() && autograd::grad_mode_enabled()),
                "copy_(): in-place change of a leaf that requires grad; wrap it in NoGradGuard");
  DLTRAIN_CHECK(broadcast_shapes(shape(), src.shape(), "copy_") == shape(), "copy_: source shape ",
                shape_str(src.shape()), " does not broadcast to destination shape ",
                shape_str(shape()));
  if (numel() == 0) return *this;
  impl()->storage.bump_version("copy_");
  // Views of one storage (docs/design.md, "Copies between overlapping views"): the same
  // elements copy to themselves, a no-op; any other overlap reads a staged copy of the source,
  // as if it had been read whole before the first write (NumPy's semantics).
  switch (dltrain::detail::memory_overlap(*this, src)) {
    case dltrain::detail::Overlap::Full:
      return *this;
    case dltrain::detail::Overlap::Partial:
      return copy_(staged_source(src), non_blocking);
    case dltrain::detail::Overlap::None:
      break;
  }
  if (device().is_cpu() && src.device().is_cpu()) {
    cpu_convert(*this, src);
    return *this;
  }
  if (device() == src.device()) {  // one CUDA device: one strided, converting kernel
    backend::cuda::copy(*this, src);
    return *this;
  }
  // Across devices, bytes move between dense buffers of equal dtype and layout: the source
  // is converted and laid out like the destination on its own side first, and the
  // destination receives into a dense staging buffer when it is not dense itself.
  Tensor dst_dense = dense(*this) ? *this : empty(shape(), options());
  Tensor s = src;
  if (!bytes_compatible(dst_dense, s)) {
    Tensor staged = empty_strided(dst_dense.shape(), dst_dense.strides(),
                                  TensorOptions(dtype()).with_device(src.device()));
    if (src.device().is_cpu())
      cpu_convert(staged, src);
    else
      backend::cuda::copy(staged, src);
    s = staged;
  }
  const bool async = non_blocking && dst_dense.data_ptr() == data_ptr() &&
                     (s.device().is_cpu() ? s.is_pinned() : dst_dense.is_pinned());
  backend::cuda::copy_bytes(dst_dense.data_ptr(), device(), s.data_ptr(), s.device(),
                            static_cast<size_t>(numel()) * element_size(), async);
  if (async) {  // the pinned block is reused only after this copy's stream has run it
    const int dev = device().is_cuda() ? device().index : s.device().index;
    cuda::record_stream(s.device().is_cpu() ? s : dst_dense, cuda::current_stream(dev));
  }
  if (dst_dense.data_ptr() != data_ptr()) {
    if (device().is_cpu())
      cpu_convert(*this, dst_dense);
    else
      backend::cuda::copy(*this, dst_dense);
  }
  return *this;
}

Tensor Tensor::pin_memory() const {
  DLTRAIN_OP_SCOPE("pin_memory", *this);
  checked();
  DLTRAIN_CHECK(device().is_cpu(), "pin_memory: the tensor is already on ", device(),
                "; only CPU tensors can be pinned");
  if (is_pinned()) return *this;
  Tensor src = contiguous();
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::pinned(static_cast<size_t>(numel()) * element_size());
  impl->shape = shape();
  impl->strides = contiguous_strides(shape());
  impl->dtype = dtype();
  if (numel() > 0)
    std::memcpy(impl->storage.data(), src.data_ptr(),
                static_cast<size_t>(numel()) * element_size());
  return Tensor(impl);
}

Tensor Tensor::clone(MemoryFormat fmt) const {
  DLTRAIN_OP_SCOPE("clone", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({*this}, {}, [&] { return clone(fmt); }); });
  checked();
  Tensor out = empty(shape(), resolve(fmt, *this), options());
  {
    NoGradGuard g;
    out.copy_(*this);
  }
  autograd::record(
      "clone", {*this}, {out},
      [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor Tensor::contiguous(MemoryFormat fmt) const {
  DLTRAIN_OP_SCOPE("contiguous", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({*this}, {}, [&] { return contiguous(fmt); }); });
  const MemoryFormat f = resolve(fmt, *this);
  if (!is_contiguous(f)) return clone(f);
  if (suggest_memory_format() == f) return *this;
  // Dense in both formats (one channel, a 1x1 image) but labelled the other one by its
  // strides: the same elements under fmt's strides (a size-1 dim's stride addresses nothing),
  // a view.
  Tensor out = detail::make_view(*this, shape(),
                                 f == MemoryFormat::ChannelsLast ? channels_last_strides(shape())
                                                                 : contiguous_strides(shape()),
                                 storage_offset());
  autograd::record(
      "contiguous", {*this}, {out},
      [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor Tensor::to(MemoryFormat fmt) const { return contiguous(fmt); }

Tensor Tensor::to(DType dt) const {
  DLTRAIN_OP_SCOPE("to", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({*this}, {}, [&] { return to(dt); }); });
  checked();
  if (dt == dtype()) return *this;
  Tensor out = empty(shape(), suggest_memory_format(), options().with_dtype(dt));
  {
    NoGradGuard g;
    out.copy_(*this);
  }
  if (is_floating(dt)) {
    const DType from = dtype();
    autograd::record(
        "to_dtype", {*this}, {out},
        [from](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].to(from)}; },
        autograd::HigherOrder::Supported);
  }
  return out;
}

Tensor Tensor::to(Device dev, bool non_blocking) const {
  DLTRAIN_OP_SCOPE("to", *this);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({*this}, {}, [&] { return to(dev, non_blocking); }); });
  checked();
  if (dev == device()) return *this;
  // Keep the layout (a channels-last batch stays channels-last) and move dense bytes.
  const MemoryFormat fmt = suggest_memory_format();
  Tensor src = contiguous(fmt);
  Tensor out = empty(shape(), fmt, TensorOptions(dtype()).with_device(dev));
  {
    NoGradGuard g;
    out.copy_(src, non_blocking);
  }
  const Device from = device();
  autograd::record(
      "to_device", {*this}, {out},
      [from](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].to(from)}; },
      autograd::HigherOrder::Supported);
  return out;
}

Tensor& copy_scaled_(Tensor& dst, const Tensor& src, double scale) {
  DLTRAIN_OP_SCOPE("copy_scaled_", dst, src);
  DLTRAIN_CHECK(dst.defined() && src.defined(), "copy_scaled_: ", dst.defined() ? "src" : "dst",
                " is undefined");
  DLTRAIN_CHECK(is_floating(dst.dtype()) && is_floating(src.dtype()),
                "copy_scaled_: dst and src must be floating (f32, f64, f16, bf16) but are ",
                dst.dtype(), " and ", src.dtype(), "; use dst.copy_(mul(src, scale)) instead");
  DLTRAIN_CHECK(dst.device() == src.device(), "copy_scaled_: dst is on ", dst.device(),
                " and src on ", src.device(), "; both must be on one device (move src with .to())");
  DLTRAIN_CHECK(!(dst.requires_grad() && dst.is_leaf() && autograd::grad_mode_enabled()),
                "copy_scaled_(): in-place change of a leaf that requires grad; wrap it in "
                "NoGradGuard");
  DLTRAIN_CHECK(broadcast_shapes(dst.shape(), src.shape(), "copy_scaled_") == dst.shape(),
                "copy_scaled_: source shape ", shape_str(src.shape()),
                " does not broadcast to destination shape ", shape_str(dst.shape()));
  if (dst.numel() == 0) return dst;
  dst.bump_version("copy_scaled_");
  // As copy_: a partly overlapping source is staged; the same elements scale in place.
  if (dltrain::detail::memory_overlap(dst, src) == dltrain::detail::Overlap::Partial)
    return copy_scaled_(dst, staged_source(src), scale);
  if (dst.device().is_cuda()) {
    backend::cuda::copy_scaled(dst, src, scale);
    return dst;
  }
  if (half_float_pair(dst, src)) {  // the bulk loops, with mul_'s arithmetic (below)
    cpu_convert_half(dst, src,
                     src.dtype() == DType::f32
                         ? static_cast<float>(scale)
                         : static_cast<float>(Half(static_cast<float>(scale))));
    return dst;
  }
  dispatch_floating(dst.dtype(), "copy_scaled_", [&]<class D>() {
    dispatch_floating(src.dtype(), "copy_scaled_", [&]<class S>() {
      using A = acc_t<S>;
      // mul_'s arithmetic (the scale rounded to S, the product rounded to S), then the cast.
      const A s = backend::cpu::cast<A>(backend::cpu::cast<S>(scale));
      backend::cpu::unary_map<D, S>(dst, src, [s](S v) {
        return backend::cpu::cast<D>(backend::cpu::cast<S>(backend::cpu::cast<A>(v) * s));
      });
    });
  });
  return dst;
}

}  // namespace dltrain
