// The version counter (issue 28): a tensor an op saved for its backward and then changed in
// place (whatever the grad mode, through a view too) makes that backward raise, naming the op
// that saved it and the op that changed it, instead of returning a wrong gradient. Tensors an
// op did not save may change freely; in-place ReLU becomes safe.
#include <catch2/catch.hpp>

#include <functional>
#include <string>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using Catch::Contains;

namespace {

// Runs backward of sum(f()) and returns the error text ("" when it ran).
std::string backward_error(const Tensor& loss) {
  try {
    sum(loss).backward();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Tensor leaf(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, DType::f64, &g).requires_grad_();
}

Tensor plain(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, DType::f64, &g);
}

}  // namespace

TEST_CASE("version counter: in-place ops, copy_ and fill_ bump it, views share it",
          "[autograd][version]") {
  Tensor x = zeros({4, 3});
  const uint64_t v0 = x.version();
  Tensor row = x.select(0, 1);
  add_(row, 1.0);
  CHECK(x.version() == v0 + 1);
  CHECK(row.version() == x.version());
  x.detach().fill_(2.0);
  CHECK(x.version() == v0 + 2);
  x.copy_(ones({4, 3}));
  CHECK(x.version() == v0 + 3);
  mul_(x, 2.0);
  addcmul_(x, x, x);
  addcdiv_(x, x, ones({4, 3}));
  CHECK(x.version() == v0 + 6);
  // A new tensor has its own counter.
  Tensor y = x.clone();
  CHECK(y.version() != x.version());
  x.bump_version("test");
  CHECK(x.version() == v0 + 7);
}

TEST_CASE("an output saved for backward and changed in place under NoGradGuard raises",
          "[autograd][version]") {
  // Issue 28's report: exp(w) + 1 came back as the gradient instead of exp(w).
  Tensor w = leaf({5}, 1);
  Tensor y = exp(w);
  {
    NoGradGuard ng;
    add_(y, 1.0);
  }
  const std::string err = backward_error(y);
  CHECK_THAT(err, Contains("backward of 'exp'") && Contains("output 0") &&
                      Contains("modified in place by 'add_'") && Contains("clone"));
  CHECK_FALSE(w.grad().defined());
  // Without the change the gradient is exp(w).
  Tensor w2 = leaf({5}, 1);
  Tensor y2 = exp(w2);
  CHECK(backward_error(y2).empty());
  CHECK(allclose(w2.grad(), exp(w2.detach()), 0, 0));
}

TEST_CASE("saved inputs of elementwise, matmul, conv, norm and softmax ops changed in place raise",
          "[autograd][version]") {
  struct Case {
    const char* op;
    std::function<Tensor(const Tensor& w, const Tensor& x)> f;
    Shape ws, xs;
  };
  const std::vector<Case> cases{
      {"mul", [](const Tensor& w, const Tensor& x) { return mul(w, x); }, {3, 4}, {3, 4}},
      {"div", [](const Tensor& w, const Tensor& x) { return div(w, x); }, {3, 4}, {3, 4}},
      {"mm", [](const Tensor& w, const Tensor& x) { return mm(w, x); }, {3, 4}, {4, 2}},
      {"linear", [](const Tensor& w, const Tensor& x) { return linear(x, w); }, {3, 4}, {2, 4}},
      {"conv2d",
       [](const Tensor& w, const Tensor& x) { return conv2d(x, w, Tensor(), 1, 1); },
       {4, 2, 3, 3},
       {2, 2, 5, 5}},
      {"batch_norm",
       [](const Tensor& w, const Tensor& x) {
         return mul(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true), w);
       },
       {2, 3, 4, 4},
       {2, 3, 4, 4}},
      {"layer_norm",
       [](const Tensor& w, const Tensor& x) { return mul(layer_norm(x, {4}), w); },
       {3, 4},
       {3, 4}},
  };
  for (const auto& c : cases) {
    INFO(c.op);
    // x does not require grad, so changing it in place is allowed even with grad mode on;
    // the op that saved it must notice. For the norms the changed tensor is x itself,
    // which the norm saved (the mul after it only scales the output).
    Tensor w = leaf(c.ws, 2);
    Tensor x = std::string(c.op) == "batch_norm" || std::string(c.op) == "layer_norm"
                   ? leaf(c.xs, 3)
                   : plain(c.xs, 3);
    Tensor out = c.f(w, x);
    if (x.requires_grad()) {
      NoGradGuard ng;
      x.detach().fill_(0.5);
    } else {
      add_(x, 1.0);
    }
    const std::string err = backward_error(out);
    CHECK_THAT(
        err, Contains("backward of '") && Contains("modified in place by '") && Contains("clone"));
  }
}

TEST_CASE("a saved tensor changed through a view, or by copy_, raises naming the writer",
          "[autograd][version]") {
  Tensor w = leaf({2, 3}, 4);
  Tensor base = plain({4, 3}, 5);
  Tensor x = base.narrow(0, 1, 2);  // a view: mul saves it
  Tensor y = mul(w, x);
  base.select(0, 3).copy_(zeros({3}));  // another row of the same storage
  CHECK_THAT(backward_error(y), Contains("backward of 'mul'") && Contains("input 1") &&
                                    Contains("modified in place by 'copy_'"));
  // softmax saves its output.
  Tensor s = softmax(leaf({2, 5}, 6), 1);
  {
    NoGradGuard ng;
    mul_(s, 2.0);
  }
  CHECK_THAT(backward_error(s), Contains("modified in place by 'mul_'"));
}

