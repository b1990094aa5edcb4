// Tensor metadata, factories, element access and printing.
#include "dltrain/core/tensor.hpp"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <numeric>
#include <sstream>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/generator.hpp"
#include "src/backend/cpu/cast.hpp"
#include "src/backend/cpu/loops.hpp"
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/elementwise.hpp"
#include "src/core/trace.hpp"

namespace dltrain {
namespace detail {
constinit thread_local std::vector<const TensorImpl*>* t_copy_probe = nullptr;
}  // namespace detail
}  // namespace dltrain

namespace dltrain {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    // A shape read from a file can be anything: its strides must fit 64 bits even when
    // another dimension is 0 (then it has no elements, yet the strides are computed).
    if (__builtin_mul_overflow(acc, std::max<int64_t>(s[i], 1), &acc))
      DLTRAIN_FAIL("shape ", shape_str(s),
                   " is too large: its element count does not fit in 64 bits (a corrupt file "
                   "header or a size computed wrongly)");
  }
  return st;
}

Shape channels_last_strides(const Shape& s) {
  DLTRAIN_CHECK(s.size() == 4, "channels-last layout needs a 4-d NCHW shape but got ", shape_str(s),
                "; use MemoryFormat::Contiguous for other ranks");
  const int64_t C = std::max<int64_t>(s[1], 1), H = std::max<int64_t>(s[2], 1),
                W = std::max<int64_t>(s[3], 1);
  return {H * W * C, 1, W * C, C};
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  DLTRAIN_CHECK(dim >= -n && dim < n, op, ": dimension ", dim,
                " is out of range for a tensor with ", ndim, " dimension(s); valid dims are ", -n,
                "..", n - 1);
  return dim < 0 ? dim + n : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape r(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    DLTRAIN_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ",
                  shape_str(b), " cannot be broadcast together (dimension ", i, ": ", da, " vs ",
                  db, "); make the sizes equal or 1, e.g. with unsqueeze() or expand()");
    r[i] = da == 1 ? db : da;
  }
  return r;
}

namespace backend::cpu {
Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  const size_t n = shape.size(), m = static_cast<size_t>(t.dim());
  Shape st(n, 0);
  for (size_t i = 0; i < m; ++i) {
    const size_t j = n - m + i;
    st[j] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  }
  return st;
}
}  // namespace backend::cpu

// --- Tensor members ------------------------------------------------------------

void Tensor::throw_undefined() {
  DLTRAIN_FAIL(
      "operation on an undefined Tensor (default-constructed, or a gradient that was never "
      "computed); check defined() first");
}

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "Tensor::size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "Tensor::stride")]; }

void* Tensor::data_ptr() const {
  const auto& i = checked();
  return static_cast<char*>(i->storage.data()) +
         i->offset * static_cast<int64_t>(dtype_size(i->dtype));
}

bool Tensor::is_contiguous(MemoryFormat fmt) const {
  const auto& i = checked();
  if (fmt == MemoryFormat::Preserve) return true;
  if (fmt == MemoryFormat::ChannelsLast && i->shape.size() != 4) return false;
  const Shape expect = fmt == MemoryFormat::ChannelsLast ? channels_last_strides(i->shape)
                                                         : contiguous_strides(i->shape);
  for (size_t d = 0; d < i->shape.size(); ++d)
    if (i->shape[d] != 1 && i->strides[d] != expect[d]) return false;
  return true;
}

MemoryFormat Tensor::suggest_memory_format() const {
  if (dim() != 4 || !is_contiguous(MemoryFormat::ChannelsLast)) return MemoryFormat::Contiguous;
  if (!is_contiguous()) return MemoryFormat::ChannelsLast;
  // Dense in both formats (one channel, a 1x1 image): the strides of the size-1 dims say which
  // one it was made in.
  const Shape& st = strides();
  return st == channels_last_strides(shape()) && st != contiguous_strides(shape())
             ? MemoryFormat::ChannelsLast
             : MemoryFormat::Contiguous;
}

Tensor& Tensor::requires_grad_(bool r) {
  const auto& i = checked();
  DLTRAIN_CHECK(
      i->grad_fn == nullptr || r,
      "requires_grad_(false) on a non-leaf tensor; use detach() to cut it from the graph");
  DLTRAIN_CHECK(i->grad_fn == nullptr, "requires_grad_() on a non-leaf tensor (produced by ",
                "an op); only leaves can be marked, and this one already requires grad");
  DLTRAIN_CHECK(!r || is_floating(i->dtype), "requires_grad_(): only floating-point tensors can ",
                "require gradients, this one is ", i->dtype, "; convert it with .to(DType::f32)");
  i->requires_grad = r;
  return *this;
}

