// nn::Module registration, naming, state dicts, conversion, modes and printing, plus the
// standard layers (shapes, defaults, gradients through a small network).
#include <catch2/catch.hpp>

#include <cmath>

#include "gradcheck.hpp"

using namespace dltrain;
using Catch::Contains;

namespace {

struct Block : nn::Module {
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
  Block() : Module("Block") {
    nn::Conv2dOptions o;
    o.padding = 1;
    o.bias = false;
    conv = register_module("conv", std::make_shared<nn::Conv2d>(2, 3, 3, o));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(3));
  }
  Tensor forward(const Tensor& x) override { return relu(bn->forward(conv->forward(x))); }
};

struct Net : nn::Module {
  std::shared_ptr<Block> block;
  std::shared_ptr<nn::Sequential> head;
  Tensor scale;
  Net() : Module("Net") {
    block = register_module("block", std::make_shared<Block>());
    head = register_module(
        "head", std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
                    std::make_shared<nn::AdaptiveAvgPool2d>(1), std::make_shared<nn::Flatten>(),
                    std::make_shared<nn::Linear>(3, 4)}));
    scale = register_parameter("scale", ones({1}));
  }
  Tensor forward(const Tensor& x) override { return mul(head->forward(block->forward(x)), scale); }
};

std::vector<std::string> names(const nn::NamedTensors& v) {
  std::vector<std::string> out;
  for (const auto& p : v) out.push_back(p.first);
  return out;
}

}  // namespace

TEST_CASE("Module: dotted names in registration order, parameters vs buffers") {
  Net net;
  REQUIRE(names(net.named_parameters()) ==
          std::vector<std::string>{"scale", "block.conv.weight", "block.bn.weight", "block.bn.bias",
                                   "head.2.weight", "head.2.bias"});
  REQUIRE(names(net.named_buffers()) == std::vector<std::string>{"block.bn.running_mean",
                                                                 "block.bn.running_var",
                                                                 "block.bn.num_batches_tracked"});
  REQUIRE(net.state_dict().keys() ==
          std::vector<std::string>{"scale", "block.conv.weight", "block.bn.weight", "block.bn.bias",
                                   "block.bn.running_mean", "block.bn.running_var",
                                   "block.bn.num_batches_tracked", "head.2.weight", "head.2.bias"});
  REQUIRE(net.num_parameters() == 1 + 2 * 3 * 9 + 3 + 3 + 3 * 4 + 4);
  REQUIRE(names(net.named_parameters(false)) == std::vector<std::string>{"scale"});
  REQUIRE(net.named_modules().size() == 8);  // Net, block, conv, bn, head, head.0-2
  for (auto& p : net.parameters()) REQUIRE(p.requires_grad());
  for (auto& b : net.buffers()) REQUIRE_FALSE(b.requires_grad());
  REQUIRE(net.block->bn->num_batches_tracked.dtype() == DType::i64);
}

TEST_CASE("Module: registration errors name the problem") {
  nn::Module m("Custom");
  m.register_parameter("w", zeros({2}));
  REQUIRE_THROWS_WITH(m.register_parameter("w", zeros({2})), Contains("already used"));
  REQUIRE_THROWS_WITH(m.register_buffer("a.b", zeros({2})), Contains("no '.'"));
  REQUIRE_THROWS_WITH(m.register_module("w", std::make_shared<nn::ReLU>()), Contains("'w'"));
  REQUIRE_THROWS_WITH(m.forward(zeros({2})), Contains("Custom::forward"));
  REQUIRE_THROWS_WITH(m.child("nope"), Contains("no submodule named 'nope'"));
}

