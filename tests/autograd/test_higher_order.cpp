// Higher-order gradients: backward(create_graph), autograd::grad, the error node of ops whose
// backward is first-order only, and second-order gradchecks of the elementwise, shape,
// reduction and matrix ops.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>

#include "dltrain/autograd/node.hpp"
#include "dltrain/dltrain.hpp"
#include "tests/gradcheck.hpp"

using namespace dltrain;
using namespace dltrain::testing;
using Catch::Contains;

namespace {
double at(const Tensor& t, size_t i) { return t.to_vector<double>()[i]; }
// Zeros shaped like t with a one at flat position i.
Tensor one_hot_like(const Tensor& t, int64_t i) {
  std::vector<double> v(static_cast<size_t>(t.numel()), 0.0);
  v[static_cast<size_t>(i)] = 1.0;
  return from_vector<double>(v, t.shape());
}
}  // namespace

TEST_CASE("grad of grad: third power, exp, sin", "[autograd][higher]") {
  Tensor x = tensor({0.5, -1.0, 2.0}, DType::f64).requires_grad_();
  Tensor y = sum(mul(mul(x, x), x));  // y' = 3x^2, y'' = 6x, y''' = 6
  auto g1 = autograd::grad({y}, {x}, {}, std::nullopt, true);
  REQUIRE(g1[0].requires_grad());
  CHECK(at(g1[0], 1) == Approx(3.0));
  auto g2 = autograd::grad({sum(g1[0])}, {x}, {}, std::nullopt, true);
  CHECK(at(g2[0], 0) == Approx(3.0));
  CHECK(at(g2[0], 2) == Approx(12.0));
  auto g3 = autograd::grad({sum(g2[0])}, {x});
  CHECK(at(g3[0], 0) == Approx(6.0));
  CHECK_FALSE(g3[0].requires_grad());  // no create_graph: a plain tensor

  Tensor z = tensor({0.3}, DType::f64).requires_grad_();
  Tensor s = sum(sin(exp(z)));  // d2/dz2 = -sin(e^z) e^{2z} + cos(e^z) e^z
  auto d1 = autograd::grad({s}, {z}, {}, std::nullopt, true);
  auto d2 = autograd::grad({sum(d1[0])}, {z});
  const double e = std::exp(0.3);
  CHECK(at(d2[0], 0) == Approx(-std::sin(e) * e * e + std::cos(e) * e));
}

TEST_CASE("autograd::grad returns gradients without touching .grad or hooks",
          "[autograd][higher]") {
  Tensor w = tensor({1.0, 2.0}, DType::f64).requires_grad_();
  Tensor b = tensor({3.0}, DType::f64).requires_grad_();
  int hook_calls = 0;
  w.register_hook([&](const Tensor&) { ++hook_calls; });
  Tensor h = mul(w, 2.0);  // a non-leaf input
  Tensor y = sum(mul(h, b));
  auto g = autograd::grad({y}, {h, w}, {}, true);
  CHECK(g[0].to_vector<double>() == std::vector<double>{3, 3});
  CHECK(g[1].to_vector<double>() == std::vector<double>{6, 6});
  CHECK_FALSE(w.grad().defined());
  CHECK_FALSE(b.grad().defined());
  CHECK(hook_calls == 0);
  // The graph was retained: a normal backward still works and accumulates.
  y.backward();
  CHECK(w.grad().to_vector<double>() == std::vector<double>{6, 6});
  CHECK(b.grad().to_vector<double>() == std::vector<double>{6});
  CHECK(hook_calls == 1);
}

TEST_CASE("autograd::grad errors name the problem", "[autograd][higher]") {
  Tensor x = tensor({1.0, 2.0}, DType::f64).requires_grad_();
  Tensor unused = tensor({1.0}, DType::f64).requires_grad_();
  Tensor y = sum(mul(x, x));
  CHECK_THROWS_WITH(autograd::grad({y}, {x, unused}, {}, true),
                    Contains("input 1") && Contains("allow_unused=true"));
  auto g = autograd::grad({y}, {x, unused}, {}, true, false, true);
  CHECK(g[0].defined());
  CHECK_FALSE(g[1].defined());
  Tensor plain = tensor({1.0}, DType::f64);
  CHECK_THROWS_WITH(autograd::grad({y}, {plain}), Contains("does not require grad"));
  CHECK_THROWS_WITH(autograd::grad({y}, {x}, {Tensor(), Tensor()}), Contains("grad_outputs"));
  CHECK_THROWS_WITH(autograd::grad({mul(x, 2.0)}, {x}), Contains("one-element"));
}

