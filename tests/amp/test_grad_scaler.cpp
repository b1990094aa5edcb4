// amp::GradScaler on the CPU: scripted runs with inf/NaN injected at chosen steps against
// PyTorch's GradScaler (tests/reference/make_amp_reference.py) and against the documented
// algorithm written out here; unscale_ + clip_grad_norm_ order; gradient accumulation; the
// stage errors (unscale_ twice, after step, step twice, update without unscale); f16 gradients
// refused; the disabled pass-through; state_dict and checkpoint round trips.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>

#include "dltrain/amp/grad_scaler.hpp"
#include "dltrain/dltrain.hpp"
#include "reference_file.hpp"

using namespace dltrain;
using Catch::Contains;

namespace {

const std::map<std::string, Tensor>& ref() {
  static const auto r =
      testing::read_reference(std::string(DLTRAIN_REFERENCE_DIR) + "/amp_reference.txt");
  return r;
}

const Tensor& at(const std::string& key) {
  auto it = ref().find(key);
  REQUIRE(it != ref().end());
  return it->second;
}

// The finite values of `v` with the injected non-finite ones put back (mask: 1 +inf, 2 -inf,
// 3 NaN), as f32.
Tensor with_injections(const Tensor& v, const Tensor& mask) {
  std::vector<double> x = v.to_vector<double>();
  const std::vector<double> m = mask.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (m[i] == 1) x[i] = std::numeric_limits<double>::infinity();
    if (m[i] == 2) x[i] = -std::numeric_limits<double>::infinity();
    if (m[i] == 3) x[i] = std::numeric_limits<double>::quiet_NaN();
  }
  return from_vector(x, v.shape()).to(DType::f32);
}

struct Scenario {
  amp::GradScalerOptions options;
  int steps;
  std::string opts;  // "sgd", "sgd_plain", "two"
  int micro;
  double clip;  // 0: none
};

// The settings of make_amp_reference.py's SCENARIOS.
const std::map<std::string, Scenario>& scenarios() {
  static const std::map<std::string, Scenario> s = {
      {"single", {{.init_scale = 1024.0, .growth_interval = 3}, 12, "sgd", 1, 0.0}},
      {"clip", {{.growth_interval = 2}, 8, "sgd_plain", 1, 0.5}},
      {"two_opt", {{.init_scale = 256.0, .growth_interval = 2}, 8, "two", 1, 0.0}},
      {"accum",
       {{.init_scale = std::ldexp(1.0, 120),
         .growth_factor = 4.0,
         .backoff_factor = 0.25,
         .growth_interval = 1},
        7,
        "sgd",
        2,
        0.0}},
  };
  return s;
}

// One scaler step of the linear loss sum(w * G) + sum(b * H), whose gradients are G and H.
Tensor linear_loss(const Tensor& w, const Tensor& b, const Tensor& G, const Tensor& H) {
  return add(sum(mul(w, G)), sum(mul(b, H)));
}

// The documented algorithm (PyTorch's _amp_update_scale_), independently of GradScaler.
struct ModelScale {
  double scale;
  int64_t tracker = 0;
  void update(bool found_inf, double growth, double backoff, int64_t interval) {
    if (found_inf) {
      scale = static_cast<float>(scale * backoff);
      tracker = 0;
      return;
    }
    if (++tracker == interval) {
      const float grown = static_cast<float>(scale * growth);
      if (std::isfinite(grown)) scale = grown;
      tracker = 0;
    }
  }
};

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("dltrain_amp_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

}  // namespace

