// nn::init: in-place weight initialisations with PyTorch's formulas.
//
// Every function fills an existing tensor in place without recording autograd
// (so it works on parameters that require grad), draws from `gen` (the default
// generator when null) and returns the tensor. Fans follow PyTorch: for a
// weight [out, in, k...], fan_in = in * prod(k) and fan_out = out * prod(k).
#pragma once

#include <string>
#include <utility>

#include "dltrain/core/generator.hpp"
#include "dltrain/core/tensor.hpp"

namespace dltrain::nn::init {

/// Which fan kaiming_* preserves the variance of.
enum class FanMode { FanIn, FanOut };

/// (fan_in, fan_out) of a weight with at least 2 dims; throws for fewer.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);
/// Recommended gain: "linear"/"conv2d"/"sigmoid" 1, "tanh" 5/3, "relu" sqrt(2),
/// "leaky_relu" sqrt(2 / (1 + param^2)), "selu" 3/4. Throws for other names.
double calculate_gain(const std::string& nonlinearity, double param = 0.01);

Tensor& uniform_(Tensor& t, double low = 0.0, double high = 1.0, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
Tensor& constant_(Tensor& t, double value);
Tensor& zeros_(Tensor& t);
Tensor& ones_(Tensor& t);
/// He uniform: U(-b, b) with b = gain * sqrt(3 / fan), gain = calculate_gain(nonlinearity, a).
Tensor& kaiming_uniform_(Tensor& t, double a = 0.0, FanMode mode = FanMode::FanIn,
                         const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
/// He normal: N(0, std^2) with std = gain / sqrt(fan).
Tensor& kaiming_normal_(Tensor& t, double a = 0.0, FanMode mode = FanMode::FanIn,
                        const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
/// Glorot uniform: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).
Tensor& xavier_uniform_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);
/// Glorot normal: std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor& xavier_normal_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);

}  // namespace dltrain::nn::init
