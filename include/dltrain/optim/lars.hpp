// LARS, layer-wise adaptive rate scaling (You, Gitman & Ginsburg 2017, "Large Batch Training
// of Convolutional Networks", Algorithm 1), the optimizer of MLPerf's large-batch ResNet-50.
//
// Per parameter w with a gradient g, lr the group's learning rate, m its momentum, wd its
// weight_decay, eta its trust_coefficient and eps its eps, in this order:
//   ratio    = eta * ||w|| / (||g|| + wd * ||w|| + eps)   when ||w|| > 0 and ||g|| > 0, else 1
//              (always 1 in a group with trust_ratio = false)
//   local_lr = lr * ratio
//   v        = m * v + local_lr * (g + wd * w)             (v starts at 0)
//   w       -= v
// ||.|| is the 2-norm of the whole tensor, accumulated in f64 over fixed chunks summed in
// order (the same result whatever the thread count). This is the paper's formulation, with
// weight decay inside the trust ratio and the learning rate folded into the velocity, and it
// is what MLPerf's TensorFlow reference runs: tf.contrib.opt.LARSOptimizer calls
// apply_momentum with lr 1 and the gradient (g + wd * w) * local_lr, i.e. the update above,
// 0-norm cases included (ratio 1); its skip list (no decay, no adaptation) is a group with
// trust_ratio = false and weight_decay 0 here. Implementations that accumulate the unscaled
// gradient instead (v = m * v + (g + wd * w); w -= local_lr * v, as PyTorch's SGD does with
// lr) agree with this one only while lr and the ratio stay constant. With momentum 0 there is
// no velocity: w -= local_lr * (g + wd * w). Nesterov momentum is not offered.
//
// The update is two passes over the parameter: the norms (one reduction), then the fused
// update. f16/bf16 parameters keep an f32 velocity and are rounded once per step. CUDA
// parameters use multi-tensor kernels: a norm pass writes per-chunk partial sums to device
// memory, and each block of the update pass sums its tensor's partials in a fixed order (no
// host synchronisation).
#pragma once

#include <limits>
#include <vector>

#include "dltrain/optim/optimizer.hpp"

namespace dltrain::optim {

/// Hyper-parameters of LARS (TensorFlow's LARSOptimizer defaults, except weight_decay). `lr`
/// has no default: leaving it unset raises dltrain::Error.
struct LARSOptions {
  /// Global learning rate (>= 0), required; schedulers drive it.
  double lr = std::numeric_limits<double>::quiet_NaN();
  /// Momentum factor, in [0, 1).
  double momentum = 0.9;
  /// Weight decay (>= 0), inside the trust ratio and added to the gradient.
  double weight_decay = 0.0;
  /// Trust coefficient eta (> 0).
  double trust_coefficient = 0.001;
  /// Added to the trust ratio's denominator (>= 0).
  double eps = 0.0;
  /// Adapt by the trust ratio (false: momentum SGD with the velocity formulation above).
  bool trust_ratio = true;
};

/// LARS. Per-parameter state: `momentum_buffer` (v; absent with momentum 0).
/// Example (MLPerf ResNet-50):
/// `LARS opt(param_groups_no_decay(*model, 5e-5, {.exclude_from_trust_ratio = true}),
///           {.lr = 10.0, .momentum = 0.9});`
class LARS final : public Optimizer {
 public:
  /// One group holding `params`.
  LARS(std::vector<Tensor> params, const LARSOptions& options);
  /// Several groups; their unset fields take `options`.
  LARS(std::vector<ParamGroup> groups, const LARSOptions& options);

  const char* name() const override { return "LARS"; }

 private:
  void validate_group(const ParamGroup& group, int64_t g) const override;
  void update(const ParamGroup& group, int64_t i, Tensor& param, const Tensor& grad) override;
  std::vector<std::string> state_names() const override;
  void save_state(int64_t i, const std::string& prefix, StateDict& out) const override;
  void load_state(const StateDict& state, const std::vector<ParamGroup>& groups) override;

  std::vector<Tensor> momentum_buffer_;  // by flat index; undefined = no buffer yet
};

}  // namespace dltrain::optim
