// The pieces of a training run that every example shares, so that their loops and their output
// are one style (header-only): the start of a run (threads, seed, device, data parallelism), one
// timed and profiled training step, the --metrics / --tensorboard log, a classifier's test
// figures, and the common fields of the --json report.
//
// Invariants: TrainStep laps the chronometer in the order data, forward, backward, optimizer and
// ends the step (train::Phase's order), and reads the loss once per step, after the optimizer
// step (that read waits for the device); MetricsLog writes on rank 0 only (train::MetricsWriter)
// and appends to the files of a resumed run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "dltrain/train/chronometer.hpp"
#include "dltrain/train/metrics.hpp"
#include "dltrain/train/profiler.hpp"
#include "dltrain/train/progress.hpp"
#include "examples/common/example_util.hpp"

namespace dltrain::examples {

/// Where a run executes: the device, and its place in a data-parallel job (a world of one
/// without a launcher).
struct Run {
  Device device = Device::cpu();
  int rank = 0;
  int ranks = 1;
  bool gpu() const { return device.is_cuda(); }
};

/// Applies --threads and --seed and selects --device. With `data_parallel`, joins the job that
/// mpirun or srun started (distributed::init: one rank per GPU, `--device cuda` becoming
/// cuda:local_rank) and sends the stdout of every rank but 0 to /dev/null (errors still reach
/// stderr); `backend` is then set to the process group's ("mpi", "nccl", "local").
inline Run start_run(const CommonFlags& a, bool data_parallel, const char** backend = nullptr) {
  if (a.threads > 0) set_num_threads(a.threads);
  manual_seed(a.seed);
  Run r;
  r.device = a.parsed_device();
  if (data_parallel) {
    distributed::ProcessGroup& world = distributed::init({.use_gpu = r.device.is_cuda()});
    r.rank = world.rank();
    r.ranks = world.size();
    if (backend) *backend = world.backend();
    if (r.device.is_cuda() && a.device == "cuda") r.device = distributed::device();
    if (!distributed::is_main_process()) (void)std::freopen("/dev/null", "w", stdout);
  }
  if (r.device.is_cuda()) cuda::set_device(r.device.index);
  return r;
}

/// The --metrics FILE and --tensorboard DIR of an example: every step's loss and learning rate
/// ("train/loss", "train/lr"), each epoch's figures, and at the end the run's hyper-parameters
/// with its final figures (TensorBoard's HPARAMS tab). A resumed run appends to the file.
class MetricsLog {
 public:
  explicit MetricsLog(const CommonFlags& a)
      : writer_(metrics_options(a.metrics, a.tensorboard, a.resume)) {}
  void step(int64_t step, double loss, double lr) {
    writer_.add_scalars({{"train/loss", loss}, {"train/lr", lr}}, step);
  }
  void epoch(const std::map<std::string, double>& figures, int64_t step) {
    writer_.add_scalars(figures, step);
  }
  /// Writes the hyper-parameters with `final_figures` (scalar tags of the run; nothing when it
  /// is empty: no epoch ended), flushes, and prints each file and how to plot it.
  void finish(const std::map<std::string, train::HParamValue>& hparams,
              const std::map<std::string, double>& final_figures) {
    if (!final_figures.empty()) writer_.add_hparams(hparams, final_figures);
    writer_.flush();
    for (const std::string& path : writer_.paths()) std::printf("metrics: %s\n", path.c_str());
    print_metrics_hint(writer_.paths());
  }

 private:
  train::MetricsWriter writer_;
};

/// The progress line of an example's training: ten lines per epoch (with --test, one every
/// `test_every` steps over the --test-nsteps steps), a live bar on a terminal, rank 0 only.
inline train::ProgressOptions progress_options(const CommonFlags& a, int64_t steps_per_epoch,
                                               int64_t test_every) {
  return {.total_steps = a.test ? std::min(a.test_nsteps, steps_per_epoch) : steps_per_epoch,
          .every = a.test ? test_every : 0,
          .label = "  train"};
}

/// An epoch's running figures on this rank: the summed loss, the samples, the batches, the time.
struct EpochTally {
  double loss_sum = 0;
  int64_t samples = 0, batches = 0;
  double seconds = 0;  ///< set by TrainStep::end_epoch (the device's work included)
  double mean_loss() const { return batches ? loss_sum / static_cast<double>(batches) : 0.0; }
  double throughput() const { return static_cast<double>(samples) / seconds; }
  /// The job's figures, on every rank of a data-parallel job (collective): the samples summed,
  /// the loss averaged over the ranks, the slowest rank's time.
  void all_reduce() {
    const int ranks = distributed::world_size();
    if (ranks <= 1) return;
    seconds = distributed::all_reduce_value(seconds, distributed::ReduceOp::Max);
    loss_sum = distributed::all_reduce_value(loss_sum) / ranks;
    samples = static_cast<int64_t>(distributed::all_reduce_value(static_cast<double>(samples)));
  }
};

/// One training step, timed by the chronometer and named for the profiler: the loss that
/// `forward` returns, computed under autocast with --amp ("forward"), its backward through the
/// GradScaler ("backward"), then the optimizer step, the scaler's update, the scheduler's step
/// (when there is one) and the loss scale's log line ("optimizer"); then the step's count, the
/// epoch's tally, the progress line and the metrics (when given). Per epoch: begin_epoch(), then
/// for each batch data_ready() once it is on the device and run(); begin() before the next
/// batch is fetched; end_epoch() after the last.
class TrainStep {
 public:
  /// `first_step` is the count of steps already trained (a resumed run's); `progress` and
  /// `metrics` may be null (nothing printed or logged), and are used only with a scheduler
  /// `sched` (the learning rate they show).
  TrainStep(train::Chronometer& chrono, StepProfiler& profiler, optim::Optimizer& opt,
            amp::GradScaler& scaler, optim::LRScheduler* sched, const PrecisionFlags& prec,
            Device device, int64_t first_step = 0, train::Progress* progress = nullptr,
            MetricsLog* metrics = nullptr)
      : chrono_(chrono),
        profiler_(profiler),
        opt_(opt),
        scaler_(scaler),
        sched_(sched),
        prec_(prec),
        device_(device),
        step_(first_step),
        progress_(progress),
        metrics_(metrics) {}

