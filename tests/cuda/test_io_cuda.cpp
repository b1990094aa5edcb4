// safetensors export of CUDA tensors: contiguous and non-contiguous device tensors are
// written row-major and load back (on the CPU) equal to the same tensors made on the CPU.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <filesystem>

#include "dltrain/dltrain.hpp"
#include "dltrain/io/checkpoint.hpp"
#include "dltrain/io/safetensors.hpp"

using namespace dltrain;

TEST_CASE("save_safetensors writes CUDA tensors (contiguous or not) row-major", "[cuda][io]") {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("dltrain_cuda_io_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  const Tensor a = arange(12.0).reshape({3, 4});
  const Tensor b = arange(24.0, DType::f64).reshape({2, 3, 4});
  const Tensor a_dev = a.to(Device::cuda());
  const Tensor b_dev = b.to(Device::cuda());
  StateDict sd;
  sd.insert("a", a_dev);
  sd.insert("a_t", a_dev.t());                    // non-contiguous device view
  sd.insert("b_perm", b_dev.permute({2, 0, 1}));  // non-contiguous, other dtype
  io::save_safetensors(path, sd);
  const StateDict back = io::load_safetensors(path);
  std::filesystem::remove(path);
  REQUIRE(back.at("a").device().is_cpu());
  REQUIRE(back.at("a").to_vector<float>() == a.to_vector<float>());
  REQUIRE(back.at("a_t").to_vector<float>() == a.t().to_vector<float>());
  REQUIRE(back.at("b_perm").shape() == Shape{4, 2, 3});
  REQUIRE(back.at("b_perm").to_vector<double>() == b.permute({2, 0, 1}).to_vector<double>());
}

namespace {
// A small conv net on the GPU, trained a few SGD steps from a fixed batch.
struct Run {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::SGD> opt;
};
Run make_run() {
  manual_seed(3);
  Run r;
  r.model = std::make_shared<nn::Sequential>();
  r.model->push_back(std::make_shared<nn::Conv2d>(3, 8, 3))
      .push_back(std::make_shared<nn::BatchNorm2d>(8))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::AdaptiveAvgPool2d>(1))
      .push_back(std::make_shared<nn::Flatten>())
      .push_back(std::make_shared<nn::Linear>(8, 4));
  r.model->to(Device::cuda(0));
  r.model->to(MemoryFormat::ChannelsLast);
  r.opt = std::make_unique<optim::SGD>(
      r.model->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  return r;
}
void train_steps(Run& r, int steps) {
  Generator g(11);
  const Tensor x = randn({6, 3, 9, 9}, {}, &g).to(Device::cuda(0));
  const Tensor y = randint(0, 4, {6}, DType::i64, &g).to(Device::cuda(0));
  for (int i = 0; i < steps; ++i) {
    Tensor loss = cross_entropy(r.model->forward(x.contiguous(MemoryFormat::ChannelsLast)), y);
    r.opt->zero_grad();
    loss.backward();
    r.opt->step();
  }
}
}  // namespace

TEST_CASE("a GPU model resumes from a checkpoint exactly (or its weights via safetensors)",
          "[cuda][io]") {
  const std::string base =
      (std::filesystem::temp_directory_path() / ("dltrain_cuda_ckpt_" + std::to_string(::getpid())))
          .string();
  Run straight = make_run();
  train_steps(straight, 4);
  Run first = make_run();
  train_steps(first, 2);
  if (io::hdf5_supported()) {
    io::save_checkpoint(base + ".h5", *first.model, first.opt.get(), nullptr, {0, 2, 2});
    Run resumed = make_run();  // fresh weights, then the checkpoint's
    io::load_checkpoint(base + ".h5", *resumed.model, resumed.opt.get(), nullptr);
    std::filesystem::remove(base + ".h5");
    train_steps(resumed, 2);
    const StateDict a = straight.model->state_dict(), b = resumed.model->state_dict();
    for (const auto& [name, t] : a.items()) {
      INFO(name);
      REQUIRE(b.at(name).device() == Device::cuda(0));
      REQUIRE(allclose(b.at(name).to(Device::cpu()), t.to(Device::cpu()), 1e-6, 1e-7));
    }
  } else {
    io::save_safetensors(base + ".safetensors", first.model->state_dict());
    Run copy = make_run();
    copy.model->load_state_dict(io::load_safetensors(base + ".safetensors"));
    std::filesystem::remove(base + ".safetensors");
    const StateDict a = first.model->state_dict(), b = copy.model->state_dict();
    for (const auto& [name, t] : a.items()) {
      INFO(name);
      REQUIRE(b.at(name).device() == Device::cuda(0));
      REQUIRE(b.at(name).to(Device::cpu()).to_vector<double>() ==
              t.to(Device::cpu()).to_vector<double>());
    }
  }
}
