// MixUp, CutMix and the Beta sampler (issue 30): exact outputs for a given lambda and box
// against a hand computation and torchvision, labels summing to 1, the box rule, the
// distribution of lambda, determinism from a seed, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "dltrain/data/mix.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/loss.hpp"
#include "dltrain/ops/reduction.hpp"

using namespace dltrain;
using namespace dltrain::data;
using Catch::Contains;

namespace {

constexpr int64_t kN = 3, kC = 2, kH = 4, kW = 5;

// The batch of the torchvision runs below: ((arange(120) * 37) % 101) / 16 as [3, 2, 4, 5] f32
// (values exact in f32), labels [2, 0, 1], 4 classes.
Tensor batch() {
  std::vector<float> v(kN * kC * kH * kW);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 37) % 101) / 16.0f;
  return from_vector<float>(v, {kN, kC, kH, kW});
}
Tensor labels() { return from_vector<int64_t>({2, 0, 1}, {kN}); }

void require_equal(const Tensor& a, const std::vector<float>& b, double tol) {
  const std::vector<float> av = a.contiguous().to_vector<float>();
  REQUIRE(av.size() == b.size());
  for (size_t i = 0; i < av.size(); ++i) REQUIRE(av[i] == Approx(b[i]).margin(tol));
}

// Mean and variance of n draws of f.
template <class F>
std::pair<double, double> moments(int n, F f) {
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    const double v = f();
    s += v;
    s2 += v * v;
  }
  const double m = s / n;
  return {m, s2 / n - m * m};
}

}  // namespace

// torchvision 0.29.2 (torch 2.15.0, /work/main/.venv-peers):
//   m = v2.MixUp(alpha=1.0, num_classes=4)
//   p = {"lam": 0.3, "labels": y, "batch_size": 3}; m.transform(x, p), m.transform(y, p)
TEST_CASE("MixUp with a given lambda equals torchvision and the hand formula", "[data][mix]") {
  const Tensor x = batch();
  MixUp mixup(4);
  const MixedBatch out = mixup.apply(x, labels(), 0.3);
  REQUIRE(out.images.shape() == Shape{kN, kC, kH, kW});
  REQUIRE(out.images.dtype() == DType::f32);
  require_equal(
      out.images,
      {
          1.35624993f, 3.66874981f, 1.5625f,     1.98124993f, 4.29374981f, 2.1875f,     2.60625005f,
          4.91874981f, 2.8125f,     3.23125005f, 5.54374981f, 1.54374993f, 3.85625005f, 1.75f,
          2.16875005f, 4.48125029f, 2.375f,      2.79375005f, 5.10624981f, 3.0f,        3.41875005f,
          1.3125f,     1.73124993f, 4.04374981f, 1.9375f,     2.35624981f, 4.66874981f, 2.5625f,
          2.98124981f, 5.29374981f, 3.1875f,     3.60624981f, 1.50000012f, 1.91875005f, 4.23124981f,
          2.125f,      2.54375005f, 4.85624981f, 2.75f,       3.16875005f, 1.23750007f, 1.65625f,
          3.96875f,    1.86250007f, 2.28124976f, 4.59375f,    2.48750019f, 2.90625f,    5.21875f,
          3.11250019f, 3.53125f,    1.42500007f, 1.84375f,    4.15625f,    2.04999995f, 2.46875f,
          4.78125f,    2.67500019f, 3.09375f,    5.40625f,    3.30000019f, 3.71875f,    1.61249995f,
          2.03125f,    4.34375f,    2.23749995f, 2.65625f,    4.96875f,    2.86249995f, 3.28125f,
          5.59375f,    1.59374988f, 3.90625f,    1.79999995f, 2.21875f,    4.53125f,    2.42500019f,
          2.84375f,    5.15625f,    3.05000019f, 3.46875f,    1.36250007f, 1.78125f,    4.09375f,
          1.98750007f, 2.40625f,    4.71875f,    2.61250019f, 3.03125f,    5.34375f,    3.23750019f,
          3.65625f,    1.55000007f, 1.96875f,    4.28125f,    2.17500019f, 2.59375f,    4.90625f,
          2.80000019f, 3.21875f,    5.53125f,    1.53125f,    3.84375f,    1.73750007f, 2.15625f,
          4.46875f,    2.36249995f, 2.78125f,    5.09375f,    2.98750019f, 3.40625f,    1.30000007f,
          1.71875f,    4.03125f,    1.92499995f, 2.34375f,    4.65625f,    2.54999995f, 2.96875f,
          5.28125f,
      },
      1e-6);
  // Hand computation: sample i mixes with sample i - 1 (0 with N - 1).
  const std::vector<float> xv = x.to_vector<float>(), ov = out.images.to_vector<float>();
  const int64_t per = kC * kH * kW;
  for (int64_t i = 0; i < kN; ++i)
    for (int64_t k = 0; k < per; ++k) {
      const int64_t prev = (i + kN - 1) % kN;
      REQUIRE(ov[i * per + k] ==
              Approx(0.3 * xv[i * per + k] + 0.7 * xv[prev * per + k]).margin(1e-6));
    }
  REQUIRE(out.labels.shape() == Shape{kN, 4});
  REQUIRE(out.labels.dtype() == DType::f32);
  require_equal(out.labels,
                {0.0f, 0.7f, 0.3f, 0.0f, 0.3f, 0.0f, 0.7f, 0.0f, 0.7f, 0.3f, 0.0f, 0.0f}, 1e-7);
  // Already-soft labels [N, num_classes] are mixed the same way (torchvision accepts them too).
  const MixedBatch again = mixup.apply(x, out.labels, 0.5);
  require_equal(sum(again.labels, {1}), {1.0f, 1.0f, 1.0f}, 1e-6);
  // lambda = 1 is the identity.
  const MixedBatch id = mixup.apply(x, labels(), 1.0);
  REQUIRE(allclose(id.images, x, 0, 0));
}

