// Process groups: collectives across the ranks of a job, and the global state that
// distributed::init() sets up.
//
// A ProcessGroup runs collectives on tensors in place: all_reduce, broadcast, all_gather,
// reduce_scatter, barrier. Each returns a Work handle at once; the collective runs behind it
// (on the group's communication thread for MPI, on the group's CUDA stream for NCCL), so
// callers overlap it with computation and call wait() before reading the result. Every rank
// must issue the same collectives in the same order with tensors of the same size and dtype.
//
// Point to point: send(t, dst, tag) / recv(t, src, tag) between two ranks of a group (what
// pipeline parallelism moves activations with). They too return a Work at once; a send is
// matched by the recv on `dst` naming this rank and the same tag, and two messages with the same
// (source, tag) arrive in the order they were sent. Unlike collectives they need not be issued
// in the same order on every rank: MPI posts them without blocking (a send and a recv pending at
// once never deadlock each other), and they count against the same timeout.
//
// Sub-groups: split(color, key) (MPI_Comm_split's semantics) and new_group(ranks) build groups
// over a subset of a group's ranks, so data, pipeline and tensor parallelism combine on one job;
// RankLayout (rank_layout.hpp) builds the usual ones.
//
// Backends: "mpi" (CPU tensors; CUDA tensors are passed to a CUDA-aware MPI as they are, else
// staged through pinned host memory: mpi_cuda_aware()), "nccl" (CUDA
// tensors; its unique id bootstrapped over MPI, or over a TCP rendezvous on
// MASTER_ADDR:MASTER_PORT without MPI), and "local" (a world of one: every collective is
// the identity, no MPI needed).
//
// Hangs are errors: a collective that has not completed within the group's timeout (default
// 10 minutes, DLTRAIN_COLLECTIVE_TIMEOUT=seconds) prints which collective, rank and sizes
// and aborts the whole job. A rank that dies of an uncaught exception after init() takes the
// job down too (MPI_Abort), printing its message once; programs that catch errors at the top
// should call distributed::abort(message) rather than return, so that no rank is left waiting.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dltrain/core/device.hpp"
#include "dltrain/core/tensor.hpp"
#include "dltrain/distributed/env.hpp"

namespace dltrain::distributed {

/// How all_reduce / reduce_scatter combine values. Avg is Sum divided by the group size
/// (floating dtypes only). On bool tensors Sum and Max are logical or, Min logical and.
enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);

/// Handle on a collective in flight. A default-constructed Work is already complete.
class Work {
 public:
  struct State;
  Work() = default;
  explicit Work(std::shared_ptr<State> s) : s_(std::move(s)) {}
  /// Blocks until the collective is done and its result may be read; rethrows its error.
  /// NCCL: the host returns once the current CUDA stream is ordered after the collective
  /// (as PyTorch's Work.wait()); read results with stream-ordered ops as usual.
  void wait() const;
  /// True when the collective has finished (never blocks).
  bool is_completed() const;

 private:
  std::shared_ptr<State> s_;
};

