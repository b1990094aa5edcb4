// The gradient halves of conv2d as plain (unrecorded) functions on any device, for ops built
// from convolutions (conv_transpose2d) (internal header).
//
// Each picks the backend conv2d itself would: cuDNN for CUDA tensors, oneDNN for f32/bf16 on
// the CPU when available, im2col + Eigen otherwise. Operands may be NCHW or channels-last;
// f16/bf16 compute in f32 on the im2col path. Nothing is recorded; the _op and _higher
// functions below are the differentiable forms that create_graph backward uses.
#pragma once

#include <vector>

#include "dltrain/core/tensor.hpp"
#include "dltrain/ops/conv.hpp"

namespace dltrain::detail {

/// One conv2d: input [N, Cin, H, W], weight [Cout, Cin/groups, kh, kw], output [N, Cout, Ho, Wo].
struct ConvGeometry {
  int64_t N, Cin, H, W, Cout, kh, kw, Ho, Wo, groups;
  Int2 stride, pad, dil;
};

/// The memory format of conv2d(x, w)'s (and conv_transpose2d(x, w)'s) output and of the
/// computation: channels-last when the input or the weight is channels-last (PyTorch's rule, its
/// suggest_memory_format for convolutions), NCHW otherwise. A 1-channel input or a weight with
/// one input channel per group is dense in both formats and counts as NCHW, so a channels-last
/// weight still makes the output of a 1-channel image channels-last.
MemoryFormat conv_memory_format(const Tensor& x, const Tensor& w);

/// The input gradient [N, Cin, H, W] in memory format `fmt` from gy [N, Cout, Ho, Wo] and w
/// (both of one floating dtype and device; the result has it too).
Tensor conv2d_input_grad(const Tensor& gy, const Tensor& w, const ConvGeometry& g,
                         MemoryFormat fmt);
/// The weight gradient [Cout, Cin/groups, kh, kw] in memory format `fmt` from x and gy.
Tensor conv2d_weight_grad(const Tensor& x, const Tensor& gy, const ConvGeometry& g,
                          MemoryFormat fmt);

/// conv2d_weight_grad with a node (create_graph backward): differentiable in x and gy.
Tensor conv2d_weight_grad_op(const Tensor& x, const Tensor& gy, const ConvGeometry& g,
                             MemoryFormat fmt);
/// The output_padding of the conv_transpose2d that maps [Ho, Wo] back to [H, W].
Int2 conv2d_output_padding(const ConvGeometry& g);
/// conv2d's gradients written with differentiable ops (x, w with their graph): input by
/// conv_transpose2d, weight by conv2d_weight_grad_op, bias by a sum.
std::vector<Tensor> conv2d_higher(const Tensor& x, const Tensor& w, const Tensor& g,
                                  const ConvGeometry& geo, bool rx, bool rw, bool rb);

}  // namespace dltrain::detail