TEST_CASE("backward(create_graph) accumulates gradients that carry a graph", "[autograd][higher]") {
  Tensor x = tensor({1.0, -2.0}, DType::f64).requires_grad_();
  Tensor y = sum(mul(mul(x, x), x));
  y.backward(Tensor(), false, true);
  Tensor gx = x.grad();
  REQUIRE(gx.requires_grad());  // 3x^2 with its graph
  CHECK(gx.to_vector<double>() == std::vector<double>{3, 12});
  // Differentiate the gradient's norm (a gradient penalty): d/dx sum(3x^2) = 6x.
  x.set_grad(Tensor());
  sum(gx).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{6, -12});
}

TEST_CASE("a leaf whose graph-carrying gradient is dropped is freed", "[autograd][higher]") {
  std::weak_ptr<TensorImpl> weak;
  {
    Tensor x = tensor({1.0, 2.0}, DType::f64).requires_grad_();
    weak = x.impl();
    sum(mul(mul(x, x), x)).backward(Tensor(), false, true);
    REQUIRE(x.grad().requires_grad());
    // x -> grad -> graph of 3x^2 -> x is a cycle (as in PyTorch); dropping the gradient, as
    // zero_grad() does, breaks it. AccumulateGrad holds x weakly, so nothing else remains.
    x.set_grad(Tensor());
  }
  CHECK(weak.expired());
}

TEST_CASE("double backward through a first-order-only op raises a named error",
          "[autograd][higher]") {
  Tensor x = tensor({1.0, 2.0}, DType::f64).requires_grad_();
  // An op whose backward is a kernel with no higher-order formula.
  Tensor out = mul(x.detach(), x.detach());
  autograd::record("square_kernel", {x}, {out}, [x = x.detach()](const std::vector<Tensor>& g) {
    NoGradGuard ng;
    return std::vector<Tensor>{mul(mul(g[0], x), 2.0)};
  });
  auto g1 = autograd::grad({sum(out)}, {x}, {}, std::nullopt, true);
  CHECK(g1[0].to_vector<double>() == std::vector<double>{2, 4});  // first order is right
  REQUIRE(g1[0].requires_grad());  // but carries the error node, not a silent constant
  CHECK_THROWS_WITH(
      autograd::grad({sum(g1[0])}, {x}),
      Contains("double backward through 'square_kernel'") && Contains("not implemented"));
}

TEST_CASE("Hessian-vector product of a small MLP matches finite differences",
          "[autograd][higher]") {
  Tensor w1 = leaf({4, 3}, 1, 0.5), w2 = leaf({1, 4}, 2, 0.5);
  Tensor x = rnd({5, 3}, 3);
  auto loss = [&](const Tensor& a) { return sum(tanh(linear(tanh(linear(x, a)), w2))); };
  Tensor v = rnd({4, 3}, 4);
  Tensor g = autograd::grad({loss(w1)}, {w1}, {}, std::nullopt, true)[0];
  Tensor hv = autograd::grad({sum(mul(g, v))}, {w1})[0];
  // (grad(w + eps v) - grad(w - eps v)) / (2 eps)
  const double eps = 1e-5;
  auto grad_at = [&](double s) {
    Tensor a = add(w1.detach(), mul(v, s)).requires_grad_();
    return autograd::grad({loss(a)}, {a})[0];
  };
  Tensor fd = div(sub(grad_at(eps), grad_at(-eps)), 2 * eps);
  CHECK(allclose(hv, fd, 1e-5, 1e-7));
}

