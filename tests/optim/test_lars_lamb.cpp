// LARS and LAMB against references written in the test from the papers' pseudo-code (You et
// al. 2017, Algorithm 1; You et al. 2019, Algorithm 2), in f64 over 20 steps with a
// learning rate that changes every step, on parameters of several shapes: a 3-d tensor, a
// vector, a scalar (0-d), a weight that starts at zero (||w|| = 0: ratio 1) and one whose
// gradient is always zero (||g|| = 0: ratio 1), plus a group excluded from the trust ratio.
// Also: exact resume from state dicts, f32 state of bf16 parameters, a parameter large enough
// for the chunked norms, and the errors.
//
// Tolerance: the reference sums the squares in the same order as the implementation for
// tensors under one chunk (32768 elements), so the norms agree to the bit; each step then
// rounds about 4 operations per element (each <= eps/2), and the compiler may contract a
// multiply-add differently (1 more rounding). After kSteps steps, with updates much smaller
// than the weights, the error is below 8 * kSteps * eps relative to the largest weight of the
// tensor; the check allows that (rtol and atol, atol scaled by max |w|).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "dltrain/autograd/node.hpp"
#include "dltrain/optim/lamb.hpp"
#include "dltrain/optim/lars.hpp"
#include "optim_test_util.hpp"

using namespace dltrain;
using namespace dltrain::optim;
using Catch::Contains;

namespace {

constexpr int kSteps = 20;
constexpr double kEps = std::numeric_limits<double>::epsilon();
constexpr double kTol = 8 * kSteps * kEps;

// The parameters: shapes, and which ones are special.
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {{3, 4, 5}, {7}, {}, {2, 3}, {4}, {6}};
  return s;
}
constexpr size_t kZeroWeight = 3, kZeroGrad = 4, kExcluded = 5;

double init_value(size_t i, int64_t k) {
  if (i == kZeroWeight) return 0.0;
  return 0.5 * std::sin(0.37 * static_cast<double>(k) + 1.1 * static_cast<double>(i)) +
         0.1 * static_cast<double>(i + 1);
}

double grad_value(size_t i, int step, int64_t k) {
  if (i == kZeroGrad) return 0.0;
  return std::cos(0.23 * static_cast<double>(k) + 0.61 * step + 0.3 * static_cast<double>(i)) *
         (1.0 + 0.1 * static_cast<double>(i));
}

// lr of step `step`: a schedule, so LARS's velocity sees a changing lr.
double lr_at(double lr0, int step) { return lr0 * (1.0 - 0.03 * step); }

Tensor from_values(const std::vector<double>& v, const Shape& shape, DType dt) {
  Tensor t = zeros(shape, DType::f64);
  std::copy(v.begin(), v.end(), t.data<double>());
  return t.to(dt);
}

struct RefParam {
  std::vector<double> w, a, b;  // weight; LARS velocity or LAMB (m, v)
  int64_t step = 0;
};

std::vector<RefParam> ref_init() {
  std::vector<RefParam> out;
  for (size_t i = 0; i < shapes().size(); ++i) {
    RefParam r;
    const int64_t n = shape_numel(shapes()[i]);
    for (int64_t k = 0; k < n; ++k) r.w.push_back(init_value(i, k));
    r.a.assign(r.w.size(), 0.0);
    r.b.assign(r.w.size(), 0.0);
    out.push_back(r);
  }
  return out;
}

std::vector<double> ref_grad(size_t i, int step) {
  std::vector<double> g;
  for (int64_t k = 0; k < shape_numel(shapes()[i]); ++k) g.push_back(grad_value(i, step, k));
  return g;
}

std::vector<Tensor> make_params(DType dt) {
  std::vector<Tensor> out;
  const auto init = ref_init();
  for (size_t i = 0; i < shapes().size(); ++i) {
    out.push_back(from_values(init[i].w, shapes()[i], dt));
    out.back().requires_grad_();
  }
  return out;
}

void set_grads(std::vector<Tensor>& p, int step) {
  for (size_t i = 0; i < p.size(); ++i)
    p[i].set_grad(from_values(ref_grad(i, step), shapes()[i], p[i].dtype()));
}

struct GroupHyper {
  double lr0, momentum, wd, eta, eps;
  bool adapt;
};

