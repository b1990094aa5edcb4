// nn::register_forward_hooks: pre and post hooks run around forward in Module::operator(), in
// registration order; a post hook's result is what the call returns (and carries gradients
// through it); removed hooks no longer run; a direct forward() call runs none.
#include <catch2/catch.hpp>

#include <string>

#include "dltrain/dltrain.hpp"

using namespace dltrain;

TEST_CASE("forward hooks run around operator(), in order, and are removable", "[nn][hooks]") {
  manual_seed(1);
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back(std::make_shared<nn::Linear>(3, 2, true, TensorOptions(DType::f64)));
  seq->push_back(std::make_shared<nn::ReLU>());
  nn::Module& lin = *seq->child("0");
  std::string log;
  const uint64_t a = nn::register_forward_hooks(
      lin, {.pre = [&](nn::Module& m) { log += "pre-a(" + m.type_name() + ") "; },
            .post =
                [&](nn::Module&, const Tensor& out) {
                  log += "post-a ";
                  return mul(out, 2.0);  // the call returns this
                }});
  const uint64_t b = nn::register_forward_hooks(lin, {.pre = [&](nn::Module&) { log += "pre-b "; },
                                                      .post =
                                                          [&](nn::Module&, const Tensor& out) {
                                                            log += "post-b ";
                                                            return out;
                                                          }});
  Tensor x = randn({4, 3}, DType::f64).requires_grad_();
  Tensor plain = lin.forward(x);  // no hooks on a direct forward call
  CHECK(log.empty());
  Tensor hooked = (*seq)(x);
  CHECK(log == "pre-a(Linear) pre-b post-a post-b ");
  CHECK(max(abs(sub(hooked, relu(mul(plain, 2.0))))).item<double>() == 0.0);
  // Gradients flow through what the post hook returned.
  sum(hooked).backward();
  Tensor gx = x.grad().clone();
  x.set_grad(Tensor());
  sum(relu(mul(lin.forward(x), 2.0))).backward();
  CHECK(max(abs(sub(gx, x.grad()))).item<double>() == 0.0);

  nn::remove_forward_hooks(a);
  log.clear();
  (*seq)(x);
  CHECK(log == "pre-b post-b ");
  nn::remove_forward_hooks(b);
  nn::remove_forward_hooks(b);  // unknown now: nothing happens
  log.clear();
  (*seq)(x);
  CHECK(log.empty());
}
