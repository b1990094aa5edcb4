// nn::fold_conv_bn and nn::fuse_conv_bn: the folded convolution equals convolution + BatchNorm
// (f64, to rounding), on every ResNet-18 pair in both layouts; training a folded BatchNorm is
// refused; a model whose convolution output has a second use is refused and left computing
// what it computed.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "dltrain/dltrain.hpp"
#include "dltrain/nn/fuse.hpp"

using namespace dltrain;
using Catch::Contains;

namespace {

// Running statistics and affine parameters away from the identity, so a fold that ignored any
// of them would show.
void randomise_bn(nn::Module& m, uint64_t seed) {
  Generator g(seed);
  NoGradGuard ng;
  for (const auto& [name, mod] : m.named_modules()) {
    auto* bn = dynamic_cast<nn::BatchNorm*>(mod.get());
    if (!bn) continue;
    const Shape c{bn->num_features};
    const TensorOptions o(bn->running_mean.dtype());
    bn->running_mean.copy_(mul(randn(c, o.dtype, &g), 0.2));
    bn->running_var.copy_(add(mul(rand(c, o.dtype, &g), 1.5), 0.5));
    bn->weight.copy_(add(mul(randn(c, o.dtype, &g), 0.2), 1.0));
    bn->bias.copy_(mul(randn(c, o.dtype, &g), 0.1));
  }
}

double rel(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(DType::f64), y = b.to(DType::f64);
  return max(abs(sub(x, y))).item<double>() / max(abs(y)).item<double>();
}

// conv -> BatchNorm, whose convolution output is also added after the BatchNorm: folding would
// change the second use.
class SecondUse : public nn::Module {
 public:
  SecondUse() : Module("SecondUse") {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(3, 4, 3, nn::Conv2dOptions{},
                                                                TensorOptions(DType::f64)));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(4, nn::BatchNormOptions{},
                                                                 TensorOptions(DType::f64)));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor c = (*conv)(x);
    return add((*bn)(c), c);
  }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
};

}  // namespace

TEST_CASE("fold_conv_bn: the folded convolution equals convolution then BatchNorm", "[nn][fuse]") {
  for (const bool conv_bias : {false, true}) {
    for (const int64_t groups : {int64_t{1}, int64_t{2}}) {
      INFO("conv bias " << conv_bias << ", groups " << groups);
      manual_seed(3);
      nn::Conv2d conv(4, 6, 3, {.stride = 2, .padding = 1, .groups = groups, .bias = conv_bias},
                      TensorOptions(DType::f64));
      nn::BatchNorm2d bn(6, {}, TensorOptions(DType::f64));
      randomise_bn(bn, 4);
      bn.eval();
      const Tensor x = randn({2, 4, 9, 7}, DType::f64);
      const Tensor want = bn(conv(x));
      nn::fold_conv_bn(conv, bn);
      CHECK(conv.bias.defined());
      CHECK(bn.folded);
      // f64: each output is a sum of 18 products (36 with one group), its scale applied before
      // the sum instead of after: a few ulps of 2^-53 relative to the output's range.
      CHECK(rel(bn(conv(x)), want) < 1e-13);
      CHECK(rel(conv(x), want) < 1e-13);  // the BatchNorm now passes its input through
      REQUIRE_THROWS_WITH(nn::fold_conv_bn(conv, bn), Contains("already folded"));
      bn.train();
      REQUIRE_THROWS_WITH(bn(conv(x)), Contains("nn::fuse_conv_bn") && Contains("eval()"));
    }
  }
  nn::Conv2d conv(3, 5, 1);
  nn::BatchNorm2d other(4);
  REQUIRE_THROWS_WITH(nn::fold_conv_bn(conv, other), Contains("5 output channels"));
  nn::BatchNorm2d batch_stats(5, {.track_running_stats = false});
  REQUIRE_THROWS_WITH(nn::fold_conv_bn(conv, batch_stats), Contains("no running statistics"));
}

TEST_CASE("fuse_conv_bn folds ResNet-18's 20 pairs, NCHW and channels-last, f64 and f32",
          "[nn][fuse]") {
  for (const DType dt : {DType::f64, DType::f32}) {
    for (const MemoryFormat fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      INFO(dt << (fmt == MemoryFormat::ChannelsLast ? " channels-last" : " NCHW"));
      manual_seed(7);
      auto model = models::resnet18({.num_classes = 10});
      model->to(dt);
      model->to(fmt);
      randomise_bn(*model, 8);
      model->eval();
      const Tensor x = randn({2, 3, 32, 32}, dt).contiguous(fmt);
      const Tensor want = model->forward(x);
      std::set<std::string> keys_before;
      for (const auto& [k, t] : model->state_dict()) keys_before.insert(k);

      const nn::FuseReport r = nn::fuse_conv_bn(*model, x);
      CHECK(r.pairs.size() == 20);  // stem, 8 blocks x 2, 3 downsamples
      CHECK(r.pairs.front() == "conv1 + bn1");
      int folded = 0;
      for (const auto& [name, m] : model->named_modules())
        if (auto* bn = dynamic_cast<nn::BatchNorm*>(m.get())) folded += bn->folded ? 1 : 0;
      CHECK(folded == 20);
      // Every key kept; each convolution gained a bias.
      std::set<std::string> keys_after;
      for (const auto& [k, t] : model->state_dict()) keys_after.insert(k);
      for (const std::string& k : keys_before) CHECK(keys_after.count(k) == 1);
      CHECK(keys_after.size() == keys_before.size() + 20);
      // Rounding only: f64 sums of up to 4,608 products per layer (u = 2^-53) through 18
      // layers; f32 the same with u = 2^-24, about 1e-4 at most.
      const double got = rel(model->forward(x), want);
      CHECK(got <= (dt == DType::f64 ? 1e-10 : 1e-3));
      CHECK(r.max_change == Approx(got).margin(1e-15));
      model->train();
      REQUIRE_THROWS_WITH(model->forward(x), Contains("nn::fuse_conv_bn"));
    }
  }
}

TEST_CASE("fuse_conv_bn refuses a convolution whose output has a second use", "[nn][fuse]") {
  manual_seed(11);
  SecondUse m;
  randomise_bn(m, 12);
  const Tensor x = randn({2, 3, 8, 8}, DType::f64);
  m.eval();
  const Tensor want = m.forward(x);
  REQUIRE_THROWS_WITH(nn::fuse_conv_bn(m, x), Contains("conv + bn") &&
                                                  Contains("also used elsewhere") &&
                                                  Contains("Nothing was folded"));
  CHECK_FALSE(m.bn->folded);
  // What it computes is unchanged (the convolution keeps a zero bias it did not have).
  CHECK(rel(m.forward(x), want) == 0.0);
  // A model without BatchNorm: nothing to fold.
  nn::Conv2d plain(3, 4, 3, {}, TensorOptions(DType::f64));
  CHECK(nn::fuse_conv_bn(plain, x).pairs.empty());
}
