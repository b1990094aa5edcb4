// train::Chronometer: marks on a steady clock, synchronised with the CUDA device when the step
// runs there; statistics over the steps after warm-up; JSON through nlohmann/json.
#include "dltrain/train/chronometer.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/core/memory.hpp"
#include "dltrain/distributed/process_group.hpp"
#include "src/train/json_util.hpp"

namespace dltrain::train {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Data:
      return "data";
    case Phase::Forward:
      return "forward";
    case Phase::Backward:
      return "backward";
    case Phase::Optimizer:
      return "optimizer";
  }
  return "?";
}

Stats compute_stats(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.count = static_cast<int64_t>(n);
  s.min = v.front();
  s.max = v.back();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  for (double x : v) s.total += x;
  s.mean = s.total / static_cast<double>(n);
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(ss / static_cast<double>(n));
  return s;
}

void DurationSeries::add(double v) {
  ++count_;
  if (count_ == 1) {
    min_ = max_ = v;
  } else {
    min_ = std::min(min_, v);
    max_ = std::max(max_, v);
  }
  total_ += v;
  const double d = v - mean_;
  mean_ += d / static_cast<double>(count_);
  m2_ += d * (v - mean_);
  if (sample_.size() < capacity_) {
    sample_.push_back(v);
    return;
  }
  // Algorithm R: the count_-th value replaces a uniform slot with probability capacity/count_.
  rng_ += 0x9E3779B97F4A7C15ull;  // splitmix64
  uint64_t z = rng_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const uint64_t j = z % static_cast<uint64_t>(count_);
  if (j < capacity_) sample_[j] = v;
}

void DurationSeries::clear() { *this = DurationSeries(capacity_); }

Stats DurationSeries::stats() const {
  Stats s = compute_stats(sample_);
  if (count_ == 0) return s;
  s.count = count_;
  s.min = min_;
  s.max = max_;
  s.total = total_;
  s.mean = mean_;
  s.std = std::sqrt(m2_ / static_cast<double>(count_));
  return s;
}

int64_t peak_host_rss_bytes() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

Chronometer::Chronometer(ChronometerOptions options) : options_(std::move(options)) {
  DLTRAIN_CHECK(options_.warmup_steps >= 0, "train::Chronometer: warmup_steps is ",
                options_.warmup_steps, "; pass 0 or more");
  if (options_.device.is_cuda())
    DLTRAIN_CHECK(cuda::is_available(), "train::Chronometer: device ", options_.device.str(),
                  " but CUDA is not available (a build without CUDA, or no GPU visible); time ",
                  "on Device::cpu() instead");
}

double Chronometer::now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Chronometer::mark_sync() const {
  if (options_.device.is_cuda() && options_.synchronize) cuda::synchronize(options_.device.index);
}

void Chronometer::begin_epoch() {
  mark_sync();
  epoch_start_ = now();
  in_epoch_ = true;
}

double Chronometer::end_epoch() {
  DLTRAIN_CHECK(in_epoch_, "train::Chronometer::end_epoch without begin_epoch; call begin_epoch ",
                "at the start of each epoch");
  mark_sync();
  const double t = now() - epoch_start_;
  epoch_times_.add(t);
  in_epoch_ = false;
  return t;
}

void Chronometer::begin_step() {
  mark_sync();
  step_start_ = last_lap_ = now();
  current_.fill(0);
  lapped_.fill(false);
  in_step_ = true;
}

void Chronometer::lap(Phase phase) {
  DLTRAIN_CHECK(in_step_, "train::Chronometer::lap(", phase_name(phase),
                ") outside a step; call begin_step() first");
  mark_sync();
  const double t = now();
  const int i = static_cast<int>(phase);
  current_[i] += t - last_lap_;
  lapped_[i] = true;
  last_lap_ = t;
}

double Chronometer::end_step(int64_t samples) {
  DLTRAIN_CHECK(in_step_, "train::Chronometer::end_step without begin_step");
  DLTRAIN_CHECK(samples >= 0, "train::Chronometer::end_step: samples is ", samples,
                "; pass the batch size (or 0)");
  mark_sync();
  const double t = now() - step_start_;
  in_step_ = false;
  ++steps_;
  if (steps_ > options_.warmup_steps) {
    step_times_.add(t);
    measured_samples_ += samples;
    for (int i = 0; i < kNumPhases; ++i)
      if (lapped_[i]) phase_times_[i].add(current_[i]);
  }
  return t;
}