TEST_CASE("GradScaler reproduces PyTorch's GradScaler on scripted runs with inf/NaN injected",
          "[amp][grad_scaler][reference]") {
  for (const auto& [name, sc] : scenarios()) {
    INFO("scenario " << name);
    Tensor w = at(name + ".init.w").to(DType::f32).requires_grad_();
    Tensor b = at(name + ".init.b").to(DType::f32).requires_grad_();
    std::vector<std::unique_ptr<optim::Optimizer>> opts;
    if (sc.opts == "sgd") {
      opts.push_back(std::make_unique<optim::SGD>(std::vector<Tensor>{w, b},
                                                  optim::SGDOptions{.lr = 0.1, .momentum = 0.9}));
    } else if (sc.opts == "sgd_plain") {
      opts.push_back(
          std::make_unique<optim::SGD>(std::vector<Tensor>{w, b}, optim::SGDOptions{.lr = 0.05}));
    } else {
      opts.push_back(
          std::make_unique<optim::SGD>(std::vector<Tensor>{w}, optim::SGDOptions{.lr = 0.1}));
      opts.push_back(
          std::make_unique<optim::Adam>(std::vector<Tensor>{b}, optim::AdamOptions{.lr = 0.01}));
    }
    amp::GradScaler scaler(sc.options);
    ModelScale model{sc.options.init_scale};
    const std::vector<double> ref_scale = at(name + ".scale").to_vector<double>();
    const std::vector<double> ref_tracker = at(name + ".tracker").to_vector<double>();
    const Tensor ref_stepped = at(name + ".stepped");
    int skipped = 0;
    for (int k = 0; k < sc.steps; ++k) {
      INFO("step " << k);
      const std::string ks = std::to_string(k);
      const Tensor G = with_injections(at(name + ".G." + ks), at(name + ".inject." + ks + ".G"));
      const Tensor H = with_injections(at(name + ".H." + ks), at(name + ".inject." + ks + ".H"));
      bool injected = false;
      for (const Tensor& t : {G, H})
        for (double v : t.to_vector<double>()) injected = injected || !std::isfinite(v);
      for (int m = 0; m < sc.micro; ++m) {
        Tensor loss = linear_loss(w, b, G.select(0, m).view({3, 4}), H.select(0, m));
        if (sc.micro > 1) loss = div(loss, static_cast<double>(sc.micro));
        scaler.scale(loss).backward();
      }
      if (sc.clip > 0) {
        scaler.unscale_(*opts[0]);
        const double norm = optim::clip_grad_norm_({w, b}, sc.clip).item<double>();
        const double want = at(name + ".norm").to_vector<double>()[k];
        if (want < 0)
          CHECK_FALSE(std::isfinite(norm));
        else
          CHECK(norm == Approx(want).epsilon(1e-6));
      }
      for (size_t o = 0; o < opts.size(); ++o) {
        const bool stepped = scaler.step(*opts[o]);
        CHECK(stepped == (ref_stepped.to_vector<double>()[k * opts.size() + o] == 1.0));
      }
      scaler.update();
      model.update(injected, sc.options.growth_factor, sc.options.backoff_factor,
                   sc.options.growth_interval);
      skipped += injected;
      // The trajectory: exactly PyTorch's, and exactly the algorithm's.
      CHECK(scaler.get_scale() == ref_scale[k]);
      CHECK(scaler.get_growth_tracker() == static_cast<int64_t>(ref_tracker[k]));
      CHECK(scaler.get_scale() == model.scale);
      CHECK(scaler.get_growth_tracker() == model.tracker);
      for (auto& o : opts) o->zero_grad();
      CHECK(allclose(w.detach(), at(name + ".w." + ks).to(DType::f32), 1e-6, 1e-7));
      CHECK(allclose(b.detach(), at(name + ".b." + ks).to(DType::f32), 1e-6, 1e-7));
    }
    CHECK(skipped > 0);
    const std::vector<double> st = at(name + ".state").to_vector<double>();
    const StateDict sd = scaler.state_dict();
    CHECK(sd.scalar("scale") == st[0]);
    CHECK(sd.scalar("growth_factor") == st[1]);
    CHECK(sd.scalar("backoff_factor") == st[2]);
    CHECK(sd.scalar("growth_interval") == st[3]);
    CHECK(sd.scalar("_growth_tracker") == st[4]);
  }
}

