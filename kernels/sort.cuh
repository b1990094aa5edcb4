// Segmented sorting on CUDA, split by key dtype (entry point sort_lines in
// src/backend/cuda/scan.hpp, dispatched in kernels/sort.cu). The 14 CUB instantiations
// (StableSortPairs and StableSortPairsDescending for 7 dtypes) were one of the build's longest
// jobs in one file; they are in two, kernels/sort_float.cu (f32, f64, f16, bf16) and
// kernels/sort_int.cu (i32, i64, u8), which compile in parallel. (Measured for sm_90 alone on
// the 2-core dev machine: 91 s of CPU in one file; 49 + 46 s in two; one file per dtype took
// 17 to 24 s each but 145 s in all, each file parsing CUB and the tensor headers again.)
//
// This header only declares the per-dtype function; kernels/sort_impl.cuh defines it (and
// includes CUB), and only sort_float.cu and sort_int.cu include that.
#pragma once

#include <cstdint>

#include "dltrain/core/tensor.hpp"

namespace dltrain::backend::cuda {

/// sort_lines for keys of device element type T (float, double, __half, __nv_bfloat16,
/// int32_t, int64_t, uint8_t), explicitly instantiated in kernels/sort_{float,int}.cu.
template <class T>
void sort_lines_as(const Tensor& indices, const Tensor& x, int64_t lines, int64_t L,
                   bool descending);

}  // namespace dltrain::backend::cuda
