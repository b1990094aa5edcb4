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

/// Group normalisation of x [N, C, *]: the channels split into num_groups groups, each
/// (sample, group) normalised with its own mean and biased variance; weight/bias [C] or
/// undefined. Returns x's dtype (16-bit inputs compute in f32); runs in f32 under autocast.
/// Keeps the input's memory format.
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

/// Instance normalisation of x [N, C, *] (each sample's channel on its own), torch's
/// F.instance_norm: with use_input_stats the instance statistics normalise and, when given,
/// running_mean/var [C] are updated in place with the batch mean of the instance means and
/// unbiased variances; without, the running statistics normalise. weight/bias [C] or undefined.
Tensor instance_norm(const Tensor& x, const Tensor& running_mean = Tensor(),
                     const Tensor& running_var = Tensor(), const Tensor& weight = Tensor(),
                     const Tensor& bias = Tensor(), bool use_input_stats = true,
                     double momentum = 0.1, double eps = 1e-5);

}  // namespace dltrain