TEST_CASE("Module: state_dict round trip into a fresh model, and strict errors") {
  manual_seed(1);
  Net a;
  manual_seed(2);
  Net b;
  REQUIRE_FALSE(allclose(a.block->conv->weight, b.block->conv->weight));
  b.load_state_dict(a.state_dict());
  for (const auto& [name, t] : a.state_dict()) {
    INFO(name);
    REQUIRE(allclose(t.to(DType::f64), b.state_dict().at(name).to(DType::f64), 0, 0));
  }
  // Handles kept in fields see the loaded values (shared TensorImpl).
  REQUIRE(allclose(b.block->conv->weight, a.block->conv->weight, 0, 0));

  StateDict missing = a.state_dict();
  missing.erase("head.2.bias");
  REQUIRE_THROWS_WITH(b.load_state_dict(missing), Contains("Missing keys: head.2.bias"));
  StateDict extra = a.state_dict();
  extra.insert("head.3.weight", zeros({1}));
  REQUIRE_THROWS_WITH(b.load_state_dict(extra), Contains("Unexpected keys: head.3.weight"));
  StateDict bad = a.state_dict();
  bad.insert("head.2.weight", zeros({5, 3}));
  Tensor before = b.head->operator[](2)->named_parameters().at(0).second.clone();
  REQUIRE_THROWS_WITH(b.load_state_dict(bad), Contains("size mismatch for head.2.weight"));
  REQUIRE_THROWS_WITH(b.load_state_dict(bad, false), Contains("[5, 3]"));
  // A failed load changes nothing.
  REQUIRE(allclose(b.head->operator[](2)->named_parameters().at(0).second, before, 0, 0));
  // Non-strict loads what matches and reports the rest.
  auto r = b.load_state_dict(missing, false);
  REQUIRE(r.missing_keys == std::vector<std::string>{"head.2.bias"});
  REQUIRE(b.load_state_dict(extra, false).unexpected_keys ==
          std::vector<std::string>{"head.3.weight"});
}

TEST_CASE("Module: to(dtype) and to(ChannelsLast) convert in place, keeping handles in sync") {
  Net net;
  Tensor x = testing::rnd({2, 2, 5, 5}, 3, DType::f32);
  sum(net.forward(x)).backward();
  REQUIRE(net.block->conv->weight.grad().defined());
  Tensor before = net.forward(x).detach();
  net.to(DType::f64);
  for (const auto& [name, t] : net.state_dict()) {
    INFO(name);
    REQUIRE(t.dtype() == (name == "block.bn.num_batches_tracked" ? DType::i64 : DType::f64));
  }
  REQUIRE(net.block->conv->weight.dtype() == DType::f64);
  REQUIRE(net.block->conv->weight.grad().dtype() == DType::f64);
  REQUIRE(net.block->conv->weight.requires_grad());
  REQUIRE(net.block->conv->weight.is_leaf());
  net.to(MemoryFormat::ChannelsLast);
  REQUIRE(net.block->conv->weight.is_contiguous(MemoryFormat::ChannelsLast));
  REQUIRE(net.block->conv->weight.suggest_memory_format() == MemoryFormat::ChannelsLast);
  // A weight with one input channel (a grey-scale model's first layer) is dense in both layouts
  // and re-labelled, so that its convolution's output is channels-last.
  nn::Conv2d grey(1, 4, 3);
  REQUIRE(grey.weight.suggest_memory_format() == MemoryFormat::Contiguous);
  grey.to(MemoryFormat::ChannelsLast);
  REQUIRE(grey.weight.suggest_memory_format() == MemoryFormat::ChannelsLast);
  REQUIRE(grey.forward(testing::rnd({2, 1, 6, 6}, 5, DType::f32)).suggest_memory_format() ==
          MemoryFormat::ChannelsLast);
  grey.to(MemoryFormat::Contiguous);
  REQUIRE(grey.weight.suggest_memory_format() == MemoryFormat::Contiguous);
  net.eval();
  net.train();
  Tensor after = net.forward(x.to(DType::f64).contiguous(MemoryFormat::ChannelsLast));
  REQUIRE(allclose(after.to(DType::f32), before, 1e-5, 1e-5));
  REQUIRE_THROWS_WITH(net.to(DType::i32), Contains("floating"));
}