// You et al. 2017, Algorithm 1 (lars.hpp's variant).
void lars_ref(RefParam& r, const std::vector<double>& g, double lr, const GroupHyper& h) {
  double sw = 0.0, sg = 0.0;
  for (size_t k = 0; k < g.size(); ++k) {
    sw += r.w[k] * r.w[k];
    sg += g[k] * g[k];
  }
  const double wn = std::sqrt(sw), gn = std::sqrt(sg);
  const double ratio = h.adapt && wn > 0 && gn > 0 ? h.eta * wn / (gn + h.wd * wn + h.eps) : 1.0;
  for (size_t k = 0; k < g.size(); ++k) {
    r.a[k] = h.momentum * r.a[k] + lr * ratio * (g[k] + h.wd * r.w[k]);
    r.w[k] -= r.a[k];
  }
}

struct LambHyper {
  double lr0, b1, b2, eps, wd, clip;
  bool adapt;
};

// You et al. 2019, Algorithm 2 (lamb.hpp's variant).
void lamb_ref(RefParam& r, const std::vector<double>& g, double lr, const LambHyper& h) {
  r.step += 1;
  const double t = static_cast<double>(r.step);
  std::vector<double> u(g.size());
  double sw = 0.0, su = 0.0;
  for (size_t k = 0; k < g.size(); ++k) {
    r.a[k] = h.b1 * r.a[k] + (1 - h.b1) * g[k];
    r.b[k] = h.b2 * r.b[k] + (1 - h.b2) * g[k] * g[k];
    const double m_hat = r.a[k] / (1 - std::pow(h.b1, t)), v_hat = r.b[k] / (1 - std::pow(h.b2, t));
    u[k] = m_hat / (std::sqrt(v_hat) + h.eps) + h.wd * r.w[k];
    sw += r.w[k] * r.w[k];
    su += u[k] * u[k];
  }
  const double wn = std::sqrt(sw), un = std::sqrt(su);
  const double ratio = h.adapt && wn > 0 && un > 0 ? std::min(wn / un, h.clip) : 1.0;
  for (size_t k = 0; k < g.size(); ++k) r.w[k] -= lr * ratio * u[k];
}

void check_params(const std::vector<Tensor>& p, const std::vector<RefParam>& ref,
                  const std::string& what, double tol = kTol) {
  for (size_t i = 0; i < p.size(); ++i) {
    double scale = 0.0;
    for (double x : ref[i].w) scale = std::max(scale, std::fabs(x));
    optim_test::require_close(p[i], from_values(ref[i].w, shapes()[i], DType::f64), tol,
                              tol * scale, what + " param " + std::to_string(i));
  }
}

// Groups: every parameter but the last adapts; the last is excluded (wd 0, trust_ratio false).
std::vector<ParamGroup> two_groups(const std::vector<Tensor>& p) {
  return {{.params = std::vector<Tensor>(p.begin(), p.begin() + kExcluded)},
          {.params = {p[kExcluded]}, .weight_decay = 0.0, .trust_ratio = false}};
}

std::unique_ptr<Optimizer> make_lars(const std::vector<Tensor>& p, const GroupHyper& h) {
  return std::make_unique<LARS>(two_groups(p), LARSOptions{.lr = h.lr0,
                                                           .momentum = h.momentum,
                                                           .weight_decay = h.wd,
                                                           .trust_coefficient = h.eta,
                                                           .eps = h.eps});
}

std::unique_ptr<Optimizer> make_lamb(const std::vector<Tensor>& p, const LambHyper& h) {
  return std::make_unique<LAMB>(two_groups(p), LAMBOptions{.lr = h.lr0,
                                                           .betas = {h.b1, h.b2},
                                                           .eps = h.eps,
                                                           .weight_decay = h.wd,
                                                           .max_trust_ratio = h.clip});
}

void set_lr(Optimizer& opt, double lr0, int step) {
  for (auto& g : opt.param_groups()) g.lr = lr_at(lr0, step);
}

}  // namespace

