// The gradient halves of conv2d as plain (unrecorded) functions on any device, for ops built
// from convolutions (conv_transpose2d) (internal header).
//
// Each picks the backend conv2d itself would: cuDNN for CUDA tensors, oneDNN for f32/bf16 on
// the CPU when available, im2col + Eigen otherwise. Operands may be NCHW or channels-last;
// f16/bf16 compute in f32 on the im2col path. Nothing is recorded (no double backward).
#pragma once

#include "dltrain/core/tensor.hpp"
#include "dltrain/ops/conv.hpp"

namespace dltrain::detail {

/// One conv2d: input [N, Cin, H, W], weight [Cout, Cin/groups, kh, kw], output [N, Cout, Ho, Wo].
struct ConvGeometry {
  int64_t N, Cin, H, W, Cout, kh, kw, Ho, Wo, groups;
  Int2 stride, pad, dil;
};

/// The input gradient [N, Cin, H, W] in memory format `fmt` from gy [N, Cout, Ho, Wo] and w
/// (both of one floating dtype and device; the result has it too).
Tensor conv2d_input_grad(const Tensor& gy, const Tensor& w, const ConvGeometry& g,
                         MemoryFormat fmt);
/// The weight gradient [Cout, Cin/groups, kh, kw] in memory format `fmt` from x and gy.
Tensor conv2d_weight_grad(const Tensor& x, const Tensor& gy, const ConvGeometry& g,
                          MemoryFormat fmt);

}  // namespace dltrain::detail
