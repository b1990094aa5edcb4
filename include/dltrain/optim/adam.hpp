// Adam and AdamW, as torch.optim.Adam / AdamW of PyTorch 1.13 (single-tensor path).
//
// Per parameter with a gradient g (negated when maximize), step t counted per parameter:
//   Adam:  g += weight_decay * p                      (L2 penalty)
//   AdamW: p *= 1 - lr * weight_decay                 (decoupled decay)
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g * g
//   v_hat = amsgrad ? (vmax = max(vmax, v)) : v
//   p -= lr / (1 - beta1^t) * m / (sqrt(v_hat) / sqrt(1 - beta2^t) + eps)
// all in one fused pass over the parameter's memory. State exists only for parameters that
// have been stepped.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "dltrain/optim/optimizer.hpp"

namespace dltrain::optim {

/// Hyper-parameters of Adam (PyTorch's names and defaults).
struct AdamOptions {
  /// Learning rate (>= 0).
  double lr = 1e-3;
  /// Decay rates of the first and second moment estimates, each in [0, 1).
  std::array<double, 2> betas{0.9, 0.999};
  /// Added to the denominator for numerical stability (>= 0).
  double eps = 1e-8;
  /// L2 penalty added to the gradient (>= 0).
  double weight_decay = 0.0;
  /// Use the AMSGrad variant.
  bool amsgrad = false;
  /// Maximise the objective instead of minimising it.
  bool maximize = false;
};

/// Hyper-parameters of AdamW: those of Adam, with weight_decay the decoupled rate
/// (default 1e-2, as PyTorch).
struct AdamWOptions {
  /// Learning rate (>= 0).
  double lr = 1e-3;
  /// Decay rates of the first and second moment estimates, each in [0, 1).
  std::array<double, 2> betas{0.9, 0.999};
  /// Added to the denominator for numerical stability (>= 0).
  double eps = 1e-8;
  /// Decoupled weight decay: p *= 1 - lr * weight_decay each step (>= 0).
  double weight_decay = 1e-2;
  /// Use the AMSGrad variant.
  bool amsgrad = false;
  /// Maximise the objective instead of minimising it.
  bool maximize = false;
};

/// Adam (and, with decoupled weight decay, AdamW). Per-parameter state: `step` (i64 0-d),
/// `exp_avg`, `exp_avg_sq`, and `max_exp_avg_sq` when amsgrad.
/// Example: `Adam opt(params, {.lr = 3e-4, .betas = {0.9, 0.98}});`
class Adam : public Optimizer {
 public:
  /// One group holding `params`.
  Adam(std::vector<Tensor> params, const AdamOptions& options);
  /// Several groups; their unset fields take `options`.
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options);

  const char* name() const override { return decoupled_ ? "AdamW" : "Adam"; }

 protected:
  /// For AdamW: the same update with decoupled weight decay.
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options, bool decoupled);

 private:
  struct State {
    int64_t step = 0;
    Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;
  };

  void validate_group(const ParamGroup& group, int64_t g) const override;
  void update(const ParamGroup& group, int64_t i, Tensor& param, const Tensor& grad) override;
  std::vector<std::string> state_names() const override;
  void save_state(int64_t i, const std::string& prefix, StateDict& out) const override;
  void load_state(const StateDict& state, const std::vector<ParamGroup>& groups) override;

  bool decoupled_;
  std::vector<State> state_;  // by flat index; step == 0 = no state yet
};

/// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter). Same state as Adam; its
/// state dict is tagged "AdamW" and does not load into Adam (nor the reverse).
class AdamW final : public Adam {
 public:
  /// One group holding `params`.
  AdamW(std::vector<Tensor> params, const AdamWOptions& options);
  /// Several groups; their unset fields take `options`.
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options);
};

}  // namespace dltrain::optim
