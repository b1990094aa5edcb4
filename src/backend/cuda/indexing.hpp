// CUDA entry points of the indexing family: row gathers and scatter-adds (index_select,
// embedding, segment_sum and their gradients), gather / scatter_add along a dim, one_hot and
// segment counts (internal header, no CUDA types; kernels in kernels/indexing.cu, refusals
// from entry.hpp). Callers (src/ops/indexing.cpp) check shapes, dtypes and devices and
// allocate the outputs; index tensors arrive as contiguous int64 on the same device. Indices
// are not range-checked here (that would need a host sync): a gathered element with an
// out-of-range index reads as NaN (0 for integer dtypes), a scattered one is dropped.
// Accumulations use atomics, so the order of repeated-index additions is unspecified.
#pragma once

#include <cstdint>

#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/entry.hpp"

namespace dltrain::backend::cuda {

/// out[o, k, j] = x[o, index[k], j] for x contiguous [outer, L, inner], index [K] and out
/// contiguous [outer, K, inner]; any dtype.
DLTRAIN_CUDA_ENTRY(void, take_rows,
                   (const Tensor& out, const Tensor& x, const Tensor& index, int64_t outer,
                    int64_t L, int64_t inner),
                   "indexing a CUDA tensor");
/// dst[o, index[k], j] += src[o, k, j] for dst contiguous [outer, L, inner] and src contiguous
/// [outer, K, inner] (same numeric dtype), skipping index[k] == skip.
DLTRAIN_CUDA_ENTRY(void, index_add_rows,
                   (const Tensor& dst, const Tensor& src, const Tensor& index, int64_t outer,
                    int64_t L, int64_t inner, int64_t skip),
                   "index_add on a CUDA tensor");
/// torch.gather: out (contiguous, index's shape) at position c = x at c with coordinate `dim`
/// replaced by index[c]; x any strides, index contiguous.
DLTRAIN_CUDA_ENTRY(void, gather_dim,
                   (const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index),
                   "gather on a CUDA tensor");
/// torch.scatter_add into dst (contiguous): for every position c of index (contiguous),
/// dst[c with coordinate `dim` replaced by index[c]] += src[c]; src any strides, at least
/// index's size in every dim; same numeric dtype as dst.
DLTRAIN_CUDA_ENTRY(void, scatter_add_dim,
                   (const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src),
                   "scatter_add on a CUDA tensor");
/// scatter_reduce's amax/amin into dst (contiguous, f32 or f64): for every position c of index
/// (contiguous), dst[c with coordinate `dim` replaced by index[c]] = max (or min) of itself and
/// src[c]; src any strides, same dtype. NaN wins (propagates), as on the CPU.
DLTRAIN_CUDA_ENTRY(void, scatter_extreme_dim,
                   (const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src,
                    bool is_max),
                   "scatter_reduce on a CUDA tensor");
/// out (int64 [n, num_classes], contiguous, zeroed here): out[i, index[i]] = 1.
DLTRAIN_CUDA_ENTRY(void, one_hot, (const Tensor& out, const Tensor& index, int64_t num_classes),
                   "one_hot on a CUDA tensor");
/// counts[s] = max(1, number of e with ids[e] == s) for s < num_segments, converted to
/// counts' dtype (contiguous, num_segments elements).
DLTRAIN_CUDA_ENTRY(void, segment_counts,
                   (const Tensor& counts, const Tensor& ids, int64_t num_segments),
                   "segment_mean on a CUDA tensor");

}  // namespace dltrain::backend::cuda
