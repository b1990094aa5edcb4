// CUDA entry points of the optimizer family: fused multi-tensor SGD, Adam/AdamW, LARS and LAMB
// updates, and the gradient-clipping passes (internal header, no CUDA types; kernels in
// kernels/optim.cu, refusals from entry.hpp). Callers (src/optim) check dtypes, devices and
// layouts: every tensor of one call is on one CUDA device and dense (its elements fill
// [data_ptr, data_ptr + numel) exactly), and a parameter's gradient and state share its
// layout, so one flat index addresses the same element in all of them. Updates are launched
// as multi-tensor kernels: the tensors' addresses travel in the kernel parameters (up to a
// few dozen tensors and 320 blocks of 64K elements per launch), so nothing is copied to the
// device and nothing syncs the host.
#pragma once

#include <cstdint>
#include <vector>

#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/entry.hpp"

namespace dltrain::backend::cuda {

/// SGD hyper-parameters of one param group (see dltrain/optim/sgd.hpp).
struct SgdHyper {
  double lr = 0, weight_decay = 0, momentum = 0, dampening = 0;
  bool nesterov = false, maximize = false;
};

/// One parameter of an SGD step. momentum_buffer is undefined when momentum == 0; `first`
/// marks a buffer created for this step (it is set to the gradient instead of blended).
struct SgdTensors {
  Tensor param, grad, momentum_buffer;
  bool first = false;
};

/// p -= lr * d with PyTorch's SGD for every tensor (same dtype, f32 or f64, one device).
DLTRAIN_CUDA_ENTRY(void, sgd_step, (const SgdHyper& h, const std::vector<SgdTensors>& ts),
                   "stepping SGD on CUDA parameters");

/// Adam hyper-parameters of one param group (see dltrain/optim/adam.hpp).
struct AdamHyper {
  double lr = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0;
  bool decoupled = false, amsgrad = false, maximize = false;
};

/// One parameter of an Adam step; `step` is its step count including this step (>= 1).
/// max_exp_avg_sq is defined when amsgrad.
struct AdamTensors {
  Tensor param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq;
  int64_t step = 1;
};

/// Adam / AdamW update of every tensor (same dtype, f32 or f64, one device).
DLTRAIN_CUDA_ENTRY(void, adam_step, (const AdamHyper& h, const std::vector<AdamTensors>& ts),
                   "stepping Adam on CUDA parameters");

/// LARS hyper-parameters of one param group (see dltrain/optim/lars.hpp).
struct LarsHyper {
  double lr = 0, weight_decay = 0, momentum = 0, trust_coefficient = 0, eps = 0;
  bool trust_ratio = true;
};

/// One parameter of a LARS step. momentum_buffer (state dtype) is undefined when
/// momentum == 0, and zero-filled before the parameter's first step.
struct LarsTensors {
  Tensor param, grad, momentum_buffer;
};

/// LARS update of every tensor (same dtype, one device): per-tensor norms (one multi-tensor
/// pass writing per-chunk partial sums to the device), then the update, whose blocks read
/// their tensor's partials; no host synchronisation.
DLTRAIN_CUDA_ENTRY(void, lars_step, (const LarsHyper& h, const std::vector<LarsTensors>& ts),
                   "stepping LARS on CUDA parameters");

/// LAMB hyper-parameters of one param group (see dltrain/optim/lamb.hpp).
struct LambHyper {
  double lr = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0, max_trust_ratio = 0;
  bool trust_ratio = true;
};

/// One parameter of a LAMB step; `step` counts this step (>= 1). The moments are zero-filled
/// before the first step.
struct LambTensors {
  Tensor param, grad, exp_avg, exp_avg_sq;
  int64_t step = 1;
};

/// LAMB update of every tensor (same dtype, one device): moments and per-chunk partial norms
/// of w and of the update in one pass, then the parameter update.
DLTRAIN_CUDA_ENTRY(void, lamb_step, (const LambHyper& h, const std::vector<LambTensors>& ts),
                   "stepping LAMB on CUDA parameters");

/// The norm_type-norm of all `grads` together (dense, any floating dtypes, one device),
/// accumulated in double in a fixed order. Writes it to `norm` (0-d f64) and the clipping
/// coefficient min(max_norm / (norm + 1e-6), 1) (NaN when the norm is NaN) to `coef` (0-d
/// f64), both on the device.
DLTRAIN_CUDA_ENTRY(void, grad_norm,
                   (const Tensor& norm, const Tensor& coef, const std::vector<Tensor>& grads,
                    double norm_type, double max_norm),
                   "clip_grad_norm_ on CUDA gradients");
/// g *= coef for every gradient (any floating dtype and strides; coef a 0-d f64 on the
/// device, converted to each gradient's dtype first, as mul_ does).
DLTRAIN_CUDA_ENTRY(void, scale_grads, (const std::vector<Tensor>& grads, const Tensor& coef),
                   "clip_grad_norm_ on CUDA gradients");
/// Clamps every gradient element into [lo, hi] (any floating dtype and strides).
DLTRAIN_CUDA_ENTRY(void, clamp_grads, (const std::vector<Tensor>& grads, double lo, double hi),
                   "clip_grad_value_ on CUDA gradients");

}  // namespace dltrain::backend::cuda
