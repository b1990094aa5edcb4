// Image augmentations with torchvision's parameters, arithmetic and randomness model, on
// 8-bit HWC images (1 or 3 channels), so that a recipe written with torchvision.transforms
// ports line by line (issue 30).
//
// Arithmetic: each op follows torchvision's tensor path on uint8 tensors
// (torchvision/transforms/_functional_tensor.py and autoaugment.py, torchvision 0.29), in
// the same float32 precision: blends are clamp(r * a + (1 - r) * b, 0, 255) truncated
// to u8, grayscale is 0.2989 R + 0.587 G + 0.114 B truncated, hue goes through float32
// HSV and back with the (255 + 1 - 1e-3) scaling, blurs and the sharpness filter round
// half to even, and the magnitude tables are torch.linspace in float32. The results equal
// torchvision's but where float summation order decides a truncation or a rounding (at
// most one grey level; tests/data/torchvision_augment_check.py measures it). torchvision's
// v2 transforms differ from this v1 tensor path in a few places (their Color and Sharpness
// blends, their Solarize table as a fraction of 255): docs/data.md lists what was measured.
//
// Geometric ops (ShearX/Y, TranslateX/Y, Rotate) are torchvision's F.affine / F.rotate on
// a tensor with nearest-neighbour sampling: the inverse affine matrix of
// _get_inverse_affine_matrix in double, then per output pixel the float32 grid of
// _gen_affine_grid and grid_sample's unnormalisation ((g + 1) * size - 1) / 2 rounded half
// to even; a source pixel outside the image gives `fill` (0 by default, as torchvision's
// fill=None). A sample coordinate within float32 noise of a .5 tie may pick the other
// neighbour than torchvision does (a whole pixel's difference, rare; the check above
// accepts a difference only at such ties).
//
// Randomness: a random transform draws from a SampleRandom (transforms.hpp) in the order
// torchvision draws from torch's generator (the same distributions, not torch's bits), so
// an augmented sample is a pure function of (seed, epoch, sample index, stream): it does
// not depend on the thread, the worker or what other samples drew. In ImagePipeline the
// k-th augmentation of `augment` draws from stream 2 + k (0 and 1 are the crop and flip);
// only Train pipelines take augmentations (check() refuses them on an Eval one).
//
// RandomErasing: torchvision's recipe applies it after Normalize, on the float tensor,
// erasing to value 0 (the mean). Here it acts on the u8 image, before normalisation, so
// the pipeline can stay u8 until to_float_batch; erasing to round(255 * mean), the default
// of RandomErasing::imagenet(), gives after normalisation a value within 0.5 / 255 / std
// (< 0.009) of torchvision's 0. The box it draws follows torchvision's get_params exactly.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dltrain/data/image.hpp"
#include "dltrain/data/transforms.hpp"