const std::vector<double>& Chronometer::phase_times(Phase phase) const {
  return phase_times_[static_cast<int>(phase)].sample();
}

void Chronometer::reset() {
  for (auto& v : phase_times_) v.clear();
  step_times_.clear();
  epoch_times_.clear();
  steps_ = measured_samples_ = 0;
  in_step_ = in_epoch_ = false;
}

ChronometerSummary Chronometer::summary() const {
  ChronometerSummary s;
  s.steps = steps_;
  s.measured_steps = step_times_.count();
  for (int i = 0; i < kNumPhases; ++i) s.phases[i] = phase_times_[i].stats();
  s.step = step_times_.stats();
  s.epoch = epoch_times_.stats();
  if (s.step.total > 0)
    s.samples_per_second = static_cast<double>(measured_samples_) / s.step.total;
  s.peak_host_rss_bytes = peak_host_rss_bytes();
  s.peak_device_bytes = static_cast<int64_t>(max_memory_allocated(options_.device));
  s.device = options_.device.str();
  return s;
}

std::string Chronometer::table(const std::string& title) const {
  const ChronometerSummary s = summary();
  std::string out;
  char line[256];
  if (!title.empty()) out += "chronometer: " + title + "\n";
  std::snprintf(line, sizeof line, "chronometer over %lld steps (%lld warm-up left out), ms:\n",
                static_cast<long long>(s.measured_steps),
                static_cast<long long>(s.steps - s.measured_steps));
  out += line;
  std::snprintf(line, sizeof line, "  %-32s %9s %9s %9s %9s\n", "", "min", "median", "std", "max");
  out += line;
  auto row = [&](const std::string& name, const Stats& st) {
    if (st.count == 0) return;
    std::snprintf(line, sizeof line, "  %-32s %9.2f %9.2f %9.2f %9.2f\n", name.c_str(),
                  1e3 * st.min, 1e3 * st.median, 1e3 * st.std, 1e3 * st.max);
    out += line;
  };
  static const char* labels[kNumPhases] = {"data wait", "forward (incl. loss)", "backward",
                                           "optimizer step"};
  for (int i = 0; i < kNumPhases; ++i) row(labels[i], s.phases[i]);
  row("whole step", s.step);
  row("epoch", s.epoch);
  if (s.samples_per_second > 0) {
    std::snprintf(line, sizeof line, "  throughput %.1f samples/s", s.samples_per_second);
    out += line;
    // The samples this process timed: in a data-parallel job the job's throughput is the
    // ranks' sum, which an example prints beside it; say whose figure this is.
    if (distributed::is_initialized() && distributed::world_size() > 1) {
      std::snprintf(line, sizeof line, " on this rank (of %d)", distributed::world_size());
      out += line;
    }
    out += "\n";
  }
  std::snprintf(line, sizeof line, "  peak host memory (RSS) %.1f MiB",
                static_cast<double>(s.peak_host_rss_bytes) / 1048576.0);
  out += line;
  std::snprintf(line, sizeof line, ", peak %s tensor memory %.1f MiB", s.device.c_str(),
                static_cast<double>(s.peak_device_bytes) / 1048576.0);
  out += line;
  out += "\n";
  return out;
}

namespace {
nlohmann::json stats_json(const Stats& s) {
  return {{"count", s.count},
          {"min_s", json_number(s.min)},
          {"median_s", json_number(s.median)},
          {"mean_s", json_number(s.mean)},
          {"std_s", json_number(s.std)},
          {"max_s", json_number(s.max)},
          {"total_s", json_number(s.total)}};
}
}  // namespace

std::string Chronometer::json() const {
  const ChronometerSummary s = summary();
  nlohmann::json j;
  j["device"] = s.device;
  j["steps"] = s.steps;
  j["measured_steps"] = s.measured_steps;
  j["warmup_steps"] = options_.warmup_steps;
  nlohmann::json phases = nlohmann::json::object();
  for (int i = 0; i < kNumPhases; ++i)
    if (s.phases[i].count > 0) phases[phase_name(static_cast<Phase>(i))] = stats_json(s.phases[i]);
  j["phases"] = phases;
  j["step"] = stats_json(s.step);
  j["epoch"] = stats_json(s.epoch);
  j["samples_per_second"] = json_number(s.samples_per_second);
  j["peak_host_rss_bytes"] = s.peak_host_rss_bytes;
  j["peak_device_bytes"] = s.peak_device_bytes;
  return dump_json(j);
}

}  // namespace dltrain::train
