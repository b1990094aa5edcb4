// LR schedulers against PyTorch 1.13 (tests/reference/optim_reference.txt): each lr sequence
// (two groups, construction + 30 steps), OneCycleLR's momentum / beta1 sequence, state-dict
// round trips that continue exactly, and the errors.
#include <functional>
#include <memory>

#include "optim_test_util.hpp"

using namespace dltrain;
using namespace dltrain::optim;
using Catch::Contains;
using optim_test::R;

namespace {

constexpr int kSteps = 30;

// SGD with two groups (lr 0.1 and 0.02) and momentum 0.9, as make_optim_reference.py's sgd2().
std::unique_ptr<Optimizer> sgd2() {
  std::vector<ParamGroup> g = {{.params = {zeros({2}, DType::f64)}},
                               {.params = {zeros({3}, DType::f64)}, .lr = 0.02}};
  return std::make_unique<SGD>(std::move(g), SGDOptions{.lr = 0.1, .momentum = 0.9});
}
std::unique_ptr<Optimizer> adam2() {
  std::vector<ParamGroup> g = {{.params = {zeros({2}, DType::f64)}},
                               {.params = {zeros({3}, DType::f64)}, .lr = 0.02}};
  return std::make_unique<Adam>(std::move(g), AdamOptions{.lr = 0.1});
}

using Make = std::function<std::shared_ptr<LRScheduler>(Optimizer&)>;

struct Case {
  std::string name;
  std::function<std::unique_ptr<Optimizer>()> optimizer;
  Make make;
  const char* momentum = nullptr;  // "momentum" or "beta1" for OneCycleLR
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"step", sgd2, [](Optimizer& o) { return std::make_shared<StepLR>(o, 7, 0.5); }},
      {"multistep", sgd2,
       [](Optimizer& o) {
         return std::make_shared<MultiStepLR>(o, std::vector<int64_t>{5, 12, 12, 20}, 0.3);
       }},
      {"cosine", sgd2,
       [](Optimizer& o) { return std::make_shared<CosineAnnealingLR>(o, 10, 0.001); }},
      {"linear", sgd2, [](Optimizer& o) { return std::make_shared<LinearLR>(o, 0.25, 1.0, 8); }},
      {"linear_decay", sgd2,
       [](Optimizer& o) { return std::make_shared<LinearLR>(o, 1.0, 0.1, 10); }},
      {"constant", sgd2, [](Optimizer& o) { return std::make_shared<ConstantLR>(o, 0.5, 4); }},
      {"exponential", sgd2, [](Optimizer& o) { return std::make_shared<ExponentialLR>(o, 0.9); }},
      {"lambda", sgd2,
       [](Optimizer& o) {
         return std::make_shared<LambdaLR>(
             o, [](int64_t e) { return 1.0 / (1.0 + 0.5 * static_cast<double>(e)); });
       }},
      {"onecycle_cos", sgd2,
       [](Optimizer& o) {
         return std::make_shared<OneCycleLR>(o, std::vector<double>{1.0, 0.5}, 30);
       },
       "momentum"},
      {"onecycle_linear", adam2,
       [](Optimizer& o) {
         return std::make_shared<OneCycleLR>(
             o, 0.3, 30,
             OneCycleOptions{.pct_start = 0.25,
                             .anneal_strategy = AnnealStrategy::Linear,
                             .base_momentum = 0.8,
                             .max_momentum = 0.9,
                             .div_factor = 10.0,
                             .final_div_factor = 100.0});
       },
       "beta1"},
      {"onecycle_three", sgd2,
       [](Optimizer& o) {
         return std::make_shared<OneCycleLR>(o, 0.8, 30, OneCycleOptions{.three_phase = true});
       },
       "momentum"},
      {"onecycle_nomom", sgd2,
       [](Optimizer& o) {
         return std::make_shared<OneCycleLR>(o, 0.8, 30, OneCycleOptions{.cycle_momentum = false});
       },
       "momentum"},
      {"sequential", sgd2,
       [](Optimizer& o) {
         auto warm = std::make_shared<LinearLR>(o, 0.1, 1.0, 5);
         auto cos = std::make_shared<CosineAnnealingLR>(o, 25, 1e-4);
         return std::make_shared<SequentialLR>(
             o, std::vector<std::shared_ptr<LRScheduler>>{warm, cos}, std::vector<int64_t>{5});
       }},
      {"sequential3", sgd2,
       [](Optimizer& o) {
         auto s1 = std::make_shared<LinearLR>(o, 0.1, 1.0, 5);
         auto s2 = std::make_shared<StepLR>(o, 4, 0.5);
         auto s3 = std::make_shared<CosineAnnealingLR>(o, 10);
         return std::make_shared<SequentialLR>(
             o, std::vector<std::shared_ptr<LRScheduler>>{s1, s2, s3}, std::vector<int64_t>{5, 15});
       }},
      {"chained", sgd2,
       [](Optimizer& o) {
         auto a = std::make_shared<LinearLR>(o, 0.2, 1.0, 4);
         auto b = std::make_shared<ExponentialLR>(o, 0.9);
         return std::make_shared<ChainedScheduler>(std::vector<std::shared_ptr<LRScheduler>>{a, b});
       }},
  };
  return c;
}

