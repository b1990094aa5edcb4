// amp::autocast on the CPU: the policy table op by op (output dtypes under f16 and bf16),
// regions (nesting, per device type, disabled regions, bad dtypes), the weight-cast cache,
// backward dtypes (gradients equal to the explicitly cast graph's, f32 gradients for f32
// leaves), batch norm with a 16-bit input and f32 parameters, and f64 finite-difference checks
// of every listed op run through the autocast entry.
#include <catch2/catch.hpp>

#include <functional>

#include "dltrain/amp/autocast.hpp"
#include "gradcheck.hpp"
#include "tests/amp/policy_ops.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::leaf;
using dltrain::testing::rnd;
using V = std::vector<Tensor>;

namespace {

constexpr DeviceType kCPU = DeviceType::CPU;

// Calls `op` with inputs of dtype `a` (and, for two-operand ops, a second of dtype `b`).
Tensor run_op(amp::Op op, DType a, DType b) {
  return testing::run_policy_op(op, a, b, Device::cpu());
}

}  // namespace

TEST_CASE("the policy table lists every op once, in order", "[amp][autocast]") {
  const auto table = amp::policy_table();
  REQUIRE(table.size() == 31);
  for (size_t i = 0; i < table.size(); ++i) {
    CHECK(static_cast<size_t>(table[i].op) == i);
    CHECK(&amp::policy(table[i].op) == &table[i]);
  }
  CHECK(amp::policy(amp::Op::conv2d).policy == amp::CastPolicy::LowerPrecision);
  CHECK(amp::policy(amp::Op::conv_transpose2d).policy == amp::CastPolicy::LowerPrecision);
  CHECK(amp::policy(amp::Op::softmax).policy == amp::CastPolicy::Float32);
  CHECK(amp::policy(amp::Op::cat).policy == amp::CastPolicy::Promote);
}

TEST_CASE("every listed op has the policy's output dtype under f16 and bf16 autocast",
          "[amp][autocast]") {
  for (DType low : {DType::f16, DType::bf16}) {
    const DType other = low == DType::f16 ? DType::bf16 : DType::f16;
    for (const amp::OpPolicy& row : amp::policy_table()) {
      INFO(row.name << " under autocast " << low);
      amp::autocast ac(kCPU, low);
      switch (row.policy) {
        case amp::CastPolicy::LowerPrecision:
          // f32 operands, and operands of the other 16-bit type, both go to the region's dtype.
          CHECK(run_op(row.op, DType::f32, DType::f32).dtype() == low);
          CHECK(run_op(row.op, other, DType::f32).dtype() == low);
          // f64 is never touched (as PyTorch): an all-f64 call stays f64.
          CHECK(run_op(row.op, DType::f64, DType::f64).dtype() == DType::f64);
          break;
        case amp::CastPolicy::Float32:
          CHECK(run_op(row.op, low, low).dtype() == DType::f32);
          CHECK(run_op(row.op, DType::f32, low).dtype() == DType::f32);
          CHECK(run_op(row.op, DType::f64, DType::f64).dtype() == DType::f64);
          break;
        case amp::CastPolicy::Promote:
          CHECK(run_op(row.op, low, low).dtype() == low);
          CHECK(run_op(row.op, low, DType::f32).dtype() == DType::f32);
          CHECK(run_op(row.op, DType::f32, low).dtype() == DType::f32);
          CHECK(run_op(row.op, low, other).dtype() == DType::f32);
          break;
      }
    }
  }
}

TEST_CASE("outside a region, or in a disabled one, ops keep their dtypes", "[amp][autocast]") {
  const Tensor a = rnd({2, 3}, 1, DType::f32), b = rnd({3, 2}, 2, DType::f32);
  CHECK_FALSE(amp::is_autocast_enabled(kCPU));
  CHECK(mm(a, b).dtype() == DType::f32);
  CHECK(softmax(a.to(DType::bf16), 1).dtype() == DType::bf16);
  // Mixed operands are still an error for matrix products outside autocast, as in PyTorch.
  REQUIRE_THROWS_WITH(mm(a, b.to(DType::bf16)), Contains("same dtype"));
  {
    amp::autocast ac(kCPU, DType::bf16, /*enabled=*/false);
    CHECK_FALSE(amp::is_autocast_enabled(kCPU));
    CHECK(mm(a, b).dtype() == DType::f32);
  }
  // A CUDA region does not touch CPU tensors.
  {
    amp::autocast ac(DeviceType::CUDA);
    CHECK(amp::is_autocast_enabled(DeviceType::CUDA));
    CHECK(mm(a, b).dtype() == DType::f32);
  }
  CHECK_FALSE(amp::is_autocast_enabled(DeviceType::CUDA));
}