TEST_CASE("Module: train/eval reach every descendant, BatchNorm and Dropout follow the mode") {
  Net net;
  net.eval();
  for (const auto& [name, m] : net.named_modules()) REQUIRE_FALSE(m->is_training());
  Tensor x = testing::rnd({4, 2, 5, 5}, 4, DType::f32);
  Tensor y1 = net.forward(x), y2 = net.forward(x);
  REQUIRE(allclose(y1, y2, 0, 0));
  REQUIRE(net.block->bn->num_batches_tracked.item<int64_t>() == 0);
  net.train();
  net.forward(x);
  REQUIRE(net.block->bn->num_batches_tracked.item<int64_t>() == 1);
  REQUIRE(max(abs(net.block->bn->running_mean)).item<double>() > 0);

  nn::Dropout drop(0.5);
  Tensor ones_in = ones({1000});
  Tensor t = drop.forward(ones_in);
  double kept = sum(gt(t, 0.0).to(DType::f32)).item<double>();
  REQUIRE(kept > 400);
  REQUIRE(kept < 600);
  drop.eval();
  REQUIRE(allclose(drop.forward(ones_in), ones_in, 0, 0));
  REQUIRE_THROWS_WITH(nn::Dropout(1.5), Contains("[0, 1]"));
}

TEST_CASE("BatchNorm momentum=None keeps a cumulative average of batch statistics") {
  nn::BatchNormOptions o;
  o.momentum = std::nullopt;
  nn::BatchNorm1d bn(2, o, DType::f64);
  Tensor a = testing::rnd({8, 2}, 5), b = testing::rnd({8, 2}, 6);
  bn.forward(a);
  bn.forward(b);
  Tensor want = div(add(mean(a, {0}), mean(b, {0})), 2.0);
  REQUIRE(allclose(bn.running_mean, want, 1e-12, 1e-12));
  REQUIRE_THROWS_WITH(bn.forward(zeros({2, 3}, DType::f64)), Contains("3 channels"));
  REQUIRE_THROWS_WITH(nn::BatchNorm2d(2).forward(zeros({2, 2})), Contains("4-d input"));
}

TEST_CASE("Module: zero_grad clears or zeroes every gradient") {
  Net net;
  sum(net.forward(testing::rnd({2, 2, 5, 5}, 7, DType::f32))).backward();
  net.zero_grad(false);
  for (auto& p : net.parameters()) {
    REQUIRE(p.grad().defined());
    REQUIRE(max(abs(p.grad())).item<double>() == 0.0);
  }
  net.zero_grad();
  for (auto& p : net.parameters()) REQUIRE_FALSE(p.grad().defined());
}

TEST_CASE("Layers: gradients of a conv-BN-ReLU-pool-linear stack pass a float64 gradcheck") {
  manual_seed(11);
  auto seq = std::make_shared<nn::Sequential>();
  nn::Conv2dOptions co;
  co.padding = 1;
  seq->push_back(std::make_shared<nn::Conv2d>(2, 3, 3, co, DType::f64))
      .push_back(std::make_shared<nn::BatchNorm2d>(3, nn::BatchNormOptions{}, DType::f64))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::MaxPool2d>(2))
      .push_back(std::make_shared<nn::Flatten>())
      .push_back(std::make_shared<nn::Linear>(12, 3, true, DType::f64))
      .push_back(std::make_shared<nn::GELU>())
      .push_back(std::make_shared<nn::LayerNorm>(Shape{3}, 1e-5, true, DType::f64))
      .push_back(std::make_shared<nn::Tanh>());
  std::vector<Tensor> inputs{testing::leaf({3, 2, 4, 4}, 12)};
  for (auto& p : seq->parameters()) inputs.push_back(p);
  testing::gradcheck([&](const std::vector<Tensor>& in) { return seq->forward(in[0]); }, inputs);
}

