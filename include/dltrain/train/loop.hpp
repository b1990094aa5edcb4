// The pieces of a training loop that every program writes, as library API: one timed and
// profiled training step under autocast and loss scaling, with gradient accumulation
// (TrainStep); an epoch's figures on this rank and over a data-parallel job (EpochTally); a
// window of profiled steps (ProfileWindow); a classifier's loss and accuracy over a loader
// (evaluate_classifier). The bundled examples and benchmarks are built on them:
//
//   train::Chronometer chrono;
//   train::TrainStep step(opt, scaler, {.device = device, .autocast = amp, .scheduler = &sched,
//                                       .chronometer = &chrono, .progress = &progress});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     step.begin_epoch(*model, epoch);
//     for (const data::Batch& b : loader) {
//       const Tensor x = b.data.to(device), y = b.target.to(device);
//       step.data_ready();
//       step.run(b.size(), [&] { return cross_entropy(model->forward(x), y); });
//       step.begin();
//     }
//     train::EpochTally t = step.end_epoch();
//     t.all_reduce();  // the job's figures (collective)
//     const train::ClassifierFigures f = train::evaluate_classifier(*model, test_loader,
//                                                                   {.device = device});
//   }
//
// Invariants: TrainStep laps the chronometer in the order data, forward, backward, optimizer and
// ends the step (train::Phase's order); it reads the loss once per batch, after the optimizer
// step (that read waits for the device); the optimizer, the scaler's update and the scheduler
// step once per cycle of accumulated batches, never inside one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "dltrain/core/device.hpp"
#include "dltrain/core/dtype.hpp"
#include "dltrain/core/tensor.hpp"

namespace dltrain {
namespace nn {
class Module;
}
namespace optim {
class Optimizer;
class LRScheduler;
}  // namespace optim
namespace amp {
class GradScaler;
}
namespace data {
class DataLoader;
}
namespace train {
class Chronometer;
class Progress;

/// An epoch's running figures on this rank: the summed loss, the samples, the batches, the time.
struct EpochTally {
  double loss_sum = 0;
  int64_t samples = 0, batches = 0;
  /// Seconds from begin_epoch to end_epoch (the device's work included).
  double seconds = 0;
  /// The mean loss per batch (0 before the first batch).
  double mean_loss() const { return batches ? loss_sum / static_cast<double>(batches) : 0.0; }
  /// Samples per second (0 before the epoch ended).
  double throughput() const { return seconds > 0 ? static_cast<double>(samples) / seconds : 0.0; }
  /// The job's figures, on every rank of a data-parallel job (collective over the default
  /// group; nothing in a world of one): the samples summed, the loss averaged over the ranks,
  /// the slowest rank's time.
  void all_reduce();
};

/// Which training steps ProfileWindow profiles, and where it writes.
struct ProfileWindowOptions {
  /// The Chrome trace's path (FILE.json); empty: the window never opens.
  std::string path{};
  /// Steps profiled (> 0), after `warmup` steps (>= 0) of the run.
  int64_t steps = 5;
  int64_t warmup = 2;
  /// Record every op's input shapes (train::ProfilerOptions::record_shapes).
  bool record_shapes = false;
  /// False on every rank but the one that profiles (usually !distributed::is_main_process()).
  bool enabled = true;
};

/// Runs train::Profiler over a window of training steps: call begin_step() before and
/// end_step() after each step (TrainStep does); when the window closes, or at finish() when the
/// run ends inside it, the Chrome trace is written and the ops table printed to stdout. Throws
/// dltrain::Error for a path that does not end in .json, steps <= 0 or warmup < 0.
class ProfileWindow {
 public:
  explicit ProfileWindow(ProfileWindowOptions options = {});
  ~ProfileWindow();
  ProfileWindow(const ProfileWindow&) = delete;
  ProfileWindow& operator=(const ProfileWindow&) = delete;
  void begin_step();
  void end_step();
  /// Writes the trace and prints the table if the profiler is running.
  void finish();
  /// True once the trace has been written.
  bool written() const { return written_; }