TEST_CASE("regions nest and restore the outer state", "[amp][autocast]") {
  const Tensor a = rnd({2, 3}, 1, DType::f32), b = rnd({3, 2}, 2, DType::f32);
  CHECK(amp::get_autocast_dtype(kCPU) == DType::bf16);
  CHECK(amp::get_autocast_dtype(DeviceType::CUDA) == DType::f16);
  {
    amp::autocast outer(kCPU);  // the CPU default: bf16
    CHECK(mm(a, b).dtype() == DType::bf16);
    {
      amp::autocast inner(kCPU, DType::f16);
      CHECK(amp::get_autocast_dtype(kCPU) == DType::f16);
      CHECK(mm(a, b).dtype() == DType::f16);
      {
        amp::autocast off(kCPU, std::nullopt, false);
        CHECK(mm(a, b).dtype() == DType::f32);
      }
      CHECK(mm(a, b).dtype() == DType::f16);
    }
    CHECK(amp::get_autocast_dtype(kCPU) == DType::bf16);
    CHECK(mm(a, b).dtype() == DType::bf16);
  }
  CHECK_FALSE(amp::is_autocast_enabled(kCPU));
}

TEST_CASE("autocast refuses dtypes other than f16 and bf16", "[amp][autocast]") {
  REQUIRE_THROWS_WITH(amp::autocast(kCPU, DType::f32), Contains("float16 or bfloat16"));
  REQUIRE_THROWS_WITH(amp::autocast(kCPU, DType::f64), Contains("DType::bf16"));
  CHECK_FALSE(amp::is_autocast_enabled(kCPU));
}

TEST_CASE("an op's internals are not autocast a second time", "[amp][autocast]") {
  // mean is not a listed op; its internal sum must not turn the result into f32.
  const Tensor x = rnd({4, 5}, 3, DType::bf16);
  amp::autocast ac(kCPU);
  CHECK(mean(x).dtype() == DType::bf16);
  CHECK(var(x, {1}).dtype() == DType::bf16);
  CHECK(sum(x).dtype() == DType::f32);  // sum itself is listed
  // linear on the CPU is composed of matmul and add: all in bf16, one cast per operand.
  const Tensor w = rnd({3, 5}, 4, DType::f32);
  CHECK(linear(x, w, rnd({3}, 5, DType::f32)).dtype() == DType::bf16);
}

TEST_CASE("a weight is cast once per region and the cache empties when it closes",
          "[amp][autocast][cache]") {
  Tensor w = rnd({3, 4}, 1, DType::f32);
  w.requires_grad_();
  const Tensor x = rnd({2, 3}, 2, DType::f32);
  // The cast node feeding the weight operand of mm (its input 1).
  auto cast_node = [](const Tensor& y) { return y.grad_fn()->next_edges()[1].node.get(); };
  {
    amp::autocast ac(kCPU);
    Tensor y1 = mm(x, w), y2 = mm(x, w), y3 = mm(relu(x), w);
    CHECK(amp::autocast_cache_size() == 1);
    REQUIRE(cast_node(y1) != nullptr);
    CHECK(cast_node(y1)->name() == "to_dtype");
    CHECK(cast_node(y2) == cast_node(y1));
    CHECK(cast_node(y3) == cast_node(y1));
    {
      amp::autocast inner(kCPU);  // a nested region shares the cache
      CHECK(cast_node(mm(x, w)) == cast_node(y1));
    }
    CHECK(amp::autocast_cache_size() == 1);
    // The activation x (no grad) and non-leaf tensors are cast at every use, never cached.
    Tensor h = mul(w, 2.0);
    (void)mm(x, h.t().t());
    CHECK(amp::autocast_cache_size() == 1);
    // The gradient of the three uses reaches the f32 master weight in f32.
    sum(add(add(y1, y2), y3)).backward();
    CHECK(amp::autocast_cache_size() == 0);  // backward drops the cache (a step may follow)
    REQUIRE(w.grad().dtype() == DType::f32);
  }
  CHECK(amp::autocast_cache_size() == 0);
  {
    amp::autocast ac(kCPU, std::nullopt, true, /*cache_enabled=*/false);
    Tensor y1 = mm(x, w), y2 = mm(x, w);
    CHECK(amp::autocast_cache_size() == 0);
    CHECK(cast_node(y1) != cast_node(y2));
  }
}

