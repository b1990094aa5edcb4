// Transforms, the fused decode+transform pipelines and to_float_batch.
//
// resample_bilinear is separable: each needed source row is interpolated horizontally
// once into a float row (two rows cached, so consecutive output rows that share a source
// row reuse it), then pairs of rows are blended vertically and rounded; both passes are
// flat loops the compiler vectorises. The arithmetic (torch's float weights,
// wy0 * (wx0 * a + wx1 * b) + wy1 * (...), round half to even) is PyTorch's
// upsample_bilinear2d on float input, so the u8 results equal torchvision's but at exact
// .5 ties, where summation order decides (see transforms.hpp). Hand-written because no
// maintained C++ library offers torchvision's exact sampling and rounding on u8 HWC
// (OpenCV's INTER_LINEAR uses fixed-point weights and different rounding).
#include "dltrain/data/transforms.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dltrain/core/error.hpp"
#include "dltrain/core/generator.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/data/augment.hpp"
#include "src/backend/cuda/image.hpp"

namespace dltrain::data {

// --- SampleRandom --------------------------------------------------------------------

SampleRandom::SampleRandom(uint64_t seed, int64_t epoch, int64_t index, uint32_t stream)
    : key_(seed), subsequence_(static_cast<uint64_t>(index)) {
  DLTRAIN_CHECK(epoch >= 0 && epoch < (int64_t{1} << 32),
                "SampleRandom: epoch must be in [0, 2^32), got ", epoch);
  DLTRAIN_CHECK(index >= 0, "SampleRandom: the sample index must be >= 0, got ", index);
  DLTRAIN_CHECK(stream < 256, "SampleRandom: stream must be < 256, got ", stream);
  counter_ = (static_cast<uint64_t>(epoch) << 32) | (static_cast<uint64_t>(stream) << 24);
}

double SampleRandom::uniform() {
  if (used_ == 4) {
    block_ = philox4x32(counter_++, subsequence_, key_);
    used_ = 0;
  }
  return static_cast<double>(block_[static_cast<size_t>(used_++)]) * 0x1p-32;
}

int64_t SampleRandom::randint(int64_t low, int64_t high) {
  DLTRAIN_CHECK(high > low, "SampleRandom::randint: empty range [", low, ", ", high, ")");
  const int64_t n = high - low;
  return low + std::min(static_cast<int64_t>(uniform() * static_cast<double>(n)), n - 1);
}

// --- bilinear resampling -------------------------------------------------------------

namespace {

struct Tap {
  int64_t a = 0, b = 0;  // source indices inside the region
  float wa = 0, wb = 0;
  bool valid = false;  // false: outside the virtual image (padding)
};

// PyTorch's area_pixel_compute_source_index (align_corners = false) and neighbour guard,
// with its precision: a float scale, the source index and lambda in double, weights stored
// as float (measured on torch 1.13; tests/reference/image_reference.txt checks the result).
std::vector<Tap> taps(int64_t in, int64_t out, int64_t first, int64_t count, bool reverse) {
  std::vector<Tap> t(static_cast<size_t>(count));
  const double scale = static_cast<double>(static_cast<float>(in) / static_cast<float>(out));
  for (int64_t j = 0; j < count; ++j) {
    const int64_t d = first + (reverse ? count - 1 - j : j);
    Tap& tp = t[static_cast<size_t>(j)];
    if (d < 0 || d >= out) continue;
    tp.valid = true;
    if (in == out) {
      tp.a = tp.b = d;
      tp.wa = 1.f;
      tp.wb = 0.f;
      continue;
    }
    double s = scale * (static_cast<double>(d) + 0.5) - 0.5;
    if (s < 0.0) s = 0.0;
    const int64_t i0 = std::min(static_cast<int64_t>(s), in - 1);
    const double l1 = std::clamp(s - static_cast<double>(i0), 0.0, 1.0);
    tp.a = i0;
    tp.b = i0 + (i0 < in - 1 ? 1 : 0);
    tp.wa = static_cast<float>(1.0 - l1);
    tp.wb = static_cast<float>(l1);
  }
  return t;
}

// The two passes as flat loops over a row's w * C values, so that the compiler vectorises
// them: per output value k (column j, channel c) the horizontal taps are the source
// offsets j's taps * C + c with j's weights; padding columns get weight 0 (value 0).
void resample_impl(const uint8_t* base, int64_t src_stride, int64_t region_width, int64_t c,
                   const std::vector<Tap>& ys, const std::vector<Tap>& xs, uint8_t* dst,
                   int64_t dst_stride) {
  const int64_t n = static_cast<int64_t>(xs.size()) * c, rn = region_width * c;
  std::vector<int32_t> idx(static_cast<size_t>(2 * n));
  std::vector<float> buf(static_cast<size_t>(2 * n + 2 * n + rn));
  int32_t* __restrict ia = idx.data();
  int32_t* __restrict ib = ia + n;
  float* __restrict wa = buf.data();
  float* __restrict wb = wa + n;
  float* rows[2] = {wb + n, wb + 2 * n};
  float* __restrict fr = wb + 3 * n;  // one source row as float
  for (int64_t j = 0; j < static_cast<int64_t>(xs.size()); ++j) {
    const Tap& t = xs[static_cast<size_t>(j)];
    for (int64_t ch = 0; ch < c; ++ch) {
      const int64_t k = j * c + ch;
      ia[k] = static_cast<int32_t>(t.a * c + ch);
      ib[k] = static_cast<int32_t>(t.b * c + ch);
      wa[k] = t.valid ? t.wa : 0.f;
      wb[k] = t.valid ? t.wb : 0.f;
    }
  }
  int64_t cached[2] = {-1, -1};
  auto hrow = [&](int64_t y, int slot) -> const float* {
    float* __restrict h = rows[slot];
    if (cached[slot] == y) return h;
    const uint8_t* __restrict r = base + y * src_stride;
    float* __restrict f = fr;
    const int32_t* __restrict xa = ia;
    const int32_t* __restrict xb = ib;
    const float* __restrict ka = wa;
    const float* __restrict kb = wb;
    for (int64_t k = 0; k < rn; ++k) f[k] = static_cast<float>(r[k]);
    for (int64_t k = 0; k < n; ++k) h[k] = ka[k] * f[xa[k]] + kb[k] * f[xb[k]];
    cached[slot] = y;
    return h;
  };
  for (size_t i = 0; i < ys.size(); ++i) {
    uint8_t* __restrict o = dst + static_cast<int64_t>(i) * dst_stride;
    const Tap& ty = ys[i];
    if (!ty.valid) {
      std::memset(o, 0, static_cast<size_t>(n));
      continue;
    }
    // Reuse cached rows: row a goes where it already is, or where b is not.
    const int sa = cached[0] == ty.a ? 0 : cached[1] == ty.a ? 1 : cached[0] == ty.b ? 1 : 0;
    const float* __restrict ha = hrow(ty.a, sa);
    const float* __restrict hb = hrow(ty.b, ty.b == ty.a ? sa : 1 - sa);
    const float y0 = ty.wa, y1 = ty.wb;
    for (int64_t k = 0; k < n; ++k) {
      const float v = std::nearbyint(y0 * ha[k] + y1 * hb[k]);
      o[k] = static_cast<uint8_t>(std::min(std::max(v, 0.f), 255.f));
    }
  }
}

// Python's round() on a double: half to even.
int64_t round_half_even(double v) { return static_cast<int64_t>(std::nearbyint(v)); }

}  // namespace

void resample_bilinear(const Image& src, const CropBox& region, int64_t out_height,
                       int64_t out_width, const CropBox& window, bool flip, uint8_t* dst,
                       int64_t dst_row_stride) {
  DLTRAIN_CHECK(!src.empty(), "resample_bilinear: the source image is empty");
  DLTRAIN_CHECK(
      region.top >= 0 && region.left >= 0 && region.height >= 1 && region.width >= 1 &&
          region.top + region.height <= src.height && region.left + region.width <= src.width,
      "resample_bilinear: region (top ", region.top, ", left ", region.left, ", ", region.height,
      "x", region.width, ") is not inside the ", src.height, "x", src.width, " image");
  DLTRAIN_CHECK(out_height >= 1 && out_width >= 1 && window.height >= 1 && window.width >= 1,
                "resample_bilinear: output ", out_height, "x", out_width, " and window ",
                window.height, "x", window.width, " must be positive");
  DLTRAIN_CHECK(dst != nullptr && dst_row_stride >= window.width * src.channels,
                "resample_bilinear: dst_row_stride ", dst_row_stride, " is below window width x ",
                "channels (", window.width * src.channels, ")");
  const auto ys = taps(region.height, out_height, window.top, window.height, false);
  const auto xs = taps(region.width, out_width, window.left, window.width, flip);
  const int64_t stride = src.row_stride();
  const uint8_t* base = src.data() + region.top * stride + region.left * src.channels;
  DLTRAIN_CHECK(src.channels == 1 || src.channels == 3 || src.channels == 4,
                "resample_bilinear: images have 1, 3 or 4 channels, got ", src.channels);
  resample_impl(base, stride, region.width, src.channels, ys, xs, dst, dst_row_stride);
}

Image resize(const Image& src, int64_t height, int64_t width) {
  DLTRAIN_CHECK(height >= 1 && width >= 1, "resize: the output size must be positive, got ", height,
                "x", width);
  Image out(width, height, src.channels);
  resample_bilinear(src, {0, 0, src.height, src.width}, height, width, {0, 0, height, width}, false,
                    out.data(), out.row_stride());
  return out;
}

Image crop(const Image& src, const CropBox& box) {
  DLTRAIN_CHECK(box.top >= 0 && box.left >= 0 && box.height >= 1 && box.width >= 1 &&
                    box.top + box.height <= src.height && box.left + box.width <= src.width,
                "crop: box (top ", box.top, ", left ", box.left, ", ", box.height, "x", box.width,
                ") is not inside the ", src.height, "x", src.width, " image");
  Image out(box.width, box.height, src.channels);
  for (int64_t y = 0; y < box.height; ++y)
    std::memcpy(out.data() + y * out.row_stride(),
                src.data() + (box.top + y) * src.row_stride() + box.left * src.channels,
                static_cast<size_t>(out.row_stride()));
  return out;
}

Image hflip(const Image& src) {
  DLTRAIN_CHECK(!src.empty(), "hflip: the image is empty");
  Image out(src.width, src.height, src.channels);
  const int64_t c = src.channels;
  for (int64_t y = 0; y < src.height; ++y)
    for (int64_t x = 0; x < src.width; ++x)
      std::memcpy(out.data() + (y * src.width + x) * c,
                  src.data() + (y * src.width + (src.width - 1 - x)) * c, static_cast<size_t>(c));
  return out;
}

// --- transforms ----------------------------------------------------------------------

Resize::Resize(int64_t size) : size_(size) {
  DLTRAIN_CHECK(size >= 1, "Resize: size must be >= 1, got ", size);
}

std::array<int64_t, 2> Resize::output_size(int64_t height, int64_t width) const {
  DLTRAIN_CHECK(height >= 1 && width >= 1, "Resize: the image is empty (", height, "x", width, ")");
  // torchvision: new_long = int(size * long / short), a float division then truncation.
  if (width <= height) {
    const auto lng =
        static_cast<int64_t>(static_cast<double>(size_ * height) / static_cast<double>(width));
    return {lng, size_};
  }
  const auto lng =
      static_cast<int64_t>(static_cast<double>(size_ * width) / static_cast<double>(height));
  return {size_, lng};
}

Image Resize::operator()(const Image& src) const {
  const auto hw = output_size(src.height, src.width);
  return resize(src, hw[0], hw[1]);
}

CenterCrop::CenterCrop(int64_t size) : size_(size) {
  DLTRAIN_CHECK(size >= 1, "CenterCrop: size must be >= 1, got ", size);
}

CropBox CenterCrop::box(int64_t height, int64_t width) const {
  auto start = [&](int64_t extent) {
    if (size_ > extent) return -((size_ - extent) / 2);  // zero padding, left/top share
    return round_half_even(static_cast<double>(extent - size_) / 2.0);
  };
  return {start(height), start(width), size_, size_};
}

Image CenterCrop::operator()(const Image& src) const {
  DLTRAIN_CHECK(!src.empty(), "CenterCrop: the image is empty");
  const CropBox b = box(src.height, src.width);
  Image out(size_, size_, src.channels);
  const int64_t c = src.channels;
  for (int64_t y = 0; y < size_; ++y) {
    const int64_t sy = b.top + y;
    if (sy < 0 || sy >= src.height) continue;
    for (int64_t x = 0; x < size_; ++x) {
      const int64_t sx = b.left + x;
      if (sx < 0 || sx >= src.width) continue;
      std::memcpy(out.data() + (y * size_ + x) * c, src.data() + (sy * src.width + sx) * c,
                  static_cast<size_t>(c));
    }
  }
  return out;
}

RandomResizedCrop::RandomResizedCrop(int64_t size, std::array<double, 2> scale,
                                     std::array<double, 2> ratio)
    : size_(size), scale_(scale), ratio_(ratio) {
  DLTRAIN_CHECK(size >= 1, "RandomResizedCrop: size must be >= 1, got ", size);
  DLTRAIN_CHECK(scale[0] > 0 && scale[0] <= scale[1],
                "RandomResizedCrop: scale must satisfy 0 < min <= max, got {", scale[0], ", ",
                scale[1], "}");
  DLTRAIN_CHECK(ratio[0] > 0 && ratio[0] <= ratio[1],
                "RandomResizedCrop: ratio must satisfy 0 < min <= max, got {", ratio[0], ", ",
                ratio[1], "}");
}

CropBox RandomResizedCrop::get_params(int64_t height, int64_t width, SampleRandom& rng) const {
  DLTRAIN_CHECK(height >= 1 && width >= 1, "RandomResizedCrop: the image is empty (", height, "x",
                width, ")");
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(ratio_[0]), log_hi = std::log(ratio_[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * rng.uniform(scale_[0], scale_[1]);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const int64_t w = round_half_even(std::sqrt(target * aspect));
    const int64_t h = round_half_even(std::sqrt(target / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int64_t top = rng.randint(0, height - h + 1);
      const int64_t left = rng.randint(0, width - w + 1);
      return {top, left, h, w};
    }
  }
  // Fallback: the centre crop of the whole image, clamped to the ratio range.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < ratio_[0]) {
    h = round_half_even(static_cast<double>(w) / ratio_[0]);
  } else if (in_ratio > ratio_[1]) {
    w = round_half_even(static_cast<double>(h) * ratio_[1]);
  }
  h = std::clamp<int64_t>(h, 1, height);
  w = std::clamp<int64_t>(w, 1, width);
  return {(height - h) / 2, (width - w) / 2, h, w};
}

Image RandomResizedCrop::operator()(const Image& src, SampleRandom& rng) const {
  const CropBox b = get_params(src.height, src.width, rng);
  Image out(size_, size_, src.channels);
  resample_bilinear(src, b, size_, size_, {0, 0, size_, size_}, false, out.data(),
                    out.row_stride());
  return out;
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  DLTRAIN_CHECK(p >= 0 && p <= 1, "RandomHorizontalFlip: p must be in [0, 1], got ", p);
}

Image RandomHorizontalFlip::operator()(const Image& src, SampleRandom& rng) const {
  return draw(rng) ? hflip(src) : src;
}

// --- pipelines -----------------------------------------------------------------------

ImagePipeline ImagePipeline::train(int64_t size) {
  ImagePipeline p;
  p.kind = Kind::Train;
  p.size = size;
  return p;
}

ImagePipeline ImagePipeline::eval(int64_t resize, int64_t size) {
  ImagePipeline p;
  p.kind = Kind::Eval;
  p.resize = resize;
  p.size = size;
  return p;
}

void ImagePipeline::check() const {
  DLTRAIN_CHECK(size >= 1, "ImagePipeline: size must be >= 1, got ", size);
  if (kind == Kind::Train) {  // the transforms' constructors check their arguments
    (void)RandomResizedCrop(size, scale, ratio);
    (void)RandomHorizontalFlip(flip_p);
    DLTRAIN_CHECK(augment.size() <= 254,
                  "ImagePipeline: at most 254 augmentations (streams 2..255), got ",
                  augment.size());
    for (size_t k = 0; k < augment.size(); ++k)
      DLTRAIN_CHECK(augment[k] != nullptr, "ImagePipeline: augment[", k, "] is null");
  } else {
    DLTRAIN_CHECK(resize >= 1, "ImagePipeline: resize must be >= 1, got ", resize);
    DLTRAIN_CHECK(augment.empty(), "ImagePipeline: augment holds ", augment.size(),
                  " augmentation(s) but this is an Eval pipeline, which does not augment; use "
                  "ImagePipeline::train or clear augment");
  }
}

namespace {

void run_train(const ImagePipeline& p, const Image& img, const CropBox& box, bool flip,
               uint64_t seed, int64_t epoch, int64_t index, uint8_t* out) {
  if (p.augment.empty()) {
    resample_bilinear(img, box, p.size, p.size, {0, 0, p.size, p.size}, flip, out, p.size * 3);
    return;
  }
  Image a(p.size, p.size, 3);
  resample_bilinear(img, box, p.size, p.size, {0, 0, p.size, p.size}, flip, a.data(), p.size * 3);
  for (size_t k = 0; k < p.augment.size(); ++k) {
    SampleRandom rng(seed, epoch, index, static_cast<uint32_t>(2 + k));
    a = (*p.augment[k])(a, rng);
    DLTRAIN_CHECK(a.width == p.size && a.height == p.size && a.channels == 3,
                  "ImagePipeline: augment[", k, "] (", p.augment[k]->repr(), ") returned a ",
                  a.height, "x", a.width, "x", a.channels, " image; expected ", p.size, "x", p.size,
                  "x3");
  }
  std::memcpy(out, a.data(), a.pixels.size());
}

void run_eval(const ImagePipeline& p, const Image& img, uint8_t* out) {
  const auto hw = Resize(p.resize).output_size(img.height, img.width);
  const CropBox win = CenterCrop(p.size).box(hw[0], hw[1]);
  resample_bilinear(img, {0, 0, img.height, img.width}, hw[0], hw[1], win, false, out, p.size * 3);
}

// A box on the header-size image mapped onto the image decoded at a smaller scale.
CropBox map_box(const CropBox& b, int64_t h, int64_t w, int64_t sh, int64_t sw) {
  const double fy = static_cast<double>(sh) / static_cast<double>(h);
  const double fx = static_cast<double>(sw) / static_cast<double>(w);
  CropBox m;
  m.height = std::clamp<int64_t>(std::llround(static_cast<double>(b.height) * fy), 1, sh);
  m.width = std::clamp<int64_t>(std::llround(static_cast<double>(b.width) * fx), 1, sw);
  m.top = std::clamp<int64_t>(std::llround(static_cast<double>(b.top) * fy), 0, sh - m.height);
  m.left = std::clamp<int64_t>(std::llround(static_cast<double>(b.left) * fx), 0, sw - m.width);
  return m;
}

}  // namespace

void ImagePipeline::apply(const Image& src, uint64_t seed, int64_t epoch, int64_t index,
                          uint8_t* out) const {
  DLTRAIN_CHECK(src.channels == 3, "ImagePipeline: expected a 3-channel RGB image, got ",
                src.channels, " channels");
  if (kind == Kind::Eval) return run_eval(*this, src, out);
  SampleRandom crop_rng(seed, epoch, index, 0), flip_rng(seed, epoch, index, 1);
  const CropBox box =
      RandomResizedCrop(size, scale, ratio).get_params(src.height, src.width, crop_rng);
  run_train(*this, src, box, RandomHorizontalFlip(flip_p).draw(flip_rng), seed, epoch, index, out);
}

void ImagePipeline::apply_jpeg(const uint8_t* data, size_t n, uint64_t seed, int64_t epoch,
                               int64_t index, uint8_t* out) const {
  const ImageInfo info = read_jpeg_header(data, n);
  const int64_t h = info.height, w = info.width;
  if (kind == Kind::Eval) {
    const JpegScale s = dct_scaling ? jpeg_scale_for(std::min(h, w), resize) : JpegScale{1, 1};
    return run_eval(*this, decode_jpeg_scaled(data, n, s), out);
  }
  SampleRandom crop_rng(seed, epoch, index, 0), flip_rng(seed, epoch, index, 1);
  const CropBox box = RandomResizedCrop(size, scale, ratio).get_params(h, w, crop_rng);
  const bool flip = RandomHorizontalFlip(flip_p).draw(flip_rng);
  const JpegScale s =
      dct_scaling ? jpeg_scale_for_crop(std::min(box.height, box.width), size) : JpegScale{1, 1};
  const CropBox scaled =
      s.num == s.denom ? box : map_box(box, h, w, jpeg_scaled(h, s), jpeg_scaled(w, s));
  CropBox in_image;
  const Image img = decode_jpeg_region(data, n, s, scaled, in_image);
  run_train(*this, img, in_image, flip, seed, epoch, index, out);
}

// --- to_float_batch ------------------------------------------------------------------

Tensor to_float_batch(const Tensor& batch, const std::vector<float>& mean,
                      const std::vector<float>& std, MemoryFormat format, DType dtype) {
  DLTRAIN_CHECK(batch.defined() && batch.dtype() == DType::u8 && batch.dim() == 4,
                "to_float_batch: expected a u8 batch [N, H, W, C], got ",
                batch.defined() ? dtype_name(batch.dtype()) : "undefined", " ",
                batch.defined() ? shape_str(batch.shape()) : "");
  DLTRAIN_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16,
                "to_float_batch: the output dtype must be f32, f16 or bf16, got ",
                dtype_name(dtype));
  DLTRAIN_CHECK(format != MemoryFormat::Preserve,
                "to_float_batch: choose MemoryFormat::Contiguous (NCHW) or ChannelsLast");
  const int64_t n = batch.size(0), h = batch.size(1), w = batch.size(2), c = batch.size(3);
  auto per_channel = [&](const std::vector<float>& v, const char* name, float dflt) {
    DLTRAIN_CHECK(v.empty() || v.size() == 1 || static_cast<int64_t>(v.size()) == c,
                  "to_float_batch: ", name, " has ", v.size(), " values; give 1 or ", c,
                  " (one per channel)");
    std::vector<float> out(static_cast<size_t>(c), dflt);
    for (int64_t k = 0; k < c && !v.empty(); ++k)
      out[static_cast<size_t>(k)] = v[v.size() == 1 ? 0 : static_cast<size_t>(k)];
    return out;
  };
  const auto m = per_channel(mean, "mean", 0.f), s = per_channel(std, "std", 1.f);
  for (float v : s) DLTRAIN_CHECK(v > 0, "to_float_batch: every std must be > 0, got ", v);
  if (batch.device().is_cuda()) {
    std::vector<float> scale(static_cast<size_t>(c)), shift(static_cast<size_t>(c));
    for (size_t k = 0; k < scale.size(); ++k) {
      scale[k] = 1.f / (255.f * s[k]);
      shift[k] = -m[k] / s[k];
    }
    Tensor out = empty({n, c, h, w}, format, TensorOptions(dtype).with_device(batch.device()));
    backend::cuda::normalize_image(out, batch, scale, shift);
    return out;
  }
  std::vector<float> lut(static_cast<size_t>(c * 256));
  for (int64_t k = 0; k < c; ++k)
    for (int v = 0; v < 256; ++v)
      lut[static_cast<size_t>(k * 256 + v)] =
          (static_cast<float>(v) / 255.f - m[static_cast<size_t>(k)]) / s[static_cast<size_t>(k)];

  const Tensor x = batch.contiguous();
  const uint8_t* in = x.data<uint8_t>();
  const float* table = lut.data();
  Tensor out = empty({n, c, h, w}, format, DType::f32);
  float* o = out.data<float>();
  const int64_t rows = n * h;  // one task unit = one image row
  if (format == MemoryFormat::ChannelsLast) {
    parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * w * c, e = r1 * w * c; i < e; i += c)
        for (int64_t k = 0; k < c; ++k) o[i + k] = table[k * 256 + in[i + k]];
    });
  } else {
    parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t img = r / h, y = r % h;
        const uint8_t* src = in + r * w * c;
        for (int64_t k = 0; k < c; ++k) {
          float* dst = o + ((img * c + k) * h + y) * w;
          const float* t = table + k * 256;
          for (int64_t xx = 0; xx < w; ++xx) dst[xx] = t[src[xx * c + k]];
        }
      }
    });
  }
  return dtype == DType::f32 ? out : out.to(dtype);
}

}  // namespace dltrain::data
