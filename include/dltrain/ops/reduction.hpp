// Reductions over all or some dimensions, with keepdim, and their gradients.
// Floating inputs reduce in their accumulation type (float for f16/bf16,
// double for f64); integer sums reduce in int64.
#pragma once

#include <utility>

#include "dltrain/core/tensor.hpp"

namespace dltrain {

/// Sum of all elements (0-d).
Tensor sum(const Tensor& x);
/// Sum over `dims` (negative dims allowed); keepdim keeps them as size 1.
Tensor sum(const Tensor& x, const Shape& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim = false);
/// Variance over dims with Bessel's `correction` (1 = unbiased, 0 = population).
Tensor var(const Tensor& x, const Shape& dims, int64_t correction = 1, bool keepdim = false);
/// Standard deviation (sqrt of var).
Tensor stddev(const Tensor& x, const Shape& dims, int64_t correction = 1, bool keepdim = false);
/// Max / min over one dim: (values, int64 indices of the first extreme).
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
/// Max / min of all elements (0-d); the gradient is split evenly between ties.
Tensor max(const Tensor& x);
Tensor min(const Tensor& x);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
/// Sums `x` down to `shape` (the inverse of broadcasting; used by backward formulas).
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace dltrain