TEST_CASE("the default settings follow the documented algorithm over a growth interval",
          "[amp][grad_scaler]") {
  // 65536 start, overflow at step 3 (backoff to 32768), then 2000 finite steps grow it back.
  Tensor p = ones({2}).requires_grad_();
  optim::SGD opt({p}, {.lr = 1e-3});
  amp::GradScaler scaler;
  ModelScale model{65536.0};
  CHECK(scaler.get_scale() == 65536.0);  // before the first scale(): init_scale
  for (int k = 0; k < 2010; ++k) {
    const bool inf = k == 3 || k == 2007;
    Tensor g = from_vector(std::vector<float>{inf ? INFINITY : 0.5f, 0.25f});
    scaler.scale(sum(mul(p, g))).backward();
    CHECK(scaler.step(opt) == !inf);
    scaler.update();
    opt.zero_grad();
    model.update(inf, 2.0, 0.5, 2000);
    REQUIRE(scaler.get_scale() == model.scale);
    REQUIRE(scaler.get_growth_tracker() == model.tracker);
    if (k == 3) CHECK(scaler.get_scale() == 32768.0);
    if (k == 2003) CHECK(scaler.get_scale() == 65536.0);
  }
  CHECK(scaler.get_scale() == 32768.0);
}

TEST_CASE(
    "unscale_ before clip_grad_norm_ clips the true gradients and step does not unscale "
    "again",
    "[amp][grad_scaler]") {
  const std::vector<float> g0 = {3.0f, -4.0f, 12.0f}, true_grad = g0;  // norm 13
  Tensor p = from_vector(std::vector<float>{1.0f, 2.0f, 3.0f}).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.5});
  amp::GradScaler scaler({.init_scale = 4096.0});
  scaler.scale(sum(mul(p, from_vector(g0)))).backward();
  CHECK(p.grad().to_vector<float>() == std::vector<float>{3.0f * 4096, -4.0f * 4096, 12.0f * 4096});
  scaler.unscale_(opt);
  CHECK(p.grad().to_vector<float>() == true_grad);
  const double norm = optim::clip_grad_norm_({p}, 1.0).item<double>();
  CHECK(norm == Approx(13.0));
  const std::vector<float> clipped = p.grad().to_vector<float>();
  CHECK(clipped[0] == Approx(3.0 / 13.0).epsilon(1e-5));
  REQUIRE(scaler.step(opt));
  const std::vector<float> after = p.detach().to_vector<float>();
  const std::vector<float> before = {1.0f, 2.0f, 3.0f};
  for (size_t i = 0; i < 3; ++i) CHECK(after[i] == before[i] - 0.5f * clipped[i]);
  scaler.update();
  CHECK(scaler.get_scale() == 4096.0);
  CHECK(scaler.get_growth_tracker() == 1);
}

TEST_CASE("gradient accumulation: scaled micro-batches add up and unscale once",
          "[amp][grad_scaler]") {
  Tensor p = zeros({3}).requires_grad_();
  optim::SGD opt({p}, {.lr = 1.0});
  amp::GradScaler scaler({.init_scale = 1024.0});
  const std::vector<std::vector<float>> g = {{1, 2, 3}, {0.5f, -1, 0}, {0.25f, 0.25f, 0.25f}};
  for (const auto& gi : g) scaler.scale(sum(mul(p, from_vector(gi)))).backward();
  scaler.unscale_(opt);
  CHECK(p.grad().to_vector<float>() == std::vector<float>{1.75f, 1.25f, 3.25f});
  CHECK(scaler.step(opt));
  scaler.update();
  CHECK(p.detach().to_vector<float>() == std::vector<float>{-1.75f, -1.25f, -3.25f});
}

