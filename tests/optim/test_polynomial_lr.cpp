// PolynomialLR against its closed formula (there is no PyTorch golden data for end_lr != 0):
// every step of several (total_iters, power, end_lr), the MLPerf schedule (LinearLR warm-up
// then polynomial decay in a SequentialLR), exact mid-schedule resume, and the errors.
//
// Tolerance: the scheduler applies PyTorch's recursive rule lr_t - e = (lr_{t-1} - e) * f_t
// with f_t = ((1 - t/T) / (1 - (t-1)/T))^p. Each f_t carries rounding from t/T, the two
// subtractions, the division and pow: relative error <= p * eps * (T/(T-t) + T/(T-t+1)) + 3 eps,
// so after t steps the distance above end_lr is off by at most
// (base - e) * eps * (2 p T (1 + ln T) + 3 t) relative to base (the harmonic sum of T/(T-k));
// the test allows twice that, plus 4 eps |lr| for the final additions.
#include <cmath>
#include <limits>
#include <memory>

#include "optim_test_util.hpp"

using namespace dltrain;
using namespace dltrain::optim;
using Catch::Contains;

namespace {

constexpr double kEps = std::numeric_limits<double>::epsilon();

std::unique_ptr<Optimizer> sgd2() {
  std::vector<ParamGroup> g = {{.params = {zeros({2}, DType::f64)}},
                               {.params = {zeros({3}, DType::f64)}, .lr = 0.02}};
  return std::make_unique<SGD>(std::move(g), SGDOptions{.lr = 0.1, .momentum = 0.9});
}

double poly(double base, double end, int64_t t, int64_t T, double p) {
  const double tt = static_cast<double>(std::min(t, T)), TT = static_cast<double>(T);
  return (base - end) * std::pow(1.0 - tt / TT, p) + end;
}

double tolerance(double base, double end, double lr, int64_t t, int64_t T, double p) {
  const double TT = static_cast<double>(T);
  return 2.0 * std::fabs(base - end) * kEps *
             (2.0 * p * TT * (1.0 + std::log(TT)) + 3.0 * static_cast<double>(t)) +
         4.0 * kEps * std::fabs(lr);
}

struct PolyCase {
  int64_t T;
  double power, end;
};

}  // namespace

TEST_CASE("PolynomialLR follows its closed formula at every step", "[optim][scheduler]") {
  for (const PolyCase c : {PolyCase{5, 1.0, 0.0}, PolyCase{10, 2.0, 1e-4}, PolyCase{7, 0.5, 0.0},
                           PolyCase{12, 3.0, 0.005}, PolyCase{1, 2.0, 1e-3}}) {
    INFO("total_iters " << c.T << " power " << c.power << " end_lr " << c.end);
    auto opt = sgd2();
    PolynomialLR sched(*opt, c.T, c.power, c.end);
    const std::vector<double> base = {0.1, 0.02};
    for (int64_t t = 0; t <= 3 * c.T + 2; ++t) {
      if (t > 0) sched.step();
      REQUIRE(sched.last_epoch() == t);
      for (size_t g = 0; g < 2; ++g) {
        const double want = poly(base[g], c.end, t, c.T, c.power);
        const double got = *opt->param_groups()[g].lr;
        INFO("step " << t << " group " << g << ": got " << got << " want " << want);
        CHECK(got == sched.get_last_lr()[g]);
        CHECK(std::fabs(got - want) <= tolerance(base[g], c.end, want, t, c.T, c.power));
        // At and after total_iters the factor is exactly 0: the lr is end_lr exactly.
        if (t >= c.T) CHECK(got == c.end);
      }
    }
  }
}

TEST_CASE("PolynomialLR with end_lr 0 is PyTorch's PolynomialLR", "[optim][scheduler]") {
  // PyTorch's defaults: total_iters 5, power 1: lr = base * (1 - t/5), then 0.
  auto opt = sgd2();
  PolynomialLR sched(*opt);
  const std::vector<double> want = {0.1, 0.08, 0.06, 0.04, 0.02, 0.0, 0.0};
  for (size_t t = 0; t < want.size(); ++t) {
    if (t > 0) sched.step();
    CHECK(std::fabs(sched.get_last_lr()[0] - want[t]) <= 16 * kEps * 0.1);
  }
}

TEST_CASE("LinearLR warm-up then PolynomialLR decay gives MLPerf's schedule",
          "[optim][scheduler]") {
  // MLPerf ResNet-50 / LARS: linear warm-up over W steps from base/W... here from 0.1*base,
  // then (base - end) * (1 - (t - W) / (N - W))^2 + end.
  constexpr int64_t W = 5, N = 30;
  constexpr double end = 1e-4, p = 2.0;
  auto opt = sgd2();
  auto warm = std::make_shared<LinearLR>(*opt, 0.1, 1.0, W);
  auto decay = std::make_shared<PolynomialLR>(*opt, N - W, p, end);
  SequentialLR sched(*opt, {warm, decay}, {W});
  const std::vector<double> base = {0.1, 0.02};
  for (int64_t t = 0; t <= N + 3; ++t) {
    if (t > 0) sched.step();
    for (size_t g = 0; g < 2; ++g) {
      const double got = sched.get_last_lr()[g];
      double want, tol;
      if (t < W) {
        want = base[g] * (0.1 + 0.9 * static_cast<double>(t) / W);
        tol = 8 * kEps * base[g] * static_cast<double>(t + 1);  // LinearLR's recursion
      } else {
        want = poly(base[g], end, t - W, N - W, p);
        tol = tolerance(base[g], end, want, t - W, N - W, p);
      }
      INFO("step " << t << " group " << g << ": got " << got << " want " << want);
      CHECK(std::fabs(got - want) <= tol);
    }
  }
  CHECK(sched.get_last_lr()[0] == end);
}

