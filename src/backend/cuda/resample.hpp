// CUDA entry points of interpolate and of reflect/replicate pad (internal header, no CUDA types;
// kernels in kernels/resample.cu, refusals from entry.hpp). The caller (src/ops/resample.cpp)
// checks arguments and allocates; taps and weights come from src/ops/resample_index.hpp, computed
// in the kernels (no tables, no copies, no host synchronisation).
#pragma once

#include <cstdint>

#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/entry.hpp"

namespace dltrain::backend::cuda {

/// One 2-d resize [N, C, H, W] -> [N, C, Ho, Wo]. scale_h / scale_w: 1/scale_factor when the
/// user gave a scale factor, else 0 (then in/out).
struct Upsample2d {
  int64_t N, C, H, W, Ho, Wo;
  bool bilinear, align_corners;
  double scale_h, scale_w;
};

/// y = interpolate(x): x any strides, y dense NCHW or channels-last, one floating dtype.
DLTRAIN_CUDA_ENTRY(void, upsample2d_forward,
                   (const Tensor& y, const Tensor& x, const Upsample2d& p),
                   "interpolate on a CUDA device");
/// acc += the adjoint of interpolate applied to gy: acc is the f32 (f64 for f64 gy) gradient
/// accumulator [N, C, H, W], dense NCHW or channels-last and zero-filled by the caller; gy any
/// strides. Atomic adds: the summation order, so the last bits, may vary between runs.
DLTRAIN_CUDA_ENTRY(void, upsample2d_backward,
                   (const Tensor& acc, const Tensor& gy, const Upsample2d& p),
                   "interpolate's backward on a CUDA device");

/// Reflect or replicate padding of the last two dims: [N, C, H, W] -> [N, C, Ho, Wo], `top`
/// rows and `left` columns in front (src/ops/resample_index.hpp's pad_index).
struct Pad2d {
  int64_t N, C, H, W, Ho, Wo, top, left;
  bool reflect;
};
/// y = pad(x): x any strides, y dense NCHW or channels-last, one dtype (any floating).
DLTRAIN_CUDA_ENTRY(void, pad2d_forward, (const Tensor& y, const Tensor& x, const Pad2d& p),
                   "reflect/replicate pad on a CUDA device");
/// acc += the adjoint of pad applied to gy (acc and gy as for upsample2d_backward).
DLTRAIN_CUDA_ENTRY(void, pad2d_backward, (const Tensor& acc, const Tensor& gy, const Pad2d& p),
                   "reflect/replicate pad's backward on a CUDA device");

}  // namespace dltrain::backend::cuda