 private:
  ProfileWindowOptions options_;
  int64_t seen_ = 0;
  bool written_ = false;
  struct Running;
  std::unique_ptr<Running> running_;
};

/// What TrainStep drives besides the optimizer and the scaler. Pointers may be null (that part
/// is skipped); they must outlive the TrainStep.
struct TrainStepOptions {
  /// Where the batches are: autocast's device type, and a CUDA device is synchronised at
  /// end_epoch so that the epoch's time includes its work.
  Device device = Device::cpu();
  /// Run the forward under autocast (mixed precision), in `autocast_dtype` (default: the
  /// device's, amp::default_autocast_dtype).
  bool autocast = false;
  std::optional<DType> autocast_dtype{};
  /// Stepped after every optimizer step; the learning rate shown is its get_last_lr()[0] (the
  /// first parameter group's lr without one).
  optim::LRScheduler* scheduler = nullptr;
  /// Optimizer steps already taken (a resumed run's); step() counts on from here.
  int64_t first_step = 0;
  /// Lapped per phase (data, forward, backward, optimizer) and ended per step.
  Chronometer* chronometer = nullptr;
  ProfileWindow* profiler = nullptr;
  /// Updated after every batch with its loss, the learning rate and the batch size.
  Progress* progress = nullptr;
  /// Called after every batch with (optimizer steps so far, loss, learning rate): a metrics
  /// sink (train::MetricsWriter::add_scalars).
  std::function<void(int64_t step, double loss, double lr)> on_step{};
  /// Prints "  loss scale S at step N" to stdout whenever the GradScaler's scale changes (an
  /// enabled scaler only; reading the scale waits for the device).
  bool print_loss_scale = true;
};

/// One training step, timed and named for the profiler: the loss `forward` returns, computed
/// under autocast when asked ("forward"), its backward through the GradScaler ("backward"),
/// then the optimizer step, the scaler's update, the scheduler's step and the loss-scale line
/// ("optimizer"); then the step's count, the epoch's tally, the progress line and on_step. Per
/// epoch: begin_epoch(), then for each batch data_ready() once it is on the device and run();
/// begin() before the next batch is fetched; end_epoch() after the last.
class TrainStep {
 public:
  TrainStep(optim::Optimizer& optimizer, amp::GradScaler& scaler, TrainStepOptions options = {});
  ~TrainStep();
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  /// Gradient accumulation (the course's "gradient aggregation"): each optimizer step sums the
  /// gradients of `k` consecutive batches, each batch's loss divided by the number of batches
  /// in its cycle (so the step sees the mean over k x batch samples); the epoch's last cycle
  /// takes the `batches_per_epoch` that are left. `no_sync` runs the backward of every batch
  /// but a cycle's last (DDP's no_sync(), so that only the last all-reduces); empty in a world
  /// of one. step() then counts optimizer steps. Throws dltrain::Error for k > 1 without a
  /// positive batches_per_epoch.
  void set_accumulation(int64_t k, int64_t batches_per_epoch,
                        std::function<void(const std::function<void()>&)> no_sync = {});
  /// True when no cycle of accumulated gradients is open (always with k = 1): where a
  /// checkpoint may be saved or training stopped without losing gradients.
  bool at_boundary() const { return micro_ == 0; }

  /// Starts epoch `epoch` (0-based) at its batch `first_batch` (a resumed epoch's), `model` in
  /// training mode, then begin().
  void begin_epoch(nn::Module& model, int64_t epoch, int64_t first_batch = 0);
  /// A step starts: the data wait is timed from here.
  void begin();
  /// The batch is ready: ends the data phase.
  void data_ready();
  /// Runs the step on a batch of `samples` and returns its loss (a NaN loss is returned and
  /// tallied as it is; the GradScaler skips the optimizer step of non-finite gradients).
  double run(int64_t samples, const std::function<Tensor()>& forward);
  /// Ends the epoch: the progress line, a profiler window cut short; returns the epoch's
  /// tally (its time waits for the device). Throws dltrain::Error inside a cycle of
  /// accumulated gradients.
  const EpochTally& end_epoch();
  /// The optimizer steps taken so far (the resumed ones included).
  int64_t step() const { return step_; }
  /// The batches of this epoch's pass over the loader so far.
  int64_t batches() const { return tally_.batches; }
  /// The learning rate the next optimizer step uses.
  double learning_rate() const;

 private:
  optim::Optimizer& opt_;
  amp::GradScaler& scaler_;
  TrainStepOptions options_;
  int64_t step_;
  EpochTally tally_;
  int64_t first_batch_ = 0;
  int64_t accumulation_ = 1, batches_per_epoch_ = 0, cycle_ = 1, micro_ = 0;
  std::function<void(const std::function<void()>&)> no_sync_{};
  double epoch_start_ = 0;
  double last_scale_ = 0;
};

/// A classifier's figures over a loader: the summed cross-entropy, the correct top-1
/// predictions and the samples (this rank's share until all_reduce).
struct ClassifierFigures {
  double loss_sum = 0;
  int64_t correct = 0, count = 0;
  /// Summed over the ranks of a data-parallel job (collective over the default group).
  void all_reduce();
  /// Mean cross-entropy per sample, top-1 accuracy in percent (NaN before any sample).
  double loss() const;
  double accuracy() const;
};

struct EvaluateOptions {
  /// Batches are moved here, in `memory_format`.
  Device device = Device::cpu();
  MemoryFormat memory_format = MemoryFormat::Contiguous;
  /// The forward under autocast, as in training (TrainStepOptions::autocast).
  bool autocast = false;
  std::optional<DType> autocast_dtype{};
};

/// Evaluates `model` (switched to eval mode; not switched back) on every batch of `loader`
/// without gradients: the logits' summed cross-entropy against the class-index targets and the
/// top-1 hits.
ClassifierFigures evaluate_classifier(nn::Module& model, const data::DataLoader& loader,
                                      const EvaluateOptions& options = {});

}  // namespace train
}  // namespace dltrain
