// torchvision's augmentations on u8 HWC images (see augment.hpp for the arithmetic it
// follows). Hand-written because no C++ image library reproduces torchvision's tensor-path
// arithmetic (its float32 blends truncated to u8, its float32 HSV round trip, its affine
// grid and nearest sampling); OpenCV and PIL round and sample differently. Every op is a
// flat loop over the interleaved pixels, or a per-channel loop where torchvision works per
// channel (autocontrast, equalize).
#include "dltrain/data/augment.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <sstream>

#include "dltrain/core/error.hpp"

namespace dltrain::data {

namespace {

void check_image(const Image& src, const char* op) {
  DLTRAIN_CHECK(!src.empty() && src.width >= 1 && src.height >= 1, op,
                ": expected a non-empty image");
  DLTRAIN_CHECK(src.channels == 1 || src.channels == 3, op,
                ": expected a 1- or 3-channel image (as torchvision), got ", src.channels,
                " channels");
}

void check_factor(double f, const char* op) {
  DLTRAIN_CHECK(f >= 0 && std::isfinite(f), op, ": the factor must be finite and >= 0, got ", f);
}

void check_fill(const std::vector<uint8_t>& fill, const char* who) {
  DLTRAIN_CHECK(fill.empty() || fill.size() == 1 || fill.size() == 3, who,
                ": fill must have 0 (black), 1 or 3 (one per channel) values, got ", fill.size());
}

inline uint8_t clamp_trunc(float v) {  // clamp(0, 255).to(uint8): truncation toward 0
  return static_cast<uint8_t>(std::min(std::max(v, 0.f), 255.f));
}

inline uint8_t round_u8(float v) {  // torch.round (half to even) then to(uint8)
  return static_cast<uint8_t>(std::min(std::max(std::nearbyint(v), 0.f), 255.f));
}

// _blend(img1, img2, ratio) with img2 per pixel.
void blend(const uint8_t* a, const uint8_t* b, uint8_t* out, size_t n, double ratio) {
  const float r = static_cast<float>(ratio), q = static_cast<float>(1.0 - ratio);
  for (size_t i = 0; i < n; ++i)
    out[i] = clamp_trunc(r * static_cast<float>(a[i]) + q * static_cast<float>(b[i]));
}

// 0.2989 R + 0.587 G + 0.114 B in float32, truncated (rgb_to_grayscale), one value per pixel.
std::vector<uint8_t> gray_plane(const Image& src) {
  const size_t n = static_cast<size_t>(src.width * src.height);
  std::vector<uint8_t> g(n);
  const uint8_t* p = src.data();
  if (src.channels == 1) {
    std::memcpy(g.data(), p, n);
    return g;
  }
  for (size_t i = 0; i < n; ++i) {
    const float v = 0.2989f * static_cast<float>(p[3 * i]) +
                    0.587f * static_cast<float>(p[3 * i + 1]) +
                    0.114f * static_cast<float>(p[3 * i + 2]);
    g[i] = static_cast<uint8_t>(v);
  }
  return g;
}

Image like(const Image& src) {
  Image out;
  out.width = src.width;
  out.height = src.height;
  out.channels = src.channels;
  out.pixels.resize(src.pixels.size());
  return out;
}

// torch.linspace(start, end, steps) in float32 as ATen's CPU kernel computes it: step = (end
// - start) / (steps - 1) in float, the first half start + step * i and the second end - step
// * (steps - 1 - i), each a fused multiply-add (the compiler contracts them; torch 2.x on
// x86-64 gives exactly these values, checked by torchvision_augment_check.py), widened to
// double as .item() does. Below 2 * the SIMD width (32 on AVX-512, 16 on AVX2) torch takes
// this scalar path for every value; its vector path (longer tables) may differ by an ulp.
std::vector<double> linspace_f32(double start, double end, int64_t steps) {
  std::vector<double> v(static_cast<size_t>(steps));
  const float s = static_cast<float>(start), e = static_cast<float>(end);
  if (steps == 1) {
    v[0] = s;
    return v;
  }
  const float step = (e - s) / static_cast<float>(steps - 1);
  const int64_t half = steps / 2;
  for (int64_t i = 0; i < steps; ++i)
    v[static_cast<size_t>(i)] = i < half ? std::fma(step, static_cast<float>(i), s)
                                         : std::fma(-step, static_cast<float>(steps - 1 - i), e);
  return v;
}

// 8 - (arange(bins) / ((bins - 1) / k)).round().int(): the float32 quotient rounded half
// to even.
std::vector<double> posterize_bits(int64_t bins, double k) {
  std::vector<double> v(static_cast<size_t>(bins));
  const float d = static_cast<float>(static_cast<double>(bins - 1) / k);
  for (int64_t i = 0; i < bins; ++i)
    v[static_cast<size_t>(i)] = 8.0 - std::nearbyint(static_cast<float>(i) / d);
  return v;
}

// torchvision's _get_inverse_affine_matrix(center, angle, translate, scale, shear) (inverted),
// in double as Python computes it.
std::array<double, 6> inverse_affine(double cx, double cy, double angle, double tx, double ty,
                                     double scale, double shear_x, double shear_y) {
  const double deg = std::numbers::pi / 180.0;
  const double rot = angle * deg, sx = shear_x * deg, sy = shear_y * deg;
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  std::array<double, 6> m{d, -b, 0.0, -c, a, 0.0};
  for (double& v : m) v /= scale;
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
  m[2] += cx;
  m[5] += cy;
  return m;
}

// _gen_affine_grid + grid_sample(nearest, zeros, align_corners=False) with torchvision's
// fill, in float32 as torch computes them.
Image warp_nearest(const Image& src, const std::array<double, 6>& m,
                   const std::vector<uint8_t>& fill) {
  const int64_t w = src.width, h = src.height, c = src.channels;
  const float hw = static_cast<float>(0.5 * static_cast<double>(w));
  const float hh = static_cast<float>(0.5 * static_cast<double>(h));
  float r[6];
  for (int k = 0; k < 6; ++k)
    r[k] = static_cast<float>(m[static_cast<size_t>(k)]) / (k < 3 ? hw : hh);
  const float wf = static_cast<float>(w), hf = static_cast<float>(h);
  std::array<uint8_t, 3> f{0, 0, 0};
  for (int64_t k = 0; k < c && !fill.empty(); ++k)
    f[static_cast<size_t>(k)] = fill[fill.size() == 1 ? 0 : static_cast<size_t>(k)];
  Image out = like(src);
  const uint8_t* in = src.data();
  uint8_t* o = out.data();
  for (int64_t y = 0; y < h; ++y) {
    const float yb = static_cast<float>(y) - hf * 0.5f + 0.5f;
    for (int64_t x = 0; x < w; ++x, o += c) {
      const float xb = static_cast<float>(x) - wf * 0.5f + 0.5f;
      const float gx = xb * r[0] + yb * r[1] + r[2];
      const float gy = xb * r[3] + yb * r[4] + r[5];
      const float ix = std::nearbyint(((gx + 1.f) * wf - 1.f) / 2.f);
      const float iy = std::nearbyint(((gy + 1.f) * hf - 1.f) / 2.f);
      if (ix >= 0.f && ix < wf && iy >= 0.f && iy < hf) {
        const uint8_t* p = in + (static_cast<int64_t>(iy) * w + static_cast<int64_t>(ix)) * c;
        for (int64_t k = 0; k < c; ++k) o[k] = p[k];
      } else {
        for (int64_t k = 0; k < c; ++k) o[k] = f[static_cast<size_t>(k)];
      }
    }
  }
  return out;
}

std::string fill_repr(const std::vector<uint8_t>& fill) {
  if (fill.empty()) return "None";
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < fill.size(); ++i) s << (i ? ", " : "") << static_cast<int>(fill[i]);
  s << "]";
  return s.str();
}

}  // namespace

