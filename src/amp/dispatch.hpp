// How ops enter autocast (internal header).
//
// A listed op starts with
//   if (auto ac = amp::detail::autocast_args(amp::Op::conv2d, {&x, &weight, &bias}))
//     return conv2d((*ac)[0], (*ac)[1], (*ac)[2], stride, padding, dilation, groups);
// autocast_args returns nothing (one thread-local test) unless an enabled region covers the
// arguments' device type and autocast is not suspended; otherwise it returns the arguments
// cast as the op's policy says, together with a guard that keeps autocast suspended on this
// thread until the op returns, so the op's own internals (linear calling matmul, mean calling
// sum) run in the dtypes they were given, as PyTorch's redispatch below the Autocast key does.
#pragma once

#include <initializer_list>
#include <optional>
#include <vector>

#include "dltrain/amp/autocast.hpp"
#include "dltrain/core/tensor.hpp"

namespace dltrain::amp::detail {

/// Suspends autocast on this thread for its lifetime (nests).
class SuspendGuard {
 public:
  SuspendGuard();
  ~SuspendGuard();
  SuspendGuard(const SuspendGuard&) = delete;
  SuspendGuard& operator=(const SuspendGuard&) = delete;
};

/// An op's arguments as autocast wants them, with autocast suspended while it lives.
class Redispatch {
 public:
  explicit Redispatch(std::vector<Tensor> args);
  Redispatch(Redispatch&& other) noexcept;
  Redispatch& operator=(Redispatch&&) = delete;
  ~Redispatch();
  const Tensor& operator[](size_t i) const { return args_[i]; }
  const std::vector<Tensor>& args() const { return args_; }

 private:
  std::vector<Tensor> args_;
  bool owns_suspension_ = true;
};

/// The arguments of `op` cast by its policy (undefined and non-floating tensors pass through),
/// or nothing when autocast does not apply to this call.
std::optional<Redispatch> autocast_args(Op op, std::initializer_list<const Tensor*> args);
/// The same for an op taking a list of tensors (cat, stack).
std::optional<Redispatch> autocast_args(Op op, const std::vector<Tensor>& args);

/// Called by the autograd engine for the duration of a backward pass: clears this thread's
/// cast cache and suspends autocast, so backward formulas run in the dtypes forward chose.
class BackwardScope {
 public:
  BackwardScope();

 private:
  SuspendGuard suspend_;
};

}  // namespace dltrain::amp::detail