TEST_CASE("LARS matches the paper's algorithm in f64 over 20 steps", "[optim][lars]") {
  for (const GroupHyper h :
       {GroupHyper{2.0, 0.9, 5e-4, 0.02, 0.0, true}, GroupHyper{1.5, 0.0, 1e-3, 0.05, 1e-9, true},
        GroupHyper{3.0, 0.8, 0.0, 0.01, 0.0, true}}) {
    INFO("lr " << h.lr0 << " momentum " << h.momentum << " wd " << h.wd << " eta " << h.eta);
    auto p = make_params(DType::f64);
    auto opt = make_lars(p, h);
    auto ref = ref_init();
    GroupHyper excluded = h;
    excluded.wd = 0.0;
    excluded.adapt = false;
    for (int step = 0; step < kSteps; ++step) {
      set_grads(p, step);
      set_lr(*opt, h.lr0, step);
      opt->step();
      for (size_t i = 0; i < ref.size(); ++i)
        lars_ref(ref[i], ref_grad(i, step), lr_at(h.lr0, step), i == kExcluded ? excluded : h);
      check_params(p, ref, "LARS step " + std::to_string(step));
    }
    // ||g|| = 0 with wd = 0: ratio 1 and no change at all.
    if (h.wd == 0.0) CHECK(p[kZeroGrad].to_vector<double>() == ref_init()[kZeroGrad].w);
  }
}

TEST_CASE("a LARS group excluded from the trust ratio is momentum SGD", "[optim][lars]") {
  // v = m v + lr g; w -= v equals PyTorch's buf = m buf + g; w -= lr buf at a constant lr.
  auto p = make_params(DType::f64);
  auto q = make_params(DType::f64);
  LARS lars(p, {.lr = 0.05, .momentum = 0.9, .trust_ratio = false});
  SGD sgd(q, {.lr = 0.05, .momentum = 0.9});
  for (int step = 0; step < kSteps; ++step) {
    set_grads(p, step);
    set_grads(q, step);
    lars.step();
    sgd.step();
  }
  for (size_t i = 0; i < p.size(); ++i) {
    double scale = 0.0;
    for (double x : q[i].to_vector<double>()) scale = std::max(scale, std::fabs(x));
    optim_test::require_close(p[i], q[i], kTol, kTol * scale, "param " + std::to_string(i));
  }
}

TEST_CASE("LAMB matches the paper's algorithm in f64 over 20 steps", "[optim][lamb]") {
  const double inf = std::numeric_limits<double>::infinity();
  for (const LambHyper h : {LambHyper{0.01, 0.9, 0.999, 1e-6, 0.01, inf, true},
                            LambHyper{0.02, 0.8, 0.99, 1e-8, 0.0, inf, true},
                            LambHyper{0.05, 0.9, 0.999, 1e-6, 0.1, 0.3, true}}) {
    INFO("lr " << h.lr0 << " wd " << h.wd << " clip " << h.clip);
    auto p = make_params(DType::f64);
    auto opt = make_lamb(p, h);
    auto ref = ref_init();
    LambHyper excluded = h;
    excluded.wd = 0.0;
    excluded.adapt = false;
    for (int step = 0; step < kSteps; ++step) {
      set_grads(p, step);
      set_lr(*opt, h.lr0, step);
      opt->step();
      for (size_t i = 0; i < ref.size(); ++i)
        lamb_ref(ref[i], ref_grad(i, step), lr_at(h.lr0, step), i == kExcluded ? excluded : h);
      check_params(p, ref, "LAMB step " + std::to_string(step));
    }
    if (h.wd == 0.0) CHECK(p[kZeroGrad].to_vector<double>() == ref_init()[kZeroGrad].w);
  }
}

TEST_CASE("LARS and LAMB resume mid-run from state dicts bit for bit", "[optim][state]") {
  using Make = std::function<std::unique_ptr<Optimizer>(const std::vector<Tensor>&)>;
  const std::vector<std::pair<std::string, Make>> makers = {
      {"LARS",
       [](const auto& p) {
         return make_lars(p, {2.0, 0.9, 5e-4, 0.02, 0.0, true});
       }},
      {"LAMB",
       [](const auto& p) {
         return make_lamb(p, {0.05, 0.9, 0.999, 1e-6, 0.1, 0.3, true});
       }},
  };
  for (const auto& [name, make] : makers) {
    SECTION(name) {
      auto p = make_params(DType::f64);
      auto full = make(p);
      for (int step = 0; step < kSteps; ++step) {
        set_grads(p, step);
        full->step();
      }
      auto q = make_params(DType::f64);
      auto first = make(q);
      for (int step = 0; step < 7; ++step) {
        set_grads(q, step);
        first->step();
      }
      const StateDict saved = first->state_dict();
      CHECK(saved.contains(name == "LARS" ? "state.0.momentum_buffer" : "state.0.exp_avg_sq"));
      CHECK(saved.scalar("param_groups.1.trust_ratio") == 0.0);
      std::vector<Tensor> r;
      for (const auto& t : q) {
        Tensor c = t.detach().clone();
        c.requires_grad_();
        r.push_back(c);
      }
      auto second = make(r);
      second->param_groups()[0].lr = 123.0;  // restored by the load
      second->load_state_dict(saved);
      for (int step = 7; step < kSteps; ++step) {
        set_grads(r, step);
        second->step();
      }
      for (size_t i = 0; i < p.size(); ++i) optim_test::require_equal(r[i], p[i], name);
    }
  }
}

