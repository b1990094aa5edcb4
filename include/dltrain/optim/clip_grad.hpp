// Gradient clipping, as torch.nn.utils.clip_grad_norm_ / clip_grad_value_.
//
// Both act in place on the .grad() of the given tensors and skip tensors without a gradient.
// The norm is taken over all gradients together, as if concatenated into one vector, and
// accumulated in double in a fixed chunk order, so the result does not depend on the thread
// count. On CUDA the norm is a multi-tensor reduction (double, fixed order) and the clipping
// coefficient never leaves the device; the returned norm is a device tensor read only when
// the caller reads it (error_if_nonfinite reads it, which synchronises).
#pragma once

#include <limits>
#include <vector>

#include "dltrain/core/tensor.hpp"

namespace dltrain::optim {

/// Scales all gradients by min(1, max_norm / (total_norm + 1e-6)) and returns total_norm, the
/// norm_type-norm of all gradients together, as a 0-d tensor with the dtype and device of the
/// first gradient (0-d f32 zero when no tensor has a gradient). `norm_type` is a positive p
/// or std::numeric_limits<double>::infinity() for the max-abs norm. With error_if_nonfinite a
/// NaN or infinite total raises dltrain::Error and leaves gradients untouched; otherwise they
/// are scaled by the (non-finite) coefficient, as PyTorch does.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

/// Clamps every gradient element into [-clip_value, clip_value] (clip_value >= 0).
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace dltrain::optim