TEST_CASE("Layers: default initialisation bounds and printing") {
  manual_seed(3);
  nn::Linear lin(100, 10);
  double bound = 1.0 / std::sqrt(100.0);
  REQUIRE(max(abs(lin.weight.detach())).item<double>() <= bound);
  REQUIRE(max(abs(lin.weight.detach())).item<double>() > 0.9 * bound);
  REQUIRE(max(abs(lin.bias.detach())).item<double>() <= bound);
  REQUIRE(lin.str() == "Linear(in_features=100, out_features=10, bias=True)");
  // The named form equals the positional one.
  const nn::Linear named(100, 10, {.bias = false});
  CHECK_FALSE(named.bias.defined());
  CHECK(named.str() == "Linear(in_features=100, out_features=10, bias=False)");
  nn::Conv2dOptions o;
  o.stride = 2;
  o.groups = 2;
  nn::Conv2d conv(4, 8, 3, o);
  REQUIRE(conv.weight.shape() == Shape{8, 2, 3, 3});
  REQUIRE(conv.str() == "Conv2d(4, 8, kernel_size=(3, 3), stride=(2, 2), groups=2)");
  REQUIRE(max(abs(conv.weight.detach())).item<double>() <= 1.0 / std::sqrt(18.0));
  REQUIRE(nn::BatchNorm2d(5).str() ==
          "BatchNorm2d(5, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)");
  REQUIRE(nn::MaxPool2d(3, 2, 1).str() ==
          "MaxPool2d(kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=False)");
  nn::Embedding emb(10, 4, 0);
  REQUIRE(max(abs(emb.weight.detach().select(0, 0))).item<double>() == 0.0);
  REQUIRE(emb.forward(from_vector(std::vector<int64_t>{1, 2, 0})).shape() == Shape{3, 4});
  REQUIRE_THROWS_WITH(nn::Conv2d(3, 4, 3, o), Contains("divisible by groups"));
  REQUIRE_THROWS_WITH(lin.forward(zeros({2, 99})), Contains("must end in 100"));
}

TEST_CASE("nn::init: kaiming/xavier statistics and fans") {
  Tensor w = empty({256, 128, 3, 3});
  auto [fi, fo] = nn::init::calculate_fan_in_and_fan_out(w);
  REQUIRE(fi == 128 * 9);
  REQUIRE(fo == 256 * 9);
  nn::init::kaiming_normal_(w, 0.0, nn::init::FanMode::FanOut, "relu");
  double want = std::sqrt(2.0 / fo);
  REQUIRE(std::abs(stddev(w, {0, 1, 2, 3}).item<double>() - want) < 0.01 * want);
  nn::init::xavier_uniform_(w);
  double b = std::sqrt(6.0 / (fi + fo));
  REQUIRE(max(abs(w)).item<double>() <= b);
  REQUIRE(std::abs(stddev(w, {0, 1, 2, 3}).item<double>() - b / std::sqrt(3.0)) < 0.01 * b);
  REQUIRE(nn::init::calculate_gain("leaky_relu", 0.2) == Approx(std::sqrt(2.0 / 1.04)));
  REQUIRE_THROWS_WITH(nn::init::calculate_gain("swish"), Contains("unknown nonlinearity"));
  Tensor v = empty({3});
  REQUIRE_THROWS_WITH(nn::init::kaiming_uniform_(v), Contains("at least 2 dims"));
}

TEST_CASE("Loss modules match the functional losses") {
  Tensor logits = testing::rnd({4, 5}, 8), target = from_vector(std::vector<int64_t>{0, 4, 2, 1});
  CrossEntropyOptions o;
  o.label_smoothing = 0.1;
  nn::CrossEntropyLoss ce(o);
  REQUIRE(allclose(ce(logits, target), cross_entropy(logits, target, o), 0, 0));
  REQUIRE(ce.str() == "CrossEntropyLoss(label_smoothing=0.1)");
  nn::MSELoss mse;
  REQUIRE(allclose(mse(logits, zeros({4, 5}, DType::f64)), mean(square(logits)), 1e-15, 0));
  nn::BCEWithLogitsLoss bce;
  Tensor y = gt(testing::rnd({4, 5}, 9), 0.0).to(DType::f64);
  REQUIRE(allclose(bce(logits, y), binary_cross_entropy_with_logits(logits, y), 0, 0));
  nn::NLLLoss nll;
  REQUIRE(allclose(nll(log_softmax(logits, 1), target), cross_entropy(logits, target), 1e-14, 0));
}
