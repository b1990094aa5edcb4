// Tensor parallelism on CPU ranks: a transformer MLP block (hidden d, 4d feed-forward, GELU)
// trained one step at a time (forward, backward against a fixed gradient) as one process and as
// a TensorParallelMLP over every rank, plus the all-reduce the block pays once in forward and
// once in backward (tokens x d values each). Run under mpirun (issue 31):
//
//   mpirun -np 2 tensor_parallel [--hidden 1024] [--tokens 512] [--rounds 7] [--json PATH]
//
// The single-process rows run on rank 0 while the other ranks wait at a barrier: with the rank's
// own thread count ("single"), and with the threads of every rank together ("single, all
// threads": the same cores as the tensor-parallel run). Modes are interleaved round by round
// (each round: single, single all threads, all-reduce, tensor parallel), the first round is
// untimed, and each figure is the median over the rounds (the maximum over ranks). The block is
// f32; parameter bytes are per rank. The expected step time of the tensor-parallel block is
// single / p + 2 all-reduces; the table prints both. PyTorch's side (DTensor on gloo, the same
// rounds): benchmarks/peers/pytorch_tensor_parallel.py.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) { return train::compute_stats(std::move(v)).median; }

}  // namespace

int main(int argc, char** argv) {
  int64_t hidden = 1024, tokens = 512, rounds = 7;
  std::string json;
  cli::Flags flags("tensor_parallel",
                   "Step time of a tensor-parallel MLP block (CPU ranks under mpirun) against one "
                   "process and the all-reduce it costs, as a table and JSON.");
  flags.group(cli::group::kBenchmark);
  flags.add("--hidden", &hidden, "model width d (the feed-forward is 4d)").positive();
  flags.add("--tokens", &tokens, "batch x sequence length").positive();
  flags.add("--rounds", &rounds, "timed rounds").positive();
  flags.group(cli::group::kCheckpoint);
  flags.add("--json", &json, "write the figures here (rank 0)").value_name("FILE.json");
  flags.parse(argc, argv);
  // Ranks waiting at a barrier while rank 0 runs the single-process rows give up their core
  // instead of spinning in Open MPI's progress loop (unless the caller chose otherwise).
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  try {
    distributed::ProcessGroup& g = distributed::init();
    const int64_t p = g.size(), ffn = 4 * hidden;
    if (ffn % p != 0)
      flags.fail("--hidden: the feed-forward width 4 x " + std::to_string(hidden) +
                 " must be divisible by the " + std::to_string(p) + " ranks");
    const int threads = get_num_threads();
    const nn::TensorParallelMLPOptions o{.activation = "gelu"};
    manual_seed(0);
    nn::Linear l1(hidden, ffn), l2(ffn, hidden);
    distributed::TensorParallelMLP tp(l1, l2, g, o);
    Generator gen(1);
    const Tensor x = randn({tokens, hidden}, DType::f32, &gen),
                 gy = randn({tokens, hidden}, DType::f32, &gen);
    auto single_step = [&] {
      l1.zero_grad();
      l2.zero_grad();
      Tensor xi = x.detach();
      xi.requires_grad_();
      sum(mul(l2(gelu(l1(xi))), gy)).backward();
    };
    auto tp_step = [&] {
      tp.zero_grad();
      Tensor xi = x.detach();
      xi.requires_grad_();
      sum(mul(tp(xi), gy)).backward();
    };
    Tensor buf = randn({tokens, hidden}, DType::f32, &gen);
    std::vector<double> single_ms, single_all_ms, reduce_ms, tp_ms;
    for (int64_t r = 0; r <= rounds; ++r) {
      double t_single = 0, t_all = 0;
      distributed::barrier();
      if (g.rank() == 0) {
        auto t0 = Clock::now();
        single_step();
        t_single = ms_since(t0);
        set_num_threads(threads * static_cast<int>(p));
        t0 = Clock::now();
        single_step();
        t_all = ms_since(t0);
        set_num_threads(threads);
      }
      distributed::barrier();
      auto t0 = Clock::now();
      g.all_reduce(buf).wait();
      const double t_reduce = ms_since(t0);
      distributed::barrier();
      t0 = Clock::now();
      tp_step();
      const double t_tp = ms_since(t0);
      if (r == 0) continue;  // untimed
      single_ms.push_back(t_single);
      single_all_ms.push_back(t_all);
      reduce_ms.push_back(t_reduce);
      tp_ms.push_back(t_tp);
    }
    using distributed::ReduceOp;
    const double single = distributed::all_reduce_value(median(single_ms), ReduceOp::Max);
    const double single_all = distributed::all_reduce_value(median(single_all_ms), ReduceOp::Max);
    const double reduce = distributed::all_reduce_value(median(reduce_ms), ReduceOp::Max);
    const double step = distributed::all_reduce_value(median(tp_ms), ReduceOp::Max);
    const double mib = 1024.0 * 1024.0;
    const double single_params =
        static_cast<double>((l1.num_parameters() + l2.num_parameters()) * 4);
    const double tp_params = static_cast<double>(tp.num_parameters() * 4);
    const double reduce_mib = static_cast<double>(tokens * hidden * 4) / mib;
    if (g.rank() == 0) {
      std::printf(
          "MLP block d=%lld, ffn=%lld, GELU, %lld tokens, f32, forward + backward; %lld ranks "
          "(%s), %d threads per rank; median of %lld rounds, maximum over ranks:\n",
          static_cast<long long>(hidden), static_cast<long long>(ffn),
          static_cast<long long>(tokens), static_cast<long long>(p), g.backend(), threads,
          static_cast<long long>(rounds));
      std::printf("  %-34s %10s %14s %12s\n", "mode", "step ms", "params MiB/rank", "x single");
      std::printf("  %-34s %10.2f %14.2f %12.2f\n", "single process", single, single_params / mib,
                  1.0);
      std::printf("  %-34s %10.2f %14.2f %12.2f\n",
                  ("single process, " + std::to_string(threads * p) + " threads").c_str(),
                  single_all, single_params / mib, single / single_all);
      std::printf("  %-34s %10.2f %14.2f %12.2f\n", "tensor parallel", step, tp_params / mib,
                  single / step);
      std::printf("  %-34s %10.2f %14s %12s\n", "  expected: single / p + 2 all-reduce",
                  single / static_cast<double>(p) + 2 * reduce, "", "");
      std::printf("  all-reduce of %.2f MiB (tokens x d, once forward, once backward): %.3f ms\n",
                  reduce_mib, reduce);
      if (!json.empty()) {
        nlohmann::json j = {{"benchmark", "tensor_parallel"},
                            {"hidden", hidden},
                            {"ffn", ffn},
                            {"tokens", tokens},
                            {"ranks", p},
                            {"backend", g.backend()},
                            {"threads_per_rank", threads},
                            {"rounds", rounds},
                            {"single_ms", cli::number(single)},
                            {"single_all_threads_ms", cli::number(single_all)},
                            {"tensor_parallel_ms", cli::number(step)},
                            {"all_reduce_ms", cli::number(reduce)},
                            {"all_reduce_mib", reduce_mib},
                            {"expected_tensor_parallel_ms",
                             cli::number(single / static_cast<double>(p) + 2 * reduce)},
                            {"single_param_mib", single_params / mib},
                            {"tensor_parallel_param_mib_per_rank", tp_params / mib}};
        cli::write_json_report(json, j);
        std::printf("wrote %s\n", json.c_str());
      }
    }
  } catch (const std::exception& e) {
    distributed::abort(std::string("tensor_parallel: ") + e.what());
  }
  return 0;
}
