// Helpers shared by the examples: the chronometer's statistics, wall-clock seconds, the
// --device flag's parsing, a small command-line parser, and the course's precision and layout
// flags (--amp, --amp-dtype, --channels-last) with the loss-scale log, and the --checkpoint file
// (resume, save, stop for a requeue on a preemption signal) (header-only).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "dltrain/amp/autocast.hpp"
#include "dltrain/amp/grad_scaler.hpp"
#include "dltrain/core/device.hpp"
#include "dltrain/data/dataloader.hpp"
#include "dltrain/distributed/process_group.hpp"
#include "dltrain/io/checkpoint.hpp"
#include "dltrain/nn/module.hpp"
#include "dltrain/optim/optimizer.hpp"
#include "dltrain/optim/scheduler.hpp"
#include "dltrain/train/metrics.hpp"
#include "dltrain/train/preemption.hpp"
#include "dltrain/train/profiler.hpp"
#include "dltrain/train/resume.hpp"

namespace dltrain::examples {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// min / median / mean / std of a list of step times (seconds), the chronometer's summary.
struct Stats {
  double min = 0, median = 0, mean = 0, std = 0;
};
inline Stats stats(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.median = v[v.size() / 2];
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.std += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(s.std / static_cast<double>(v.size()));
  return s;
}

/// Prints the chronometer table: min / median / std in ms of the data, forward (with the
/// loss) and backward + optimizer-step times, one row each; `config` (precision and layout)
/// goes in the title when given.
inline void print_chronometer(const char* data_label, const std::vector<double>& data,
                              const std::vector<double>& forward,
                              const std::vector<double>& backward, const std::string& config = "") {
  if (!config.empty()) std::printf("chronometer: %s\n", config.c_str());
  std::printf("chronometer over %zu steps (ms): %-18s %8s %8s %8s\n", forward.size(), "", "min",
              "median", "std");
  auto row = [](const char* name, const Stats& s) {
    std::printf("  %-44s %8.2f %8.2f %8.2f\n", name, 1e3 * s.min, 1e3 * s.median, 1e3 * s.std);
  };
  row(data_label, stats(data));
  row("forward (incl. loss)", stats(forward));
  row("backward + optimizer step", stats(backward));
}

/// "cpu", "cuda" (device 0) or "cuda:N"; throws std::invalid_argument otherwise.
inline Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) return Device::cuda(std::stoi(s.substr(5)));
  throw std::invalid_argument(s);
}

/// Command-line flags bound to variables: `--name VALUE` for strings and numbers, `--name`
/// alone for switches. Unknown flags, missing or malformed values print the message and the
/// usage line to stderr and exit with code 2; -h/--help prints the usage.
class Flags {
 public:
  Flags(std::string program, std::string usage)
      : program_(std::move(program)), usage_(std::move(usage)) {}
  template <class T>
  Flags& add(const std::string& name, T* value) {
    bound_[name] = value;
    return *this;
  }
  /// A switch: its presence stores `set` into *value.
  Flags& add_switch(const std::string& name, bool* value, bool set = true) {
    switches_[name] = {value, set};
    return *this;
  }
  void parse(int argc, char** argv) const {
    for (int i = 1; i < argc; ++i) {
      const std::string k = argv[i];
      if (k == "-h" || k == "--help") fail("help");
      if (auto s = switches_.find(k); s != switches_.end()) {
        *s->second.first = s->second.second;
        continue;
      }
      auto b = bound_.find(k);
      if (b == bound_.end()) fail("unknown flag " + k);
      if (i + 1 >= argc) fail("missing value after " + k);
      const std::string v = argv[++i];
      try {
        std::visit(
            [&](auto* p) {
              using T = std::remove_pointer_t<decltype(p)>;
              size_t used = v.size();
              if constexpr (std::is_same_v<T, std::string>)
                *p = v;
              else if constexpr (std::is_same_v<T, double>)
                *p = std::stod(v, &used);
              else if constexpr (std::is_same_v<T, uint64_t>)
                *p = std::stoull(v, &used);
              else
                *p = static_cast<T>(std::stoll(v, &used));
              if (used != v.size()) throw std::invalid_argument(v);
            },
            b->second);
      } catch (const std::logic_error&) {
        fail("bad value for " + k + ": '" + v + "'");
      }
    }
  }
  [[noreturn]] void fail(const std::string& msg) const {
    std::fprintf(stderr, "%s: %s\nusage: %s %s\n", program_.c_str(), msg.c_str(), program_.c_str(),
                 usage_.c_str());
    std::exit(2);
  }