TEST_CASE("LARS and LAMB keep f32 state for bf16 parameters", "[optim][lowp]") {
  auto p = make_params(DType::bf16);
  auto q = make_params(DType::bf16);
  LARS lars(p, {.lr = 1.0, .trust_coefficient = 0.02});
  LAMB lamb(q, {.lr = 0.01});
  set_grads(p, 0);
  set_grads(q, 0);
  lars.step();
  lamb.step();
  CHECK(lars.state_dict().at("state.0.momentum_buffer").dtype() == DType::f32);
  CHECK(lamb.state_dict().at("state.0.exp_avg").dtype() == DType::f32);
  CHECK(p[0].dtype() == DType::bf16);
  // One step from the f64 reference: the bf16 initial value and the bf16 result are each
  // rounded (<= 2^-8 relative each); the f32 arithmetic and the small update add far less.
  auto ref = ref_init();
  lars_ref(ref[0], ref_grad(0, 0), 1.0, {1.0, 0.9, 0.0, 0.02, 0.0, true});
  optim_test::require_close(p[0], from_values(ref[0].w, shapes()[0], DType::f64), 2.0 / 256, 1e-6,
                            "bf16 LARS");
}

TEST_CASE("LARS and LAMB norms over many chunks match the sequential sum", "[optim][lars][lamb]") {
  // 100003 elements: 4 chunks summed in parallel; against the reference's one sequential
  // sum, the norms differ by at most n * eps relative (the summation bound).
  const int64_t n = 100003;
  std::vector<double> w(n), g(n);
  for (int64_t k = 0; k < n; ++k) {
    w[k] = std::sin(0.001 * static_cast<double>(k)) + 0.2;
    g[k] = std::cos(0.0007 * static_cast<double>(k));
  }
  const double tol = 4.0 * static_cast<double>(n) * kEps;
  {
    Tensor p = from_values(w, {n}, DType::f64);
    p.requires_grad_();
    LARS opt({p}, {.lr = 1.0, .momentum = 0.0, .weight_decay = 1e-4, .trust_coefficient = 0.01});
    p.set_grad(from_values(g, {n}, DType::f64));
    opt.step();
    RefParam r{w, std::vector<double>(n, 0.0), {}, 0};
    lars_ref(r, g, 1.0, {1.0, 0.0, 1e-4, 0.01, 0.0, true});
    optim_test::require_close(p, from_values(r.w, {n}, DType::f64), tol, tol, "LARS");
  }
  {
    Tensor p = from_values(w, {n}, DType::f64);
    p.requires_grad_();
    LAMB opt({p}, {.lr = 0.1, .weight_decay = 0.01});
    p.set_grad(from_values(g, {n}, DType::f64));
    opt.step();
    RefParam r{w, std::vector<double>(n, 0.0), std::vector<double>(n, 0.0), 0};
    lamb_ref(r, g, 0.1,
             {0.1, 0.9, 0.999, 1e-6, 0.01, std::numeric_limits<double>::infinity(), true});
    optim_test::require_close(p, from_values(r.w, {n}, DType::f64), tol, tol, "LAMB");
  }
}

