// SGD with momentum, dampening, Nesterov, weight decay and maximize, as torch.optim.SGD.
//
// Per parameter with a gradient g (negated when maximize), in one fused pass:
//   g += weight_decay * p
//   buf = g on the first step with momentum, else buf = momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf          (when momentum != 0)
//   p -= lr * g
// The momentum buffer exists only for parameters that were stepped with momentum != 0.
#pragma once

#include <limits>
#include <vector>

#include "dltrain/optim/optimizer.hpp"

namespace dltrain::optim {

/// Hyper-parameters of SGD (PyTorch's names and defaults). `lr` has no default, as in
/// PyTorch: leaving it unset raises dltrain::Error.
struct SGDOptions {
  /// Learning rate (>= 0), required.
  double lr = std::numeric_limits<double>::quiet_NaN();
  /// Momentum factor (>= 0).
  double momentum = 0.0;
  /// Dampening for momentum.
  double dampening = 0.0;
  /// L2 penalty (>= 0), added to the gradient.
  double weight_decay = 0.0;
  /// Nesterov momentum (needs momentum > 0 and dampening == 0).
  bool nesterov = false;
  /// Maximise the objective instead of minimising it.
  bool maximize = false;
};

/// Stochastic gradient descent. Per-parameter state: `momentum_buffer`.
/// Example: `SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});`
class SGD final : public Optimizer {
 public:
  /// One group holding `params`.
  SGD(std::vector<Tensor> params, const SGDOptions& options);
  /// Several groups; their unset fields take `options`.
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options);

  const char* name() const override { return "SGD"; }

 private:
  void validate_group(const ParamGroup& group, int64_t g) const override;
  void update(const ParamGroup& group, int64_t i, Tensor& param, const Tensor& grad) override;
  std::vector<std::string> state_names() const override;
  void save_state(int64_t i, const std::string& prefix, StateDict& out) const override;
  void load_state(const StateDict& state, const std::vector<ParamGroup>& groups) override;

  std::vector<Tensor> momentum_buffer_;  // by flat index; undefined = no buffer yet
};

}  // namespace dltrain::optim
