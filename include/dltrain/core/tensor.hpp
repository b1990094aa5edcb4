// Tensor: a cheap shared handle to (storage, shape, strides, offset, dtype)
// plus autograd metadata.
//
// Invariants: shape and strides have the same length; strides are in elements
// and may be 0 (broadcast views) but never negative; offset + the furthest
// reachable element lies inside the storage. Copying a Tensor copies the handle,
// not the data: views (view, reshape, permute, narrow, expand, ...) share
// storage. Channels-last is a stride order on the logical NCHW shape.
//
// Layering: this header only forward-declares autograd::Node. The methods that
// compute (views, clone, to, arithmetic operators) are thin wrappers over the
// free functions of dltrain/ops and are defined with them.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "dltrain/core/device.hpp"
#include "dltrain/core/dtype.hpp"
#include "dltrain/core/storage.hpp"

namespace dltrain {

namespace autograd {
class Node;
}

class Generator;

/// A list of sizes (or strides), outermost first.
using Shape = std::vector<int64_t>;

/// Number of elements of a shape (1 for a 0-d shape).
int64_t shape_numel(const Shape& s);
/// "[2, 3, 4]"
std::string shape_str(const Shape& s);
/// Row-major (contiguous) strides of a shape.
Shape contiguous_strides(const Shape& s);
/// Strides of a 4-d shape in channels-last order (C fastest, then W, H, N).
Shape channels_last_strides(const Shape& s);
/// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
/// Shape that `a` and `b` broadcast to; throws naming `op` when they do not.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

class Tensor;
struct TensorImpl;

namespace detail {
/// While non-null, every Tensor copy-constructed on this thread appends its TensorImpl here:
/// autograd::record copies an op's backward closure once with it set, to learn which tensors
/// the closure keeps (their versions are then checked before it runs). Null otherwise.
extern constinit thread_local std::vector<const TensorImpl*>* t_copy_probe;
}  // namespace detail

/// Autograd hook, called with the final gradient of a leaf tensor.
using GradHook = std::function<void(const Tensor&)>;

/// The state behind a Tensor handle. Users normally never touch it.
struct TensorImpl {
  Storage storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;
  DType dtype = DType::f32;
  // autograd
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
  uint32_t output_nr = 0;
  std::vector<GradHook> hooks;
  std::weak_ptr<autograd::Node> grad_accumulator;
};

/// Options for factories: dtype, device, requires_grad.
struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;
  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}    // NOLINT: zeros({2}, DType::f64) reads naturally
  TensorOptions(Device d) : device(d) {}  // NOLINT
  TensorOptions& with_dtype(DType d) {
    dtype = d;
    return *this;
  }
  TensorOptions& with_device(Device d) {
    device = d;
    return *this;
  }
  TensorOptions& with_requires_grad(bool r = true) {
    requires_grad = r;
    return *this;
  }
};

/// An n-dimensional array with autograd. See the file comment for invariants.
class Tensor {
 public:
  /// An undefined tensor (defined() == false), used for "no gradient".
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  Tensor(const Tensor& other) : impl_(other.impl_) {
    if (detail::t_copy_probe != nullptr) [[unlikely]]
      detail::t_copy_probe->push_back(impl_.get());
  }
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(const Tensor&) = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  ~Tensor() = default;

  bool defined() const { return impl_ != nullptr; }
  /// The state behind the handle; throws dltrain::Error on an undefined tensor.
  const std::shared_ptr<TensorImpl>& impl() const {
    if (!impl_) throw_undefined();
    return impl_;
  }

  // --- metadata -----------------------------------------------------------
  const Shape& shape() const { return impl()->shape; }
  const Shape& sizes() const { return impl()->shape; }
  /// Size of dimension d (negative counts from the end).
  int64_t size(int64_t d) const;
  const Shape& strides() const { return impl()->strides; }
  int64_t stride(int64_t d) const;
  int64_t dim() const { return static_cast<int64_t>(impl()->shape.size()); }
  int64_t numel() const { return shape_numel(impl()->shape); }
  int64_t storage_offset() const { return impl()->offset; }
  DType dtype() const { return impl()->dtype; }
  Device device() const { return impl()->storage.device(); }
  size_t element_size() const { return dtype_size(dtype()); }
  const Storage& storage() const { return impl()->storage; }
  TensorOptions options() const { return TensorOptions(dtype()).with_device(device()); }