TEST_CASE("second-order gradchecks: arithmetic and unary math", "[autograd][higher]") {
  Tensor a = leaf({2, 3}, 11), b = leaf({3}, 12);
  gradgradcheck([](const std::vector<Tensor>& t) { return add(t[0], t[1], 0.5); }, {a, b});
  gradgradcheck([](const std::vector<Tensor>& t) { return sub(t[0], t[1], 2.0); }, {a, b});
  gradgradcheck([](const std::vector<Tensor>& t) { return mul(t[0], t[1]); }, {a, b});
  Tensor pos = add(abs(leaf({2, 3}, 13).detach()), 0.5).requires_grad_();
  gradgradcheck([](const std::vector<Tensor>& t) { return div(t[0], t[1]); }, {a, pos});
  gradgradcheck([](const std::vector<Tensor>& t) { return exp(t[0]); }, {a});
  gradgradcheck([](const std::vector<Tensor>& t) { return log(t[0]); }, {pos});
  gradgradcheck([](const std::vector<Tensor>& t) { return sqrt(t[0]); }, {pos});
  gradgradcheck([](const std::vector<Tensor>& t) { return rsqrt(t[0]); }, {pos});
  gradgradcheck([](const std::vector<Tensor>& t) { return pow(t[0], 3.0); }, {a});
  gradgradcheck([](const std::vector<Tensor>& t) { return pow(t[0], t[1]); }, {pos, a});
  gradgradcheck([](const std::vector<Tensor>& t) { return neg(t[0]); }, {a});
  gradgradcheck([](const std::vector<Tensor>& t) { return sin(t[0]); }, {a});
  gradgradcheck([](const std::vector<Tensor>& t) { return cos(t[0]); }, {a});
  gradgradcheck([](const std::vector<Tensor>& t) { return log1p(t[0]); }, {pos});
  gradgradcheck([](const std::vector<Tensor>& t) { return expm1(t[0]); }, {a});
  gradgradcheck([](const std::vector<Tensor>& t) { return maximum(t[0], t[1]); }, {a, b});
  gradgradcheck([](const std::vector<Tensor>& t) { return mul(abs(t[0]), t[0]); }, {a});
  gradgradcheck([](const std::vector<Tensor>& t) { return mul(sign(t[0]), t[0]); }, {a});
  gradgradcheck([](const std::vector<Tensor>& t) { return where(gt(t[0], 0.0), t[0], t[1]); },
                {a, b});
}

TEST_CASE("second-order gradchecks: activations", "[autograd][higher]") {
  // Values away from the kinks (|x| > 0.1), where the second derivative exists.
  Generator gen(5);
  Tensor v = randn({3, 4}, DType::f64, &gen);
  Tensor x = add(v, mul(sign(v), 0.2)).requires_grad_();
  gradgradcheck([](const std::vector<Tensor>& t) { return relu(t[0]); }, {x});
  gradgradcheck([](const std::vector<Tensor>& t) { return leaky_relu(t[0], 0.1); }, {x});
  gradgradcheck([](const std::vector<Tensor>& t) { return gelu(t[0], false); }, {x});
  gradgradcheck([](const std::vector<Tensor>& t) { return gelu(t[0], true); }, {x});
  gradgradcheck([](const std::vector<Tensor>& t) { return sigmoid(t[0]); }, {x});
  gradgradcheck([](const std::vector<Tensor>& t) { return tanh(t[0]); }, {x});
  gradgradcheck([](const std::vector<Tensor>& t) { return silu(t[0]); }, {x});
  gradgradcheck([](const std::vector<Tensor>& t) { return softplus(t[0], 2.0, 20.0); }, {x});
  gradgradcheck([](const std::vector<Tensor>& t) { return elu(t[0], 1.5); }, {x});
  gradgradcheck([](const std::vector<Tensor>& t) { return mish(t[0]); }, {x});
  gradgradcheck([](const std::vector<Tensor>& t) { return mul(hardswish(t[0]), 1.0); }, {x});
  gradgradcheck([](const std::vector<Tensor>& t) { return clamp(t[0], -0.5, 0.7); }, {x});
  // Third order of gelu(erf) through its recorded derivative: d3/dx3 at 0.3.
  Tensor z = tensor({0.3}, DType::f64).requires_grad_();
  Tensor d1 = autograd::grad({sum(gelu(z, false))}, {z}, {}, std::nullopt, true)[0];
  Tensor d2 = autograd::grad({sum(d1)}, {z}, {}, std::nullopt, true)[0];
  Tensor d3 = autograd::grad({sum(d2)}, {z})[0];
  // gelu''(x) = phi(x) (2 - x^2), so gelu'''(x) = phi(x) (x^3 - 4x)
  const double phi = std::exp(-0.045) / std::sqrt(2 * M_PI);
  CHECK(at(d2, 0) == Approx(phi * (2 - 0.09)));
  CHECK(at(d3, 0) == Approx(phi * (0.027 - 1.2)));
}