TEST_CASE("a cast made without grad mode is not reused with grad mode on",
          "[amp][autocast][cache]") {
  Tensor w = rnd({3, 4}, 1, DType::f32);
  w.requires_grad_();
  const Tensor x = rnd({2, 3}, 2, DType::f32);
  amp::autocast ac(kCPU);
  {
    NoGradGuard ng;
    CHECK_FALSE(mm(x, w).requires_grad());
  }
  Tensor y = mm(x, w);
  REQUIRE(y.requires_grad());
  sum(y).backward();
  CHECK(w.grad().defined());
}

TEST_CASE("a weight updated in place between steps in one region is cast again",
          "[amp][autocast][cache]") {
  Tensor w = rnd({3, 4}, 1, DType::f32);
  w.requires_grad_();
  const Tensor x = rnd({2, 3}, 2, DType::f32);
  amp::autocast ac(kCPU);
  for (int step = 0; step < 3; ++step) {
    Tensor y = mm(x, w);
    // Equal to the product with the weight as it is now (not a stale cached copy).
    CHECK(allclose(y.detach().to(DType::f32),
                   mm(x.to(DType::bf16), w.detach().to(DType::bf16)).to(DType::f32), 0, 0));
    sum(y).backward();
    NoGradGuard ng;
    add_(w, w.grad(), -0.5);
    w.set_grad(Tensor());
  }
}

TEST_CASE("backward runs in the dtypes forward chose and f32 leaves get f32 gradients",
          "[amp][autocast][grad]") {
  for (DType low : {DType::bf16, DType::f16}) {
    INFO("autocast " << low);
    // A two-layer MLP: linear -> relu -> linear -> cross_entropy.
    Tensor w1 = rnd({8, 5}, 1, DType::f32), b1 = rnd({8}, 2, DType::f32);
    Tensor w2 = rnd({3, 8}, 3, DType::f32), b2 = rnd({3}, 4, DType::f32);
    for (Tensor* p : {&w1, &b1, &w2, &b2}) p->requires_grad_();
    const Tensor x = rnd({6, 5}, 5, DType::f32);
    const Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 0, 1, 2});
    Tensor loss;
    {
      amp::autocast ac(kCPU, low);
      Tensor logits = linear(relu(linear(x, w1, b1)), w2, b2);
      CHECK(logits.dtype() == low);
      loss = cross_entropy(logits, y);
      CHECK(loss.dtype() == DType::f32);
    }
    loss.backward();
    V auto_grads;
    for (Tensor* p : {&w1, &b1, &w2, &b2}) {
      CHECK(p->grad().dtype() == DType::f32);
      auto_grads.push_back(p->grad());
      p->set_grad(Tensor());
    }
    // The same graph with the casts written out: gradients must be bit-identical.
    auto c = [&](const Tensor& t) { return t.to(low); };
    Tensor logits = linear(relu(linear(c(x), c(w1), c(b1))), c(w2), c(b2));
    cross_entropy(logits.to(DType::f32), y).backward();
    int k = 0;
    for (Tensor* p : {&w1, &b1, &w2, &b2}) CHECK(allclose(p->grad(), auto_grads[k++], 0, 0));
  }
}

