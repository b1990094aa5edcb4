#include <catch2/catch.hpp>
#include <csignal>
#include <cstring>
#include <thread>

#include "dltrain/core/error.hpp"
#include "dltrain/train/preemption.hpp"

using namespace dltrain;

namespace {
volatile std::sig_atomic_t g_previous_calls = 0;
extern "C" void previous_handler(int) { g_previous_calls = g_previous_calls + 1; }
}  // namespace

TEST_CASE("preemption: a signal sets the flag, the first one is kept", "[train][preemption]") {
  train::PreemptionHandler h;
  CHECK_FALSE(h.signalled());
  CHECK_FALSE(h.requested());
  CHECK(h.signal() == 0);
  REQUIRE(std::raise(SIGUSR1) == 0);
  CHECK(h.signalled());
  CHECK(h.requested());  // no distributed world: the local flag
  CHECK(h.signal() == SIGUSR1);
  REQUIRE(std::raise(SIGTERM) == 0);  // handled too (the process is still alive), not recorded
  CHECK(h.signal() == SIGUSR1);
  h.reset();
  CHECK_FALSE(h.requested());
  REQUIRE(std::raise(SIGTERM) == 0);
  CHECK(h.signal() == SIGTERM);
  CHECK(std::string(train::signal_name(h.signal())) == "SIGTERM");
}

TEST_CASE("preemption: a signal delivered to another thread is seen", "[train][preemption]") {
  train::PreemptionHandler h({SIGUSR2});
  std::thread t([] { std::raise(SIGUSR2); });  // raise() targets the calling thread
  t.join();
  CHECK(h.signal() == SIGUSR2);
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
    std::raise(SIGUSR1);
    CHECK(h.signalled());
    CHECK(g_previous_calls == 0);
  }
  std::raise(SIGUSR1);
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
  std::raise(SIGTERM);
  CHECK(h.signal() == SIGTERM);
}