TEST_CASE("GradScaler enforces PyTorch's stage order", "[amp][grad_scaler][errors]") {
  Tensor p = ones({2}).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.1});
  amp::GradScaler scaler;
  REQUIRE_THROWS_WITH(scaler.unscale_(opt), Contains("no loss has been scaled yet"));
  REQUIRE_THROWS_WITH(scaler.step(opt), Contains("scaler.scale(loss)"));
  REQUIRE_THROWS_WITH(scaler.update(), Contains("no loss has been scaled yet"));
  scaler.scale(sum(p)).backward();
  REQUIRE_THROWS_WITH(scaler.update(), Contains("no inf checks were recorded prior to update"));
  scaler.unscale_(opt);
  REQUIRE_THROWS_WITH(scaler.unscale_(opt), Contains("already been called on this optimizer"));
  CHECK(scaler.step(opt));
  REQUIRE_THROWS_WITH(scaler.unscale_(opt), Contains("after step()"));
  REQUIRE_THROWS_WITH(scaler.step(opt), Contains("step() has already been called"));
  scaler.update();
  // The next iteration starts fresh; an optimizer whose parameters have no gradient cannot step.
  opt.zero_grad();
  scaler.scale(sum(p));  // no backward
  REQUIRE_THROWS_WITH(scaler.step(opt), Contains("no inf checks were recorded for this optimizer"));
  // update(new_scale) needs no inf check and keeps the tracker.
  scaler.update(8.0);
  CHECK(scaler.get_scale() == 8.0);
  REQUIRE_THROWS_WITH(scaler.update(-1.0), Contains("new_scale must be finite and > 0"));
  // Settings are checked.
  REQUIRE_THROWS_WITH(amp::GradScaler({.growth_factor = 1.0}), Contains("growth_factor"));
  REQUIRE_THROWS_WITH(amp::GradScaler({.backoff_factor = 1.5}), Contains("backoff_factor"));
  REQUIRE_THROWS_WITH(amp::GradScaler({.growth_interval = 0}), Contains("growth_interval"));
  REQUIRE_THROWS_WITH(amp::GradScaler({.init_scale = 0.0}), Contains("init_scale"));
}

TEST_CASE("GradScaler refuses f16 gradients and unscales bf16 and f64 ones",
          "[amp][grad_scaler][errors]") {
  Tensor h = ones({4}, DType::f16).requires_grad_();
  optim::SGD opt_h({h}, {.lr = 0.1});
  amp::GradScaler scaler;
  scaler.scale(sum(h)).backward();
  REQUIRE_THROWS_WITH(scaler.unscale_(opt_h), Contains("float16 gradient"));
  Tensor bf = ones({4}, DType::bf16).requires_grad_();
  Tensor d = ones({4}, DType::f64).requires_grad_();
  optim::SGD opt({bf, d}, {.lr = 0.5});
  amp::GradScaler s2({.init_scale = 64.0});
  s2.scale(add(sum(mul(bf, 2.0)), sum(mul(d, 3.0)))).backward();
  s2.unscale_(opt);
  CHECK(bf.grad().to_vector<float>() == std::vector<float>(4, 2.0f));
  CHECK(d.grad().to_vector<double>() == std::vector<double>(4, 3.0));
  CHECK(s2.step(opt));
}