TEST_CASE("tensors an op did not save may change in place, and the gradient is right",
          "[autograd][version]") {
  // add saves neither input; 3x3/1 max pooling keeps its indices, not its input (2x2/2 keeps
  // the input and compares it with the maxima: there a change raises, below).
  Tensor w = leaf({3, 4}, 7);
  Tensor x = plain({3, 4}, 8);
  Tensor y = add(w, x);
  add_(x, 5.0);
  CHECK(backward_error(y).empty());
  CHECK(allclose(w.grad(), ones({3, 4}, DType::f64), 0, 0));

  Tensor a = leaf({1, 1, 5, 5}, 9);
  Tensor h = mul(a, 2.0);
  Tensor p = max_pool2d(h, 3, 1);
  const Tensor want = [&] {
    Tensor a2 = a.detach().clone().requires_grad_();
    sum(max_pool2d(mul(a2, 2.0), 3, 1)).backward();
    return a2.grad();
  }();
  {
    NoGradGuard ng;
    add_(h, 100.0);  // h is max_pool2d's input; mul(a, 2) saved only the scalar
  }
  const std::string err = backward_error(p);
  INFO(err);
  REQUIRE(err.empty());
  CHECK(allclose(a.grad(), want, 0, 0));

  Tensor b = leaf({1, 1, 4, 4}, 14);
  Tensor hb = mul(b, 2.0);
  Tensor q = max_pool2d(hb, 2);
  {
    NoGradGuard ng;
    add_(hb, 100.0);
  }
  CHECK_THAT(backward_error(q),
             Contains("backward of 'max_pool2d'") && Contains("modified in place by 'add_'"));
}

TEST_CASE("an optimizer step or load_state_dict between forward and backward raises",
          "[autograd][version]") {
  // The weight is saved when the input requires grad (the input's gradient needs it), as in
  // every layer but the first.
  nn::Linear lin(4, 2);
  Tensor x = plain({3, 4}, 10).to(DType::f32).requires_grad_();
  Tensor y = lin(x);
  optim::SGD opt(lin.parameters(), {.lr = 0.1});
  for (auto& p : lin.parameters()) p.set_grad(ones_like(p));
  const uint64_t before = lin.weight.version();
  opt.step();
  CHECK(lin.weight.version() == before + 1);
  CHECK_THAT(backward_error(y), Contains("modified in place by 'Optimizer::step'"));

  nn::Linear lin2(4, 2);
  Tensor y2 = lin2(x);
  lin2.load_state_dict(lin.state_dict());
  CHECK_THAT(backward_error(y2), Contains("modified in place by 'copy_'"));
}

TEST_CASE("relu_ and nn::ReLU({.inplace = true}) give relu's gradients, unsafe uses are refused",
          "[autograd][version][nn]") {
  Generator g(11);
  auto net = [&](bool inplace) {
    auto seq = std::make_shared<nn::Sequential>();
    seq->push_back(std::make_shared<nn::Conv2d>(2, 4, 3, nn::Conv2dOptions{.padding = 1}));
    seq->push_back(std::make_shared<nn::BatchNorm2d>(4));
    seq->push_back(std::make_shared<nn::ReLU>(nn::ReLUOptions{.inplace = inplace}));
    seq->push_back(std::make_shared<nn::Conv2d>(4, 3, 3));
    seq->push_back(std::make_shared<nn::ReLU>(nn::ReLUOptions{.inplace = inplace}));
    return seq;
  };
  auto a = net(false), b = net(true);
  b->load_state_dict(a->state_dict());
  const Tensor x = randn({2, 2, 6, 6}, DType::f32, &g);
  sum(a->forward(x)).backward();
  sum(b->forward(x)).backward();
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(allclose(pa[i].second.grad(), pb[i].second.grad(), 0, 0));
  }
  CHECK_THAT((*b)[2]->str(), Contains("inplace=true"));

  // Refused: a leaf, a view (its base's history could not follow), a tensor whose producer
  // kept a copy of it (sigmoid saves its output).
  Tensor w = leaf({3}, 12);
  CHECK_THROWS_WITH(relu_(w), Contains("leaf that requires grad"));
  Tensor m = mul(w, 2.0);
  Tensor v = m.narrow(0, 0, 2);
  CHECK_THROWS_WITH(relu_(v), Contains("shares its memory"));
  Tensor s = sigmoid(w);
  CHECK_THROWS_WITH(relu_(s), Contains("shares its memory"));
  // Allowed but caught later: an op saved the same tensor (mul saves its inputs).
  Tensor t = mul(w, 3.0);
  Tensor u = mul(t, w);
  relu_(t);
  CHECK_THAT(backward_error(u),
             Contains("backward of 'mul'") && Contains("modified in place by 'relu_'"));
  // Without grad mode, or on a tensor that needs none, it is a plain in-place op.
  Tensor p = plain({4}, 13);
  relu_(p);
  CHECK(min(p).item<double>() >= 0);
}
