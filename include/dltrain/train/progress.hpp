// train::Progress: the progress of a training loop, for a person watching a terminal and for a
// Slurm log alike.
//
// On a terminal (the stream is a tty) one live line is redrawn in place with a carriage return
// (at most `redraw_seconds` apart): a bar, step/total, rate, ETA, loss and learning rate. When
// the stream is not a tty (a Slurm log, a pipe, a file), no carriage return or escape code is
// ever written: one plain line every `every` steps and at the last step. In a distributed job
// only rank 0 prints (distributed::detect_environment), unless `rank` says otherwise.
//
// Line format (plain):
//   train epoch 2 step 120/469 (25.6%) | 12.3 step/s, 1574.4 samples/s | loss 0.4312 |
//   lr 0.01 | elapsed 9.8s ETA 28.4s
// Rates are over the steps since the previous line (the current speed); the ETA divides the
// steps left by the average rate since begin(). Not thread-safe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

namespace dltrain::train {

struct ProgressOptions {
  /// Steps in the run (or in the epoch, if begin() is called every epoch); 0 = unknown (no bar,
  /// no ETA).
  int64_t total_steps = 0;
  /// A plain line every this many steps; 0 picks ten lines per run (the course's rule) when
  /// total_steps is known, else every 100 steps.
  int64_t every = 0;
  /// The line's first word ("train", "val").
  std::string label = "train";
  /// Where to write (stdout by default).
  std::FILE* out = stdout;
  /// -1: the live bar when `out` is a terminal and no launcher (mpirun, srun, torchrun) started
  /// the process (Open MPI gives ranks a pseudo-terminal even when its output goes to a file);
  /// 0: plain lines; 1: the live bar.
  int tty = -1;
  /// This process's rank; -1: read it from the launcher's variables. Only rank 0 prints.
  int rank = -1;
  /// Seconds between redraws of the live bar.
  double redraw_seconds = 0.1;
  /// The clock in seconds (default steady_clock); tests pass their own.
  std::function<double()> clock{};
};

class Progress {
 public:
  explicit Progress(ProgressOptions options = {});
  ~Progress();

  /// (Re)starts the count: the rate and ETA are measured from here; `epoch` >= 0 is shown in
  /// the line ("epoch 2"), -1 leaves it out.
  void begin(int64_t epoch = -1);
  /// Step `step` (1-based, the steps done since begin) has ended. `loss` and `lr` are shown when
  /// given (a NaN loss prints as "loss nan": a diverged run shows in the log); `samples` (the
  /// step's batch size) adds a samples/s rate. Prints per the options.
  void update(int64_t step, std::optional<double> loss = std::nullopt,
              std::optional<double> lr = std::nullopt, int64_t samples = 0);
  /// Ends the run or epoch: on a tty, finishes the live line with a newline; otherwise prints
  /// the last line if update() did not just print it. Idempotent.
  void end();

  /// True when this process prints (rank 0).
  bool enabled() const { return enabled_; }
  /// True when the live bar is drawn (a tty).
  bool live() const { return live_; }
  /// The line as it would be printed now (without "\r" or a newline).
  std::string line() const;

 private:
  double now() const;
  void print_plain();
  void redraw();

  ProgressOptions options_;
  bool enabled_ = true, live_ = false, open_line_ = false;
  int64_t epoch_ = -1, step_ = 0, last_print_step_ = 0, samples_ = 0, last_print_samples_ = 0;
  double start_ = 0, last_print_time_ = 0, last_redraw_ = -1e300;
  std::optional<double> loss_, lr_;
  double interval_rate_ = 0, interval_sample_rate_ = 0;
};

}  // namespace dltrain::train
