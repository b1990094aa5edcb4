// SGD, Adam and AdamW against PyTorch 1.13 (tests/reference/optim_reference.txt), in f64
// (tight) and f32; state-dict round trips that must continue bit for bit; parameter groups;
// the memory layouts the fused pass accepts; and every error the optimizers raise.
#include <functional>
#include <memory>

#include "optim_test_util.hpp"

using namespace dltrain;
using namespace dltrain::optim;
using Catch::Contains;
using optim_test::R;

namespace {

constexpr int kSteps = 5;
using Factory = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

// The configurations of make_optim_reference.py, built the same way.
const std::map<std::string, Factory>& configs() {
  static const std::map<std::string, Factory> c = {
      {"sgd_plain", [](auto p) { return std::make_unique<SGD>(p, SGDOptions{.lr = 0.1}); }},
      {"sgd_momentum",
       [](auto p) {
         return std::make_unique<SGD>(
             p, SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
       }},
      {"sgd_nesterov",
       [](auto p) {
         return std::make_unique<SGD>(
             p, SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
       }},
      {"sgd_maximize",
       [](auto p) {
         return std::make_unique<SGD>(p, SGDOptions{.lr = 0.1, .momentum = 0.5, .maximize = true});
       }},
      {"sgd_skip",
       [](auto p) { return std::make_unique<SGD>(p, SGDOptions{.lr = 0.1, .momentum = 0.8}); }},
      {"adam_wd",
       [](auto p) {
         return std::make_unique<Adam>(
             p, AdamOptions{.lr = 0.01, .betas = {0.8, 0.99}, .eps = 1e-8, .weight_decay = 0.1});
       }},
      {"adam_amsgrad",
       [](auto p) { return std::make_unique<Adam>(p, AdamOptions{.lr = 0.02, .amsgrad = true}); }},
      {"adam_maximize",
       [](auto p) {
         return std::make_unique<Adam>(p, AdamOptions{.lr = 0.01, .eps = 1e-6, .maximize = true});
       }},
      {"adam_skip", [](auto p) { return std::make_unique<Adam>(p, AdamOptions{.lr = 0.05}); }},
      {"adamw",
       [](auto p) {
         return std::make_unique<AdamW>(p, AdamWOptions{.lr = 0.01, .weight_decay = 0.05});
       }},
      {"adamw_amsgrad",
       [](auto p) {
         return std::make_unique<AdamW>(
             p,
             AdamWOptions{.lr = 0.03, .betas = {0.85, 0.95}, .weight_decay = 0.1, .amsgrad = true});
       }},
      {"sgd_groups",
       [](auto p) {
         return std::make_unique<SGD>(
             std::vector<ParamGroup>{{.params = {p[0]}, .lr = 0.2, .weight_decay = 0.05},
                                     {.params = {p[1]}}},
             SGDOptions{.lr = 0.01, .momentum = 0.9});
       }},
      {"adam_groups",
       [](auto p) {
         return std::make_unique<Adam>(
             std::vector<ParamGroup>{{.params = {p[0]}},
                                     {.params = {p[1]}, .lr = 0.05, .weight_decay = 0.2}},
             AdamOptions{.lr = 0.01});
       }},
  };
  return c;
}

std::vector<Tensor> initial_params(DType dt) {
  Tensor w = R("optim.init.w").to(dt).clone();
  Tensor b = R("optim.init.b").to(dt).clone();
  w.requires_grad_();
  b.requires_grad_();
  return {w, b};
}

// Feeds step k's reference gradients (b gets none at step 2 for "_skip" configs).
void set_grads(const std::string& config, std::vector<Tensor>& p, int k) {
  const std::string pre = "optim.grad." + std::to_string(k) + ".";
  p[0].set_grad(R(pre + "w").to(p[0].dtype()).clone());
  const bool skip = config.size() > 5 && config.substr(config.size() - 5) == "_skip" && k == 2;
  p[1].set_grad(skip ? Tensor() : R(pre + "b").to(p[1].dtype()).clone());
}

void check_config(const std::string& name, DType dt, double rtol, double atol) {
  auto p = initial_params(dt);
  auto opt = configs().at(name)(p);
  for (int k = 0; k < kSteps; ++k) {
    set_grads(name, p, k);
    opt->step();
    const std::string pre = "optim." + name + "." + std::to_string(k) + ".";
    optim_test::require_close(p[0], R(pre + "w"), rtol, atol, pre + "w");
    optim_test::require_close(p[1], R(pre + "b"), rtol, atol, pre + "b");
  }
}

}  // namespace

TEST_CASE("every optimizer config matches PyTorch in f64", "[optim][reference]") {
  for (const auto& [name, make] : configs()) {
    (void)make;
    SECTION(name) { check_config(name, DType::f64, 1e-10, 1e-13); }
  }
}

TEST_CASE("every optimizer config works on f32 parameters", "[optim][reference][f32]") {
  for (const auto& [name, make] : configs()) {
    (void)make;
    SECTION(name) { check_config(name, DType::f32, 1e-4, 1e-5); }
  }
}

TEST_CASE("param groups take their own lr and weight decay, the rest from the options",
          "[optim][groups]") {
  auto p = initial_params(DType::f64);
  auto opt = configs().at("sgd_groups")(p);
  const auto& g = opt->param_groups();
  REQUIRE(g.size() == 2);
  CHECK(*g[0].lr == 0.2);
  CHECK(*g[0].weight_decay == 0.05);
  CHECK(*g[0].momentum == 0.9);
  CHECK(*g[1].lr == 0.01);
  CHECK(*g[1].weight_decay == 0.0);
  CHECK_FALSE(g[1].betas.has_value());
  CHECK(opt->num_params() == 2);

  // add_param_group appends with the defaults; its parameter moves with its own lr
  Tensor extra = ones({3}, DType::f64);
  extra.requires_grad_();
  opt->add_param_group({.params = {extra}, .lr = 1.0, .momentum = 0.0});
  REQUIRE(opt->param_groups().size() == 3);
  CHECK(*opt->param_groups()[2].dampening == 0.0);
  extra.set_grad(full({3}, 0.5, DType::f64));
  opt->step();
  CHECK(extra.to_vector<double>() == std::vector<double>{0.5, 0.5, 0.5});
  CHECK(opt->parameters().size() == 3);
}

TEST_CASE("parameters without a gradient are skipped and get no state", "[optim]") {
  for (const char* name : {"sgd_momentum", "adam_wd"}) {
    INFO(name);
    auto p = initial_params(DType::f64);
    auto opt = configs().at(name)(p);
    const auto b_before = p[1].to_vector<double>();
    p[0].set_grad(R("optim.grad.0.w").clone());
    opt->step();
    CHECK(p[1].to_vector<double>() == b_before);
    const StateDict sd = opt->state_dict();
    CHECK_FALSE(sd.sub("state.1.").size() > 0);
    CHECK(sd.sub("state.0.").size() > 0);
  }
}

TEST_CASE("zero_grad drops or zeroes gradients", "[optim]") {
  auto p = initial_params(DType::f64);
  SGD opt(p, {.lr = 0.1});
  p[0].set_grad(ones({3, 4}, DType::f64));
  p[1].set_grad(ones({4}, DType::f64));
  opt.zero_grad(false);
  REQUIRE(p[0].grad().defined());
  CHECK(p[0].grad().to_vector<double>() == std::vector<double>(12, 0.0));
  opt.zero_grad();
  CHECK_FALSE(p[0].grad().defined());
  CHECK_FALSE(p[1].grad().defined());
}

TEST_CASE("state_dict then load_state_dict continues bit for bit", "[optim][state]") {
  for (const auto& [name, make] : configs()) {
    SECTION(name) {
      // uninterrupted
      auto p = initial_params(DType::f64);
      auto opt = make(p);
      for (int k = 0; k < kSteps; ++k) {
        set_grads(name, p, k);
        opt->step();
      }
      // 3 steps, save, fresh optimizer on copies of the parameters, load, 2 more
      auto q = initial_params(DType::f64);
      auto first = make(q);
      for (int k = 0; k < 3; ++k) {
        set_grads(name, q, k);
        first->step();
      }
      const StateDict saved = first->state_dict();
      std::vector<Tensor> r;
      for (const auto& t : q) {
        Tensor c = t.detach().clone();
        c.requires_grad_();
        r.push_back(c);
      }
      set_grads(name, q, 3);
      first->step();  // the snapshot must not follow later steps
      CHECK(saved.contains("param_groups.0.lr"));
      CHECK(saved.contains("param_groups.0.params"));
      CHECK(saved.contains("type"));

      auto second = make(r);
      second->param_groups()[0].lr = 123.0;  // must be restored from the state
      second->load_state_dict(saved);
      CHECK(*second->param_groups()[0].lr == *opt->param_groups()[0].lr);
      for (int k = 3; k < kSteps; ++k) {
        set_grads(name, r, k);
        second->step();
      }
      optim_test::require_equal(r[0], p[0], name + " w");
      optim_test::require_equal(r[1], p[1], name + " b");
    }
  }
}

TEST_CASE("state dict keys follow PyTorch's names", "[optim][state]") {
  auto p = initial_params(DType::f64);
  Adam adam(p, {.lr = 0.01, .amsgrad = true});
  set_grads("adam", p, 0);
  adam.step();
  const StateDict sd = adam.state_dict();
  for (const char* key :
       {"state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq", "state.0.max_exp_avg_sq",
        "state.1.exp_avg", "param_groups.0.lr", "param_groups.0.betas", "param_groups.0.eps",
        "param_groups.0.weight_decay", "param_groups.0.amsgrad", "param_groups.0.maximize"}) {
    INFO(key);
    CHECK(sd.contains(key));
  }
  CHECK(sd.scalar("state.0.step") == 1.0);
  CHECK(sd.at("state.0.exp_avg").shape() == Shape{3, 4});
  CHECK(sd.at("param_groups.0.params").to_vector<int64_t>() == std::vector<int64_t>{0, 1});
  CHECK_FALSE(sd.contains("param_groups.0.momentum"));

  auto q = initial_params(DType::f64);
  SGD sgd(q, {.lr = 0.1, .momentum = 0.9});
  set_grads("sgd", q, 0);
  sgd.step();
  const StateDict s2 = sgd.state_dict();
  CHECK(s2.contains("state.1.momentum_buffer"));
  CHECK(s2.scalar("param_groups.0.nesterov") == 0.0);
}

TEST_CASE("load_state_dict rejects states that do not fit, and changes nothing",
          "[optim][state][errors]") {
  auto p = initial_params(DType::f64);
  Adam adam(p, {.lr = 0.01});
  set_grads("adam", p, 0);
  adam.step();
  const StateDict good = adam.state_dict();

  SECTION("another optimizer type") {
    auto q = initial_params(DType::f64);
    SGD sgd(q, {.lr = 0.1, .momentum = 0.9});
    REQUIRE_THROWS_WITH(sgd.load_state_dict(good), Contains("saved by a Adam optimizer"));
    AdamW adamw(q, {});
    REQUIRE_THROWS_WITH(adamw.load_state_dict(good), Contains("cannot be loaded into AdamW"));
  }
  SECTION("wrong number of parameters") {
    Tensor only = zeros({3, 4}, DType::f64);
    only.requires_grad_();
    Adam one({only}, {});
    REQUIRE_THROWS_WITH(one.load_state_dict(good), Contains("has 1 parameters but the saved"));
  }
  SECTION("wrong number of groups") {
    auto q = initial_params(DType::f64);
    Adam two(std::vector<ParamGroup>{{.params = {q[0]}}, {.params = {q[1]}}}, {});
    REQUIRE_THROWS_WITH(two.load_state_dict(good), Contains("param groups"));
  }
  SECTION("mismatched shapes") {
    Tensor w = zeros({4, 3}, DType::f64), b = zeros({4}, DType::f64);
    Adam other({w, b}, {.lr = 0.5});
    REQUIRE_THROWS_WITH(other.load_state_dict(good),
                        Contains("state.0.exp_avg") && Contains("[3, 4]") && Contains("[4, 3]"));
    CHECK(*other.param_groups()[0].lr == 0.5);  // unchanged
  }
  SECTION("missing keys") {
    auto q = initial_params(DType::f64);
    Adam fresh(q, {.lr = 0.5});
    StateDict bad = good;
    bad.erase("state.1.exp_avg_sq");
    REQUIRE_THROWS_WITH(fresh.load_state_dict(bad), Contains("state.1.exp_avg_sq"));
    StateDict bad2 = good;
    bad2.erase("param_groups.0.eps");
    REQUIRE_THROWS_WITH(fresh.load_state_dict(bad2), Contains("param_groups.0.eps"));
    StateDict bad3 = good;
    bad3.erase("type");
    REQUIRE_THROWS_WITH(fresh.load_state_dict(bad3), Contains("'type'"));
    CHECK(*fresh.param_groups()[0].lr == 0.5);
    CHECK(fresh.state_dict().sub("state.").empty());
  }
  SECTION("unexpected keys") {
    auto q = initial_params(DType::f64);
    Adam fresh(q, {});
    StateDict bad = good;
    bad.insert("state.0.momentum_buffer", zeros({3, 4}, DType::f64));
    REQUIRE_THROWS_WITH(fresh.load_state_dict(bad), Contains("unexpected entry"));
    StateDict bad2 = good;
    bad2.insert("state.7.exp_avg", zeros({3, 4}, DType::f64));
    REQUIRE_THROWS_WITH(fresh.load_state_dict(bad2), Contains("only 2 parameters"));
  }
  SECTION("invalid saved hyper-parameters") {
    auto q = initial_params(DType::f64);
    Adam fresh(q, {});
    StateDict bad = good;
    bad.insert("param_groups.0.betas", from_vector(std::vector<double>{1.5, 0.9}));
    REQUIRE_THROWS_WITH(fresh.load_state_dict(bad), Contains("beta1"));
  }
  SECTION("f32 parameters load an f64 state (converted)") {
    auto q = initial_params(DType::f32);
    Adam f32(q, {});
    f32.load_state_dict(good);
    CHECK(f32.state_dict().at("state.0.exp_avg").dtype() == DType::f32);
  }
}

TEST_CASE("invalid hyper-parameters raise dltrain::Error", "[optim][errors]") {
  auto p = initial_params(DType::f64);
  REQUIRE_THROWS_WITH(SGD(p, SGDOptions{}), Contains("no default lr"));
  REQUIRE_THROWS_WITH(SGD(p, {.lr = -0.1}), Contains("invalid learning rate"));
  REQUIRE_THROWS_WITH(SGD(p, {.lr = 0.1, .momentum = -0.5}), Contains("invalid momentum"));
  REQUIRE_THROWS_WITH(SGD(p, {.lr = 0.1, .weight_decay = -1}), Contains("weight_decay"));
  REQUIRE_THROWS_WITH(SGD(p, {.lr = 0.1, .nesterov = true}), Contains("Nesterov"));
  REQUIRE_THROWS_WITH(SGD(p, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                      Contains("dampening == 0"));
  REQUIRE_THROWS_WITH(Adam(p, {.lr = -1}), Contains("invalid learning rate"));
  REQUIRE_THROWS_WITH(Adam(p, {.betas = {1.0, 0.999}}), Contains("invalid beta1"));
  REQUIRE_THROWS_WITH(Adam(p, {.betas = {0.9, -0.1}}), Contains("invalid beta2"));
  REQUIRE_THROWS_WITH(Adam(p, {.eps = -1e-8}), Contains("invalid eps"));
  REQUIRE_THROWS_WITH(AdamW(p, {.weight_decay = -0.01}), Contains("AdamW: invalid weight_decay"));
  // per-group overrides are validated too, and foreign fields are refused
  REQUIRE_THROWS_WITH(SGD(std::vector<ParamGroup>{{.params = {p[0]}, .lr = -2.0}}, {.lr = 0.1}),
                      Contains("param group 0"));
  REQUIRE_THROWS_WITH(
      SGD(std::vector<ParamGroup>{{.params = {p[0]}, .betas = std::array{0.9, 0.99}}}, {.lr = 0.1}),
      Contains("sets 'betas', which SGD does not use"));
  REQUIRE_THROWS_WITH(Adam(std::vector<ParamGroup>{{.params = {p[0]}, .momentum = 0.9}}, {}),
                      Contains("'momentum'"));
  // parameter lists
  REQUIRE_THROWS_WITH(SGD(std::vector<Tensor>{}, {.lr = 0.1}), Contains("empty parameter list"));
  REQUIRE_THROWS_WITH(SGD(std::vector<Tensor>{p[0], p[0]}, {.lr = 0.1}),
                      Contains("more than one param group"));
  SGD opt(p, {.lr = 0.1});
  REQUIRE_THROWS_WITH(opt.add_param_group({.params = {p[1]}}), Contains("more than one"));
  REQUIRE_THROWS_WITH(SGD(std::vector<Tensor>{zeros({2}, DType::i64)}, {.lr = 0.1}),
                      Contains("floating-point"));
  Tensor nonleaf = mul(p[0], 2.0);
  REQUIRE_THROWS_WITH(SGD(std::vector<Tensor>{nonleaf}, {.lr = 0.1}), Contains("not a leaf"));
  REQUIRE_THROWS_WITH(SGD(std::vector<Tensor>{Tensor()}, {.lr = 0.1}), Contains("undefined"));
}

TEST_CASE("step refuses what the fused pass cannot update", "[optim][errors]") {
  Tensor w = zeros({3, 4}, DType::f64);
  w.requires_grad_();
  SGD opt({w}, {.lr = 0.1});
  w.set_grad(zeros({3, 4}, DType::f32));
  REQUIRE_THROWS_WITH(opt.step(), Contains("gradient of parameter 0 is float32"));

  Tensor h = zeros({4}, DType::f16);  // f16 parameters are updated (test_low_precision.cpp)
  SGD half({h}, {.lr = 0.1});
  h.set_grad(zeros({4}, DType::bf16));
  REQUIRE_THROWS_WITH(half.step(), Contains("gradient of parameter 0 is bfloat16"));

  Tensor base = zeros({4, 6}, DType::f64);
  Tensor strided = base.slice(1, 0, 6, 2);  // non-dense view
  SGD view({strided}, {.lr = 0.1});
  strided.set_grad(ones({4, 3}, DType::f64));
  REQUIRE_THROWS_WITH(view.step(), Contains("non-dense view"));
}

TEST_CASE("channels-last parameters and mismatched gradient layouts update correctly",
          "[optim][layout]") {
  Generator gen(7);
  Tensor w0 = randn({2, 3, 4, 5}, DType::f64, &gen);
  Tensor g0 = randn({2, 3, 4, 5}, DType::f64, &gen);
  auto run = [&](MemoryFormat pfmt, MemoryFormat gfmt) {
    Tensor w = w0.contiguous(pfmt).clone(pfmt);
    Adam opt({w}, {.lr = 0.1, .weight_decay = 0.01, .amsgrad = true});
    for (int k = 0; k < 3; ++k) {
      w.set_grad(g0.contiguous(gfmt).clone(gfmt));
      opt.step();
    }
    return w;
  };
  Tensor ref = run(MemoryFormat::Contiguous, MemoryFormat::Contiguous);
  Tensor cl = run(MemoryFormat::ChannelsLast, MemoryFormat::ChannelsLast);
  Tensor mixed = run(MemoryFormat::ChannelsLast, MemoryFormat::Contiguous);
  CHECK(cl.is_contiguous(MemoryFormat::ChannelsLast));
  optim_test::require_equal(cl, ref, "channels-last");
  optim_test::require_equal(mixed, ref, "channels-last param, contiguous grad");
}

TEST_CASE("large parameters split over threads give the scalar formula's result",
          "[optim][parallel]") {
  const int64_t n = 300001;  // several chunks, ragged end
  Generator gen(11);
  Tensor w = randn({n}, DType::f64, &gen), g1 = randn({n}, DType::f64, &gen),
         g2 = randn({n}, DType::f64, &gen);
  std::vector<double> p = w.to_vector<double>(), buf(static_cast<size_t>(n));
  const auto a = g1.to_vector<double>(), b = g2.to_vector<double>();
  const double lr = 0.05, mom = 0.9, wd = 1e-3;
  for (int step = 0; step < 2; ++step) {
    const auto& g = step == 0 ? a : b;
    for (size_t k = 0; k < p.size(); ++k) {
      double d = g[k] + wd * p[k];
      buf[k] = step == 0 ? d : mom * buf[k] + d;
      d = d + mom * buf[k];
      p[k] = p[k] - lr * d;
    }
  }
  const int threads = get_num_threads();
  set_num_threads(3);
  SGD opt({w}, {.lr = lr, .momentum = mom, .weight_decay = wd, .nesterov = true});
  w.set_grad(g1);
  opt.step();
  w.set_grad(g2);
  opt.step();
  set_num_threads(threads);
  optim_test::require_close(w, from_vector(p), 1e-13, 1e-15, "SGD nesterov, 300001 elements");
}

TEST_CASE("optimizers fit a linear regression from autograd gradients", "[optim][autograd]") {
  Generator gen(3);
  Tensor x = randn({64, 5}, DType::f64, &gen);
  Tensor true_w = randn({5, 1}, DType::f64, &gen);
  Tensor y = matmul(x, true_w);
  for (int which = 0; which < 3; ++which) {
    INFO("optimizer " << which);
    Tensor w = zeros({5, 1}, DType::f64);
    w.requires_grad_();
    std::unique_ptr<Optimizer> opt;
    if (which == 0)
      opt = std::make_unique<SGD>(std::vector<Tensor>{w}, SGDOptions{.lr = 0.1, .momentum = 0.9});
    if (which == 1) opt = std::make_unique<Adam>(std::vector<Tensor>{w}, AdamOptions{.lr = 0.05});
    if (which == 2)
      opt = std::make_unique<AdamW>(std::vector<Tensor>{w},
                                    AdamWOptions{.lr = 0.05, .weight_decay = 0.0});
    double first = 0.0, last = 0.0;
    for (int it = 0; it < 300; ++it) {
      opt->zero_grad();
      Tensor loss = mse_loss(matmul(x, w), y);
      loss.backward();
      opt->step();
      (it == 0 ? first : last) = loss.item<double>();
    }
    CHECK(last < 1e-6 * first);
    optim_test::require_close(w, true_w, 1e-3, 1e-3, "recovered weights");
  }
}