// --- functional ops --------------------------------------------------------------------

Image adjust_brightness(const Image& src, double factor) {
  check_image(src, "adjust_brightness");
  check_factor(factor, "adjust_brightness");
  Image out = like(src);
  const float r = static_cast<float>(factor);
  for (size_t i = 0; i < src.pixels.size(); ++i)
    out.pixels[i] = clamp_trunc(r * static_cast<float>(src.pixels[i]));
  return out;
}

Image adjust_contrast(const Image& src, double factor) {
  check_image(src, "adjust_contrast");
  check_factor(factor, "adjust_contrast");
  const std::vector<uint8_t> g = gray_plane(src);
  int64_t sum = 0;
  for (uint8_t v : g) sum += v;
  // torch.mean over float32: the integer sum (exact below 2^24) divided in float32.
  const float mean = static_cast<float>(sum) / static_cast<float>(g.size());
  const float r = static_cast<float>(factor), q = static_cast<float>(1.0 - factor);
  const float shift = q * mean;
  Image out = like(src);
  for (size_t i = 0; i < src.pixels.size(); ++i)
    out.pixels[i] = clamp_trunc(r * static_cast<float>(src.pixels[i]) + shift);
  return out;
}

Image adjust_saturation(const Image& src, double factor) {
  check_image(src, "adjust_saturation");
  check_factor(factor, "adjust_saturation");
  if (src.channels == 1) return src;
  const std::vector<uint8_t> g = gray_plane(src);
  const float r = static_cast<float>(factor), q = static_cast<float>(1.0 - factor);
  Image out = like(src);
  const uint8_t* p = src.data();
  uint8_t* o = out.data();
  for (size_t i = 0; i < g.size(); ++i) {
    const float gq = q * static_cast<float>(g[i]);
    for (size_t k = 0; k < 3; ++k)
      o[3 * i + k] = clamp_trunc(r * static_cast<float>(p[3 * i + k]) + gq);
  }
  return out;
}

Image adjust_hue(const Image& src, double factor) {
  check_image(src, "adjust_hue");
  DLTRAIN_CHECK(factor >= -0.5 && factor <= 0.5,
                "adjust_hue: the hue factor must be in [-0.5, 0.5], got ", factor);
  if (src.channels == 1) return src;
  const float hue = static_cast<float>(factor);
  Image out = like(src);
  const uint8_t* p = src.data();
  uint8_t* o = out.data();
  const size_t n = static_cast<size_t>(src.width * src.height);
  for (size_t i = 0; i < n; ++i) {
    // _rgb2hsv on convert_image_dtype(img, float32) = x / 255.
    const float r = static_cast<float>(p[3 * i]) / 255.f;
    const float g = static_cast<float>(p[3 * i + 1]) / 255.f;
    const float b = static_cast<float>(p[3 * i + 2]) / 255.f;
    const float maxc = std::max(std::max(r, g), b), minc = std::min(std::min(r, g), b);
    const bool eqc = maxc == minc;
    const float cr = maxc - minc;
    const float s = cr / (eqc ? 1.f : maxc);
    const float crd = eqc ? 1.f : cr;
    const float rc = (maxc - r) / crd, gc = (maxc - g) / crd, bc = (maxc - b) / crd;
    const float hr = maxc == r ? bc - gc : 0.f;
    const float hg = (maxc == g && maxc != r) ? 2.f + rc - bc : 0.f;
    const float hb = (maxc != g && maxc != r) ? 4.f + gc - rc : 0.f;
    float h = std::fmod((hr + hg + hb) / 6.f + 1.f, 1.f);
    // (h + hue) % 1.0: torch.remainder, the sign of the divisor.
    h = std::fmod(h + hue, 1.f);
    if (h < 0.f) h += 1.f;
    // _hsv2rgb.
    const float v = maxc;
    const float fi = std::floor(h * 6.f);
    const float f = h * 6.f - fi;
    const int sector = ((static_cast<int>(fi) % 6) + 6) % 6;
    const float pp = std::clamp(v * (1.f - s), 0.f, 1.f);
    const float qq = std::clamp(v * (1.f - s * f), 0.f, 1.f);
    const float tt = std::clamp(v * (1.f - s * (1.f - f)), 0.f, 1.f);
    float rgb[3];
    switch (sector) {
      case 0:
        rgb[0] = v, rgb[1] = tt, rgb[2] = pp;
        break;
      case 1:
        rgb[0] = qq, rgb[1] = v, rgb[2] = pp;
        break;
      case 2:
        rgb[0] = pp, rgb[1] = v, rgb[2] = tt;
        break;
      case 3:
        rgb[0] = pp, rgb[1] = qq, rgb[2] = v;
        break;
      case 4:
        rgb[0] = tt, rgb[1] = pp, rgb[2] = v;
        break;
      default:
        rgb[0] = v, rgb[1] = pp, rgb[2] = qq;
        break;
    }
    // convert_image_dtype(float -> uint8): x * (255 + 1 - 1e-3), truncated.
    constexpr float kScale = static_cast<float>(255.0 + 1.0 - 1e-3);
    for (size_t k = 0; k < 3; ++k) o[3 * i + k] = static_cast<uint8_t>(rgb[k] * kScale);
  }
  return out;
}

