// The Fashion-MNIST example's model and data (header-only), shared by examples/fashion_mnist and
// benchmarks/soak: the small CNN and the normalisation of the IDX images.
#pragma once

#include <memory>
#include <string>

#include "dltrain/data/vision.hpp"
#include "dltrain/nn/containers.hpp"
#include "dltrain/nn/layers.hpp"

namespace fashion_mnist {

/// Where Debian's dataset-fashion-mnist puts the IDX files.
inline const std::string kDefaultData = "/usr/share/datasets/fashion-mnist";

/// Fashion-MNIST's mean and standard deviation (one channel).
inline dltrain::data::ImageOptions normalization() { return {{0.2860f}, {0.3530f}}; }

/// conv(1->32)-BN-ReLU-pool, conv(32->64)-BN-ReLU-pool, linear(64*7*7 -> 10).
inline std::shared_ptr<dltrain::nn::Sequential> make_model() {
  namespace nn = dltrain::nn;
  nn::Conv2dOptions c;
  c.padding = 1;
  c.bias = false;  // BN follows
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Conv2d>(1, 32, 3, c))
      .push_back(std::make_shared<nn::BatchNorm2d>(32))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::MaxPool2d>(2))
      .push_back(std::make_shared<nn::Conv2d>(32, 64, 3, c))
      .push_back(std::make_shared<nn::BatchNorm2d>(64))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::MaxPool2d>(2))
      .push_back(std::make_shared<nn::Flatten>())
      .push_back(std::make_shared<nn::Linear>(64 * 7 * 7, 10));
  return m;
}

}  // namespace fashion_mnist
