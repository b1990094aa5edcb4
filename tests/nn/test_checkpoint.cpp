// Activation checkpointing (nn::checkpoint, nn::checkpoint_sequential): the same gradients
// as without it, bit for bit where the arithmetic is the same; running statistics moved once;
// dropout masks replayed; autocast replayed; higher-order gradients through it; the segment's
// intermediates really freed after its forward.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "gradcheck.hpp"

using namespace dltrain;
using testing::gradcheck;
using testing::gradgradcheck;
using testing::leaf;
using testing::rnd;

namespace {

// Bitwise equality of two tensors of the same shape (NaN-free values).
bool same(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  return max(abs(sub(a.to(DType::f64), b.to(DType::f64)))).item<double>() == 0.0;
}

void check_same_grads(nn::Module& a, nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    REQUIRE(pa[i].second.grad().defined());
    CHECK(same(pa[i].second.grad(), pb[i].second.grad()));
  }
}

void check_same_buffers(nn::Module& a, nn::Module& b) {
  const auto ba = a.named_buffers(), bb = b.named_buffers();
  REQUIRE(ba.size() == bb.size());
  for (size_t i = 0; i < ba.size(); ++i) {
    INFO(ba[i].first);
    CHECK(same(ba[i].second, bb[i].second));
  }
}

// Two ResNet basic blocks (the second with a strided downsample) in f64, weights from `seed`.
std::shared_ptr<nn::Sequential> block_chain(uint64_t seed) {
  manual_seed(seed);
  models::ResNetOptions o;
  auto down = nn::sequential(
      {std::make_shared<nn::Conv2d>(4, 8, 1, nn::Conv2dOptions{.stride = 2, .bias = false}),
       std::make_shared<nn::BatchNorm2d>(8)});
  auto chain = nn::sequential({std::make_shared<models::BasicBlock>(4, 4, 1, nullptr, o),
                               std::make_shared<models::BasicBlock>(4, 8, 2, down, o),
                               std::make_shared<models::BasicBlock>(8, 8, 1, nullptr, o)});
  chain->to(DType::f64);
  return chain;
}

}  // namespace

TEST_CASE("checkpoint: a ResNet block chain with BatchNorm gives the plain gradients bit for bit",
          "[nn][checkpoint]") {
  for (int64_t segments : {1, 2, 3}) {
    INFO("segments " << segments);
    auto plain = block_chain(11), ckpt = block_chain(11);
    const Tensor w = rnd({2, 8, 4, 4}, 5);
    Tensor x1 = leaf({2, 4, 8, 8}, 3), x2 = x1.detach().clone().requires_grad_();
    sum(mul((*plain)(x1), w)).backward();
    Tensor y2 = nn::checkpoint_sequential(*ckpt, segments, x2);
    sum(mul(y2, w)).backward();
    check_same_grads(*plain, *ckpt);
    CHECK(same(x1.grad(), x2.grad()));
    // Running statistics moved once (num_batches_tracked is 1 everywhere), to the same values.
    check_same_buffers(*plain, *ckpt);
    for (auto& [name, b] : ckpt->named_buffers())
      if (name.find("num_batches_tracked") != std::string::npos) CHECK(b.item<int64_t>() == 1);
  }
}

TEST_CASE("checkpoint: dropout masks are replayed and the random stream is left as without it",
          "[nn][checkpoint]") {
  manual_seed(21);
  auto plain = std::make_shared<nn::TransformerEncoderLayer>(
      8, 2, nn::TransformerEncoderLayerOptions{.dim_feedforward = 16, .dropout = 0.3});
  plain->to(DType::f64);
  auto ckpt = plain->clone();
  const Tensor w = rnd({5, 3, 8}, 6);
  Tensor x1 = leaf({5, 3, 8}, 4), x2 = x1.detach().clone().requires_grad_();

  manual_seed(99);
  Tensor y1 = (*plain)(x1);
  sum(mul(y1, w)).backward();
  const uint64_t offset_plain = default_generator().offset();

  manual_seed(99);
  Tensor y2 = nn::checkpoint(*ckpt, x2);
  const uint64_t offset_after_forward = default_generator().offset();
  sum(mul(y2, w)).backward();
  CHECK(same(y1, y2));
  check_same_grads(*plain, *ckpt);
  CHECK(same(x1.grad(), x2.grad()));
  // The recomputation drew its masks from the saved position and put the generator back.
  CHECK(default_generator().offset() == offset_after_forward);
  CHECK(offset_after_forward == offset_plain);

  SECTION("without preserve_rng_state the recomputation draws new masks") {
    for (auto& p : ckpt->parameters()) p.set_grad(Tensor());
    Tensor x3 = x1.detach().clone().requires_grad_();
    manual_seed(99);
    Tensor y3 = nn::checkpoint(*ckpt, x3, {.preserve_rng_state = false});
    sum(mul(y3, w)).backward();
    CHECK(same(y1, y3));                      // the forward itself is unchanged
    CHECK_FALSE(same(x1.grad(), x3.grad()));  // but the gradients used other masks
  }
}