 private:
  std::string program_, usage_;
  std::map<std::string, std::variant<std::string*, double*, int64_t*, int*, uint64_t*>> bound_;
  std::map<std::string, std::pair<bool*, bool>> switches_;
};

/// The course's mixed-precision and layout flags: `--amp` (autocast in f16 with a GradScaler on
/// a GPU, bf16 without one on the CPU), `--amp-dtype f16|bf16` to choose, `--channels-last`.
struct PrecisionFlags {
  bool amp = false;
  std::string amp_dtype;  // empty: the device's default
  bool channels_last = false;

  void add_to(Flags& f) {
    f.add_switch("--amp", &amp).add("--amp-dtype", &amp_dtype);
    f.add_switch("--channels-last", &channels_last);
  }
  /// Checks the values (after Flags::parse); exits with the usage line on a bad one.
  void check(const Flags& f) const {
    if (!amp_dtype.empty() && amp_dtype != "f16" && amp_dtype != "bf16")
      f.fail("bad value for --amp-dtype: " + amp_dtype + " (f16 or bf16)");
    if (!amp_dtype.empty() && !amp) f.fail("--amp-dtype needs --amp");
  }
  /// The autocast dtype on `d`.
  DType dtype(Device d) const {
    if (amp_dtype.empty()) return amp::default_autocast_dtype(d.type);
    return amp_dtype == "f16" ? DType::f16 : DType::bf16;
  }
  /// The autocast region of a forward pass on `d` (a disabled region without --amp).
  amp::autocast region(Device d) const { return amp::autocast(d.type, dtype(d), amp); }
  /// Loss scaling is for f16 only: bf16 has f32's range, and f32 needs none.
  amp::GradScalerOptions scaler_options(Device d) const {
    return {.enabled = amp && dtype(d) == DType::f16};
  }
  MemoryFormat format() const {
    return channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  }
  /// "f32", "amp-bf16" or "amp-f16".
  std::string precision(Device d) const {
    return amp ? (dtype(d) == DType::f16 ? "amp-f16" : "amp-bf16") : "f32";
  }
  const char* layout() const { return channels_last ? "channels-last" : "contiguous"; }
  /// "precision amp-bf16, layout channels-last, loss scaling off".
  std::string describe(Device d) const {
    return "precision " + precision(d) + ", layout " + layout() + ", loss scaling " +
           (scaler_options(d).enabled ? "on" : "off");
  }
};

/// Prints the loss scale whenever it differs from the last one printed (a disabled scaler
/// prints nothing). Reading the scale synchronises with the device.
class ScaleLog {
 public:
  void operator()(const amp::GradScaler& s, int64_t step) {
    if (!s.is_enabled()) return;
    const double v = s.get_scale();
    if (v != last_) {
      std::printf("  loss scale %g at step %lld\n", v, static_cast<long long>(step));
      last_ = v;
    }
  }

 private:
  double last_ = 0;
};

/// The sinks of `--metrics FILE` (JSON lines when FILE ends in .jsonl, else CSV) and
/// `--tensorboard DIR`; a resumed run appends to the file. Rank 0 writes (MetricsWriter).
inline train::MetricsOptions metrics_options(const std::string& file, const std::string& tb_dir,
                                             bool append) {
  const bool jsonl = file.size() > 6 && file.ends_with(".jsonl");
  return {.csv = jsonl ? "" : file,
          .jsonl = jsonl ? file : "",
          .tensorboard = tb_dir,
          .append = append};
}

/// `--resume-lr-scaling keep|linear|sqrt`: what the learning rate does when a run resumes a
/// checkpoint written with another global batch (other ranks or per-rank batch).
inline train::LRScaling parse_lr_scaling(const Flags& f, const std::string& v) {
  if (v == "keep") return train::LRScaling::Keep;
  if (v == "linear") return train::LRScaling::Linear;
  if (v == "sqrt") return train::LRScaling::Sqrt;
  f.fail("bad value for --resume-lr-scaling: '" + v + "' (keep, linear or sqrt)");
}

