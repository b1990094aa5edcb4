// LAMB, layer-wise adaptive moments (You et al. 2019, "Large Batch Optimization for Deep
// Learning: Training BERT in 76 minutes", Algorithm 2).
//
// Per parameter w with a gradient g, step t counted per parameter, and the group's lr, betas
// (beta1, beta2), eps, weight_decay wd and max_trust_ratio:
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g * g   (m, v start at 0)
//   r = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + wd * w
//   ratio = min(||w|| / ||r||, max_trust_ratio)   when ||w|| > 0 and ||r|| > 0, else 1
//           (always 1 in a group with trust_ratio = false)
//   w -= lr * ratio * r
// ||.|| is the 2-norm of the whole tensor, accumulated in f64 over fixed chunks summed in
// order. The paper's scaling function phi is the identity here, clipped to
// [0, max_trust_ratio] when max_trust_ratio is finite (the paper allows phi(z) =
// min(max(z, gamma_l), gamma_u); gamma_l = 0 since the ratio is never negative). Without
// clipping, this is the update of NVIDIA apex's FusedLAMB (bias_correction, adam_w_mode and
// grad_averaging on) without its global gradient-norm clipping (call clip_grad_norm_ before
// step() for that).
//
// Two passes over the parameter: the first updates m and v and accumulates ||w||^2 and
// ||r||^2, the second recomputes r from m, v and w and updates w. f16/bf16 parameters keep f32
// moments and are rounded once per step. CUDA parameters use multi-tensor kernels (per-chunk
// partial norms in device memory, read by the update pass; no host synchronisation).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "dltrain/optim/optimizer.hpp"

namespace dltrain::optim {

/// Hyper-parameters of LAMB (the paper's and apex's defaults).
struct LAMBOptions {
  /// Learning rate (>= 0).
  double lr = 1e-3;
  /// Decay rates of the first and second moment estimates, each in [0, 1).
  std::array<double, 2> betas{0.9, 0.999};
  /// Added to the denominator (>= 0).
  double eps = 1e-6;
  /// Decoupled weight decay inside the update r (>= 0).
  double weight_decay = 0.0;
  /// Upper clip of the trust ratio (> 0); +infinity does not clip.
  double max_trust_ratio = std::numeric_limits<double>::infinity();
  /// Adapt by the trust ratio (false: ratio 1).
  bool trust_ratio = true;
};

/// LAMB. Per-parameter state: `step` (i64 0-d), `exp_avg`, `exp_avg_sq`.
/// Example: `LAMB opt(param_groups_no_decay(*model, 0.01, {.exclude_from_trust_ratio = true}),
///                    {.lr = 2e-3, .betas = {0.9, 0.999}});`
class LAMB final : public Optimizer {
 public:
  /// One group holding `params`.
  LAMB(std::vector<Tensor> params, const LAMBOptions& options);
  /// Several groups; their unset fields take `options`.
  LAMB(std::vector<ParamGroup> groups, const LAMBOptions& options);

  const char* name() const override { return "LAMB"; }

 private:
  struct State {
    int64_t step = 0;
    Tensor exp_avg, exp_avg_sq;
  };

  void validate_group(const ParamGroup& group, int64_t g) const override;
  void update(const ParamGroup& group, int64_t i, Tensor& param, const Tensor& grad) override;
  std::vector<std::string> state_names() const override;
  void save_state(int64_t i, const std::string& prefix, StateDict& out) const override;
  void load_state(const StateDict& state, const std::vector<ParamGroup>& groups) override;

  std::vector<State> state_;  // by flat index; step == 0 = no state yet
};

}  // namespace dltrain::optim
