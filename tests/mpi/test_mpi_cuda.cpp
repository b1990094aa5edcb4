// Two ranks with GPU tensors on the MPI group. Staged: through pinned host memory from the
// pinned pool (DLTRAIN_MPI_CUDA_AWARE=0); direct: device pointers passed to a CUDA-aware MPI
// (only when the library reports CUDA support; printed as skipped otherwise). With a GPU per
// rank the default group is NCCL, otherwise both ranks share device 0 through MPI. The whole
// binary exits with ctest's skip code on machines without a GPU (tests/mpi/main.cpp).
#include <catch2/catch.hpp>

#include <cstdlib>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using namespace dltrain::distributed;

namespace {

// An MPI group built with DLTRAIN_MPI_CUDA_AWARE set to `aware` (restored afterwards).
std::shared_ptr<ProcessGroup> mpi_group_with(const char* aware) {
  const char* saved = std::getenv("DLTRAIN_MPI_CUDA_AWARE");
  const std::string keep = saved ? saved : "";
  setenv("DLTRAIN_MPI_CUDA_AWARE", aware, 1);
  auto g = new_mpi_group(default_group().timeout());
  if (saved)
    setenv("DLTRAIN_MPI_CUDA_AWARE", keep.c_str(), 1);
  else
    unsetenv("DLTRAIN_MPI_CUDA_AWARE");
  return g;
}

bool library_cuda_aware() {
  const char* saved = std::getenv("DLTRAIN_MPI_CUDA_AWARE");
  const std::string keep = saved ? saved : "";
  unsetenv("DLTRAIN_MPI_CUDA_AWARE");
  const bool yes = mpi_cuda_aware();
  if (saved) setenv("DLTRAIN_MPI_CUDA_AWARE", keep.c_str(), 1);
  return yes;
}

Device test_device() { return device().is_cuda() ? device() : Device::cuda(0); }

void check_collectives(ProcessGroup& m, const Device d) {
  const int n = world_size();
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i64}) {
    INFO("dtype " << dtype_name(dt));
    Tensor cpu = full({1000}, rank() + 1.0, TensorOptions(dt));
    Tensor gpu = cpu.to(d);
    m.all_reduce(gpu, ReduceOp::Sum).wait();
    CHECK(gpu.device() == d);
    CHECK(gpu.to(Device::cpu()).to(DType::f64).to_vector<double>()[999] == n * (n + 1) / 2.0);
    if (dt != DType::i64) {
      Tensor avg = full({3, 4, 5, 6}, 2.0 * (rank() + 1), TensorOptions(dt).with_device(d))
                       .contiguous(MemoryFormat::ChannelsLast);
      m.all_reduce(avg, ReduceOp::Avg).wait();
      CHECK(avg.to(Device::cpu()).to(DType::f64).to_vector<double>()[17] == n + 1.0);
    }
    Tensor b = full({10}, rank(), TensorOptions(dt).with_device(d));
    m.broadcast(b, 1).wait();
    CHECK(b.to(Device::cpu()).to(DType::f64).to_vector<double>()[3] == 1.0);
    Tensor in = full({4}, rank() + 1.0, TensorOptions(dt).with_device(d));
    Tensor all = zeros({4 * n}, TensorOptions(dt).with_device(d));
    m.all_gather(all, in).wait();
    auto v = all.to(Device::cpu()).to(DType::f64).to_vector<double>();
    for (int r = 0; r < n; ++r) CHECK(v[static_cast<size_t>(4 * r + 3)] == r + 1.0);
    Tensor rs_in = full({2 * n}, 1.0, TensorOptions(dt).with_device(d));
    Tensor rs_out = zeros({2}, TensorOptions(dt).with_device(d));
    m.reduce_scatter(rs_out, rs_in, ReduceOp::Sum).wait();
    CHECK(rs_out.to(Device::cpu()).to(DType::f64).to_vector<double>()[1] == n);
  }
}

}  // namespace

TEST_CASE("mpi+cuda: CUDA tensors staged through pinned memory match the CPU", "[mpi][cuda]") {
  auto m = mpi_group_with("0");
  check_collectives(*m, test_device());
}

TEST_CASE("mpi+cuda: CUDA tensors passed directly to a CUDA-aware MPI", "[mpi][cuda]") {
  if (!library_cuda_aware()) {
    if (rank() == 0)
      std::printf(
          "SKIPPED: this MPI library is not CUDA-aware (MPIX_Query_cuda_support() == 0); "
          "its CUDA tensors are staged through pinned memory\n");
    return;
  }
  auto m = mpi_group_with("1");
  check_collectives(*m, test_device());
}

TEST_CASE("mpi+cuda: the default group with CUDA tensors", "[mpi][cuda]") {
  ProcessGroup& g = default_group();
  const Device d = test_device();
  Tensor gpu = full({1000}, rank() + 1.0, TensorOptions(DType::f32).with_device(d));
  g.all_reduce(gpu, ReduceOp::Sum).wait();
  CHECK(gpu.to(Device::cpu()).to_vector<float>()[999] == world_size() * (world_size() + 1) / 2.0f);
}
