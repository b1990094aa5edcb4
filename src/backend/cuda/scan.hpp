// CUDA entry points of the line ops (internal header, no CUDA types): scans and products along
// one dim (cumsum, prod and their gradients), segmented sorting (sort, argsort, topk) and the
// writing pass of nonzero. Kernels in kernels/scan.cu and kernels/sort.cu, refusals
// from entry.hpp. Callers (src/ops/reduction_extra.cpp, sort.cpp, rearrange.cpp) check
// arguments and allocate contiguous outputs on the input's device.
#pragma once

#include <cstdint>

#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/entry.hpp"

namespace dltrain::backend::cuda {

/// What line_scan computes along L for each (outer, inner) line of a contiguous
/// [outer, L, inner] input.
enum class LineOp {
  CumSum,         // out[l] = x[0] + ... + x[l]
  CumSumReverse,  // out[l] = x[l] + ... + x[L-1]
  Prod,           // out [outer, inner] = x[0] * ... * x[L-1]
  ProdOthers,     // out[l] = product of x[k] for k != l (prod's gradient, exact with zeros)
};
/// out = op(x) for x contiguous [outer, L, inner] (f16, bf16, f32, f64 or i64), out contiguous
/// of x's dtype ([outer, inner] for Prod). Floating lines accumulate in float (double for f64).
DLTRAIN_CUDA_ENTRY(void, line_scan,
                   (const Tensor& out, const Tensor& x, int64_t outer, int64_t L, int64_t inner,
                    LineOp op),
                   "cumsum/prod on a CUDA tensor");
/// indices (int64 contiguous [lines, L]) = the stable order that sorts each row of x
/// (contiguous [lines, L], any dtype but bool), NaN above everything.
DLTRAIN_CUDA_ENTRY(void, sort_lines,
                   (const Tensor& indices, const Tensor& x, int64_t lines, int64_t L,
                    bool descending),
                   "sort on a CUDA tensor");
/// nonzero's writing pass: for every element i of mask (bool, contiguous, shape `shape`) that
/// is true, writes its coordinates to row csum[i] - 1 of out (int64 contiguous [n, ndim]);
/// csum is the inclusive int64 cumsum of mask.
DLTRAIN_CUDA_ENTRY(void, nonzero_write,
                   (const Tensor& out, const Tensor& mask, const Tensor& csum, const Shape& shape),
                   "nonzero on a CUDA tensor");

}  // namespace dltrain::backend::cuda
