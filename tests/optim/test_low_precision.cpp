// Optimizers on f16 and bf16 parameters (pure low-precision training): the state is f32, the
// update is the f32 update of the parameter's value rounded once to its dtype, state dicts
// round-trip, and parameters converted in place by Module::to keep f32 state.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using namespace dltrain::optim;

namespace {

using MakeOpt = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

const std::vector<std::pair<const char*, MakeOpt>>& configs() {
  static const std::vector<std::pair<const char*, MakeOpt>> c = {
      {"sgd_momentum",
       [](std::vector<Tensor> p) {
         return std::make_unique<SGD>(
             std::move(p),
             SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
       }},
      {"sgd_nesterov",
       [](std::vector<Tensor> p) {
         return std::make_unique<SGD>(std::move(p),
                                      SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true});
       }},
      {"adam_amsgrad",
       [](std::vector<Tensor> p) {
         return std::make_unique<Adam>(
             std::move(p), AdamOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true});
       }},
      {"adamw",
       [](std::vector<Tensor> p) {
         return std::make_unique<AdamW>(std::move(p), AdamWOptions{.lr = 0.01});
       }},
  };
  return c;
}

}  // namespace

TEST_CASE("f16 and bf16 parameters update in f32 and round once per step", "[optim][lowp]") {
  for (DType dt : {DType::f16, DType::bf16}) {
    for (const auto& [name, make] : configs()) {
      INFO(name << " on " << dt);
      Generator gen(5);
      Tensor p = randn({7, 9}, DType::f32, &gen).to(dt);
      Tensor ref = p.to(DType::f32);  // the f32 twin, reset to p's value before each step
      auto opt = make({p});
      auto opt_ref = make({ref});
      for (int k = 0; k < 6; ++k) {
        const Tensor g = randn({7, 9}, DType::f32, &gen).to(dt);
        p.set_grad(g);
        {
          NoGradGuard ng;
          ref.copy_(p);
        }
        ref.set_grad(g.to(DType::f32));
        opt->step();
        opt_ref->step();
        REQUIRE(p.dtype() == dt);
        // Bit-identical to the f32 update rounded to dt.
        REQUIRE(allclose(p.to(DType::f32), ref.to(dt).to(DType::f32), 0, 0));
      }
      for (const auto& [key, t] : opt->state_dict()) {
        INFO(key);
        if (key.find("state.0.") == 0 && key != "state.0.step") CHECK(t.dtype() == DType::f32);
      }
    }
  }
}

TEST_CASE("low-precision optimizer state round-trips through state_dict", "[optim][lowp]") {
  for (const auto& [name, make] : configs()) {
    INFO(name);
    Generator gen(9);
    Tensor a = randn({5}, DType::f32, &gen).to(DType::bf16);
    Tensor b = a.clone();
    auto opt_a = make({a});
    std::vector<Tensor> grads;
    for (int k = 0; k < 4; ++k) grads.push_back(randn({5}, DType::f32, &gen).to(DType::bf16));
    for (int k = 0; k < 2; ++k) {
      a.set_grad(grads[k]);
      opt_a->step();
    }
    auto opt_b = make({b});
    {
      NoGradGuard ng;
      b.copy_(a);
    }
    opt_b->load_state_dict(opt_a->state_dict());
    for (int k = 2; k < 4; ++k) {
      a.set_grad(grads[k]);
      b.set_grad(grads[k]);
      opt_a->step();
      opt_b->step();
    }
    CHECK(allclose(a.to(DType::f32), b.to(DType::f32), 0, 0));
  }
}

TEST_CASE("state stays f32 when Module::to converts parameters to bf16", "[optim][lowp]") {
  manual_seed(3);
  nn::Linear lin(4, 3);
  Adam opt(lin.parameters(), {.lr = 0.01});
  const Tensor x = ones({2, 4});
  sum(lin.forward(x)).backward();
  opt.step();
  opt.zero_grad();
  lin.to(DType::bf16);
  REQUIRE(lin.weight.dtype() == DType::bf16);
  sum(lin.forward(x.to(DType::bf16))).backward();
  REQUIRE(lin.weight.grad().dtype() == DType::bf16);
  opt.step();
  CHECK(lin.weight.dtype() == DType::bf16);
  const StateDict sd = opt.state_dict();
  CHECK(sd.at("state.0.exp_avg").dtype() == DType::f32);
  CHECK(sd.at("state.0.exp_avg_sq").dtype() == DType::f32);
  CHECK(sd.scalar("state.0.step") == 2.0);
}
