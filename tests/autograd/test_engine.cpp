// The backward engine: accumulation, ordering, retain_graph, detach, no_grad, hooks, errors.
#include <catch2/catch.hpp>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using Catch::Contains;

TEST_CASE("gradients accumulate into leaves across uses and calls", "[autograd]") {
  Tensor x = tensor({1, 2, 3}, DType::f64).requires_grad_();
  Tensor y = sum(add(mul(x, x), mul(x, 3.0)));  // d/dx = 2x + 3
  y.backward();
  REQUIRE(x.grad().to_vector<double>() == std::vector<double>{5, 7, 9});
  sum(x).backward();  // accumulates
  REQUIRE(x.grad().to_vector<double>() == std::vector<double>{6, 8, 10});
  x.set_grad(Tensor());
  REQUIRE_FALSE(x.grad().defined());
}

TEST_CASE("diamond graphs sum gradients before running a node", "[autograd]") {
  Tensor x = tensor({2.0}, DType::f64).requires_grad_();
  Tensor a = mul(x, 3.0);
  Tensor b = exp(a);          // uses a
  Tensor c = mul(a, a);       // uses a twice
  Tensor y = sum(add(b, c));  // dy/dx = 3 e^{3x} + 18 x
  y.backward();
  REQUIRE(x.grad().item() == Approx(3 * std::exp(6.0) + 36.0));
}

TEST_CASE("backward twice needs retain_graph", "[autograd]") {
  Tensor x = tensor({1.0, 2.0}, DType::f64).requires_grad_();
  Tensor y = sum(exp(x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  REQUIRE(x.grad().to_vector<double>()[0] == Approx(2 * std::exp(1.0)));
  REQUIRE_THROWS_WITH(y.backward(), Contains("second time") && Contains("retain_graph"));
}

TEST_CASE("non-scalar backward needs a gradient", "[autograd]") {
  Tensor x = tensor({1.0, 2.0}, DType::f64).requires_grad_();
  Tensor y = mul(x, 2.0);
  REQUIRE_THROWS_WITH(y.backward(), Contains("one-element"));
  y.backward(tensor({1.0, 10.0}, DType::f64));
  REQUIRE(x.grad().to_vector<double>() == std::vector<double>{2.0, 20.0});
  REQUIRE_THROWS_WITH(mul(x, 2.0).backward(zeros({3}, DType::f64)), Contains("shape"));
}

TEST_CASE("detach, no_grad and requires_grad propagation", "[autograd]") {
  Tensor x = tensor({1.0}).requires_grad_();
  REQUIRE(mul(x, 2.0).requires_grad());
  REQUIRE_FALSE(mul(x.detach(), 2.0).requires_grad());
  REQUIRE(mul(x, 2.0).grad_fn() != nullptr);
  {
    NoGradGuard g;
    REQUIRE_FALSE(mul(x, 2.0).requires_grad());
  }
  REQUIRE(autograd::grad_mode_enabled());
  Tensor c = tensor({3.0});
  REQUIRE_THROWS_WITH(sum(c).backward(), Contains("does not require grad"));
  REQUIRE_THROWS_WITH(mul(x, 2.0).requires_grad_(), Contains("non-leaf"));
  Tensor leaf = zeros({2}).requires_grad_();
  REQUIRE_THROWS_WITH(add_(leaf, ones({2})), Contains("NoGradGuard"));
  {
    NoGradGuard g;
    add_(leaf, ones({2}));
  }
  REQUIRE(leaf.to_vector<float>() == std::vector<float>{1, 1});
}

TEST_CASE("hooks fire once per backward with the final accumulated gradient", "[autograd][hooks]") {
  Tensor w = tensor({1.0, 2.0}, DType::f64).requires_grad_();
  int calls = 0;
  std::vector<double> seen;
  w.register_hook([&](const Tensor& g) {
    ++calls;
    seen = g.to_vector<double>();
  });
  // w used three times: the hook must see the sum, once.
  Tensor y = sum(add(add(mul(w, 2.0), mul(w, 3.0)), w));
  y.backward();
  REQUIRE(calls == 1);
  REQUIRE(seen == std::vector<double>{6.0, 6.0});
  REQUIRE_THROWS_WITH(mul(w, 1.0).register_hook([](const Tensor&) {}), Contains("leaf"));
}

TEST_CASE("saved tensors are released after backward", "[autograd]") {
  Tensor x = randn({1000}, DType::f64).requires_grad_();
  Storage saved;
  Tensor y;
  {
    Tensor e = exp(x);  // exp saves its output
    saved = e.storage();
    y = sum(e);
  }
  REQUIRE(saved.use_count() == 2);  // ours and the graph's
  y.backward();
  REQUIRE(saved.use_count() == 1);  // the graph let go as backward went
}

TEST_CASE("multi-output nodes and views route gradients", "[autograd]") {
  Tensor x = arange(6, DType::f64).reshape({2, 3}).detach().requires_grad_();
  auto parts = chunk(x, 3, 1);
  Tensor y = sum(add(mul(parts[0], 2.0), parts[2]));
  y.backward();
  REQUIRE(x.grad().to_vector<double>() == std::vector<double>{2, 0, 1, 2, 0, 1});
}
