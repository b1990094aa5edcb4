// CUDA entry points of the reduction family: sums over any set of dims, max/min with the
// index of the first extreme along one dim, and the scatter that routes a max/min gradient
// back (internal header, no CUDA types; kernels in kernels/reduce.cu, refusals
// from entry.hpp). Callers (src/ops/reduction.cpp) check arguments and allocate outputs;
// these functions only compute, on the current stream of the device, never synchronising
// the host.
//
// Outputs are passed as keepdim views: they have x's rank, and each dim equals x's (kept)
// or is 1 (reduced). They may have any strides. Results are deterministic for a given
// device (fixed reduction order, no atomics).
#pragma once

#include <cstdint>

#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/entry.hpp"

namespace dltrain::backend::cuda {

/// out = sum of x over the dims where out has size 1 and x does not. Accumulates in float
/// (f16, bf16, f32), double (f64) or int64 (integers); out's dtype is x's for floating x and
/// i64 for integer x (convert bool to u8 first). An empty reduction writes 0.
DLTRAIN_CUDA_ENTRY(void, sum, (const Tensor& out, const Tensor& x), "sum");

/// Max (is_max) or min of x along `dim` (x non-empty, any numeric dtype): values (x's dtype)
/// and indices (i64), keepdim views with equal strides. The index is the first extreme's; a
/// NaN counts as the extreme (the first NaN wins), as on the CPU.
DLTRAIN_CUDA_ENTRY(void, extreme,
                   (const Tensor& values, const Tensor& indices, const Tensor& x, int64_t dim,
                    bool is_max),
                   is_max ? "max" : "min");

/// grad_in[..., indices[...], ...] = grad[...] along `dim`: the gradient of max/min over a dim.
/// grad_in has the input's shape and is zero-filled by the caller; grad (grad_in's floating
/// dtype) and indices (i64) have the keepdim shape.
DLTRAIN_CUDA_ENTRY(void, extreme_backward,
                   (const Tensor& grad_in, const Tensor& grad, const Tensor& indices, int64_t dim),
                   "max/min backward");

}  // namespace dltrain::backend::cuda
