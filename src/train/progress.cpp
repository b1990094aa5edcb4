// train::Progress: a live bar on a terminal, plain lines elsewhere (see the header for the
// format). The rate shown is over the current window of `every` steps (the previous window's
// while the current one is still empty), so a slow-down shows up within one window.
#include "dltrain/train/progress.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>

#include "dltrain/core/error.hpp"
#include "dltrain/distributed/env.hpp"

namespace dltrain::train {

namespace {

std::string duration_text(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s / 3600),
                  static_cast<int>(s / 60) % 60);
  return buf;
}

}  // namespace

Progress::Progress(ProgressOptions options) : options_(std::move(options)) {
  DLTRAIN_CHECK(options_.total_steps >= 0 && options_.every >= 0, "train::Progress: total_steps ",
                options_.total_steps, " and every ", options_.every, " must be 0 or more");
  DLTRAIN_CHECK(options_.out != nullptr, "train::Progress: null output stream");
  if (options_.every == 0)
    options_.every =
        options_.total_steps > 0 ? std::max<int64_t>(1, options_.total_steps / 10) : 100;
  // Under a launcher (mpirun, srun, torchrun) plain lines even when stdout is a terminal: Open
  // MPI hands every rank a pseudo-terminal whatever mpirun's own output is (a file, a pipe).
  const bool ask_env = options_.rank < 0 || options_.tty < 0;
  const distributed::Environment env =
      ask_env ? distributed::detect_environment() : distributed::Environment{};
  const int rank = options_.rank >= 0 ? options_.rank : env.rank;
  enabled_ = rank == 0;
  live_ = options_.tty < 0
              ? isatty(fileno(options_.out)) == 1 && env.launcher == distributed::Launcher::Single
              : options_.tty == 1;
  begin();
}

Progress::~Progress() {
  try {
    end();
  } catch (...) {  // a destructor must not throw; end() only writes to a stream
  }
}

double Progress::now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Progress::begin(int64_t epoch) {
  epoch_ = epoch;
  step_ = last_print_step_ = samples_ = last_print_samples_ = 0;
  start_ = last_print_time_ = now();
  last_redraw_ = -1e300;
  interval_rate_ = interval_sample_rate_ = 0;
  loss_.reset();
  lr_.reset();
  open_line_ = false;
}

std::string Progress::line() const {
  const double t = now();
  const int64_t total = options_.total_steps;
  std::string s;
  char buf[160];
  if (live_ && total > 0) {
    constexpr int width = 20;
    const int filled =
        static_cast<int>(width * std::min<double>(1.0, static_cast<double>(step_) / total));
    s += '[';
    s.append(static_cast<size_t>(filled), '#');
    s.append(static_cast<size_t>(width - filled), '.');
    s += "] ";
  }
  s += options_.label;
  if (epoch_ >= 0) {
    s += " epoch ";
    s += std::to_string(epoch_);
  }
  if (total > 0) {
    std::snprintf(buf, sizeof buf, " step %lld/%lld (%.1f%%)", static_cast<long long>(step_),
                  static_cast<long long>(total), 100.0 * static_cast<double>(step_) / total);
  } else {
    std::snprintf(buf, sizeof buf, " step %lld", static_cast<long long>(step_));
  }
  s += buf;
  // The rate over the current window, or the previous window's while this one is empty.
  const double window = t - last_print_time_;
  double rate = interval_rate_, sample_rate = interval_sample_rate_;
  if (step_ > last_print_step_ && window > 0) {
    rate = static_cast<double>(step_ - last_print_step_) / window;
    sample_rate = static_cast<double>(samples_ - last_print_samples_) / window;
  }
  if (rate > 0) {
    std::snprintf(buf, sizeof buf, " | %.2f step/s", rate);
    s += buf;
    if (sample_rate > 0) {
      std::snprintf(buf, sizeof buf, ", %.1f samples/s", sample_rate);
      s += buf;
    }
  }
  if (loss_) {
    std::snprintf(buf, sizeof buf, " | loss %.4f", *loss_);
    s += buf;
  }
  if (lr_) {
    std::snprintf(buf, sizeof buf, " | lr %.3g", *lr_);
    s += buf;
  }
  const double elapsed = t - start_;
  s += " | elapsed " + duration_text(elapsed);
  if (total > 0 && step_ > 0 && elapsed > 0) {
    const double avg = static_cast<double>(step_) / elapsed;
    s += " ETA " + duration_text(static_cast<double>(total - step_) / avg);
  }
  return s;
}

void Progress::print_plain() {
  const std::string l = line();
  std::fprintf(options_.out, "%s\n", l.c_str());
  std::fflush(options_.out);
}

void Progress::redraw() {
  const std::string l = line();
  // \r back to column 0, ESC[K clears what a longer previous line left.
  std::fprintf(options_.out, "\r%s\x1b[K", l.c_str());
  std::fflush(options_.out);
  open_line_ = true;
}

void Progress::update(int64_t step, std::optional<double> loss, std::optional<double> lr,
                      int64_t samples) {
  DLTRAIN_CHECK(step >= 0 && samples >= 0, "train::Progress::update: step ", step, " and samples ",
                samples, " must be 0 or more");
  step_ = step;
  samples_ += samples;
  loss_ = loss;
  lr_ = lr;
  if (!enabled_) return;
  const double t = now();
  const bool last = options_.total_steps > 0 && step >= options_.total_steps;
  const bool window_done = step - last_print_step_ >= options_.every;
  if (live_) {
    if (last || t - last_redraw_ >= options_.redraw_seconds) {
      redraw();
      last_redraw_ = t;
    }
  } else if (window_done || last) {
    print_plain();
  }
  if (window_done || last) {
    const double window = t - last_print_time_;
    if (window > 0 && step > last_print_step_) {
      interval_rate_ = static_cast<double>(step - last_print_step_) / window;
      interval_sample_rate_ = static_cast<double>(samples_ - last_print_samples_) / window;
    }
    last_print_step_ = step;
    last_print_samples_ = samples_;
    last_print_time_ = t;
  }
}

void Progress::end() {
  if (!enabled_) return;
  if (live_) {
    if (open_line_) {
      redraw();
      std::fprintf(options_.out, "\n");
      std::fflush(options_.out);
      open_line_ = false;
    }
  } else if (step_ > last_print_step_) {
    print_plain();
    last_print_step_ = step_;
    last_print_samples_ = samples_;
    last_print_time_ = now();
  }
}

}  // namespace dltrain::train