TEST_CASE("second-order gradchecks: shapes, reductions, matrices", "[autograd][higher]") {
  Tensor a = leaf({2, 3, 4}, 21), m = leaf({4, 5}, 22), n = leaf({2, 4, 3}, 23);
  gradgradcheck(
      [](const std::vector<Tensor>& t) {
        return mul(t[0].permute({2, 0, 1}).reshape({4, 6}), t[0].reshape({4, 6}));
      },
      {a});
  gradgradcheck(
      [](const std::vector<Tensor>& t) {
        Tensor s = t[0].slice(2, 1, 4, 2);
        return mul(s, s);
      },
      {a});
  gradgradcheck(
      [](const std::vector<Tensor>& t) {
        return mul(cat({t[0], mul(t[0], t[0])}, 1), sum(t[0], {1}, true).expand({2, 6, 4}));
      },
      {a});
  gradgradcheck(
      [](const std::vector<Tensor>& t) { return mul(mean(t[0], {1}), sum(max(t[0], 2).first)); },
      {a});
  gradgradcheck(
      [](const std::vector<Tensor>& t) { return mul(matmul(t[0], t[1]), matmul(t[0], t[1])); },
      {a, m});
  gradgradcheck([](const std::vector<Tensor>& t) { return tanh(bmm(t[0], t[1])); }, {a, n});
  Tensor w = leaf({3, 4}, 24), b = leaf({3}, 25);
  gradgradcheck([](const std::vector<Tensor>& t) { return sigmoid(linear(t[0], t[1], t[2])); },
                {a, w, b});
}

TEST_CASE("second-order gradchecks: softmax and losses", "[autograd][higher]") {
  Tensor x = leaf({4, 5}, 31), x3 = leaf({2, 3, 4}, 32);
  gradgradcheck([](const std::vector<Tensor>& t) { return softmax(t[0], 1); }, {x});
  gradgradcheck([](const std::vector<Tensor>& t) { return log_softmax(t[0], 0); }, {x});
  const Tensor target = tensor({1, 4, -100, 0}, DType::i64);
  const Tensor t3 = tensor({0, 2, 1, 1, -100, 0, 2, 2}, DType::i64).reshape({2, 4});
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    CrossEntropyOptions o;
    o.reduction = red;
    o.label_smoothing = 0.1;
    o.weight = tensor({0.5, 1.0, 2.0, 1.5, 0.7}, DType::f64);
    gradgradcheck([&](const std::vector<Tensor>& t) { return cross_entropy(t[0], target, o); },
                  {x});
    CrossEntropyOptions o3 = o;
    o3.weight = Tensor();
    gradgradcheck([&](const std::vector<Tensor>& t) { return cross_entropy(t[0], t3, o3); }, {x3});
    NLLLossOptions n;
    n.reduction = red;
    n.weight = o.weight;
    // nll of log_softmax: the composite path through two nodes.
    gradgradcheck(
        [&](const std::vector<Tensor>& t) { return nll_loss(log_softmax(t[0], 1), target, n); },
        {x});
  }
  Tensor y = leaf({4, 5}, 33);
  gradgradcheck([](const std::vector<Tensor>& t) { return mse_loss(t[0], t[1]); }, {x, y});
  Tensor prob = sigmoid(leaf({4, 5}, 34).detach());
  Tensor pw = add(abs(leaf({5}, 35).detach()), 0.5).requires_grad_();
  gradgradcheck(
      [&](const std::vector<Tensor>& t) {
        return binary_cross_entropy_with_logits(t[0], prob,
                                                {.reduction = Reduction::Mean, .pos_weight = t[1]});
      },
      {x, pw});
}

