// Augmentations (data/augment.hpp): values checked by hand, bad arguments, the distribution
// of the parameters each random transform draws against torchvision's model (chi-square,
// binomial and Kolmogorov-Smirnov tests at the 0.1% level on fixed seeds, so deterministic),
// determinism of the pipeline (any thread count, any loader worker count), and the hidden
// "[.augment_fixture]" that tests/data/torchvision_augment_check.py runs to compare every op
// with torchvision (ctest data.torchvision_augment_agreement).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <thread>

#include "data/data_test_util.hpp"
#include "dltrain/data/augment.hpp"
#include "dltrain/data/dataloader.hpp"
#include "dltrain/data/image_folder.hpp"
#include "dltrain/data/transforms.hpp"
#include "dltrain/dltrain.hpp"
#include "skip.hpp"

using namespace dltrain;
using namespace dltrain::data;
using Catch::Matchers::Contains;

namespace {

// A deterministic test picture: smooth colour gradients (all hues, grey pixels where the
// three channels meet), a sharp-edged rectangle and noise, so that every op has work to do.
Image test_picture(int64_t h, int64_t w, int64_t c, uint64_t seed = 3) {
  Image img(w, h, c);
  SampleRandom rng(seed, 0, 0, 0);
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t k = 0; k < c; ++k) {
        const double phase = 2.0 * 3.14159265358979 * (static_cast<double>(k) / 3.0);
        double v = 128 + 100 * std::sin(0.09 * static_cast<double>(x) + phase) *
                             std::cos(0.07 * static_cast<double>(y) - phase);
        if (y > h / 3 && y < h / 2 && x > w / 4 && x < w / 2) v = k == 0 ? 250 : 20;
        if (x == y) v = 90;  // grey diagonal: r = g = b
        v += rng.uniform(-12, 12);
        img.at(y, x, k) = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
  return img;
}

int max_abs_diff(const Image& a, const Image& b) {
  REQUIRE(a.pixels.size() == b.pixels.size());
  int m = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i)
    m = std::max(m, std::abs(static_cast<int>(a.pixels[i]) - static_cast<int>(b.pixels[i])));
  return m;
}

double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& expected) {
  double x2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double d = static_cast<double>(counts[i]) - expected[i];
    x2 += d * d / expected[i];
  }
  return x2;
}

// Critical values of the chi-square distribution at p = 0.001 (tables), by degrees of freedom.
double chi2_crit(int dof) {
  static const std::map<int, double> t{{2, 13.816}, {13, 34.528}, {23, 49.728}, {30, 59.703}};
  return t.at(dof);
}
// Two-sided z at p = 0.001.
constexpr double kZ = 3.291;
// Kolmogorov-Smirnov: sqrt(n) D < 1.949 at p = 0.001 (asymptotic).
constexpr double kKS = 1.949;

double ks_uniform(std::vector<double> v, double lo, double hi) {
  std::sort(v.begin(), v.end());
  const double n = static_cast<double>(v.size());
  double d = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const double f = (v[i] - lo) / (hi - lo);
    d = std::max({d, f - static_cast<double>(i) / n, static_cast<double>(i + 1) / n - f});
  }
  return std::sqrt(n) * d;
}

size_t bin_of(const std::vector<double>& table, double magnitude) {
  const auto it = std::find(table.begin(), table.end(), std::fabs(magnitude));
  REQUIRE(it != table.end());
  return static_cast<size_t>(it - table.begin());
}

}  // namespace