namespace dltrain::data {

// --- functional ops (torchvision.transforms.functional on a uint8 tensor) -------------

/// F.adjust_brightness: blend with black, factor >= 0.
Image adjust_brightness(const Image& src, double factor);
/// F.adjust_contrast: blend with the mean of the grayscale image, factor >= 0.
Image adjust_contrast(const Image& src, double factor);
/// F.adjust_saturation: blend with the grayscale image, factor >= 0 (1 channel: a copy).
Image adjust_saturation(const Image& src, double factor);
/// F.adjust_hue: rotate the hue by factor in [-0.5, 0.5] turns (1 channel: a copy).
Image adjust_hue(const Image& src, double factor);
/// F.adjust_sharpness: blend with the 3x3 smoothed image (border pixels kept), factor >= 0.
Image adjust_sharpness(const Image& src, double factor);
/// F.rgb_to_grayscale with num_output_channels 1 or 3. A 1-channel input is copied into
/// output_channels channels (torchvision returns 1 channel even when asked for 3).
Image rgb_to_grayscale(const Image& src, int64_t output_channels = 1);
/// F.posterize: keep the `bits` (0..8) high bits.
Image posterize(const Image& src, int64_t bits);
/// F.solarize: invert the pixels >= threshold.
Image solarize(const Image& src, double threshold);
/// F.autocontrast: stretch each channel's [min, max] to [0, 255].
Image autocontrast(const Image& src);
/// F.equalize: per-channel histogram equalisation (PIL's algorithm, as torchvision).
Image equalize(const Image& src);
/// F.invert: 255 - x.
Image invert(const Image& src);
/// F.gaussian_blur(kernel_size = {kx, ky}, sigma = {sx, sy}): odd kernel sizes, sigma > 0,
/// reflect padding.
Image gaussian_blur(const Image& src, std::array<int64_t, 2> kernel_size,
                    std::array<double, 2> sigma);
/// F.affine(angle, translate, scale, shear, NEAREST, fill, center) on a tensor; `center`
/// in pixels from the top-left corner, or the image centre when empty. Degrees, clockwise.
Image affine(const Image& src, double angle, std::array<double, 2> translate, double scale,
             std::array<double, 2> shear, const std::vector<uint8_t>& fill = {},
             const std::vector<double>& center = {});
/// F.rotate(angle, NEAREST, expand=False, fill): counter-clockwise degrees about the centre.
Image rotate(const Image& src, double angle, const std::vector<uint8_t>& fill = {});
/// F.erase on a uint8 tensor: `box` set to `value` (1 value or one per channel).
Image erase(const Image& src, const CropBox& box, const std::vector<uint8_t>& value);

// --- the automatic-augmentation op set -------------------------------------------------

/// The ops of AutoAugment, RandAugment and TrivialAugmentWide (autoaugment.py's _apply_op).
enum class AugmentOp {
  Identity,
  ShearX,
  ShearY,
  TranslateX,
  TranslateY,
  Rotate,
  Brightness,
  Color,
  Contrast,
  Sharpness,
  Posterize,
  Solarize,
  AutoContrast,
  Equalize,
  Invert,
};
/// torchvision's name of the op ("ShearX", ...).
const char* augment_op_name(AugmentOp op);

/// autoaugment._apply_op(img, op, magnitude, NEAREST, fill): Shear by atan(magnitude)
/// about the top-left corner, Translate by int(magnitude) pixels, Rotate by magnitude
/// degrees, Brightness/Color/Contrast/Sharpness by factor 1 + magnitude, Posterize to
/// int(magnitude) bits, Solarize at threshold magnitude; the rest ignore it.
Image apply_augment_op(const Image& src, AugmentOp op, double magnitude,
                       const std::vector<uint8_t>& fill = {});

/// One op chosen by a policy, with its signed magnitude.
struct AugmentDraw {
  AugmentOp op = AugmentOp::Identity;
  double magnitude = 0;
};

/// One entry of a policy's augmentation space: the op, its magnitude bins (empty when it
/// has none: torchvision's 0-d tensor) and whether a random sign applies.
struct AugmentSpaceEntry {
  AugmentOp op = AugmentOp::Identity;
  std::vector<double> magnitudes{};
  bool signed_magnitude = false;
};

// --- random transforms -------------------------------------------------------------------

/// A random per-sample transform of an image: ImagePipeline::augment holds a list of them.
class Augmentation {
 public:
  virtual ~Augmentation() = default;
  /// The transformed image; draws from `rng` only.
  virtual Image operator()(const Image& src, SampleRandom& rng) const = 0;
  /// The torchvision expression it reproduces, e.g. "TrivialAugmentWide(num_magnitude_bins=31)".
  virtual std::string repr() const = 0;
};

/// torchvision.transforms.TrivialAugmentWide(num_magnitude_bins, NEAREST, fill): one op
/// uniform over the 14 of its wide space (Identity first, no Invert), a bin uniform over
/// num_magnitude_bins for ops with magnitudes, then a sign (negative when a fair draw is
/// 1) for signed ops.
class TrivialAugmentWide final : public Augmentation {
 public:
  /// Throws dltrain::Error when num_magnitude_bins < 2 or fill has a size other than 0, 1
  /// or 3.
  explicit TrivialAugmentWide(int64_t num_magnitude_bins = 31, std::vector<uint8_t> fill = {});
  /// torchvision's _augmentation_space(num_bins), in its order.
  std::vector<AugmentSpaceEntry> space() const;
  AugmentDraw draw(SampleRandom& rng) const;
  Image operator()(const Image& src, SampleRandom& rng) const override;
  std::string repr() const override;

