// ModelEMA against the formula written in the test, in f64 over 20 steps: warm-up, blending
// every k-th call, buffers blended or copied, integer buffers copied; evaluation with the EMA
// weights (EMAScope restores the model bit for bit, copy_to); exact resume from its state
// dict; the errors.
//
// Tolerance: each blend computes shadow * d, then + (1 - d) * w: three roundings (<= eps/2
// each, relative to the magnitudes involved) per blend, and the errors of earlier blends are
// multiplied by d < 1. After at most 20 blends the shadow is within 2 * 20 * eps of the
// formula, relative to the largest |value| seen; the check allows that.
#include <cmath>
#include <limits>
#include <memory>
#include <set>

#include "dltrain/autograd/node.hpp"
#include "dltrain/nn/containers.hpp"
#include "dltrain/nn/layers.hpp"
#include "dltrain/optim/ema.hpp"
#include "optim_test_util.hpp"

using namespace dltrain;
using namespace dltrain::optim;
using Catch::Contains;

namespace {

constexpr int kSteps = 20;
constexpr double kEps = std::numeric_limits<double>::epsilon();

// "Training": every floating entry of the state moves to a new deterministic value, and
// num_batches_tracked counts.
void train_step(nn::Module& model, int step) {
  autograd::NoGradGuard no_grad;
  int e = 0;
  for (auto& [name, t] : model.state_dict()) {
    Tensor v = t;
    if (is_floating(t.dtype())) {
      auto x = v.to_vector<double>();
      for (size_t k = 0; k < x.size(); ++k)
        x[k] = std::sin(0.7 * step + 0.3 * static_cast<double>(k) + e) * (1.0 + 0.1 * e);
      v.copy_(from_vector(x).reshape(t.shape()));
    } else {
      v.fill_(static_cast<double>(step + 1));
    }
    ++e;
  }
}

// Linear + BatchNorm1d in f64 with deterministic values (train_step's of step -1).
std::shared_ptr<nn::Sequential> make_model() {
  auto m = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::BatchNorm1d>(4)});
  m->to(DType::f64);
  train_step(*m, -1);
  return m;
}

// The formula, per state entry, over flattened values.
struct RefEMA {
  std::vector<std::vector<double>> s;
  int64_t calls = 0, blends = 0;
};

RefEMA ref_init(const nn::Module& model) {
  RefEMA r;
  for (const auto& [name, t] : model.state_dict())
    r.s.push_back(t.to(DType::f64).to_vector<double>());
  return r;
}

void ref_update(RefEMA& r, const nn::Module& model, const ModelEMAOptions& o,
                const std::set<std::string>& blended) {
  if (++r.calls % o.update_every != 0) return;
  const double t = static_cast<double>(r.blends);
  const double d = o.warmup ? std::min(o.decay, (1 + t) / (10 + t)) : o.decay;
  size_t e = 0;
  for (const auto& [name, tensor] : model.state_dict()) {
    const auto w = tensor.to(DType::f64).to_vector<double>();
    for (size_t k = 0; k < w.size(); ++k)
      r.s[e][k] = blended.count(name) ? d * r.s[e][k] + (1 - d) * w[k] : w[k];
    ++e;
  }
  ++r.blends;
}

void check_shadow(const ModelEMA& ema, const RefEMA& r, const std::string& what) {
  size_t e = 0;
  for (const auto& [name, t] : ema.shadow()) {
    double scale = 1.1;  // |values| <= 1 + 0.1 * entries
    for (double x : r.s[e]) scale = std::max(scale, std::fabs(x));
    const double tol = 2.0 * kSteps * kEps * scale * 2;
    optim_test::require_close(t, from_vector(r.s[e]).reshape(t.shape()), 0.0, tol,
                              what + " " + name);
    ++e;
  }
}

}  // namespace

TEST_CASE("ModelEMA follows the EMA formula with warm-up and every-k updates", "[optim][ema]") {
  for (const ModelEMAOptions o :
       {ModelEMAOptions{.decay = 0.9}, ModelEMAOptions{.decay = 0.99, .warmup = true},
        ModelEMAOptions{.decay = 0.8, .warmup = true, .update_every = 3},
        ModelEMAOptions{.decay = 0.7, .update_every = 2, .average_buffers = false}}) {
    INFO("decay " << o.decay << " warmup " << o.warmup << " every " << o.update_every
                  << " average_buffers " << o.average_buffers);
    auto model = make_model();
    ModelEMA ema(*model, o);
    RefEMA ref = ref_init(*model);
    std::set<std::string> blended = {"0.weight", "0.bias", "1.weight", "1.bias"};
    if (o.average_buffers) blended.insert({"1.running_mean", "1.running_var"});
    for (int step = 0; step < kSteps; ++step) {
      train_step(*model, step);
      CHECK(ema.next_decay() ==
            (o.warmup ? std::min(o.decay, (1.0 + static_cast<double>(ema.num_updates())) /
                                              (10.0 + static_cast<double>(ema.num_updates())))
                      : o.decay));
      ema.update(*model);
      ref_update(ref, *model, o, blended);
      CHECK(ema.step_count() == step + 1);
      CHECK(ema.num_updates() == (step + 1) / o.update_every);
      check_shadow(ema, ref, "step " + std::to_string(step));
    }
    // num_batches_tracked (i64) is copied at each blend.
    CHECK(ema.shadow().at("1.num_batches_tracked").dtype() == DType::i64);
  }
}