Image adjust_sharpness(const Image& src, double factor) {
  check_image(src, "adjust_sharpness");
  check_factor(factor, "adjust_sharpness");
  const int64_t w = src.width, h = src.height, c = src.channels;
  if (w <= 2 || h <= 2) return src;
  // _blurred_degenerate_image: the 3x3 kernel [1 1 1; 1 5 1; 1 1 1] / 13 in float32 inside,
  // rounded; the border keeps the original pixels.
  Image blurred = src;
  const float k1 = 1.f / 13.f, k5 = 5.f / 13.f;
  const int64_t rs = w * c;
  for (int64_t y = 1; y < h - 1; ++y) {
    // The nine taps in row-major order, over a row's interior values as one flat loop.
    const uint8_t* __restrict a = src.data() + (y - 1) * rs;
    const uint8_t* __restrict m = a + rs;
    const uint8_t* __restrict b = m + rs;
    uint8_t* __restrict o = blurred.data() + y * rs;
    for (int64_t i = c; i < rs - c; ++i) {
      float acc = k1 * static_cast<float>(a[i - c]);
      acc += k1 * static_cast<float>(a[i]);
      acc += k1 * static_cast<float>(a[i + c]);
      acc += k1 * static_cast<float>(m[i - c]);
      acc += k5 * static_cast<float>(m[i]);
      acc += k1 * static_cast<float>(m[i + c]);
      acc += k1 * static_cast<float>(b[i - c]);
      acc += k1 * static_cast<float>(b[i]);
      acc += k1 * static_cast<float>(b[i + c]);
      o[i] = round_u8(acc);
    }
  }
  Image out = like(src);
  blend(src.data(), blurred.data(), out.data(), src.pixels.size(), factor);
  return out;
}

Image rgb_to_grayscale(const Image& src, int64_t output_channels) {
  check_image(src, "rgb_to_grayscale");
  DLTRAIN_CHECK(output_channels == 1 || output_channels == 3,
                "rgb_to_grayscale: output_channels must be 1 or 3, got ", output_channels);
  const std::vector<uint8_t> g = gray_plane(src);
  Image out(src.width, src.height, output_channels);
  for (size_t i = 0; i < g.size(); ++i)
    for (size_t k = 0; k < static_cast<size_t>(output_channels); ++k)
      out.pixels[i * static_cast<size_t>(output_channels) + k] = g[i];
  return out;
}

Image posterize(const Image& src, int64_t bits) {
  check_image(src, "posterize");
  DLTRAIN_CHECK(bits >= 0 && bits <= 8, "posterize: bits must be in [0, 8], got ", bits);
  const uint8_t mask = static_cast<uint8_t>(0xFF00 >> bits);
  Image out = like(src);
  for (size_t i = 0; i < src.pixels.size(); ++i) out.pixels[i] = src.pixels[i] & mask;
  return out;
}

Image solarize(const Image& src, double threshold) {
  check_image(src, "solarize");
  DLTRAIN_CHECK(threshold <= 255, "solarize: the threshold must be <= 255, got ", threshold);
  const float t = static_cast<float>(threshold);
  Image out = like(src);
  for (size_t i = 0; i < src.pixels.size(); ++i) {
    const uint8_t v = src.pixels[i];
    out.pixels[i] = static_cast<float>(v) >= t ? static_cast<uint8_t>(255 - v) : v;
  }
  return out;
}

Image autocontrast(const Image& src) {
  check_image(src, "autocontrast");
  const int64_t c = src.channels;
  const size_t n = static_cast<size_t>(src.width * src.height);
  std::array<float, 3> lo{}, scale{};
  for (int64_t k = 0; k < c; ++k) {
    uint8_t mn = 255, mx = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint8_t v = src.pixels[i * static_cast<size_t>(c) + static_cast<size_t>(k)];
      mn = std::min(mn, v);
      mx = std::max(mx, v);
    }
    const size_t kk = static_cast<size_t>(k);
    if (mn == mx) {  // 255 / 0 is not finite: torchvision sets minimum 0, scale 1
      lo[kk] = 0.f;
      scale[kk] = 1.f;
    } else {
      lo[kk] = static_cast<float>(mn);
      scale[kk] = 255.f / (static_cast<float>(mx) - static_cast<float>(mn));
    }
  }
  Image out = like(src);
  for (size_t i = 0; i < n; ++i)
    for (size_t k = 0; k < static_cast<size_t>(c); ++k) {
      const size_t j = i * static_cast<size_t>(c) + k;
      out.pixels[j] = clamp_trunc((static_cast<float>(src.pixels[j]) - lo[k]) * scale[k]);
    }
  return out;
}

Image equalize(const Image& src) {
  check_image(src, "equalize");
  const size_t c = static_cast<size_t>(src.channels);
  const size_t n = static_cast<size_t>(src.width * src.height);
  Image out = like(src);
  for (size_t k = 0; k < c; ++k) {
    std::array<int64_t, 256> hist{};
    for (size_t i = 0; i < n; ++i) ++hist[src.pixels[i * c + k]];
    // step = (sum of the nonzero bins but the last nonzero one) // 255.
    int64_t last = 255;
    while (hist[static_cast<size_t>(last)] == 0) --last;
    int64_t total = 0;
    for (int64_t v = 0; v < last; ++v) total += hist[static_cast<size_t>(v)];
    const int64_t step = total / 255;
    std::array<uint8_t, 256> lut{};
    if (step == 0) {
      for (int v = 0; v < 256; ++v) lut[static_cast<size_t>(v)] = static_cast<uint8_t>(v);
    } else {
      // lut[v] = (cumsum[v - 1] + step // 2) // step, lut[0] = 0, clamped to 255.
      int64_t cum = 0;
      for (size_t v = 0; v < 256; ++v) {
        lut[v] = static_cast<uint8_t>(std::min<int64_t>((cum + step / 2) / step, 255));
        cum += hist[v];
      }
    }
    for (size_t i = 0; i < n; ++i) out.pixels[i * c + k] = lut[src.pixels[i * c + k]];
  }
  return out;
}