  /// Pointer to the first element (storage data + offset).
  void* data_ptr() const;
  /// Typed pointer to the first element; throws if T does not match dtype().
  template <class T>
  T* data() const {
    DLTRAIN_CHECK(dtype_v<T> == dtype(), "Tensor::data<T>(): tensor has dtype ", dtype(),
                  " but T is ", dtype_v<T>,
                  "; use data<> with the matching type or convert with .to()");
    return static_cast<T*>(data_ptr());
  }

  /// True when the strides are those of `fmt` for this shape (size-1 dims ignored).
  bool is_contiguous(MemoryFormat fmt = MemoryFormat::Contiguous) const;
  /// ChannelsLast for a 4-d tensor laid out as NHWC (and not plain contiguous), else Contiguous.
  /// A tensor dense in both (one channel, or a 1x1 image) is ChannelsLast when its strides are
  /// exactly channels-last's, size-1 dims included, as contiguous(ChannelsLast) makes them
  /// (PyTorch's tie-break), so a 1-channel image or weight can still say it is channels-last.
  MemoryFormat suggest_memory_format() const;

  // --- autograd -----------------------------------------------------------
  bool requires_grad() const { return impl()->requires_grad; }
  /// Marks a leaf as needing a gradient. Throws on a non-leaf or an integer tensor.
  Tensor& requires_grad_(bool r = true);
  /// Accumulated gradient of a leaf (undefined until backward reached it).
  Tensor grad() const;
  /// How many times the memory under this tensor (shared with its views) was changed in
  /// place. Autograd refuses to run a backward function whose saved tensors changed since it
  /// saved them, naming both ops.
  uint64_t version() const;
  /// Records an in-place change by `op` (a string literal). The library's in-place ops,
  /// copy_ and fill_ call it; code that writes through data_ptr() into a tensor autograd may
  /// have saved must call it too.
  void bump_version(const char* op) const;
  void set_grad(const Tensor& g) const;
  /// The node that produced this tensor (null for leaves).
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl()->grad_fn; }
  bool is_leaf() const { return impl()->grad_fn == nullptr; }
  /// Runs backward from this tensor. With no `gradient` it must be a one-element tensor.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false,
                bool create_graph = false) const;
  /// A tensor sharing storage but cut from the graph.
  Tensor detach() const;
  /// Registers a hook called with the final gradient of this leaf during backward,
  /// after it has been accumulated into grad(). Throws on a non-leaf.
  void register_hook(GradHook hook) const;

  // --- views (share storage) ----------------------------------------------
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  /// 2-d transpose.
  Tensor t() const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  /// Elements start, start+step, ... < end along dim (Python slice semantics, step > 0).
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  /// Removes dimension dim by indexing it at `index`.
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;

  // --- copies and conversion ----------------------------------------------
  /// This tensor if already laid out as `fmt`, else a copy that is. A 4-d tensor dense in both
  /// formats (one channel, a 1x1 image) is re-labelled, a view with fmt's strides (no copy), so
  /// that suggest_memory_format() says fmt.
  Tensor contiguous(MemoryFormat fmt = MemoryFormat::Contiguous) const;
  Tensor clone(MemoryFormat fmt = MemoryFormat::Preserve) const;
  /// Copies src (broadcast to this shape, any dtype/device) into this tensor, in place.
  /// non_blocking: a copy between pinned host memory and a CUDA device that needs no
  /// conversion is enqueued on the device's current stream and returns at once (order the
  /// consumer with a cuda::Event, keep both tensors alive until it has run); every other copy
  /// returns when it is done.
  Tensor& copy_(const Tensor& src, bool non_blocking = false);
  Tensor to(DType dtype) const;
  /// Copy to `device`. non_blocking: a host-to-device copy from pinned memory (pin_memory())
  /// is enqueued on the device's current stream and returns at once, as in PyTorch; every
  /// other copy returns when it is done.
  Tensor to(Device device, bool non_blocking = false) const;
  /// A copy of this CPU tensor in page-locked memory (this tensor if already pinned).
  Tensor pin_memory() const;
  bool is_pinned() const { return impl()->storage.is_pinned(); }
  Tensor to(MemoryFormat fmt) const;
  /// Fills with a value, in place.
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }

  /// The value of a one-element tensor, converted to T.
  template <class T = double>
  T item() const;
  /// All elements in row-major order, converted to T.
  template <class T>
  std::vector<T> to_vector() const;
  /// Multi-line human-readable form: values, shape, dtype, device.
  std::string str() const;

 private:
  const std::shared_ptr<TensorImpl>& checked() const { return impl(); }
  [[noreturn]] static void throw_undefined();
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// --- factories ---------------------------------------------------------------
/// Uninitialised tensor.
Tensor empty(const Shape& shape, TensorOptions opts = {});
/// Uninitialised tensor with explicit strides (elements).
Tensor empty_strided(const Shape& shape, const Shape& strides, TensorOptions opts = {});
/// Uninitialised tensor laid out as `fmt` (ChannelsLast needs a 4-d shape).
Tensor empty(const Shape& shape, MemoryFormat fmt, TensorOptions opts = {});
/// Uninitialised tensor with the shape, dtype and device of `t` (memory format preserved).
Tensor empty_like(const Tensor& t);
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
/// 0-d tensor holding `value`.
Tensor scalar_tensor(double value, TensorOptions opts = {});
/// [start, start+step, ...) up to end (exclusive), in opts.dtype (f32 by default;
/// use arange(n, DType::i64) for indices).
Tensor arange(double start, double end, double step = 1.0, TensorOptions opts = {});
Tensor arange(double end, TensorOptions opts = {});
/// `steps` evenly spaced values from start to end inclusive.
Tensor linspace(double start, double end, int64_t steps, TensorOptions opts = {});
/// Uniform in [low, high).
Tensor rand(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor uniform(const Shape& shape, double low, double high, TensorOptions opts = {},
               Generator* gen = nullptr);
/// Normal with mean 0 and std 1 (Box-Muller on Philox words).
Tensor randn(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);
/// rand / randn with t's shape, dtype, device and memory format (floating t only), drawn on
/// t's device (no host copy; a GPU draw equals the CPU's from the same generator state).
Tensor rand_like(const Tensor& t, Generator* gen = nullptr);
Tensor randn_like(const Tensor& t, Generator* gen = nullptr);
/// 1 with probability p[i], else 0, in p's dtype, device and memory format (p in [0, 1],
/// floating; drawn on p's device as rand_like(p) < p). No gradient.
Tensor bernoulli(const Tensor& p, Generator* gen = nullptr);
/// 1 with probability p, else 0, with t's shape, dtype, device and memory format.
Tensor bernoulli(const Tensor& t, double p, Generator* gen = nullptr);
/// num_samples category indices (i64) per row of probs [K] or [R, K] (non-negative weights,
/// not necessarily normalised), drawn on probs' device: without replacement (PyTorch's
/// default) each category at most once per row. Output [num_samples] or [R, num_samples].
/// The weights are checked (finite, >= 0, enough non-zero categories) on the CPU only.
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false,
                   Generator* gen = nullptr);
Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts = {},
              Generator* gen = nullptr);
/// Integers uniform in [low, high), dtype i64 unless opts says otherwise.
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts = DType::i64,
               Generator* gen = nullptr);
/// A random permutation of 0..n-1 (i64).
Tensor randperm(int64_t n, Generator* gen = nullptr);
/// Copies `values` into a new tensor of `shape` (default 1-d) with T's dtype, then converts to
/// opts.dtype when opts is given.
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape = {},
                   std::optional<TensorOptions> opts = std::nullopt);
/// Convenience: from_vector for a list of doubles, converted to opts.dtype.
Tensor tensor(std::initializer_list<double> values, TensorOptions opts = {});

}  // namespace dltrain