std::vector<double> momenta(const Optimizer& o, const char* kind) {
  std::vector<double> out;
  for (const auto& g : o.param_groups()) {
    out.push_back(std::string(kind) == "beta1" ? (*g.betas)[0] : *g.momentum);
  }
  return out;
}

void check_row(const std::vector<double>& got, const Tensor& table, int64_t row, double rtol,
               const std::string& what) {
  optim_test::require_close(from_vector(got), table.select(0, row).contiguous(), rtol, 1e-15,
                            what + " row " + std::to_string(row));
}

}  // namespace

TEST_CASE("every scheduler's lr sequence matches PyTorch", "[optim][scheduler][reference]") {
  for (const Case& c : cases()) {
    SECTION(c.name) {
      auto opt = c.optimizer();
      auto sched = c.make(*opt);
      const Tensor lr = R("sched." + c.name + ".lr");
      REQUIRE(lr.size(0) == kSteps + 1);
      const Tensor mom = c.momentum ? R("sched." + c.name + ".momentum") : Tensor();
      for (int64_t k = 0; k <= kSteps; ++k) {
        if (k > 0) {
          opt->step();  // no gradients: a no-op, in the order PyTorch expects
          sched->step();
        }
        check_row(sched->get_last_lr(), lr, k, 1e-12, c.name + " lr");
        std::vector<double> group_lr;
        for (const auto& g : opt->param_groups()) group_lr.push_back(*g.lr);
        CHECK(group_lr == sched->get_last_lr());
        if (c.momentum) check_row(momenta(*opt, c.momentum), mom, k, 1e-12, c.name + " mom");
      }
      CHECK(sched->last_epoch() == kSteps);
    }
  }
}

TEST_CASE("OneCycleLR raises when stepped past total_steps and keeps its state",
          "[optim][scheduler][errors]") {
  auto opt = sgd2();
  OneCycleLR sched(*opt, 1.0, 30);
  for (int k = 0; k < 30; ++k) sched.step();  // PyTorch allows total_steps steps
  const auto lr = sched.get_last_lr();
  // PyTorch's message counts the construction step too: the 31st step() is its 32nd
  REQUIRE_THROWS_WITH(sched.step(), Contains("tried to step 32 times") && Contains("30"));
  CHECK(sched.last_epoch() == 30);
  CHECK(sched.get_last_lr() == lr);
  CHECK(*opt->param_groups()[0].lr == lr[0]);
}

TEST_CASE("scheduler and optimizer state dicts resume a schedule exactly",
          "[optim][scheduler][state]") {
  for (const Case& c : cases()) {
    SECTION(c.name) {
      auto full_opt = c.optimizer();
      auto full = c.make(*full_opt);
      for (int k = 0; k < 20; ++k) full->step();

      auto opt1 = c.optimizer();
      auto s1 = c.make(*opt1);
      for (int k = 0; k < 7; ++k) s1->step();
      const StateDict osd = opt1->state_dict(), ssd = s1->state_dict();
      CHECK(ssd.scalar("last_epoch") == 7.0);
      CHECK(ssd.contains("base_lrs"));

      auto opt2 = c.optimizer();
      auto s2 = c.make(*opt2);
      opt2->load_state_dict(osd);
      s2->load_state_dict(ssd);
      CHECK(s2->last_epoch() == 7);
      CHECK(s2->get_last_lr() == s1->get_last_lr());
      for (int k = 7; k < 20; ++k) s2->step();
      CHECK(s2->get_last_lr() == full->get_last_lr());
      CHECK(s2->last_epoch() == full->last_epoch());
      if (c.momentum) CHECK(momenta(*opt2, c.momentum) == momenta(*full_opt, c.momentum));
    }
  }
}

