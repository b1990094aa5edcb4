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
/// A copy of x with alpha * src added at `index` (1-d) along dim (torch.index_add): src has
/// x's shape except index.numel() along dim; repeated indices add up. 16-bit floats accumulate
/// in f32 and round once. Deterministic on the CPU; on CUDA atomics make the order of repeated
/// additions unspecified (f32/f64 results may differ in the last bits between runs).
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                 double alpha = 1.0);

/// How scatter_reduce combines the values that land on one position.
enum class ScatterReduce { Sum, Mean, Amax, Amin };

/// torch.scatter_reduce: a copy of x where each src[c] (c over index's positions) is combined
/// into position c with coordinate `dim` replaced by index[c]. include_self = false leaves x's
/// value out of every position that receives at least one src value (positions that receive
/// none keep x). Mean divides by the number of values combined (x counting as one with
/// include_self). Floating dtypes; 16-bit floats accumulate in f32 and round once. Gradients as
/// PyTorch: amax/amin split the gradient evenly between every value equal to the result
/// (x's value counted even with include_self = false, as torch does). Deterministic on the
/// CPU; on CUDA Sum/Mean add with atomics (order unspecified, last-bit differences between
/// runs), Amax/Amin are deterministic except for the sign of a zero. NaN propagates.
Tensor scatter_reduce(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                      ScatterReduce reduce, bool include_self = true);
/// Row-wise maximum of src [E, ...] per segment id [E] -> [num_segments, ...]; empty segments
/// give 0 (PyG's scatter(..., reduce="max")). The gradient goes to the maxima (split between
/// ties, as scatter_reduce's Amax with include_self = false on zeros).
Tensor segment_max(const Tensor& src, const Tensor& segment_ids, int64_t num_segments);
/// Softmax of src [E, ...] over the rows sharing a segment id (PyG's softmax(src, index):
/// attention weights of the edges entering each node): exp(src - max) / (sum + 1e-16), the
/// max and sum taken per segment and column. Differentiable in src.
Tensor segment_softmax(const Tensor& src, const Tensor& segment_ids, int64_t num_segments);
/// Coordinates of the non-zero elements (NaN counts as non-zero), int64 [n, x.dim()], in
/// row-major order. On CUDA the count is read back to size the output: one host sync.
Tensor nonzero(const Tensor& x);
/// int64 one-hot encoding [*, num_classes] (num_classes = max + 1 when negative).
Tensor one_hot(const Tensor& indices, int64_t num_classes = -1);

}  // namespace dltrain
