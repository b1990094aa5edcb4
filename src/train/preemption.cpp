// train::PreemptionHandler (dltrain/train/preemption.hpp): an async-signal-safe flag set by
// SIGUSR1/SIGTERM, computing threads kept from receiving the signals, previous handlers
// restored on destruction.
#include "dltrain/train/preemption.hpp"

#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "dltrain/core/error.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/distributed/process_group.hpp"

namespace dltrain::train {

namespace {

// The first signal received (0: none), written inside the handler: a lock-free atomic is
// async-signal-safe.
std::atomic<int> g_signal{0};
std::atomic<bool> g_installed{false};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_preemption_signal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig, std::memory_order_relaxed);
}

}  // namespace

// The thread that receives the signals (sigwait) while every computing thread blocks them.
struct PreemptionHandler::Watcher {
  sigset_t set;
  sigset_t caller_mask;  // the creating thread's mask before
  std::atomic<bool> quit{false};
  std::thread thread;
};

const char* signal_name(int sig) {
  switch (sig) {
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    case SIGCONT:
      return "SIGCONT";
    default:
      break;
  }
  thread_local char buf[24];
  std::snprintf(buf, sizeof buf, "signal %d", sig);
  return buf;
}

PreemptionHandler::PreemptionHandler(std::vector<int> signals, int check_every)
    : signals_(std::move(signals)), check_every_(check_every) {
  DLTRAIN_CHECK(check_every >= 1, "PreemptionHandler: check_every must be >= 1, got ", check_every);
  for (int s : signals_)
    DLTRAIN_CHECK(
        s == SIGUSR1 || s == SIGUSR2 || s == SIGTERM || s == SIGINT || s == SIGHUP || s == SIGCONT,
        "PreemptionHandler: ", signal_name(s),
        " cannot be a preemption signal; use SIGUSR1, SIGUSR2, SIGTERM, SIGINT, "
        "SIGHUP or SIGCONT");
  bool expected = false;
  DLTRAIN_CHECK(g_installed.compare_exchange_strong(expected, true),
                "PreemptionHandler: one is already installed in this process; keep a single "
                "handler for the whole training loop");
  g_signal.store(0);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  // Interrupted system calls (file reads of the loader, MPI's sockets) are restarted.
  sa.sa_flags = SA_RESTART;
  previous_.resize(signals_.size());
  for (size_t i = 0; i < signals_.size(); ++i) {
    if (sigaction(signals_[i], &sa, &previous_[i]) != 0) {
      const int err = errno;
      for (size_t j = 0; j < i; ++j) sigaction(signals_[j], &previous_[j], nullptr);
      g_installed.store(false);
      DLTRAIN_FAIL("PreemptionHandler: cannot install a handler for ", signal_name(signals_[i]),
                   ": ", std::strerror(err));
    }
  }
  // The handler above stays as the fallback for threads that do not block the signals (made
  // before this handler by other libraries, such as MPI's progress threads; they run no JIT
  // code). The computing threads block them, and the watcher takes them with sigwait.
  auto w = std::make_unique<Watcher>();
  sigemptyset(&w->set);
  for (int s : signals_) sigaddset(&w->set, s);
  pthread_sigmask(SIG_BLOCK, &w->set, &w->caller_mask);
  const sigset_t* set = &w->set;
  detail::for_each_compute_thread([set] { pthread_sigmask(SIG_BLOCK, set, nullptr); });
  try {
    w->thread = std::thread([wp = w.get()] {
      for (;;) {
        int sig = 0;
        if (sigwait(&wp->set, &sig) != 0) continue;
        if (wp->quit.load()) return;
        int none = 0;
        g_signal.compare_exchange_strong(none, sig, std::memory_order_relaxed);
      }
    });
  } catch (const std::system_error& e) {
    detail::for_each_compute_thread([set] { pthread_sigmask(SIG_UNBLOCK, set, nullptr); });
    pthread_sigmask(SIG_SETMASK, &w->caller_mask, nullptr);
    for (size_t i = 0; i < signals_.size(); ++i) sigaction(signals_[i], &previous_[i], nullptr);
    g_installed.store(false);
    DLTRAIN_FAIL("PreemptionHandler: cannot start the signal watcher thread: ", e.what());
  }
  watcher_ = std::move(w);
}

PreemptionHandler::~PreemptionHandler() {
  Watcher& w = *watcher_;
  w.quit.store(true);
  pthread_kill(w.thread.native_handle(), signals_.front());  // wakes sigwait
  w.thread.join();
  // Unblocked while our handler is still installed: a signal that came meanwhile is recorded.
  const sigset_t* set = &w.set;
  detail::for_each_compute_thread([set] { pthread_sigmask(SIG_UNBLOCK, set, nullptr); });
  pthread_sigmask(SIG_SETMASK, &w.caller_mask, nullptr);
  for (size_t i = 0; i < signals_.size(); ++i) sigaction(signals_[i], &previous_[i], nullptr);
  g_installed.store(false);
}

bool PreemptionHandler::signalled() const { return g_signal.load(std::memory_order_relaxed) != 0; }

int PreemptionHandler::signal() const { return g_signal.load(std::memory_order_relaxed); }

void PreemptionHandler::reset() { g_signal.store(0); }

bool PreemptionHandler::requested() {
  const double local = signalled() ? 1.0 : 0.0;
  if (!distributed::is_initialized() || distributed::world_size() <= 1) return local != 0;
  if (++calls_ % check_every_ != 0) return false;  // every rank skips the same calls
  return distributed::all_reduce_value(local, distributed::ReduceOp::Max) != 0;
}

}  // namespace dltrain::train
