// Mixed precision on CUDA against the CPU: the autocast policy table's output dtypes under an
// f16 and a bf16 CUDA region, a CUDA region leaving CPU tensors alone, batch norm (cuDNN) with
// an f16/bf16 input and f32 parameters, GradScaler's unscale kernel (many tensors, a strided
// gradient, inf/NaN found on the device) and update kernel against the same run on the CPU,
// and f16/bf16 parameters stepped by the fused optimizer kernels against the CPU update.
// GPU-only: without a GPU, tests/cuda/main.cpp makes every test exit with ctest's skip code.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "tests/amp/policy_ops.hpp"
#include "tests/cuda/cuda_test_util.hpp"

using namespace dltrain;
using dltrain::test::check_close;
using dltrain::test::kCuda;

namespace {

Tensor r(const Shape& s, uint64_t seed, DType dt) {
  Generator g(seed);
  return randn(s, DType::f32, &g).to(dt).to(kCuda);
}

// One call per policy row with operands of dtypes a and b on the GPU.
Tensor run_op(amp::Op op, DType a, DType b) {
  return dltrain::testing::run_policy_op(op, a, b, kCuda);
}

}  // namespace

TEST_CASE("CUDA: every listed op has the policy's output dtype under f16 and bf16 autocast",
          "[cuda][amp]") {
  for (DType low : {DType::f16, DType::bf16}) {
    const DType other = low == DType::f16 ? DType::bf16 : DType::f16;
    for (const amp::OpPolicy& row : amp::policy_table()) {
      INFO(row.name << " under CUDA autocast " << dltrain::test::dt_str(low));
      amp::autocast ac(DeviceType::CUDA, low);
      Tensor out;
      switch (row.policy) {
        case amp::CastPolicy::LowerPrecision:
          out = run_op(row.op, DType::f32, DType::f32);
          CHECK(out.dtype() == low);
          CHECK(run_op(row.op, other, DType::f32).dtype() == low);
          break;
        case amp::CastPolicy::Float32:
          out = run_op(row.op, low, low);
          CHECK(out.dtype() == DType::f32);
          break;
        case amp::CastPolicy::Promote:
          out = run_op(row.op, low, DType::f32);
          CHECK(out.dtype() == DType::f32);
          CHECK(run_op(row.op, low, low).dtype() == low);
          break;
      }
      CHECK(out.device() == kCuda);
    }
  }
}

TEST_CASE("CUDA: a CUDA region leaves CPU tensors alone, a CPU region CUDA ones", "[cuda][amp]") {
  const Tensor a = r({2, 3}, 1, DType::f32), b = r({3, 2}, 2, DType::f32);
  {
    amp::autocast ac(DeviceType::CUDA);
    CHECK(mm(a, b).dtype() == DType::f16);
    CHECK(mm(a.to(Device::cpu()), b.to(Device::cpu())).dtype() == DType::f32);
  }
  amp::autocast ac(DeviceType::CPU);
  CHECK(mm(a, b).dtype() == DType::f32);
}

TEST_CASE("CUDA: a model under f16 autocast trains its f32 master weights like the CPU run",
          "[cuda][amp]") {
  // conv -> BatchNorm2d (f16 input, f32 parameters on cuDNN) -> relu -> linear, GradScaler.
  for (DType low : {DType::f16, DType::bf16}) {
    INFO(dltrain::test::dt_str(low));
    auto make = [] {
      manual_seed(5);
      auto net = std::make_shared<nn::Sequential>();
      net->push_back(std::make_shared<nn::Conv2d>(3, 4, 3, nn::Conv2dOptions{.padding = 1}))
          .push_back(std::make_shared<nn::BatchNorm2d>(4))
          .push_back(std::make_shared<nn::ReLU>())
          .push_back(std::make_shared<nn::Flatten>())
          .push_back(std::make_shared<nn::Linear>(4 * 6 * 6, 5));
      return net;
    };
    auto cpu = make(), gpu = make();
    gpu->to(kCuda);
    Generator gx(9);
    const Tensor x = randn({8, 3, 6, 6}, DType::f32, &gx);
    const Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2});
    optim::SGD oc(cpu->parameters(), {.lr = 0.05, .momentum = 0.9});
    optim::SGD og(gpu->parameters(), {.lr = 0.05, .momentum = 0.9});
    amp::GradScaler sc({.init_scale = 1024.0}), sg({.init_scale = 1024.0});
    for (int k = 0; k < 3; ++k) {
      Tensor lc, lg;
      {
        amp::autocast ac(DeviceType::CPU, low);
        lc = cross_entropy(cpu->forward(x), y);
      }
      {
        amp::autocast ac(DeviceType::CUDA, low);
        Tensor logits = gpu->forward(x.to(kCuda));
        CHECK(logits.dtype() == low);
        lg = cross_entropy(logits, y.to(kCuda));
      }
      CHECK(lg.dtype() == DType::f32);
      sc.scale(lc).backward();
      sg.scale(lg).backward();
      for (const Tensor& p : gpu->parameters()) CHECK(p.grad().dtype() == DType::f32);
      CHECK(sc.step(oc) == sg.step(og));
      sc.update();
      sg.update();
      CHECK(sc.get_scale() == sg.get_scale());
      oc.zero_grad();
      og.zero_grad();
      check_close(lg.to(Device::cpu()), lc, low == DType::f16 ? 1e-2 : 5e-2, 1e-2, "loss");
    }
    const auto pc = cpu->parameters(), pg = gpu->parameters();
    for (size_t i = 0; i < pc.size(); ++i)
      check_close(pg[i].detach().to(Device::cpu()), pc[i].detach(), 5e-2, 5e-3, "parameter", 2e-2);
  }
}