TEST_CASE("second-order gradchecks: normalisation layers", "[autograd][higher]") {
  Tensor x = leaf({3, 4, 2, 3}, 41), w = leaf({4}, 42), b = leaf({4}, 43);
  gradgradcheck(
      [](const std::vector<Tensor>& t) {
        return batch_norm(t[0], t[1], t[2], Tensor(), Tensor(), true, 0.1, 1e-5);
      },
      {x, w, b});
  Tensor rm = rnd({4}, 44), rv = add(abs(rnd({4}, 45)), 0.5);
  gradgradcheck(
      [&](const std::vector<Tensor>& t) {
        return mul(batch_norm(t[0], t[1], t[2], rm, rv, false, 0.1, 1e-5), t[0]);
      },
      {x, w, b});
  Tensor lw = leaf({2, 3}, 46), lb = leaf({2, 3}, 47);
  gradgradcheck(
      [](const std::vector<Tensor>& t) {
        return layer_norm(t[0], {2, 3}, t[1], t[2], 1e-5);
      },
      {x, lw, lb});
  gradgradcheck([](const std::vector<Tensor>& t) { return group_norm(t[0], 2, t[1], t[2], 1e-5); },
                {x, w, b});
}

TEST_CASE("second-order gradchecks: convolutions", "[autograd][higher]") {
  Tensor x = leaf({2, 4, 5, 6}, 51, 0.5), w = leaf({6, 2, 3, 3}, 52, 0.5), b = leaf({6}, 53);
  gradgradcheck(
      [](const std::vector<Tensor>& t) {
        return tanh(conv2d(t[0], t[1], t[2], Int2(2, 1), Int2(1, 1), Int2(1, 2), 2));
      },
      {x, w, b});
  Tensor xt = leaf({2, 4, 3, 3}, 54, 0.5), wt = leaf({4, 3, 3, 2}, 55, 0.5), bt = leaf({6}, 56);
  gradgradcheck(
      [](const std::vector<Tensor>& t) {
        return tanh(conv_transpose2d(t[0], t[1], t[2], Int2(2, 2), Int2(1, 0), Int2(1, 1), 2));
      },
      {xt, wt, bt});
}

TEST_CASE("gradient penalty of a conv critic: f32 (oneDNN where built) agrees with f64",
          "[autograd][higher]") {
  // WGAN-GP: penalty = mean((|d critic / d input| - 1)^2), differentiated w.r.t. the weights.
  auto penalty_grads = [](DType dt) {
    Tensor w1 = rnd({4, 3, 3, 3}, 61).to(dt).requires_grad_();
    Tensor w2 = rnd({1, 4, 3, 3}, 62).to(dt).requires_grad_();
    Tensor x = rnd({2, 3, 6, 6}, 63).to(dt).requires_grad_();
    Tensor h = leaky_relu(batch_norm(conv2d(x, w1, Tensor(), 1, 1), Tensor(), Tensor(), Tensor(),
                                     Tensor(), true, 0.1, 1e-5),
                          0.2);
    Tensor critic = sum(conv2d(h, w2, Tensor(), 2, 0));
    Tensor gx = autograd::grad({critic}, {x}, {}, std::nullopt, true)[0];
    Tensor norm = sqrt(sum(mul(gx, gx), {1, 2, 3}));
    Tensor gp = mean(mul(sub(norm, 1.0), sub(norm, 1.0)));
    return autograd::grad({gp}, {w1, w2});
  };
  auto f64 = penalty_grads(DType::f64), f32 = penalty_grads(DType::f32);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(f64[i].to_vector<double>().size() == f32[i].to_vector<double>().size());
    CHECK(allclose(f32[i].to(DType::f64), f64[i], 1e-3, 1e-4));
  }
}

