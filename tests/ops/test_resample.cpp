// interpolate (nearest, bilinear with and without align_corners), pad (constant with negative
// amounts, reflect, replicate), pixel_shuffle / pixel_unshuffle and nn::Upsample: PyTorch's
// values and gradients (research_reference.txt) in f64 and f32, NCHW and channels-last; f64
// finite-difference gradients; f16; errors.
#include <catch2/catch.hpp>

#include "gradcheck.hpp"
#include "reference_file.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::leaf;
using V = std::vector<Tensor>;
using F = std::function<Tensor(const Tensor&)>;

namespace {

const char* const kResearchReference = DLTRAIN_REFERENCE_DIR "/research_reference.txt";
Tensor R(const std::string& name) {
  return dltrain::testing::reference_tensor(kResearchReference, name);
}

// f on the reference input p.x in f64 and f32, NCHW and channels-last: output, its memory
// format and the input gradient against PyTorch's.
void against_torch(const std::string& p, const F& f) {
  for (DType dt : {DType::f64, DType::f32})
    for (MemoryFormat fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      INFO(p << " dtype " << dt << " channels-last " << (fmt == MemoryFormat::ChannelsLast));
      const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
      Tensor x = R(p + ".x").to(dt).clone().contiguous(fmt).detach();
      x.requires_grad_();
      Tensor y = f(x);
      CHECK(y.dtype() == dt);
      if (x.dim() == 4) CHECK(y.suggest_memory_format() == fmt);
      REQUIRE(y.shape() == R(p + ".y").shape());
      CHECK(allclose(y.to(DType::f64), R(p + ".y"), tol, tol));
      y.backward(R(p + ".gy").to(dt));
      CHECK(allclose(x.grad().to(DType::f64), R(p + ".gx"), tol, tol));
    }
}

InterpolateOptions sized(Int2 s, InterpolateMode m, bool ac = false) {
  return {.size = s, .mode = m, .align_corners = ac};
}
InterpolateOptions scaled(double f, InterpolateMode m) { return {.scale_factor = f, .mode = m}; }

constexpr auto kNearest = InterpolateMode::Nearest;
constexpr auto kBilinear = InterpolateMode::Bilinear;

}  // namespace

TEST_CASE("interpolate matches PyTorch", "[ops][resample]") {
  against_torch("interp_nearest_s2",
                [](const Tensor& x) { return interpolate(x, scaled(2, kNearest)); });
  against_torch("interp_nearest_size", [](const Tensor& x) {
    return interpolate(x, sized({7, 3}, kNearest));
  });
  against_torch("interp_bilinear_size", [](const Tensor& x) {
    return interpolate(x, sized({7, 9}, kBilinear));
  });
  against_torch("interp_bilinear_s2",
                [](const Tensor& x) { return interpolate(x, scaled(2, kBilinear)); });
  against_torch("interp_bilinear_down", [](const Tensor& x) {
    return interpolate(x, sized({3, 2}, kBilinear));
  });
  against_torch("interp_bilinear_ac", [](const Tensor& x) {
    return interpolate(x, sized({7, 9}, kBilinear, true));
  });
}

TEST_CASE("pad and pixel_shuffle match PyTorch", "[ops][resample]") {
  against_torch("pad_constant", [](const Tensor& x) {
    return pad(x, {1, 2, 0, 1}, PadMode::Constant, 0.5);
  });
  against_torch("pad_reflect", [](const Tensor& x) {
    return pad(x, {2, 1, 1, 3}, PadMode::Reflect);
  });
  against_torch("pad_replicate", [](const Tensor& x) {
    return pad(x, {3, 1, 2, 0}, PadMode::Replicate);
  });
  against_torch("pad_constant_neg", [](const Tensor& x) { return pad(x, {-1, 2, 1, -2}); });
  against_torch("pixel_shuffle", [](const Tensor& x) { return pixel_shuffle(x, 2); });
}

TEST_CASE("resampling gradients", "[ops][resample][grad]") {
  const V x{leaf({2, 2, 3, 4}, 1)};
  gradcheck([](const V& v) { return interpolate(v[0], sized({5, 7}, kNearest)); }, x);
  gradcheck([](const V& v) { return interpolate(v[0], sized({5, 7}, kBilinear)); }, x);
  gradcheck([](const V& v) { return interpolate(v[0], sized({2, 9}, kBilinear, true)); }, x);
  gradcheck([](const V& v) { return interpolate(v[0], scaled(1.5, kBilinear)); }, x);
  gradcheck([](const V& v) { return pad(v[0], {1, 2, 2, 1}, PadMode::Reflect); }, x);
  gradcheck([](const V& v) { return pad(v[0], {3, 0, 1, 4}, PadMode::Replicate); }, x);
  // One padded dim of a 4-d tensor, other ranks (the fused kernel sees [1, P, H, W]), and three
  // padded dims (one gather per dim).
  gradcheck([](const V& v) { return pad(v[0], {2, 3}, PadMode::Reflect); }, x);
  gradcheck(
      [](const V& v) {
        return pad(v[0], {1, 2, 2, 0}, PadMode::Replicate);
      },
      {leaf({3, 4, 3}, 4)});
  gradcheck([](const V& v) { return pad(v[0], {2, 1}, PadMode::Reflect); }, {leaf({5}, 5)});
  gradcheck([](const V& v) { return pad(v[0], {1, 1, 1, 2, 1, 0}, PadMode::Reflect); }, x);
  gradcheck([](const V& v) { return pad(v[0], {-1, 2, 0, 0, 1, 1}, PadMode::Constant, 2); }, x);
  gradcheck([](const V& v) { return pixel_shuffle(v[0], 2); }, {leaf({2, 8, 2, 3}, 2)});
  gradcheck([](const V& v) { return pixel_unshuffle(v[0], 2); }, {leaf({1, 2, 4, 6}, 3)});
  SECTION("channels-last leaf") {
    Tensor c = randn({1, 3, 3, 3}, DType::f64).contiguous(MemoryFormat::ChannelsLast);
    c.requires_grad_();
    gradcheck([](const V& v) { return interpolate(v[0], scaled(2, kBilinear)); }, {c});
    CHECK(c.grad().suggest_memory_format() == MemoryFormat::ChannelsLast);
  }
}

