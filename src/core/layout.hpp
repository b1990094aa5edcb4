// Layout helpers shared by the CPU ops, the optimizers, AMP, the process groups and the CUDA
// kernels (internal header, not installed): the density predicate, view construction and the
// overlap test of copies.
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

/// How the memory `dst` and `src` address relates, for a copy from `src` (broadcast to dst's
/// shape) into `dst`: None (disjoint byte ranges, or different devices), Full (every element
/// of dst is the very element of src the copy would read into it: same dtype, same address,
/// same strides, so copying is a no-op), or Partial (the ranges of bytes the two span
/// intersect any other way: a shifted or transposed view of the same storage). Partial is
/// conservative: interleaved views whose elements never coincide (the even and the odd
/// columns) report it too.
enum class Overlap { None, Full, Partial };
inline Overlap memory_overlap(const Tensor& dst, const Tensor& src) {
  if (dst.device() != src.device() || dst.numel() == 0 || src.numel() == 0) return Overlap::None;
  // [lowest byte, one past the highest byte] of t's elements.
  auto span = [](const Tensor& t) {
    const auto base = reinterpret_cast<uintptr_t>(t.data_ptr());
    const auto es = static_cast<int64_t>(t.element_size());
    int64_t lo = 0, hi = 0;
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t reach = (t.size(d) - 1) * t.stride(d) * es;
      (reach < 0 ? lo : hi) += reach;
    }
    return std::make_pair(base + static_cast<uintptr_t>(lo),
                          base + static_cast<uintptr_t>(hi + es));
  };
  const auto [d0, d1] = span(dst);
  const auto [s0, s1] = span(src);
  if (d1 <= s0 || s1 <= d0) return Overlap::None;
  bool same =
      dst.data_ptr() == src.data_ptr() && dst.dtype() == src.dtype() && src.dim() <= dst.dim();
  for (int64_t d = 0; same && d < dst.dim(); ++d) {
    if (dst.size(d) == 1) continue;                  // a size-1 dim's stride addresses nothing
    const int64_t sd = d - (dst.dim() - src.dim());  // src's dim aligned with d, if any
    const int64_t s_stride = sd < 0 || src.size(sd) == 1 ? 0 : src.stride(sd);
    same = s_stride == dst.stride(d);
  }
  return same ? Overlap::Full : Overlap::Partial;
}

}  // namespace dltrain::detail