TEST_CASE("second-order gradchecks: pooling", "[autograd][higher]") {
  Tensor x = leaf({2, 3, 6, 5}, 71);
  // Products with x make the second derivative with respect to x non-zero as well.
  gradgradcheck([](const std::vector<Tensor>& t) { return max_pool2d(mul(t[0], t[0]), 2); }, {x});
  gradgradcheck(
      [](const std::vector<Tensor>& t) {
        return max_pool2d(t[0], Int2(3, 2), Int2(2, 1), Int2(1, 1), Int2(1, 1), true);
      },
      {x});
  gradgradcheck(
      [](const std::vector<Tensor>& t) {
        auto [y, i] = max_pool2d_with_indices(t[0], 3, 2, 1);
        return mul(y, y);
      },
      {x});
  gradgradcheck(
      [](const std::vector<Tensor>& t) {
        return mul(avg_pool2d(t[0], 3, 2, 1, true, false), avg_pool2d(t[0], 3, 2, 1, true, true));
      },
      {x});
  gradgradcheck(
      [](const std::vector<Tensor>& t) { return exp(adaptive_avg_pool2d(t[0], Int2(4, 3))); }, {x});
  Tensor x3 = leaf({3, 4, 4}, 72);
  gradgradcheck([](const std::vector<Tensor>& t) { return mul(max_pool2d(t[0], 2), 2.0); }, {x3});
}

TEST_CASE("second-order gradchecks: indexing and segment ops", "[autograd][higher]") {
  Tensor x = leaf({5, 4}, 81), src = leaf({3, 4}, 82);
  const Tensor idx = tensor({4, 0, 4}, DType::i64);
  gradgradcheck([&](const std::vector<Tensor>& t) { return sin(index_select(t[0], 0, idx)); }, {x});
  const Tensor gi = tensor({0, 2, 1, 3, 4, 4, 0, 1, 2, 2, 3, 0}, DType::i64).reshape({3, 4});
  gradgradcheck([&](const std::vector<Tensor>& t) { return exp(gather(t[0], 0, gi)); }, {x});
  gradgradcheck([&](const std::vector<Tensor>& t) { return tanh(scatter_add(t[0], 0, gi, t[1])); },
                {x, src});
  gradgradcheck(
      [&](const std::vector<Tensor>& t) { return tanh(index_add(t[0], 0, idx, t[1], 0.5)); },
      {x, src});
  const Tensor ids = tensor({1, 0, 1}, DType::i64);
  gradgradcheck(
      [&](const std::vector<Tensor>& t) {
        return mul(segment_sum(t[0], ids, 2), sum(t[1], {0}, true).expand({2, 4}));
      },
      {src, x});
  const Tensor tok = tensor({3, 0, 3, 1}, DType::i64).reshape({2, 2});
  gradgradcheck([&](const std::vector<Tensor>& t) { return tanh(embedding(t[0], tok, 0)); }, {x});
}

TEST_CASE("second-order gradchecks: cumsum, prod, norm, pad, interpolate, scatter_reduce",
          "[autograd][higher]") {
  Tensor x = leaf({2, 3, 4, 5}, 91);
  gradgradcheck([](const std::vector<Tensor>& t) { return mul(cumsum(t[0], 2), t[0]); }, {x});
  gradgradcheck([](const std::vector<Tensor>& t) { return prod(t[0], 1, false); }, {x});
  // A zero in a product: the gradient of the others stays exact.
  Tensor z = tensor({0.5, 0.0, -2.0, 1.5}, DType::f64).reshape({2, 2}).requires_grad_();
  gradgradcheck([](const std::vector<Tensor>& t) { return prod(t[0], 0, true); }, {z});
  for (double p : {1.0, 2.0, 3.0})
    gradgradcheck([p](const std::vector<Tensor>& t) { return norm(t[0], p, {1, 3}, false); }, {x});
  for (PadMode m : {PadMode::Constant, PadMode::Reflect, PadMode::Replicate})
    gradgradcheck(
        [m](const std::vector<Tensor>& t) {
          Tensor y = pad(t[0], {1, 2, 2, 1}, m, 0.5);
          return mul(y, y);
        },
        {x});
  InterpolateOptions o;
  o.size = Int2(7, 3);
  o.mode = InterpolateMode::Bilinear;
  gradgradcheck(
      [&](const std::vector<Tensor>& t) {
        Tensor y = interpolate(t[0], o);
        return mul(y, y);
      },
      {x});
  InterpolateOptions n;
  n.scale_factor = Double2(2.0, 1.5);
  gradgradcheck([&](const std::vector<Tensor>& t) { return exp(interpolate(t[0], n)); }, {x});
  Tensor base = leaf({4, 3}, 92), src = leaf({5, 3}, 93);
  const Tensor idx = tensor({0, 2, 2, 3, 0}, DType::i64).reshape({5, 1}).expand({5, 3});
  for (ScatterReduce r : {ScatterReduce::Sum, ScatterReduce::Mean, ScatterReduce::Amax})
    gradgradcheck(
        [&, r](const std::vector<Tensor>& t) {
          Tensor y = scatter_reduce(t[0], 0, idx.contiguous(), t[1], r, false);
          return mul(y, y);
        },
        {base, src});
  const Tensor ids = tensor({1, 0, 1, 1, 0}, DType::i64);
  gradgradcheck([&](const std::vector<Tensor>& t) { return segment_softmax(t[0], ids, 2); }, {src});
  gradgradcheck([&](const std::vector<Tensor>& t) { return exp(segment_max(t[0], ids, 2)); },
                {src});
}

