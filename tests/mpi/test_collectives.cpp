// Every collective of the MPI group, every dtype, against values computed independently on
// each rank (rank r contributes f(r, i) for element i), on 2 and 3 ranks.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using namespace dltrain::distributed;

namespace {

// Rank r's value at element i: small integers, exact in every dtype (bool: alternating).
double value(int r, int64_t i, DType dt) {
  if (dt == DType::b8) return ((r + i) % 3 == 0) ? 1.0 : 0.0;
  return static_cast<double>((r * 7 + i * 3) % 11) - (dt == DType::u8 ? 0.0 : 5.0);
}

Tensor make(int r, int64_t n, DType dt) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(value(r, i, dt));
  return from_vector(v, {n}, TensorOptions(dt));
}

double reduce_expected(int64_t i, int size, ReduceOp op, DType dt) {
  double acc = value(0, i, dt);
  for (int r = 1; r < size; ++r) {
    const double v = value(r, i, dt);
    if (op == ReduceOp::Sum || op == ReduceOp::Avg) acc += v;
    if (op == ReduceOp::Max) acc = std::max(acc, v);
    if (op == ReduceOp::Min) acc = std::min(acc, v);
  }
  if (op == ReduceOp::Avg) acc /= size;
  if (dt == DType::b8) acc = acc != 0.0 ? 1.0 : 0.0;  // sum/max = or, min = and
  if (dt == DType::u8 && op == ReduceOp::Sum) acc = std::fmod(acc, 256.0);
  return acc;
}

const DType kAll[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                      DType::i32, DType::i64, DType::u8,  DType::b8};

}  // namespace