TEST_CASE("batch_norm takes a 16-bit input with f32 parameters and statistics",
          "[amp][autocast][norm]") {
  for (DType low : {DType::bf16, DType::f16}) {
    INFO("input " << low);
    const Tensor x32 = rnd({4, 3, 5, 5}, 1, DType::f32);
    const Tensor x = x32.to(low).requires_grad_();
    Tensor w = rnd({3}, 2, DType::f32).requires_grad_();
    Tensor b = rnd({3}, 3, DType::f32).requires_grad_();
    Tensor rm = zeros({3}), rv = ones({3});
    Tensor y = batch_norm(x, w, b, rm, rv, /*training=*/true);
    CHECK(y.dtype() == low);
    CHECK(rm.dtype() == DType::f32);
    // Against f32 batch norm of the same (rounded) values.
    Tensor rm32 = zeros({3}), rv32 = ones({3});
    const Tensor xr = x.detach().to(DType::f32).requires_grad_();
    Tensor w32 = w.detach().clone().requires_grad_(), b32 = b.detach().clone().requires_grad_();
    Tensor y32 = batch_norm(xr, w32, b32, rm32, rv32, true);
    CHECK(allclose(rm, rm32, 1e-6, 1e-6));
    CHECK(allclose(rv, rv32, 1e-6, 1e-6));
    CHECK(allclose(y.to(DType::f32), y32, low == DType::bf16 ? 1e-2 : 2e-3, 1e-2));
    const Tensor g = rnd({4, 3, 5, 5}, 4, DType::f32);
    sum(mul(y, g.to(low))).backward();
    sum(mul(y32, g.to(low).to(DType::f32))).backward();
    CHECK(x.grad().dtype() == low);
    REQUIRE(w.grad().dtype() == DType::f32);
    REQUIRE(b.grad().dtype() == DType::f32);
    CHECK(allclose(w.grad(), w32.grad(), 1e-4, 1e-4));
    CHECK(allclose(b.grad(), b32.grad(), 1e-4, 1e-4));
  }
  // In a model under autocast: conv (bf16) -> BatchNorm2d (f32 parameters) -> bf16 output.
  nn::Sequential net;
  net.push_back(std::make_shared<nn::Conv2d>(3, 4, 3, nn::Conv2dOptions{.padding = 1}))
      .push_back(std::make_shared<nn::BatchNorm2d>(4));
  const Tensor in = rnd({2, 3, 6, 6}, 5, DType::f32).contiguous(MemoryFormat::ChannelsLast);
  amp::autocast ac(kCPU);
  Tensor out = net.forward(in);
  CHECK(out.dtype() == DType::bf16);
  CHECK(out.is_contiguous(MemoryFormat::ChannelsLast));
  for (const auto& [name, t] : net.state_dict()) {
    INFO(name);
    if (is_floating(t.dtype())) CHECK(t.dtype() == DType::f32);
  }
}