/// The --checkpoint file of an example: resumes from it (--resume), saves to it (rank 0 writes,
/// every rank waits until the file is complete), and stops for a requeue when Slurm signals
/// the wall time (`--signal=USR1@T`) or a preemption or scancel (SIGTERM). The signal handler
/// exists only with a file (without one there is nothing to resume from, and the signals keep
/// their default action). An empty path makes every call a no-op.
///
/// The data position is saved in samples of the epoch over all ranks, with the run's global
/// batch (per-rank batch x ranks), so a job resumes on any number of ranks or with another
/// per-rank batch: the rest of the same epoch order, each sample once, and the learning rate
/// scaled as `lr_scaling` says (train::resume_data_position).
class CheckpointFile {
 public:
  CheckpointFile(std::string path, nn::Module& model, optim::Optimizer& opt,
                 optim::LRScheduler& sched, amp::GradScaler& scaler,
                 std::map<std::string, std::string> metadata, int64_t global_batch,
                 train::LRScaling lr_scaling = train::LRScaling::Keep)
      : path_(std::move(path)),
        model_(model),
        opt_(opt),
        sched_(sched),
        scaler_(scaler),
        metadata_(std::move(metadata)),
        global_batch_(global_batch),
        lr_scaling_(lr_scaling) {
    if (!path_.empty()) preempt_.emplace();
  }
  /// With `asked` and an existing file: loads everything, prints where training resumes and
  /// (when the global batch changed) what changed; otherwise the position of a fresh start.
  /// Pass the position to the loader: set_epoch(p.epoch), then set_start_sample(
  /// p.samples_in_epoch).
  train::ResumePosition resume(bool asked) {
    train::ResumePosition& r = start_;
    r.saved_global_batch = r.global_batch = global_batch_;
    if (!asked || path_.empty() || !std::ifstream(path_).good()) return r;
    const io::TrainingProgress p = io::load_checkpoint(path_, model_, &opt_, &sched_, &scaler_);
    r = train::resume_data_position(p, global_batch_, &opt_, &sched_, {.lr_scaling = lr_scaling_});
    std::printf("resumed from %s: epoch %lld, sample %lld, step %lld\n", path_.c_str(),
                static_cast<long long>(r.epoch + 1), static_cast<long long>(r.samples_in_epoch),
                static_cast<long long>(r.step));
    return r;
  }
  /// At the top of each epoch: selects `epoch` in `loader` and, in the epoch the run resumed
  /// in, starts it after the samples already trained. Returns the number of the epoch's first
  /// batch (for progress lines).
  int64_t begin_epoch(data::DataLoader& loader, int64_t epoch) const {
    loader.set_epoch(epoch);
    const int64_t first = epoch == start_.epoch ? start_.samples_in_epoch : 0;
    loader.set_start_sample(first);
    return first / global_batch_;
  }
  /// Saves the state at `step`, `batches` batches into this iteration of `loader` in `epoch`
  /// (0-based).
  void save(int64_t epoch, int64_t step, const data::DataLoader& loader, int64_t batches) {
    const int64_t samples = loader.samples_after(batches);
    save(epoch, step, samples / global_batch_, samples);
  }
  /// Saves the state at `step`, at the start of `epoch` (after the last one's end).
  void save(int64_t epoch, int64_t step) { save(epoch, step, 0, 0); }
  /// At a step boundary, on every rank (collective with several ranks): when a preemption
  /// signal reached any rank, saves the state and returns true; the program then exits with
  /// train::kExitRequeue, which the job files in examples/resnet50/slurm/ turn into a requeue.
  bool stop_for_requeue(int64_t epoch, int64_t step, const data::DataLoader& loader,
                        int64_t batches) {
    if (!preempt_ || !preempt_->requested()) return false;
    save(epoch, step, loader, batches);
    const int sig = preempt_->signal() ? preempt_->signal() : SIGTERM;  // another rank's
    std::printf(
        "preempted by %s at epoch %lld, step %lld: state saved, exiting with %d so "
        "that the job is requeued (resume with --resume)\n",
        train::signal_name(sig), static_cast<long long>(epoch + 1), static_cast<long long>(step),
        train::kExitRequeue);
    std::fflush(stdout);
    return true;
  }
  int64_t global_batch() const { return global_batch_; }

