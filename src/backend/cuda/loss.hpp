// CUDA entry points of the softmax and loss family: softmax / log_softmax and their
// backward, the fused cross-entropy, nll_loss, the elementwise pieces of
// binary_cross_entropy_with_logits and dropout (internal header, no CUDA types; kernels in
// kernels/loss.cu, refusals from entry.hpp). Callers (src/ops/loss.cpp) check shapes, dtypes
// and devices and allocate the outputs; these functions only compute, on the current stream
// of the tensors' device, and never synchronise the host. Targets live on the device, so
// they are not range-checked: a target outside [0, C) other than ignore_index makes that
// sample's loss, the reduced loss and that sample's gradient NaN.
#pragma once

#include <cstdint>

#include "dltrain/core/tensor.hpp"
#include "src/backend/cuda/entry.hpp"

namespace dltrain::backend::cuda {

/// How a class-index loss reduces its per-sample losses.
enum class LossReduction { None, Mean, Sum };

/// y = softmax(x) (log_softmax when `log`) along L of a contiguous x seen as [outer, L,
/// inner]; y is contiguous with x's shape and dtype (floating).
DLTRAIN_CUDA_ENTRY(void, softmax_forward,
                   (const Tensor& y, const Tensor& x, int64_t outer, int64_t L, int64_t inner,
                    bool log),
                   "softmax on a CUDA tensor");
/// dx from the contiguous upstream gradient g and the forward output y (both of dx's
/// dtype): softmax dx = y (g - sum(g y)), log_softmax dx = g - exp(y) sum(g).
DLTRAIN_CUDA_ENTRY(void, softmax_backward,
                   (const Tensor& dx, const Tensor& g, const Tensor& y, int64_t outer, int64_t L,
                    int64_t inner, bool log),
                   "softmax backward on a CUDA tensor");

/// The geometry and options of a class-index loss over scores [N, C, S] (contiguous), int64
/// targets [N * S] (contiguous) and optional f64 class weights [C] (contiguous or undefined).
struct ClassLoss {
  int64_t N = 0, C = 0, S = 1;
  int64_t ignore_index = -100;
  LossReduction reduction = LossReduction::Mean;
};

/// Fused cross-entropy: log-softmax, weighted NLL, label smoothing and the reduction.
/// Writes `out` (the scores' dtype: [N * S] elements for None, 0-d otherwise), the per-sample
/// log-sum-exp `lse` ([N * S], f32, or f64 for f64 scores) that backward needs, and, when
/// defined, `total_weight` (0-d f64): the summed class weight of non-ignored targets (the
/// Mean denominator, kept for backward).
DLTRAIN_CUDA_ENTRY(void, cross_entropy_forward,
                   (const Tensor& out, const Tensor& lse, const Tensor& total_weight,
                    const Tensor& logits, const Tensor& target, const Tensor& weight,
                    const ClassLoss& a, double label_smoothing),
                   "cross_entropy on a CUDA tensor");
/// d(logits) [N, C, S] from the upstream gradient `grad` (contiguous, the scores' dtype: [N *
/// S] for None, 0-d otherwise) and what forward saved; one kernel.
DLTRAIN_CUDA_ENTRY(void, cross_entropy_backward,
                   (const Tensor& dx, const Tensor& grad, const Tensor& logits, const Tensor& lse,
                    const Tensor& total_weight, const Tensor& target, const Tensor& weight,
                    const ClassLoss& a, double label_smoothing),
                   "cross_entropy backward on a CUDA tensor");
/// nll_loss of log-probabilities [N, C, S]; outputs as cross_entropy_forward (no lse).
DLTRAIN_CUDA_ENTRY(void, nll_loss_forward,
                   (const Tensor& out, const Tensor& total_weight, const Tensor& log_probs,
                    const Tensor& target, const Tensor& weight, const ClassLoss& a),
                   "nll_loss on a CUDA tensor");
/// d(log_probs) [N, C, S]: -w[t] * grad at the target class, 0 elsewhere.
DLTRAIN_CUDA_ENTRY(void, nll_loss_backward,
                   (const Tensor& dx, const Tensor& grad, const Tensor& total_weight,
                    const Tensor& target, const Tensor& weight, const ClassLoss& a),
                   "nll_loss backward on a CUDA tensor");

/// out = (1 - y) x + (1 + (pw - 1) y) softplus(-x) elementwise; y and pw (x's dtype) broadcast
/// to x's shape, out has x's shape (any strides).
DLTRAIN_CUDA_ENTRY(void, bce_with_logits,
                   (const Tensor& out, const Tensor& x, const Tensor& y, const Tensor& pos_weight),
                   "binary_cross_entropy_with_logits on a CUDA tensor");
/// out = log(1 + exp(-x)), computed stably as log1p(exp(-|x|)) + max(-x, 0).
DLTRAIN_CUDA_ENTRY(void, softplus_neg, (const Tensor& out, const Tensor& x),
                   "binary_cross_entropy_with_logits backward on a CUDA tensor");

/// Dropout with the CPU's mask: element i of x in row-major order is kept when the uniform
/// that rand() would draw for it (Philox counter base + i / 2 under key `seed`, as f32, or
/// f64 for f64 x) is below `keep`. out = x * (kept ? 1 / keep : 0) in x's dtype; mask (u8, 1
/// where kept) and out have x's shape, any strides.
DLTRAIN_CUDA_ENTRY(void, dropout_forward,
                   (const Tensor& out, const Tensor& mask, const Tensor& x, double keep,
                    uint64_t seed, uint64_t base),
                   "dropout on a CUDA tensor");
/// dx = g * (mask ? 1 / keep : 0), g broadcast to dx's shape (dx's dtype).
DLTRAIN_CUDA_ENTRY(void, dropout_backward,
                   (const Tensor& dx, const Tensor& g, const Tensor& mask, double keep),
                   "dropout backward on a CUDA tensor");

}  // namespace dltrain::backend::cuda
