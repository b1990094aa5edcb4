// CUDA entry points of the optimizer family: fused multi-tensor SGD and Adam/AdamW updates,
// and the gradient-clipping passes (internal header, no CUDA types; kernels in
// kernels/optim.cu, stubs in stub_optim.cpp). Callers (src/optim) check dtypes, devices and
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
void sgd_step(const SgdHyper& h, const std::vector<SgdTensors>& ts);

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
void adam_step(const AdamHyper& h, const std::vector<AdamTensors>& ts);

/// The norm_type-norm of all `grads` together (dense, any floating dtypes, one device),
/// accumulated in double in a fixed order. Writes it to `norm` (0-d f64) and the clipping
/// coefficient min(max_norm / (norm + 1e-6), 1) (NaN when the norm is NaN) to `coef` (0-d
/// f64), both on the device.
void grad_norm(const Tensor& norm, const Tensor& coef, const std::vector<Tensor>& grads,
               double norm_type, double max_norm);
/// g *= coef for every gradient (any floating dtype and strides; coef a 0-d f64 on the
/// device, converted to each gradient's dtype first, as mul_ does).
void scale_grads(const std::vector<Tensor>& grads, const Tensor& coef);
/// Clamps every gradient element into [lo, hi] (any floating dtype and strides).
void clamp_grads(const std::vector<Tensor>& grads, double lo, double hi);

}  // namespace dltrain::backend::cuda