TEST_CASE("Augmentation ops: identities and hand-computed values", "[augment]") {
  const Image src = test_picture(29, 37, 3);
  CHECK(adjust_brightness(src, 1.0).pixels == src.pixels);
  CHECK(adjust_contrast(src, 1.0).pixels == src.pixels);
  CHECK(adjust_saturation(src, 1.0).pixels == src.pixels);
  CHECK(adjust_sharpness(src, 1.0).pixels == src.pixels);
  CHECK(posterize(src, 8).pixels == src.pixels);
  CHECK(invert(invert(src)).pixels == src.pixels);
  CHECK(rotate(src, 0.0).pixels == src.pixels);
  CHECK(affine(src, 0, {0, 0}, 1, {0, 0}).pixels == src.pixels);
  CHECK(apply_augment_op(src, AugmentOp::Identity, 5).pixels == src.pixels);
  // Hue 0 through float32 HSV and x * 255.999 truncated: the identity (x/255 * 255.999 has
  // margin 0.0039 x over x, far above float noise, and 255 * 0.99999... stays 255).
  CHECK(adjust_hue(src, 0.0).pixels == src.pixels);
  // A vanishing sigma: the centre tap of the kernel is 1 in float32.
  CHECK(gaussian_blur(src, {5, 3}, {0.01, 0.01}).pixels == src.pixels);

  // Brightness 0.5: trunc(0.5 x); 2: min(2x, 255).
  const Image half = adjust_brightness(src, 0.5), twice = adjust_brightness(src, 2.0);
  for (size_t i = 0; i < src.pixels.size(); ++i) {
    REQUIRE(half.pixels[i] == src.pixels[i] / 2);
    REQUIRE(twice.pixels[i] == std::min(2 * src.pixels[i], 255));
  }
  // Grayscale of (100, 150, 200): 0.2989*100 + 0.587*150 + 0.114*200 = 140.74 -> 140.
  Image px(1, 1, 3);
  px.pixels = {100, 150, 200};
  CHECK(rgb_to_grayscale(px, 1).pixels == std::vector<uint8_t>{140});
  CHECK(rgb_to_grayscale(px, 3).pixels == std::vector<uint8_t>{140, 140, 140});
  // Saturation 0 gives the grayscale in every channel; contrast 0 the mean of the grayscale.
  const Image s0 = adjust_saturation(src, 0.0), g3 = rgb_to_grayscale(src, 3);
  CHECK(s0.pixels == g3.pixels);
  // Posterize 3 bits keeps x & 0xE0; solarize 128 inverts x >= 128.
  const Image p3 = posterize(src, 3), sol = solarize(src, 128);
  for (size_t i = 0; i < src.pixels.size(); ++i) {
    REQUIRE(p3.pixels[i] == (src.pixels[i] & 0xE0));
    REQUIRE(sol.pixels[i] == (src.pixels[i] >= 128 ? 255 - src.pixels[i] : src.pixels[i]));
  }
  // Autocontrast maps each channel's min to 0 and max to 255.
  const Image ac = autocontrast(src);
  for (int64_t k = 0; k < 3; ++k) {
    uint8_t mn = 255, mx = 0;
    for (int64_t y = 0; y < src.height; ++y)
      for (int64_t x = 0; x < src.width; ++x) {
        mn = std::min(mn, ac.at(y, x, k));
        mx = std::max(mx, ac.at(y, x, k));
      }
    CHECK(mn == 0);
    CHECK(mx == 255);
  }
  // A flat image: equalize and autocontrast leave it (step 0; max == min).
  Image flat(8, 6, 3);
  std::fill(flat.pixels.begin(), flat.pixels.end(), uint8_t{77});
  CHECK(equalize(flat).pixels == flat.pixels);
  CHECK(autocontrast(flat).pixels == flat.pixels);
  // Translation by (3, -2) pixels: out(y, x) = src(y + 2, x - 3), else the fill.
  const Image t = affine(src, 0, {3, -2}, 1, {0, 0}, {9, 8, 7});
  for (int64_t y = 0; y < src.height; ++y)
    for (int64_t x = 0; x < src.width; ++x)
      for (int64_t k = 0; k < 3; ++k) {
        const int64_t sy = y + 2, sx = x - 3;
        const bool in = sy < src.height && sx >= 0;
        REQUIRE(t.at(y, x, k) == (in ? src.at(sy, sx, k) : static_cast<uint8_t>(9 - k)));
      }
  // Rotation by 90 degrees (counter-clockwise) of an odd square image: an exact permutation,
  // out(y, x) = src(x, n - 1 - y).
  const Image sq = test_picture(15, 15, 3);
  const Image r90 = rotate(sq, 90.0);
  for (int64_t y = 0; y < 15; ++y)
    for (int64_t x = 0; x < 15; ++x)
      for (int64_t k = 0; k < 3; ++k) REQUIRE(r90.at(y, x, k) == sq.at(x, 14 - y, k));
  // Erasing sets exactly the box.
  const Image e = erase(src, {2, 3, 4, 5}, {1, 2, 3});
  for (int64_t y = 0; y < src.height; ++y)
    for (int64_t x = 0; x < src.width; ++x)
      for (int64_t k = 0; k < 3; ++k) {
        const bool in = y >= 2 && y < 6 && x >= 3 && x < 8;
        REQUIRE(e.at(y, x, k) == (in ? static_cast<uint8_t>(k + 1) : src.at(y, x, k)));
      }
  // One-channel images: colour ops that torchvision skips are copies.
  const Image gray = test_picture(20, 24, 1);
  CHECK(adjust_saturation(gray, 0.3).pixels == gray.pixels);
  CHECK(adjust_hue(gray, 0.3).pixels == gray.pixels);
  CHECK(max_abs_diff(adjust_contrast(gray, 1.0), gray) == 0);
}

