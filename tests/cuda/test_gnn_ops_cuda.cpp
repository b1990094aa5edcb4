// The second batch of issue-14 ops on CUDA against the CPU: scatter_reduce (every reduction,
// with and without self), index_add, segment_max, segment_softmax, logsumexp, cumsum, prod,
// norm, sort/argsort/topk (ties, NaN, lines long enough for CUB's large-segment path), any,
// all, nonzero, repeat, flip, roll, tril, triu. Every output (indices exactly) and every input
// gradient from the same inputs: f32, f64, and f16/bf16 against the CPU's f32 result of the
// same rounded inputs. Errors are measured relative to the largest reference value. Also: graph
// batches (data::GraphDataset) pinned by the DataLoader and copied by DevicePrefetcher.
// GPU-only: without a GPU tests/cuda/main.cpp exits with ctest's skip code.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "tests/cuda/cuda_test_util.hpp"

using namespace dltrain;
using namespace dltrain::test;

namespace {

using V = std::vector<Tensor>;
using Fn = std::function<V(const V&)>;

Tensor rnd(const Shape& s, uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(s, DType::f32, &g), scale);
}
Tensor rnd_index(const Shape& s, int64_t n, uint64_t seed) {
  Generator g(seed);
  return mul(rand(s, DType::f64, &g), static_cast<double>(n)).to(DType::i64);
}

struct Run {
  V outs;   // on the CPU; floating ones in f64
  V grads;  // on the CPU, f64 (undefined where no gradient)
};

// f on copies of `inputs` on dev (floating ones as leaves); backward from the first output
// (when it has a gradient) seeded with gy.
Run run_on(Device dev, const Fn& f, const V& inputs, const Tensor& gy) {
  V leaves;
  for (const Tensor& t : inputs) {
    Tensor l = (dev.is_cpu() ? t.clone() : t.to(dev)).detach();
    if (is_floating(l.dtype())) l.requires_grad_();
    leaves.push_back(l);
  }
  const V outs = f(leaves);
  Run r;
  for (const Tensor& o : outs) {
    REQUIRE(o.device() == dev);
    Tensor c = o.detach().to(Device::cpu());
    r.outs.push_back(is_floating(c.dtype()) ? c.to(DType::f64) : c);
  }
  if (outs[0].requires_grad()) outs[0].backward(gy.to(outs[0].dtype()).to(dev));
  for (const Tensor& l : leaves)
    r.grads.push_back(l.grad().defined() ? l.grad().to(Device::cpu()).to(DType::f64) : Tensor());
  return r;
}

double tol_for(DType dt) {
  switch (dt) {
    case DType::f16:
      return 5e-3;
    case DType::bf16:
      return 3e-2;
    case DType::f64:
      return 1e-11;
    default:
      return 1e-5;
  }
}

void check(const std::string& name, const Fn& f, const V& inputs, DType dt) {
  const double tol = tol_for(dt);
  const DType ref_dt = ref_dtype(dt);
  V in_dt, in_ref;
  for (const Tensor& t : inputs) {
    const bool fl = is_floating(t.dtype());
    in_dt.push_back(fl ? t.to(dt) : t);
    in_ref.push_back(fl ? t.to(dt).to(ref_dt) : t);
  }
  Tensor probe;
  {
    NoGradGuard ng;
    probe = f(in_ref)[0];
  }
  const Tensor gy = rnd(probe.shape(), 1000).to(dt).to(ref_dt);
  const Run want = run_on(Device::cpu(), f, in_ref, gy);
  const Run got = run_on(kCuda, f, in_dt, gy);
  const std::string tag = name + " [" + dt_str(dt) + "]";
  for (size_t i = 0; i < want.outs.size(); ++i)
    check_close(got.outs[i], want.outs[i], 0, 0, tag + " output " + std::to_string(i), tol);
  for (size_t i = 0; i < want.grads.size(); ++i) {
    INFO(tag << " grad of input " << i);
    REQUIRE(got.grads[i].defined() == want.grads[i].defined());
    if (want.grads[i].defined())
      check_close(got.grads[i], want.grads[i], 0, 0, tag + " grad of input " + std::to_string(i),
                  tol);
  }
}

void check_all(const std::string& name, const Fn& f, const V& inputs) {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) check(name, f, inputs, dt);
}

Fn one(std::function<Tensor(const V&)> f) {
  return [f](const V& v) { return V{f(v)}; };
}

const std::vector<std::pair<std::string, ScatterReduce>> kReduces{{"sum", ScatterReduce::Sum},
                                                                  {"mean", ScatterReduce::Mean},
                                                                  {"amax", ScatterReduce::Amax},
                                                                  {"amin", ScatterReduce::Amin}};

}  // namespace

