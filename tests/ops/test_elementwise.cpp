// Elementwise ops: values, broadcasting, dtype promotion, gradients (f64 finite differences),
// errors.
#include <catch2/catch.hpp>

#include "gradcheck.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::leaf;
using V = std::vector<Tensor>;

TEST_CASE("arithmetic values, broadcasting and promotion", "[ops][elementwise]") {
  Tensor a = tensor({1, 2, 3}).reshape({3, 1});
  Tensor b = tensor({10, 20});
  Tensor c = add(a, b);
  REQUIRE(c.shape() == Shape{3, 2});
  REQUIRE(c.to_vector<float>() == std::vector<float>{11, 21, 12, 22, 13, 23});
  REQUIRE(sub(a, b, 2.0).to_vector<float>()[0] == -19.f);
  REQUIRE(div(tensor({1.0}), tensor({4.0})).item() == 0.25);
  REQUIRE(add(ones({2}, DType::i64), ones({2}, DType::f64)).dtype() == DType::f64);
  REQUIRE(mul(ones({2}, DType::i32), 2.5).dtype() == DType::f32);
  REQUIRE(mul(ones({2}, DType::i32), 2.0).dtype() == DType::i32);
  REQUIRE(div(ones({2}, DType::i64), 2.0).to_vector<float>() == std::vector<float>{0.5, 0.5});
  REQUIRE((2.0 - tensor({1.0})).item() == 1.0);
  REQUIRE((8.0 / tensor({2.0})).item() == 4.0);
  Tensor h = add(ones({3}, DType::f16), ones({3}, DType::f16));
  REQUIRE(h.dtype() == DType::f16);
  REQUIRE(h.to_vector<float>() == std::vector<float>{2, 2, 2});
  REQUIRE(add(ones({2}, DType::bf16), ones({2}, DType::f16)).dtype() == DType::f32);
}

TEST_CASE("unary values", "[ops][elementwise]") {
  Tensor x = tensor({-2, -0.5, 0.5, 2}, DType::f64);
  REQUIRE(relu(x).to_vector<double>() == std::vector<double>{0, 0, 0.5, 2});
  REQUIRE(leaky_relu(x, 0.1).to_vector<double>()[0] == Approx(-0.2));
  REQUIRE(gelu(x).to_vector<double>()[3] == Approx(1.9544997361036416));
  REQUIRE(gelu(x, true).to_vector<double>()[3] == Approx(1.9545976940877752));
  REQUIRE(sigmoid(x).to_vector<double>()[3] == Approx(0.8807970779778823));
  REQUIRE(sigmoid(tensor({-1000.0}, DType::f64)).item() == 0.0);
  REQUIRE(tanh(x).to_vector<double>()[0] == Approx(std::tanh(-2.0)));
  REQUIRE(clamp(x, -1.0, 1.0).to_vector<double>() == std::vector<double>{-1, -0.5, 0.5, 1});
  REQUIRE(clamp(x, std::nullopt, 0.0).to_vector<double>()[3] == 0.0);
  REQUIRE(abs(x).to_vector<double>()[0] == 2.0);
  REQUIRE(pow(x, 2.0).to_vector<double>()[0] == 4.0);
  REQUIRE(rsqrt(tensor({4.0})).item() == 0.5);
  REQUIRE(exp(log(tensor({3.0}, DType::f64))).item() == Approx(3.0));
  REQUIRE(maximum(x, zeros({1}, DType::f64)).to_vector<double>() == relu(x).to_vector<double>());
}

TEST_CASE("comparisons, where and masked_fill", "[ops][elementwise]") {
  Tensor x = tensor({1, 5, 3});
  REQUIRE(gt(x, 2.0).to_vector<bool>() == std::vector<bool>{false, true, true});
  REQUIRE(eq(x, tensor({1, 0, 3})).to_vector<bool>() == std::vector<bool>{true, false, true});
  REQUIRE(le(x, 3.0).dtype() == DType::b8);
  REQUIRE(where(gt(x, 2.0), x, zeros({1})).to_vector<float>() == std::vector<float>{0, 5, 3});
  REQUIRE(masked_fill(x, lt(x, 2.0), -1).to_vector<float>() == std::vector<float>{-1, 5, 3});
  REQUIRE_THROWS_WITH(where(x, x, x), Contains("where") && Contains("bool"));
  REQUIRE(logical_not(gt(x, 2.0)).to_vector<bool>() == std::vector<bool>{true, false, false});
}

