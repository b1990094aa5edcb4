// The autocast policy table, the thread-local region state, the weight-cast cache and the
// entry helper the ops call (src/amp/dispatch.hpp).
//
// The table follows PyTorch's autocast lists (aten/src/ATen/autocast_mode.cpp), restricted to
// the ops dltrain has. PyTorch keeps two lists: the CUDA one (lower precision: conv, linear,
// mm/bmm/matmul, ...; fp32: exp, log, pow, rsqrt, layer_norm, the losses, ...;
// fp32_set_opt_dtype: softmax, log_softmax, sum, ...; promote: scatter_add, ...) and a
// narrower CPU one (same lower-precision ops, but only the losses in fp32, and cat/stack as
// promote). dltrain applies one table on both device types, the CUDA list plus cat/stack:
// our CPU kernels compute softmax, exp, layer norm and sums in float anyway, so the f32 output
// costs little, and one table gives the same numerics on the CPU and the GPU.
// fp32_set_opt_dtype is plain Float32 here (no dltrain op takes an explicit output dtype).
// Promote widens with promote_types (f16 with bf16 gives f32) where PyTorch raises an error.
#include <array>
#include <memory>
#include <unordered_map>

#include "dltrain/autograd/node.hpp"
#include "src/amp/dispatch.hpp"
#include "src/amp/replay.hpp"

namespace dltrain::amp {

namespace {

using P = CastPolicy;

constexpr std::array<OpPolicy, 31> kTable{{
    {Op::conv2d, "conv2d", P::LowerPrecision},
    {Op::conv_transpose2d, "conv_transpose2d", P::LowerPrecision},
    {Op::linear, "linear", P::LowerPrecision},
    {Op::mm, "mm", P::LowerPrecision},
    {Op::bmm, "bmm", P::LowerPrecision},
    {Op::matmul, "matmul", P::LowerPrecision},
    {Op::exp, "exp", P::Float32},
    {Op::log, "log", P::Float32},
    {Op::pow, "pow", P::Float32},
    {Op::rsqrt, "rsqrt", P::Float32},
    {Op::softmax, "softmax", P::Float32},
    {Op::log_softmax, "log_softmax", P::Float32},
    {Op::layer_norm, "layer_norm", P::Float32},
    {Op::sum, "sum", P::Float32},
    {Op::cross_entropy, "cross_entropy", P::Float32},
    {Op::nll_loss, "nll_loss", P::Float32},
    {Op::mse_loss, "mse_loss", P::Float32},
    {Op::binary_cross_entropy_with_logits, "binary_cross_entropy_with_logits", P::Float32},
    {Op::cat, "cat", P::Promote},
    {Op::stack, "stack", P::Promote},
    {Op::scatter_add, "scatter_add", P::Promote},
    {Op::log1p, "log1p", P::Float32},
    {Op::expm1, "expm1", P::Float32},
    {Op::softplus, "softplus", P::Float32},
    {Op::l1_loss, "l1_loss", P::Float32},
    {Op::smooth_l1_loss, "smooth_l1_loss", P::Float32},
    {Op::huber_loss, "huber_loss", P::Float32},
    {Op::kl_div, "kl_div", P::Float32},
    {Op::binary_cross_entropy, "binary_cross_entropy", P::Float32},
    {Op::gaussian_nll_loss, "gaussian_nll_loss", P::Float32},
    {Op::group_norm, "group_norm", P::Float32},
}};

constexpr bool table_in_order() {
  for (size_t i = 0; i < kTable.size(); ++i)
    if (static_cast<size_t>(kTable[i].op) != i) return false;
  return static_cast<size_t>(Op::group_norm) + 1 == kTable.size();
}
static_assert(table_in_order(), "kTable must list every amp::Op once, in declaration order");

struct DeviceState {
  bool enabled = false;
  DType dtype;
};

// Cached f32 -> lower-precision casts of leaves, keyed by the source's TensorImpl. The entry
// keeps a weak reference to the source so that a freed TensorImpl whose address is reused
// never hits, and the data pointer, so that a source whose storage was swapped (Module::to
// repoints a parameter's impl) is cast again.
struct CacheKey {
  const TensorImpl* impl;
  DType to;
  bool grad_mode;
  bool operator==(const CacheKey&) const = default;
};
struct CacheKeyHash {
  size_t operator()(const CacheKey& k) const {
    return std::hash<const void*>()(k.impl) ^ (static_cast<size_t>(k.to) << 1) ^
           static_cast<size_t>(k.grad_mode);
  }
};
struct CacheEntry {
  std::weak_ptr<TensorImpl> source;
  const void* data = nullptr;
  Tensor cast;
};

struct State {
  std::array<DeviceState, 2> device{{{false, default_autocast_dtype(DeviceType::CPU)},
                                     {false, default_autocast_dtype(DeviceType::CUDA)}}};
  bool cache_enabled = true;
  int nesting = 0;
  int suspended = 0;
  std::unordered_map<CacheKey, CacheEntry, CacheKeyHash> cache;
};

thread_local State t_state;

DeviceState& device_state(DeviceType t) { return t_state.device[static_cast<size_t>(t)]; }

// Floating, not f64, on the region's device type: the tensors autocast may cast.
bool eligible(const Tensor& t, DeviceType dev) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != DType::f64 && t.device().type == dev;
}

Tensor cached_cast(DType to, const Tensor& t, DeviceType dev) {
  if (!eligible(t, dev) || t.dtype() == to) return t;
  const bool can_cache = t_state.cache_enabled && to == device_state(dev).dtype &&
                         t.dtype() == DType::f32 && t.requires_grad() && t.is_leaf();
  if (!can_cache) return t.to(to);
  const std::shared_ptr<TensorImpl>& impl = t.impl();
  const CacheKey key{impl.get(), to, autograd::grad_mode_enabled()};
  auto it = t_state.cache.find(key);
  if (it != t_state.cache.end() && it->second.source.lock() == impl &&
      it->second.data == t.data_ptr())
    return it->second.cast;
  Tensor cast = t.to(to);
  t_state.cache[key] = CacheEntry{impl, t.data_ptr(), cast};
  return cast;
}

std::optional<detail::Redispatch> cast_args(Op op, std::vector<Tensor> args) {
  DeviceType dev = DeviceType::CPU;
  bool found = false;
  for (const Tensor& t : args) {
    if (t.defined()) {
      dev = t.device().type;
      found = true;
      break;
    }
  }
  if (!found || !device_state(dev).enabled) return std::nullopt;
  const DType lower = device_state(dev).dtype;
  DType to = lower;
  switch (policy(op).policy) {
    case CastPolicy::LowerPrecision:
      break;
    case CastPolicy::Float32:
      to = DType::f32;
      break;
    case CastPolicy::Promote:
      for (const Tensor& t : args)
        if (eligible(t, dev)) to = promote_types(to, t.dtype());
      break;
  }
  for (Tensor& t : args) t = cached_cast(to, t, dev);
  return std::optional<detail::Redispatch>(std::in_place, std::move(args));
}

bool applies() {
  return t_state.suspended == 0 && (t_state.device[0].enabled || t_state.device[1].enabled);
}

}  // namespace