  /// Gradient accumulation (the course's "gradient aggregation"): each optimizer step sums
  /// the gradients of `k` consecutive batches, each batch's loss divided by the number of
  /// batches in its cycle (so the step sees the mean over k x batch samples); the epoch's last
  /// cycle takes the `batches_per_epoch` that are left. `no_sync` runs the backward of every
  /// batch but a cycle's last (DDP's no_sync(), so that only the last all-reduces); empty in a
  /// world of one. step() then counts optimizer steps; at_boundary() is true between cycles.
  void set_accumulation(int64_t k, int64_t batches_per_epoch,
                        std::function<void(const std::function<void()>&)> no_sync = {}) {
    accumulation_ = std::max<int64_t>(1, k);
    batches_per_epoch_ = batches_per_epoch;
    no_sync_ = std::move(no_sync);
  }
  /// True when no cycle of accumulated gradients is open (always with k = 1): where a
  /// checkpoint may be saved or training stopped without losing gradients.
  bool at_boundary() const { return micro_ == 0; }

  /// Starts epoch `epoch` (0-based) at its batch `first_batch` (a resumed epoch's), `model` in
  /// training mode, then begin().
  void begin_epoch(nn::Module& model, int64_t epoch, int64_t first_batch = 0) {
    model.train();
    tally_ = {};
    first_batch_ = first_batch;
    epoch_start_ = Clock::now();
    if (progress_) progress_->begin(epoch + 1);
    begin();
  }
  /// A step starts: the data wait is timed from here.
  void begin() {
    chrono_.begin_step();
    profiler_.begin_step();
  }
  /// The batch is ready: ends the data phase.
  void data_ready() { chrono_.lap(train::Phase::Data); }
  /// Runs the step on a batch of `samples` and returns its loss.
  double run(int64_t samples, const std::function<Tensor()>& forward) {
    if (micro_ == 0) {  // a new cycle: as many batches as are left in the epoch, at most k
      const int64_t left = batches_per_epoch_ - (first_batch_ + tally_.batches);
      cycle_ = accumulation_ > 1 ? std::clamp<int64_t>(left, 1, accumulation_) : 1;
    }
    const bool last = micro_ + 1 == cycle_;
    Tensor loss;
    {
      const train::ProfileRange range("forward");
      const amp::autocast ac = prec_.region(device_);
      loss = forward();
    }
    chrono_.lap(train::Phase::Forward);
    {
      const train::ProfileRange range("backward");
      if (micro_ == 0) opt_.zero_grad();
      const Tensor scaled =
          scaler_.scale(cycle_ > 1 ? div(loss, static_cast<double>(cycle_)) : loss);
      if (!last && no_sync_)
        no_sync_([&] { scaled.backward(); });
      else
        scaled.backward();
    }
    chrono_.lap(train::Phase::Backward);
    double value = 0;
    {
      const train::ProfileRange range("optimizer");
      if (last) {
        scaler_.step(opt_);
        scaler_.update();
        if (sched_) sched_->step();
        scale_log_(scaler_, step_);
      }
      value = loss.item<double>();
    }
    chrono_.lap(train::Phase::Optimizer);
    chrono_.end_step(samples);
    profiler_.end_step();
    micro_ = last ? 0 : micro_ + 1;
    if (last) ++step_;
    tally_.loss_sum += value;
    tally_.samples += samples;
    ++tally_.batches;
    // The learning rate is the scheduler's (a step without one is not printed or logged).
    if (sched_) {
      const double lr = sched_->get_last_lr()[0];
      if (progress_) progress_->update(first_batch_ + tally_.batches, value, lr, samples);
      if (metrics_) metrics_->step(step_, value, lr);
    }
    return value;
  }
  /// Ends the epoch: the progress line, a profiler window cut short; returns the epoch's tally
  /// (its time waits for the device).
  const EpochTally& end_epoch() {
    DLTRAIN_CHECK(micro_ == 0,
                  "TrainStep: the epoch ended inside a cycle of accumulated "
                  "gradients (",
                  micro_, " of ", cycle_,
                  " batches); give set_accumulation the "
                  "loader's batches per epoch");
    if (progress_) progress_->end();
    profiler_.finish();
    if (device_.is_cuda()) cuda::synchronize();
    tally_.seconds = seconds(epoch_start_, Clock::now());
    return tally_;
  }
  /// The steps trained so far (the resumed ones included).
  int64_t step() const { return step_; }
  /// The batches of this epoch's pass over the loader so far.
  int64_t batches() const { return tally_.batches; }