TEST_CASE("Augmentations reject bad arguments with clear errors", "[augment]") {
  const Image src = test_picture(16, 16, 3);
  CHECK_THROWS_WITH(adjust_brightness(src, -0.1), Contains(">= 0"));
  CHECK_THROWS_WITH(adjust_hue(src, 0.6), Contains("[-0.5, 0.5]"));
  CHECK_THROWS_WITH(posterize(src, 9), Contains("[0, 8]"));
  CHECK_THROWS_WITH(solarize(src, 300), Contains("<= 255"));
  CHECK_THROWS_WITH(gaussian_blur(src, {4, 3}, {1, 1}), Contains("odd"));
  CHECK_THROWS_WITH(gaussian_blur(src, {41, 3}, {1, 1}), Contains("reflect padding"));
  CHECK_THROWS_WITH(rotate(src, 10, {1, 2}), Contains("fill"));
  CHECK_THROWS_WITH(erase(src, {10, 10, 10, 10}, {0}), Contains("not inside"));
  CHECK_THROWS_WITH(rgb_to_grayscale(Image(4, 4, 4)), Contains("1- or 3-channel"));
  CHECK_THROWS_WITH(TrivialAugmentWide(1), Contains("num_magnitude_bins"));
  CHECK_THROWS_WITH(RandAugment(2, 31, 31), Contains("magnitude must be in [0, 31)"));
  CHECK_THROWS_WITH(ColorJitter(0.1, 0.1, 0.1, 0.7), Contains("hue"));
  CHECK_THROWS_WITH(ColorJitter::ranges({1.2, 0.8}, {1, 1}, {1, 1}, {0, 0}),
                    Contains("brightness"));
  CHECK_THROWS_WITH(GaussianBlur({3, 3}, {2.0, 1.0}), Contains("sigma"));
  CHECK_THROWS_WITH(RandomErasing(0.5, {0.02, 0.33}, {0.3, 3.3}, {1, 2}), Contains("value"));
  CHECK_THROWS_WITH(RandomGrayscale(1.5), Contains("[0, 1]"));
  CHECK_THROWS_WITH(make_auto_augment("autoaugment"), Contains("trivial"));
  ImagePipeline p = ImagePipeline::train(32);
  p.augment.push_back(nullptr);
  CHECK_THROWS_WITH(p.check(), Contains("augment[0] is null"));
  ImagePipeline e = ImagePipeline::eval(36, 32);
  e.augment.push_back(make_auto_augment("trivial"));
  CHECK_THROWS_WITH(e.check(), Contains("Eval pipeline"));
}

TEST_CASE("TrivialAugmentWide draws ops, bins and signs uniformly", "[augment][distribution]") {
  const TrivialAugmentWide ta;
  const auto space = ta.space();
  REQUIRE(space.size() == 14);
  const int64_t n = 14000;
  std::vector<int64_t> ops(14, 0), bins(31, 0);
  int64_t signed_draws = 0, negative = 0;
  for (int64_t i = 0; i < n; ++i) {
    SampleRandom rng(21, 0, i, 2);
    const AugmentDraw d = ta.draw(rng);
    const size_t o = static_cast<size_t>(d.op);  // Identity..Equalize are 0..13, space order
    REQUIRE(space[o].op == d.op);
    ++ops[o];
    if (d.op == AugmentOp::Rotate || d.op == AugmentOp::ShearX || d.op == AugmentOp::TranslateY ||
        d.op == AugmentOp::Contrast) {
      ++bins[bin_of(space[o].magnitudes, d.magnitude)];
      if (d.magnitude != 0) {
        ++signed_draws;
        negative += d.magnitude < 0;
      }
    }
    if (!space[o].signed_magnitude) REQUIRE(d.magnitude >= 0);
  }
  CHECK(chi_square(ops, std::vector<double>(14, n / 14.0)) < chi2_crit(13));
  const double per_bin =
      static_cast<double>(std::accumulate(bins.begin(), bins.end(), int64_t{0})) / 31;
  CHECK(chi_square(bins, std::vector<double>(31, per_bin)) < chi2_crit(30));
  const double ns = static_cast<double>(signed_draws);
  CHECK(std::fabs((static_cast<double>(negative) - ns / 2) / std::sqrt(ns / 4)) < kZ);
}

TEST_CASE("RandAugment draws num_ops uniform ops at the fixed magnitude",
          "[augment][distribution]") {
  const RandAugment ra(2, 9, 31);
  const auto space = ra.space(224, 224);
  const int64_t n = 7000;
  std::vector<int64_t> ops(14, 0);
  for (int64_t i = 0; i < n; ++i) {
    SampleRandom rng(22, 0, i, 2);
    const auto draws = ra.draw(rng, 224, 224);
    REQUIRE(draws.size() == 2);
    for (const AugmentDraw& d : draws) {
      const size_t o = static_cast<size_t>(d.op);
      REQUIRE(space[o].op == d.op);
      ++ops[o];
      const double expect = space[o].magnitudes.empty() ? 0.0 : space[o].magnitudes[9];
      REQUIRE(std::fabs(d.magnitude) == expect);
    }
  }
  CHECK(chi_square(ops, std::vector<double>(14, 2.0 * n / 14.0)) < chi2_crit(13));
}