/// A set of ranks that run collectives together.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// "mpi", "nccl" or "local".
  virtual const char* backend() const = 0;
  /// Where this group's collectives want their tensors: cuda:N for NCCL, the CPU otherwise
  /// (the MPI group also accepts CUDA tensors, staged through host memory).
  virtual Device tensor_device() const { return Device::cpu(); }
  /// Seconds after which a collective that has not completed aborts the job.
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// Reduces `t` across ranks, in place. `t` must be dense (no gaps or overlaps: contiguous,
  /// channels-last or another permutation).
  virtual Work all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  /// Copies `t` of rank `root` into `t` of every rank.
  virtual Work broadcast(const Tensor& t, int root = 0) = 0;
  /// Gathers every rank's `input` into `output`, whose numel is size() * input.numel()
  /// (rank r's values at [r * n, (r + 1) * n) of the contiguous output).
  virtual Work all_gather(const Tensor& output, const Tensor& input) = 0;
  /// Reduces `input` (numel size() * output.numel()) across ranks and leaves block `rank()`
  /// of the result in `output`.
  virtual Work reduce_scatter(const Tensor& output, const Tensor& input,
                              ReduceOp op = ReduceOp::Sum) = 0;
  /// Completes when every rank has called it.
  virtual Work barrier() = 0;

  /// Sends the dense tensor `t` (any dtype) to rank `dst` of this group, where the recv(..., src
  /// = this rank, tag) with as many elements of the same dtype receives it. `t` must not change
  /// until the Work completes. `tag` is in [0, max_tag()]. Throws dltrain::Error for a rank out
  /// of range, a send to this rank itself, or a tensor that is not dense; a receiver expecting
  /// another number of bytes fails its wait(). NCCL: ncclSend on the group's stream (untested:
  /// no machine with two GPUs has run it yet; the NCCL group has no tags, `tag` is only checked).
  virtual Work send(const Tensor& t, int dst, int tag = 0);
  /// Receives into the dense tensor `t` what rank `src` sends with `tag`. wait() throws when
  /// the message holds another number of elements than `t` (both sides must agree on shapes).
  virtual Work recv(const Tensor& t, int src, int tag = 0);
  // (The three have default implementations that throw, naming the backend, so that a group
  // written outside the library for collectives only, such as a test double, still compiles.)
  /// The largest tag send/recv accept (MPI's MPI_TAG_UB, at least 32767).
  virtual int max_tag() const { return 32767; }

  /// Splits this group as MPI_Comm_split does: the ranks passing the same `color` (>= 0) form
  /// one new group, ranked by (`key`, rank in this group); a rank passing a negative color
  /// belongs to none and gets nullptr. Collective over this group: every rank calls it, in the
  /// same order relative to its other collectives. The new group has this group's timeout and
  /// its own communication resources (MPI: a communicator and a thread; NCCL: ncclCommSplit,
  /// untested on GPUs).
  virtual std::shared_ptr<ProcessGroup> split(int color, int key);

 protected:
  ProcessGroup(int rank, int size, std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), timeout_(timeout) {}

 private:
  int rank_, size_;
  std::chrono::milliseconds timeout_;
};

/// Which backend init() builds the default group with.
enum class Backend {
  /// NCCL when this process trains on a GPU and NCCL is built in, else MPI when the world has
  /// more than one rank, else local.
  Auto,
  MPI,
  NCCL,
  Local,
};

struct InitOptions {
  Backend backend = Backend::Auto;
  /// Collective timeout; 0 = DLTRAIN_COLLECTIVE_TIMEOUT seconds, or 10 minutes.
  std::chrono::milliseconds timeout{0};
  /// Pick cuda:local_rank (select_gpu) when GPUs are visible and make it current.
  bool use_gpu = true;
  /// Set the CPU thread count to this rank's share of the CPUs it may use (unless
  /// DLTRAIN_NUM_THREADS or set_num_threads chose it): ranks that share CPUs split them.
  bool set_threads = true;
  /// Print one line per rank describing the launch (rank 0 prints the job summary).
  bool verbose = false;
};

/// Detects the launch (detect_environment), starts MPI when the job needs it, checks the
/// ranks agree (world size, one GPU per rank), picks the device and builds the default
/// group. Calling it again returns the same group; a world of one needs no MPI at all.
/// Throws dltrain::Error naming the variables and the fix when the launch is inconsistent.
ProcessGroup& init(const InitOptions& options = {});
bool is_initialized();
/// The default group; throws when init() has not run.
ProcessGroup& default_group();
/// The launch as detected (with MPI's sizes filled in for a bare PMIx launch).
const Environment& environment();
/// Shortcuts over environment(); a world of one before init().
int rank();
int world_size();
int local_rank();
int local_world_size();
int node_id();
/// True on rank 0 (print, write checkpoints).
bool is_main_process();
/// The device this rank trains on: cuda:N chosen by init(), or the CPU.
Device device();
/// Waits for every rank (on the default group). No-op in a world of one.
void barrier();
/// Prints "dltrain: rank R: message" to stderr once and ends the whole job with exit code
/// `code` (MPI_Abort in a distributed job, std::exit otherwise). Never returns.
[[noreturn]] void abort(const std::string& message, int code = 1);
/// Ends MPI cleanly after a barrier (run at exit too). Collectives are invalid afterwards.
void finalize();