TEST_CASE("unscale_ handles non-dense gradients and many tensors in one pass",
          "[amp][grad_scaler]") {
  // 40 parameters (several chunks each for the large ones) and one strided gradient.
  std::vector<Tensor> ps;
  for (int i = 0; i < 40; ++i) ps.push_back(zeros({i % 3 == 0 ? 70000 : 17}).requires_grad_());
  Tensor strided = zeros({4, 6}).requires_grad_();
  ps.push_back(strided);
  optim::SGD opt(ps, {.lr = 1.0});
  amp::GradScaler scaler({.init_scale = 512.0});
  scaler.scale(zeros({}));  // creates the scale
  for (size_t i = 0; i < ps.size(); ++i) {
    Tensor g = full(ps[i].shape(), 512.0 * static_cast<double>(i + 1));
    if (ps[i].impl() == strided.impl()) g = full({6, 4}, 512.0 * (i + 1)).t();  // strides (1, 4)
    ps[i].set_grad(g);
  }
  REQUIRE_FALSE(strided.grad().is_contiguous());
  scaler.unscale_(opt);
  for (size_t i = 0; i < ps.size(); ++i) {
    INFO("parameter " << i);
    CHECK(allclose(ps[i].grad(), full(ps[i].shape(), static_cast<double>(i + 1)), 0, 0));
  }
  CHECK(scaler.step(opt));
  scaler.update();
  // A NaN in the strided one, alone, is found.
  scaler.scale(zeros({}));
  Tensor g = full({6, 4}, 1.0).t();
  g.select(0, 2).select(0, 3).fill_(NAN);
  strided.set_grad(g);
  CHECK_FALSE(scaler.step(opt));
  scaler.update();
  CHECK(scaler.get_scale() == 256.0);
}

TEST_CASE("a disabled GradScaler passes everything through", "[amp][grad_scaler]") {
  Tensor p = from_vector(std::vector<float>{1, 2}).requires_grad_();
  Tensor q = p.detach().clone().requires_grad_();
  optim::SGD opt({p}, {.lr = 0.1}), opt_q({q}, {.lr = 0.1});
  amp::GradScaler scaler({.enabled = false});
  CHECK_FALSE(scaler.is_enabled());
  for (int k = 0; k < 3; ++k) {
    const Tensor loss = sum(mul(p, p));
    const Tensor scaled = scaler.scale(loss);
    CHECK(scaled.impl() == loss.impl());
    scaled.backward();
    scaler.unscale_(opt);
    scaler.unscale_(opt);  // no stages when disabled
    CHECK(scaler.step(opt));
    scaler.update();
    opt.zero_grad();
    sum(mul(q, q)).backward();
    opt_q.step();
    opt_q.zero_grad();
  }
  CHECK(allclose(p.detach(), q.detach(), 0, 0));
  CHECK(scaler.get_scale() == 1.0);
  CHECK(scaler.state_dict().empty());
  scaler.load_state_dict(StateDict());  // ignored
  // An enabled scaler refuses the empty state a disabled one saves.
  amp::GradScaler on;
  REQUIRE_THROWS_WITH(on.load_state_dict(scaler.state_dict()), Contains("disabled"));
}

TEST_CASE("GradScaler state_dict round-trips and continues the trajectory",
          "[amp][grad_scaler][state]") {
  Tensor p = ones({2}).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.1});
  amp::GradScaler a({.init_scale = 128.0, .growth_interval = 3});
  auto step = [&](amp::GradScaler& s, bool inf) {
    s.scale(sum(mul(p, from_vector(std::vector<float>{inf ? NAN : 1.0f, 2.0f})))).backward();
    s.step(opt);
    s.update();
    opt.zero_grad();
  };
  step(a, false);
  step(a, true);
  step(a, false);
  step(a, false);
  const StateDict sd = a.state_dict();
  CHECK(sd.keys() == std::vector<std::string>{"scale", "growth_factor", "backoff_factor",
                                              "growth_interval", "_growth_tracker"});
  CHECK(sd.scalar("scale") == 64.0);
  CHECK(sd.scalar("_growth_tracker") == 2.0);
  amp::GradScaler b;  // other settings, not started: loading sets everything
  b.load_state_dict(sd);
  CHECK(b.get_scale() == 64.0);
  CHECK(b.get_growth_tracker() == 2);
  CHECK(b.get_growth_interval() == 3);
  step(a, false);
  step(b, false);
  CHECK(a.get_scale() == 128.0);
  CHECK(b.get_scale() == 128.0);
  CHECK(b.get_growth_tracker() == 0);
  // A started scaler takes loaded values into its device tensors.
  a.load_state_dict(sd);
  CHECK(a.get_scale() == 64.0);
  CHECK(a.get_growth_tracker() == 2);
  // Bad states change nothing and say what is wrong.
  StateDict missing = sd;
  missing.erase("growth_factor");
  REQUIRE_THROWS_WITH(b.load_state_dict(missing), Contains("growth_factor"));
  StateDict extra = sd;
  extra.insert_scalar("momentum", 0.9);
  REQUIRE_THROWS_WITH(b.load_state_dict(extra), Contains("unexpected entry 'momentum'"));
  StateDict bad;
  for (const auto& [k, t] : sd) bad.insert(k, k == "backoff_factor" ? scalar_tensor(2.0) : t);
  REQUIRE_THROWS_WITH(b.load_state_dict(bad), Contains("backoff_factor must be in (0, 1)"));
  CHECK(b.get_scale() == 128.0);
  CHECK(b.get_backoff_factor() == 0.5);
}

