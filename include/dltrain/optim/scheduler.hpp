// Learning-rate schedulers with PyTorch 1.13 semantics (torch.optim.lr_scheduler).
//
// A scheduler holds a reference to its Optimizer (which must outlive it) and writes each
// group's `lr`. Construction performs the initial step as PyTorch does: it records each
// group's `initial_lr` (the first scheduler attached sets it; later ones reuse it), sets
// last_epoch() to 0 and applies the epoch-0 learning rate. Each step() then advances
// last_epoch() by one and applies the next rate. Where PyTorch's get_lr() is recursive
// ("chainable": it scales the group's current lr), so is ours, with the same floating-point
// expressions, so sequences agree with PyTorch to rounding and schedulers compose
// (ChainedScheduler, or changing lr from outside). The closed forms are used where PyTorch
// uses them: when SequentialLR hands over to the next scheduler at a milestone.
//
// Custom schedulers derive from LRScheduler, implement get_lr(), and call initial_step() at
// the end of their constructor (a base constructor cannot call a virtual get_lr()).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dltrain/core/state_dict.hpp"
#include "dltrain/optim/optimizer.hpp"

namespace dltrain::optim {

/// Base of all LR schedulers.
///
/// State-dict keys: `type` (u8 bytes of name()), `last_epoch`, `step_count`, `base_lrs`,
/// `last_lr` (1-d f64, one per group), plus each scheduler's hyper-parameters under PyTorch's
/// names (restored on load, as PyTorch does). Save and load the optimizer's state too: group
/// lr, initial_lr and momentum live there.
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances one epoch (or iteration) and writes the new lr into every group. Call it after
  /// optimizer.step(). Throws dltrain::Error when the optimizer's number of groups changed
  /// since construction (and from OneCycleLR past total_steps), leaving the state unchanged.
  virtual void step();
  /// The learning rate of each group computed by the last step (or construction).
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  /// Steps taken since construction (0 right after it).
  int64_t last_epoch() const { return last_epoch_; }
  /// Each group's initial_lr when the scheduler was made.
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  /// The optimizer whose groups this scheduler drives.
  Optimizer& optimizer() const { return optimizer_; }
  /// Class name, e.g. "StepLR"; the state-dict type tag.
  virtual const char* name() const = 0;

  /// The scheduler's position and hyper-parameters (see the class comment for keys).
  StateDict state_dict() const;
  /// Restores state_dict(); the next step() continues exactly. Throws dltrain::Error (and
  /// changes nothing) for another scheduler type, another number of groups or a missing key.
  void load_state_dict(const StateDict& state);

  /// For a scheduler stepped once per batch whose batches from now on hold 1 / `factor` times
  /// the samples they held so far (a run resumed with another global batch: factor = saved /
  /// new global batch; train::resume_data_position calls it): converts the rest of the
  /// schedule so that what was due N steps from now (a milestone, the end of a cycle) comes
  /// after round(N x factor) steps, at least 1, i.e. after the same samples. The rates are not
  /// touched. Each scheduler says how below (some move last_epoch() to keep the fraction of
  /// their cycle already done). Returns what changed ("milestones 40, 60 -> 80, 120"), an
  /// empty string when nothing was left to convert, or nullopt for a scheduler with nothing it
  /// could convert (LambdaLR, ExponentialLR: functions of the step; SequentialLR,
  /// ChainedScheduler). Throws dltrain::Error for a factor that is not positive and finite.
  virtual std::optional<std::string> rescale_remaining(double factor);

 protected:
  /// Records initial_lr (first scheduler only) and base_lrs; does not step.
  explicit LRScheduler(Optimizer& optimizer);
  /// PyTorch's _initial_step: step count reset, then one step() (to epoch 0).
  void initial_step();
  /// The chainable rule: the lr of each group for last_epoch() (already advanced).
  virtual std::vector<double> get_lr() = 0;
  /// The closed form for last_epoch(), where PyTorch has one (used by SequentialLR).
  virtual std::optional<std::vector<double>> closed_form_lr() const { return std::nullopt; }
  /// Hyper-parameters into / out of a state dict (load must throw before changing anything).
  virtual void save_extra(StateDict& /*out*/) const {}
  virtual void load_extra(const StateDict& /*state*/) {}
  /// Current lr of every group.
  std::vector<double> group_lrs() const;
  /// Writes `lrs` into the groups and last_lr.
  void apply(const std::vector<double>& lrs);
  /// Throws when the optimizer's group count no longer matches base_lrs.
  void check_groups() const;

  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = -1;
  int64_t step_count_ = 0;
  std::vector<double> last_lr_;

 private:
  friend class SequentialLR;
  /// PyTorch's deprecated step(epoch): jump to `epoch` using the closed form if any.
  void step_to(int64_t epoch);
};