TEST_CASE("PolynomialLR resumes mid-schedule exactly from state dicts",
          "[optim][scheduler][state]") {
  auto make = [](Optimizer& o) -> std::shared_ptr<LRScheduler> {
    auto warm = std::make_shared<LinearLR>(o, 0.1, 1.0, 4);
    auto decay = std::make_shared<PolynomialLR>(o, 16, 2.0, 1e-4);
    return std::make_shared<SequentialLR>(o, std::vector<std::shared_ptr<LRScheduler>>{warm, decay},
                                          std::vector<int64_t>{4});
  };
  for (const int64_t cut : {2, 4, 9, 19, 22}) {
    INFO("cut at " << cut);
    for (const bool sequential : {false, true}) {
      auto build = [&](Optimizer& o) -> std::shared_ptr<LRScheduler> {
        if (sequential) return make(o);
        return std::make_shared<PolynomialLR>(o, 16, 2.0, 1e-4);
      };
      auto full_opt = sgd2();
      auto full = build(*full_opt);
      for (int k = 0; k < 24; ++k) full->step();

      auto opt1 = sgd2();
      auto s1 = build(*opt1);
      for (int64_t k = 0; k < cut; ++k) s1->step();
      const StateDict osd = opt1->state_dict(), ssd = s1->state_dict();

      auto opt2 = sgd2();
      auto s2 = build(*opt2);
      s2->step();  // a different position, overwritten by the load
      opt2->load_state_dict(osd);
      s2->load_state_dict(ssd);
      CHECK(s2->last_epoch() == cut);
      CHECK(s2->get_last_lr() == s1->get_last_lr());
      for (int64_t k = cut; k < 24; ++k) s2->step();
      CHECK(s2->get_last_lr() == full->get_last_lr());
      CHECK(*opt2->param_groups()[1].lr == *full_opt->param_groups()[1].lr);
    }
  }
}

TEST_CASE("PolynomialLR state dict holds its hyper-parameters and restores them",
          "[optim][scheduler][state]") {
  auto opt = sgd2();
  PolynomialLR a(*opt, 12, 2.0, 1e-3);
  a.step();
  const StateDict sd = a.state_dict();
  CHECK(sd.scalar("total_iters") == 12.0);
  CHECK(sd.scalar("power") == 2.0);
  CHECK(sd.scalar("end_lr") == 1e-3);
  auto opt2 = sgd2();
  PolynomialLR b(*opt2, 3, 1.0, 0.0);  // other hyper-parameters, replaced by the load
  opt2->load_state_dict(opt->state_dict());
  b.load_state_dict(sd);
  for (int k = 0; k < 14; ++k) {
    a.step();
    b.step();
    CHECK(a.get_last_lr() == b.get_last_lr());
  }
  CHECK(b.get_last_lr()[0] == 1e-3);
}

TEST_CASE("PolynomialLR rejects invalid arguments and foreign states",
          "[optim][scheduler][errors]") {
  auto opt = sgd2();
  REQUIRE_THROWS_WITH(PolynomialLR(*opt, 0), Contains("total_iters must be > 0"));
  REQUIRE_THROWS_WITH(PolynomialLR(*opt, 5, -1.0), Contains("power must be"));
  REQUIRE_THROWS_WITH(PolynomialLR(*opt, 5, std::nan("")), Contains("power must be"));
  REQUIRE_THROWS_WITH(PolynomialLR(*opt, 5, 1.0, -1e-4), Contains("end_lr must be"));
  REQUIRE_THROWS_WITH(PolynomialLR(*opt, 5, 1.0, INFINITY), Contains("end_lr must be"));
  auto opt2 = sgd2();
  StepLR step(*opt2, 3);
  auto opt3 = sgd2();
  PolynomialLR poly_lr(*opt3, 10);
  REQUIRE_THROWS_WITH(poly_lr.load_state_dict(step.state_dict()), Contains("saved by a StepLR"));
  StateDict bad = poly_lr.state_dict();
  bad.insert_scalar("power", -2.0);
  REQUIRE_THROWS_WITH(poly_lr.load_state_dict(bad), Contains("power must be"));
  CHECK(poly_lr.state_dict().scalar("power") == 1.0);  // unchanged
}

TEST_CASE("PolynomialLR stretches the rest of its decay for another global batch",
          "[optim][scheduler]") {
  auto opt = sgd2();
  PolynomialLR sched(*opt, 20, 2.0, 1e-4);
  for (int k = 0; k < 10; ++k) sched.step();
  const auto msg = sched.rescale_remaining(2.0);
  REQUIRE(msg.has_value());
  CHECK_THAT(*msg, Contains("remaining 10 steps -> 20"));
  CHECK(sched.state_dict().scalar("total_iters") == 40.0);
  CHECK(sched.last_epoch() == 20);
  for (int k = 0; k < 20; ++k) sched.step();
  CHECK(sched.get_last_lr()[0] == 1e-4);
}
