// Pieces of clip_grad_norm_ (src/optim/clip_grad.cpp) for norms taken over gradients spread
// across processes (distributed::clip_grad_norm_ of ZeRO): the partial sum of one process's
// share, then the clipping from the combined partial sums.
#pragma once

#include <vector>

#include "dltrain/core/tensor.hpp"

namespace dltrain::optim::detail {

/// Over the defined gradients of `params` (one device): sum |g|^p in double, or max |g| when
/// norm_type is infinite (a NaN wins). CPU: fixed chunk order; CUDA: the device's norm raised
/// back to the power p (one host sync).
double grad_norm_partial(const std::vector<Tensor>& params, double norm_type, const char* op);
/// The total norm from the combined partial sums (partial^(1/p), or partial for infinity);
/// scales the defined gradients of `params` by min(1, max_norm / (total + 1e-6)) as
/// clip_grad_norm_ does (a NaN total poisons them); returns the total.
double clip_from_partial(const std::vector<Tensor>& params, double max_norm, double norm_type,
                         double partial, bool error_if_nonfinite);

}  // namespace dltrain::optim::detail