Image invert(const Image& src) {
  check_image(src, "invert");
  Image out = like(src);
  for (size_t i = 0; i < src.pixels.size(); ++i)
    out.pixels[i] = static_cast<uint8_t>(255 - src.pixels[i]);
  return out;
}

Image gaussian_blur(const Image& src, std::array<int64_t, 2> kernel_size,
                    std::array<double, 2> sigma) {
  check_image(src, "gaussian_blur");
  for (int a = 0; a < 2; ++a) {
    DLTRAIN_CHECK(
        kernel_size[static_cast<size_t>(a)] >= 1 && kernel_size[static_cast<size_t>(a)] % 2 == 1,
        "gaussian_blur: kernel sizes must be odd and positive, got {", kernel_size[0], ", ",
        kernel_size[1], "}");
    DLTRAIN_CHECK(sigma[static_cast<size_t>(a)] > 0, "gaussian_blur: sigma must be > 0, got {",
                  sigma[0], ", ", sigma[1], "}");
  }
  const int64_t w = src.width, h = src.height, c = src.channels;
  const int64_t rx = kernel_size[0] / 2, ry = kernel_size[1] / 2;
  DLTRAIN_CHECK(rx < w && ry < h,
                "gaussian_blur: reflect padding needs kernel_size / 2 "
                "smaller than the image; kernel {",
                kernel_size[0], ", ", kernel_size[1], "} on a ", w, "x", h, " image");
  // _get_gaussian_kernel1d in float32.
  auto kernel1d = [](int64_t k, double s) {
    const std::vector<double> x =
        linspace_f32(-(static_cast<double>(k) - 1) * 0.5, (static_cast<double>(k) - 1) * 0.5, k);
    std::vector<float> pdf(static_cast<size_t>(k));
    float sum = 0.f;
    const float sf = static_cast<float>(s);
    for (size_t i = 0; i < pdf.size(); ++i) {
      const float t = static_cast<float>(x[i]) / sf;
      pdf[i] = std::exp(-0.5f * (t * t));
      sum += pdf[i];
    }
    for (float& v : pdf) v /= sum;
    return pdf;
  };
  const std::vector<float> kx = kernel1d(kernel_size[0], sigma[0]);
  const std::vector<float> ky = kernel1d(kernel_size[1], sigma[1]);
  auto reflect = [](int64_t i, int64_t n) { return i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i; };
  // Separable (torch convolves with the outer product kx ky^T: the same sum in another
  // order, so results differ only where a value lies within float noise of a .5 tie).
  std::vector<float> rows(static_cast<size_t>(w * h * c));
  const uint8_t* p = src.data();
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t ch = 0; ch < c; ++ch) {
        float acc = 0.f;
        for (int64_t d = -rx; d <= rx; ++d)
          acc += kx[static_cast<size_t>(d + rx)] *
                 static_cast<float>(p[(y * w + reflect(x + d, w)) * c + ch]);
        rows[static_cast<size_t>((y * w + x) * c + ch)] = acc;
      }
  Image out = like(src);
  for (int64_t y = 0; y < h; ++y)
    for (int64_t i = 0; i < w * c; ++i) {
      float acc = 0.f;
      for (int64_t d = -ry; d <= ry; ++d)
        acc += ky[static_cast<size_t>(d + ry)] *
               rows[static_cast<size_t>(reflect(y + d, h) * w * c + i)];
      out.pixels[static_cast<size_t>(y * w * c + i)] = round_u8(acc);
    }
  return out;
}

Image affine(const Image& src, double angle, std::array<double, 2> translate, double scale,
             std::array<double, 2> shear, const std::vector<uint8_t>& fill,
             const std::vector<double>& center) {
  check_image(src, "affine");
  check_fill(fill, "affine");
  DLTRAIN_CHECK(scale > 0, "affine: scale must be > 0, got ", scale);
  DLTRAIN_CHECK(center.empty() || center.size() == 2,
                "affine: center must be empty (the image centre) or {x, y}, got ", center.size(),
                " values");
  // The tensor path's centre: relative to the image centre, (0, 0) by default.
  double cx = 0, cy = 0;
  if (!center.empty()) {
    cx = center[0] - static_cast<double>(src.width) * 0.5;
    cy = center[1] - static_cast<double>(src.height) * 0.5;
  }
  return warp_nearest(
      src, inverse_affine(cx, cy, angle, translate[0], translate[1], scale, shear[0], shear[1]),
      fill);
}

Image rotate(const Image& src, double angle, const std::vector<uint8_t>& fill) {
  check_image(src, "rotate");
  check_fill(fill, "rotate");
  // F.rotate passes -angle: rotate is counter-clockwise, affine clockwise.
  return warp_nearest(src, inverse_affine(0, 0, -angle, 0, 0, 1, 0, 0), fill);
}

Image erase(const Image& src, const CropBox& box, const std::vector<uint8_t>& value) {
  check_image(src, "erase");
  DLTRAIN_CHECK(value.size() == 1 || static_cast<int64_t>(value.size()) == src.channels,
                "erase: value must have 1 or ", src.channels, " entries, got ", value.size());
  DLTRAIN_CHECK(box.top >= 0 && box.left >= 0 && box.height >= 0 && box.width >= 0 &&
                    box.top + box.height <= src.height && box.left + box.width <= src.width,
                "erase: the box (top ", box.top, ", left ", box.left, ", ", box.height, "x",
                box.width, ") is not inside the ", src.height, "x", src.width, " image");
  Image out = src;
  const int64_t c = src.channels;
  for (int64_t y = box.top; y < box.top + box.height; ++y)
    for (int64_t x = box.left; x < box.left + box.width; ++x)
      for (int64_t k = 0; k < c; ++k)
        out.at(y, x, k) = value[value.size() == 1 ? 0 : static_cast<size_t>(k)];
  return out;
}

// --- the op set ----------------------------------------------------------------------

