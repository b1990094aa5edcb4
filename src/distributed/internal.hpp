// Internals shared by the process-group backends: the Work state, the MPI runtime seam
// (implemented by mpi_group.cpp, or by mpi_stub.cpp in builds without MPI), and argument
// checks. No MPI or CUDA types appear here.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "dltrain/distributed/process_group.hpp"

namespace dltrain::distributed {

/// Completion state of one collective. The default implementation is completed by a
/// communication thread (complete()); NCCL's overrides wait/completed with CUDA events.
struct Work::State {
  virtual ~State() = default;
  virtual void wait();
  virtual bool completed() const { return done.load(std::memory_order_acquire); }
  /// Called by the thread that ran the collective.
  void complete(std::exception_ptr e = nullptr);

  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  std::exception_ptr error;
  /// Runs once on the waiting thread after completion (copy a staged result back).
  std::function<void()> on_wait;
  bool on_wait_ran = false;
};

namespace detail {

/// Rank 0's string on every rank of `g` (two blocking broadcasts: length, then bytes).
std::string broadcast_string(ProcessGroup& g, const std::string& s);

/// "all_reduce(sum) of 1024 f32 elements (4.0 KiB)": what a timeout message names.
std::string describe_collective(const char* name, const Tensor& t, const char* extra = nullptr);
/// "5 s", "0.5 s", "600 s".
std::string seconds_str(double s);
/// Avg needs a floating dtype (`op` names the collective).
void check_reduce_op(const char* op, ReduceOp r, DType dt);
/// `big` (all_gather's output, reduce_scatter's input) has `group_size` times the elements of
/// `small`, and the same dtype and device.
void check_gather_pair(const char* op, const Tensor& big, const Tensor& small, int group_size);
/// Checks a collective's tensor: defined, dense (contiguous or channels-last, or contiguous
/// only when `contiguous_only`), on the expected device kind.
void check_collective_tensor(const char* op, const Tensor& t, bool contiguous_only);
/// Checks a send/recv: `t` dense, `peer` a rank of the group other than `self`, `tag` in
/// [0, max_tag]. `op` is "send" or "recv", `peer_name` "dst" or "src".
void check_p2p(const char* op, const Tensor& t, int peer, const char* peer_name, int tag,
               const ProcessGroup& g);
/// "send of 12 f64 elements (96 bytes, shape [3, 4], on cpu) to rank 1 (tag 7)".
std::string describe_p2p(const char* op, const Tensor& t, int peer, int tag);

// --- the MPI runtime (mpi_group.cpp / mpi_stub.cpp) ----------------------------------
bool mpi_compiled();
/// MPI_Init_thread(MPI_THREAD_MULTIPLE) unless MPI is already initialised; throws when the
/// library cannot give at least MPI_THREAD_SERIALIZED.
void mpi_init();
bool mpi_initialized();
int mpi_world_rank();
int mpi_world_size();
/// Rank and size among the ranks on this node (MPI_Comm_split_type SHARED).
int mpi_node_rank();
int mpi_node_size();
/// This node's index (nodes numbered by their lowest world rank) and the number of nodes.
void mpi_node_index(int& node, int& nodes);
/// Blocking all-gather of one string per rank over MPI_COMM_WORLD (init-time checks).
std::vector<std::string> mpi_allgather_strings(const std::string& mine);
/// The same over the ranks of this node.
std::vector<std::string> mpi_node_allgather_strings(const std::string& mine);
/// Blocking broadcast of rank 0's bytes (NCCL's unique id).
std::string mpi_broadcast_bytes(const std::string& bytes);
[[noreturn]] void mpi_abort(int code);
void mpi_finalize();

/// A rank's CPU threads: the `mask_cpus` of its affinity mask divided among the
/// `ranks_sharing` node-local ranks whose masks overlap it, at most `usable` (usable_cpus():
/// the mask capped by SLURM_CPUS_PER_TASK, which is already this task's share), at least 1.
int rank_thread_share(int mask_cpus, int ranks_sharing, int usable);

/// Prints "dltrain: rank R: message" once per process (later calls print nothing).
void print_fatal_once(const std::string& message);

/// An error a communication thread caught (the NCCL watchdog's event query after a sticky
/// CUDA error): printed once on stderr, kept, and raised as dltrain::Error on the caller's
/// side by the next wait() or collective. An exception escaping the thread would end the
/// process in std::terminate without a word about the fault.
class DeferredError {
 public:
  /// Keeps `message` and prints "dltrain: rank R of N (host): message" on stderr; only the
  /// first call does either (returns whether this call was it).
  bool set(const std::string& message);
  bool is_set() const;
  /// Throws dltrain::Error "<op>: <message>" when a message was kept.
  void throw_if_set(const std::string& op) const;

 private:
  mutable std::mutex mu_;
  std::string message_;
  bool set_ = false;
};

/// A watchdog's poll: pops the entries at the front of `pending` while `completed(front)` says
/// they are done. When `completed` throws, the error goes into `error` as "<thread>: checking
/// <describe(front)> failed: <what>. <advice>" and false is returned (the caller stops
/// watching: the fault is reported, and a timeout message about entries that can no longer
/// complete would only hide it); true otherwise.
template <class Queue, class Completed, class Describe>
bool retire_completed(Queue& pending, Completed&& completed, Describe&& describe,
                      DeferredError& error, const std::string& thread, const std::string& advice) {
  try {
    while (!pending.empty() && completed(pending.front())) pending.pop_front();
    return true;
  } catch (const std::exception& e) {
    error.set(thread + ": checking " + describe(pending.front()) + " failed: " + e.what() + ". " +
              advice);
    return false;
  }
}

}  // namespace detail
}  // namespace dltrain::distributed