TEST_CASE("in-place updates", "[ops][elementwise]") {
  Tensor p = ones({3}, DType::f64);
  add_(p, tensor({1, 2, 3}, DType::f64), -0.5);
  REQUIRE(p.to_vector<double>() == std::vector<double>{0.5, 0, -0.5});
  mul_(p, 2.0);
  addcmul_(p, tensor({1, 1, 1}, DType::f64), tensor({2, 2, 2}, DType::f64), 0.5);
  REQUIRE(p.to_vector<double>() == std::vector<double>{2, 1, 0});
  addcdiv_(p, ones({3}, DType::f64), full({3}, 4.0, DType::f64));
  REQUIRE(p.to_vector<double>() == std::vector<double>{2.25, 1.25, 0.25});
  REQUIRE_THROWS_WITH(add_(p, ones({4}, DType::f64)), Contains("add_"));
}

TEST_CASE("gradients of binary ops with broadcasting", "[ops][elementwise][grad]") {
  auto a = leaf({3, 4}, 1), b = leaf({4}, 2), c = leaf({3, 1}, 3);
  gradcheck([](const V& v) { return add(v[0], v[1], 0.7); }, {a, b});
  gradcheck([](const V& v) { return sub(v[0], v[1], 1.3); }, {a, c});
  gradcheck([](const V& v) { return mul(v[0], v[1]); }, {a, b});
  gradcheck([](const V& v) { return div(v[0], add(mul(v[1], v[1]), 1.0)); }, {a, c});
  gradcheck([](const V& v) { return maximum(v[0], v[1]); }, {a, b});
  gradcheck([](const V& v) { return minimum(v[0], v[1]); }, {a, c});
  auto pos = leaf({3, 4}, 4);
  gradcheck([](const V& v) { return pow(add(abs(v[0]), 0.5), v[1]); }, {pos, b});
  Tensor cond = gt(randn({3, 4}, DType::f64), 0.0);
  gradcheck([cond](const V& v) { return where(cond, v[0], v[1]); }, {a, b});
  gradcheck([cond](const V& v) { return masked_fill(v[0], cond, 2.0); }, {a});
  gradcheck([](const V& v) { return 2.0 - v[0] / 3.0; }, {a});
}

TEST_CASE("gradients of unary ops, contiguous and not", "[ops][elementwise][grad]") {
  Tensor base = randn({4, 5}, DType::f64);
  Tensor nc = base.transpose(0, 1);  // non-contiguous leaf
  nc.requires_grad_();
  for (Tensor x : {leaf({4, 5}, 7), nc}) {
    gradcheck([](const V& v) { return neg(v[0]); }, {x});
    gradcheck([](const V& v) { return exp(v[0]); }, {x});
    gradcheck([](const V& v) { return log(add(abs(v[0]), 0.5)); }, {x});
    gradcheck([](const V& v) { return sqrt(add(abs(v[0]), 0.5)); }, {x});
    gradcheck([](const V& v) { return rsqrt(add(abs(v[0]), 0.5)); }, {x});
    gradcheck([](const V& v) { return abs(v[0]); }, {x});
    gradcheck([](const V& v) { return pow(v[0], 3.0); }, {x});
    gradcheck([](const V& v) { return square(v[0]); }, {x});
    gradcheck([](const V& v) { return relu(v[0]); }, {x});
    gradcheck([](const V& v) { return leaky_relu(v[0], 0.2); }, {x});
    gradcheck([](const V& v) { return gelu(v[0]); }, {x});
    gradcheck([](const V& v) { return gelu(v[0], true); }, {x});
    gradcheck([](const V& v) { return sigmoid(v[0]); }, {x});
    gradcheck([](const V& v) { return tanh(v[0]); }, {x});
    gradcheck([](const V& v) { return clamp(v[0], -0.5, 0.7); }, {x});
  }
}

TEST_CASE("gradients through channels-last inputs", "[ops][elementwise][grad]") {
  Tensor x = randn({2, 3, 4, 5}, DType::f64).contiguous(MemoryFormat::ChannelsLast);
  x.requires_grad_();
  Tensor out = relu(x);
  REQUIRE(out.is_contiguous(MemoryFormat::ChannelsLast));
  gradcheck([](const V& v) { return mul(sigmoid(v[0]), v[0]); }, {x});
  REQUIRE(x.grad().is_contiguous(MemoryFormat::ChannelsLast));
}

TEST_CASE("elementwise errors name the op and shapes", "[ops][elementwise][errors]") {
  REQUIRE_THROWS_WITH(add(zeros({2, 3}), zeros({4})),
                      Contains("add") && Contains("[2, 3]") && Contains("[4]"));
  REQUIRE_THROWS_WITH(max(zeros({2}, DType::b8)), Contains("max") && Contains("bool"));
  REQUIRE_THROWS_WITH(exp(Tensor()), Contains("undefined"));
}