TEST_CASE("scatter_reduce and index_add on CUDA match the CPU", "[cuda][gpu]") {
  // 300 values into 50 rows (some rows get nothing), along dim 0 and dim 1.
  const Tensor x = rnd({50, 8}, 1), src = rnd({300, 8}, 2), index = rnd_index({300, 8}, 45, 3);
  const Tensor xt = rnd({8, 50}, 4), srct = rnd({8, 300}, 5), indext = rnd_index({8, 300}, 45, 6);
  for (const auto& [name, r] : kReduces)
    for (bool inc : {true, false}) {
      const std::string tag = "scatter_reduce " + name + (inc ? " include_self" : " exclude_self");
      check_all(tag + " dim 0", one([r = r, inc](const V& v) {
                  return scatter_reduce(v[0], 0, v[2], v[1], r, inc);
                }),
                {x, src, index});
      check_all(tag + " dim 1", one([r = r, inc](const V& v) {
                  return scatter_reduce(v[0], 1, v[2], v[1], r, inc);
                }),
                {xt, srct, indext});
    }
  const Tensor rows = rnd_index({300}, 50, 7);
  check_all("index_add dim 0", one([](const V& v) { return index_add(v[0], 0, v[2], v[1], 0.5); }),
            {x, src, rows});
  check_all("index_add dim 1", one([](const V& v) { return index_add(v[0], 1, v[2], v[1]); }),
            {xt, srct, rows});
  // amax is order-independent: two runs agree bit for bit.
  const Tensor a =
      scatter_reduce(x.to(kCuda), 0, index.to(kCuda), src.to(kCuda), ScatterReduce::Amax, false);
  const Tensor b =
      scatter_reduce(x.to(kCuda), 0, index.to(kCuda), src.to(kCuda), ScatterReduce::Amax, false);
  CHECK(a.to(Device::cpu()).to_vector<float>() == b.to(Device::cpu()).to_vector<float>());
}

TEST_CASE("segment_max and segment_softmax on CUDA match the CPU", "[cuda][gpu]") {
  const Tensor ids = rnd_index({400}, 60, 11);  // 64 segments, some empty
  check_all("segment_max", one([](const V& v) { return segment_max(v[0], v[1], 64); }),
            {rnd({400, 16}, 12), ids});
  check_all("segment_softmax", one([](const V& v) { return segment_softmax(v[0], v[1], 64); }),
            {rnd({400, 4}, 13, 4.0), ids});
  check_all("segment_softmax 1-d", one([](const V& v) { return segment_softmax(v[0], v[1], 64); }),
            {rnd({400}, 14, 4.0), ids});
}

TEST_CASE("logsumexp, cumsum, prod and norm on CUDA match the CPU", "[cuda][gpu]") {
  const Tensor x = rnd({6, 7, 33}, 21);
  check_all("logsumexp dim 1", one([](const V& v) { return logsumexp(v[0], {1}); }), {x});
  check_all("logsumexp all", one([](const V& v) { return logsumexp(v[0], {}); }), {x});
  check_all("cumsum dim 0", one([](const V& v) { return cumsum(v[0], 0); }), {x});
  check_all("cumsum last dim", one([](const V& v) { return cumsum(v[0], -1); }), {x});
  // Long last-dim lines: CUB's block scan (several lines) and device-wide scan (one line),
  // forward and reverse (the gradient).
  check_all("cumsum long lines", one([](const V& v) { return cumsum(v[0], 1); }),
            {rnd({3, 5000}, 24)});
  check_all("cumsum 1-d", one([](const V& v) { return cumsum(v[0], 0); }), {rnd({70000}, 25)});
  check("cumsum int64 1-d", one([](const V& v) { return cumsum(v[0], 0); }),
        {rnd_index({70000}, 9, 26)}, DType::f32);
  Tensor xp = add(rnd({5, 9, 4}, 22, 0.3), 1.0);
  xp.select(0, 1).select(0, 3).fill_(0.0);
  xp.select(0, 2).select(0, 0).fill_(0.0);
  xp.select(0, 2).select(0, 5).fill_(0.0);
  check_all("prod dim 1", one([](const V& v) { return prod(v[0], 1); }), {xp});
  check_all("prod dim -1 keepdim", one([](const V& v) { return prod(v[0], -1, true); }), {xp});
  const V ints{rnd_index({4, 50}, 7, 23)};
  check("cumsum int64", one([](const V& v) { return cumsum(v[0], 1); }), ints, DType::f32);
  check("prod int64", one([](const V& v) { return prod(v[0], 0); }), ints, DType::f32);
  for (double p : {1.0, 2.0, 3.0, static_cast<double>(INFINITY)}) {
    check_all("norm p=" + std::to_string(p), one([p](const V& v) {
                return norm(v[0], p, {0, 2});
              }),
              {x});
  }
  check_all("norm 2 all", one([](const V& v) { return norm(v[0]); }), {x});
}

