// Softmax family, dropout and losses.
//
// On CUDA, cross_entropy and nll_loss are fused kernels whose mean reduction is computed on
// the device (no host sync). Targets are range-checked on the CPU only: on CUDA an
// out-of-range target (other than ignore_index) gives a NaN loss and gradient instead of an
// error, because checking would synchronise every step.
#pragma once

#include "dltrain/core/generator.hpp"
#include "dltrain/core/tensor.hpp"

namespace dltrain {

/// How a loss reduces over samples.
enum class Reduction { None, Mean, Sum };

/// Softmax along `dim` (computed stably, in the accumulation type).
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

/// Zeroes elements with probability p and scales the rest by 1/(1-p) when training;
/// identity otherwise. The mask is drawn from `gen` (default generator when null).
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr);

struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  /// Optional per-class weights [C].
  Tensor weight = Tensor();
};

/// Cross-entropy of logits [N, C] (or [N, C, d...]) against int64 class indices [N] (or
/// [N, d...]), with PyTorch's semantics for ignore_index, label smoothing, class weights
/// and the mean reduction (divides by the summed weight of non-ignored targets).
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     const CrossEntropyOptions& opts = {});

struct NLLLossOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
  Tensor weight = Tensor();
};

/// Negative log-likelihood of log-probabilities [N, C] against class indices [N].
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NLLLossOptions& opts = {});
/// Mean (or summed) squared error; shapes broadcast.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
/// Numerically stable sigmoid + binary cross-entropy; pos_weight [C] optional.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction = Reduction::Mean,
                                        const Tensor& pos_weight = Tensor());

}  // namespace dltrain
