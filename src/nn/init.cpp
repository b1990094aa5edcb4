// Weight initialisation (dltrain/nn/init.hpp): fans, gains and the uniform/normal/Kaiming/
// Xavier fills, drawn in f32 (f64 for f64 tensors) from a generator and written in place.
#include "dltrain/nn/init.hpp"

#include <cmath>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"

namespace dltrain::nn::init {

namespace {

// Draws in f32/f64 on the CPU and copies into t (any dtype, device or layout).
Tensor& fill_from(Tensor& t, const Tensor& values) {
  autograd::NoGradGuard ng;
  Tensor dst = t.detach();
  dst.copy_(values);
  return t;
}

DType draw_dtype(const Tensor& t) { return t.dtype() == DType::f64 ? DType::f64 : DType::f32; }

int64_t pick_fan(const Tensor& t, FanMode mode) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  int64_t fan = mode == FanMode::FanIn ? fan_in : fan_out;
  DLTRAIN_CHECK(fan > 0, "nn::init: tensor of shape ", shape_str(t.shape()),
                " has a zero fan; it cannot be initialised with kaiming_*");
  return fan;
}

}  // namespace

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  DLTRAIN_CHECK(t.dim() >= 2,
                "nn::init: fan in and fan out need a tensor with at least 2 dims, "
                "got shape ",
                shape_str(t.shape()));
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

double calculate_gain(const std::string& nl, double param) {
  if (nl == "linear" || nl == "conv1d" || nl == "conv2d" || nl == "conv3d" || nl == "sigmoid" ||
      nl == "identity") {
    return 1.0;
  }
  if (nl == "tanh") return 5.0 / 3.0;
  if (nl == "relu") return std::sqrt(2.0);
  if (nl == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nl == "selu") return 0.75;
  DLTRAIN_FAIL("nn::init::calculate_gain: unknown nonlinearity '", nl,
               "' (use linear, conv2d, sigmoid, tanh, relu, leaky_relu or selu)");
}

Tensor& uniform_(Tensor& t, double low, double high, Generator* gen) {
  DLTRAIN_CHECK(low <= high, "nn::init::uniform_: low (", low, ") must not exceed high (", high,
                ")");
  return fill_from(t, uniform(t.shape(), low, high, draw_dtype(t), gen));
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  DLTRAIN_CHECK(std >= 0, "nn::init::normal_: std must be >= 0, got ", std);
  return fill_from(t, normal(t.shape(), mean, std, draw_dtype(t), gen));
}

Tensor& constant_(Tensor& t, double value) {
  autograd::NoGradGuard ng;
  t.detach().fill_(value);
  return t;
}

Tensor& zeros_(Tensor& t) { return constant_(t, 0.0); }
Tensor& ones_(Tensor& t) { return constant_(t, 1.0); }

Tensor& kaiming_uniform_(Tensor& t, double a, FanMode mode, const std::string& nonlinearity,
                         Generator* gen) {
  double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(pick_fan(t, mode)));
  double bound = std::sqrt(3.0) * std;
  return uniform_(t, -bound, bound, gen);
}

Tensor& kaiming_normal_(Tensor& t, double a, FanMode mode, const std::string& nonlinearity,
                        Generator* gen) {
  double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(pick_fan(t, mode)));
  return normal_(t, 0.0, std, gen);
}

Tensor& xavier_uniform_(Tensor& t, double gain, Generator* gen) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(t, -bound, bound, gen);
}

Tensor& xavier_normal_(Tensor& t, double gain, Generator* gen) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), gen);
}

}  // namespace dltrain::nn::init