/// lr = base_lr * lambda(epoch), lambda per group or shared (LambdaLR). The functions are not
/// saved in the state dict.
class LambdaLR final : public LRScheduler {
 public:
  /// One function for every group.
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda);
  /// One function per group (count must match).
  LambdaLR(Optimizer& optimizer, std::vector<std::function<double(int64_t)>> lr_lambdas);
  const char* name() const override { return "LambdaLR"; }

 private:
  std::vector<double> get_lr() override;
  std::vector<std::function<double(int64_t)>> lambdas_;
};

/// Multiplies lr by gamma every step_size epochs (StepLR). step_size > 0.
class StepLR final : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  const char* name() const override { return "StepLR"; }
  /// step_size becomes round(step_size x factor) and last_epoch() moves so that the next
  /// decay comes after round(steps to it x factor) steps, the decays so far unchanged.
  std::optional<std::string> rescale_remaining(double factor) override;

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_extra(StateDict& out) const override;
  void load_extra(const StateDict& state) override;
  int64_t step_size_;
  double gamma_;
};

/// Multiplies lr by gamma at each milestone epoch (MultiStepLR); a milestone listed k times
/// multiplies by gamma^k. Milestones >= 0, any order.
class MultiStepLR final : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
  const char* name() const override { return "MultiStepLR"; }
  /// Each milestone m after last_epoch() L becomes L + round((m - L) x factor); past ones stay.
  std::optional<std::string> rescale_remaining(double factor) override;

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_extra(StateDict& out) const override;
  void load_extra(const StateDict& state) override;
  std::vector<int64_t> milestones_;  // sorted, with repeats
  double gamma_;
};

/// lr * factor until epoch total_iters, then lr (ConstantLR). 0 < factor <= 1.
class ConstantLR final : public LRScheduler {
 public:
  ConstantLR(Optimizer& optimizer, double factor = 1.0 / 3, int64_t total_iters = 5);
  const char* name() const override { return "ConstantLR"; }
  /// A total_iters still ahead moves like a milestone (MultiStepLR).
  std::optional<std::string> rescale_remaining(double factor) override;

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_extra(StateDict& out) const override;
  void load_extra(const StateDict& state) override;
  double factor_;
  int64_t total_iters_;
};

/// Factor going linearly from start_factor to end_factor over total_iters epochs, then
/// constant (LinearLR): the usual warmup. 0 < start_factor <= 1, 0 <= end_factor <= 1,
/// total_iters > 0.
class LinearLR final : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
           int64_t total_iters = 5);
  const char* name() const override { return "LinearLR"; }
  /// A ramp still under way is stretched as OneCycleLR's cycle (rescale_remaining there).
  std::optional<std::string> rescale_remaining(double factor) override;

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_extra(StateDict& out) const override;
  void load_extra(const StateDict& state) override;
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

/// Multiplies lr by gamma every epoch (ExponentialLR).
class ExponentialLR final : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);
  const char* name() const override { return "ExponentialLR"; }

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_extra(StateDict& out) const override;
  void load_extra(const StateDict& state) override;
  double gamma_;
};

/// Cosine annealing from base_lr to eta_min over T_max epochs, then back up (no restarts),
/// with PyTorch's recursive formula (CosineAnnealingLR). T_max > 0.
class CosineAnnealingLR final : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0.0);
  const char* name() const override { return "CosineAnnealingLR"; }
  /// T_max - last_epoch() steps left are stretched as OneCycleLR's (T_max and last_epoch()
  /// change, the fraction of the half-period done stays); a schedule past T_max is left alone.
  std::optional<std::string> rescale_remaining(double factor) override;

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_extra(StateDict& out) const override;
  void load_extra(const StateDict& state) override;
  int64_t T_max_;
  double eta_min_;
};

/// Polynomial decay (PolynomialLR) of base_lr to end_lr over total_iters epochs, then
/// constant:
///   lr(t) = (base_lr - end_lr) * (1 - min(t, T) / T)^power + end_lr,   T = total_iters.
/// With end_lr = 0 (the default) this is torch.optim.lr_scheduler.PolynomialLR (PyTorch 1.13,
/// defaults total_iters 5, power 1) with its recursive formula
///   lr(t) = lr(t-1) * ((1 - t/T) / (1 - (t-1)/T))^power   for 0 < t <= T,
/// applied here to lr - end_lr, so that a non-zero end_lr gives MLPerf's ResNet-50 / LARS
/// schedule (power 2, end_lr 1e-4 at the end of training); it still chains with other
/// schedulers and changes made to `lr` from outside. After the warm-up of a SequentialLR
/// (LinearLR then PolynomialLR) the decay restarts from base_lr at the milestone, so T counts
/// the steps after the warm-up, as MLPerf's (train_steps - warmup_steps).
/// total_iters > 0, power >= 0 and end_lr >= 0, each finite.
class PolynomialLR final : public LRScheduler {
 public:
  PolynomialLR(Optimizer& optimizer, int64_t total_iters = 5, double power = 1.0,
               double end_lr = 0.0);
  const char* name() const override { return "PolynomialLR"; }
  /// A decay still under way is stretched as CosineAnnealingLR's (total_iters and
  /// last_epoch() change, the fraction of the decay done stays); a finished one is left alone.
  std::optional<std::string> rescale_remaining(double factor) override;

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  // State adds `total_iters`, `power` and `end_lr`.
  void save_extra(StateDict& out) const override;
  void load_extra(const StateDict& state) override;
  int64_t total_iters_;
  double power_, end_lr_;
};

