// Image transforms with torchvision semantics, the fused decode+transform pipelines
// ImageFolder runs per sample, and the u8 -> f32 batch normalisation.
//
// Randomness: a random transform draws from a SampleRandom, a Philox stream that is a
// pure function of (seed, epoch, sample index, stream id), so an augmented sample does
// not depend on which thread or worker built it, nor on what was drawn before.
//
// Resampling: bilinear without antialiasing, exactly torchvision's tensor path
// (F.resize(t, size, InterpolationMode.BILINEAR, antialias=False), i.e. PyTorch's
// upsample_bilinear2d with align_corners=False): output pixel d samples source
// coordinate (d + 0.5) * in / out - 0.5 (clamped at 0; the second neighbour clamped to
// the last pixel) with torch's float weights, and the result is rounded half to even, so
// the u8 output equals torchvision's except where a value lies within float noise of an
// exact .5 (at most one level off; under 0.1% of the pixels in
// tests/reference/image_reference.txt). It is not PIL's resize, which widens its filter
// when downscaling (antialiasing). The fused pipelines decode with DCT scaling first
// (1/2, 1/4 or 1/8), so the bilinear step shrinks by less than 2x unless the crop is over
// 16x the output size, and aliasing stays small; with dct_scaling = false they equal the
// plain transforms on a full decode (also when only the crop region is decoded).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "dltrain/core/device.hpp"
#include "dltrain/core/tensor.hpp"
#include "dltrain/data/image.hpp"

namespace dltrain::data {

class Augmentation;  // augment.hpp

/// A counter-based random stream for one sample: Philox-4x32-10 keyed by `seed`, with the
/// sample index as subsequence and (epoch, stream, draw block) as counter. Two streams
/// with different (seed, epoch, index, stream) never share counters (epoch < 2^32, up to
/// 2^24 blocks of 4 draws per stream).
class SampleRandom {
 public:
  SampleRandom(uint64_t seed, int64_t epoch, int64_t index, uint32_t stream = 0);
  /// Uniform in [0, 1) (32 random bits).
  double uniform();
  /// Uniform in [low, high).
  double uniform(double low, double high) { return low + (high - low) * uniform(); }
  /// Integer uniform in [low, high) (high > low).
  int64_t randint(int64_t low, int64_t high);

 private:
  uint64_t key_, subsequence_, counter_;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
};

/// Bilinear resampling (see the file comment) of `region` of `src` (inside the image) to a
/// virtual out_height x out_width image, of which rows [window.top, window.top +
/// window.height) and columns [window.left, ...) are written to `dst` (HWC, src.channels
/// channels, dst_row_stride bytes per row), mirrored left-right when `flip`. Window pixels
/// outside the virtual image are written as 0 (CenterCrop's padding). Throws
/// dltrain::Error on an empty image, a region outside the image or non-positive sizes.
void resample_bilinear(const Image& src, const CropBox& region, int64_t out_height,
                       int64_t out_width, const CropBox& window, bool flip, uint8_t* dst,
                       int64_t dst_row_stride);

/// `src` resized to height x width (bilinear, see the file comment).
Image resize(const Image& src, int64_t height, int64_t width);
/// The pixels of `box` (which must lie inside `src`).
Image crop(const Image& src, const CropBox& box);
/// `src` mirrored left-right.
Image hflip(const Image& src);

/// torchvision.transforms.Resize(size) with an int size: the shorter side becomes `size`
/// and the longer int(size * long / short) (truncated, as torchvision), bilinear.
class Resize {
 public:
  /// Throws dltrain::Error when size < 1.
  explicit Resize(int64_t size);
  /// {height, width} of the output for an input of height x width.
  std::array<int64_t, 2> output_size(int64_t height, int64_t width) const;
  Image operator()(const Image& src) const;
  int64_t size() const { return size_; }

 private:
  int64_t size_;
};

/// torchvision.transforms.CenterCrop(size): the size x size centre, top =
/// round((height - size) / 2) and left likewise (round half to even, as Python); an image
/// smaller than `size` is zero-padded first, as torchvision does.
class CenterCrop {
 public:
  /// Throws dltrain::Error when size < 1.
  explicit CenterCrop(int64_t size);
  /// The crop box in input coordinates (top/left negative when padding).
  CropBox box(int64_t height, int64_t width) const;
  Image operator()(const Image& src) const;
  int64_t size() const { return size_; }

 private:
  int64_t size_;
};

/// torchvision.transforms.RandomResizedCrop(size, scale, ratio) with bilinear resampling:
/// up to 10 attempts draw an area fraction uniform in `scale` and an aspect ratio
/// log-uniform in `ratio`, w = round(sqrt(area * ratio)), h = round(sqrt(area / ratio));
/// the first that fits gets a uniform position; if none fits, the centre crop of the whole
/// image clamped to the ratio range. The box is then resized to size x size.
class RandomResizedCrop {
 public:
  /// Throws dltrain::Error when size < 1, scale is not 0 < lo <= hi, or ratio is not
  /// 0 < lo <= hi.
  explicit RandomResizedCrop(int64_t size, std::array<double, 2> scale = {0.08, 1.0},
                             std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0});
  /// torchvision's get_params: the crop box for a height x width image, drawn from `rng`.
  CropBox get_params(int64_t height, int64_t width, SampleRandom& rng) const;
  Image operator()(const Image& src, SampleRandom& rng) const;
  int64_t size() const { return size_; }
  const std::array<double, 2>& scale() const { return scale_; }
  const std::array<double, 2>& ratio() const { return ratio_; }

