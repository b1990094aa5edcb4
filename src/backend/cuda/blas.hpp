// CUDA entry points of the matrix-product family (internal header, no CUDA types; cuBLASLt
// implementation in blas.cpp, refusals from entry.hpp). Callers (src/ops/linalg.cpp) check
// shapes, dtypes and devices and allocate the output; these functions only compute, on the
// current stream of the device.
#pragma once

#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/entry.hpp"

namespace dltrain::backend::cuda {

/// out[i] = a[i] x b[i] (+ bias broadcast over rows) for every i < B, through cuBLASLt.
/// a [B, n, k], b [B, k, m], out [B, n, m] contiguous, bias [m] or undefined; one floating
/// dtype (f32, f64, f16, bf16; 16-bit operands accumulate in f32), one CUDA device. Operands
/// may have any strides: row- or column-major matrices (transposed views) are used in place,
/// a batch stride of 0 repeats a matrix, anything else is copied contiguous first. f32 uses
/// TF32 tensor cores when dltrain::cuda::allow_tf32().
DLTRAIN_CUDA_ENTRY(void, gemm,
                   (const Tensor& out, const Tensor& a, const Tensor& b,
                    const Tensor& bias = Tensor()),
                   "matrix product on a CUDA tensor");

}  // namespace dltrain::backend::cuda