TEST_CASE("checkpoint: several inputs and outputs, captured parameters, finite differences",
          "[nn][checkpoint]") {
  // f(a, b; W) = (tanh(a * b + W), sin(a) * W): W is captured by the function, not passed.
  auto f = [](const std::vector<Tensor>& in) {
    const Tensor W = in[2];
    std::vector<Tensor> outs = nn::checkpoint(
        [W](const std::vector<Tensor>& xs) {
          return std::vector<Tensor>{tanh(add(mul(xs[0], xs[1]), W)), mul(sin(xs[0]), W)};
        },
        {in[0], in[1]});
    return add(mul(outs[0], 2.0), outs[1]);
  };
  std::vector<Tensor> in{leaf({3, 4}, 1), leaf({3, 4}, 2), leaf({3, 4}, 3)};
  CHECK(gradcheck(f, in) < 1e-6);
  // Second order through the checkpoint (create_graph differentiates the recomputation).
  CHECK(gradgradcheck(f, in) < 1e-6);
}

TEST_CASE("checkpoint: an input without grad, an integer input and an unused output",
          "[nn][checkpoint]") {
  Tensor a = leaf({4}, 7), c = rnd({4}, 8);
  const Tensor idx = arange(0, 4, 1, DType::i64);
  auto run = [&](bool use_checkpoint) {
    a.set_grad(Tensor());
    auto fn = [](const std::vector<Tensor>& xs) {
      Tensor g = index_select(mul(xs[0], xs[1]), 0, xs[2]);
      return std::vector<Tensor>{exp(g), mul(xs[1], 3.0)};
    };
    std::vector<Tensor> outs = use_checkpoint ? nn::checkpoint(fn, {a, c, idx}) : fn({a, c, idx});
    sum(outs[0]).backward();  // outs[1] gets no gradient
    return a.grad().clone();
  };
  CHECK(same(run(false), run(true)));
}

TEST_CASE("checkpoint: the segment's intermediates are freed after its forward",
          "[nn][checkpoint]") {
  manual_seed(5);
  auto net = nn::sequential({std::make_shared<nn::Linear>(64, 64), std::make_shared<nn::Tanh>(),
                             std::make_shared<nn::Linear>(64, 64), std::make_shared<nn::Tanh>()});
  net->to(DType::f64);
  Tensor x = leaf({32, 64}, 9);
  const size_t out_bytes = 32 * 64 * sizeof(double);
  size_t plain_rise = 0;
  {
    const size_t before = memory_allocated();
    Tensor y = (*net)(x);
    plain_rise = memory_allocated() - before;
  }
  const size_t before = memory_allocated();
  Tensor y = nn::checkpoint(*net, x);
  // Only the output stays: the intermediates went with the forward's graph, where the plain
  // forward keeps at least the first tanh's output for the second linear's backward.
  CHECK(memory_allocated() - before == out_bytes);
  CHECK(plain_rise >= 2 * out_bytes);
  // Under no_grad it is a plain call that records nothing.
  NoGradGuard no_grad;
  CHECK_FALSE(nn::checkpoint(*net, x).requires_grad());
}

TEST_CASE("checkpoint: autocast is replayed in the recomputation", "[nn][checkpoint][amp]") {
  manual_seed(3);
  auto plain = nn::sequential({std::make_shared<nn::Linear>(16, 32), std::make_shared<nn::ReLU>(),
                               std::make_shared<nn::Linear>(32, 8)});
  manual_seed(3);
  auto ckpt = nn::sequential({std::make_shared<nn::Linear>(16, 32), std::make_shared<nn::ReLU>(),
                              std::make_shared<nn::Linear>(32, 8)});
  const Tensor x = rnd({4, 16}, 2, DType::f32);
  {
    amp::autocast ac(DeviceType::CPU);
    sum((*plain)(x).to(DType::f32)).backward();
  }
  {
    amp::autocast ac(DeviceType::CPU);
    Tensor y = nn::checkpoint(*ckpt, x);
    CHECK(y.dtype() == DType::bf16);
    sum(y.to(DType::f32)).backward();
  }
  check_same_grads(*plain, *ckpt);
}

TEST_CASE("checkpoint: misuse gets a clear error", "[nn][checkpoint]") {
  Tensor a = leaf({3}, 1);
  Tensor outside = mul(a, 2.0);  // computed before the segment, with a graph
  CHECK_THROWS_WITH(
      nn::checkpoint([&](const Tensor& x) { return add(x, outside); }, a),
      Catch::Contains("pass that tensor in the inputs of checkpoint") && Catch::Contains("mul"));
  auto net = nn::sequential({std::make_shared<nn::Tanh>(), std::make_shared<nn::Tanh>()});
  CHECK_THROWS_WITH(nn::checkpoint_sequential(*net, 0, a), Catch::Contains("0 segments for 2"));
  CHECK_THROWS_WITH(nn::checkpoint_sequential(*net, 3, a), Catch::Contains("3 segments for 2"));
}

TEST_CASE("checkpoint: ResNet::checkpoint_segments changes memory, not the gradients",
          "[nn][checkpoint][resnet]") {
  auto make = [] {
    manual_seed(8);
    auto m = models::resnet18({.num_classes = 10});
    m->to(DType::f64);
    return m;
  };
  auto plain = make(), ckpt = make();
  ckpt->checkpoint_segments = 3;  // 8 blocks: 2 checkpointed segments of 2, then 4 plain
  const Tensor x = rnd({2, 3, 32, 32}, 4);
  const Tensor target = arange(0, 2, 1, DType::i64);
  cross_entropy((*plain)(x), target).backward();
  cross_entropy((*ckpt)(x), target).backward();
  check_same_grads(*plain, *ckpt);
  check_same_buffers(*plain, *ckpt);
  ckpt->checkpoint_segments = 9;  // more segments than blocks
  CHECK_THROWS_WITH((*ckpt)(x), Catch::Contains("9 segments for 8 modules"));
}