TEST_CASE("sort, argsort and topk on CUDA match the CPU", "[cuda][gpu]") {
  // Whole numbers (ties) and NaN; short lines and long ones (CUB's large-segment path).
  for (int64_t L : {7, 300, 5000}) {
    Tensor x = mul(rnd({5, L}, 31 + L), 3.0).to(DType::i64).to(DType::f32);
    x.select(0, 2).narrow(0, 1, 1).fill_(NAN);
    x.select(0, 3).narrow(0, L - 1, 1).fill_(NAN);
    for (bool desc : {false, true}) {
      const std::string tag = " L=" + std::to_string(L) + (desc ? " descending" : "");
      check_all("sort dim 1" + tag,
                [desc](const V& v) {
                  auto [a, b] = sort(v[0], 1, desc);
                  return V{a, b};
                },
                {x});
      check_all("sort dim 0" + tag,
                [desc](const V& v) {
                  auto [a, b] = sort(v[0], 0, desc);
                  return V{a, b};
                },
                {x});
      check("argsort int64" + tag, one([desc](const V& v) { return argsort(v[0], -1, desc); }),
            {masked_fill(x, ne(x, x), 0.0).to(DType::i64)}, DType::f32);
    }
    check_all("topk" + std::to_string(L),
              [](const V& v) {
                auto [a, b] = topk(v[0], 5, 1);
                return V{a, b};
              },
              {rnd({5, L}, 40 + L)});
    check_all("topk smallest dim 0" + std::to_string(L),
              [](const V& v) {
                auto [a, b] = topk(v[0], 2, 0, false);
                return V{a, b};
              },
              {rnd({5, L}, 50 + L)});
  }
}

TEST_CASE("any, all, nonzero, repeat, flip, roll, tril, triu on CUDA match the CPU",
          "[cuda][gpu]") {
  Tensor x = rnd({4, 5, 6}, 61);
  Tensor sparse = mul(x, gt(x, 0.8).to(DType::f32));
  check(
      "any/all",
      [](const V& v) {
        return V{any(v[0]), all(v[0]), any(v[0], {1}), all(gt(v[0], -10.0), {0, 2}, true)};
      },
      {sparse}, DType::f32);
  check("nonzero", one([](const V& v) { return nonzero(v[0]); }), {sparse}, DType::f32);
  check("nonzero large", one([](const V& v) { return nonzero(v[0]); }),
        {gt(rnd({300, 1000}, 62), 2.0).to(DType::f32)}, DType::f32);
  check("nonzero empty", one([](const V& v) { return nonzero(v[0]); }), {zeros({3, 2})},
        DType::f32);
  check_all("repeat", one([](const V& v) { return repeat(v[0], {2, 1, 1, 3}); }), {x});
  check_all("flip", one([](const V& v) { return flip(v[0], {0, 2}); }), {x});
  check_all("roll", one([](const V& v) { return roll(v[0], {2, -7}, {1, 2}); }), {x});
  check_all("roll flat", one([](const V& v) { return roll(v[0], {11}); }), {x});
  for (int64_t k : {-2, 0, 3}) {
    check_all("tril " + std::to_string(k), one([k](const V& v) { return tril(v[0], k); }), {x});
    check_all("triu " + std::to_string(k), one([k](const V& v) { return triu(v[0], k); }), {x});
  }
}

TEST_CASE("graph batches reach the GPU with every field (pinned, DevicePrefetcher)",
          "[cuda][gpu]") {
  std::vector<data::Graph> gs;
  for (int64_t k = 0; k < 5; ++k) {
    const int64_t N = 3 + k;
    gs.push_back({rnd({N, 4}, 70 + static_cast<uint64_t>(k)), rnd_index({2, 2 * N}, N, 80),
                  rnd({2 * N, 2}, 90), rnd({2 * N}, 95)});
  }
  auto ds = std::make_shared<data::GraphDataset>(gs);
  data::DataLoader loader(ds, {.batch_size = 2, .num_workers = 1, .pin_memory = true});
  std::vector<data::Batch> host;
  for (const data::Batch& b : loader) {
    CHECK(b.field("edge_index").is_pinned());
    host.push_back(b);
  }
  size_t i = 0;
  for (const data::Batch& b : data::DevicePrefetcher(loader, kCuda)) {
    REQUIRE(i < host.size());
    CHECK(b.size() == host[i].size());
    REQUIRE(b.fields.size() == host[i].fields.size());
    for (size_t f = 0; f < b.fields.size(); ++f) {
      INFO(b.fields[f].first);
      CHECK(b.fields[f].second.device() == kCuda);
      check_close(b.fields[f].second.to(Device::cpu()), host[i].fields[f].second, 0, 0,
                  "graph batch field");
    }
    const data::GraphBatch g = data::GraphBatch::from(b);
    CHECK(segment_softmax(g.x, g.batch, g.num_graphs).device() == kCuda);
    ++i;
  }
  CHECK(i == host.size());
}
