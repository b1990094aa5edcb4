// train::PreemptionHandler: a signal sets the flag (the first one kept), also from another
// thread; computing threads block the signals; the previous handlers come back.
#include <pthread.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "dltrain/core/error.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/train/preemption.hpp"

using namespace dltrain;

namespace {
volatile std::sig_atomic_t g_previous_calls = 0;
extern "C" void previous_handler(int) { g_previous_calls = g_previous_calls + 1; }

// Sends `sig` to the process, as Slurm, scancel and mpirun do (kill, not raise: the computing
// threads block the signal, and the watcher thread takes it).
void send(int sig) { REQUIRE(::kill(::getpid(), sig) == 0); }

// The signal is taken by the watcher thread, asynchronously: wait up to 10 s for `sig`.
bool wait_for(const train::PreemptionHandler& h, int sig) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (h.signal() != sig && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return h.signal() == sig;
}

bool blocked_here(int sig) {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  return sigismember(&now, sig) == 1;
}
}  // namespace

TEST_CASE("preemption: a signal sets the flag, the first one is kept", "[train][preemption]") {
  train::PreemptionHandler h;
  CHECK_FALSE(h.signalled());
  CHECK_FALSE(h.requested());
  CHECK(h.signal() == 0);
  send(SIGUSR1);
  REQUIRE(wait_for(h, SIGUSR1));
  CHECK(h.signalled());
  CHECK(h.requested());  // no distributed world: the local flag
  send(SIGTERM);         // taken too (the process is still alive), not recorded
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(h.signal() == SIGUSR1);
  h.reset();
  CHECK_FALSE(h.requested());
  send(SIGTERM);
  REQUIRE(wait_for(h, SIGTERM));
  CHECK(std::string(train::signal_name(h.signal())) == "SIGTERM");
}

TEST_CASE("preemption: a signal sent from another thread is seen", "[train][preemption]") {
  train::PreemptionHandler h({SIGUSR2});
  std::thread t([] { ::kill(::getpid(), SIGUSR2); });
  t.join();
  CHECK(wait_for(h, SIGUSR2));
}

// The defect this guards against: a signal delivered to a thread that runs JIT-compiled code
// (oneDNN's GEMM kernels move the stack pointer into the heap) writes its frame into the heap.
TEST_CASE("preemption: computing threads block the signals while a handler exists",
          "[train][preemption]") {
  REQUIRE_FALSE(blocked_here(SIGUSR1));
  auto team_blocked = [] {
    std::mutex mu;
    std::vector<bool> seen;
    detail::for_each_compute_thread([&] {
      const bool b = blocked_here(SIGUSR1);
      std::lock_guard<std::mutex> lk(mu);
      seen.push_back(b);
    });
    // Chunks of parallel_for run on the same team.
    std::atomic<int> unblocked{0};
    parallel_for(0, 64, 1, [&](int64_t, int64_t) {
      if (!blocked_here(SIGUSR1)) ++unblocked;
    });
    int n = 0;
    for (bool b : seen) n += b;
    return std::pair<int, int>{n == static_cast<int>(seen.size()) ? n : -1, unblocked.load()};
  };
  {
    train::PreemptionHandler h;
    CHECK(blocked_here(SIGUSR1));
    CHECK(blocked_here(SIGTERM));
    const auto [blocked, unblocked_chunks] = team_blocked();
    CHECK(blocked >= 1);
    CHECK(unblocked_chunks == 0);
    bool in_new_thread = false;
    std::thread t([&] { in_new_thread = blocked_here(SIGUSR1); });  // inherits the mask
    t.join();
    CHECK(in_new_thread);
    send(SIGUSR1);  // taken by the watcher, with every computing thread blocking it
    CHECK(wait_for(h, SIGUSR1));
  }
  CHECK_FALSE(blocked_here(SIGUSR1));  // the masks come back
  std::atomic<int> still_blocked{0};
  detail::for_each_compute_thread([&] {
    if (blocked_here(SIGUSR1)) ++still_blocked;
  });
  CHECK(still_blocked == 0);
}

TEST_CASE("preemption: the previous handlers come back", "[train][preemption]") {
  struct sigaction sa, old;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = previous_handler;
  sigemptyset(&sa.sa_mask);
  REQUIRE(sigaction(SIGUSR1, &sa, &old) == 0);
  g_previous_calls = 0;
  {
    train::PreemptionHandler h;
    send(SIGUSR1);
    CHECK(wait_for(h, SIGUSR1));
    CHECK(g_previous_calls == 0);
  }
  std::raise(SIGUSR1);  // the previous handler runs synchronously in this thread again
  CHECK(g_previous_calls == 1);
  REQUIRE(sigaction(SIGUSR1, &old, nullptr) == 0);
}

TEST_CASE("preemption: misuse is refused with a clear error", "[train][preemption]") {
  CHECK_THROWS_WITH(train::PreemptionHandler({SIGKILL}),
                    Catch::Contains("cannot be a preemption signal"));
  CHECK_THROWS_WITH(train::PreemptionHandler({SIGSEGV}), Catch::Contains("SIGUSR1"));
  CHECK_THROWS_WITH(train::PreemptionHandler({SIGUSR1}, 0), Catch::Contains("check_every"));
  train::PreemptionHandler h;
  CHECK_THROWS_WITH(train::PreemptionHandler(), Catch::Contains("already installed"));
  // The refused second handler did not take the first one's signals away.
  send(SIGTERM);
  CHECK(wait_for(h, SIGTERM));
}
