// train::Chronometer: the course's step timing (data wait, forward, backward, optimizer step),
// per step and per epoch, with min / median / mean / std / max, the peak memory (host RSS and the
// device allocator's peak of tensor bytes, CPU or CUDA), a summary table and a JSON summary.
//
// A step is begin_step(), then one lap() per phase in the order the loop runs them (each lap
// measures the time since the previous lap or begin_step), then end_step(), which also records
// the whole step. On a CUDA device, begin_step(), every lap() and end_step() first wait for the
// device (cuda::synchronize), so a phase's time is the GPU work it launched, not the launch
// alone; that wait serialises host and device, so use the chronometer for measured runs (the
// course's --test mode), or turn `synchronize` off for a cheap host-side view. The first
// `warmup_steps` steps (allocator growth, cuDNN benchmark searches) are left out of every
// statistic. Not thread-safe: one chronometer per training loop.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dltrain/core/device.hpp"

namespace dltrain::train {

/// The phases of a training step that the chronometer times.
enum class Phase { Data, Forward, Backward, Optimizer };
inline constexpr int kNumPhases = 4;
/// "data", "forward", "backward", "optimizer".
const char* phase_name(Phase p);

/// Summary statistics of a list of durations (seconds). All zero when count is 0.
struct Stats {
  int64_t count = 0;
  double min = 0, median = 0, mean = 0, std = 0, max = 0, total = 0;
};
/// min / median (mean of the two middle values for an even count) / mean / population std / max
/// / total of `values`.
Stats compute_stats(std::vector<double> values);

/// Durations kept in bounded memory, however long the run: count, min, max, total, mean and
/// std over every value (streaming, Welford's update), and a sample for the median: every value
/// up to `capacity`, then a uniform sample of that size (reservoir sampling, Vitter's algorithm
/// R, from a fixed seed). Two series that receive values at the same steps make the same
/// replacements, so their samples stay aligned step by step.
class DurationSeries {
 public:
  static constexpr size_t kDefaultCapacity = 4096;
  explicit DurationSeries(size_t capacity = kDefaultCapacity) : capacity_(capacity) {}
  void add(double v);
  void clear();
  /// The kept values: all of them while count <= capacity, a uniform sample after.
  const std::vector<double>& sample() const { return sample_; }
  /// Values added so far.
  int64_t count() const { return count_; }
  /// Exact count, min, max, total, mean, std; the median is the sample's (exact while count <=
  /// capacity).
  Stats stats() const;

 private:
  size_t capacity_;
  std::vector<double> sample_;
  int64_t count_ = 0;
  double min_ = 0, max_ = 0, total_ = 0, mean_ = 0, m2_ = 0;
  uint64_t rng_ = 0x9E3779B97F4A7C15ull;
};

struct ChronometerOptions {
  /// The device the step runs on; a CUDA device makes the marks wait for it (see `synchronize`).
  Device device = Device::cpu();
  /// On a CUDA device, wait for the device at every mark (true: accurate GPU phase times).
  bool synchronize = true;
  /// Steps at the start of the run left out of the statistics (still counted in `steps`).
  int64_t warmup_steps = 0;
  /// The clock in seconds (default: std::chrono::steady_clock); tests pass their own.
  std::function<double()> clock{};
};

/// Everything the chronometer measured, in seconds and bytes.
struct ChronometerSummary {
  int64_t steps = 0;                     ///< steps ended, warm-up included
  int64_t measured_steps = 0;            ///< steps in the statistics (after warm-up)
  std::array<Stats, kNumPhases> phases;  ///< indexed by Phase; count 0 for a phase never lapped
  Stats step;                            ///< whole steps (begin_step to end_step)
  Stats epoch;                           ///< whole epochs (begin_epoch to end_epoch)
  double samples_per_second = 0;    ///< samples passed to end_step / time of the measured steps
  int64_t peak_host_rss_bytes = 0;  ///< the process's peak resident set (getrusage)
  /// Peak bytes of live tensors on the device (max_memory_allocated(device): the CPU
  /// allocator's on the CPU, the CUDA one's on a GPU) since the start or the last
  /// reset_peak_memory_stats: what the model's weights, activations and optimizer state cost.
  int64_t peak_device_bytes = 0;
  std::string device;  ///< "cpu", "cuda:0"
};

class Chronometer {
 public:
  explicit Chronometer(ChronometerOptions options = {});

  /// Starts an epoch (its time runs until end_epoch).
  void begin_epoch();
  /// Ends the epoch; returns its duration in seconds. Throws if no epoch was begun.
  double end_epoch();

  /// Starts a step: the next lap measures from here (usually the data wait).
  void begin_step();
  /// Ends `phase` of the current step: records the time since the previous lap or begin_step.
  /// A phase lapped twice in one step adds up. Throws if no step was begun.
  void lap(Phase phase);
  /// Ends the step (the time since begin_step), with the number of samples it processed (for
  /// the throughput). Returns the step's duration. Throws if no step was begun.
  double end_step(int64_t samples = 0);

  /// The durations of `phase` in the measured steps (seconds; a step that never lapped the phase
  /// contributes nothing): every step's up to DurationSeries::kDefaultCapacity steps, a uniform
  /// sample of that many after (so memory stays bounded over any run; the statistics' count,
  /// min, max, mean and std still cover every step). Phases lapped at every step stay aligned
  /// with each other and with step_times().
  const std::vector<double>& phase_times(Phase phase) const;
  /// The durations of the measured steps (the same bounded sample).
  const std::vector<double>& step_times() const { return step_times_.sample(); }
  const std::vector<double>& epoch_times() const { return epoch_times_.sample(); }

  /// The statistics and peak memory so far (reads the memory counters now).
  ChronometerSummary summary() const;
  /// The course's table: one row per phase and per step / epoch, min / median / std / max in
  /// ms, then throughput and peak memory. `title` (e.g. the precision and layout) heads it.
  std::string table(const std::string& title = "") const;
  /// The summary as a JSON object (text): {"steps":..,"phases":{"data":{"min_s":..},..},
  /// "peak_host_rss_bytes":..}; a non-finite number is written as null.
  std::string json() const;

  /// Forgets every measurement (the options stay): e.g. after a warm-up run.
  void reset();

 private:
  double now() const;
  void mark_sync() const;

  ChronometerOptions options_;
  std::array<DurationSeries, kNumPhases> phase_times_;
  std::array<double, kNumPhases> current_{};
  std::array<bool, kNumPhases> lapped_{};
  DurationSeries step_times_, epoch_times_;
  int64_t steps_ = 0;
  int64_t measured_samples_ = 0;
  double step_start_ = 0, last_lap_ = 0, epoch_start_ = 0;
  bool in_step_ = false, in_epoch_ = false;
};

/// The process's peak resident set size in bytes (getrusage's ru_maxrss), 0 where unknown.
int64_t peak_host_rss_bytes();

}  // namespace dltrain::train