TEST_CASE("EMAScope evaluates with the EMA weights and restores the model bit for bit",
          "[optim][ema]") {
  auto model = make_model();
  ModelEMA ema(*model, {.decay = 0.5});
  for (int step = 0; step < 3; ++step) {
    train_step(*model, step);
    ema.update(*model);
  }
  const StateDict own = [&] {
    StateDict c;
    for (const auto& [n, t] : model->state_dict()) c.insert(n, t.clone());
    return c;
  }();
  Tensor x = from_vector(std::vector<double>{0.1, -0.2, 0.3, 0.4, 0.5, -0.6}).reshape({2, 3});
  model->eval();
  {
    EMAScope scope(ema, *model);
    for (const auto& [n, t] : model->state_dict())
      optim_test::require_equal(t, ema.shadow().at(n), "inside " + n);
  }
  for (const auto& [n, t] : model->state_dict())
    optim_test::require_equal(t, own.at(n), "after " + n);
  auto other = make_model();
  ema.copy_to(*other);
  for (const auto& [n, t] : other->state_dict())
    optim_test::require_equal(t, ema.shadow().at(n), "copy_to " + n);
}

TEST_CASE("ModelEMA keeps f32 shadows of bf16 models", "[optim][ema][lowp]") {
  auto model = make_model();
  model->to(DType::bf16);
  ModelEMA ema(*model, {.decay = 0.999});
  CHECK(ema.shadow().at("0.weight").dtype() == DType::f32);
  const double before = ema.shadow().at("0.bias").to_vector<double>()[0];
  ema.update(*model);
  // A 0.999 blend of a value with itself stays (it would in bf16 too); the shadow moves by
  // less than a bf16 ulp toward a different value, which only f32 can hold.
  CHECK(ema.shadow().at("0.bias").to_vector<double>()[0] == Approx(before).epsilon(1e-6));
}

TEST_CASE("ModelEMA resumes from its state dict exactly", "[optim][ema][state]") {
  const ModelEMAOptions o{.decay = 0.95, .warmup = true, .update_every = 2};
  auto m1 = make_model();
  ModelEMA full(*m1, o);
  for (int step = 0; step < kSteps; ++step) {
    train_step(*m1, step);
    full.update(*m1);
  }
  auto m2 = make_model();
  ModelEMA first(*m2, o);
  for (int step = 0; step < 7; ++step) {
    train_step(*m2, step);
    first.update(*m2);
  }
  const StateDict saved = first.state_dict();
  CHECK(saved.contains("shadow.1.running_var"));
  CHECK(saved.scalar("num_updates") == 3.0);
  ModelEMA second(*m2, {.decay = 0.5});  // options come from the state
  second.load_state_dict(saved);
  CHECK(second.options().update_every == 2);
  for (int step = 7; step < kSteps; ++step) {
    train_step(*m2, step);
    second.update(*m2);
  }
  CHECK(second.num_updates() == full.num_updates());
  for (const auto& [n, t] : full.shadow()) optim_test::require_equal(second.shadow().at(n), t, n);
}

TEST_CASE("ModelEMA errors name the problem", "[optim][ema][errors]") {
  auto model = make_model();
  REQUIRE_THROWS_WITH(ModelEMA(*model, {.decay = 1.5}), Contains("decay must be in [0, 1]"));
  REQUIRE_THROWS_WITH(ModelEMA(*model, {.update_every = 0}), Contains("update_every must be >= 1"));
  ModelEMA ema(*model);
  auto other = std::make_shared<nn::Linear>(3, 4);
  other->to(DType::f64);
  REQUIRE_THROWS_WITH(ema.update(*other), Contains("another model"));
  auto wider = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(3, 5), std::make_shared<nn::BatchNorm1d>(5)});
  REQUIRE_THROWS_WITH(ema.copy_to(*wider), Contains("0.weight") && Contains("[5, 3]"));
  CHECK(ema.step_count() == 0);
  StateDict bad = ema.state_dict();
  bad.insert("shadow.extra", zeros({1}));
  REQUIRE_THROWS_WITH(ema.load_state_dict(bad), Contains("unexpected entry 'shadow.extra'"));
  StateDict bad2 = ema.state_dict();
  bad2.erase("shadow.0.bias");
  REQUIRE_THROWS_WITH(ema.load_state_dict(bad2), Contains("shadow.0.bias"));
  auto p = zeros({2}, DType::f64);
  p.requires_grad_();
  SGD sgd({p}, {.lr = 0.1});
  REQUIRE_THROWS_WITH(ema.load_state_dict(sgd.state_dict()), Contains("saved by a SGD"));
}