/// Runs `fn` on rank 0 only while every other rank waits for it to finish: the way to write a
/// report or a log once (`on_main_process([&] { io::save_checkpoint(path, ...); });`), after
/// which every rank may read what rank 0 wrote. Collective: every rank calls it. When `fn`
/// throws on rank 0, rank 0 rethrows its exception and every other rank throws
/// dltrain::Error with rank 0's message, so no rank is left waiting for the others and a
/// caller that catches sees the failure on every rank. A world of one (or no init()) just
/// runs `fn`.
void on_main_process(const std::function<void()>& fn);

/// Sums (or reduces with `op`) a value across the ranks of the default group: the usual way
/// to report a global loss or accuracy. Returns the value itself in a world of one.
double all_reduce_value(double value, ReduceOp op = ReduceOp::Sum);

/// A process group of one rank (every collective is the identity); what a single-process
/// run uses.
std::shared_ptr<ProcessGroup> new_local_group(std::chrono::milliseconds timeout);
/// A group over MPI_COMM_WORLD (MPI must be initialised; init() does it). Throws when this
/// build has no MPI.
std::shared_ptr<ProcessGroup> new_mpi_group(std::chrono::milliseconds timeout);
/// An NCCL group of `size` ranks on CUDA device `device` whose unique id comes from
/// `bootstrap`: rank 0 creates the id (`bytes` filled in), the function must deliver rank 0's
/// bytes to every rank and return them. Throws when this build has no NCCL.
std::shared_ptr<ProcessGroup> new_nccl_group(
    int rank, int size, int device, std::chrono::milliseconds timeout,
    const std::function<std::string(const std::string& bytes)>& bootstrap);
/// Delivers rank 0's `bytes` to every rank over TCP: rank 0 listens on `port` (all
/// interfaces), the others connect to `addr:port` (retrying until `timeout`). Used to
/// bootstrap NCCL without MPI; any blob works, which is how it is tested.
std::string tcp_broadcast_bytes(const std::string& addr, int port, int rank, int size,
                                const std::string& bytes, std::chrono::milliseconds timeout);
/// True when this build has MPI / NCCL process groups.
bool mpi_available();
bool nccl_available();
/// True when the MPI group passes CUDA device pointers to MPI as they are (a CUDA-aware MPI):
/// DLTRAIN_MPI_CUDA_AWARE=1 or 0 when set, else what the library reports at run time
/// (Open MPI's MPIX_Query_cuda_support(), MPICH's MPIX_GPU_query_support), else false. When
/// false, CUDA tensors are staged through pinned host memory. False without MPI.
bool mpi_cuda_aware();

/// A group of the ranks `ranks` (ranks of `parent`, default the default group), in that order:
/// rank i of the new group is ranks[i]. As torch.distributed.new_group, every rank of `parent`
/// must call it, with the same list, in the same order relative to the other collectives;
/// ranks not in the list get nullptr. Throws dltrain::Error on every rank when the list has a
/// duplicate or a rank out of range, is empty, or differs between ranks.
std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                        ProcessGroup* parent = nullptr);

/// The collective timeout from DLTRAIN_COLLECTIVE_TIMEOUT (seconds), or 10 minutes.
std::chrono::milliseconds default_timeout();

}  // namespace dltrain::distributed