const char* augment_op_name(AugmentOp op) {
  switch (op) {
    case AugmentOp::Identity:
      return "Identity";
    case AugmentOp::ShearX:
      return "ShearX";
    case AugmentOp::ShearY:
      return "ShearY";
    case AugmentOp::TranslateX:
      return "TranslateX";
    case AugmentOp::TranslateY:
      return "TranslateY";
    case AugmentOp::Rotate:
      return "Rotate";
    case AugmentOp::Brightness:
      return "Brightness";
    case AugmentOp::Color:
      return "Color";
    case AugmentOp::Contrast:
      return "Contrast";
    case AugmentOp::Sharpness:
      return "Sharpness";
    case AugmentOp::Posterize:
      return "Posterize";
    case AugmentOp::Solarize:
      return "Solarize";
    case AugmentOp::AutoContrast:
      return "AutoContrast";
    case AugmentOp::Equalize:
      return "Equalize";
    case AugmentOp::Invert:
      return "Invert";
  }
  return "?";
}

Image apply_augment_op(const Image& src, AugmentOp op, double magnitude,
                       const std::vector<uint8_t>& fill) {
  check_image(src, "apply_augment_op");
  check_fill(fill, "apply_augment_op");
  const double deg = 180.0 / std::numbers::pi;
  // Shears are about the top-left corner (center [0, 0] in pixels).
  const std::vector<double> corner{0.0, 0.0};
  switch (op) {
    case AugmentOp::Identity:
      return src;
    case AugmentOp::ShearX:
      return affine(src, 0, {0, 0}, 1, {std::atan(magnitude) * deg, 0}, fill, corner);
    case AugmentOp::ShearY:
      return affine(src, 0, {0, 0}, 1, {0, std::atan(magnitude) * deg}, fill, corner);
    case AugmentOp::TranslateX:
      return affine(src, 0, {std::trunc(magnitude), 0}, 1, {0, 0}, fill);
    case AugmentOp::TranslateY:
      return affine(src, 0, {0, std::trunc(magnitude)}, 1, {0, 0}, fill);
    case AugmentOp::Rotate:
      return rotate(src, magnitude, fill);
    case AugmentOp::Brightness:
      return adjust_brightness(src, 1.0 + magnitude);
    case AugmentOp::Color:
      return adjust_saturation(src, 1.0 + magnitude);
    case AugmentOp::Contrast:
      return adjust_contrast(src, 1.0 + magnitude);
    case AugmentOp::Sharpness:
      return adjust_sharpness(src, 1.0 + magnitude);
    case AugmentOp::Posterize:
      return posterize(src, static_cast<int64_t>(magnitude));
    case AugmentOp::Solarize:
      return solarize(src, magnitude);
    case AugmentOp::AutoContrast:
      return autocontrast(src);
    case AugmentOp::Equalize:
      return equalize(src);
    case AugmentOp::Invert:
      return invert(src);
  }
  return src;
}

// --- policies ------------------------------------------------------------------------

namespace {

// The space shared by RandAugment and AutoAugment (autoaugment.py's _augmentation_space of
// both), Identity first for RandAugment, Invert last for AutoAugment.
std::vector<AugmentSpaceEntry> standard_space(int64_t bins, int64_t height, int64_t width,
                                              bool identity, bool invert) {
  using O = AugmentOp;
  std::vector<AugmentSpaceEntry> s;
  if (identity) s.push_back({O::Identity, {}, false});
  s.push_back({O::ShearX, linspace_f32(0, 0.3, bins), true});
  s.push_back({O::ShearY, linspace_f32(0, 0.3, bins), true});
  s.push_back(
      {O::TranslateX, linspace_f32(0, 150.0 / 331.0 * static_cast<double>(width), bins), true});
  s.push_back(
      {O::TranslateY, linspace_f32(0, 150.0 / 331.0 * static_cast<double>(height), bins), true});
  s.push_back({O::Rotate, linspace_f32(0, 30, bins), true});
  s.push_back({O::Brightness, linspace_f32(0, 0.9, bins), true});
  s.push_back({O::Color, linspace_f32(0, 0.9, bins), true});
  s.push_back({O::Contrast, linspace_f32(0, 0.9, bins), true});
  s.push_back({O::Sharpness, linspace_f32(0, 0.9, bins), true});
  s.push_back({O::Posterize, posterize_bits(bins, 4.0), false});
  s.push_back({O::Solarize, linspace_f32(255, 0, bins), false});
  s.push_back({O::AutoContrast, {}, false});
  s.push_back({O::Equalize, {}, false});
  if (invert) s.push_back({O::Invert, {}, false});
  return s;
}

}  // namespace

TrivialAugmentWide::TrivialAugmentWide(int64_t num_magnitude_bins, std::vector<uint8_t> fill)
    : bins_(num_magnitude_bins), fill_(std::move(fill)) {
  DLTRAIN_CHECK(bins_ >= 2, "TrivialAugmentWide: num_magnitude_bins must be >= 2, got ", bins_);
  check_fill(fill_, "TrivialAugmentWide");
  using O = AugmentOp;
  space_ = {{O::Identity, {}, false},
            {O::ShearX, linspace_f32(0, 0.99, bins_), true},
            {O::ShearY, linspace_f32(0, 0.99, bins_), true},
            {O::TranslateX, linspace_f32(0, 32, bins_), true},
            {O::TranslateY, linspace_f32(0, 32, bins_), true},
            {O::Rotate, linspace_f32(0, 135, bins_), true},
            {O::Brightness, linspace_f32(0, 0.99, bins_), true},
            {O::Color, linspace_f32(0, 0.99, bins_), true},
            {O::Contrast, linspace_f32(0, 0.99, bins_), true},
            {O::Sharpness, linspace_f32(0, 0.99, bins_), true},
            {O::Posterize, posterize_bits(bins_, 6.0), false},
            {O::Solarize, linspace_f32(255, 0, bins_), false},
            {O::AutoContrast, {}, false},
            {O::Equalize, {}, false}};
}

std::vector<AugmentSpaceEntry> TrivialAugmentWide::space() const { return space_; }