uint64_t Tensor::version() const { return checked()->storage.version(); }

void Tensor::bump_version(const char* op) const { checked()->storage.bump_version(op); }

Tensor Tensor::grad() const {
  const auto& i = checked();
  return i->grad ? Tensor(i->grad) : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  const auto& i = checked();
  if (!g.defined()) {
    i->grad.reset();
    return;
  }
  DLTRAIN_CHECK(g.shape() == i->shape, "set_grad: gradient shape ", shape_str(g.shape()),
                " does not match the tensor's shape ", shape_str(i->shape));
  i->grad = g.impl();
}

Tensor Tensor::detach() const {
  const auto& i = checked();
  auto d = std::make_shared<TensorImpl>();
  d->storage = i->storage;
  d->shape = i->shape;
  d->strides = i->strides;
  d->offset = i->offset;
  d->dtype = i->dtype;
  return Tensor(d);
}

void Tensor::register_hook(GradHook hook) const {
  const auto& i = checked();
  DLTRAIN_CHECK(
      i->grad_fn == nullptr && i->requires_grad,
      "register_hook: hooks fire when a leaf's gradient is final, so the tensor must be a "
      "leaf that requires grad; call requires_grad_() on it first");
  i->hooks.push_back(std::move(hook));
}

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph, create_graph);
}

template <class T>
T Tensor::item() const {
  DLTRAIN_CHECK(numel() == 1, "item(): the tensor has ", numel(), " elements (shape ",
                shape_str(shape()), "); item() needs exactly one, reduce it first (e.g. sum())");
  Tensor c = device().is_cpu() ? *this : to(Device::cpu());
  return dispatch_all(c.dtype(), [&]<class S>() { return backend::cpu::cast<T>(*c.data<S>()); });
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = contiguous().to(Device::cpu()).to(dtype_v<T>).contiguous();
  const T* p = c.data<T>();
  return std::vector<T>(p, p + c.numel());
}

#define DLTRAIN_INSTANTIATE_ACCESS(T) \
  template T Tensor::item<T>() const; \
  template std::vector<T> Tensor::to_vector<T>() const;
DLTRAIN_INSTANTIATE_ACCESS(float)
DLTRAIN_INSTANTIATE_ACCESS(double)
DLTRAIN_INSTANTIATE_ACCESS(Half)
DLTRAIN_INSTANTIATE_ACCESS(BFloat16)
DLTRAIN_INSTANTIATE_ACCESS(int32_t)
DLTRAIN_INSTANTIATE_ACCESS(int64_t)
DLTRAIN_INSTANTIATE_ACCESS(uint8_t)
DLTRAIN_INSTANTIATE_ACCESS(bool)
#undef DLTRAIN_INSTANTIATE_ACCESS

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  const std::vector<double> v = to_vector<double>();
  const int64_t nd = dim();
  const bool integral = !is_floating(dtype());
  os << "tensor(";
  if (nd == 0) {
    os << v[0];
  } else {
    const Shape st = contiguous_strides(shape());
    const int64_t limit = 1000;
    std::function<void(int64_t, int64_t)> rec = [&](int64_t d, int64_t off) {
      os << '[';
      const int64_t n = shape()[d];
      const bool elide = numel() > limit && n > 6;
      for (int64_t i = 0; i < n; ++i) {
        if (elide && i == 3) {
          os << "...";
          i = n - 4;
          if (d == nd - 1)
            os << ", ";
          else
            os << ",\n" << std::string(static_cast<size_t>(d + 8), ' ');
          continue;
        }
        if (d == nd - 1) {
          if (integral)
            os << static_cast<int64_t>(v[off + i]);
          else
            os << std::setprecision(4) << v[off + i];
        } else {
          rec(d + 1, off + i * st[d]);
        }
        if (i + 1 < n) {
          if (d == nd - 1)
            os << ", ";
          else
            os << ",\n" << std::string(static_cast<size_t>(d + 8), ' ');
        }
      }
      os << ']';
    };
    rec(0, 0);
  }
  os << ", shape=" << shape_str(shape()) << ", dtype=" << dtype() << ", device=" << device();
  if (requires_grad()) os << ", requires_grad";
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

// --- factories -------------------------------------------------------------------

