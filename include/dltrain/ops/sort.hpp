// Sorting along a dim: sort, argsort and topk. Values are gathered from the input with the
// computed indices, so their gradient is gather's (scattered back to the positions taken).
// NaN sorts above every number (last ascending, first descending), as PyTorch. sort is stable
// on both devices (equal values keep their order); on CUDA each line is sorted by CUB's
// segmented radix sort, on the CPU by std::sort per line with ties broken by position.
#pragma once

#include <utility>

#include "dltrain/core/tensor.hpp"

namespace dltrain {

/// (values, int64 indices) of x sorted along dim, ascending unless `descending`; stable.
std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false);
/// The int64 indices that sort x along dim (stable).
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);
/// (values, int64 indices) of the k largest (or smallest) elements along dim, in sorted order;
/// among equal values the lower index comes first. 0 <= k <= size of dim.
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);

}  // namespace dltrain
