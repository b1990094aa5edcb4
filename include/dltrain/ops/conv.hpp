// 2-d convolution (cross-correlation, as in PyTorch) and transposed convolution with
// stride, padding, dilation and groups, on NCHW or channels-last inputs; the output keeps
// the input's memory format.
#pragma once

#include <array>

#include "dltrain/core/tensor.hpp"

namespace dltrain {

/// A (height, width) pair; an int gives the same value for both.
struct Int2 {
  int64_t h = 0, w = 0;
  Int2() = default;
  Int2(int64_t v) : h(v), w(v) {}  // NOLINT: conv2d(x, w, b, 2) reads naturally
  Int2(int64_t a, int64_t b) : h(a), w(b) {}
  bool operator==(const Int2&) const = default;
};

/// x [N, C_in, H, W], weight [C_out, C_in/groups, kH, kW], bias [C_out] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Int2 stride = 1,
              Int2 padding = 0, Int2 dilation = 1, int64_t groups = 1);

/// 1-d convolution: x [N, C_in, L], weight [C_out, C_in/groups, k], bias [C_out] or undefined
/// -> [N, C_out, L_out]; conv2d on a height-1 view, so every conv2d backend and autocast apply.
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              int64_t stride = 1, int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1);

/// Transposed convolution (the gradient of conv2d with respect to its input; PyTorch's
/// conv_transpose2d and argument order). x [N, C_in, H, W], weight [C_in, C_out/groups, kH, kW],
/// bias [C_out] or undefined; the output is [N, C_out, Ho, Wo] with
/// Ho = (H - 1) * stride - 2 * padding + dilation * (kH - 1) + output_padding + 1 (Wo alike)
/// and keeps x's memory format. output_padding must be smaller than stride or dilation.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        Int2 stride = 1, Int2 padding = 0, Int2 output_padding = 0,
                        int64_t groups = 1, Int2 dilation = 1);

/// Output spatial size of a convolution/pooling window along one dim.
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation,
                         bool ceil_mode = false);

}  // namespace dltrain