// torchvision 0.29.2: cm = v2.CutMix(alpha=1.0, num_classes=4), box = (1, 0, 4, 3),
//   p = {"box": box, "lam_adjusted": 1 - 9/20, "labels": y, "batch_size": 3}
TEST_CASE("CutMix with a given box equals torchvision and the hand formula", "[data][mix]") {
  const Tensor x = batch();
  CutMix cutmix(4);
  const CutMixBox box{1, 0, 4, 3};
  const MixedBatch out = cutmix.apply(x, labels(), box);
  const std::vector<float> xv = x.to_vector<float>(), ov = out.images.to_vector<float>();
  for (int64_t i = 0; i < kN; ++i)
    for (int64_t c = 0; c < kC; ++c)
      for (int64_t h = 0; h < kH; ++h)
        for (int64_t w = 0; w < kW; ++w) {
          const bool inside = w >= 1 && w < 4 && h >= 0 && h < 3;
          const int64_t src = inside ? (i + kN - 1) % kN : i;
          REQUIRE(ov[((i * kC + c) * kH + h) * kW + w] == xv[((src * kC + c) * kH + h) * kW + w]);
        }
  // The first sample's first channel as torchvision printed it (rows of 5).
  require_equal(
      out.images.narrow(0, 0, 1).narrow(1, 0, 1),
      {0.0f,    4.25f,  0.25f,   2.5625f, 2.9375f, 5.25f,  3.1875f, 5.5f,    1.5f,  1.875f,
       4.1875f, 2.125f, 4.4375f, 0.4375f, 0.8125f, 3.125f, 5.4375f, 1.4375f, 3.75f, 6.0625f},
      0);
  // lambda corrected to the box: 1 - 9 / 20 = 0.55.
  require_equal(out.labels,
                {0.0f, 0.45f, 0.55f, 0.0f, 0.55f, 0.0f, 0.45f, 0.0f, 0.45f, 0.55f, 0.0f, 0.0f},
                1e-7);
  // An empty box changes nothing.
  const MixedBatch none = cutmix.apply(x, labels(), CutMixBox{2, 2, 2, 4});
  REQUIRE(allclose(none.images, x, 0, 0));
}

