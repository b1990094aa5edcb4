// Fused multi-tensor optimizers (SGD, Adam/AdamW, LARS, LAMB) and gradient clipping on CUDA
// against the CPU: identical parameters and gradients stepped on both devices for several
// steps must follow the same trajectory (f32 to ~1e-6 relative; only fused multiply-adds, and
// for LARS / LAMB the summation order of the f64 norms, may differ), with the same state
// dicts. The parameter sets span several kernel launches (more tensors than one table holds,
// a tensor longer than one launch's blocks), mixed dtypes in a group, a channels-last
// parameter, a gradient in another layout, and parameters skipped on some steps (their state
// starts later, so per-tensor step counts and first-step flags differ within a launch), and
// buffers that follow a parameter Module::to moved to the GPU and made channels-last.
// GPU-only: without a GPU, tests/cuda/main.cpp makes every test exit with ctest's skip code.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "tests/cuda/cuda_test_util.hpp"

using namespace dltrain;

namespace {

const Device kDev = Device::cuda(0);

void require_close(const Tensor& got, const Tensor& want, double rtol, double atol,
                   const std::string& what) {
  REQUIRE(got.dtype() == want.dtype());
  dltrain::test::check_close(got, want, rtol, atol, what);
}

struct Params {
  std::vector<Tensor> cpu, gpu;
};

// The parameter set described in the file comment; `big` adds a tensor longer than one
// launch (320 blocks of 64K elements).
Params make_params(bool big) {
  std::vector<Shape> shapes = {{7, 5}, {100003}, {3}, {2, 3, 4, 5}, {0}, {4, 4}};
  for (int64_t k = 0; k < 80; ++k) shapes.push_back({3 + k});  // > one table per group
  if (big) shapes.push_back({21 * 1048576 + 333});
  Params ps;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const DType dt = k == 5 ? DType::f64 : DType::f32;
    Tensor v = randn(shapes[k], DType::f64).to(dt);
    if (shapes[k].size() == 4) v = v.contiguous(MemoryFormat::ChannelsLast);
    Tensor c = v.clone(), g = v.to(kDev);
    c.requires_grad_();
    g.requires_grad_();
    ps.cpu.push_back(c);
    ps.gpu.push_back(g);
  }
  return ps;
}

// Same random gradients on both devices; parameter k gets none when skip(k).
void set_grads(Params& ps, const std::function<bool(size_t)>& skip) {
  for (size_t k = 0; k < ps.cpu.size(); ++k) {
    if (skip(k)) {
      ps.cpu[k].set_grad(Tensor());
      ps.gpu[k].set_grad(Tensor());
      continue;
    }
    // The channels-last parameter gets a contiguous gradient: the step copies it first.
    Tensor g = randn(ps.cpu[k].shape(), DType::f64).to(ps.cpu[k].dtype());
    ps.cpu[k].set_grad(g);
    ps.gpu[k].set_grad(g.to(kDev));
  }
}

void compare(const Params& ps, const optim::Optimizer& oc, const optim::Optimizer& og,
             const std::string& what) {
  for (size_t k = 0; k < ps.cpu.size(); ++k)
    require_close(ps.gpu[k], ps.cpu[k], 1e-5, 1e-6, what + " param " + std::to_string(k));
  const StateDict sc = oc.state_dict(), sg = og.state_dict();
  REQUIRE(sg.keys() == sc.keys());
  for (const auto& [key, t] : sc) require_close(sg.at(key), t, 1e-5, 1e-6, what + " state " + key);
}

// Runs `steps` steps of the optimizer `make` builds (from two param groups, the second with
// its own lr) on both devices and compares after each.
void run_both(
    const std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>& make,
    const std::string& what, int steps, bool big = false) {
  Params ps = make_params(big);
  auto groups = [&](const std::vector<Tensor>& all) {
    const size_t half = all.size() / 2;
    std::vector<optim::ParamGroup> gs(2);
    gs[0].params.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(half));
    gs[1].params.assign(all.begin() + static_cast<std::ptrdiff_t>(half), all.end());
    gs[1].lr = 0.02;
    return gs;
  };
  std::unique_ptr<optim::Optimizer> oc = make(groups(ps.cpu)), og = make(groups(ps.gpu));
  for (int s = 0; s < steps; ++s) {
    set_grads(ps, [s](size_t k) { return s < 2 && k % 5 == 1; });
    oc->step();
    og->step();
    compare(ps, *oc, *og, what + " step " + std::to_string(s));
  }
}

}  // namespace