 private:
  int64_t size_;
  std::array<double, 2> scale_, ratio_;
};

/// torchvision.transforms.RandomHorizontalFlip(p): mirrors when a uniform draw is < p.
class RandomHorizontalFlip {
 public:
  /// Throws dltrain::Error unless 0 <= p <= 1.
  explicit RandomHorizontalFlip(double p = 0.5);
  /// Whether this draw flips.
  bool draw(SampleRandom& rng) const { return rng.uniform() < p_; }
  Image operator()(const Image& src, SampleRandom& rng) const;
  double p() const { return p_; }

 private:
  double p_;
};

/// The per-sample transform of an image dataset, fused with crop-aware JPEG decoding; its
/// output is always size x size x 3 u8. Train: RandomResizedCrop(size, scale, ratio) +
/// RandomHorizontalFlip(flip_p), then the `augment` list in order (torchvision's recipe
/// order: auto-augmentation, colour, erasing after the crop and flip, before
/// normalisation). Eval: Resize(resize) + CenterCrop(size). Sample `index` of epoch
/// `epoch` draws its crop from SampleRandom(seed, epoch, index, 0), its flip from stream 1
/// and augment[k] from stream 2 + k.
struct ImagePipeline {
  enum class Kind { Train, Eval };
  Kind kind = Kind::Train;
  /// Output side in pixels.
  int64_t size = 224;
  /// Eval: the shorter side after Resize.
  int64_t resize = 256;
  /// Train: RandomResizedCrop's area fraction and aspect-ratio ranges.
  std::array<double, 2> scale{0.08, 1.0};
  std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};
  /// Train: flip probability (0 disables flipping).
  double flip_p = 0.5;
  /// Decode JPEGs at the smallest DCT scale that keeps >= size (train: on the crop's
  /// shorter side) or >= resize (eval) pixels; false decodes at full size.
  bool dct_scaling = true;
  /// Train: augmentations applied to the size x size crop (augment.hpp), e.g.
  /// {make_auto_augment("trivial"),
  /// std::make_shared<RandomErasing>(RandomErasing::imagenet(0.25))}. Empty (the default): the crop
  /// is written straight to the batch, no extra copy. At most 254 entries; the images must stay
  /// size x size x 3.
  std::vector<std::shared_ptr<const Augmentation>> augment{};

  /// RandomResizedCrop(size) + RandomHorizontalFlip(0.5), the ImageNet training transform.
  static ImagePipeline train(int64_t size = 224);
  /// Resize(resize) + CenterCrop(size), the ImageNet validation transform.
  static ImagePipeline eval(int64_t resize = 256, int64_t size = 224);

  /// Throws dltrain::Error naming the bad field (sizes < 1, bad ranges, p outside [0, 1],
  /// a null or 255th augmentation).
  void check() const;
  /// Decodes the JPEG in `data` (crop-aware: for Train the crop box is drawn on the header
  /// size, mapped to the smallest DCT scale that keeps its shorter side >= size, and only
  /// that region decoded where decode_jpeg_region can) and writes the size x size x 3
  /// result to `out` (contiguous HWC). Throws dltrain::Error with libjpeg's message on bad
  /// data.
  void apply_jpeg(const uint8_t* data, size_t n, uint64_t seed, int64_t epoch, int64_t index,
                  uint8_t* out) const;
  /// The same transform on a decoded 3-channel image (full size: no DCT scaling). Throws
  /// dltrain::Error when src does not have 3 channels.
  void apply(const Image& src, uint64_t seed, int64_t epoch, int64_t index, uint8_t* out) const;
};

/// ImageNet's per-channel mean and standard deviation (RGB, on [0, 1] pixels).
inline const std::vector<float> kImageNetMean{0.485f, 0.456f, 0.406f};
inline const std::vector<float> kImageNetStd{0.229f, 0.224f, 0.225f};

/// Converts a u8 batch [N, H, W, C] (as ImageFolder returns it) to `dtype` (f32, f16 or bf16)
/// with the logical shape [N, C, H, W], y = (x / 255 - mean[c]) / std[c], stored NCHW
/// (Contiguous) or NHWC (ChannelsLast, strides of x.contiguous(MemoryFormat::ChannelsLast)),
/// on the batch's device. On the CPU: one pass through a per-channel 256-entry table, split
/// over the CPU pool. On a CUDA device: one kernel (y = x * scale[c] + shift[c] in float,
/// rounded once to `dtype`), so only uint8 crosses PCIe. `mean` and `std` hold 1 value or C
/// (at most 64 channels on CUDA); empty means 0 and 1. Throws dltrain::Error on a non-u8 or
/// non-4-d input, wrong mean/std sizes, a std <= 0, a non-floating dtype or
/// MemoryFormat::Preserve.
Tensor to_float_batch(const Tensor& batch_u8_nhwc, const std::vector<float>& mean,
                      const std::vector<float>& std, MemoryFormat format = MemoryFormat::Contiguous,
                      DType dtype = DType::f32);

}  // namespace dltrain::data
