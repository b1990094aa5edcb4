// Matrix products on Eigen (CPU), split across the thread pool by output blocks.
// 16-bit floats are computed in float and rounded once at the end.
#pragma once

#include "dltrain/core/tensor.hpp"

namespace dltrain {

/// [n,k] x [k,m] -> [n,m].
Tensor mm(const Tensor& a, const Tensor& b);
/// [b,n,k] x [b,k,m] -> [b,n,m].
Tensor bmm(const Tensor& a, const Tensor& b);
/// NumPy matmul: 1-d/2-d/batched with broadcasting of the batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
/// x [..., in] times weight [out, in] transposed, plus bias [out] if defined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace dltrain
