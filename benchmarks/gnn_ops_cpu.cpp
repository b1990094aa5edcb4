// CPU benchmark of the issue-14 GNN ops on the shapes of a message-passing step (10k nodes,
// 80k edges, 64 features) and of the reductions around it: segment_sum, segment_max
// (scatter_reduce amax), segment_softmax (4 heads), index_add, sort, topk, cumsum, logsumexp,
// norm; forward + backward where differentiable, f32. Prints one line per case (median ms
// over --iters runs after two warm-ups) and optionally writes JSON {"threads": N, "cases":
// {name: ms}} read by benchmarks/peers/pytorch_gnn_ops_cpu.py.
//
// Usage: gnn_ops_cpu [--threads N] [--iters N] [--json PATH]
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "apps/common/op_bench.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;

namespace {

Tensor leaf(const Shape& s) {
  Tensor t = randn(s);
  t.requires_grad_();
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  apps::OpBench bench("gnn_ops_cpu",
                      "The GNN ops (segment sum/max/softmax, index_add, sort, topk, cumsum, "
                      "logsumexp, norm), forward + backward, median ms per case; compare with "
                      "benchmarks/peers/pytorch_gnn_ops_cpu.py.");
  bench.parse(argc, argv);
  const int64_t N = 10000, E = 80000, F = 64;
  const Tensor dst = mul(rand({E}), static_cast<double>(N)).to(DType::i64);
  Tensor msg = leaf({E, F}), att = leaf({E, 4}), x = leaf({N, F});
  bench.run("segment_sum E80k F64 -> N10k", [&] { sum(segment_sum(msg, dst, N)).backward(); });
  bench.run("index_add E80k F64 -> N10k", [&] { sum(index_add(x, 0, dst, msg)).backward(); });
  bench.run("segment_max E80k F64 -> N10k", [&] { sum(segment_max(msg, dst, N)).backward(); });
  bench.run("segment_softmax E80k H4",
            [&] { sum(mul(segment_softmax(att, dst, N), att)).backward(); });
  Tensor s = leaf({1024, 1024});
  bench.run("sort 1024x1024 dim -1", [&] { sum(sort(s, -1).first).backward(); });
  bench.run("topk k16 1024x1024 dim -1", [&] { sum(topk(s, 16, -1).first).backward(); });
  Tensor c = leaf({256, 4096});
  bench.run("cumsum 256x4096 dim -1", [&] { sum(cumsum(c, -1)).backward(); });
  bench.run("cumsum 256x4096 dim 0", [&] { sum(cumsum(c, 0)).backward(); });
  bench.run("logsumexp 256x4096 dim -1", [&] { sum(logsumexp(c, {-1})).backward(); });
  bench.run("norm 2 256x4096 dim -1", [&] { sum(norm(c, 2, {-1})).backward(); });
  return bench.finish();
}
