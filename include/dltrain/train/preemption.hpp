// Preemption and wall-time signals: Slurm sends SIGUSR1 (`#SBATCH --signal=USR1@120`) some
// time before the wall-time limit, and SIGTERM when it preempts or cancels a job (then SIGKILL
// after KillWait, 30 s by default). A PreemptionHandler turns those signals into a flag that the
// training loop polls at step boundaries: the program saves a full checkpoint there and exits
// with kExitRequeue, and the sbatch script requeues the job, which resumes from the checkpoint.
//
//   train::PreemptionHandler preempt;            // SIGUSR1 and SIGTERM
//   for (...) {
//     step();
//     if (preempt.requested()) { save_checkpoint(...); return train::kExitRequeue; }
//   }
//
// The handler only sets an atomic flag (async-signal-safe); nothing runs inside the signal.
// The signals are received by a watcher thread of the handler's own (sigwait), never by the
// threads that compute: while a handler exists they are blocked in the thread that created it,
// in every thread created after it (which inherit the mask), and in the compute team's
// threads. A signal delivered to a thread running JIT-compiled code can corrupt the heap:
// oneDNN's x64 GEMM kernels point the stack pointer into a heap buffer, and the kernel writes
// the signal frame there (oneDNN issue #4845, fixed in 2026 releases, present in Debian's 2.6;
// about 4 runs in 100 of the ResNet example aborted with "free(): invalid pointer").
// With several ranks, requested() is collective: every rank must call it at the same step, and
// every rank gets the same answer (true when any rank was signalled), so all ranks stop at the
// same step and the checkpoint is consistent even when the signal reached one rank only.
#pragma once

#include <csignal>
#include <cstdint>
#include <memory>
#include <vector>

namespace dltrain::train {

/// Exit status of a program that stopped on a preemption signal after saving its state, to be
/// restarted: sysexits' EX_TEMPFAIL ("temporary failure; retry"). The bundled sbatch templates
/// run `scontrol requeue` when the program exits with it; sites may list it in slurm.conf's
/// RequeueExit instead.
inline constexpr int kExitRequeue = 75;

/// Installs handlers for `signals` (default SIGUSR1 and SIGTERM) that record the first signal
/// received, blocks them in the calling thread and the compute team (see the file comment) and
/// starts the watcher thread; when it is destroyed, the watcher stops, the masks and the
/// previous handlers come back (destroy it on the thread that created it). One handler may exist at
/// a time in a process (a second one throws dltrain::Error). With several ranks, requested()
/// communicates on every `check_every`-th call only (default 10), and answers false in
/// between: the collective (and, on NCCL, its host synchronisation) is paid once per 10 steps,
/// and the job stops at most 9 steps after the signal, well inside Slurm's warning time.
class PreemptionHandler {
 public:
  explicit PreemptionHandler(std::vector<int> signals = {SIGUSR1, SIGTERM}, int check_every = 10);
  ~PreemptionHandler();
  PreemptionHandler(const PreemptionHandler&) = delete;
  PreemptionHandler& operator=(const PreemptionHandler&) = delete;

  /// Whether to stop now. With a distributed world of more than one rank this is a collective
  /// on every check_every-th call (a max over ranks of the local flag through
  /// distributed::all_reduce_value): call it on every rank at every step. Otherwise it reads the
  /// local flag only.
  bool requested();
  /// Whether a signal reached this process (local, no communication).
  bool signalled() const;
  /// The first signal received by this process, 0 if none.
  int signal() const;
  /// Forgets the signal received (to continue after a handled request).
  void reset();

 private:
  std::vector<int> signals_;
  int check_every_;
  int64_t calls_ = 0;
  std::vector<struct sigaction> previous_;
  struct Watcher;
  std::unique_ptr<Watcher> watcher_;
};

/// "SIGUSR1", "SIGTERM", ... or "signal N".
const char* signal_name(int signal);

}  // namespace dltrain::train