TEST_CASE("SGD on CUDA follows the CPU trajectory with every option", "[cuda][gpu]") {
  const std::vector<optim::SGDOptions> options = {
      {.lr = 0.1},
      {.lr = 0.1, .momentum = 0.9},
      {.lr = 0.05, .momentum = 0.9, .dampening = 0.3, .weight_decay = 1e-2},
      {.lr = 0.05, .momentum = 0.8, .weight_decay = 1e-3, .nesterov = true},
      {.lr = 0.1, .momentum = 0.5, .maximize = true},
      {.lr = 0.1, .weight_decay = 0.1, .maximize = true},
  };
  for (size_t i = 0; i < options.size(); ++i) {
    run_both(
        [&](std::vector<optim::ParamGroup> gs) {
          return std::make_unique<optim::SGD>(std::move(gs), options[i]);
        },
        "SGD options " + std::to_string(i), 5);
  }
}

TEST_CASE("SGD on CUDA handles a tensor longer than one launch", "[cuda][gpu]") {
  run_both(
      [](std::vector<optim::ParamGroup> gs) {
        return std::make_unique<optim::SGD>(std::move(gs),
                                            optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      },
      "SGD big", 3, /*big=*/true);
}

TEST_CASE("Adam and AdamW on CUDA follow the CPU trajectory", "[cuda][gpu]") {
  for (bool amsgrad : {false, true}) {
    const std::string tag = amsgrad ? " amsgrad" : "";
    run_both(
        [&](std::vector<optim::ParamGroup> gs) {
          return std::make_unique<optim::AdamW>(
              std::move(gs), optim::AdamWOptions{.lr = 1e-2, .amsgrad = amsgrad});
        },
        "AdamW" + tag, 6);
    run_both(
        [&](std::vector<optim::ParamGroup> gs) {
          return std::make_unique<optim::Adam>(std::move(gs),
                                               optim::AdamOptions{.lr = 1e-2,
                                                                  .betas = {0.8, 0.99},
                                                                  .weight_decay = 1e-2,
                                                                  .amsgrad = amsgrad,
                                                                  .maximize = true});
        },
        "Adam L2 maximize" + tag, 6);
  }
  run_both(
      [](std::vector<optim::ParamGroup> gs) {
        return std::make_unique<optim::AdamW>(std::move(gs), optim::AdamWOptions{.lr = 1e-2});
      },
      "AdamW big", 2, /*big=*/true);
}

TEST_CASE("LARS and LAMB on CUDA follow the CPU trajectory", "[cuda][gpu]") {
  // The per-tensor norms come from per-chunk partial sums read back by the update kernel's
  // blocks: the parameter set spans several tables and launches (first_block bookkeeping).
  for (const bool adapt_second : {true, false}) {
    const std::string tag = adapt_second ? "" : " second group excluded";
    auto exclude = [&](std::vector<optim::ParamGroup> gs) {
      if (!adapt_second) {
        gs[1].trust_ratio = false;
        gs[1].weight_decay = 0.0;
      }
      return gs;
    };
    run_both(
        [&](std::vector<optim::ParamGroup> gs) {
          return std::make_unique<optim::LARS>(
              exclude(std::move(gs)),
              optim::LARSOptions{
                  .lr = 2.0, .momentum = 0.9, .weight_decay = 5e-4, .trust_coefficient = 0.02});
        },
        "LARS" + tag, 5);
    run_both(
        [&](std::vector<optim::ParamGroup> gs) {
          return std::make_unique<optim::LARS>(exclude(std::move(gs)),
                                               optim::LARSOptions{.lr = 1.0, .momentum = 0.0});
        },
        "LARS no momentum" + tag, 3);
    run_both(
        [&](std::vector<optim::ParamGroup> gs) {
          return std::make_unique<optim::LAMB>(
              exclude(std::move(gs)), optim::LAMBOptions{.lr = 1e-2, .weight_decay = 1e-2});
        },
        "LAMB" + tag, 5);
    run_both(
        [&](std::vector<optim::ParamGroup> gs) {
          return std::make_unique<optim::LAMB>(
              exclude(std::move(gs)),
              optim::LAMBOptions{.lr = 2e-2, .betas = {0.8, 0.99}, .max_trust_ratio = 0.5});
        },
        "LAMB clipped" + tag, 4);
  }
  run_both(
      [](std::vector<optim::ParamGroup> gs) {
        return std::make_unique<optim::LARS>(std::move(gs), optim::LARSOptions{.lr = 1.0});
      },
      "LARS big", 2, /*big=*/true);
  run_both(
      [](std::vector<optim::ParamGroup> gs) {
        return std::make_unique<optim::LAMB>(std::move(gs), optim::LAMBOptions{.lr = 1e-2});
      },
      "LAMB big", 2, /*big=*/true);
}

TEST_CASE("LARS and LAMB on CUDA give ratio 1 for zero weights and zero gradients, in bf16 too",
          "[cuda][gpu]") {
  for (const DType dt : {DType::f32, DType::bf16, DType::f64}) {
    std::vector<Tensor> cpu, gpu;
    for (int k = 0; k < 3; ++k) {
      Tensor v = k == 0 ? zeros({5, 3}, DType::f64) : randn({k == 1 ? 7 : 1}, DType::f64);
      Tensor c = v.to(dt).clone(), g = v.to(dt).to(kDev);
      c.requires_grad_();
      g.requires_grad_();
      cpu.push_back(c);
      gpu.push_back(g);
    }
    auto grads = [&](int step) {
      for (size_t k = 0; k < cpu.size(); ++k) {
        // Parameter 1's gradient is zero at the first step.
        Tensor gr = k == 1 && step == 0 ? zeros(cpu[k].shape(), DType::f64)
                                        : randn(cpu[k].shape(), DType::f64);
        cpu[k].set_grad(gr.to(dt));
        gpu[k].set_grad(gr.to(dt).to(kDev));
      }
    };
    optim::LARS lc(cpu, {.lr = 1.0, .weight_decay = 1e-3}),
        lg(gpu, {.lr = 1.0, .weight_decay = 1e-3});
    for (int step = 0; step < 3; ++step) {
      grads(step);
      lc.step();
      lg.step();
    }
    optim::LAMB mc(cpu, {.lr = 1e-2}), mg(gpu, {.lr = 1e-2});
    for (int step = 0; step < 3; ++step) {
      grads(step);
      mc.step();
      mg.step();
    }
    // bf16: one rounding of the parameter per step may land on either side (2^-8 relative).
    const double rtol = dt == DType::bf16 ? 1.0 / 128 : 1e-5;
    for (size_t k = 0; k < cpu.size(); ++k)
      dltrain::test::check_close(gpu[k], cpu[k], rtol, 1e-6,
                                 dltrain::test::dt_str(dt) + " param " + std::to_string(k));
  }
}

TEST_CASE("a CUDA optimizer resumes exactly from its state_dict", "[cuda][gpu]") {
  Params ps = make_params(false);
  optim::AdamW a(ps.gpu, {.lr = 1e-2, .amsgrad = true});
  set_grads(ps, [](size_t k) { return k % 7 == 3; });
  a.step();
  const StateDict saved = a.state_dict();
  std::vector<Tensor> resumed;
  for (const Tensor& p : ps.gpu) {
    Tensor r = p.detach().clone();
    r.requires_grad_();
    resumed.push_back(r);
  }
  optim::AdamW b(resumed, {.lr = 1e-2, .amsgrad = true});
  b.load_state_dict(saved);
  set_grads(ps, [](size_t) { return false; });
  for (size_t k = 0; k < resumed.size(); ++k) resumed[k].set_grad(ps.gpu[k].grad());
  a.step();
  b.step();
  for (size_t k = 0; k < resumed.size(); ++k)
    require_close(resumed[k], ps.gpu[k], 0.0, 0.0, "resumed param " + std::to_string(k));
}

TEST_CASE("optimizer state follows a parameter that Module::to moved and re-laid out",
          "[cuda][gpu]") {
  // Twin convolutions: `ref` steps on the CPU throughout; `moved` steps once on the CPU, is
  // then moved to the GPU and made channels-last in place, and steps on. The optimizer's
  // buffers must follow (device and layout), so both trajectories agree.
  using Make = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;
  const std::vector<std::pair<std::string, Make>> makers = {
      {"SGD",
       [](std::vector<Tensor> ps) {
         return std::make_unique<optim::SGD>(std::move(ps),
                                             optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
       }},
      {"AdamW amsgrad",
       [](std::vector<Tensor> ps) {
         return std::make_unique<optim::AdamW>(std::move(ps),
                                               optim::AdamWOptions{.lr = 1e-2, .amsgrad = true});
       }},
  };
  for (const auto& [name, make] : makers) {
    nn::Conv2d ref(3, 8, 3), moved(3, 8, 3);
    moved.load_state_dict(ref.state_dict());
    std::unique_ptr<optim::Optimizer> oref = make(ref.parameters()),
                                      omov = make(moved.parameters());
    for (int s = 0; s < 3; ++s) {
      if (s == 1) {
        moved.to(kDev);
        moved.to(MemoryFormat::ChannelsLast);
        REQUIRE(moved.weight.device() == kDev);
      }
      for (size_t k = 0; k < ref.parameters().size(); ++k) {
        Tensor g = randn(ref.parameters()[k].shape(), DType::f64).to(DType::f32);
        ref.parameters()[k].set_grad(g);
        moved.parameters()[k].set_grad(g.to(moved.parameters()[k].device()));
      }
      oref->step();
      omov->step();
      for (size_t k = 0; k < ref.parameters().size(); ++k)
        require_close(moved.parameters()[k], ref.parameters()[k], 1e-5, 1e-6,
                      name + " step " + std::to_string(s) + " param " + std::to_string(k));
    }
  }
}

TEST_CASE("clip_grad_norm_ and clip_grad_value_ on CUDA match the CPU", "[cuda][gpu]") {
  const double inf = std::numeric_limits<double>::infinity();
  for (double norm_type : {2.0, 1.0, inf, 3.0}) {
    for (double max_norm : {0.5, 1e6}) {
      std::ostringstream what;
      what << "norm " << norm_type << " max " << max_norm;
      std::vector<Tensor> pc, pg;
      const std::vector<Shape> shapes = {{100, 50}, {7}, {70000}, {2, 3, 4, 5}, {100, 50}};
      for (size_t k = 0; k < shapes.size(); ++k) {
        const DType dt = k == 1 ? DType::f16 : DType::f32;
        Tensor g = randn(shapes[k], DType::f64).to(dt);
        if (k == 3) g = g.contiguous(MemoryFormat::ChannelsLast);  // dense, permuted
        Tensor gg = g.to(kDev);
        if (k == 4) {  // a non-dense gradient: every other column of a wider tensor
          Tensor wide = randn({100, 100}, DType::f64).to(dt);
          g = wide.slice(1, 0, 100, 2);
          gg = wide.to(kDev).slice(1, 0, 100, 2);
        }
        Tensor a = zeros(shapes[k], dt), b = zeros(shapes[k], TensorOptions(dt).with_device(kDev));
        a.set_grad(g);
        b.set_grad(gg);
        pc.push_back(a);
        pg.push_back(b);
      }
      Tensor tc = optim::clip_grad_norm_(pc, max_norm, norm_type);
      Tensor tg = optim::clip_grad_norm_(pg, max_norm, norm_type);
      REQUIRE(tg.device() == kDev);
      require_close(tg, tc, 1e-6, 0.0, what.str() + " total");
      for (size_t k = 0; k < pc.size(); ++k)
        require_close(pg[k].grad(), pc[k].grad(), k == 1 ? 1e-3 : 1e-6, 0.0,
                      what.str() + " grad " + std::to_string(k));

      optim::clip_grad_value_(pc, 0.3);
      optim::clip_grad_value_(pg, 0.3);
      for (size_t k = 0; k < pc.size(); ++k)
        require_close(pg[k].grad(), pc[k].grad(), k == 1 ? 1e-3 : 1e-6, 0.0,
                      what.str() + " clip_grad_value_ " + std::to_string(k));
    }
  }
  // A non-finite norm raises when asked to, and leaves the gradients untouched.
  Tensor p = zeros({4}, kDev);
  p.set_grad(from_vector(std::vector<float>{1.0f, NAN, 2.0f, 3.0f}).to(kDev));
  REQUIRE_THROWS_WITH(optim::clip_grad_norm_({p}, 1.0, 2.0, true), Catch::Contains("non-finite"));
  REQUIRE(p.grad().to(Device::cpu()).to_vector<float>()[3] == 3.0f);
  // Gradients on two devices are refused.
  Tensor q = zeros({2});
  q.set_grad(ones({2}));
  REQUIRE_THROWS_WITH(optim::clip_grad_norm_({p, q}, 1.0), Catch::Contains("separate call"));
}
