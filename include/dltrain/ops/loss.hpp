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

/// Cross-entropy of logits [N, C] (or [N, C, d...], or unbatched [C]) with PyTorch's
/// semantics. The target's dtype chooses the form:
///  - int64 (or int32) class indices [N] (or [N, d...], or 0-d): ignore_index, label
///    smoothing, class weights; the mean divides by the summed weight of non-ignored targets.
///  - floating class probabilities of the input's shape ("soft" targets, PyTorch >= 1.10;
///    MixUp/CutMix labels, distillation): per sample -sum_c w_c t'_c log_softmax(x)_c with
///    t' = (1 - label_smoothing) t + label_smoothing / C; the mean divides by the number of
///    samples (N d...), not by the weights. ignore_index does not apply: a class index (>= 0)
///    is refused, the default -100 accepted. The probabilities are not checked (negative or
///    unnormalised values follow the formula, as in PyTorch). The target may require grad.
/// An integer target of the input's shape is refused (convert it with .to(DType::f32)).
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     const CrossEntropyOptions& opts = {});

struct NLLLossOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
  Tensor weight = Tensor();
};

/// Negative log-likelihood of log-probabilities [N, C] against class indices [N].
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NLLLossOptions& opts = {});
/// Mean (or summed) squared error. Like every loss with an elementwise target (l1,
/// smooth_l1, huber, kl_div, binary_cross_entropy[_with_logits], gaussian_nll), target must
/// have input's shape: a [N, 1, H, W] prediction against a [N, H, W] target would broadcast
/// to another loss, so it is refused naming the unsqueeze/squeeze that matches them; pass
/// target.expand(input.shape()) to broadcast on purpose.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
/// The options of binary_cross_entropy and binary_cross_entropy_with_logits (PyTorch's BCELoss
/// and BCEWithLogitsLoss arguments, by name).
struct BinaryCrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  /// Rescaling weight of each element's loss, broadcast to the input's shape (floating-point).
  Tensor weight = Tensor();
  /// binary_cross_entropy_with_logits only: the weight of the positive term per class, [C]
  /// broadcast over the input's last dimension (> 1 raises recall, < 1 precision).
  Tensor pos_weight = Tensor();
};
/// Numerically stable sigmoid + binary cross-entropy of `logits` against `target` (same shape,
/// probabilities in [0, 1]): -w (pw y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))).
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        const BinaryCrossEntropyOptions& options = {});
/// The earlier positional form (reduction before pos_weight, unlike binary_cross_entropy's);
/// kept for one release.
[[deprecated("pass BinaryCrossEntropyOptions{.reduction = ..., .pos_weight = ...}")]] Tensor
binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target, Reduction reduction,
                                 const Tensor& pos_weight = Tensor());

// Regression and distribution losses (issue 14). Input and target must have the same shape
// (PyTorch broadcasts with a warning; dltrain refuses, see mse_loss); every input may
// require grad.

/// Mean (or summed) absolute error; the gradient at a zero difference is 0.
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
/// 0.5 d^2 / beta where |d| < beta, |d| - 0.5 beta elsewhere (d = input - target); beta = 0
/// is l1_loss.
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target,
                      Reduction reduction = Reduction::Mean, double beta = 1.0);
/// 0.5 d^2 where |d| < delta, delta (|d| - 0.5 delta) elsewhere (smooth_l1 times delta).
Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                  double delta = 1.0);

/// kl_div's reductions: PyTorch's "mean" averages over every element; BatchMean divides the
/// sum by the batch size (input.size(0)), which is the KL divergence proper.
enum class KLDivReduction { None, Mean, Sum, BatchMean };
/// KL(target || input) pointwise with input as log-probabilities: target (log target - input),
/// 0 where target is 0; with log_target the target is given as log-probabilities too.
Tensor kl_div(const Tensor& input, const Tensor& target,
              KLDivReduction reduction = KLDivReduction::Mean, bool log_target = false);
/// Binary cross-entropy of probabilities input in [0, 1] against target, with PyTorch's
/// clamp of each log at -100 and an optional rescaling weight (broadcast to input). The range
/// of input is checked on the CPU only (on CUDA that would synchronise). options.pos_weight is
/// refused (it belongs to the logits form, as in PyTorch).
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target,
                            const BinaryCrossEntropyOptions& options = {});
/// The earlier positional form; kept for one release.
[[deprecated("pass BinaryCrossEntropyOptions{.reduction = ..., .weight = ...}")]] Tensor
binary_cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight,
                     Reduction reduction = Reduction::Mean);
/// Gaussian negative log-likelihood 0.5 (log var + (input - target)^2 / var) (+ 0.5 log 2 pi
/// when full) with var clamped below at eps (the clamp passes gradients through, as PyTorch's
/// no-grad clamp does). var has input's shape, or one dim fewer, or a last dim of 1
/// (homoscedastic). Negative variances are refused on the CPU.
Tensor gaussian_nll_loss(const Tensor& input, const Tensor& target, const Tensor& var,
                         bool full = false, double eps = 1e-6,
                         Reduction reduction = Reduction::Mean);

}  // namespace dltrain