TEST_CASE("AutoAugment applies each sub-policy's ops with their probabilities",
          "[augment][distribution]") {
  const AutoAugment aa;
  const auto& policy = AutoAugment::imagenet_policy();
  REQUIRE(policy.size() == 25);
  // P(0, 1 or 2 ops apply) averaged over the uniformly chosen sub-policy.
  std::vector<double> expected(3, 0.0);
  for (const auto& sub : policy) {
    const double a = sub[0].p, b = sub[1].p;
    expected[0] += (1 - a) * (1 - b) / 25;
    expected[1] += (a * (1 - b) + (1 - a) * b) / 25;
    expected[2] += a * b / 25;
  }
  const int64_t n = 20000;
  std::vector<int64_t> count(3, 0);
  int64_t signed_draws = 0, negative = 0;
  for (int64_t i = 0; i < n; ++i) {
    SampleRandom rng(23, 1, i, 2);
    const auto draws = aa.draw(rng, 224, 224);
    ++count[draws.size()];
    for (const AugmentDraw& d : draws)
      if (d.op == AugmentOp::Rotate) {  // signed, bins 3, 8 and 9 are nonzero
        ++signed_draws;
        negative += d.magnitude < 0;
      }
  }
  for (double& e : expected) e *= n;
  CHECK(chi_square(count, expected) < chi2_crit(2));
  const double ns = static_cast<double>(signed_draws);
  REQUIRE(ns > 1000);
  CHECK(std::fabs((static_cast<double>(negative) - ns / 2) / std::sqrt(ns / 4)) < kZ);
}

TEST_CASE("ColorJitter draws a uniform order and uniform factors", "[augment][distribution]") {
  const ColorJitter cj(0.4, 0.3, 0.2, 0.1);
  const int64_t n = 12000;
  std::map<std::array<int, 4>, int64_t> perms;
  std::vector<double> b, h;
  for (int64_t i = 0; i < n; ++i) {
    SampleRandom rng(24, 0, i, 2);
    const auto p = cj.draw(rng);
    ++perms[p.order];
    b.push_back(p.factor[0]);
    h.push_back(p.factor[3]);
    REQUIRE(p.factor[1] >= 0.7);
    REQUIRE(p.factor[1] < 1.3);
    REQUIRE(p.factor[2] >= 0.8);
    REQUIRE(p.factor[2] < 1.2);
  }
  REQUIRE(perms.size() == 24);
  std::vector<int64_t> counts;
  for (const auto& kv : perms) counts.push_back(kv.second);
  CHECK(chi_square(counts, std::vector<double>(24, n / 24.0)) < chi2_crit(23));
  CHECK(ks_uniform(b, 0.6, 1.4) < kKS);
  CHECK(ks_uniform(h, -0.1, 0.1) < kKS);
  // Disabled adjustments draw nothing and are skipped (torchvision's None).
  SampleRandom rng(24, 0, 0, 2);
  const auto p = ColorJitter(0.0, 0.5).draw(rng);
  CHECK(std::isnan(p.factor[0]));
  CHECK(std::isnan(p.factor[2]));
  CHECK(std::isnan(p.factor[3]));
  CHECK(!std::isnan(p.factor[1]));
}

TEST_CASE("RandomErasing, RandomGrayscale and GaussianBlur draw as torchvision",
          "[augment][distribution]") {
  const int64_t n = 10000;
  const RandomErasing re(0.5);
  int64_t erased = 0;
  std::vector<double> sigmas;
  int64_t grays = 0;
  const RandomGrayscale rg(0.3);
  const GaussianBlur gb({5, 5}, {0.1, 2.0});
  const Image tiny = test_picture(4, 4, 3);
  for (int64_t i = 0; i < n; ++i) {
    SampleRandom rng(25, 0, i, 2);
    const CropBox box = re.draw(rng, 224, 224);
    if (box.height > 0) {
      ++erased;
      REQUIRE(box.height < 224);
      REQUIRE(box.width < 224);
      REQUIRE(box.top + box.height <= 224);
      REQUIRE(box.left + box.width <= 224);
      const double area = static_cast<double>(box.height * box.width) / (224.0 * 224.0);
      REQUIRE(area > 0.015);  // scale 0.02..0.33 up to the rounding of the sides
      REQUIRE(area < 0.36);
    }
    SampleRandom r2(25, 0, i, 3);
    sigmas.push_back(gb.draw(r2));
    SampleRandom r3(25, 0, i, 4);
    const Image g = rg(tiny, r3);
    grays +=
        g.at(0, 0, 0) == g.at(0, 0, 1) && g.at(1, 2, 1) == g.at(1, 2, 2) && g.pixels != tiny.pixels;
  }
  const double nn = static_cast<double>(n);
  CHECK(std::fabs((static_cast<double>(erased) - nn * 0.5) / std::sqrt(nn * 0.25)) < kZ);
  CHECK(std::fabs((static_cast<double>(grays) - nn * 0.3) / std::sqrt(nn * 0.21)) < kZ);
  CHECK(ks_uniform(sigmas, 0.1, 2.0) < kKS);
  // A box never fits a 1-pixel-high image (h < height fails): no erasing, as torchvision.
  SampleRandom rng(25, 0, 0, 2);
  CHECK(RandomErasing(1.0).draw(rng, 1, 50).height == 0);
}