TEST_CASE("LARS and LAMB reject bad hyper-parameters naming them", "[optim][errors]") {
  auto p = make_params(DType::f64);
  REQUIRE_THROWS_WITH(LARS(p, LARSOptions{}), Contains("no default lr"));
  REQUIRE_THROWS_WITH(LARS(p, {.lr = -1.0}), Contains("invalid learning rate"));
  REQUIRE_THROWS_WITH(LARS(p, {.lr = 1.0, .momentum = 1.0}), Contains("invalid momentum"));
  REQUIRE_THROWS_WITH(LARS(p, {.lr = 1.0, .weight_decay = -1e-4}),
                      Contains("invalid weight_decay"));
  REQUIRE_THROWS_WITH(LARS(p, {.lr = 1.0, .trust_coefficient = 0.0}),
                      Contains("invalid trust_coefficient"));
  REQUIRE_THROWS_WITH(LARS(p, {.lr = 1.0, .eps = -1.0}), Contains("invalid eps"));
  REQUIRE_THROWS_WITH(LAMB(p, {.lr = std::nan("")}), Contains("invalid learning rate"));
  REQUIRE_THROWS_WITH(LAMB(p, {.betas = {1.0, 0.999}}), Contains("invalid beta1"));
  REQUIRE_THROWS_WITH(LAMB(p, {.betas = {0.9, -0.1}}), Contains("invalid beta2"));
  REQUIRE_THROWS_WITH(LAMB(p, {.eps = -1e-6}), Contains("invalid eps"));
  REQUIRE_THROWS_WITH(LAMB(p, {.weight_decay = INFINITY}), Contains("invalid weight_decay"));
  REQUIRE_THROWS_WITH(LAMB(p, {.max_trust_ratio = 0.0}), Contains("invalid max_trust_ratio"));
  // Per-group values are checked too, and fields the optimizer does not use are refused.
  REQUIRE_THROWS_WITH(
      LARS(std::vector<ParamGroup>{{.params = {p[0]}, .trust_coefficient = -1.0}}, {.lr = 1.0}),
      Contains("trust_coefficient") && Contains("param group 0"));
  REQUIRE_THROWS_WITH(
      LARS(std::vector<ParamGroup>{{.params = {p[0]}, .betas = std::array<double, 2>{0.9, 0.9}}},
           {.lr = 1.0}),
      Contains("sets 'betas', which LARS does not use"));
  REQUIRE_THROWS_WITH(
      SGD(std::vector<ParamGroup>{{.params = {p[0]}, .trust_ratio = false}}, {.lr = 1.0}),
      Contains("sets 'trust_ratio', which SGD does not use"));
  REQUIRE_THROWS_WITH(LAMB(std::vector<ParamGroup>{{.params = {p[0]}, .momentum = 0.9}}, {}),
                      Contains("sets 'momentum', which LAMB does not use"));
  // A state saved by another optimizer does not load.
  LARS lars(p, {.lr = 1.0});
  auto q = make_params(DType::f64);
  LAMB lamb(q, {});
  REQUIRE_THROWS_WITH(lamb.load_state_dict(lars.state_dict()),
                      Contains("saved by a LARS optimizer"));
}

TEST_CASE("LARS and LAMB with a polynomial decay fit a linear regression from autograd gradients",
          "[optim][lars][lamb][autograd]") {
  // Both take steps of about lr * eta * ||w|| (LARS) or lr * ||w|| (LAMB) whatever the
  // gradient's size, so they only settle when the lr decays: PolynomialLR to 0 does it.
  Generator gen(3);
  Tensor x = randn({64, 5}, DType::f64, &gen);
  Tensor true_w = randn({5, 1}, DType::f64, &gen);
  Tensor y = matmul(x, true_w);
  for (const bool lamb : {false, true}) {
    INFO((lamb ? "LAMB" : "LARS"));
    Tensor w = zeros({5, 1}, DType::f64);
    w.requires_grad_();
    std::unique_ptr<Optimizer> opt;
    if (lamb) {
      opt = std::make_unique<LAMB>(std::vector<Tensor>{w}, LAMBOptions{.lr = 0.05});
    } else {
      opt = std::make_unique<LARS>(std::vector<Tensor>{w},
                                   LARSOptions{.lr = 5.0, .trust_coefficient = 0.01});
    }
    PolynomialLR sched(*opt, 400, 2.0);
    double first = 0.0, last = 0.0;
    for (int it = 0; it < 400; ++it) {
      opt->zero_grad();
      Tensor loss = mse_loss(matmul(x, w), y);
      loss.backward();
      opt->step();
      sched.step();
      (it == 0 ? first : last) = loss.item<double>();
    }
    CHECK(last < 1e-4 * first);
    optim_test::require_close(w, true_w, 1e-2, 1e-2, "recovered weights");
  }
}