std::span<const OpPolicy> policy_table() { return kTable; }

const OpPolicy& policy(Op op) { return kTable[static_cast<size_t>(op)]; }

autocast::autocast(DeviceType device_type, std::optional<DType> dtype, bool enabled,
                   bool cache_enabled)
    : device_type_(device_type),
      prev_enabled_(device_state(device_type).enabled),
      prev_dtype_(device_state(device_type).dtype),
      prev_cache_enabled_(t_state.cache_enabled) {
  const DType dt = dtype.value_or(default_autocast_dtype(device_type));
  DLTRAIN_CHECK(dt == DType::f16 || dt == DType::bf16, "amp::autocast: dtype must be ",
                "float16 or bfloat16 but got ", dt, "; pass DType::f16 or DType::bf16 (or ",
                "leave it unset for the device's default)");
  DeviceState& s = device_state(device_type);
  s.enabled = enabled;
  s.dtype = dt;
  t_state.cache_enabled = cache_enabled;
  ++t_state.nesting;
}

autocast::~autocast() {
  DeviceState& s = device_state(device_type_);
  s.enabled = prev_enabled_;
  s.dtype = prev_dtype_;
  t_state.cache_enabled = prev_cache_enabled_;
  if (--t_state.nesting == 0) t_state.cache.clear();
}

bool is_autocast_enabled(DeviceType device_type) { return device_state(device_type).enabled; }

DType get_autocast_dtype(DeviceType device_type) { return device_state(device_type).dtype; }

bool is_autocast_cache_enabled() { return t_state.cache_enabled; }

void clear_autocast_cache() { t_state.cache.clear(); }

int64_t autocast_cache_size() { return static_cast<int64_t>(t_state.cache.size()); }

namespace detail {

SuspendGuard::SuspendGuard() { ++t_state.suspended; }
SuspendGuard::~SuspendGuard() { --t_state.suspended; }

Redispatch::Redispatch(std::vector<Tensor> args) : args_(std::move(args)) { ++t_state.suspended; }

Redispatch::Redispatch(Redispatch&& other) noexcept
    : args_(std::move(other.args_)), owns_suspension_(other.owns_suspension_) {
  other.owns_suspension_ = false;
}

Redispatch::~Redispatch() {
  if (owns_suspension_) --t_state.suspended;
}

std::optional<Redispatch> autocast_args(Op op, std::initializer_list<const Tensor*> args) {
  if (!applies()) return std::nullopt;
  std::vector<Tensor> v;
  v.reserve(args.size());
  for (const Tensor* t : args) v.push_back(*t);
  return cast_args(op, std::move(v));
}

std::optional<Redispatch> autocast_args(Op op, const std::vector<Tensor>& args) {
  if (!applies()) return std::nullopt;
  return cast_args(op, args);
}

BackwardScope::BackwardScope() { t_state.cache.clear(); }

AutocastSnapshot autocast_snapshot() {
  AutocastSnapshot s;
  for (size_t d = 0; d < 2; ++d) {
    s.enabled[d] = t_state.device[d].enabled;
    s.dtype[d] = t_state.device[d].dtype;
  }
  s.cache_enabled = t_state.cache_enabled;
  s.suspended = t_state.suspended > 0;
  return s;
}

AutocastReplay::AutocastReplay(const AutocastSnapshot& s)
    : saved_(autocast_snapshot()), saved_suspended_(t_state.suspended) {
  for (size_t d = 0; d < 2; ++d) {
    t_state.device[d].enabled = s.enabled[d];
    t_state.device[d].dtype = s.dtype[d];
  }
  t_state.cache_enabled = s.cache_enabled;
  t_state.suspended = s.suspended ? 1 : 0;
  ++t_state.nesting;
}

AutocastReplay::~AutocastReplay() {
  for (size_t d = 0; d < 2; ++d) {
    t_state.device[d].enabled = saved_.enabled[d];
    t_state.device[d].dtype = saved_.dtype[d];
  }
  t_state.cache_enabled = saved_.cache_enabled;
  t_state.suspended = saved_suspended_;
  --t_state.nesting;
  t_state.cache.clear();
}

}  // namespace detail

}  // namespace dltrain::amp