// value="random": the erased bytes, normalised with the mean and std given, are standard normal
// draws. With mean 0.5 and std 0.08 the clamp to 0..255 cuts at |z| = 6.25 (a fraction 4e-10)
// and the rounding adds a uniform error of width q = 1 / (255 * 0.08) = 0.049, variance
// q^2 / 12 = 2.0e-4. Bounds: the mean within 5 standard errors of 0, the variance within
// 5 standard errors (sqrt(2 / n)) of 1 + q^2 / 12, and the fraction beyond |z| > 1.96 within
// 5 binomial standard errors of 0.05 (the rounding moves the cut by at most q / 2: widened by
// the normal density there, 0.058, times q).
TEST_CASE("RandomErasing value='random' erases to standard normal noise of the normalised image",
          "[augment][distribution]") {
  const double mean = 0.5, sd = 0.08, q = 1.0 / (255.0 * sd);
  const RandomErasing re = RandomErasing::random(1.0, {mean}, {sd});
  CHECK_THAT(re.repr(), Contains("value='random'"));
  Image src(64, 64, 1);
  std::fill(src.pixels.begin(), src.pixels.end(), uint8_t{7});  // outside every noise draw
  std::vector<double> z;
  for (int64_t i = 0; i < 40 && z.size() < 20000; ++i) {
    SampleRandom rng(31, 0, i, 2), again(31, 0, i, 2);
    const CropBox box = re.draw(again, 64, 64);
    const Image out = re(src, rng);
    REQUIRE(box.height > 0);
    for (int64_t y = 0; y < 64; ++y)
      for (int64_t x = 0; x < 64; ++x) {
        const bool inside =
            y >= box.top && y < box.top + box.height && x >= box.left && x < box.left + box.width;
        if (!inside) {
          REQUIRE(out.at(y, x, 0) == 7);  // the same box as draw(), nothing outside it touched
          continue;
        }
        z.push_back((out.at(y, x, 0) / 255.0 - mean) / sd);
      }
  }
  const double n = static_cast<double>(z.size());
  REQUIRE(n > 5000);
  const double m = std::accumulate(z.begin(), z.end(), 0.0) / n;
  double var = 0, tails = 0;
  for (double v : z) {
    var += (v - m) * (v - m);
    tails += std::fabs(v) > 1.96;
  }
  var /= n - 1;
  CHECK(std::fabs(m) < 5.0 / std::sqrt(n));
  CHECK(std::fabs(var - (1.0 + q * q / 12.0)) < 5.0 * std::sqrt(2.0 / n));
  CHECK(std::fabs(tails / n - 0.05) < 5.0 * std::sqrt(0.05 * 0.95 / n) + 0.058 * q);

  // Three channels draw independently, each with its own mean and std; bad arguments refused.
  Image rgb(32, 32, 3);
  SampleRandom r3(31, 0, 0, 2);
  const Image noisy =
      RandomErasing::random(1.0, {0.485, 0.456, 0.406}, {0.229, 0.224, 0.225})(rgb, r3);
  CHECK(noisy.pixels != rgb.pixels);
  SampleRandom r4(31, 0, 0, 2);
  CHECK_THROWS_WITH(RandomErasing::random(1.0, {0.5, 0.5, 0.5}, {0.2, 0.2, 0.2})(src, r4),
                    Contains("3 channels and a 1-channel image"));
  CHECK_THROWS_WITH(RandomErasing::random(0.5, {0.5}, {0.0}), Contains("std > 0"));
  CHECK_THROWS_WITH(RandomErasing::random(0.5, {0.5, 0.5}, {0.2, 0.2}), Contains("1 or 3"));
  CHECK_THROWS_WITH(RandomErasing::random(0.5, {0.5}, {0.2, 0.2}), Contains("same size"));
}