/// How OneCycleLR interpolates within a phase.
enum class AnnealStrategy { Cos, Linear };

/// Options of OneCycleLR (PyTorch's names and defaults).
struct OneCycleOptions {
  /// Fraction of the steps spent increasing the lr, in [0, 1].
  double pct_start = 0.3;
  /// Cosine or linear interpolation.
  AnnealStrategy anneal_strategy = AnnealStrategy::Cos;
  /// Cycle SGD momentum or Adam beta1 inversely to the lr (between base and max momentum).
  bool cycle_momentum = true;
  /// Momentum at the lr peak.
  double base_momentum = 0.85;
  /// Momentum at the start and end.
  double max_momentum = 0.95;
  /// initial_lr = max_lr / div_factor (> 0).
  double div_factor = 25.0;
  /// min_lr = initial_lr / final_div_factor (> 0).
  double final_div_factor = 1e4;
  /// Three phases (up, down to initial_lr, down to min_lr) instead of two.
  bool three_phase = false;
};

/// The 1cycle policy (OneCycleLR), stepped once per batch. It overwrites each group's
/// initial_lr with max_lr / div_factor. Stepping more than total_steps times after
/// construction raises dltrain::Error (as PyTorch). With cycle_momentum, the optimizer's
/// groups must have `momentum` (SGD) or `betas` (Adam): their momentum / beta1 is set too.
class OneCycleLR final : public LRScheduler {
 public:
  /// One max_lr for every group.
  OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
             const OneCycleOptions& options = {});
  /// One max_lr per group.
  OneCycleLR(Optimizer& optimizer, std::vector<double> max_lrs, int64_t total_steps,
             const OneCycleOptions& options = {});
  const char* name() const override { return "OneCycleLR"; }
  /// The number of steps of the cycle.
  int64_t total_steps() const { return total_steps_; }
  /// Stretches (factor > 1) or shrinks (factor < 1) the rest of the cycle: the steps left
  /// become round(left x factor), at least 1, and the fraction of the cycle already done stays,
  /// so the learning rate continues from where it was. What a run resumed with another global
  /// batch needs (factor = saved / new global batch: the rest of the epochs then takes that
  /// many more steps; train::resume_data_position calls it). total_steps() and last_epoch()
  /// change accordingly; a finished cycle is left alone. Returns "remaining L steps -> L'".
  /// Throws dltrain::Error for a factor that is not positive and finite.
  std::optional<std::string> rescale_remaining(double factor) override;

 private:
  struct Phase {
    double end_step;
    int start_lr, end_lr;              // 0 initial_lr, 1 max_lr, 2 min_lr
    int start_momentum, end_momentum;  // 0 max_momentum, 1 base_momentum
  };
  std::vector<double> get_lr() override;
  void save_extra(StateDict& out) const override;
  void load_extra(const StateDict& state) override;
  void build_phases();
  double anneal(double start, double end, double pct) const;

  int64_t total_steps_;
  OneCycleOptions opt_;
  bool use_beta1_ = false;
  std::vector<double> max_lrs_, min_lrs_;
  std::vector<Phase> phases_;
};

/// Runs schedulers one after another, switching at the milestones (SequentialLR): scheduler
/// k drives epochs [milestones[k-1], milestones[k]), restarted at its epoch 0 (closed form)
/// when it takes over. All schedulers must drive `optimizer`; milestones strictly increase,
/// one fewer than schedulers. Typical use: LinearLR warmup then CosineAnnealingLR.
class SequentialLR final : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  void step() override;
  const char* name() const override { return "SequentialLR"; }

 private:
  std::vector<double> get_lr() override { return group_lrs(); }
  // State adds `milestones` and each child's state under `schedulers.<k>.`.
  void save_extra(StateDict& out) const override;
  void load_extra(const StateDict& state) override;
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

/// Steps every scheduler at each step() (ChainedScheduler): their chainable factors multiply.
/// All must drive the same optimizer. last_epoch() counts this scheduler's steps.
class ChainedScheduler final : public LRScheduler {
 public:
  explicit ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers);
  void step() override;
  const char* name() const override { return "ChainedScheduler"; }

 private:
  std::vector<double> get_lr() override { return group_lrs(); }
  // State adds each child's state under `schedulers.<k>.`.
  void save_extra(StateDict& out) const override;
  void load_extra(const StateDict& state) override;
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
};

}  // namespace dltrain::optim
