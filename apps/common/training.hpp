// The pieces of a training run that every example shares, so that their loops and their output
// are one style (header-only): the start of a run (threads, seed, device, data parallelism), the
// options of the library's train::TrainStep from the flags, the --metrics / --tensorboard log,
// and the common fields of the --json report.
//
// The step itself, the epoch's tally, the profiler window and the classifier's evaluation are
// library API (dltrain/train/loop.hpp); this file binds them to the examples' flags.
//
// Invariants: MetricsLog writes on rank 0 only (train::MetricsWriter) and appends to the files
// of a resumed run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "apps/common/example_util.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/train/chronometer.hpp"
#include "dltrain/train/loop.hpp"
#include "dltrain/train/metrics.hpp"
#include "dltrain/train/profiler.hpp"
#include "dltrain/train/progress.hpp"

namespace dltrain::apps {

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

/// train::TrainStep's options for an example: its device and --amp/--amp-dtype, the scheduler,
/// the steps already taken, and the chronometer, profiler window, progress line and metrics log
/// (each may be null).
inline train::TrainStepOptions step_options(const PrecisionFlags& prec, Device device,
                                            optim::LRScheduler* sched, int64_t first_step,
                                            train::Chronometer* chrono,
                                            train::ProfileWindow* profiler,
                                            train::Progress* progress = nullptr,
                                            MetricsLog* metrics = nullptr) {
  train::TrainStepOptions o{.device = device,
                            .autocast = prec.amp,
                            .autocast_dtype = prec.dtype(device),
                            .scheduler = sched,
                            .first_step = first_step,
                            .chronometer = chrono,
                            .profiler = profiler,
                            .progress = progress};
  if (metrics)
    o.on_step = [metrics](int64_t step, double loss, double lr) { metrics->step(step, loss, lr); };
  return o;
}

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

}  // namespace dltrain::apps