TEST_CASE("CUDA: GradScaler unscale and update kernels match the CPU", "[cuda][amp]") {
  // 90 parameters (more than one table), one longer than one launch, one strided gradient.
  std::vector<Shape> shapes;
  for (int k = 0; k < 90; ++k) shapes.push_back({5 + k});
  shapes.push_back({21 * 1048576 + 5});
  shapes.push_back({4, 6});
  for (int scenario = 0; scenario < 4; ++scenario) {
    INFO("scenario " << scenario);  // 0 finite, 1 inf in a dense grad, 2 NaN in the strided one,
                                    // 3 bf16 and f64 gradients next to f32 ones
    std::vector<Tensor> pc, pg;
    for (size_t k = 0; k < shapes.size(); ++k) {
      const DType dt = scenario == 3 ? (k % 3 == 0   ? DType::bf16
                                        : k % 3 == 1 ? DType::f64
                                                     : DType::f32)
                                     : DType::f32;
      Tensor c = zeros(shapes[k], dt).requires_grad_();
      Tensor g = zeros(shapes[k], TensorOptions(dt).with_device(kCuda)).requires_grad_();
      Generator gen(100 + k);
      Tensor grad = mul(randn(shapes[k], DType::f32, &gen), 4096.0).to(dt);
      if (k == shapes.size() - 1) grad = grad.t().contiguous().t();  // strides (1, 4)
      if (scenario == 1 && k == 7) grad.select(0, 3).fill_(INFINITY);
      if (scenario == 2 && k == shapes.size() - 1) grad.select(0, 1).select(0, 2).fill_(NAN);
      c.set_grad(grad);
      Tensor gd = empty_strided(grad.shape(), grad.strides(), TensorOptions(dt).with_device(kCuda));
      gd.copy_(grad);
      g.set_grad(gd);
      pc.push_back(c);
      pg.push_back(g);
    }
    REQUIRE_FALSE(pg.back().grad().is_contiguous());
    optim::SGD oc(pc, {.lr = 0.5}), og(pg, {.lr = 0.5});
    amp::GradScaler sc({.init_scale = 4096.0, .growth_interval = 1}),
        sg({.init_scale = 4096.0, .growth_interval = 1});
    sc.scale(zeros({}));
    sg.scale(zeros({}, TensorOptions().with_device(kCuda)));
    sc.unscale_(oc);
    sg.unscale_(og);
    for (size_t k = 0; k < pc.size(); ++k)
      check_close(pg[k].grad().to(Device::cpu()), pc[k].grad(), 0, 0, "unscaled gradient");
    const bool stepped = sg.step(og);
    CHECK(stepped == sc.step(oc));
    CHECK(stepped == (scenario == 0 || scenario == 3));
    sc.update();
    sg.update();
    CHECK(sg.get_scale() == sc.get_scale());
    CHECK(sg.get_scale() == (stepped ? 8192.0 : 2048.0));
    CHECK(sg.get_growth_tracker() == 0);
    for (size_t k = 0; k < pc.size(); ++k)
      check_close(pg[k].detach().to(Device::cpu()), pc[k].detach(), 1e-6, 1e-6, "parameter");
  }
}

TEST_CASE("CUDA: f16 and bf16 parameters step like the CPU's f32-state update", "[cuda][amp]") {
  for (DType dt : {DType::f16, DType::bf16}) {
    for (int which = 0; which < 2; ++which) {
      INFO(dltrain::test::dt_str(dt) << (which == 0 ? " SGD" : " Adam"));
      std::vector<Tensor> pc, pg;
      for (int k = 0; k < 30; ++k) {
        Generator gen(k);
        Tensor v = randn({17 + 1000 * k}, DType::f32, &gen).to(dt);
        pc.push_back(v.clone().requires_grad_());
        pg.push_back(v.to(kCuda).requires_grad_());
      }
      auto make = [&](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
        if (which == 0)
          return std::make_unique<optim::SGD>(
              ps, optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01});
        return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{.lr = 0.01});
      };
      auto oc = make(pc), og = make(pg);
      for (int step = 0; step < 3; ++step) {
        for (size_t k = 0; k < pc.size(); ++k) {
          Generator gen(1000 + 31 * step + k);
          Tensor g = randn(pc[k].shape(), DType::f32, &gen).to(dt);
          pc[k].set_grad(g);
          pg[k].set_grad(g.to(kCuda));
        }
        oc->step();
        og->step();
      }
      // The same f32 arithmetic rounded once; a fused multiply-add may move a rounding by 1 ulp.
      const double ulp = dt == DType::f16 ? 1e-3 : 8e-3;
      for (size_t k = 0; k < pc.size(); ++k)
        check_close(pg[k].detach().to(Device::cpu()).to(DType::f32), pc[k].detach().to(DType::f32),
                    ulp, 1e-3, "parameter");
      for (const auto& [key, t] : og->state_dict())
        if (key.find(".exp_avg") != std::string::npos ||
            key.find("momentum_buffer") != std::string::npos)
          CHECK(t.dtype() == DType::f32);
    }
  }
}
