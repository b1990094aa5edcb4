// Fault injection for the multi-rank tests (run by expect_failure.sh under mpirun):
//   mpi_fault timeout   rank 0 all-reduces, the other ranks never do: the collective
//                       timeout must abort the job with a message naming the collective.
//   mpi_fault throw     rank 1 dies of an uncaught exception while rank 0 waits in an
//                       all-reduce: the job must end at once, the message printed once.
//   mpi_fault abort     rank 1 calls distributed::abort (what a caught error should do).
//   mpi_fault zero      rank 1's shard of a ZeroRedundancyOptimizer fails its local step (a
//                       gradient of the wrong dtype) while rank 0 waits in the broadcast of
//                       rank 1's parameters: the job must end at once with the step's message.
//   mpi_fault fsdp      rank 1's forward throws inside FullyShardedDataParallel unit "1" after
//                       gathering it, while rank 0 goes on to wait in unit 2's gather: the job
//                       must end at once with rank 1's message.
//   mpi_fault pipeline  a 1F1B pipeline over every rank whose last stage's loss throws on
//                       micro-batch 2 while the other stages wait in a recv for its gradient:
//                       the job must end at once with the loss's message.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "dltrain/dltrain.hpp"

using namespace dltrain;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  distributed::ProcessGroup& g = distributed::init();
  Tensor t = ones({1000});
  if (mode == "timeout") {
    if (g.rank() == 0) g.all_reduce(t).wait();
    std::this_thread::sleep_for(std::chrono::seconds(120));
  } else if (mode == "throw") {
    if (g.rank() == 1) throw std::runtime_error("corrupt file shard-00017.h5 (injected)");
    g.all_reduce(t).wait();
    std::this_thread::sleep_for(std::chrono::seconds(120));
  } else if (mode == "abort") {
    if (g.rank() == 1) distributed::abort("cannot read shard-00017.h5 (injected)", 3);
    g.all_reduce(t).wait();
    std::this_thread::sleep_for(std::chrono::seconds(120));
  } else if (mode == "zero") {
    // Partitioned by size: the 4-element parameter on rank 0, the 3-element one on rank 1.
    Tensor a = zeros({4}).requires_grad_(), b = zeros({3}).requires_grad_();
    auto opt = distributed::ZeroRedundancyOptimizer::make<optim::SGD>(std::vector<Tensor>{a, b},
                                                                      optim::SGDOptions{.lr = 0.1});
    a.set_grad(ones({4}));
    b.set_grad(g.rank() == 1 ? ones({3}, DType::f64) : ones({3}));
    opt.step();
    std::this_thread::sleep_for(std::chrono::seconds(120));
  } else if (mode == "fsdp") {
    manual_seed(3);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(4, 4))
        .push_back(std::make_shared<nn::Linear>(4, 4))
        .push_back(std::make_shared<nn::Linear>(4, 2));
    distributed::FullyShardedDataParallel fsdp(m, {.units = {"0", "1", "2"}});
    // Rank 1 fails inside unit 1, after its gather: rank 0 goes on into unit 2's.
    if (g.rank() == 1) {
      nn::register_forward_hooks(*m->child("1"), {.pre = [](nn::Module&) {
        throw std::runtime_error("corrupt shard of unit 1 (injected)");
      }});
    }
    sum(fsdp(ones({2, 4}))).backward();
    std::this_thread::sleep_for(std::chrono::seconds(120));
  } else if (mode == "pipeline") {
    manual_seed(3);
    auto m = std::make_shared<nn::Sequential>();
    for (int i = 0; i < 4; ++i) m->push_back(std::make_shared<nn::Linear>(4, 4));
    distributed::Pipeline pipe(m, {.micro_batches = 4});
    const auto loss = [](const Tensor& out, const Tensor& target) {
      static int calls = 0;
      if (++calls == 3) throw std::runtime_error("loss of micro-batch 2 is NaN (injected)");
      return mse_loss(out, target);
    };
    pipe.forward_backward(ones({8, 4}), zeros({8, 4}), loss);
    std::this_thread::sleep_for(std::chrono::seconds(120));
  } else {
    std::fprintf(stderr, "usage: mpi_fault timeout|throw|abort|zero|fsdp|pipeline\n");
    return 2;
  }
  return 0;
}
