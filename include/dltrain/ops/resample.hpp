// Resampling and padding of feature maps: interpolate (nearest, bilinear), pad (constant,
// reflect, replicate) and pixel_shuffle / pixel_unshuffle, with PyTorch's semantics and
// argument conventions. All are differentiable and run on any device.
#pragma once

#include <optional>
#include <vector>

#include "dltrain/core/tensor.hpp"
#include "dltrain/ops/conv.hpp"

namespace dltrain {

/// A (height, width) pair of scale factors; a double gives the same value for both.
struct Double2 {
  double h = 1, w = 1;
  Double2() = default;
  Double2(double v) : h(v), w(v) {}  // NOLINT: .scale_factor = 2.0 reads naturally
  Double2(double a, double b) : h(a), w(b) {}
};

enum class InterpolateMode { Nearest, Bilinear };

/// Exactly one of size and scale_factor. align_corners applies to Bilinear only (PyTorch
/// raises for nearest with align_corners, and so do we).
struct InterpolateOptions {
  /// Output (height, width).
  std::optional<Int2> size = std::nullopt;
  /// Output size = floor(input size * scale_factor); the source coordinates use 1/scale_factor
  /// itself, as PyTorch does when recompute_scale_factor is not set.
  std::optional<Double2> scale_factor = std::nullopt;
  InterpolateMode mode = InterpolateMode::Nearest;
  /// Bilinear: true maps the corner pixels' centres onto each other (scale (in-1)/(out-1)),
  /// false (PyTorch's default) maps the corners' edges (half-pixel centres).
  bool align_corners = false;
};

/// Resizes the two spatial dims of x [N, C, H, W] (PyTorch's F.interpolate for 4-d input,
/// modes "nearest" and "bilinear"). The output keeps x's dtype and memory format.
Tensor interpolate(const Tensor& x, const InterpolateOptions& options);

enum class PadMode { Constant, Reflect, Replicate };

/// Pads x: `pad` lists (before, after) pairs starting from the last dim, as F.pad:
/// {left, right} pads dim -1, {left, right, top, bottom} dims -1 and -2, and so on.
/// Constant fills with `value` and accepts negative amounts (cropping); Reflect mirrors
/// without repeating the edge (each amount < that dim's size); Replicate repeats the edge
/// (the dim must not be empty). Keeps x's memory format.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pad, PadMode mode = PadMode::Constant,
           double value = 0.0);

/// [N, C*r*r, H, W] -> [N, C, H*r, W*r] (sub-pixel convolution's rearrangement; any rank >= 3,
/// the last three dims are used).
Tensor pixel_shuffle(const Tensor& x, int64_t upscale_factor);
/// The inverse: [N, C, H*r, W*r] -> [N, C*r*r, H, W].
Tensor pixel_unshuffle(const Tensor& x, int64_t downscale_factor);

}  // namespace dltrain