// torchvision's make_params box rule for a given lambda and centre (r_x, r_y), from the venv:
//   r = 0.5 * sqrt(1 - lam); rw = int(r * W); rh = int(r * H)
//   (max(rx - rw, 0), max(ry - rh, 0), min(rx + rw, W), min(ry + rh, H))
TEST_CASE("CutMix box rule equals torchvision", "[data][mix]") {
  struct Row {
    int64_t H, W;
    double lam;
    int64_t cx, cy;
    CutMixBox box;
  };
  const Row rows[] = {{4, 5, 0.3, 2, 1, {0, 0, 4, 2}},
                      {32, 32, 0.5, 0, 31, {0, 20, 11, 32}},
                      {224, 224, 0.0, 112, 112, {0, 0, 224, 224}},
                      {7, 9, 0.999, 3, 3, {3, 3, 3, 3}},
                      {10, 20, 0.1, 19, 0, {10, 0, 20, 4}}};
  for (const Row& r : rows) {
    const CutMixBox b = CutMix::box_for(r.H, r.W, r.lam, r.cx, r.cy);
    CHECK(b.x1 == r.box.x1);
    CHECK(b.y1 == r.box.y1);
    CHECK(b.x2 == r.box.x2);
    CHECK(b.y2 == r.box.y2);
  }
}

TEST_CASE("MixUp and CutMix draws: labels sum to 1, box inside, seeded", "[data][mix]") {
  const Tensor x = batch();
  CutMix cutmix(4, 1.0);
  MixUp mixup(4, 0.2);
  Generator g(123);
  for (int it = 0; it < 200; ++it) {
    const MixedBatch c = cutmix(x, labels(), &g);
    const MixedBatch m = mixup(x, labels(), &g);
    for (const MixedBatch* b : {&c, &m}) {
      const std::vector<float> s = sum(b->labels, {1}).to_vector<float>();
      for (float v : s) REQUIRE(v == Approx(1.0f).margin(1e-6));
      const std::vector<float> lv = b->labels.to_vector<float>();
      for (float v : lv) REQUIRE((v >= 0.0f && v <= 1.0f));
    }
    // Each image pixel comes from itself or its predecessor: the pasted box (where the two
    // differ) is a rectangle inside the image whose area matches the label weight.
    const std::vector<float> xv = x.to_vector<float>(), cv = c.images.to_vector<float>();
    int64_t changed = 0, y1 = kH, y2 = -1, x1 = kW, x2 = -1;
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t w = 0; w < kW; ++w)
        if (cv[h * kW + w] != xv[h * kW + w]) {  // sample 0, channel 0 (values all distinct)
          ++changed;
          y1 = std::min(y1, h), y2 = std::max(y2, h), x1 = std::min(x1, w), x2 = std::max(x2, w);
        }
    if (changed > 0) REQUIRE(changed == (y2 - y1 + 1) * (x2 - x1 + 1));
    const double lam = c.labels.to_vector<float>()[2];  // sample 0 has label 2
    REQUIRE(lam == Approx(1.0 - double(changed) / double(kH * kW)).margin(1e-6));
  }
  // The same seed gives the same draws.
  Generator g1(7), g2(7);
  REQUIRE(allclose(cutmix(x, labels(), &g1).images, cutmix(x, labels(), &g2).images, 0, 0));
  REQUIRE(sample_beta(0.4, 0.4, &g1) == sample_beta(0.4, 0.4, &g2));
  // MixUpOrCutMix picks one of the two.
  MixUpOrCutMix both(MixUp(4), CutMix(4), 0.5);
  const MixedBatch b = both(x, labels(), &g1);
  REQUIRE(b.labels.shape() == Shape{kN, 4});
}

// The point of soft labels: cross-entropy is linear in the target, so the loss of a MixUp
// batch is lambda CE(logits, y) + (1 - lambda) CE(logits, roll(y)) with class indices.
TEST_CASE("MixUp labels give the mixed class-index cross-entropy", "[data][mix]") {
  Generator g(5);
  const Tensor logits = randn({kN, 4}, DType::f32, &g);
  const MixedBatch m = MixUp(4).apply(batch(), labels(), 0.3);
  CrossEntropyOptions sum_opts;
  sum_opts.reduction = Reduction::Sum;
  const double soft = cross_entropy(logits, m.labels, sum_opts).item();
  const double mixed =
      0.3 * cross_entropy(logits, labels(), sum_opts).item() +
      0.7 * cross_entropy(logits, from_vector<int64_t>({1, 2, 0}, {kN}), sum_opts).item();
  REQUIRE(soft == Approx(mixed).epsilon(1e-6));
}