TEST_CASE("resampling odds and ends", "[ops][resample]") {
  Tensor x = randn({2, 12, 3, 5});
  CHECK(allclose(pixel_unshuffle(pixel_shuffle(x, 2), 2), x, 0, 0));
  CHECK(pixel_shuffle(randn({12, 3, 5}), 2).shape() == Shape{3, 6, 10});
  // Same size: a copy, not the input itself.
  Tensor same = interpolate(x, sized({3, 5}, kBilinear));
  CHECK(same.data_ptr() != x.data_ptr());
  CHECK(allclose(same, x, 0, 0));
  // 1-d padding of the last dim of any rank.
  Tensor p = pad(from_vector(std::vector<double>{1, 2, 3}), {2, 2}, PadMode::Reflect);
  CHECK(p.to_vector<double>() == std::vector<double>{3, 2, 1, 2, 3, 2, 1});
  p = pad(from_vector(std::vector<double>{1, 2, 3}), {1, 2}, PadMode::Replicate);
  CHECK(p.to_vector<double>() == std::vector<double>{1, 1, 2, 3, 3, 3});
  // A 3-d tensor padded in its last two dims: each [H, W] slice padded on its own.
  Tensor s3 = randn({3, 2, 4});
  Tensor p3 = pad(s3, {1, 1, 1, 1}, PadMode::Reflect);
  CHECK(p3.shape() == Shape{3, 4, 6});
  CHECK(allclose(p3.select(0, 1),
                 pad(s3.select(0, 1).unsqueeze(0).unsqueeze(0), {1, 1, 1, 1}, PadMode::Reflect)
                     .squeeze(0)
                     .squeeze(0),
                 0, 0));
  // f16 computes its weights in float and keeps the dtype.
  Tensor h = interpolate(x.to(DType::f16), scaled(2, kBilinear));
  CHECK(h.dtype() == DType::f16);
  CHECK(allclose(h.to(DType::f32), interpolate(x, scaled(2, kBilinear)), 1e-2, 1e-2));

  nn::Upsample up({.scale_factor = 2.0, .mode = kBilinear});
  CHECK(up.forward(x).shape() == Shape{2, 12, 6, 10});
  CHECK(up.extra_repr() == "scale_factor=2.0, mode='bilinear'");
  nn::Upsample up2({.size = Int2(4, 4), .mode = kBilinear, .align_corners = true});
  CHECK(up2.extra_repr() == "size=(4, 4), mode='bilinear', align_corners=True");
  nn::PixelShuffle ps(2);
  CHECK(ps.forward(x).shape() == Shape{2, 3, 6, 10});
}

TEST_CASE("resampling errors name the problem and the fix", "[ops][resample][errors]") {
  Tensor x = randn({1, 4, 3, 3});
  CHECK_THROWS_WITH(interpolate(randn({4, 3, 3}), scaled(2, kNearest)),
                    Contains("expected a 4-d input"));
  CHECK_THROWS_WITH(interpolate(x, {}), Contains("exactly one of size and scale_factor"));
  CHECK_THROWS_WITH(interpolate(x, {.size = Int2(2), .scale_factor = 2.0}), Contains("got both"));
  CHECK_THROWS_WITH(interpolate(x, {.scale_factor = 2.0, .align_corners = true}),
                    Contains("align_corners only applies to bilinear"));
  CHECK_THROWS_WITH(interpolate(x, scaled(0.2, kNearest)), Contains("use a larger scale_factor"));
  CHECK_THROWS_WITH(interpolate(x.to(DType::i64), scaled(2, kNearest)),
                    Contains("must be floating point"));
  CHECK_THROWS_WITH(pad(x, {1, 1, 1}), Contains("(before, after) pairs"));
  CHECK_THROWS_WITH(pad(x, {3, 0}, PadMode::Reflect), Contains("must be smaller than dim 3"));
  CHECK_THROWS_WITH(pad(x, {-1, 0}, PadMode::Replicate), Contains("non-negative amounts"));
  CHECK_THROWS_WITH(pad(x, {-2, -2}), Contains("crop more than dim 3"));
  CHECK_THROWS_WITH(pixel_shuffle(x, 3), Contains("not divisible by upscale_factor^2 = 9"));
  CHECK_THROWS_WITH(pixel_unshuffle(x, 2), Contains("not divisible by downscale_factor 2"));
  CHECK_THROWS_WITH(nn::Upsample({}), Contains("exactly one of size and scale_factor"));
}
