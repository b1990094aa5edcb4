// Dynamic loss scaling for f16 mixed precision, as torch.amp.GradScaler.
//
// f16 gradients underflow below 6e-8; scaling the loss by S multiplies every gradient by S,
// so small gradients survive the backward pass. Before the optimizer step the gradients are
// divided by S again (unscale_), in one fused pass per (device, dtype) group of gradients that
// also records whether any value is inf or NaN. The step is skipped when one is, and update()
// adapts S: multiplied by backoff_factor after a step with non-finite gradients, by
// growth_factor after growth_interval consecutive finite steps (PyTorch's
// _amp_update_scale_: a grown scale that is not finite is not taken).
//
// A training step: `scaler.scale(loss).backward(); scaler.unscale_(opt); clip_grad_norm_(...);
// scaler.step(opt); scaler.update();` (unscale_ only when the gradients must be read or clipped;
// step unscales otherwise). With gradient accumulation, call scale(loss).backward() for every
// micro-batch and unscale_/step/update once. bf16 has f32's range and needs no scaling:
// `GradScaler({.enabled = false})` turns every method into a pass-through (scale returns the
// loss, step steps), so one training loop serves both.
//
// Invariants: the scale (0-d f32) and growth tracker (0-d i32) live on the device of the first
// scaled loss and are only read by the host in get_scale(), state_dict() and step()'s skip
// decision (PyTorch syncs at the same place); found-inf flags (0-d f32, one per device) stay on
// their devices. Per optimizer, the stages ready -> unscaled -> stepped are enforced as in
// PyTorch: unscale_ twice, or after step, before update() raises dltrain::Error, as does step
// twice. Gradients of an optimizer's parameters must not be f16 (keep f32 master weights).
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "dltrain/core/state_dict.hpp"
#include "dltrain/core/tensor.hpp"

namespace dltrain::optim {
class Optimizer;
}

namespace dltrain::amp {

/// GradScaler settings, PyTorch's names and defaults.
struct GradScalerOptions {
  /// The scale before the first update (> 0).
  double init_scale = 65536.0;
  /// Factor applied after growth_interval finite steps in a row (> 1).
  double growth_factor = 2.0;
  /// Factor applied after a step with inf/NaN gradients (in (0, 1)).
  double backoff_factor = 0.5;
  /// Finite steps in a row before the scale grows (>= 1).
  int64_t growth_interval = 2000;
  /// false: every method passes through (bf16 training, or f32).
  bool enabled = true;
};

/// Dynamic loss scaler; see the file comment.
class GradScaler {
 public:
  /// Throws dltrain::Error for an out-of-range setting.
  explicit GradScaler(const GradScalerOptions& options = {});

  /// loss * scale (differentiable; the loss's dtype is promoted with f32). Creates the scale on
  /// the loss's device at the first call. Disabled: returns `loss`.
  Tensor scale(const Tensor& loss);
  /// scale() of each tensor (several losses backpropagated together).
  std::vector<Tensor> scale(const std::vector<Tensor>& losses);

  /// Divides the gradients of `optimizer`'s parameters by the scale in place, one fused pass
  /// per (device, dtype) group, and records on each device whether any was inf or NaN.
  /// Parameters without a gradient are skipped. Throws dltrain::Error when called twice for
  /// `optimizer` before update(), after step(), before any scale(), or for f16 gradients.
  void unscale_(optim::Optimizer& optimizer);
  /// Unscales (unless unscale_ already did) and steps `optimizer` unless a gradient was inf or
  /// NaN. Returns whether it stepped. Throws dltrain::Error when called twice before update(),
  /// or when no parameter of `optimizer` has a gradient. Disabled: optimizer.step(), true.
  bool step(optim::Optimizer& optimizer);
  /// Adapts the scale from the found-inf flags of every optimizer stepped since the last update
  /// (see the file comment) and resets the per-optimizer stages. With `new_scale` the scale is
  /// set to it instead (the growth tracker is kept, as in PyTorch). Throws dltrain::Error when
  /// nothing was unscaled since the last update and no new_scale is given.
  void update(std::optional<double> new_scale = std::nullopt);

  /// The current scale (init_scale before the first scale(); 1 when disabled). Reads the
  /// device value, so it synchronises with the device.
  double get_scale() const;
  /// Consecutive finite steps counted towards the next growth.
  int64_t get_growth_tracker() const;
  double get_growth_factor() const { return options_.growth_factor; }
  void set_growth_factor(double factor);
  double get_backoff_factor() const { return options_.backoff_factor; }
  void set_backoff_factor(double factor);
  int64_t get_growth_interval() const { return options_.growth_interval; }
  void set_growth_interval(int64_t interval);
  bool is_enabled() const { return options_.enabled; }

  /// PyTorch's keys: `scale`, `growth_factor`, `backoff_factor`, `growth_interval`,
  /// `_growth_tracker` (0-d tensors); empty when disabled.
  StateDict state_dict() const;
  /// Restores what state_dict() saved. Throws dltrain::Error for an empty dict (saved by a
  /// disabled scaler), a missing or malformed entry, or a bad value; changes nothing then.
  /// Disabled: does nothing.
  void load_state_dict(const StateDict& state);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct OptimizerState {
    Stage stage = Stage::Ready;
    std::vector<Tensor> found_inf;  // one 0-d f32 flag per device holding gradients
  };

  void check_started(const char* method) const;

  GradScalerOptions options_;
  Tensor scale_;           // 0-d f32, undefined until the first scale()
  Tensor growth_tracker_;  // 0-d i32, with scale_
  int64_t init_growth_tracker_ = 0;
  std::unordered_map<const optim::Optimizer*, OptimizerState> per_optimizer_;
};

}  // namespace dltrain::amp
