// train::Profiler: records every op run while it is active — forward ops ("conv2d", "linear",
// ...), autograd backward nodes ("conv2d_backward"), optimizer steps ("SGD.step") and the
// user's own ranges (train::ProfileRange) — with its CPU wall time, on every thread, and on a
// CUDA build with a GPU its GPU time through CUDA events plus an NVTX range per op, so Nsight
// Systems shows op names. The result is a Chrome trace (the "traceEvents" JSON that Perfetto and
// chrome://tracing open) and a table of the most expensive ops, like torch.profiler's
// key_averages().table().
//
// One profiler runs at a time in a process: it starts at construction and stops at stop() or
// destruction. Scopes nest on each thread; an op's self time is its time less that of the ops
// it called. With no profiler running, an op pays one relaxed atomic load and a not-taken
// branch (docs/performance.md has the measured figure). An op that calls itself (add(a, 2.0)
// calling add(a, b), an op redispatched under autocast) is one event.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dltrain::train {

struct ProfilerOptions {
  /// Record the shapes of each op's tensor inputs (the trace's "Input Shapes" argument; the
  /// table can group by them). Costs a string per op while profiling.
  bool record_shapes = false;
  /// On a CUDA build with a visible GPU: time each op with a pair of CUDA events on the current
  /// stream and push an NVTX range named after it. Ignored (off) without a GPU.
  bool cuda = true;
};

/// One recorded scope. Times in microseconds since the profiler started.
struct ProfileEvent {
  std::string name;      ///< "conv2d", "conv2d_backward", "SGD.step", a ProfileRange's name
  std::string category;  ///< "cpu_op", "backward", "optimizer" or "user_range"
  uint64_t thread = 0;   ///< OS thread id (gettid)
  double start_us = 0;
  double dur_us = 0;          ///< CPU wall time
  double self_us = 0;         ///< dur_us less the scopes directly nested in it
  uint32_t depth = 0;         ///< nesting depth on its thread (0: outermost)
  std::string shapes;         ///< input shapes ("[[8, 3, 32, 32], [16, 3, 3, 3], []]"), if recorded
  double cuda_start_us = -1;  ///< on the GPU timeline since the profiler started; -1: no GPU time
  double cuda_dur_us = -1;    ///< GPU time between the op's start and end events; -1: none
};

/// Per-name aggregate of the events (key_averages): sorted by self CPU time, largest first.
struct ProfileStat {
  std::string name;
  std::string shapes;  ///< set when grouped by shapes
  int64_t calls = 0;
  double total_us = 0;  ///< sum of durations (an op nested in itself counts twice, as PyTorch)
  double self_us = 0;   ///< sum of self times; the self times of all names add up to the profile
  double cuda_us = 0;   ///< sum of GPU times (0 without CUDA timing)
};

class Profiler {
 public:
  /// Starts profiling. Throws dltrain::Error when another profiler is already running.
  explicit Profiler(ProfilerOptions options = {});
  /// Stops if still running.
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  /// Stops recording and gathers the events (waits for the CUDA events it recorded). Scopes
  /// still open at that moment are left out. Idempotent.
  void stop();
  bool running() const { return running_; }

  /// The recorded events, ordered by thread then start time. Stops first if running.
  const std::vector<ProfileEvent>& events();
  /// Aggregates per op name (and input shapes when `group_by_shapes`), largest self time first.
  std::vector<ProfileStat> key_averages(bool group_by_shapes = false);
  /// The top `top_k` rows of key_averages as a text table: name, calls, self CPU ms and %, total
  /// CPU ms, CPU ms per call (and CUDA ms when timed), followed by the profiled wall time.
  std::string table(size_t top_k = 20, bool group_by_shapes = false);
  /// The Chrome trace as JSON text: complete ("ph": "X") events with pid, tid, ts and dur in
  /// microseconds, thread-name metadata, GPU times on a "CUDA" track.
  std::string chrome_trace_json();
  /// Writes chrome_trace_json() to `path` (parent directories created). Throws dltrain::Error
  /// naming the path when it cannot be written.
  void write_chrome_trace(const std::string& path);

 private:
  ProfilerOptions options_;
  bool running_ = false;
  int64_t start_unix_us_ = 0;
  double wall_us_ = 0;
  std::vector<ProfileEvent> events_;
};

/// Marks a named range on this thread for its lifetime ("data", "forward", ...): a user_range
/// event in the running profiler (and an NVTX range on GPU builds); nothing when none runs.
class ProfileRange {
 public:
  explicit ProfileRange(std::string_view name);
  ~ProfileRange();
  ProfileRange(const ProfileRange&) = delete;
  ProfileRange& operator=(const ProfileRange&) = delete;

 private:
  bool on_ = false;
};

}  // namespace dltrain::train
