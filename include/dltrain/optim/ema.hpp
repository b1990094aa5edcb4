// Exponential moving average of a model's weights (Polyak averaging; timm's ModelEmaV2,
// torch.optim.swa_utils.AveragedModel with an EMA function), for evaluating or exporting the
// averaged weights.
//
// The EMA keeps a shadow copy of every entry of the model's state_dict() (parameters and
// persistent buffers) on the model's device. Every `update_every`-th call of update(model),
// made after optimizer.step(), blends each floating entry:
//   shadow = decay_t * shadow + (1 - decay_t) * model
// with decay_t = decay, or with warm-up min(decay, (1 + t) / (10 + t)) where t counts the
// blends done before this one (t = 0 at the first: decay_t = 0.1): the rule of TensorFlow's
// tf.train.ExponentialMovingAverage(num_updates), so that early averages do not remember the
// random initialisation for ~1 / (1 - decay) steps (timm's ModelEmaV3 ramps differently). Integer
// buffers (BatchNorm's num_batches_tracked) are copied; floating buffers (running statistics)
// are blended like parameters unless average_buffers is false (then copied). Shadows of f16 /
// bf16 entries are kept in f32 (a 0.9999 decay moves a bf16 value by less than its
// resolution), rounded once when copied into the model.
//
// To evaluate with the averaged weights, either copy them into the model for good
// (copy_to: export, the end of training), or swap them in for a scope (EMAScope: the model's
// own weights are kept aside and put back at the end of the scope, bit for bit).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dltrain/core/state_dict.hpp"
#include "dltrain/nn/module.hpp"

namespace dltrain::optim {

/// Options of ModelEMA.
struct ModelEMAOptions {
  /// The decay, in [0, 1] (1 freezes the average at the model's weights when made).
  double decay = 0.9999;
  /// Warm-up: decay_t = min(decay, (1 + t) / (10 + t)).
  bool warmup = false;
  /// Blend once every this many update() calls (>= 1); the calls in between only count.
  int64_t update_every = 1;
  /// Blend floating buffers (BatchNorm running statistics); false copies them.
  bool average_buffers = true;
};

/// EMA of a model's state_dict(). Example:
///   optim::ModelEMA ema(*model, {.decay = 0.9998, .warmup = true});
///   ... opt.step(); ema.update(*model);
///   { optim::EMAScope scope(ema, *model); evaluate(*model); }  // EMA weights inside
class ModelEMA {
 public:
  /// Shadows a copy of `model`'s current state. Throws dltrain::Error for an invalid option.
  explicit ModelEMA(const nn::Module& model, const ModelEMAOptions& options = {});

  /// Counts one step and, on every update_every-th, blends the model into the shadow. Throws
  /// dltrain::Error (changing nothing) when the model's state_dict() has other names, shapes
  /// or devices than the shadow's.
  void update(const nn::Module& model);
  /// Copies the averaged weights into `model` (dtype converted); same checks as update().
  void copy_to(nn::Module& model) const;

  /// The averaged tensors under the model's state-dict names (f32 for f16/bf16 entries).
  const StateDict& shadow() const { return shadow_; }
  /// update() calls so far.
  int64_t step_count() const { return step_count_; }
  /// Blends so far.
  int64_t num_updates() const { return num_updates_; }
  /// decay_t of the next blend.
  double next_decay() const;
  const ModelEMAOptions& options() const { return options_; }

  /// Keys: `type` ("ModelEMA"), `decay`, `warmup`, `update_every`, `average_buffers`,
  /// `step_count`, `num_updates`, and `shadow.<name>` for each shadowed entry (copies).
  StateDict state_dict() const;
  /// Restores state_dict() (options included), so updates continue exactly. Throws
  /// dltrain::Error (changing nothing) for another type, a missing, unexpected or
  /// differently shaped entry, or an invalid option.
  void load_state_dict(const StateDict& state);

 private:
  friend class EMAScope;
  /// Checks that `model`'s state matches the shadow (names, shapes, devices).
  StateDict checked_model_state(const nn::Module& model, const char* who) const;

  ModelEMAOptions options_;
  StateDict shadow_;
  std::vector<bool> is_param_;  // per shadow entry, in order
  int64_t step_count_ = 0;
  int64_t num_updates_ = 0;
};

/// Puts the EMA weights into `model` for this object's lifetime and the model's own weights
/// back (bit for bit) when it ends. The model must not be trained inside the scope (what it
/// learns there is overwritten). Both objects must outlive the scope. A model whose entries
/// changed shape inside the scope cannot be restored: the destructor then terminates rather
/// than leave the EMA weights in place silently.
class EMAScope {
 public:
  EMAScope(const ModelEMA& ema, nn::Module& model);
  ~EMAScope();
  EMAScope(const EMAScope&) = delete;
  EMAScope& operator=(const EMAScope&) = delete;

 private:
  nn::Module& model_;
  StateDict saved_;  // the model's own entries (copies)
};

}  // namespace dltrain::optim
