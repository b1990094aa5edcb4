// Two ranks with GPU tensors: the MPI group stages CUDA tensors through host memory; with a
// GPU per rank the default group is NCCL, otherwise both ranks share device 0 through MPI.
#include <catch2/catch.hpp>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using namespace dltrain::distributed;

TEST_CASE("mpi+cuda: all_reduce and broadcast of CUDA tensors match the CPU", "[mpi][cuda]") {
  ProcessGroup& g = default_group();
  // init() only picks a GPU per rank when each rank has its own; else use cuda:0 through MPI.
  const Device d = device().is_cuda() ? device() : Device::cuda(0);
  auto mpi = std::string(g.backend()) == "mpi" ? nullptr : new_mpi_group(g.timeout());
  ProcessGroup& m = mpi ? *mpi : g;
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::i64}) {
    Tensor cpu = full({1000}, rank() + 1.0, TensorOptions(dt));
    Tensor gpu = cpu.to(d);
    m.all_reduce(gpu, ReduceOp::Sum).wait();
    CHECK(gpu.device() == d);
    CHECK(gpu.to(Device::cpu()).to(DType::f64).to_vector<double>()[999] ==
          world_size() * (world_size() + 1) / 2.0);
    Tensor b = full({10}, rank(), TensorOptions(dt).with_device(d));
    m.broadcast(b, 1).wait();
    CHECK(b.to(Device::cpu()).to(DType::f64).to_vector<double>()[3] == 1.0);
  }
}