TEST_CASE("second-order gradcheck through scaled dot-product attention", "[autograd][higher]") {
  Tensor q = leaf({2, 3, 4}, 101, 0.5), k = leaf({2, 5, 4}, 102, 0.5), v = leaf({2, 5, 4}, 103);
  const Tensor mask =
      tensor({1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}, DType::b8).reshape({3, 5});
  gradgradcheck(
      [&](const std::vector<Tensor>& t) {
        return scaled_dot_product_attention(t[0], t[1], t[2], mask);
      },
      {q, k, v});
}

TEST_CASE("physics-informed residual: u_xx by double backward matches finite differences",
          "[autograd][higher]") {
  // u(x) = w2 tanh(w1 x + b1): the second derivative in x, then its gradient in w1 (third order
  // through linear and tanh), as a PINN loss needs.
  Tensor w1 = leaf({8, 1}, 111), b1 = leaf({8}, 112), w2 = leaf({1, 8}, 113);
  auto u = [&](const Tensor& x, const Tensor& a) { return linear(tanh(linear(x, a, b1)), w2); };
  Tensor x = tensor({-0.7, 0.1, 0.9}, DType::f64).reshape({3, 1}).requires_grad_();
  Tensor ux = autograd::grad({sum(u(x, w1))}, {x}, {}, std::nullopt, true)[0];
  Tensor uxx = autograd::grad({sum(ux)}, {x}, {}, std::nullopt, true)[0];
  const double h = 1e-4;
  Tensor xd = x.detach();
  Tensor fd = div(add(sub(u(add(xd, h), w1), mul(u(xd, w1), 2.0)), u(sub(xd, h), w1)), h * h);
  CHECK(allclose(uxx, fd.detach(), 1e-5, 1e-6));
  // The residual's gradient with respect to the weights.
  Tensor loss = mean(mul(uxx, uxx));
  Tensor gw = autograd::grad({loss}, {w1})[0];
  const double e = 1e-6;
  auto loss_at = [&](double s) {
    Tensor a = add(w1.detach(), mul(one_hot_like(w1, 3), s)).requires_grad_();
    Tensor xx = x.detach().requires_grad_();
    Tensor g1 = autograd::grad({sum(u(xx, a))}, {xx}, {}, std::nullopt, true)[0];
    Tensor g2 = autograd::grad({sum(g1)}, {xx})[0];
    return mean(mul(g2, g2)).item<double>();
  };
  CHECK(at(gw, 3) == Approx((loss_at(e) - loss_at(-e)) / (2 * e)).epsilon(1e-4));
}

TEST_CASE("zero_grad cuts a graph-carrying gradient instead of failing", "[autograd][higher]") {
  nn::Linear lin(3, 2);
  lin.to(DType::f64);
  Tensor x = rnd({4, 3}, 121);
  sum(tanh(lin.forward(x))).backward(Tensor(), false, true);
  REQUIRE(lin.parameters()[0].grad().requires_grad());
  lin.zero_grad(false);
  CHECK_FALSE(lin.parameters()[0].grad().requires_grad());
  CHECK(sum(abs(lin.parameters()[0].grad())).item<double>() == 0.0);
  sum(tanh(lin.forward(x))).backward(Tensor(), false, true);
  optim::SGDOptions so;
  so.lr = 0.1;
  optim::SGD opt(lin.parameters(), so);
  opt.zero_grad(false);
  CHECK_FALSE(lin.parameters()[0].grad().requires_grad());
}