TEST_CASE("every listed op keeps exact f64 gradients through the autocast entry",
          "[amp][autocast][grad]") {
  amp::autocast ac(kCPU);  // f64 is never cast, but every call goes through the entry
  const Tensor labels = from_vector(std::vector<int64_t>{0, 2, 1});
  const Tensor idx = from_vector(std::vector<int64_t>{0, 1, 2, 2, 1, 0, 1, 1, 0}, {3, 3});
  using F = std::function<Tensor(const V&)>;
  const std::vector<std::pair<amp::Op, std::pair<F, V>>> cases = {
      {amp::Op::conv2d,
       {[](const V& v) { return conv2d(v[0], v[1], v[2], 1, 1); },
        {leaf({1, 2, 4, 4}, 1), leaf({3, 2, 3, 3}, 2), leaf({3}, 3)}}},
      {amp::Op::conv_transpose2d,
       {[](const V& v) { return conv_transpose2d(v[0], v[1], v[2], 2, 1, 1); },
        {leaf({1, 2, 3, 3}, 36), leaf({2, 3, 3, 3}, 37), leaf({3}, 38)}}},
      {amp::Op::linear,
       {[](const V& v) { return linear(v[0], v[1], v[2]); },
        {leaf({3, 4}, 4), leaf({2, 4}, 5), leaf({2}, 6)}}},
      {amp::Op::mm,
       {[](const V& v) { return mm(v[0], v[1]); }, {leaf({3, 4}, 7), leaf({4, 2}, 8)}}},
      {amp::Op::bmm,
       {[](const V& v) { return bmm(v[0], v[1]); }, {leaf({2, 3, 4}, 9), leaf({2, 4, 2}, 10)}}},
      {amp::Op::matmul,
       {[](const V& v) { return matmul(v[0], v[1]); }, {leaf({2, 3, 4}, 11), leaf({4, 2}, 12)}}},
      {amp::Op::exp, {[](const V& v) { return exp(v[0]); }, {leaf({3, 3}, 13)}}},
      {amp::Op::log,
       {[](const V& v) { return log(add(mul(v[0], v[0]), 1.0)); }, {leaf({3, 3}, 14)}}},
      {amp::Op::pow,
       {[](const V& v) { return pow(add(mul(v[0], v[0]), 1.0), v[1]); },
        {leaf({3, 3}, 15), leaf({3, 3}, 16)}}},
      {amp::Op::rsqrt,
       {[](const V& v) { return rsqrt(add(mul(v[0], v[0]), 1.0)); }, {leaf({3, 3}, 17)}}},
      {amp::Op::softmax, {[](const V& v) { return softmax(v[0], 1); }, {leaf({3, 4}, 18)}}},
      {amp::Op::log_softmax, {[](const V& v) { return log_softmax(v[0], 0); }, {leaf({3, 4}, 19)}}},
      {amp::Op::layer_norm,
       {[](const V& v) { return layer_norm(v[0], {4}, v[1], v[2]); },
        {leaf({3, 4}, 20), leaf({4}, 21), leaf({4}, 22)}}},
      {amp::Op::sum, {[](const V& v) { return sum(v[0], {1}); }, {leaf({3, 4}, 23)}}},
      {amp::Op::cross_entropy,
       {[&](const V& v) { return cross_entropy(v[0], labels); }, {leaf({3, 4}, 24)}}},
      {amp::Op::nll_loss,
       {[&](const V& v) { return nll_loss(log_softmax(v[0], 1), labels); }, {leaf({3, 4}, 25)}}},
      {amp::Op::mse_loss,
       {[](const V& v) { return mse_loss(v[0], v[1]); }, {leaf({3, 4}, 26), leaf({3, 4}, 27)}}},
      {amp::Op::binary_cross_entropy_with_logits,
       {[](const V& v) { return binary_cross_entropy_with_logits(v[0], sigmoid(v[1])); },
        {leaf({3, 4}, 28), leaf({3, 4}, 29)}}},
      {amp::Op::cat,
       {[](const V& v) {
          return cat({v[0], v[1]}, 1);
        },
        {leaf({3, 2}, 30), leaf({3, 4}, 31)}}},
      {amp::Op::stack,
       {[](const V& v) {
          return stack({v[0], v[1]}, 1);
        },
        {leaf({3, 4}, 32), leaf({3, 4}, 33)}}},
      {amp::Op::scatter_add,
       {[&](const V& v) { return scatter_add(v[0], 1, idx, v[1]); },
        {leaf({3, 3}, 34), leaf({3, 3}, 35)}}},
      {amp::Op::log1p, {[](const V& v) { return log1p(mul(v[0], v[0])); }, {leaf({3, 3}, 39)}}},
      {amp::Op::expm1, {[](const V& v) { return expm1(v[0]); }, {leaf({3, 3}, 40)}}},
      {amp::Op::softplus, {[](const V& v) { return softplus(v[0], 2.0); }, {leaf({3, 3}, 41)}}},
      {amp::Op::l1_loss,
       {[](const V& v) { return l1_loss(v[0], v[1]); }, {leaf({3, 4}, 42), leaf({3, 4}, 43)}}},
      {amp::Op::smooth_l1_loss,
       {[](const V& v) { return smooth_l1_loss(v[0], v[1], Reduction::Sum, 0.5); },
        {leaf({3, 4}, 44), leaf({3, 4}, 45)}}},
      {amp::Op::huber_loss,
       {[](const V& v) { return huber_loss(v[0], v[1], Reduction::Mean, 0.7); },
        {leaf({3, 4}, 46), leaf({3, 4}, 47)}}},
      {amp::Op::kl_div,
       {[](const V& v) {
          return kl_div(log_softmax(v[0], 1), softmax(v[1], 1), KLDivReduction::BatchMean);
        },
        {leaf({3, 4}, 48), leaf({3, 4}, 49)}}},
      {amp::Op::binary_cross_entropy,
       {[](const V& v) { return binary_cross_entropy(sigmoid(v[0]), sigmoid(v[1])); },
        {leaf({3, 4}, 50), leaf({3, 4}, 51)}}},
      {amp::Op::gaussian_nll_loss,
       {[](const V& v) { return gaussian_nll_loss(v[0], v[1], add(mul(v[2], v[2]), 0.5)); },
        {leaf({3, 4}, 52), leaf({3, 4}, 53), leaf({3, 4}, 54)}}},
      {amp::Op::group_norm,
       {[](const V& v) { return group_norm(v[0], 2, v[1], v[2]); },
        {leaf({2, 4, 3}, 55), leaf({4}, 56), leaf({4}, 57)}}},
  };
  REQUIRE(cases.size() == amp::policy_table().size());
  for (const auto& [op, fc] : cases) {
    INFO(amp::policy(op).name);
    gradcheck(fc.first, fc.second);
  }
}
