// Gathering and scattering by index: the building blocks of embeddings and
// GNN message passing. Index tensors are int64 (int32 accepted). On the CPU every index
// is bounds-checked and a bad one raises dltrain::Error naming it. On CUDA a check would
// need a device-to-host sync per call, so indices are not checked there: an out-of-range
// gather/index_select reads NaN (0 for integer dtypes) and a scatter drops that element;
// validate indices on the CPU (or run once on the CPU) when they come from untrusted data.
#pragma once

#include <optional>

#include "dltrain/core/tensor.hpp"

namespace dltrain {

/// Rows of `weight` [num, dim] picked by `indices` (any shape) -> [*indices.shape, dim].
/// Rows equal to padding_idx get no gradient.
Tensor embedding(const Tensor& weight, const Tensor& indices,
                 std::optional<int64_t> padding_idx = std::nullopt);
/// Slices of x along dim at the 1-d `index`.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
/// out[i][j][k] = x[i][index[i][j][k]][k] for dim = 1 (torch.gather semantics).
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
/// A copy of x with src added at index along dim (torch.scatter_add semantics).
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
/// Sums rows of src [E, ...] into num_segments rows by segment id [E]: out[s] = sum_{ids[e]=s}
/// src[e]. Ids need not be sorted (GNN aggregation of edge messages into nodes).
Tensor segment_sum(const Tensor& src, const Tensor& segment_ids, int64_t num_segments);
/// Like segment_sum divided by each segment's count (empty segments give 0).
Tensor segment_mean(const Tensor& src, const Tensor& segment_ids, int64_t num_segments);
/// int64 one-hot encoding [*, num_classes] (num_classes = max + 1 when negative).
Tensor one_hot(const Tensor& indices, int64_t num_classes = -1);

}  // namespace dltrain
