// The convolutional VAE of examples/vae (Fashion-MNIST, 28x28): encoder (a typed Chain of a
// convolutional trunk and two Gaussian heads), decoder (Linear then two transposed
// convolutions) and the VAE that samples z between them. In a header of its own so that tests
// (the ONNX export of encoder and decoder) build the same model.
#pragma once

#include <cstdint>
#include <memory>
#include <tuple>
#include <utility>

#include "dltrain/dltrain.hpp"

namespace vae_example {

namespace nn = dltrain::nn;
using dltrain::Generator;
using dltrain::Tensor;

// The encoder's last stage: one tensor in, two out. Its call is operator(), not forward, since
// forward(const Tensor&) is Module's virtual one-tensor call (see docs/design.md).
struct GaussianHeads : nn::Module {
  std::shared_ptr<nn::Linear> mu, logvar;
  GaussianHeads(int64_t in, int64_t latent) : nn::Module("GaussianHeads") {
    mu = register_module("mu", std::make_shared<nn::Linear>(in, latent));
    logvar = register_module("logvar", std::make_shared<nn::Linear>(in, latent));
  }
  std::pair<Tensor, Tensor> operator()(const Tensor& h) {
    return {mu->forward(h), logvar->forward(h)};
  }
};

// [N, 1, 28, 28] -> (mu, logvar), each [N, latent]: a typed Chain of a plain Sequential (the
// convolutional trunk) and the two heads; (*encoder)(x) returns the heads' std::pair.
using Encoder = nn::Chain<nn::Sequential, GaussianHeads>;

inline std::shared_ptr<Encoder> make_encoder(int64_t latent) {
  const nn::Conv2dOptions s2{.stride = 2, .padding = 1};
  auto trunk = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(1, 32, 4, s2),   // 28 -> 14
      std::make_shared<nn::ReLU>(),                 //
      std::make_shared<nn::Conv2d>(32, 64, 4, s2),  // 14 -> 7
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Flatten>()});
  return nn::chain(trunk, std::make_shared<GaussianHeads>(64 * 7 * 7, latent));
}

// z [N, latent] -> probabilities [N, 1, 28, 28]: a one-tensor module, so it is also called
// alone (decoding random z into samples).
struct Decoder : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::ConvTranspose2d> up1, up2;
  explicit Decoder(int64_t latent) : nn::Module("Decoder") {
    const nn::ConvTranspose2dOptions s2{.stride = 2, .padding = 1};
    fc = register_module("fc", std::make_shared<nn::Linear>(latent, 64 * 7 * 7));
    up1 = register_module("up1", std::make_shared<nn::ConvTranspose2d>(64, 32, 4, s2));  // 7->14
    up2 = register_module("up2", std::make_shared<nn::ConvTranspose2d>(32, 1, 4, s2));   // ->28
  }
  Tensor forward(const Tensor& z) override {
    // The view is NCHW; a transposed convolution's output follows its input's layout, so the
    // features take the weights' (NHWC after model->to(MemoryFormat::ChannelsLast)).
    const Tensor h = dltrain::relu(fc->forward(z))
                         .view({z.size(0), 64, 7, 7})
                         .contiguous(up1->weight.suggest_memory_format());
    return dltrain::sigmoid(up2->forward(dltrain::relu(up1->forward(h))));
  }
};

struct VAE : nn::Module {
  std::shared_ptr<Encoder> encoder;
  std::shared_ptr<Decoder> decoder;
  explicit VAE(int64_t latent) : nn::Module("VAE") {
    encoder = register_module("encoder", make_encoder(latent));
    decoder = register_module("decoder", std::make_shared<Decoder>(latent));
  }
  // x -> (reconstruction, mu, logvar); z = mu + exp(logvar / 2) * eps with eps ~ N(0, I) drawn
  // from `gen` (the global generator when null).
  std::tuple<Tensor, Tensor, Tensor> operator()(const Tensor& x, Generator* gen = nullptr) {
    auto [mu, logvar] = (*encoder)(x);
    const Tensor z = dltrain::add(
        mu, dltrain::mul(dltrain::exp(dltrain::mul(logvar, 0.5)), dltrain::randn_like(mu, gen)));
    return {decoder->forward(z), mu, logvar};
  }
};

}  // namespace vae_example
