// The small model and data the multi-rank equivalence tests train (test_ddp.cpp, test_zero.cpp):
// the Fashion-MNIST example's CNN, 2 x kSteps x kBatch images, the relative difference of two
// models' parameters, and the f32 bound derived from a single process's own sensitivity.
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"

namespace dltrain::mpi_test {

inline constexpr int64_t kBatch = 12;  // divisible by 1, 2, 3 and 4
inline constexpr int kSteps = 20;

/// The Fashion-MNIST example's CNN (conv-[BN]-ReLU-pool x2, linear), with or without BN.
inline std::shared_ptr<nn::Sequential> fm_cnn(bool bn, DType dt) {
  manual_seed(42);
  nn::Conv2dOptions c;
  c.padding = 1;
  c.bias = !bn;
  TensorOptions o(dt);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Conv2d>(1, 32, 3, c, o));
  if (bn) m->push_back(std::make_shared<nn::BatchNorm2d>(32, nn::BatchNormOptions{}, o));
  m->push_back(std::make_shared<nn::ReLU>()).push_back(std::make_shared<nn::MaxPool2d>(2));
  m->push_back(std::make_shared<nn::Conv2d>(32, 64, 3, c, o));
  if (bn) m->push_back(std::make_shared<nn::BatchNorm2d>(64, nn::BatchNormOptions{}, o));
  m->push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::MaxPool2d>(2))
      .push_back(std::make_shared<nn::Flatten>())
      .push_back(std::make_shared<nn::Linear>(64 * 7 * 7, 10, true, o));
  return m;
}

struct Data {
  Tensor x, y;
};

/// 2 x kSteps x kBatch Fashion-MNIST images (real data when Debian's package is installed,
/// seeded noise otherwise), cached per dtype.
inline const Data& fm_data(DType dt) {
  static std::map<DType, Data> cache;
  auto it = cache.find(dt);
  if (it != cache.end()) return it->second;
  const int64_t n = 2 * kSteps * kBatch;
  Data d;
  const char* dir = "/usr/share/datasets/fashion-mnist";
  if (std::ifstream(std::string(dir) + "/train-images-idx3-ubyte.gz").good() ||
      std::ifstream(std::string(dir) + "/train-images-idx3-ubyte").good()) {
    data::MNIST ds(dir, true, data::ImageOptions{{0.2860f}, {0.3530f}});
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < n; ++i) idx.push_back(i * 97 % ds.size());
    data::Batch b = ds.get_batch(idx);
    d = {b.data.to(dt), b.target};
  } else {
    Generator g(9);
    d = {randn({n, 1, 28, 28}, dt, &g), randint(0, 10, {n}, DType::i64, &g)};
  }
  return cache[dt] = d;
}

/// Relative difference ||a - b|| / ||b|| over all parameters.
inline double rel_diff(const nn::Module& a, const nn::Module& b) {
  double num = 0, den = 0;
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    auto x = pa[i].to(DType::f64).to_vector<double>(), y = pb[i].to(DType::f64).to_vector<double>();
    for (size_t k = 0; k < x.size(); ++k) {
      num += (x[k] - y[k]) * (x[k] - y[k]);
      den += y[k] * y[k];
    }
  }
  return std::sqrt(num / den);
}

/// In f32 the bound is 1e-6, or 10x what the single-process run itself drifts by from a
/// last-bit perturbation of its weights when its dynamics amplify rounding more than that
/// (the BatchNorm model: ~1.6e-3 after 20 steps, in PyTorch as here; no implementation that
/// sums in another order can be closer). The f64 bound, 1e-12, is the exact-math check.
inline double f32_bound(double sensitivity) { return std::max(1e-6, 10 * sensitivity); }

}  // namespace dltrain::mpi_test