 private:
  train::Chronometer& chrono_;
  StepProfiler& profiler_;
  optim::Optimizer& opt_;
  amp::GradScaler& scaler_;
  optim::LRScheduler* sched_;
  const PrecisionFlags& prec_;
  Device device_;
  int64_t step_;
  train::Progress* progress_;
  MetricsLog* metrics_;
  ScaleLog scale_log_;
  EpochTally tally_;
  int64_t first_batch_ = 0;
  int64_t accumulation_ = 1, batches_per_epoch_ = 0, cycle_ = 1, micro_ = 0;
  std::function<void(const std::function<void()>&)> no_sync_;
  Clock::time_point epoch_start_ = Clock::now();
};

/// The data, forward and backward + optimizer-step medians in ms (the report's "step_ms": the
/// PyTorch peers time backward and the optimizer step as one phase).
inline nlohmann::json step_ms(const train::Chronometer& chrono) {
  std::vector<double> bwd = chrono.phase_times(train::Phase::Backward);
  const std::vector<double>& opt = chrono.phase_times(train::Phase::Optimizer);
  for (size_t i = 0; i < bwd.size() && i < opt.size(); ++i) bwd[i] += opt[i];
  const train::ChronometerSummary cs = chrono.summary();
  return {{"data", 1e3 * cs.phases[static_cast<int>(train::Phase::Data)].median},
          {"forward", 1e3 * cs.phases[static_cast<int>(train::Phase::Forward)].median},
          {"backward", 1e3 * train::compute_stats(bwd).median}};
}

/// A classifier's figures over a loader: the summed cross-entropy, the correct predictions and
/// the images (this rank's share).
struct ClassifierFigures {
  double loss_sum = 0;
  int64_t correct = 0, count = 0;
  /// Summed over the ranks of a data-parallel job (every rank calls it).
  void all_reduce() {
    if (distributed::world_size() <= 1) return;
    loss_sum = distributed::all_reduce_value(loss_sum);
    correct = static_cast<int64_t>(distributed::all_reduce_value(static_cast<double>(correct)));
    count = static_cast<int64_t>(distributed::all_reduce_value(static_cast<double>(count)));
  }
  double loss() const { return loss_sum / static_cast<double>(count); }
  double accuracy() const {
    return 100.0 * static_cast<double>(correct) / static_cast<double>(count);
  }
};

/// Evaluates `model` on `loader` (in eval mode, without gradients, under autocast with --amp,
/// batches moved to `device` in the run's layout).
inline ClassifierFigures evaluate_classifier(nn::Module& model, const data::DataLoader& loader,
                                             Device device, const PrecisionFlags& prec) {
  model.eval();
  NoGradGuard ng;
  const amp::autocast ac = prec.region(device);
  ClassifierFigures f;
  for (const data::Batch& hb : loader) {
    const Tensor x = hb.data.to(device).contiguous(prec.format());
    const Tensor y = hb.target.to(device);
    const Tensor logits = model.forward(x);
    CrossEntropyOptions sum_opts;
    sum_opts.reduction = Reduction::Sum;
    f.loss_sum += cross_entropy(logits, y, sum_opts).item<double>();
    f.correct += static_cast<int64_t>(sum(eq(argmax(logits, 1), y).to(DType::i64)).item<double>());
    f.count += hb.size();
  }
  return f;
}

/// The fields every example's --json report starts with: the framework, the device, the
/// precision, layout and loss scaling, the threads and the batch size per rank.
inline nlohmann::json report_header(const CommonFlags& a, Device device,
                                    const amp::GradScaler& scaler) {
  return {{"framework", "dltrain"},
          {"device", device.str()},
          {"precision", a.prec.precision(device)},
          {"layout", a.prec.layout()},
          {"loss_scaling", scaler.is_enabled()},
          {"threads", get_num_threads()},
          {"batch_size", a.batch_size}};
}

/// Runs an example's `body` and returns its exit status; a dltrain::Error it raises is printed
/// as "PROGRAM: error: ..." and gives status 1, after taking a data-parallel job down so that no
/// rank waits for this one.
inline int run_guarded(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    if (distributed::world_size() > 1) distributed::abort(std::string(program) + ": " + e.what());
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

/// Writes the --json report on rank 0 and says so (nothing without --json).
inline void write_report(const CommonFlags& a, const nlohmann::json& report) {
  if (a.json.empty() || !distributed::is_main_process()) return;
  cli::write_json_report(a.json, report);
  std::printf("wrote %s\n", a.json.c_str());
}

}  // namespace dltrain::examples