TEST_CASE("scheduler load_state_dict rejects foreign states", "[optim][scheduler][errors]") {
  auto opt = sgd2();
  StepLR step(*opt, 3);
  const StateDict sd = step.state_dict();
  auto opt2 = sgd2();
  CosineAnnealingLR cos(*opt2, 10);
  REQUIRE_THROWS_WITH(cos.load_state_dict(sd), Contains("saved by a StepLR"));

  Tensor w = zeros({2}, DType::f64);
  SGD one({w}, {.lr = 0.1});
  StepLR other(one, 3);
  REQUIRE_THROWS_WITH(other.load_state_dict(sd), Contains("one per param group"));
  CHECK(other.last_epoch() == 0);

  StateDict bad = sd;
  bad.erase("gamma");
  auto opt3 = sgd2();
  StepLR fresh(*opt3, 5);
  REQUIRE_THROWS_WITH(fresh.load_state_dict(bad), Contains("'gamma'"));

  auto opt4 = sgd2();
  auto warm = std::make_shared<LinearLR>(*opt4, 0.1, 1.0, 5);
  auto tail = std::make_shared<CosineAnnealingLR>(*opt4, 25);
  SequentialLR seq(*opt4, {warm, tail}, {5});
  StateDict sseq = seq.state_dict();
  CHECK(sseq.contains("schedulers.1.T_max"));
  sseq.erase("schedulers.1.eta_min");
  for (int k = 0; k < 3; ++k) seq.step();
  REQUIRE_THROWS_WITH(seq.load_state_dict(sseq), Contains("eta_min"));
  CHECK(seq.last_epoch() == 3);
  CHECK(warm->last_epoch() == 3);  // the child loaded before the failure was rolled back
}

TEST_CASE("invalid scheduler arguments raise dltrain::Error", "[optim][scheduler][errors]") {
  auto opt = sgd2();
  REQUIRE_THROWS_WITH(StepLR(*opt, 0), Contains("step_size"));
  REQUIRE_THROWS_WITH(LinearLR(*opt, 0.0), Contains("start_factor"));
  REQUIRE_THROWS_WITH(LinearLR(*opt, 0.5, 1.5), Contains("end_factor"));
  REQUIRE_THROWS_WITH(LinearLR(*opt, 0.5, 1.0, 0), Contains("total_iters"));
  REQUIRE_THROWS_WITH(ConstantLR(*opt, 1.5), Contains("factor"));
  REQUIRE_THROWS_WITH(CosineAnnealingLR(*opt, 0), Contains("T_max"));
  REQUIRE_THROWS_WITH(MultiStepLR(*opt, {-1}), Contains("milestones"));
  REQUIRE_THROWS_WITH(OneCycleLR(*opt, 1.0, 0), Contains("total_steps"));
  REQUIRE_THROWS_WITH(OneCycleLR(*opt, 1.0, 10, {.pct_start = 1.5}), Contains("pct_start"));
  REQUIRE_THROWS_WITH(OneCycleLR(*opt, std::vector<double>{1.0}, 10), Contains("one per"));
  REQUIRE_THROWS_WITH(
      LambdaLR(*opt, std::vector<std::function<double(int64_t)>>{[](int64_t) { return 1.0; }}),
      Contains("one per param group"));

  auto a = std::make_shared<LinearLR>(*opt, 0.1, 1.0, 5);
  auto b = std::make_shared<StepLR>(*opt, 3);
  REQUIRE_THROWS_WITH(SequentialLR(*opt, {a, b}, {}), Contains("milestone"));
  REQUIRE_THROWS_WITH(SequentialLR(*opt, {a, b, b}, {5, 5}), Contains("increase strictly"));
  auto other = sgd2();
  auto foreign = std::make_shared<StepLR>(*other, 3);
  REQUIRE_THROWS_WITH(SequentialLR(*opt, {a, foreign}, {5}), Contains("another optimizer"));
  REQUIRE_THROWS_WITH(ChainedScheduler({a, foreign}), Contains("another optimizer"));

  // a group added after the scheduler was made
  StepLR s(*opt, 2);
  opt->add_param_group({.params = {zeros({1}, DType::f64)}});
  REQUIRE_THROWS_WITH(s.step(), Contains("param groups"));
}

TEST_CASE("the first scheduler sets initial_lr, later ones reuse it", "[optim][scheduler]") {
  auto opt = sgd2();
  LinearLR warm(*opt, 0.5, 1.0, 4);
  CHECK(*opt->param_groups()[0].initial_lr == 0.1);
  CHECK(*opt->param_groups()[0].lr == 0.05);
  StepLR later(*opt, 3);
  CHECK(later.base_lrs() == std::vector<double>{0.1, 0.02});
  CHECK(opt->state_dict().scalar("param_groups.1.initial_lr") == 0.02);
}