TEST_CASE("Augmented samples are a pure function of (seed, epoch, index)", "[augment]") {
  const Image src = test_picture(48, 48, 3);
  std::vector<std::shared_ptr<const Augmentation>> all{
      make_auto_augment("trivial"),
      make_auto_augment("rand"),
      make_auto_augment("imagenet"),
      std::make_shared<ColorJitter>(0.4, 0.4, 0.4, 0.1),
      std::make_shared<RandomGrayscale>(0.5),
      std::make_shared<GaussianBlur>(std::array<int64_t, 2>{5, 5}),
      std::make_shared<RandomErasing>(RandomErasing::imagenet(0.9)),
      std::make_shared<RandomErasing>(
          RandomErasing::random(0.9, {0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}))};
  for (const auto& a : all) {
    INFO(a->repr());
    int differ = 0;
    for (int64_t i = 0; i < 20; ++i) {
      SampleRandom r1(5, 2, i, 2), r2(5, 2, i, 2), r3(5, 3, i, 2);
      const Image a1 = (*a)(src, r1), a2 = (*a)(src, r2), a3 = (*a)(src, r3);
      REQUIRE(a1.pixels == a2.pixels);
      differ += a1.pixels != a3.pixels;
    }
    CHECK(differ > 0);  // another epoch draws other parameters
  }

  // The pipeline: each sample the same whether built alone or by any of 1..3 threads.
  ImagePipeline p = ImagePipeline::train(40);
  p.augment = {make_auto_augment("trivial"), std::make_shared<ColorJitter>(0.3, 0.3, 0.3, 0.05),
               std::make_shared<RandomErasing>(RandomErasing::imagenet(0.5))};
  p.check();
  const int64_t count = 24, bytes = 40 * 40 * 3;
  std::vector<uint8_t> serial(static_cast<size_t>(count * bytes));
  for (int64_t i = 0; i < count; ++i) p.apply(src, 7, 1, i, serial.data() + i * bytes);
  for (int threads : {2, 3}) {
    std::vector<uint8_t> par(serial.size());
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (int64_t i = count - 1 - t; i >= 0; i -= threads)  // reverse order, interleaved
          p.apply(src, 7, 1, i, par.data() + i * bytes);
      });
    for (auto& th : pool) th.join();
    REQUIRE(par == serial);
  }
  // Without augment the pipeline writes what it wrote before augment existed: the crop and
  // flip alone; with it, the augmentations change some samples.
  ImagePipeline plain = ImagePipeline::train(40);
  std::vector<uint8_t> out(static_cast<size_t>(bytes));
  int changed = 0;
  for (int64_t i = 0; i < count; ++i) {
    plain.apply(src, 7, 1, i, out.data());
    changed += !std::equal(out.begin(), out.end(), serial.begin() + i * bytes);
  }
  CHECK(changed > count / 2);
}

TEST_CASE("ImageFolder with augmentations: identical batches with 0, 2 and 3 workers",
          "[augment][folder][loader]") {
  if (!jpeg_supported()) {
    testing::skip("this build has no JPEG decoder (install libturbojpeg0-dev and rebuild)");
    return;
  }
  testing::TempDir dir("augment_folder");
  Generator g(12);
  const Tensor images = randint(0, 256, {12, 28, 28}, DType::u8, &g);
  std::vector<int64_t> lab;
  for (int i = 0; i < 12; ++i) lab.push_back(i % 3);
  MakeImageFolderOptions mo;
  mo.classes = 3;
  mo.per_class = 4;
  mo.size = 64;
  REQUIRE(write_image_folder(dir.str(), images, from_vector(lab, {12}), mo) == 12);
  ImageFolderOptions fo;
  fo.transform = ImagePipeline::train(48);
  fo.transform.augment = {make_auto_augment("imagenet"),
                          std::make_shared<RandomErasing>(RandomErasing::imagenet(0.5))};
  fo.seed = 3;
  auto ds = std::make_shared<ImageFolder>(dir.str(), fo);
  auto run = [&](int64_t workers) {
    DataLoaderOptions lo;
    lo.batch_size = 5;
    lo.shuffle = true;
    lo.seed = 9;
    lo.num_workers = workers;
    DataLoader loader(ds, lo);
    loader.set_epoch(1);
    std::vector<std::vector<int>> out;
    for (const Batch& b : loader) out.push_back(b.data.to_vector<int>());
    return out;
  };
  const auto ref = run(0);
  REQUIRE(ref.size() == 3);
  CHECK(run(2) == ref);
  CHECK(run(3) == ref);
}

// --- the fixture for tests/data/torchvision_augment_check.py ----------------------------

namespace {

struct FixtureWriter {
  std::filesystem::path dir;
  std::ostringstream cases;
  int n = 0;

