// ParamGroup and the Optimizer base class that SGD, Adam, AdamW, LARS and LAMB derive from.
//
// An optimizer owns a list of parameter groups; each group holds parameters (tensor handles
// shared with the model) and the hyper-parameters used to update them. A group's fields are
// std::optional so a user-built group overrides only what it sets: when the optimizer adopts
// a group (construction or add_param_group) every field that optimizer uses is filled from its
// options and validated, and a field it does not use must stay unset. So after adoption,
// `group.lr` (and the optimizer's other fields) always hold a value, which LR schedulers read
// and write between steps. Per-parameter state (momentum buffers, Adam moments) is indexed by
// the flat parameter index: the position of the parameter when the groups are concatenated,
// as in PyTorch. Adding a group appends, so earlier indices never change. A parameter appears
// in at most one group.
//
// The CPU update is one fused pass per parameter over its memory, so parameter, gradient and
// state must be dense (no holes, no overlap) and share one layout: contiguous and
// channels-last parameters both qualify. A gradient laid out differently from its parameter
// is copied into the parameter's layout first (correct, slower); a non-dense parameter (a
// strided view) raises dltrain::Error. f16 and bf16 parameters (pure low-precision training;
// under mixed precision keep f32 master weights instead) have f32 state, and their update is
// computed in f32 and rounded to the parameter's dtype once. CUDA parameters are updated by
// multi-tensor kernels
// (one launch per parameter group, device and dtype; the tensor table travels in the kernel
// parameters) with the CPU update's arithmetic. Every parameter is validated before any is
// updated, so a rejected step changes nothing.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dltrain/core/state_dict.hpp"
#include "dltrain/core/tensor.hpp"

namespace dltrain::distributed {
class ZeroRedundancyOptimizer;
}

namespace dltrain::optim {

/// Parameters updated with one set of hyper-parameters. Unset fields take the optimizer's
/// defaults when the group is adopted; fields the optimizer does not use must stay unset
/// (SGD: lr, weight_decay, momentum, dampening, nesterov, maximize; Adam/AdamW: lr,
/// weight_decay, betas, eps, amsgrad, maximize; LARS: lr, weight_decay, momentum, eps,
/// trust_coefficient, trust_ratio; LAMB: lr, weight_decay, betas, eps, max_trust_ratio,
/// trust_ratio). Example:
/// `ParamGroup{.params = head, .lr = 0.1, .weight_decay = 0.0}`.
struct ParamGroup {
  /// The tensors to update (floating-point leaves; handles shared with the model).
  std::vector<Tensor> params{};
  /// Learning rate (>= 0). LR schedulers overwrite it between steps.
  std::optional<double> lr{};
  /// L2 penalty (SGD, Adam) or decoupled decay rate (AdamW), >= 0.
  std::optional<double> weight_decay{};
  /// SGD momentum factor (>= 0; 0 disables the buffer). OneCycleLR cycles it.
  std::optional<double> momentum{};
  /// SGD dampening of the gradient added to the momentum buffer.
  std::optional<double> dampening{};
  /// SGD Nesterov momentum (needs momentum > 0 and dampening == 0).
  std::optional<bool> nesterov{};
  /// Adam (beta1, beta2), each in [0, 1). OneCycleLR cycles beta1.
  std::optional<std::array<double, 2>> betas{};
  /// Adam term added to the denominator (>= 0).
  std::optional<double> eps{};
  /// Adam: use the running maximum of the second moment (AMSGrad).
  std::optional<bool> amsgrad{};
  /// Ascend instead of descend (the gradient is negated).
  std::optional<bool> maximize{};
  /// LARS trust coefficient eta (> 0), the scale of the layer-wise learning rate.
  std::optional<double> trust_coefficient{};
  /// LAMB: upper clip of the trust ratio (> 0; +infinity, the default, does not clip).
  std::optional<double> max_trust_ratio{};
  /// LARS / LAMB: scale the group's updates by each parameter's trust ratio. false excludes
  /// the group from the adaptation (ratio 1: plain momentum SGD for LARS, an AdamW-like
  /// update for LAMB), as MLPerf does for BatchNorm parameters and biases; the
  /// group's weight_decay still applies, so such a group usually sets it to 0 too
  /// (param_groups_no_decay does both).
  std::optional<bool> trust_ratio{};
  /// The lr the group started from; set by the first LR scheduler attached (as PyTorch's
  /// 'initial_lr'), unset otherwise.
  std::optional<double> initial_lr{};
};

/// Base of every optimizer: groups, zero_grad, the step loop and state dicts.
///
/// State-dict keys (PyTorch's, flattened): `type` (u8 bytes of name()),
/// `param_groups.<g>.params` (i64 flat indices), `param_groups.<g>.<field>` for each set
/// field of ParamGroup (bools as i64 0/1, betas as a 2-element f64 tensor), and
/// `state.<i>.<name>` for parameter i's state (see each optimizer).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// The groups, mutable: schedulers and users may change hyper-parameters between steps
  /// (keep fields the optimizer uses set; changing `params` here is not supported, use
  /// add_param_group).
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  /// Every parameter, in flat-index order.
  std::vector<Tensor> parameters() const;
  /// Number of parameters over all groups.
  int64_t num_params() const;