AugmentDraw TrivialAugmentWide::draw(SampleRandom& rng) const {
  const AugmentSpaceEntry& e =
      space_[static_cast<size_t>(rng.randint(0, static_cast<int64_t>(space_.size())))];
  AugmentDraw d{e.op, 0.0};
  if (!e.magnitudes.empty())
    d.magnitude = e.magnitudes[static_cast<size_t>(
        rng.randint(0, static_cast<int64_t>(e.magnitudes.size())))];
  if (e.signed_magnitude && rng.randint(0, 2) == 1) d.magnitude = -d.magnitude;
  return d;
}

Image TrivialAugmentWide::operator()(const Image& src, SampleRandom& rng) const {
  const AugmentDraw d = draw(rng);
  return apply_augment_op(src, d.op, d.magnitude, fill_);
}

std::string TrivialAugmentWide::repr() const {
  std::ostringstream s;
  s << "TrivialAugmentWide(num_magnitude_bins=" << bins_ << ", fill=" << fill_repr(fill_) << ")";
  return s.str();
}

RandAugment::RandAugment(int64_t num_ops, int64_t magnitude, int64_t num_magnitude_bins,
                         std::vector<uint8_t> fill)
    : num_ops_(num_ops), magnitude_(magnitude), bins_(num_magnitude_bins), fill_(std::move(fill)) {
  DLTRAIN_CHECK(num_ops_ >= 0, "RandAugment: num_ops must be >= 0, got ", num_ops_);
  DLTRAIN_CHECK(bins_ >= 2, "RandAugment: num_magnitude_bins must be >= 2, got ", bins_);
  DLTRAIN_CHECK(magnitude_ >= 0 && magnitude_ < bins_, "RandAugment: magnitude must be in [0, ",
                bins_, ") (num_magnitude_bins), got ", magnitude_);
  check_fill(fill_, "RandAugment");
}

std::vector<AugmentSpaceEntry> RandAugment::space(int64_t height, int64_t width) const {
  return standard_space(bins_, height, width, true, false);
}

std::vector<AugmentDraw> RandAugment::draw(SampleRandom& rng, int64_t height, int64_t width) const {
  const std::vector<AugmentSpaceEntry> s = space(height, width);
  std::vector<AugmentDraw> out;
  for (int64_t i = 0; i < num_ops_; ++i) {
    const AugmentSpaceEntry& e =
        s[static_cast<size_t>(rng.randint(0, static_cast<int64_t>(s.size())))];
    AugmentDraw d{e.op, e.magnitudes.empty() ? 0.0 : e.magnitudes[static_cast<size_t>(magnitude_)]};
    if (e.signed_magnitude && rng.randint(0, 2) == 1) d.magnitude = -d.magnitude;
    out.push_back(d);
  }
  return out;
}

Image RandAugment::operator()(const Image& src, SampleRandom& rng) const {
  Image img = src;
  for (const AugmentDraw& d : draw(rng, src.height, src.width))
    img = apply_augment_op(img, d.op, d.magnitude, fill_);
  return img;
}

std::string RandAugment::repr() const {
  std::ostringstream s;
  s << "RandAugment(num_ops=" << num_ops_ << ", magnitude=" << magnitude_
    << ", num_magnitude_bins=" << bins_ << ", fill=" << fill_repr(fill_) << ")";
  return s.str();
}

AutoAugment::AutoAugment(std::vector<uint8_t> fill) : fill_(std::move(fill)) {
  check_fill(fill_, "AutoAugment");
}

const std::vector<std::array<AutoAugment::Step, 2>>& AutoAugment::imagenet_policy() {
  using O = AugmentOp;
  static const std::vector<std::array<Step, 2>> policy{
      {{{O::Posterize, 0.4, 8}, {O::Rotate, 0.6, 9}}},
      {{{O::Solarize, 0.6, 5}, {O::AutoContrast, 0.6, -1}}},
      {{{O::Equalize, 0.8, -1}, {O::Equalize, 0.6, -1}}},
      {{{O::Posterize, 0.6, 7}, {O::Posterize, 0.6, 6}}},
      {{{O::Equalize, 0.4, -1}, {O::Solarize, 0.2, 4}}},
      {{{O::Equalize, 0.4, -1}, {O::Rotate, 0.8, 8}}},
      {{{O::Solarize, 0.6, 3}, {O::Equalize, 0.6, -1}}},
      {{{O::Posterize, 0.8, 5}, {O::Equalize, 1.0, -1}}},
      {{{O::Rotate, 0.2, 3}, {O::Solarize, 0.6, 8}}},
      {{{O::Equalize, 0.6, -1}, {O::Posterize, 0.4, 6}}},
      {{{O::Rotate, 0.8, 8}, {O::Color, 0.4, 0}}},
      {{{O::Rotate, 0.4, 9}, {O::Equalize, 0.6, -1}}},
      {{{O::Equalize, 0.0, -1}, {O::Equalize, 0.8, -1}}},
      {{{O::Invert, 0.6, -1}, {O::Equalize, 1.0, -1}}},
      {{{O::Color, 0.6, 4}, {O::Contrast, 1.0, 8}}},
      {{{O::Rotate, 0.8, 8}, {O::Color, 1.0, 2}}},
      {{{O::Color, 0.8, 8}, {O::Solarize, 0.8, 7}}},
      {{{O::Sharpness, 0.4, 7}, {O::Invert, 0.6, -1}}},
      {{{O::ShearX, 0.6, 5}, {O::Equalize, 1.0, -1}}},
      {{{O::Color, 0.4, 0}, {O::Equalize, 0.6, -1}}},
      {{{O::Equalize, 0.4, -1}, {O::Solarize, 0.2, 4}}},
      {{{O::Solarize, 0.6, 5}, {O::AutoContrast, 0.6, -1}}},
      {{{O::Invert, 0.6, -1}, {O::Equalize, 1.0, -1}}},
      {{{O::Color, 0.6, 4}, {O::Contrast, 1.0, 8}}},
      {{{O::Equalize, 0.8, -1}, {O::Equalize, 0.6, -1}}},
  };
  return policy;
}

std::vector<AugmentSpaceEntry> AutoAugment::space(int64_t height, int64_t width) {
  return standard_space(10, height, width, false, true);
}

