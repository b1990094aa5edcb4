// 2-d pooling on NCHW or channels-last inputs (output keeps the input's format).
#pragma once

#include <optional>
#include <utility>

#include "dltrain/ops/conv.hpp"

namespace dltrain {

/// Max pooling; stride defaults to the kernel size. Padding is -inf.
Tensor max_pool2d(const Tensor& x, Int2 kernel, std::optional<Int2> stride = std::nullopt,
                  Int2 padding = 0, Int2 dilation = 1, bool ceil_mode = false);
/// Max pooling also returning the flat (h*W+w) int64 index of each max in its plane.
std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, Int2 kernel,
                                                  std::optional<Int2> stride = std::nullopt,
                                                  Int2 padding = 0, Int2 dilation = 1,
                                                  bool ceil_mode = false);
/// Average pooling; count_include_pad counts zero padding in the divisor (PyTorch default).
Tensor avg_pool2d(const Tensor& x, Int2 kernel, std::optional<Int2> stride = std::nullopt,
                  Int2 padding = 0, bool ceil_mode = false, bool count_include_pad = true);
/// Average pooling to an output size, with PyTorch's start/end window rule.
Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size);

}  // namespace dltrain
