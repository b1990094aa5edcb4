// Batch mixing: MixUp and CutMix with torchvision.transforms.v2 semantics (issue 30).
//
// Both act on a whole batch (images [N, C, H, W] floating, labels int64 [N] or probabilities
// [N, num_classes]) after collation, and pair sample i with sample i - 1 (the batch rolled by
// one along dim 0, sample 0 with sample N - 1), exactly as torchvision's v2 MixUp/CutMix do:
// the batch should be shuffled (a DataLoader with a random sampler is). They return the
// mixed images and soft labels [N, num_classes], which cross_entropy accepts as targets
// (a floating target of the logits' shape).
//
//   MixUp:  lambda ~ Beta(alpha, alpha); images' = lambda x + (1 - lambda) roll(x),
//           labels' = lambda onehot(y) + (1 - lambda) roll(onehot(y)).
//   CutMix: lambda ~ Beta(alpha, alpha); a centre (cx, cy) uniform over the pixels; half
//           sides r W and r H truncated to integers with r = sqrt(1 - lambda) / 2; the box
//           [cx - rw, cx + rw) x [cy - rh, cy + rh) clipped to the image is pasted from the
//           rolled batch; labels are mixed with lambda corrected to the box actually pasted,
//           1 - box area / (H W).
//
// Randomness comes from a dltrain Generator (the default one when null), so a seed fixes the
// draws; `apply` overloads take lambda or the box directly (tests, custom schedules). The
// ops are ordinary tensor ops, so a batch on a CUDA device is mixed there; nothing records
// autograd history that matters (the inputs of a data pipeline do not require grad).
#pragma once

#include <cstdint>

#include "dltrain/core/generator.hpp"
#include "dltrain/core/tensor.hpp"

namespace dltrain::data {

/// A draw from Gamma(shape, 1) (Marsaglia and Tsang's method; shape < 1 by boosting to
/// shape + 1 and multiplying by U^(1/shape)), from `gen` (default generator when null).
double sample_gamma(double shape, Generator* gen = nullptr);
/// A draw from Beta(a, b) = X / (X + Y), X ~ Gamma(a), Y ~ Gamma(b), computed from the logs
/// of the gammas so that small parameters (alpha = 0.1 or 0.2, common for MixUp) do not
/// underflow to 0 / 0.
double sample_beta(double a, double b, Generator* gen = nullptr);

/// Mixed images and soft labels [N, num_classes] (f32 for int64 labels; a floating label
/// dtype is kept).
struct MixedBatch {
  Tensor images;
  Tensor labels;
};

/// A CutMix box: columns [x1, x2), rows [y1, y2) (torchvision's (x1, y1, x2, y2)).
struct CutMixBox {
  int64_t x1 = 0, y1 = 0, x2 = 0, y2 = 0;
  int64_t area() const { return (x2 - x1) * (y2 - y1); }
};

/// torchvision.transforms.v2.MixUp(alpha, num_classes).
class MixUp {
 public:
  /// alpha > 0; num_classes > 0.
  explicit MixUp(int64_t num_classes, double alpha = 1.0);
  /// Draws lambda from Beta(alpha, alpha) and mixes.
  MixedBatch operator()(const Tensor& images, const Tensor& labels, Generator* gen = nullptr) const;
  /// Mixes with a given lambda in [0, 1].
  MixedBatch apply(const Tensor& images, const Tensor& labels, double lambda) const;
  double alpha() const { return alpha_; }
  int64_t num_classes() const { return num_classes_; }

 private:
  int64_t num_classes_;
  double alpha_;
};

/// torchvision.transforms.v2.CutMix(alpha, num_classes). Images are [N, C, H, W] (any
/// [N, ..., H, W] with at least 3 dims: the box is cut from the last two).
class CutMix {
 public:
  explicit CutMix(int64_t num_classes, double alpha = 1.0);
  /// Draws lambda from Beta(alpha, alpha), then the centre (cx uniform in [0, W), cy in
  /// [0, H)), and pastes that box.
  MixedBatch operator()(const Tensor& images, const Tensor& labels, Generator* gen = nullptr) const;
  /// Pastes a given box (inside the image); the labels are mixed with lambda = 1 - box area
  /// / (H W).
  MixedBatch apply(const Tensor& images, const Tensor& labels, const CutMixBox& box) const;
  /// torchvision's box rule for lambda and a centre (cx, cy) in an H x W image.
  static CutMixBox box_for(int64_t height, int64_t width, double lambda, int64_t cx, int64_t cy);
  double alpha() const { return alpha_; }
  int64_t num_classes() const { return num_classes_; }

 private:
  int64_t num_classes_;
  double alpha_;
};

/// torchvision's RandomChoice([MixUp, CutMix], p=[p_mixup, 1 - p_mixup]): one uniform draw
/// picks which of the two mixes the batch. Both must have the same num_classes.
class MixUpOrCutMix {
 public:
  MixUpOrCutMix(MixUp mixup, CutMix cutmix, double p_mixup = 0.5);
  MixedBatch operator()(const Tensor& images, const Tensor& labels, Generator* gen = nullptr) const;

 private:
  MixUp mixup_;
  CutMix cutmix_;
  double p_mixup_;
};

}  // namespace dltrain::data