// Beta(a, a) has mean 1/2 and variance 1 / (4 (2a + 1)); the sample mean of n draws has
// standard error sqrt(var / n), the sample variance about sqrt((m4 - var^2) / n) with
// m4 = 3 / (16 (2a + 1)(2a + 3)) the fourth central moment of Beta(a, a). Bounds: 5 sigma.
TEST_CASE("sample_beta and sample_gamma have the right mean and variance", "[data][mix][random]") {
  const int n = 20000;
  Generator g(2024);
  for (double a : {0.2, 0.5, 1.0, 2.0, 8.0}) {
    INFO("alpha " << a);
    const double var = 1.0 / (4.0 * (2.0 * a + 1.0));
    const double m4 = 3.0 / (16.0 * (2.0 * a + 1.0) * (2.0 * a + 3.0));
    const auto [m, v] = moments(n, [&] { return sample_beta(a, a, &g); });
    CHECK(std::abs(m - 0.5) < 5.0 * std::sqrt(var / n));
    CHECK(std::abs(v - var) < 5.0 * std::sqrt((m4 - var * var) / n));
  }
  // An asymmetric Beta(2, 5): mean 2/7, variance 10 / (49 * 8).
  {
    const double var = 10.0 / (49.0 * 8.0);
    const auto [m, v] = moments(n, [&] { return sample_beta(2.0, 5.0, &g); });
    CHECK(std::abs(m - 2.0 / 7.0) < 5.0 * std::sqrt(var / n));
    CHECK(std::abs(v - var) < 0.05 * var);
  }
  // Gamma(k, 1): mean k, variance k (the variance within 5 standard errors, sd of the sample
  // variance of a gamma about sqrt((6k + 2k^2) / n)).
  for (double k : {0.3, 1.0, 4.5}) {
    INFO("shape " << k);
    const auto [m, v] = moments(n, [&] { return sample_gamma(k, &g); });
    CHECK(std::abs(m - k) < 5.0 * std::sqrt(k / n));
    CHECK(std::abs(v - k) < 5.0 * std::sqrt((6.0 * k + 2.0 * k * k) / n));
  }
  // Every draw lies in [0, 1], also for tiny alpha.
  for (int i = 0; i < 1000; ++i) {
    const double b = sample_beta(0.05, 0.05, &g);
    REQUIRE((b >= 0.0 && b <= 1.0));
  }
}

TEST_CASE("MixUp and CutMix errors", "[data][mix][errors]") {
  const Tensor x = batch();
  REQUIRE_THROWS_WITH(MixUp(0), Contains("num_classes"));
  REQUIRE_THROWS_WITH(MixUp(4, 0.0), Contains("alpha"));
  REQUIRE_THROWS_WITH(MixUp(4).apply(x, labels(), 1.5), Contains("lambda"));
  REQUIRE_THROWS_WITH(MixUp(4).apply(x, from_vector<int64_t>({0, 1}, {2}), 0.5),
                      Contains("3 images") && Contains("2 labels"));
  REQUIRE_THROWS_WITH(MixUp(4).apply(x, ones({3, 5}), 0.5), Contains("num_classes"));
  REQUIRE_THROWS_WITH(MixUp(4).apply(x, ones({3}), 0.5), Contains("int64"));
  REQUIRE_THROWS_WITH(MixUp(4).apply(ones({3, 2, 4, 5}, DType::u8), labels(), 0.5),
                      Contains("floating"));
  REQUIRE_THROWS_WITH(CutMix(4).apply(x, labels(), CutMixBox{0, 0, 6, 2}), Contains("inside"));
  REQUIRE_THROWS_WITH(CutMix(4)(ones({3, 4}), labels()), Contains("[N, C, H, W]"));
  REQUIRE_THROWS_WITH(CutMix::box_for(4, 5, 0.5, 5, 0), Contains("centre"));
  REQUIRE_THROWS_WITH(MixUpOrCutMix(MixUp(4), CutMix(5)), Contains("num_classes"));
}