 private:
  int64_t bins_;
  std::vector<uint8_t> fill_;
  std::vector<AugmentSpaceEntry> space_;
};

/// torchvision.transforms.RandAugment(num_ops, magnitude, num_magnitude_bins, NEAREST,
/// fill): num_ops times, an op uniform over the 14 of its space (Identity first, no
/// Invert) at bin `magnitude`, then a sign for signed ops. Translations scale with the
/// image (150/331 of its width or height), so the space depends on the image size.
class RandAugment final : public Augmentation {
 public:
  /// Throws dltrain::Error when num_ops < 0, num_magnitude_bins < 2, magnitude is not in
  /// [0, num_magnitude_bins) or fill has a size other than 0, 1 or 3.
  explicit RandAugment(int64_t num_ops = 2, int64_t magnitude = 9, int64_t num_magnitude_bins = 31,
                       std::vector<uint8_t> fill = {});
  std::vector<AugmentSpaceEntry> space(int64_t height, int64_t width) const;
  std::vector<AugmentDraw> draw(SampleRandom& rng, int64_t height, int64_t width) const;
  Image operator()(const Image& src, SampleRandom& rng) const override;
  std::string repr() const override;

 private:
  int64_t num_ops_, magnitude_, bins_;
  std::vector<uint8_t> fill_;
};

/// torchvision.transforms.AutoAugment(AutoAugmentPolicy.IMAGENET, NEAREST, fill): one of
/// the 25 sub-policies uniformly, two uniform probabilities and two fair signs always
/// drawn; op i applies when its probability draw is <= its p, at its bin of the 10-bin
/// space, negated when sign i is 0.
class AutoAugment final : public Augmentation {
 public:
  struct Step {
    AugmentOp op = AugmentOp::Identity;
    double p = 0;
    int64_t magnitude_bin = -1;  // -1: the op has no magnitude (torchvision's None)
  };
  /// Throws dltrain::Error when fill has a size other than 0, 1 or 3.
  explicit AutoAugment(std::vector<uint8_t> fill = {});
  /// The ImageNet policy's 25 pairs, in torchvision's order.
  static const std::vector<std::array<Step, 2>>& imagenet_policy();
  /// The 10-bin space (with Invert) for an image of height x width.
  static std::vector<AugmentSpaceEntry> space(int64_t height, int64_t width);
  /// The ops that apply (0, 1 or 2), with their signed magnitudes.
  std::vector<AugmentDraw> draw(SampleRandom& rng, int64_t height, int64_t width) const;
  Image operator()(const Image& src, SampleRandom& rng) const override;
  std::string repr() const override;

 private:
  std::vector<uint8_t> fill_;
};

/// torchvision.transforms.ColorJitter(brightness, contrast, saturation, hue): a random
/// order of the four (torch.randperm(4)), then each enabled factor uniform in its range
/// (brightness, contrast, saturation drawn in that order, then hue), applied in the drawn
/// order. A range {1, 1} (hue {0, 0}) disables that adjustment, as torchvision's None.
class ColorJitter final : public Augmentation {
 public:
  /// torchvision's scalar form: brightness b gives [max(0, 1 - b), 1 + b], likewise
  /// contrast and saturation; hue h gives [-h, h]. Throws dltrain::Error when a value is
  /// negative or hue > 0.5.
  ColorJitter(double brightness = 0, double contrast = 0, double saturation = 0, double hue = 0);
  /// Explicit ranges. Throws dltrain::Error unless 0 <= lo <= hi for the first three and
  /// -0.5 <= lo <= hi <= 0.5 for hue.
  static ColorJitter ranges(std::array<double, 2> brightness, std::array<double, 2> contrast,
                            std::array<double, 2> saturation, std::array<double, 2> hue);
  /// The drawn order (a permutation of 0 brightness, 1 contrast, 2 saturation, 3 hue) and
  /// factors (NaN for a disabled adjustment).
  struct Params {
    std::array<int, 4> order{};
    std::array<double, 4> factor{};
  };
  Params draw(SampleRandom& rng) const;
  Image apply(const Image& src, const Params& p) const;
  Image operator()(const Image& src, SampleRandom& rng) const override;
  std::string repr() const override;

