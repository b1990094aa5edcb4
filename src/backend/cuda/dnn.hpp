// CUDA entry points of the deep-learning-primitives family: convolution and batch norm
// through cuDNN (dnn_conv.cpp, dnn_norm_pool.cpp), layer norm, pooling and per-channel sums
// as kernels (kernels/dnn_norm.cu, kernels/dnn_pool.cu); stubs in stub_dnn.cpp. Internal
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

namespace dltrain::backend::cuda {

// --- convolution (cuDNN) -------------------------------------------------------------------

struct ConvParams {
  Int2 stride, padding, dilation;
  int64_t groups = 1;
};

/// y = conv2d(x, w) + bias. x [N, C, H, W], w [K, C/groups, kh, kw], y [N, K, Ho, Wo]: dense
/// 4-d in one layout and one dtype (f32, f16, bf16; f64 in NCHW); bias [K] of that dtype or
/// undefined.
void conv2d_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const ConvParams& p);
/// gx = the gradient of conv2d with respect to its input, from gy and w (layouts as above).
void conv2d_backward_data(const Tensor& gx, const Tensor& gy, const Tensor& w, const ConvParams& p);
/// gw = the gradient of conv2d with respect to its weight, from gy and x (layouts as above).
void conv2d_backward_filter(const Tensor& gw, const Tensor& gy, const Tensor& x,
                            const ConvParams& p);

/// out[c] = sum of g over every dim but dim 1: g is [M, C] contiguous, or [N, C, ...]
/// contiguous, or 4-d channels-last; out is a contiguous [C] tensor of any floating dtype.
/// Accumulates in f32 (f64 for f64), in a fixed order (deterministic). Bias gradients.
void channel_sum(const Tensor& out, const Tensor& g);

// --- batch norm (cuDNN; eval-mode backward as kernels) ------------------------------------
//
// x, y, gx, gy: [N, C, H, W] dense 4-d in one layout, one dtype (f32, f16, bf16, f64);
// 2-d/3-d/5-d inputs are viewed as [N, C, S, 1] by the caller. Per-channel tensors [C]
// (weight, bias, running and saved statistics, parameter gradients) are contiguous f32
// (f64 when x is f64).

/// Training: normalises with batch statistics, writes save_mean / save_invstd (for the
/// backward) and, when running_mean is defined, updates running_mean / running_var in place
/// with factor `momentum` (running_var from the unbiased batch variance).
void batch_norm_forward_training(const Tensor& y, const Tensor& x, const Tensor& weight,
                                 const Tensor& bias, const Tensor& running_mean,
                                 const Tensor& running_var, double momentum, double eps,
                                 const Tensor& save_mean, const Tensor& save_invstd);
/// Evaluation: normalises with the running statistics.
void batch_norm_forward_inference(const Tensor& y, const Tensor& x, const Tensor& weight,
                                  const Tensor& bias, const Tensor& running_mean,
                                  const Tensor& running_var, double eps);
/// Backward of the training forward: gx, gweight, gbias from gy, x, weight and the saved
/// statistics.
void batch_norm_backward(const Tensor& gx, const Tensor& gweight, const Tensor& gbias,
                         const Tensor& gy, const Tensor& x, const Tensor& weight,
                         const Tensor& save_mean, const Tensor& save_invstd, double eps);
/// Backward of the evaluation forward (statistics are constants): gx = gy * weight * invstd,
/// gweight = sum gy * xhat, gbias = sum gy; gx, gweight or gbias may be undefined (skipped).
void batch_norm_backward_eval(const Tensor& gx, const Tensor& gweight, const Tensor& gbias,
                              const Tensor& gy, const Tensor& x, const Tensor& weight,
                              const Tensor& running_mean, const Tensor& running_var, double eps);

// --- layer norm (kernels) -------------------------------------------------------------------
//
// x, y, gx, gy: contiguous, viewed as [R, D] rows; weight/bias [D] contiguous in the
// accumulation type (f32, or f64 for f64 inputs) or undefined; mean/rstd [R] in that type.

void layer_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, int64_t D, double eps);
/// gx (may be undefined), gweight / gbias ([D], accumulation type, may be undefined).
void layer_norm_backward(const Tensor& gx, const Tensor& gweight, const Tensor& gbias,
                         const Tensor& gy, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& rstd, int64_t D);

// --- pooling (kernels) ----------------------------------------------------------------------

struct PoolParams {
  Int2 kernel, stride, padding, dilation;
};

/// Max pooling of x [N, C, H, W] into y [N, C, Ho, Wo] (PyTorch's rule: -inf padding, the
/// first maximum of a window wins, a NaN wins over everything). indices (same shape as y):
/// i64 flat positions h * W + w in the plane (-1 for an empty window), or u8 positions
/// i * kW + j inside the window (255 for an empty window; needs kH * kW < 255).
void max_pool2d_forward(const Tensor& y, const Tensor& indices, const Tensor& x,
                        const PoolParams& p);
/// gx [N, C, H, W] = the gradient routed to each window's maximum (written entirely).
void max_pool2d_backward(const Tensor& gx, const Tensor& gy, const Tensor& indices,
                         const PoolParams& p);
/// Average pooling with the CPU's window and divisor rules (see src/ops/pool.cpp).
void avg_pool2d_forward(const Tensor& y, const Tensor& x, const PoolParams& p,
                        bool count_include_pad);
void avg_pool2d_backward(const Tensor& gx, const Tensor& gy, const PoolParams& p,
                         bool count_include_pad);
/// Adaptive average pooling to y's spatial size (windows [floor(o*In/Out), ceil((o+1)*In/Out))).
void adaptive_avg_pool2d_forward(const Tensor& y, const Tensor& x);
void adaptive_avg_pool2d_backward(const Tensor& gx, const Tensor& gy);

}  // namespace dltrain::backend::cuda
