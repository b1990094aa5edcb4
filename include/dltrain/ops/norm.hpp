// Normalisation layers' functional forms.
#pragma once

#include "dltrain/core/tensor.hpp"

namespace dltrain {

/// Batch normalisation over all dims but 1 (channels) of x [N, C, ...].
/// training: normalises with batch statistics and, when running_mean/var are defined,
/// updates them in place: running = (1 - momentum) * running + momentum * batch stat
/// (unbiased variance), as PyTorch. Eval: normalises with the running statistics.
/// weight/bias [C] may be undefined (no affine). Keeps the input's memory format.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum = 0.1, double eps = 1e-5);

/// Layer normalisation over the trailing `normalized_shape` dims; weight/bias of that shape
/// or undefined.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

}  // namespace dltrain
