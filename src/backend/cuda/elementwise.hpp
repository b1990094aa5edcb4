// CUDA entry points of the elementwise family: copy/convert, unary, binary, ternary maps
// (internal header, no CUDA types; kernels in kernels/copy.cu and kernels/elementwise.cu,
// stubs in stub_elementwise.cpp). Callers (src/ops) check shapes, devices and dtypes and
// allocate outputs; these functions only compute, on the current stream of the device.
#pragma once

#include "dltrain/core/tensor.hpp"

namespace dltrain::backend::cuda {

/// dst[...] = convert(src[...]): src broadcast to dst's shape, any strides and dtypes, both
/// on the same CUDA device.
void copy(const Tensor& dst, const Tensor& src);

}  // namespace dltrain::backend::cuda
