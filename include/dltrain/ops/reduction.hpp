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
/// log(sum(exp(x))) over `dims` (empty: all), computed as m + log(sum(exp(x - m))) with m the
/// maximum (infinite maxima replaced by 0, as PyTorch). Floating x.
Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim = false);
/// Inclusive cumulative sum along dim; integer and bool inputs give int64. Floating sums
/// accumulate in double on the CPU and in float (double for f64) on CUDA, one line per thread.
Tensor cumsum(const Tensor& x, int64_t dim);
/// Product of all elements (0-d); integer and bool inputs give int64.
Tensor prod(const Tensor& x);
/// Product over one dim. The gradient is g * (product of the other elements of the line),
/// exact with zeros.
Tensor prod(const Tensor& x, int64_t dim, bool keepdim = false);
/// Vector p-norm over `dims` (empty: all): p = 2 (default), 1, any p > 1, INFINITY (max |x|),
/// or 0 (count of non-zeros, no gradient). Floating x; 16-bit inputs compute in f32 and
/// return their dtype. Gradients as torch.linalg.vector_norm (0 where the norm is 0; for
/// INFINITY split between the elements reaching the maximum).
Tensor norm(const Tensor& x, double p = 2.0, const Shape& dims = {}, bool keepdim = false);
/// Whether any / all elements are non-zero (NaN is non-zero) over `dims` (empty: all); bool.
Tensor any(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor all(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
/// Sums `x` down to `shape` (the inverse of broadcasting; used by backward formulas).
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace dltrain
