// Preemption across ranks: a signal that reaches one rank only (Slurm signals every task, but
// not at the same instant) must stop every rank at the same step, so that the checkpoint
// written there is consistent.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "dltrain/dltrain.hpp"

using namespace dltrain;

TEST_CASE("preemption: a signal on the last rank stops every rank at the same later check",
          "[mpi][preemption]") {
  distributed::ProcessGroup& world = distributed::init();
  REQUIRE(world.size() >= 2);
  train::PreemptionHandler preempt({SIGUSR1, SIGTERM}, /*check_every=*/3);
  const int signalled_rank = world.size() - 1;
  int stopped_at = -1;
  for (int step = 0; step < 10; ++step) {
    if (world.rank() == signalled_rank && step == 4) {
      // As Slurm does: to the process, taken by the handler's watcher thread (asynchronously).
      REQUIRE(::kill(::getpid(), SIGUSR1) == 0);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!preempt.signalled() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (preempt.requested()) {
      stopped_at = step;
      break;
    }
  }
  CHECK(stopped_at == 5);  // the first check after step 4: the 6th call
  CHECK(preempt.signalled() == (world.rank() == signalled_rank));
  // Every rank agrees (a max and a min over ranks of the step give the same value).
  CHECK(distributed::all_reduce_value(stopped_at, distributed::ReduceOp::Max) == 5);
  CHECK(distributed::all_reduce_value(stopped_at, distributed::ReduceOp::Min) == 5);
}