 private:
  /// Saves the state at `step`, `batch` batches and `samples` samples (over all ranks) into
  /// `epoch` (0-based).
  void save(int64_t epoch, int64_t step, int64_t batch, int64_t samples) {
    if (path_.empty()) return;
    if (distributed::is_main_process())
      io::save_checkpoint(path_, model_, &opt_, &sched_, &scaler_,
                          {.epoch = epoch,
                           .step = step,
                           .batch_in_epoch = batch,
                           .samples_in_epoch = samples,
                           .global_batch = global_batch_},
                          metadata_);
    distributed::barrier();
    std::printf("checkpoint: %s (epoch %lld, sample %lld, step %lld)\n", path_.c_str(),
                static_cast<long long>(epoch + 1), static_cast<long long>(samples),
                static_cast<long long>(step));
  }
  std::string path_;
  nn::Module& model_;
  optim::Optimizer& opt_;
  optim::LRScheduler& sched_;
  amp::GradScaler& scaler_;
  std::map<std::string, std::string> metadata_;
  int64_t global_batch_;
  train::LRScaling lr_scaling_;
  train::ResumePosition start_;
  std::optional<train::PreemptionHandler> preempt_;
};

/// The course's profiler flags: `--profile FILE.json` profiles `--profile-steps N` (5) training
/// steps after `--profile-warmup N` (2) steps of this run, then writes the Chrome trace to FILE
/// and prints the ops table; `--profile-shapes` records input shapes.
struct ProfileFlags {
  std::string path;
  int64_t steps = 5;
  int64_t warmup = 2;
  bool shapes = false;
  void add_to(Flags& f) {
    f.add("--profile", &path).add("--profile-steps", &steps).add("--profile-warmup", &warmup);
    f.add_switch("--profile-shapes", &shapes);
  }
  /// Checks the values (after Flags::parse); exits with the usage line on a bad one.
  void check(const Flags& f) const {
    if (steps <= 0) f.fail("--profile-steps must be positive");
    if (warmup < 0) f.fail("--profile-warmup must be >= 0");
    if (!path.empty() && !path.ends_with(".json"))
      f.fail("--profile takes a FILE.json for the Chrome trace (got '" + path + "')");
  }
};

/// Runs train::Profiler over a window of training steps (rank 0 only): call begin_step() before
/// and end_step() after each step; the trace is written and the table printed when the window
/// closes, or at finish() when the run ends inside it.
class StepProfiler {
 public:
  StepProfiler(const ProfileFlags& flags, bool main_process)
      : flags_(flags), on_(!flags.path.empty() && main_process) {}
  void begin_step() {
    if (on_ && !prof_ && !written_ && seen_ == flags_.warmup)
      prof_.emplace(train::ProfilerOptions{.record_shapes = flags_.shapes});
  }
  void end_step() {
    ++seen_;
    if (prof_ && seen_ == flags_.warmup + flags_.steps) finish();
  }
  /// Writes the trace and prints the table if the profiler ran.
  void finish() {
    if (!prof_) return;
    prof_->stop();
    const int64_t n = seen_ - flags_.warmup;
    std::printf("profile: %lld training steps after %lld warm-up steps\n%s",
                static_cast<long long>(n), static_cast<long long>(flags_.warmup),
                prof_->table(15).c_str());
    prof_->write_chrome_trace(flags_.path);
    std::printf("profile: wrote %s (open it in https://ui.perfetto.dev or chrome://tracing)\n",
                flags_.path.c_str());
    prof_.reset();
    written_ = true;
  }

 private:
  ProfileFlags flags_;
  bool on_;
  int64_t seen_ = 0;
  bool written_ = false;
  std::optional<train::Profiler> prof_;
};

/// Where the metrics file is and how to plot it (one line per file).
inline void print_metrics_hint(const std::vector<std::string>& paths) {
  for (const std::string& path : paths)
    if (path.find("tfevents") == std::string::npos)  // not TensorBoard's
      std::printf("plot: tools/dltrain-plot %s\n", path.c_str());
}

}  // namespace dltrain::examples
