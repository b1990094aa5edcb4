// Argument checks shared by the ops (internal header).
#pragma once

#include <initializer_list>

#include "dltrain/core/tensor.hpp"
#include "src/amp/dispatch.hpp"

namespace dltrain::detail {

/// Throws unless every defined tensor is on the same device.
void check_same_device(const char* op, std::initializer_list<const Tensor*> ts);
/// Throws unless `t` is defined.
void check_defined(const char* op, const Tensor& t, const char* name);
/// The CUDA backend of this op is not in this build: throw a clear error for a CUDA tensor.
void require_cpu(const char* op, std::initializer_list<const Tensor*> ts);
/// Throws unless t has `n` dimensions.
void check_dim(const char* op, const Tensor& t, int64_t n, const char* name);
/// Throws unless a loss's elementwise target has the input's shape: broadcasting them
/// (a [N, 1, H, W] prediction against a [N, H, W] target) silently computes another loss
/// (issue 28). The error names both shapes, the shape broadcasting would give, the
/// squeeze/unsqueeze that matches them, and target.expand(input.shape()) for callers who
/// mean to broadcast.
void check_loss_target_shape(const char* op, const Tensor& input, const Tensor& target);

/// `g` placed into zeros of `shape` (its leading block): the gradient of a source larger than
/// the index that used it (scatter_add, scatter_reduce). `g` itself when the shapes agree.
Tensor zero_pad_to(const Tensor& g, const Shape& shape);

/// A contiguous tensor seen as [outer, L, inner] around dimension `dim`: the sizes before,
/// at and after it (the reductions, softmaxes, scans and gathers along one dimension).
struct Lines {
  int64_t outer = 1, L = 1, inner = 1;
};
inline Lines lines_of(const Shape& shape, int64_t dim) {
  Lines s;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < dim)
      s.outer *= shape[d];
    else if (d == dim)
      s.L = shape[d];
    else
      s.inner *= shape[d];
  }
  return s;
}

}  // namespace dltrain::detail