TEST_CASE("checkpoints save and restore the GradScaler, older files load without one",
          "[amp][grad_scaler][checkpoint]") {
  auto model = std::make_shared<nn::Linear>(3, 2);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  amp::GradScaler scaler({.init_scale = 1024.0, .growth_interval = 5});
  const std::string path = temp_path("scaler.h5");
  if (!io::hdf5_supported()) {
    REQUIRE_THROWS_WITH(io::save_checkpoint(path, *model, &opt, nullptr, &scaler, {}),
                        Contains("without HDF5"));
    return;
  }
  for (int k = 0; k < 3; ++k) {
    Tensor loss = sum(model->forward(ones({4, 3})));
    if (k == 1) loss = mul(loss, INFINITY);
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    opt.zero_grad();
  }
  REQUIRE(scaler.get_scale() == 512.0);
  REQUIRE(scaler.get_growth_tracker() == 1);
  io::save_checkpoint(path, *model, &opt, nullptr, &scaler, {0, 3, 0});
  const io::Checkpoint c = io::read_checkpoint(path);
  CHECK(c.scaler.scalar("scale") == 512.0);

  auto model2 = std::make_shared<nn::Linear>(3, 2);
  optim::SGD opt2(model2->parameters(), {.lr = 0.1});
  amp::GradScaler resumed({.init_scale = 7.0});
  io::load_checkpoint(path, *model2, &opt2, nullptr, &resumed);
  CHECK(resumed.get_scale() == 512.0);
  CHECK(resumed.get_growth_tracker() == 1);
  CHECK(resumed.get_growth_interval() == 5);
  CHECK(allclose(model2->weight.detach(), model->weight.detach(), 0, 0));

  // A file written without a scaler (as before scalers were saved) loads into model and
  // optimizer; asking it for a scaler is an error that loads nothing.
  const std::string old = temp_path("noscaler.h5");
  io::save_checkpoint(old, *model, &opt, nullptr, {0, 3, 0});
  CHECK(io::read_checkpoint(old).scaler.empty());
  io::load_checkpoint(old, *model2, &opt2, nullptr);
  REQUIRE_THROWS_WITH(io::load_checkpoint(old, *model2, &opt2, nullptr, &resumed),
                      Contains("holds no GradScaler state"));
  CHECK(resumed.get_scale() == 512.0);
  // A disabled scaler saves nothing and ignores what a file holds.
  amp::GradScaler off({.enabled = false});
  io::save_checkpoint(old, *model, &opt, nullptr, &off, {0, 3, 0});
  CHECK(io::read_checkpoint(old).scaler.empty());
  io::load_checkpoint(path, *model2, &opt2, nullptr, &off);
  CHECK(off.get_scale() == 1.0);
  std::filesystem::remove(path);
  std::filesystem::remove(old);
}
