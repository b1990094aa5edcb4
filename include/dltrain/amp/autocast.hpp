// Automatic mixed precision: the autocast region and its op policy.
//
// Inside an `amp::autocast` region for a device type, the ops listed in `policy_table()` cast
// their floating inputs on that device type before running: matrix products and convolutions
// to the region's lower-precision dtype (f16 or bf16), numerically sensitive ops (losses,
// softmax, exp/log/pow, layer norm, sum) to f32, and joins to the widest floating dtype among
// their inputs. Every other op runs in the dtypes it is given, as outside a region; binary
// elementwise ops and where() already promote mixed dtypes to the wider one. batch_norm needs no
// entry: it accepts an f16/bf16 input with f32 weight, bias and running statistics, computes
// its statistics in f32 or wider and returns the input's dtype.
//
// The casts are ordinary differentiable `Tensor::to(dtype)` conversions, so backward runs in
// the dtypes forward chose and an f32 leaf (a master weight) receives an f32 gradient. The f32
// -> lower-precision cast of a leaf that requires grad (a parameter) is cached per thread for
// the lifetime of the outermost region, so a weight used by several ops (or several forward
// passes of one step) is cast once. The cache is emptied when the outermost region on the
// thread closes and whenever backward() starts (so an optimizer step between two forward passes
// in one region never leaves a stale copy); a cast made with grad mode off is never handed to
// code running with grad mode on.
//
// Invariants: the state is thread-local; regions nest (an inner region may change the dtype
// or disable autocast; closing it restores the outer state exactly); an op's internals and
// every backward pass run with autocast suspended, so a listed op called inside another
// listed op's implementation is not cast a second time. Autocast never changes f64 tensors or
// non-floating ones.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "dltrain/core/device.hpp"
#include "dltrain/core/dtype.hpp"

namespace dltrain::amp {

/// How an op casts its floating inputs inside an autocast region.
enum class CastPolicy : uint8_t {
  /// To the region's dtype (f16 or bf16): tensor-core / AMX friendly products.
  LowerPrecision,
  /// f16/bf16 inputs to f32: ops whose range or accuracy needs f32.
  Float32,
  /// Every floating input to the widest floating dtype among them (and the region's dtype).
  Promote,
};

/// The ops autocast acts on (each a public function of dltrain/ops).
enum class Op : uint8_t {
  conv2d,
  conv_transpose2d,
  linear,
  mm,
  bmm,
  matmul,
  exp,
  log,
  pow,
  rsqrt,
  softmax,
  log_softmax,
  layer_norm,
  sum,
  cross_entropy,
  nll_loss,
  mse_loss,
  binary_cross_entropy_with_logits,
  cat,
  stack,
  scatter_add,
  log1p,
  expm1,
  softplus,
  l1_loss,
  smooth_l1_loss,
  huber_loss,
  kl_div,
  binary_cross_entropy,
  gaussian_nll_loss,
  group_norm,
};

/// One row of the policy table.
struct OpPolicy {
  Op op;
  /// The op's function name ("conv2d").
  const char* name;
  CastPolicy policy;
};

/// The whole policy, one row per Op in declaration order (see src/amp/autocast.cpp for the
/// PyTorch lists it follows).
std::span<const OpPolicy> policy_table();
/// The row of `op`.
const OpPolicy& policy(Op op);

/// Default lower-precision dtype of a device type: bf16 on the CPU, f16 on CUDA (PyTorch's).
constexpr DType default_autocast_dtype(DeviceType t) {
  return t == DeviceType::CPU ? DType::bf16 : DType::f16;
}

/// RAII autocast region for ops on `device_type` (torch.autocast in C++):
/// `{ amp::autocast ac(DeviceType::CUDA); loss = criterion(model.forward(x), y); }`.
/// `dtype` is f16 or bf16 (default: default_autocast_dtype); `enabled = false` opens a region
/// with autocast off (to exclude a piece of an enclosing region); `cache_enabled = false`
/// casts weights at every use. Throws dltrain::Error for another dtype. Not copyable or
/// movable; close regions in reverse order of opening (automatic with scopes).
class autocast {
 public:
  explicit autocast(DeviceType device_type, std::optional<DType> dtype = std::nullopt,
                    bool enabled = true, bool cache_enabled = true);
  ~autocast();
  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;

 private:
  DeviceType device_type_;
  bool prev_enabled_;
  DType prev_dtype_;
  bool prev_cache_enabled_;
};

/// True inside an enabled autocast region for `device_type` on this thread.
bool is_autocast_enabled(DeviceType device_type);
/// The dtype the innermost region for `device_type` casts to (the default outside one).
DType get_autocast_dtype(DeviceType device_type);
/// Whether the innermost region caches weight casts (true outside any region).
bool is_autocast_cache_enabled();
/// Drops every cached cast of this thread (done automatically; see the file comment).
void clear_autocast_cache();
/// Number of cached casts held by this thread (for tests and diagnostics).
int64_t autocast_cache_size();

}  // namespace dltrain::amp