Tensor empty_strided(const Shape& shape, const Shape& strides, TensorOptions opts) {
  DLTRAIN_CHECK(shape.size() == strides.size(), "empty_strided: shape ", shape_str(shape),
                " and strides ", shape_str(strides), " have different lengths");
  int64_t extent = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    DLTRAIN_CHECK(shape[i] >= 0, "empty: negative size ", shape[i], " in shape ", shape_str(shape));
    if (shape[i] == 0) extent = 0;
  }
  if (extent != 0) {
    extent = 1;
    for (size_t i = 0; i < shape.size(); ++i) extent += (shape[i] - 1) * strides[i];
  }
  if (opts.device.is_cuda()) {
    DLTRAIN_CHECK(backend::cuda::compiled(), "cannot create a tensor on ", opts.device,
                  ": this dltrain was built without CUDA; rebuild with -DDLTRAIN_CUDA=ON");
    const int n = backend::cuda::device_count();
    DLTRAIN_CHECK(opts.device.index >= 0 && opts.device.index < n, "cannot create a tensor on ",
                  opts.device, ": ", n, " CUDA device(s) are visible",
                  n == 0 ? " (no GPU or no driver on this machine); use Device::cpu()" : "");
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage(static_cast<size_t>(extent) * dtype_size(opts.dtype), opts.device);
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = opts.dtype;
  Tensor t(impl);
  if (opts.requires_grad) t.requires_grad_();
  return t;
}

Tensor empty(const Shape& shape, TensorOptions opts) {
  return empty_strided(shape, contiguous_strides(shape), opts);
}

Tensor empty(const Shape& shape, MemoryFormat fmt, TensorOptions opts) {
  if (fmt == MemoryFormat::ChannelsLast)
    return empty_strided(shape, channels_last_strides(shape), opts);
  return empty(shape, opts);
}

Tensor empty_like(const Tensor& t) {
  return empty(t.shape(), t.suggest_memory_format(), t.options());
}

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  const bool rg = opts.requires_grad;
  opts.requires_grad = false;
  Tensor t = empty(shape, opts);
  t.fill_(value);
  if (rg) t.requires_grad_();
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
Tensor zeros_like(const Tensor& t) { return full_like(t, 0.0); }
Tensor ones_like(const Tensor& t) { return full_like(t, 1.0); }
// An op scope of its own so that io::export_onnx sees a tensor shaped like a graph value (a
// GNN's zeros_like(x) accumulator) as an op of that value, not as a constant of the traced size.
Tensor full_like(const Tensor& t, double value) {
  DLTRAIN_OP_SCOPE("full_like", t);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({t}, {{"value", value}}, [&] { return full_like(t, value); });
    });
  return empty_like(t).fill_(value);
}
Tensor scalar_tensor(double value, TensorOptions opts) { return full({}, value, opts); }

Tensor& Tensor::fill_(double value) {
  checked();
  DLTRAIN_CHECK(!(requires_grad() && is_leaf() && autograd::grad_mode_enabled()),
                "fill_(): in-place change of a leaf that requires grad; wrap it in NoGradGuard");
  impl_->storage.bump_version("fill_");
  if (device().is_cuda()) {
    // Dense (contiguous or channels-last) tensors fill [data_ptr, data_ptr + numel) in one
    // kernel; other layouts broadcast a 0-d device value through the strided copy kernel.
    // Neither waits for the device.
    if (is_contiguous() || (dim() == 4 && is_contiguous(MemoryFormat::ChannelsLast))) {
      backend::cuda::fill(data_ptr(), dtype(), numel(), value, device());
    } else {
      Tensor v = empty({}, options());
      backend::cuda::fill(v.data_ptr(), dtype(), 1, value, device());
      backend::cuda::copy(*this, v);
    }
    return *this;
  }
  dispatch_all(dtype(), [&]<class T>() {
    const T v = backend::cpu::cast<T>(value);
    // Writes only: the old contents may be uninitialised (reading them as bool is UB).
    backend::cpu::for_each_strided<1>(
        shape(), {static_cast<char*>(data_ptr())}, {strides()}, {sizeof(T)},
        [v](const std::array<char*, 1>& p, const std::array<int64_t, 1>& s, int64_t n) {
          T* o = reinterpret_cast<T*>(p[0]);
          const int64_t so = s[0] / static_cast<int64_t>(sizeof(T));
          for (int64_t i = 0; i < n; ++i) o[i * so] = v;
        });
  });
  return *this;
}

}  // namespace dltrain
