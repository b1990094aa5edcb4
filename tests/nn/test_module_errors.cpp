// Issue 28: errors raised inside a module say where (the module path), conv's hints fit the
// mistake, and two small API gaps (nn::sequential, a scalar first in sub/add/mul/div).
#include <catch2/catch.hpp>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using Catch::Contains;

namespace {

// A U-Net-like module: two encoder blocks, and a skip connection concatenated in forward.
struct Block : nn::Module {
  std::shared_ptr<nn::Sequential> block;
  Block(int64_t in, int64_t out) : Module("Block") {
    block = register_module("block", nn::sequential({std::make_shared<nn::Conv2d>(in, out, 3),
                                                     std::make_shared<nn::ReLU>(),
                                                     std::make_shared<nn::Conv2d>(out, out, 3)}));
  }
  Tensor forward(const Tensor& x) override { return (*block)(x); }
};

struct Net : nn::Module {
  std::shared_ptr<Block> enc1, enc2;
  Net() : Module("Net") {
    enc1 = register_module("enc1", std::make_shared<Block>(1, 4));
    enc2 = register_module("enc2", std::make_shared<Block>(5, 4));  // should take 4 channels
  }
  Tensor forward(const Tensor& x) override {
    const Tensor a = (*enc1)(x);
    const Tensor b = enc2->forward(a);  // ->forward: the path still comes out below
    return cat({a, b}, 1);
  }
};

}  // namespace

TEST_CASE("an error inside a module names its path, once, from the outermost call",
          "[nn][errors]") {
  Net net;
  Generator g(28);
  const Tensor x = randn({2, 1, 12, 12}, DType::f32, &g);
  try {
    net(x);
    FAIL("no error");
  } catch (const nn::ModuleError& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(e.module_path() == "enc2.block.0 (Conv2d)");
    CHECK(what.rfind("in enc2.block.0 (Conv2d): Conv2d: the input has 4 channels", 0) == 0);
    CHECK_THAT(what, Contains("but the layer's in_channels is 5"));
    CHECK(what.find("in Net") == std::string::npos);  // said once, by the innermost
    CHECK(what.find("in enc2", 1) == std::string::npos);
  }
  // Called with ->forward, a module is not on the path: the outermost module called as m(x)
  // is then enc2's Sequential, below which the layer is "0".
  CHECK_THROWS_WITH(net.forward(x), Contains("in 0 (Conv2d): Conv2d: the input has 4 channels"));
  // An error in the outermost module's own forward names its type.
  struct Skip : nn::Module {
    Skip() : Module("Skip") {}
    Tensor forward(const Tensor& x) override { return cat({x, x.narrow(2, 0, 3)}, 1); }
  } skip;
  CHECK_THROWS_WITH(skip(x), Contains("in Skip: cat"));
  // Errors stay dltrain::Error for callers that catch that.
  CHECK_THROWS_AS(net(x), Error);
}

TEST_CASE("conv hints: a missing channel or batch dim, and the channel count named first",
          "[nn][errors]") {
  nn::Conv2d gray(1, 8, 3), rgb(3, 8, 3);
  CHECK_THROWS_WITH(gray(zeros({4, 28, 28})),
                    Contains("Conv2d(in_channels=1): expected a 4-d input [N, 1, H, W] but got "
                             "shape [4, 28, 28]") &&
                        Contains("x.unsqueeze(1)"));
  CHECK_THROWS_WITH(rgb(zeros({3, 32, 32})), Contains("x.unsqueeze(0)"));
  CHECK_THROWS_WITH(rgb(zeros({2, 32, 32, 3})), Contains("the input has 32 channels") &&
                                                    Contains("in_channels is 3") &&
                                                    Contains("permute"));
  CHECK_THROWS_WITH(conv2d(zeros({4, 28, 28}), zeros({8, 1, 3, 3})), Contains("unsqueeze(1)"));
  CHECK_THROWS_WITH(conv2d(zeros({1, 2, 8, 8}), zeros({8, 3, 3, 3})),
                    Contains("conv2d: the input has 2 channels"));
}

TEST_CASE("nn::sequential({a, b}) and a scalar first in add/sub/mul/div", "[nn][api]") {
  auto seq = nn::sequential({std::make_shared<nn::Linear>(2, 3), std::make_shared<nn::ReLU>()});
  CHECK(seq->size() == 2);
  const Tensor t = from_vector(std::vector<float>{1.f, 2.f, 4.f});
  CHECK(allclose(sub(1.0, t), from_vector(std::vector<float>{0.f, -1.f, -3.f}), 0, 0));
  CHECK(allclose(add(1.0, t), from_vector(std::vector<float>{2.f, 3.f, 5.f}), 0, 0));
  CHECK(allclose(mul(2.0, t), from_vector(std::vector<float>{2.f, 4.f, 8.f}), 0, 0));
  CHECK(allclose(div(4.0, t), from_vector(std::vector<float>{4.f, 2.f, 1.f}), 0, 0));
  // sub(1, t) has t's gradient -1.
  Tensor w = from_vector(std::vector<double>{0.5, 2.0}).requires_grad_();
  sum(sub(1.0, w)).backward();
  CHECK(allclose(w.grad(), from_vector(std::vector<double>{-1.0, -1.0}), 0, 0));
}
