// Folding BatchNorm into the convolution before it, for inference (PyTorch's
// torch.nn.utils.fusion.fuse_conv_bn_eval, applied over a whole model as
// torch.ao.quantization.fuse_modules does, but found by running the model, not by naming pairs).
//
// In eval mode a BatchNorm after a convolution is a per-channel affine map of the convolution's
// output, y = (conv(x) - mean) * gamma / sqrt(var + eps) + beta, so it folds into the
// convolution's weight and bias: W' = W * s, b' = (b - mean) * s + beta with
// s = gamma / sqrt(var + eps), computed in f64 and rounded once to the weight's dtype. The fused
// model then runs one convolution (bias included) where it ran a convolution and a BatchNorm
// pass over the activation: what makes small-batch CPU inference faster (ONNX Runtime folds
// them when it loads a model).
//
// Invariants: fuse_conv_bn finds the pairs by running the model once on an example input with
// forward hooks: a pair is a Conv2d and a BatchNorm2d whose input is exactly that convolution's
// output (checked by recomputing the BatchNorm on it, bit for bit). It then folds every pair
// and runs the example again: if the output moved by more than rounding can explain (the
// convolution's output was also used elsewhere, so folding changed another path), every change
// is undone and dltrain::Error names the pairs. A folded BatchNorm keeps its place in the model
// (BatchNorm::folded: forward returns its input, training it is refused); state dicts keep their
// keys (a convolution without bias gains one), so a fused model saves and exports (ONNX: no
// BatchNormalization nodes) like any other. It is for inference: fuse a copy, or reload the
// unfused weights to train again.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dltrain/core/tensor.hpp"

namespace dltrain::nn {

class Module;
class Conv2d;
class BatchNorm;

/// Folds `bn`'s eval transform (running statistics, affine parameters) into `conv` and marks
/// `bn` folded. Throws dltrain::Error (changing nothing) when the channel counts differ, `bn`
/// has no running statistics (track_running_stats false), or is already folded.
void fold_conv_bn(Conv2d& conv, BatchNorm& bn);

struct FuseReport {
  /// The folded pairs, "conv name + bn name" in the order the forward ran them.
  std::vector<std::string> pairs;
  /// Largest |fused - unfused| / max|unfused| over the example's output.
  double max_change = 0;
};

/// Switches `model` to eval mode and folds every BatchNorm2d that directly follows a Conv2d
/// (see the file comment). Returns what was folded. Throws dltrain::Error, leaving the model
/// as it was, when folding changes the example's output beyond rounding.
FuseReport fuse_conv_bn(Module& model, const Tensor& example_input);

}  // namespace dltrain::nn