  void write_image(const std::string& file, const Image& img) {
    std::ofstream f(dir / file, std::ios::binary);
    f.write(reinterpret_cast<const char*>(img.data()),
            static_cast<std::streamsize>(img.pixels.size()));
    REQUIRE(f.good());
  }
  // One case: `call` is a JSON object naming the torchvision call; `input` the input's name.
  void add(const std::string& input, const std::string& call, const Image& out) {
    const std::string file = "out_" + std::to_string(n) + ".bin";
    write_image(file, out);
    cases << (n ? ",\n" : "") << "{\"input\": \"" << input << "\", \"file\": \"" << file
          << "\", \"height\": " << out.height << ", \"width\": " << out.width
          << ", \"channels\": " << out.channels << ", \"call\": " << call << "}";
    ++n;
  }
};

std::string num(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

std::string fill_json(const std::vector<uint8_t>& f) {
  if (f.empty()) return "null";
  std::string s = "[";
  for (size_t i = 0; i < f.size(); ++i) s += (i ? ", " : "") + std::to_string(f[i]);
  return s + "]";
}

std::string space_json(const std::vector<AugmentSpaceEntry>& space) {
  std::string s = "[";
  for (size_t i = 0; i < space.size(); ++i) {
    s += (i ? ", " : "") + std::string("{\"op\": \"") + augment_op_name(space[i].op) +
         "\", \"signed\": " + (space[i].signed_magnitude ? "true" : "false") +
         ", \"magnitudes\": [";
    for (size_t j = 0; j < space[i].magnitudes.size(); ++j)
      s += (j ? ", " : "") + num(space[i].magnitudes[j]);
    s += "]}";
  }
  return s + "]";
}

}  // namespace

TEST_CASE("Augmentation outputs for torchvision_augment_check.py", "[.augment_fixture]") {
  const char* dir_env = std::getenv("DLTRAIN_AUGMENT_FIXTURE");
  REQUIRE(dir_env != nullptr);
  FixtureWriter w;
  w.dir = dir_env;
  const int64_t H = 61, W = 83;
  const Image rgb = test_picture(H, W, 3), gray = test_picture(H, W, 1, 4);
  w.write_image("rgb.bin", rgb);
  w.write_image("gray.bin", gray);
  const std::vector<std::pair<std::string, const Image*>> inputs{{"rgb", &rgb}, {"gray", &gray}};

  // Functional ops on fixed parameters.
  for (const auto& [name, img] : inputs) {
    for (double f : {0.0, 0.3, 1.7}) {
      w.add(name, "{\"fn\": \"adjust_brightness\", \"args\": [" + num(f) + "]}",
            adjust_brightness(*img, f));
      w.add(name, "{\"fn\": \"adjust_contrast\", \"args\": [" + num(f) + "]}",
            adjust_contrast(*img, f));
      w.add(name, "{\"fn\": \"adjust_saturation\", \"args\": [" + num(f) + "]}",
            adjust_saturation(*img, f));
      w.add(name, "{\"fn\": \"adjust_sharpness\", \"args\": [" + num(f) + "]}",
            adjust_sharpness(*img, f));
    }
    for (double hf : {-0.5, -0.23, 0.0, 0.1, 0.37, 0.5})
      w.add(name, "{\"fn\": \"adjust_hue\", \"args\": [" + num(hf) + "]}", adjust_hue(*img, hf));
    // (torchvision returns 1 channel for a 1-channel input asked for 3; dltrain 3.)
    for (int64_t c : {int64_t{1}, img->channels})
      w.add(name, "{\"fn\": \"rgb_to_grayscale\", \"args\": [" + std::to_string(c) + "]}",
            rgb_to_grayscale(*img, c));
    for (int64_t b : {0, 1, 4, 7})
      w.add(name, "{\"fn\": \"posterize\", \"args\": [" + std::to_string(b) + "]}",
            posterize(*img, b));
    for (double t : {0.0, 128.5, 200.0})
      w.add(name, "{\"fn\": \"solarize\", \"args\": [" + num(t) + "]}", solarize(*img, t));
    w.add(name, "{\"fn\": \"autocontrast\", \"args\": []}", autocontrast(*img));
    w.add(name, "{\"fn\": \"equalize\", \"args\": []}", equalize(*img));
    w.add(name, "{\"fn\": \"invert\", \"args\": []}", invert(*img));
    const std::array<std::array<int64_t, 2>, 3> ks{{{5, 9}, {3, 3}, {23, 23}}};
    const std::array<std::array<double, 2>, 3> sg{{{1.3, 2.1}, {0.5, 0.5}, {3.7, 3.7}}};
    for (size_t i = 0; i < ks.size(); ++i)
      w.add(name,
            "{\"fn\": \"gaussian_blur\", \"args\": [[" + std::to_string(ks[i][0]) + ", " +
                std::to_string(ks[i][1]) + "], [" + num(sg[i][0]) + ", " + num(sg[i][1]) + "]]}",
            gaussian_blur(*img, ks[i], sg[i]));
    for (double a : {-135.0, -17.3, 45.0, 90.0, 121.7})
      for (const std::vector<uint8_t>& f : {std::vector<uint8_t>{}, std::vector<uint8_t>{200}})
        w.add(name,
              "{\"fn\": \"rotate\", \"args\": [" + num(a) + "], \"fill\": " + fill_json(f) + "}",
              rotate(*img, a, f));
    w.add(name,
          "{\"fn\": \"affine\", \"angle\": 12.5, \"translate\": [4, -7], \"scale\": 1.1, "
          "\"shear\": [8.0, -3.0], \"center\": null, \"fill\": null}",
          affine(*img, 12.5, {4, -7}, 1.1, {8.0, -3.0}));
    w.add(name,
          "{\"fn\": \"affine\", \"angle\": -30.0, \"translate\": [0, 0], \"scale\": 0.8, "
          "\"shear\": [0.0, 20.0], \"center\": [10.0, 5.0], \"fill\": [1]}",
          affine(*img, -30.0, {0, 0}, 0.8, {0.0, 20.0}, {1}, {10.0, 5.0}));
    w.add(name, "{\"fn\": \"erase\", \"box\": [5, 7, 20, 31], \"value\": [17]}",
          erase(*img, {5, 7, 20, 31}, {17}));
  }
  const std::vector<uint8_t> fill3{10, 20, 30};
  w.add("rgb", "{\"fn\": \"rotate\", \"args\": [33.3], \"fill\": " + fill_json(fill3) + "}",
        rotate(rgb, 33.3, fill3));
  w.add("rgb", "{\"fn\": \"erase\", \"box\": [0, 0, 61, 10], \"value\": [1, 2, 3]}",
        erase(rgb, {0, 0, 61, 10}, {1, 2, 3}));

  // ColorJitter with drawn parameters: torchvision applies F.adjust_* in the drawn order.
  const ColorJitter cj(0.5, 0.5, 0.5, 0.3);
  for (int64_t i = 0; i < 6; ++i) {
    SampleRandom rng(31, 0, i, 2);
    const auto p = cj.draw(rng);
    std::string call = "{\"fn\": \"color_jitter\", \"order\": [";
    for (size_t k = 0; k < 4; ++k) call += (k ? ", " : "") + std::to_string(p.order[k]);
    call += "], \"factors\": [";
    for (size_t k = 0; k < 4; ++k) call += (k ? ", " : "") + num(p.factor[k]);
    w.add("rgb", call + "]}", cj.apply(rgb, p));
  }

  // Every op of TrivialAugmentWide's space at every bin, both signs, through _apply_op.
  auto add_space = [&](const std::vector<AugmentSpaceEntry>& space, const std::string& input,
                       const Image& img, const std::vector<uint8_t>& fill, size_t stride) {
    for (const AugmentSpaceEntry& e : space) {
      const size_t nb = std::max<size_t>(e.magnitudes.size(), 1);
      for (size_t b = 0; b < nb; b += (e.magnitudes.empty() ? 1 : stride))
        for (int sign : {1, -1}) {
          if (sign < 0 && !e.signed_magnitude) continue;
          const double m = e.magnitudes.empty() ? 0.0 : sign * e.magnitudes[b];
          w.add(input,
                std::string("{\"fn\": \"op\", \"op\": \"") + augment_op_name(e.op) +
                    "\", \"magnitude\": " + num(m) + ", \"fill\": " + fill_json(fill) + "}",
                apply_augment_op(img, e.op, m, fill));
        }
    }
  };
  add_space(TrivialAugmentWide().space(), "rgb", rgb, {}, 1);
  add_space(TrivialAugmentWide().space(), "gray", gray, {}, 3);
  add_space(RandAugment().space(H, W), "rgb", rgb, {128}, 2);
  add_space(AutoAugment::space(H, W), "rgb", rgb, fill3, 1);
  w.add("rgb", "{\"fn\": \"op\", \"op\": \"Invert\", \"magnitude\": 0.0, \"fill\": null}",
        apply_augment_op(rgb, AugmentOp::Invert, 0.0));

  // The policies' tables, compared with torchvision's _augmentation_space and policies.
  std::string policy = "[";
  const auto& pol = AutoAugment::imagenet_policy();
  for (size_t i = 0; i < pol.size(); ++i) {
    policy += i ? ", [" : "[";
    for (size_t k = 0; k < 2; ++k) {
      const auto& s = pol[i][k];
      policy += (k ? ", [\"" : "[\"") + std::string(augment_op_name(s.op)) + "\", " + num(s.p) +
                ", " +
                (s.magnitude_bin < 0 ? std::string("null") : std::to_string(s.magnitude_bin)) + "]";
    }
    policy += "]";
  }
  policy += "]";
  std::ofstream f(w.dir / "cases.json");
  f << "{\"height\": " << H << ", \"width\": " << W << ",\n"
    << "\"trivial_space_31\": " << space_json(TrivialAugmentWide(31).space()) << ",\n"
    << "\"trivial_space_11\": " << space_json(TrivialAugmentWide(11).space()) << ",\n"
    << "\"rand_space_31_224\": " << space_json(RandAugment().space(224, 224)) << ",\n"
    << "\"rand_space_31_hw\": " << space_json(RandAugment().space(H, W)) << ",\n"
    << "\"rand_space_17_hw\": " << space_json(RandAugment(2, 5, 17).space(H, W)) << ",\n"
    << "\"auto_space_224\": " << space_json(AutoAugment::space(224, 224)) << ",\n"
    << "\"auto_policy\": " << policy << ",\n"
    << "\"cases\": [\n"
    << w.cases.str() << "]}\n";
  REQUIRE(f.good());
  std::printf("augment fixture: %d cases in %s\n", w.n, dir_env);
}