std::vector<AugmentDraw> AutoAugment::draw(SampleRandom& rng, int64_t height, int64_t width) const {
  const auto& policy = imagenet_policy();
  const auto& sub =
      policy[static_cast<size_t>(rng.randint(0, static_cast<int64_t>(policy.size())))];
  // get_params: policy id, then torch.rand((2,)), then torch.randint(2, (2,)).
  const double probs[2] = {rng.uniform(), rng.uniform()};
  const int64_t signs[2] = {rng.randint(0, 2), rng.randint(0, 2)};
  const std::vector<AugmentSpaceEntry> s = space(height, width);
  std::vector<AugmentDraw> out;
  for (size_t i = 0; i < 2; ++i) {
    const Step& st = sub[i];
    if (!(probs[i] <= st.p)) continue;
    const auto it =
        std::find_if(s.begin(), s.end(), [&](const AugmentSpaceEntry& e) { return e.op == st.op; });
    AugmentDraw d{st.op, 0.0};
    if (st.magnitude_bin >= 0) d.magnitude = it->magnitudes[static_cast<size_t>(st.magnitude_bin)];
    if (it->signed_magnitude && signs[i] == 0) d.magnitude = -d.magnitude;
    out.push_back(d);
  }
  return out;
}

Image AutoAugment::operator()(const Image& src, SampleRandom& rng) const {
  Image img = src;
  for (const AugmentDraw& d : draw(rng, src.height, src.width))
    img = apply_augment_op(img, d.op, d.magnitude, fill_);
  return img;
}

std::string AutoAugment::repr() const {
  return "AutoAugment(policy=AutoAugmentPolicy.IMAGENET, fill=" + fill_repr(fill_) + ")";
}

// --- ColorJitter, RandomGrayscale, GaussianBlur, RandomErasing ------------------------------

ColorJitter::ColorJitter(double brightness, double contrast, double saturation, double hue) {
  const double v[3] = {brightness, contrast, saturation};
  const char* names[3] = {"brightness", "contrast", "saturation"};
  for (size_t i = 0; i < 3; ++i) {
    DLTRAIN_CHECK(v[i] >= 0, "ColorJitter: ", names[i], " must be >= 0, got ", v[i]);
    range_[i] = {std::max(1.0 - v[i], 0.0), 1.0 + v[i]};
    enabled_[i] = v[i] != 0;
  }
  DLTRAIN_CHECK(hue >= 0 && hue <= 0.5, "ColorJitter: hue must be in [0, 0.5], got ", hue);
  range_[3] = {-hue, hue};
  enabled_[3] = hue != 0;
}

ColorJitter ColorJitter::ranges(std::array<double, 2> brightness, std::array<double, 2> contrast,
                                std::array<double, 2> saturation, std::array<double, 2> hue) {
  ColorJitter j;
  const std::array<double, 2> r[3] = {brightness, contrast, saturation};
  const char* names[3] = {"brightness", "contrast", "saturation"};
  for (size_t i = 0; i < 3; ++i) {
    DLTRAIN_CHECK(0 <= r[i][0] && r[i][0] <= r[i][1], "ColorJitter: the ", names[i],
                  " range must satisfy 0 <= lo <= hi, got [", r[i][0], ", ", r[i][1], "]");
    j.range_[i] = r[i];
    j.enabled_[i] = !(r[i][0] == 1 && r[i][1] == 1);
  }
  DLTRAIN_CHECK(-0.5 <= hue[0] && hue[0] <= hue[1] && hue[1] <= 0.5,
                "ColorJitter: the hue range must satisfy -0.5 <= lo <= hi <= 0.5, got [", hue[0],
                ", ", hue[1], "]");
  j.range_[3] = hue;
  j.enabled_[3] = !(hue[0] == 0 && hue[1] == 0);
  return j;
}

ColorJitter::Params ColorJitter::draw(SampleRandom& rng) const {
  Params p;
  // torch.randperm(4): a uniform permutation (Fisher-Yates here).
  p.order = {0, 1, 2, 3};
  for (int64_t i = 3; i > 0; --i)
    std::swap(p.order[static_cast<size_t>(i)], p.order[static_cast<size_t>(rng.randint(0, i + 1))]);
  for (size_t i = 0; i < 4; ++i)
    p.factor[i] = enabled_[i] ? rng.uniform(range_[i][0], range_[i][1])
                              : std::numeric_limits<double>::quiet_NaN();
  return p;
}

Image ColorJitter::apply(const Image& src, const Params& p) const {
  Image img = src;
  for (int id : p.order) {
    const double f = p.factor[static_cast<size_t>(id)];
    if (std::isnan(f)) continue;
    switch (id) {
      case 0:
        img = adjust_brightness(img, f);
        break;
      case 1:
        img = adjust_contrast(img, f);
        break;
      case 2:
        img = adjust_saturation(img, f);
        break;
      default:
        img = adjust_hue(img, f);
        break;
    }
  }
  return img;
}

Image ColorJitter::operator()(const Image& src, SampleRandom& rng) const {
  return apply(src, draw(rng));
}

std::string ColorJitter::repr() const {
  std::ostringstream s;
  const char* names[4] = {"brightness", "contrast", "saturation", "hue"};
  s << "ColorJitter(";
  for (size_t i = 0; i < 4; ++i) {
    s << (i ? ", " : "") << names[i] << "=";
    if (enabled_[i])
      s << "(" << range_[i][0] << ", " << range_[i][1] << ")";
    else
      s << "None";
  }
  s << ")";
  return s.str();
}

RandomGrayscale::RandomGrayscale(double p) : p_(p) {
  DLTRAIN_CHECK(p >= 0 && p <= 1, "RandomGrayscale: p must be in [0, 1], got ", p);
}

Image RandomGrayscale::operator()(const Image& src, SampleRandom& rng) const {
  return rng.uniform() < p_ ? rgb_to_grayscale(src, src.channels) : src;
}

std::string RandomGrayscale::repr() const {
  std::ostringstream s;
  s << "RandomGrayscale(p=" << p_ << ")";
  return s.str();
}

GaussianBlur::GaussianBlur(std::array<int64_t, 2> kernel_size, std::array<double, 2> sigma)
    : kernel_(kernel_size), sigma_(sigma) {
  DLTRAIN_CHECK(kernel_[0] >= 1 && kernel_[0] % 2 == 1 && kernel_[1] >= 1 && kernel_[1] % 2 == 1,
                "GaussianBlur: kernel sizes must be odd and positive, got {", kernel_[0], ", ",
                kernel_[1], "}");
  DLTRAIN_CHECK(0 < sigma_[0] && sigma_[0] <= sigma_[1],
                "GaussianBlur: sigma must satisfy 0 < min <= max, got [", sigma_[0], ", ",
                sigma_[1], "]");
}