 private:
  std::array<std::array<double, 2>, 4> range_{};
  std::array<bool, 4> enabled_{};
};

/// torchvision.transforms.RandomGrayscale(p): grayscale with as many channels as the input
/// when a uniform draw is < p.
class RandomGrayscale final : public Augmentation {
 public:
  /// Throws dltrain::Error unless 0 <= p <= 1.
  explicit RandomGrayscale(double p = 0.1);
  Image operator()(const Image& src, SampleRandom& rng) const override;
  std::string repr() const override;

 private:
  double p_;
};

/// torchvision.transforms.GaussianBlur(kernel_size, sigma): sigma uniform in
/// [sigma_lo, sigma_hi], the same for both axes.
class GaussianBlur final : public Augmentation {
 public:
  /// Throws dltrain::Error unless both kernel sizes are odd and positive and
  /// 0 < sigma_lo <= sigma_hi.
  GaussianBlur(std::array<int64_t, 2> kernel_size, std::array<double, 2> sigma = {0.1, 2.0});
  double draw(SampleRandom& rng) const { return rng.uniform(sigma_[0], sigma_[1]); }
  Image operator()(const Image& src, SampleRandom& rng) const override;
  std::string repr() const override;

 private:
  std::array<int64_t, 2> kernel_;
  std::array<double, 2> sigma_;
};

/// torchvision.transforms.RandomErasing(p, scale, ratio, value) on the u8 image (see the
/// file comment): when a uniform draw is < p, up to 10 attempts draw an area fraction
/// uniform in `scale` and an aspect ratio log-uniform in `ratio`, h = round(sqrt(area *
/// ratio)), w = round(sqrt(area / ratio)); the first with h < height and w < width gets a
/// uniform position and is set to `value`; if none fits the image is unchanged.
/// RandomErasing::random() is torchvision's value="random": the box gets noise instead.
class RandomErasing final : public Augmentation {
 public:
  /// Throws dltrain::Error unless 0 <= p <= 1, 0 < scale lo <= hi <= 1, 0 < ratio lo <= hi
  /// and value has 1 or 3 entries.
  explicit RandomErasing(double p = 0.5, std::array<double, 2> scale = {0.02, 0.33},
                         std::array<double, 2> ratio = {0.3, 3.3},
                         std::vector<uint8_t> value = {0});
  /// Erasing to round(255 * kImageNetMean) = {124, 116, 104}: 0 after normalisation, as
  /// torchvision's recipe (RandomErasing after Normalize, value 0), within 0.009.
  static RandomErasing imagenet(double p);
  /// torchvision's value="random", which fills the box of the normalised float image with
  /// standard normal noise, one draw per pixel and channel: here each erased byte is
  /// round(255 * (mean_c + std_c * z)) clamped to [0, 255], z ~ N(0, 1) from the sample's
  /// generator, so that after normalising with the same `mean` and `std` (1 or 3 entries
  /// each, std > 0) it is z up to the clamp to the image range and a rounding of
  /// 0.5 / 255 / std_c. Throws dltrain::Error on bad sizes or values.
  static RandomErasing random(double p, std::vector<double> mean, std::vector<double> std,
                              std::array<double, 2> scale = {0.02, 0.33},
                              std::array<double, 2> ratio = {0.3, 3.3});
  /// The box to erase, or an empty box (height 0) when no erasing happens.
  CropBox draw(SampleRandom& rng, int64_t height, int64_t width) const;
  Image operator()(const Image& src, SampleRandom& rng) const override;
  std::string repr() const override;

 private:
  double p_;
  std::array<double, 2> scale_, ratio_;
  std::vector<uint8_t> value_;
  std::vector<double> mean_, std_;  // non-empty: value="random" (random())
};

/// The automatic policy named as the torchvision reference recipes' --auto-augment flag
/// does: "trivial" (TrivialAugmentWide()), "rand" (RandAugment()), "imagenet"
/// (AutoAugment(IMAGENET)). Throws dltrain::Error naming the accepted values otherwise.
std::shared_ptr<const Augmentation> make_auto_augment(const std::string& name);

}  // namespace dltrain::data