  /// Updates every parameter that has a gradient (parameters without one are skipped and
  /// their state does not advance). Runs without recording autograd. Throws dltrain::Error
  /// (before updating anything) for a gradient whose dtype, device or shape differs from its
  /// parameter, or a non-dense parameter. Virtual so that a wrapper
  /// (distributed::ZeroRedundancyOptimizer) adds its communication when stepped through this
  /// class, as GradScaler does.
  virtual void step();
  /// Clears gradients: drops them (set_to_none, the default, as PyTorch 2) or fills with 0.
  void zero_grad(bool set_to_none = true);
  /// Adopts a new group: fills unset fields from the defaults, validates, appends its
  /// parameters after the existing ones. Throws dltrain::Error for an empty or undefined
  /// parameter, a non-floating or non-leaf tensor, a parameter already in a group, a field
  /// this optimizer does not use, or an invalid hyper-parameter.
  virtual void add_param_group(ParamGroup group);

  /// A snapshot (tensors are copies) of hyper-parameters and per-parameter state.
  StateDict state_dict() const;
  /// Restores what state_dict() saved, so the next step continues exactly. Hyper-parameters
  /// (lr included) come from the state; state tensors are converted to each parameter's
  /// dtype, device and layout. Throws dltrain::Error naming the problem (another optimizer
  /// type, a different number of groups or parameters, a missing or unexpected key, a
  /// shape mismatch) and leaves the optimizer unchanged then.
  void load_state_dict(const StateDict& state);

  /// "SGD", "Adam", "AdamW", "LARS", "LAMB": used in messages and as the state-dict type tag.
  virtual const char* name() const = 0;

  /// GradScaler's hook: combines this process's inf/NaN flags (0-d f32 tensors, one per
  /// gradient device; possibly none) into those the step decision reads. The identity here; an
  /// optimizer whose ranks each hold part of the gradients (ZeroRedundancyOptimizer under
  /// ZeRO-2) reduces them over its group, so that every rank skips or takes the step alike.
  /// Collective for such optimizers: called once per unscale_ on every rank.
  virtual std::vector<Tensor> combine_found_inf(std::vector<Tensor> found) const { return found; }

 protected:
  // ZeroRedundancyOptimizer drives the optimizer it wraps through the hooks below (saving and
  // loading one parameter's state, validating groups) without widening the public interface.
  friend class distributed::ZeroRedundancyOptimizer;

  /// `defaults` holds every field the optimizer uses (params empty).
  explicit Optimizer(ParamGroup defaults) : defaults_(std::move(defaults)) {}
  /// Adopts `groups` (at least one parameter overall); derived constructors call it.
  void init(std::vector<ParamGroup> groups);

  /// Throws dltrain::Error for an invalid or foreign hyper-parameter of adopted group `g`.
  virtual void validate_group(const ParamGroup& group, int64_t g) const = 0;
  /// Updates parameter `i` of `group` in place. `param` and `grad` are dense, of the same
  /// floating dtype and laid out alike; numel() > 0.
  virtual void update(const ParamGroup& group, int64_t i, Tensor& param, const Tensor& grad) = 0;
  /// Names of the per-parameter state entries (without the `state.<i>.` prefix).
  virtual std::vector<std::string> state_names() const = 0;
  /// Appends parameter i's state under `prefix` (`state.<i>.`); nothing if it has none.
  virtual void save_state(int64_t i, const std::string& prefix, StateDict& out) const = 0;
  /// Replaces all per-parameter state by `state` (the saved dict, groups already validated;
  /// `groups` are the groups being loaded). Must throw before changing anything.
  virtual void load_state(const StateDict& state, const std::vector<ParamGroup>& groups) = 0;

  /// Copy of saved tensor `key` converted to `param`'s state dtype (f32 for f16/bf16
  /// parameters, else the parameter's), device and layout; throws when its shape differs from
  /// the parameter's.
  static Tensor load_buffer(const StateDict& state, const std::string& key, const Tensor& param);
  /// Uninitialised tensor with `param`'s shape, strides, dtype and device.
  static Tensor empty_state_like(const Tensor& param);

  ParamGroup defaults_;
  std::vector<ParamGroup> groups_;
};

}  // namespace dltrain::optim
