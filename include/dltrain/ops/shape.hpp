// Joining and splitting tensors. (View ops are Tensor methods: view, reshape,
// permute, transpose, narrow, slice, select, expand, squeeze, unsqueeze, flatten.)
#pragma once

#include <vector>

#include "dltrain/core/tensor.hpp"

namespace dltrain {

/// Concatenation along dim; all other sizes must match.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Stacking along a new dim; all shapes must match.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Views of `split_size` along dim (the last may be smaller).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
/// Views of the given sizes along dim (they must sum to the dim's size).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
/// `chunks` nearly equal views along dim (torch.chunk semantics).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

/// x tiled `repeats[d]` times along each dim (torch.repeat): repeats may have more entries
/// than x has dims (x gets leading size-1 dims). A copy; the gradient sums the tiles.
Tensor repeat(const Tensor& x, const Shape& repeats);
/// x reversed along each of `dims` (a copy).
Tensor flip(const Tensor& x, const Shape& dims);
/// x shifted cyclically by shifts[i] along dims[i] (torch.roll); with dims empty, x is
/// flattened, rolled by the one shift and reshaped back.
Tensor roll(const Tensor& x, const Shape& shifts, const Shape& dims = {});
/// The lower / upper triangle of the last two dims (elements with col - row <= diagonal for
/// tril, >= diagonal for triu), zeros elsewhere; any dtype, batched over leading dims.
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);

}  // namespace dltrain