TEST_CASE("mpi group: all_reduce sum/avg/max/min in every dtype", "[mpi][collectives]") {
  ProcessGroup& g = default_group();
  REQUIRE(std::string(g.backend()) == "mpi");
  REQUIRE(g.size() >= 2);
  const int64_t n = 1000;
  for (DType dt : kAll) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      if (op == ReduceOp::Avg && !is_floating(dt)) continue;
      INFO("dtype " << dtype_name(dt) << " op " << reduce_op_name(op));
      Tensor t = make(g.rank(), n, dt);
      Work w = g.all_reduce(t, op);
      w.wait();
      CHECK(w.is_completed());
      auto got = t.to(DType::f64).to_vector<double>();
      int bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double want = reduce_expected(i, g.size(), op, dt);
        const double tol = dt == DType::bf16 || dt == DType::f16 ? 0.02 * std::abs(want) : 1e-6;
        if (std::abs(got[static_cast<size_t>(i)] - want) > tol) ++bad;
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("mpi group: broadcast, all_gather and reduce_scatter in every dtype",
          "[mpi][collectives]") {
  ProcessGroup& g = default_group();
  const int64_t n = 37;
  for (DType dt : kAll) {
    INFO("dtype " << dtype_name(dt));
    for (int root = 0; root < g.size(); ++root) {
      Tensor t = make(g.rank(), n, dt);
      g.broadcast(t, root).wait();
      CHECK(t.to(DType::f64).to_vector<double>() ==
            make(root, n, dt).to(DType::f64).to_vector<double>());
    }
    Tensor out = zeros({g.size() * n}, TensorOptions(dt));
    g.all_gather(out, make(g.rank(), n, dt)).wait();
    for (int r = 0; r < g.size(); ++r)
      CHECK(out.narrow(0, r * n, n).to(DType::f64).to_vector<double>() ==
            make(r, n, dt).to(DType::f64).to_vector<double>());

    if (dt == DType::b8) continue;
    // reduce_scatter: every rank contributes size * n values; rank r keeps block r, summed.
    std::vector<double> in;
    for (int64_t i = 0; i < g.size() * n; ++i) in.push_back(value(g.rank(), i % 7, dt));
    Tensor input = from_vector(in, {g.size() * n}, TensorOptions(dt));
    Tensor block = zeros({n}, TensorOptions(dt));
    g.reduce_scatter(block, input, ReduceOp::Sum).wait();
    auto got = block.to(DType::f64).to_vector<double>();
    for (int64_t i = 0; i < n; ++i) {
      double want = 0;
      for (int r = 0; r < g.size(); ++r) want += value(r, (g.rank() * n + i) % 7, dt);
      if (dt == DType::u8) want = std::fmod(want, 256.0);
      CHECK(got[static_cast<size_t>(i)] == Approx(want).epsilon(0.02));
    }
  }
}

TEST_CASE("mpi group: reduce_scatter avg/max/min in every dtype", "[mpi][collectives]") {
  ProcessGroup& g = default_group();
  const int64_t n = 29;
  for (DType dt : kAll) {
    for (ReduceOp op : {ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      if (op == ReduceOp::Avg && !is_floating(dt)) continue;
      INFO("dtype " << dtype_name(dt) << " op " << reduce_op_name(op));
      // Element i of the input is value(rank, i): rank r keeps block r, reduced over ranks.
      Tensor input = make(g.rank(), g.size() * n, dt);
      Tensor block = zeros({n}, TensorOptions(dt));
      Work w = g.reduce_scatter(block, input, op);
      w.wait();
      CHECK(w.is_completed());
      auto got = block.to(DType::f64).to_vector<double>();
      int bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double want = reduce_expected(g.rank() * n + i, g.size(), op, dt);
        const double tol = dt == DType::bf16 || dt == DType::f16 ? 0.02 * std::abs(want) : 1e-6;
        if (std::abs(got[static_cast<size_t>(i)] - want) > tol) ++bad;
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("mpi group: Work::is_completed is false while a collective waits for a rank",
          "[mpi][collectives]") {
  ProcessGroup& g = default_group();
  CHECK(Work().is_completed());
  g.barrier().wait();
  Tensor t = full({64}, 1.0);
  if (g.rank() == g.size() - 1) {
    // The last rank joins a second later: no other rank's all-reduce can complete before.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    g.all_reduce(t).wait();
  } else {
    Work w = g.all_reduce(t);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_FALSE(w.is_completed());  // never blocks, and the last rank has not joined
    w.wait();
    CHECK(w.is_completed());
  }
  CHECK(t.to_vector<float>()[63] == g.size());
}

TEST_CASE("mpi group: channels-last tensors, async overlap and ordering", "[mpi][collectives]") {
  ProcessGroup& g = default_group();
  Tensor x = full({2, 3, 4, 5}, g.rank() + 1.0).contiguous(MemoryFormat::ChannelsLast);
  // Many collectives in flight at once complete in issue order with the right values.
  std::vector<Tensor> ts;
  std::vector<Work> ws;
  for (int k = 0; k < 16; ++k) {
    ts.push_back(full({1000 + k}, static_cast<double>(k + g.rank())));
    ws.push_back(g.all_reduce(ts.back(), ReduceOp::Sum));
  }
  ws.push_back(g.all_reduce(x, ReduceOp::Max));
  for (auto& w : ws) w.wait();
  const double ranks_sum = g.size() * (g.size() - 1) / 2.0;
  for (int k = 0; k < 16; ++k)
    CHECK(ts[static_cast<size_t>(k)].to_vector<float>()[7] == Approx(g.size() * k + ranks_sum));
  CHECK(x.is_contiguous(MemoryFormat::ChannelsLast));
  CHECK(min(x).item<double>() == g.size());
  g.barrier().wait();
  CHECK(all_reduce_value(1.0) == g.size());
  CHECK(all_reduce_value(rank(), ReduceOp::Max) == g.size() - 1);
}

TEST_CASE("mpi group: argument errors are raised before anything is sent", "[mpi][collectives]") {
  ProcessGroup& g = default_group();
  CHECK_THROWS_WITH(g.all_gather(zeros({3}), zeros({3})), Catch::Contains("expected size() * 3"));
  CHECK_THROWS_WITH(g.all_reduce(zeros({4}, DType::i32), ReduceOp::Avg),
                    Catch::Contains("averaging needs a floating dtype"));
  CHECK_THROWS_WITH(g.broadcast(zeros({4}), g.size()), Catch::Contains("is not a rank"));
  CHECK_THROWS_WITH(g.all_reduce(zeros({4, 8}).narrow(1, 0, 4)), Catch::Contains("not dense"));
  // The group still works afterwards.
  Tensor t = ones({5});
  g.all_reduce(t).wait();
  CHECK(t.to_vector<float>()[4] == g.size());
}

TEST_CASE("init(): environment, thread share and device", "[mpi][init]") {
  const Environment& e = environment();
  // tests/mpi/as_hydra.sh runs this binary with MPICH/Intel MPI's variables instead.
  const char* expected = std::getenv("DLTRAIN_TEST_LAUNCHER");
  CHECK(std::string(launcher_name(e.launcher)) == (expected ? expected : "openmpi"));
  CHECK(e.world_size == default_group().size());
  CHECK(e.rank == default_group().rank());
  CHECK(local_world_size() == world_size());  // one node
  CHECK(local_rank() == rank());
  CHECK(node_id() == 0);
  CHECK(e.num_nodes == 1);
  CHECK_FALSE(e.sizes_from_mpi);
  CHECK_FALSE(e.node_from_mpi);
  CHECK(device() == Device::cpu());
  // Ranks that share CPUs split them (mpirun.sh does not bind): never more threads than
  // the CPUs divided among the ranks, and at least one.
  CHECK(get_num_threads() >= 1);
  CHECK(get_num_threads() <= std::max(1, usable_cpus() / std::min(world_size(), usable_cpus())));
}

TEST_CASE("mpi_cuda_aware(): the library's answer, overridden by DLTRAIN_MPI_CUDA_AWARE",
          "[mpi][init]") {
  const char* saved = std::getenv("DLTRAIN_MPI_CUDA_AWARE");
  const std::string keep = saved ? saved : "";
  unsetenv("DLTRAIN_MPI_CUDA_AWARE");
  const bool library = mpi_cuda_aware();
  if (rank() == 0)
    std::printf("the MPI library is %sCUDA-aware (CUDA tensors are %s)\n", library ? "" : "not ",
                library ? "passed to MPI as they are" : "staged through pinned host memory");
  setenv("DLTRAIN_MPI_CUDA_AWARE", "1", 1);
  CHECK(mpi_cuda_aware());
  setenv("DLTRAIN_MPI_CUDA_AWARE", "0", 1);
  CHECK_FALSE(mpi_cuda_aware());
  setenv("DLTRAIN_MPI_CUDA_AWARE", "yes", 1);
  CHECK_THROWS_WITH(mpi_cuda_aware(), Catch::Contains("DLTRAIN_MPI_CUDA_AWARE must be 0 or 1"));
  if (saved)
    setenv("DLTRAIN_MPI_CUDA_AWARE", keep.c_str(), 1);
  else
    unsetenv("DLTRAIN_MPI_CUDA_AWARE");
  // A group built while the override says CUDA-aware still reduces CPU tensors as before.
  setenv("DLTRAIN_MPI_CUDA_AWARE", "1", 1);
  auto g = new_mpi_group(default_group().timeout());
  if (saved)
    setenv("DLTRAIN_MPI_CUDA_AWARE", keep.c_str(), 1);
  else
    unsetenv("DLTRAIN_MPI_CUDA_AWARE");
  Tensor t = full({7}, 1.0 + rank());
  g->all_reduce(t, ReduceOp::Avg).wait();
  CHECK(t.to_vector<float>()[6] == Approx((world_size() + 1) / 2.0));
}

TEST_CASE("on_main_process: rank 0 runs it, every rank waits, a failure reaches every rank",
          "[mpi][init]") {
  const std::string path = "on_main_process_" + std::to_string(world_size()) + ".txt";
  std::remove(path.c_str());
  int ran = 0;
  on_main_process([&] {
    ++ran;
    // Slow enough that a rank which did not wait would look before the file exists.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::ofstream(path) << "written by rank " << rank();
  });
  CHECK(ran == (rank() == 0 ? 1 : 0));
  std::string text;
  std::getline(std::ifstream(path), text);
  CHECK(text == "written by rank 0");  // every rank reads what rank 0 wrote
  barrier();
  if (rank() == 0) std::remove(path.c_str());

  try {
    on_main_process([] { throw std::runtime_error("disk quota exceeded writing ckpt.h5"); });
    FAIL("rank 0's failure must reach every rank");
  } catch (const Error& e) {
    CHECK(rank() != 0);
    CHECK_THAT(e.what(), Catch::Contains("rank 0 failed: disk quota exceeded writing ckpt.h5"));
  } catch (const std::runtime_error& e) {
    CHECK(rank() == 0);  // rank 0 gets its own exception back
    CHECK(std::string(e.what()) == "disk quota exceeded writing ckpt.h5");
  }
  // The group still works afterwards.
  CHECK(all_reduce_value(1.0) == world_size());
}

TEST_CASE("DistributedSampler::for_default_group takes init()'s rank and world size",
          "[mpi][init]") {
  auto s = data::DistributedSampler::for_default_group(100, true, 5);
  CHECK(s->rank() == rank());
  CHECK(s->world_size() == world_size());
  data::DistributedSampler same(100, rank(), world_size(), true, 5);
  CHECK(s->indices() == same.indices());
}

TEST_CASE("the chronometer's throughput says it is this rank's", "[mpi][init]") {
  train::Chronometer c;
  c.begin_step();
  c.end_step(8);
  CHECK_THAT(c.table("t"),
             Catch::Contains("samples/s on this rank (of " + std::to_string(world_size()) + ")"));
}
