// CPU benchmark of the issue-14 GNN ops on the shapes of a message-passing step (10k nodes,
// 80k edges, 64 features) and of the reductions around it: segment_sum, segment_max
// (scatter_reduce amax), segment_softmax (4 heads), index_add, sort, topk, cumsum, logsumexp,
// norm; forward + backward where differentiable, f32. Prints one line per case (median ms
// over --iters runs after two warm-ups) and optionally writes JSON {"threads": N, "cases":
// {name: ms}} read by benchmarks/peers/pytorch_gnn_ops_cpu.py.
//
// Usage: gnn_ops_cpu [--threads N] [--iters N] [--json PATH]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "examples/common/cli.hpp"

using namespace dltrain;

namespace {

double median_ms(const std::function<void()>& f, int iters) {
  f();
  f();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Tensor leaf(const Shape& s) {
  Tensor t = randn(s);
  t.requires_grad_();
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, iters = 20;
  std::string json;
  cli::Flags flags("gnn_ops_cpu",
                   "The GNN ops (segment sum/max/softmax, index_add, sort, topk, cumsum, "
                   "logsumexp, norm), forward + backward, median ms per case; compare with "
                   "benchmarks/peers/pytorch_gnn_ops_cpu.py.");
  flags.group(cli::group::kBenchmark);
  flags.add("--threads", &threads, "CPU threads").positive();
  flags.add("--iters", &iters, "timed iterations per case (the median is reported)").positive();
  flags.add("--json", &json, "write the figures here").value_name("FILE.json");
  flags.parse(argc, argv);
  set_num_threads(threads);
  manual_seed(0);
  std::vector<std::pair<std::string, double>> results;
  auto run = [&](const std::string& name, const std::function<void()>& f) {
    const double ms = median_ms(f, iters);
    std::printf("%-44s %9.3f ms\n", name.c_str(), ms);
    std::fflush(stdout);
    results.emplace_back(name, ms);
  };
  const int64_t N = 10000, E = 80000, F = 64;
  const Tensor dst = mul(rand({E}), static_cast<double>(N)).to(DType::i64);
  Tensor msg = leaf({E, F}), att = leaf({E, 4}), x = leaf({N, F});
  run("segment_sum E80k F64 -> N10k", [&] { sum(segment_sum(msg, dst, N)).backward(); });
  run("index_add E80k F64 -> N10k", [&] { sum(index_add(x, 0, dst, msg)).backward(); });
  run("segment_max E80k F64 -> N10k", [&] { sum(segment_max(msg, dst, N)).backward(); });
  run("segment_softmax E80k H4", [&] { sum(mul(segment_softmax(att, dst, N), att)).backward(); });
  Tensor s = leaf({1024, 1024});
  run("sort 1024x1024 dim -1", [&] { sum(sort(s, -1).first).backward(); });
  run("topk k16 1024x1024 dim -1", [&] { sum(topk(s, 16, -1).first).backward(); });
  Tensor c = leaf({256, 4096});
  run("cumsum 256x4096 dim -1", [&] { sum(cumsum(c, -1)).backward(); });
  run("cumsum 256x4096 dim 0", [&] { sum(cumsum(c, 0)).backward(); });
  run("logsumexp 256x4096 dim -1", [&] { sum(logsumexp(c, {-1})).backward(); });
  run("norm 2 256x4096 dim -1", [&] { sum(norm(c, 2, {-1})).backward(); });
  if (!json.empty()) {
    nlohmann::json cases = nlohmann::json::object();
    for (const auto& [case_name, ms] : results) cases[case_name] = ms;
    cli::write_json_report(json, {{"threads", threads}, {"cases", cases}});
  }
  return 0;
}
