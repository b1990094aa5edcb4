// End to end on the GPU: three SGD-momentum training steps of a CIFAR-stem ResNet-18 on CUDA
// against the same steps on the CPU, from identical weights and data (TF32 off for the test),
// in NCHW and in channels-last. Compares the loss of every step, then every parameter and
// every BatchNorm buffer after the last step. This catches whatever the per-op tests miss in
// how the CUDA ops compose: autograd through the whole graph, gradient accumulation, the
// optimizer's fused update, BN running statistics and layouts.
// GPU-only: without a GPU, tests/cuda/main.cpp skips every test (exit code 4).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "tests/cuda/cuda_test_util.hpp"

using namespace dltrain;

namespace {

std::shared_ptr<models::ResNet> small_resnet() {
  return models::resnet18({.num_classes = 10, .cifar_stem = true});
}

// Runs `steps` training steps; returns the loss of each (before its update).
std::vector<double> train_steps(models::ResNet& model, const Tensor& x, const Tensor& y,
                                int steps) {
  optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4});
  model.train();
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    Tensor loss = cross_entropy(model.forward(x), y);
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// |got - want| <= rtol * max|want| + atol over the whole tensor, compared on the host in f64.
void require_close(const std::string& name, const Tensor& got, const Tensor& want, double rtol,
                   double atol) {
  INFO(name);
  REQUIRE(got.shape() == want.shape());
  std::vector<double> g = got.to(Device::cpu()).to_vector<double>();
  std::vector<double> w = want.to(Device::cpu()).to_vector<double>();
  double max_err = 0, max_ref = 0;
  int64_t non_finite = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    non_finite += std::isfinite(g[i]) ? 0 : 1;
    max_err = std::max(max_err, std::abs(g[i] - w[i]));
    max_ref = std::max(max_ref, std::abs(w[i]));
  }
  INFO("max |cuda - cpu| " << max_err << ", max |cpu| " << max_ref);
  REQUIRE(non_finite == 0);
  REQUIRE(max_err <= rtol * max_ref + atol);
}

void compare_training(MemoryFormat fmt) {
  const test::Tf32 tf32_off(false);  // CUDA and CPU agree to f32 rounding
  const Device gpu = Device::cuda(0);
  manual_seed(1234);
  auto cpu_model = small_resnet();
  auto gpu_model = small_resnet();
  gpu_model->load_state_dict(cpu_model->state_dict());
  gpu_model->to(gpu);
  if (fmt == MemoryFormat::ChannelsLast) gpu_model->to(fmt);

  Tensor x = randn({4, 3, 32, 32});
  Tensor y = randint(0, 10, {4});
  Tensor x_gpu = x.to(gpu).contiguous(fmt);
  Tensor y_gpu = y.to(gpu);
  REQUIRE(x_gpu.is_contiguous(fmt));

  constexpr int kSteps = 3;
  std::vector<double> cpu_losses = train_steps(*cpu_model, x, y, kSteps);
  std::vector<double> gpu_losses = train_steps(*gpu_model, x_gpu, y_gpu, kSteps);
  cuda::synchronize();
  for (int i = 0; i < kSteps; ++i) {
    INFO("step " << i << ": loss cuda " << gpu_losses[static_cast<size_t>(i)] << ", cpu "
                 << cpu_losses[static_cast<size_t>(i)]);
    REQUIRE(std::isfinite(gpu_losses[static_cast<size_t>(i)]));
    REQUIRE(std::abs(gpu_losses[static_cast<size_t>(i)] - cpu_losses[static_cast<size_t>(i)]) <=
            1e-4 * std::abs(cpu_losses[static_cast<size_t>(i)]) + 1e-6);
  }
  // The steps did train: the loss on the one repeated batch went down.
  REQUIRE(cpu_losses.back() < cpu_losses.front());

  // The GPU model stayed on the GPU and in its layout (the optimizer updates in place).
  REQUIRE(gpu_model->conv1->weight.device() == gpu);
  REQUIRE(gpu_model->fc->weight.device() == gpu);
  REQUIRE(gpu_model->conv1->weight.is_contiguous(fmt));
  REQUIRE(gpu_model->layer4->named_parameters().front().second.is_contiguous(fmt));

  const nn::NamedTensors cpu_params = cpu_model->named_parameters();
  const nn::NamedTensors gpu_params = gpu_model->named_parameters();
  REQUIRE(cpu_params.size() == gpu_params.size());
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    REQUIRE(gpu_params[i].first == cpu_params[i].first);
    require_close(gpu_params[i].first, gpu_params[i].second, cpu_params[i].second, 1e-3, 1e-6);
  }

  const nn::NamedTensors cpu_buffers = cpu_model->named_buffers();
  const nn::NamedTensors gpu_buffers = gpu_model->named_buffers();
  REQUIRE(cpu_buffers.size() == gpu_buffers.size());
  int64_t bn_stats = 0;
  for (size_t i = 0; i < cpu_buffers.size(); ++i) {
    const auto& [name, want] = cpu_buffers[i];
    const Tensor& got = gpu_buffers[i].second;
    REQUIRE(gpu_buffers[i].first == name);
    REQUIRE(got.device() == gpu);
    if (name.ends_with("num_batches_tracked")) {
      INFO(name);
      REQUIRE(got.to(Device::cpu()).item<int64_t>() == kSteps);
      REQUIRE(want.item<int64_t>() == kSteps);
    } else {
      require_close(name, got, want, 1e-3, 1e-6);
      ++bn_stats;
    }
  }
  REQUIRE(bn_stats == 2 * 20);  // ResNet-18: 20 BatchNorm layers, running_mean and running_var
}

}  // namespace

TEST_CASE("ResNet-18 training steps on CUDA match the CPU (NCHW)", "[cuda][gpu][resnet]") {
  compare_training(MemoryFormat::Contiguous);
}

TEST_CASE("ResNet-18 training steps on CUDA match the CPU (channels-last)", "[cuda][gpu][resnet]") {
  compare_training(MemoryFormat::ChannelsLast);
}
