// CUDA entry points of the deep-learning-primitives family: convolution and batch norm
// through cuDNN (dnn_conv.cpp, dnn_norm_pool.cpp), layer norm, pooling and per-channel sums
// as kernels (kernels/dnn_norm.cu, kernels/dnn_pool.cu); refusals from entry.hpp. Internal
// header, no CUDA types. Callers (src/ops) check shapes, dtypes and devices and allocate the
// outputs; these functions only compute, on the current stream of the tensors' device.
//
// Layouts: "dense 4-d" below means contiguous in NCHW or channels-last (NHWC) order; the
// operands of one call share one of the two (cuDNN is told which). Pooling kernels take any
// strides (they read each operand's own), and are coalesced for NCHW and NHWC alike.
#pragma once

#include <cstdint>

#include "dltrain/core/tensor.hpp"
#include "dltrain/ops/conv.hpp"
#include "src/backend/cuda/entry.hpp"

namespace dltrain::backend::cuda {

// --- convolution (cuDNN) -------------------------------------------------------------------

struct ConvParams {
  Int2 stride, padding, dilation;
  int64_t groups = 1;
};

/// y = conv2d(x, w) + bias. x [N, C, H, W], w [K, C/groups, kh, kw], y [N, K, Ho, Wo]: dense
/// 4-d in one layout and one dtype (f32, f16, bf16; f64 in NCHW); bias [K] of that dtype or
/// undefined.
DLTRAIN_CUDA_ENTRY(void, conv2d_forward,
                   (const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const ConvParams& p),
                   "conv2d on a CUDA tensor");
/// gx = the gradient of conv2d with respect to its input, from gy and w (layouts as above).
DLTRAIN_CUDA_ENTRY(void, conv2d_backward_data,
                   (const Tensor& gx, const Tensor& gy, const Tensor& w, const ConvParams& p),
                   "conv2d backward on a CUDA tensor");
/// gw = the gradient of conv2d with respect to its weight, from gy and x (layouts as above).
DLTRAIN_CUDA_ENTRY(void, conv2d_backward_filter,
                   (const Tensor& gw, const Tensor& gy, const Tensor& x, const ConvParams& p),
                   "conv2d backward on a CUDA tensor");

/// out[c] = sum of g over every dim but dim 1: g is [M, C] contiguous, or [N, C, ...]
/// contiguous, or 4-d channels-last; out is a contiguous [C] tensor of any floating dtype.
/// Accumulates in f32 (f64 for f64), in a fixed order (deterministic). Bias gradients.
DLTRAIN_CUDA_ENTRY(void, channel_sum, (const Tensor& out, const Tensor& g),
                   "a bias gradient on a CUDA tensor");

// --- batch norm (cuDNN; eval-mode backward as kernels) ------------------------------------
//
// x, y, gx, gy: [N, C, H, W] dense 4-d in one layout, one dtype (f32, f16, bf16, f64);
// 2-d/3-d/5-d inputs are viewed as [N, C, S, 1] by the caller. Per-channel tensors [C]
// (weight, bias, running and saved statistics, parameter gradients) are contiguous f32
// (f64 when x is f64).

/// Training: normalises with batch statistics, writes save_mean / save_invstd (for the
/// backward) and, when running_mean is defined, updates running_mean / running_var in place
/// with factor `momentum` (running_var from the unbiased batch variance).
DLTRAIN_CUDA_ENTRY(void, batch_norm_forward_training,
                   (const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Tensor& running_mean, const Tensor& running_var, double momentum,
                    double eps, const Tensor& save_mean, const Tensor& save_invstd),
                   "batch_norm on a CUDA tensor");
/// Evaluation: normalises with the running statistics.
DLTRAIN_CUDA_ENTRY(void, batch_norm_forward_inference,
                   (const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Tensor& running_mean, const Tensor& running_var, double eps),
                   "batch_norm on a CUDA tensor");
/// Backward of the training forward: gx, gweight, gbias from gy, x, weight and the saved
/// statistics.
DLTRAIN_CUDA_ENTRY(void, batch_norm_backward,
                   (const Tensor& gx, const Tensor& gweight, const Tensor& gbias, const Tensor& gy,
                    const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                    const Tensor& save_invstd, double eps),
                   "batch_norm backward on a CUDA tensor");
/// Backward of the evaluation forward (statistics are constants): gx = gy * weight * invstd,
/// gweight = sum gy * xhat, gbias = sum gy; gx, gweight or gbias may be undefined (skipped).
DLTRAIN_CUDA_ENTRY(void, batch_norm_backward_eval,
                   (const Tensor& gx, const Tensor& gweight, const Tensor& gbias, const Tensor& gy,
                    const Tensor& x, const Tensor& weight, const Tensor& running_mean,
                    const Tensor& running_var, double eps),
                   "batch_norm backward on a CUDA tensor");

// --- layer norm (kernels) -------------------------------------------------------------------
//
// x, y, gx, gy: contiguous, viewed as [R, D] rows; weight/bias [D] contiguous in the
// accumulation type (f32, or f64 for f64 inputs) or undefined; mean/rstd [R] in that type.

DLTRAIN_CUDA_ENTRY(void, layer_norm_forward,
                   (const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                    const Tensor& weight, const Tensor& bias, int64_t D, double eps),
                   "layer_norm on a CUDA tensor");
/// gx (may be undefined), gweight / gbias ([D], accumulation type, may be undefined).
DLTRAIN_CUDA_ENTRY(void, layer_norm_backward,
                   (const Tensor& gx, const Tensor& gweight, const Tensor& gbias, const Tensor& gy,
                    const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                    int64_t D),
                   "layer_norm backward on a CUDA tensor");

// --- pooling (kernels) ----------------------------------------------------------------------

struct PoolParams {
  Int2 kernel, stride, padding, dilation;
};

/// Max pooling of x [N, C, H, W] into y [N, C, Ho, Wo] (PyTorch's rule: -inf padding, the
/// first maximum of a window wins, a NaN wins over everything). indices (same shape as y):
/// i64 flat positions h * W + w in the plane (-1 for an empty window), or u8 positions
/// i * kW + j inside the window (255 for an empty window; needs kH * kW < 255).
DLTRAIN_CUDA_ENTRY(void, max_pool2d_forward,
                   (const Tensor& y, const Tensor& indices, const Tensor& x, const PoolParams& p),
                   "max_pool2d on a CUDA tensor");
/// gx [N, C, H, W] = the gradient routed to each window's maximum (written entirely).
DLTRAIN_CUDA_ENTRY(void, max_pool2d_backward,
                   (const Tensor& gx, const Tensor& gy, const Tensor& indices, const PoolParams& p),
                   "max_pool2d backward on a CUDA tensor");
/// Average pooling with the CPU's window and divisor rules (see src/ops/pool.cpp).
DLTRAIN_CUDA_ENTRY(void, avg_pool2d_forward,
                   (const Tensor& y, const Tensor& x, const PoolParams& p, bool count_include_pad),
                   "avg_pool2d on a CUDA tensor");
DLTRAIN_CUDA_ENTRY(void, avg_pool2d_backward,
                   (const Tensor& gx, const Tensor& gy, const PoolParams& p,
                    bool count_include_pad),
                   "avg_pool2d backward on a CUDA tensor");
/// Adaptive average pooling to y's spatial size (windows [floor(o*In/Out), ceil((o+1)*In/Out))).
DLTRAIN_CUDA_ENTRY(void, adaptive_avg_pool2d_forward, (const Tensor& y, const Tensor& x),
                   "adaptive_avg_pool2d on a CUDA tensor");
DLTRAIN_CUDA_ENTRY(void, adaptive_avg_pool2d_backward, (const Tensor& gx, const Tensor& gy),
                   "adaptive_avg_pool2d backward on a CUDA tensor");

}  // namespace dltrain::backend::cuda