Image GaussianBlur::operator()(const Image& src, SampleRandom& rng) const {
  const double s = draw(rng);
  return gaussian_blur(src, kernel_, {s, s});
}

std::string GaussianBlur::repr() const {
  std::ostringstream s;
  s << "GaussianBlur(kernel_size=(" << kernel_[0] << ", " << kernel_[1] << "), sigma=(" << sigma_[0]
    << ", " << sigma_[1] << "))";
  return s.str();
}

RandomErasing::RandomErasing(double p, std::array<double, 2> scale, std::array<double, 2> ratio,
                             std::vector<uint8_t> value)
    : p_(p), scale_(scale), ratio_(ratio), value_(std::move(value)) {
  DLTRAIN_CHECK(p >= 0 && p <= 1, "RandomErasing: p must be in [0, 1], got ", p);
  DLTRAIN_CHECK(0 < scale_[0] && scale_[0] <= scale_[1] && scale_[1] <= 1,
                "RandomErasing: scale must satisfy 0 < lo <= hi <= 1, got [", scale_[0], ", ",
                scale_[1], "]");
  DLTRAIN_CHECK(0 < ratio_[0] && ratio_[0] <= ratio_[1],
                "RandomErasing: ratio must satisfy 0 < lo <= hi, got [", ratio_[0], ", ", ratio_[1],
                "]");
  DLTRAIN_CHECK(value_.size() == 1 || value_.size() == 3,
                "RandomErasing: value must have 1 or 3 (one per channel) entries, got ",
                value_.size());
}

RandomErasing RandomErasing::imagenet(double p) {
  return RandomErasing(p, {0.02, 0.33}, {0.3, 3.3}, {124, 116, 104});
}

RandomErasing RandomErasing::random(double p, std::vector<double> mean, std::vector<double> std,
                                    std::array<double, 2> scale, std::array<double, 2> ratio) {
  DLTRAIN_CHECK((mean.size() == 1 || mean.size() == 3) && std.size() == mean.size(),
                "RandomErasing::random: mean and std must have the same size, 1 or 3 (one per "
                "channel), got ",
                mean.size(), " and ", std.size());
  for (size_t c = 0; c < mean.size(); ++c)
    DLTRAIN_CHECK(std::isfinite(mean[c]) && std[c] > 0 && std::isfinite(std[c]),
                  "RandomErasing::random: channel ", c, " needs a finite mean and a std > 0, got ",
                  mean[c], " and ", std[c], " (the normalisation's, on the 0..1 scale)");
  RandomErasing r(p, scale, ratio);
  r.mean_ = std::move(mean);
  r.std_ = std::move(std);
  return r;
}

CropBox RandomErasing::draw(SampleRandom& rng, int64_t height, int64_t width) const {
  if (!(rng.uniform() < p_)) return {};
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(ratio_[0]), log_hi = std::log(ratio_[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * rng.uniform(scale_[0], scale_[1]);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const int64_t h = static_cast<int64_t>(std::nearbyint(std::sqrt(target * aspect)));
    const int64_t w = static_cast<int64_t>(std::nearbyint(std::sqrt(target / aspect)));
    if (!(h < height && w < width)) continue;
    const int64_t top = rng.randint(0, height - h + 1);
    const int64_t left = rng.randint(0, width - w + 1);
    return {top, left, h, w};
  }
  return {};
}

Image RandomErasing::operator()(const Image& src, SampleRandom& rng) const {
  const CropBox b = draw(rng, src.height, src.width);
  if (b.height == 0 || b.width == 0) return src;
  if (!mean_.empty()) {  // value="random": a standard normal draw per pixel and channel
    const int64_t c = src.channels;
    DLTRAIN_CHECK(mean_.size() == 1 || static_cast<int64_t>(mean_.size()) == c,
                  "RandomErasing: a mean and std for ", mean_.size(), " channels and a ", c,
                  "-channel image");
    check_image(src, "RandomErasing");
    Image out = src;
    for (int64_t y = b.top; y < b.top + b.height; ++y)
      for (int64_t x = b.left; x < b.left + b.width; ++x)
        for (int64_t k = 0; k < c; ++k) {
          const size_t m = mean_.size() == 1 ? 0 : static_cast<size_t>(k);
          // Box-Muller on two uniforms (1 - u in (0, 1] keeps the log finite).
          const double r = std::sqrt(-2.0 * std::log(1.0 - rng.uniform()));
          const double z = r * std::cos(2.0 * std::numbers::pi * rng.uniform());
          const double v = std::nearbyint(255.0 * (mean_[m] + std_[m] * z));
          out.pixels[static_cast<size_t>((y * src.width + x) * c + k)] =
              static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
        }
    return out;
  }
  DLTRAIN_CHECK(value_.size() == 1 || static_cast<int64_t>(value_.size()) == src.channels,
                "RandomErasing: ", value_.size(), " fill values for a ", src.channels,
                "-channel image");
  return erase(src, b, value_);
}

std::string RandomErasing::repr() const {
  std::ostringstream s;
  s << "RandomErasing(p=" << p_ << ", scale=(" << scale_[0] << ", " << scale_[1] << "), ratio=("
    << ratio_[0] << ", " << ratio_[1] << "), value=";
  if (mean_.empty()) {
    s << fill_repr(value_);
  } else {
    s << "'random' (mean";
    for (double m : mean_) s << " " << m;
    s << ", std";
    for (double v : std_) s << " " << v;
    s << ")";
  }
  s << ")";
  return s.str();
}

std::shared_ptr<const Augmentation> make_auto_augment(const std::string& name) {
  if (name == "trivial" || name == "ta_wide") return std::make_shared<TrivialAugmentWide>();
  if (name == "rand" || name == "ra") return std::make_shared<RandAugment>();
  if (name == "imagenet") return std::make_shared<AutoAugment>();
  DLTRAIN_FAIL("make_auto_augment: unknown policy '", name,
               "'; use trivial (TrivialAugmentWide), rand (RandAugment) or imagenet "
               "(AutoAugment, ImageNet policy)");
}

}  // namespace dltrain::data
