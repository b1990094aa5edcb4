// train::TrainStep, ProfileWindow, EpochTally and evaluate_classifier
// (dltrain/train/loop.hpp): the training loop's shared pieces.
#include "dltrain/train/loop.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <utility>

#include "dltrain/amp/autocast.hpp"
#include "dltrain/amp/grad_scaler.hpp"
#include "dltrain/autograd/node.hpp"
#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/data/dataloader.hpp"
#include "dltrain/distributed/process_group.hpp"
#include "dltrain/nn/module.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/loss.hpp"
#include "dltrain/ops/reduction.hpp"
#include "dltrain/optim/optimizer.hpp"
#include "dltrain/optim/scheduler.hpp"
#include "dltrain/train/chronometer.hpp"
#include "dltrain/train/profiler.hpp"
#include "dltrain/train/progress.hpp"

namespace dltrain::train {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void EpochTally::all_reduce() {
  const int ranks = distributed::world_size();
  if (ranks <= 1) return;
  seconds = distributed::all_reduce_value(seconds, distributed::ReduceOp::Max);
  loss_sum = distributed::all_reduce_value(loss_sum) / ranks;
  samples = static_cast<int64_t>(distributed::all_reduce_value(static_cast<double>(samples)));
}

// ---------------------------------------------------------------------------------------------
// ProfileWindow

struct ProfileWindow::Running {
  Profiler profiler;
};

ProfileWindow::ProfileWindow(ProfileWindowOptions options) : options_(std::move(options)) {
  DLTRAIN_CHECK(options_.path.empty() || options_.path.ends_with(".json"),
                "train::ProfileWindow: the trace path must end in .json (Chrome trace format; "
                "got '",
                options_.path, "')");
  DLTRAIN_CHECK(options_.steps > 0 && options_.warmup >= 0,
                "train::ProfileWindow: steps must be > 0 and warmup >= 0 (got steps ",
                options_.steps, ", warmup ", options_.warmup, ")");
}

ProfileWindow::~ProfileWindow() = default;

void ProfileWindow::begin_step() {
  if (options_.enabled && !options_.path.empty() && !running_ && !written_ &&
      seen_ == options_.warmup)
    running_.reset(new Running{Profiler(ProfilerOptions{.record_shapes = options_.record_shapes})});
}

void ProfileWindow::end_step() {
  ++seen_;
  if (running_ && seen_ == options_.warmup + options_.steps) finish();
}

void ProfileWindow::finish() {
  if (!running_) return;
  Profiler& prof = running_->profiler;
  prof.stop();
  const int64_t n = seen_ - options_.warmup;
  std::printf("profile: %lld training steps after %lld warm-up steps\n%s",
              static_cast<long long>(n), static_cast<long long>(options_.warmup),
              prof.table(15).c_str());
  prof.write_chrome_trace(options_.path);
  std::printf("profile: wrote %s (open it in https://ui.perfetto.dev or chrome://tracing)\n",
              options_.path.c_str());
  running_.reset();
  written_ = true;
}

// ---------------------------------------------------------------------------------------------
// TrainStep

TrainStep::TrainStep(optim::Optimizer& optimizer, amp::GradScaler& scaler, TrainStepOptions options)
    : opt_(optimizer),
      scaler_(scaler),
      options_(std::move(options)),
      step_(options_.first_step),
      epoch_start_(now_seconds()) {
  DLTRAIN_CHECK(options_.first_step >= 0, "train::TrainStep: options.first_step is ",
                options_.first_step, "; pass the optimizer steps already taken (>= 0)");
}

TrainStep::~TrainStep() = default;

void TrainStep::set_accumulation(int64_t k, int64_t batches_per_epoch,
                                 std::function<void(const std::function<void()>&)> no_sync) {
  DLTRAIN_CHECK(micro_ == 0,
                "train::TrainStep::set_accumulation: called inside a cycle of accumulated "
                "gradients; call it before an epoch starts");
  DLTRAIN_CHECK(k <= 1 || batches_per_epoch > 0,
                "train::TrainStep::set_accumulation: accumulating ", k,
                " batches needs the loader's batches per epoch (got ", batches_per_epoch, ")");
  accumulation_ = std::max<int64_t>(1, k);
  batches_per_epoch_ = batches_per_epoch;
  no_sync_ = std::move(no_sync);
}

void TrainStep::begin_epoch(nn::Module& model, int64_t epoch, int64_t first_batch) {
  model.train();
  tally_ = {};
  first_batch_ = first_batch;
  epoch_start_ = now_seconds();
  if (options_.progress) options_.progress->begin(epoch + 1);
  begin();
}

void TrainStep::begin() {
  if (options_.chronometer) options_.chronometer->begin_step();
  if (options_.profiler) options_.profiler->begin_step();
}

void TrainStep::data_ready() {
  if (options_.chronometer) options_.chronometer->lap(Phase::Data);
}

double TrainStep::learning_rate() const {
  if (options_.scheduler) return options_.scheduler->get_last_lr()[0];
  const auto& groups = opt_.param_groups();
  return groups.empty() ? std::numeric_limits<double>::quiet_NaN()
                        : groups[0].lr.value_or(std::numeric_limits<double>::quiet_NaN());
}

double TrainStep::run(int64_t samples, const std::function<Tensor()>& forward) {
  Chronometer* chrono = options_.chronometer;
  if (micro_ == 0) {  // a new cycle: as many batches as are left in the epoch, at most k
    const int64_t left = batches_per_epoch_ - (first_batch_ + tally_.batches);
    cycle_ = accumulation_ > 1 ? std::clamp<int64_t>(left, 1, accumulation_) : 1;
  }
  const bool last = micro_ + 1 == cycle_;
  Tensor loss;
  {
    const ProfileRange range("forward");
    const amp::autocast ac(options_.device.type, options_.autocast_dtype, options_.autocast);
    loss = forward();
  }
  if (chrono) chrono->lap(Phase::Forward);
  {
    const ProfileRange range("backward");
    if (micro_ == 0) opt_.zero_grad();
    const Tensor scaled = scaler_.scale(cycle_ > 1 ? div(loss, static_cast<double>(cycle_)) : loss);
    if (!last && no_sync_)
      no_sync_([&] { scaled.backward(); });
    else
      scaled.backward();
  }
  if (chrono) chrono->lap(Phase::Backward);
  double value = 0;
  {
    const ProfileRange range("optimizer");
    if (last) {
      scaler_.step(opt_);
      scaler_.update();
      if (options_.scheduler) options_.scheduler->step();
      if (options_.print_loss_scale && scaler_.is_enabled()) {
        const double s = scaler_.get_scale();
        if (s != last_scale_) {
          std::printf("  loss scale %g at step %lld\n", s, static_cast<long long>(step_));
          last_scale_ = s;
        }
      }
    }
    value = loss.item<double>();
  }
  if (chrono) {
    chrono->lap(Phase::Optimizer);
    chrono->end_step(samples);
  }
  if (options_.profiler) options_.profiler->end_step();
  micro_ = last ? 0 : micro_ + 1;
  if (last) ++step_;
  tally_.loss_sum += value;
  tally_.samples += samples;
  ++tally_.batches;
  if (options_.progress || options_.on_step) {
    const double lr = learning_rate();
    if (options_.progress)
      options_.progress->update(first_batch_ + tally_.batches, value, lr, samples);
    if (options_.on_step) options_.on_step(step_, value, lr);
  }
  return value;
}

const EpochTally& TrainStep::end_epoch() {
  DLTRAIN_CHECK(
      micro_ == 0, "train::TrainStep: the epoch ended inside a cycle of accumulated gradients (",
      micro_, " of ", cycle_, " batches); give set_accumulation the loader's batches per epoch");
  if (options_.progress) options_.progress->end();
  if (options_.profiler) options_.profiler->finish();
  if (options_.device.is_cuda()) cuda::synchronize();
  tally_.seconds = now_seconds() - epoch_start_;
  return tally_;
}

// ---------------------------------------------------------------------------------------------
// Evaluation

void ClassifierFigures::all_reduce() {
  if (distributed::world_size() <= 1) return;
  loss_sum = distributed::all_reduce_value(loss_sum);
  correct = static_cast<int64_t>(distributed::all_reduce_value(static_cast<double>(correct)));
  count = static_cast<int64_t>(distributed::all_reduce_value(static_cast<double>(count)));
}

double ClassifierFigures::loss() const {
  return count ? loss_sum / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN();
}

double ClassifierFigures::accuracy() const {
  return count ? 100.0 * static_cast<double>(correct) / static_cast<double>(count)
               : std::numeric_limits<double>::quiet_NaN();
}

ClassifierFigures evaluate_classifier(nn::Module& model, const data::DataLoader& loader,
                                      const EvaluateOptions& options) {
  model.eval();
  const NoGradGuard no_grad;
  const amp::autocast ac(options.device.type, options.autocast_dtype, options.autocast);
  CrossEntropyOptions sum_opts;
  sum_opts.reduction = Reduction::Sum;
  ClassifierFigures f;
  for (const data::Batch& hb : loader) {
    const Tensor x = hb.data.to(options.device).contiguous(options.memory_format);
    const Tensor y = hb.target.to(options.device);
    const Tensor logits = model.forward(x);
    DLTRAIN_CHECK(logits.dim() == 2 && y.dim() == 1 && logits.size(0) == y.size(0),
                  "train::evaluate_classifier: the model must return [batch, classes] logits "
                  "for [batch] class-index targets (got logits ",
                  shape_str(logits.shape()), ", targets ", shape_str(y.shape()), ")");
    f.loss_sum += cross_entropy(logits, y, sum_opts).item<double>();
    f.correct += static_cast<int64_t>(sum(eq(argmax(logits, 1), y).to(DType::i64)).item<double>());
    f.count += hb.size();
  }
  return f;
}

}  // namespace dltrain::train
