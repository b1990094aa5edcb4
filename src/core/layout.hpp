// Layout helpers shared by the CPU ops, the optimizers, AMP, the process groups and the CUDA
// kernels (internal header, not installed): the density predicate and view construction.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "dltrain/core/tensor.hpp"

namespace dltrain::detail {

/// True when t's elements fill [data_ptr, data_ptr + numel) exactly once, in any dim order
/// (contiguous, channels-last or another permutation): such a tensor can be processed as one
/// flat array, and two of them with equal strides can be copied as bytes.
inline bool is_dense(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims with size > 1
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) return true;
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

/// A view of base's storage with the given shape, strides (elements) and storage offset; no
/// bounds check (callers compute valid geometry) and no autograd link.
inline Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(impl);
}

}  // namespace dltrain::detail
