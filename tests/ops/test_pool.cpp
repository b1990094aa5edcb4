// Pooling: max (with indices, dilation, ceil_mode, padding), average
// (count_include_pad both ways, ceil_mode) and adaptive average (non-divisible
// sizes): values against naive loops, channels-last in and out, 3-d inputs,
// f16/bf16, finite-difference gradients in f64, and errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "gradcheck.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::leaf;
using dltrain::testing::rnd;
using V = std::vector<Tensor>;

namespace {

void require_close(const Tensor& t, const std::vector<double>& ref, double tol) {
  const std::vector<double> v = t.to_vector<double>();
  REQUIRE(v.size() == ref.size());
  for (size_t i = 0; i < v.size(); ++i)
    if (std::abs(v[i] - ref[i]) > tol * (1.0 + std::abs(ref[i])))
      FAIL("element " << i << ": got " << v[i] << " expected " << ref[i]);
}

// Naive max pool over [P, H, W] planes; also returns flat indices.
std::pair<std::vector<double>, std::vector<double>> naive_max(const Tensor& x, Int2 k, Int2 s,
                                                              Int2 p, Int2 d, int64_t Ho,
                                                              int64_t Wo) {
  const auto xv = x.to_vector<double>();
  const int64_t P = x.size(0) * x.size(1), H = x.size(2), W = x.size(3);
  std::vector<double> y, idx;
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < Ho; ++oh)
      for (int64_t ow = 0; ow < Wo; ++ow) {
        double best = -std::numeric_limits<double>::infinity();
        int64_t bi = -1;
        for (int64_t i = 0; i < k.h; ++i)
          for (int64_t j = 0; j < k.w; ++j) {
            const int64_t ih = oh * s.h - p.h + i * d.h, iw = ow * s.w - p.w + j * d.w;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            const double v = xv[(pl * H + ih) * W + iw];
            if (v > best) {
              best = v;
              bi = ih * W + iw;
            }
          }
        y.push_back(best);
        idx.push_back(static_cast<double>(bi));
      }
  return {y, idx};
}

std::vector<double> naive_avg(const Tensor& x, Int2 k, Int2 s, Int2 p, bool cip, int64_t Ho,
                              int64_t Wo) {
  const auto xv = x.to_vector<double>();
  const int64_t P = x.size(0) * x.size(1), H = x.size(2), W = x.size(3);
  std::vector<double> y;
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < Ho; ++oh)
      for (int64_t ow = 0; ow < Wo; ++ow) {
        double sum = 0;
        int64_t inside = 0, padded = 0;
        for (int64_t i = 0; i < k.h; ++i)
          for (int64_t j = 0; j < k.w; ++j) {
            const int64_t ih = oh * s.h - p.h + i, iw = ow * s.w - p.w + j;
            if (ih >= H + p.h || iw >= W + p.w) continue;  // beyond the padding (ceil_mode)
            ++padded;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            ++inside;
            sum += xv[(pl * H + ih) * W + iw];
          }
        y.push_back(sum / static_cast<double>(cip ? padded : inside));
      }
  return y;
}

std::vector<double> naive_adaptive(const Tensor& x, int64_t Ho, int64_t Wo) {
  const auto xv = x.to_vector<double>();
  const int64_t P = x.size(0) * x.size(1), H = x.size(2), W = x.size(3);
  std::vector<double> y;
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < Ho; ++oh)
      for (int64_t ow = 0; ow < Wo; ++ow) {
        const int64_t hs = static_cast<int64_t>(std::floor(double(oh) * H / Ho));
        const int64_t he = static_cast<int64_t>(std::ceil(double(oh + 1) * H / Ho));
        const int64_t ws = static_cast<int64_t>(std::floor(double(ow) * W / Wo));
        const int64_t we = static_cast<int64_t>(std::ceil(double(ow + 1) * W / Wo));
        double sum = 0;
        for (int64_t ih = hs; ih < he; ++ih)
          for (int64_t iw = ws; iw < we; ++iw) sum += xv[(pl * H + ih) * W + iw];
        y.push_back(sum / double((he - hs) * (we - ws)));
      }
  return y;
}

struct PoolCfg {
  Int2 k, s, p, d;
  bool ceil;
};

const std::vector<PoolCfg> kPools = {
    {2, 2, 0, 1, false}, {3, 2, 1, 1, false}, {3, 2, 1, 1, true}, {{3, 2}, {2, 1}, {1, 0}, 1, true},
    {3, 1, 1, 2, false}, {2, 2, 1, 1, true},
};

}  // namespace

TEST_CASE("max_pool2d values and indices", "[ops][pool]") {
  set_num_threads(2);
  for (DType dt : {DType::f32, DType::f64})
    for (const PoolCfg& c : kPools) {
      Tensor x = rnd({2, 3, 7, 6}, 1, dt);
      auto [y, idx] = max_pool2d_with_indices(x, c.k, c.s, c.p, c.d, c.ceil);
      const int64_t Ho = conv_output_size(7, c.k.h, c.s.h, c.p.h, c.d.h, c.ceil);
      const int64_t Wo = conv_output_size(6, c.k.w, c.s.w, c.p.w, c.d.w, c.ceil);
      REQUIRE(y.shape() == Shape{2, 3, Ho, Wo});
      REQUIRE(y.dtype() == dt);
      REQUIRE(idx.dtype() == DType::i64);
      auto [ry, ri] = naive_max(x, c.k, c.s, c.p, c.d, Ho, Wo);
      require_close(y, ry, 1e-7);
      require_close(idx, ri, 0);
      Tensor ycl = max_pool2d(x.contiguous(MemoryFormat::ChannelsLast), c.k, c.s, c.p, c.d, c.ceil);
      REQUIRE(ycl.suggest_memory_format() == MemoryFormat::ChannelsLast);
      require_close(ycl, ry, 1e-7);
    }
  // Default stride = kernel, 3-d input, f16.
  Tensor x = rnd({3, 4, 4}, 2);
  REQUIRE(max_pool2d(x, 2).shape() == Shape{3, 2, 2});
  Tensor xh = rnd({1, 2, 4, 4}, 3, DType::f32);
  require_close(max_pool2d(xh.to(DType::f16), 2),
                max_pool2d(xh.to(DType::f16).to(DType::f32), 2).to_vector<double>(), 0);
  // NaN propagates like PyTorch.
  Tensor n = tensor({1, NAN, 3, 4}, DType::f32).reshape({1, 1, 2, 2});
  REQUIRE(std::isnan(max_pool2d(n, 2).item<float>()));
}

TEST_CASE("avg_pool2d values", "[ops][pool]") {
  for (bool cip : {true, false})
    for (const PoolCfg& c : kPools) {
      if (!(c.d == Int2(1))) continue;
      Tensor x = rnd({2, 2, 7, 6}, 4);
      Tensor y = avg_pool2d(x, c.k, c.s, c.p, c.ceil, cip);
      const int64_t Ho = conv_output_size(7, c.k.h, c.s.h, c.p.h, 1, c.ceil);
      const int64_t Wo = conv_output_size(6, c.k.w, c.s.w, c.p.w, 1, c.ceil);
      REQUIRE(y.shape() == Shape{2, 2, Ho, Wo});
      const auto ref = naive_avg(x, c.k, c.s, c.p, cip, Ho, Wo);
      require_close(y, ref, 1e-12);
      Tensor ycl = avg_pool2d(x.contiguous(MemoryFormat::ChannelsLast), c.k, c.s, c.p, c.ceil, cip);
      REQUIRE(ycl.suggest_memory_format() == MemoryFormat::ChannelsLast);
      require_close(ycl, ref, 1e-12);
      require_close(avg_pool2d(x.to(DType::f32), c.k, c.s, c.p, c.ceil, cip), ref, 1e-5);
    }
  Tensor x = rnd({1, 1, 4, 4}, 5, DType::bf16);
  REQUIRE(avg_pool2d(x, 2).dtype() == DType::bf16);
}

TEST_CASE("adaptive_avg_pool2d values", "[ops][pool]") {
  for (auto [H, W, Ho, Wo] : {std::array<int64_t, 4>{7, 7, 1, 1},
                              {7, 5, 3, 2},
                              {5, 6, 5, 6},
                              {4, 9, 3, 4},
                              {3, 3, 5, 4}}) {
    Tensor x = rnd({2, 3, H, W}, 6);
    Tensor y = adaptive_avg_pool2d(x, {Ho, Wo});
    REQUIRE(y.shape() == Shape{2, 3, Ho, Wo});
    const auto ref = naive_adaptive(x, Ho, Wo);
    require_close(y, ref, 1e-12);
    Tensor ycl = adaptive_avg_pool2d(x.contiguous(MemoryFormat::ChannelsLast), {Ho, Wo});
    if (Ho * Wo > 1) REQUIRE(ycl.suggest_memory_format() == MemoryFormat::ChannelsLast);
    require_close(ycl, ref, 1e-12);
  }
  REQUIRE(adaptive_avg_pool2d(rnd({3, 5, 5}, 7), 2).shape() == Shape{3, 2, 2});
}

TEST_CASE("pool gradients", "[ops][pool][grad]") {
  set_num_threads(2);
  SECTION("max_pool2d") {
    gradcheck([](const V& v) { return max_pool2d(v[0], 2); }, {leaf({2, 2, 4, 4}, 1)});
    // Odd sizes: the 2x2/2 backward must zero the uncovered last row and column itself.
    gradcheck([](const V& v) { return max_pool2d(v[0], 2); }, {leaf({2, 2, 5, 7}, 9)});
    gradcheck([](const V& v) { return max_pool2d(v[0], 3, 2, 1, 1, true); },
              {leaf({1, 2, 6, 5}, 2)});
    gradcheck(
        [](const V& v) {
          return max_pool2d(v[0], {3, 2}, Int2{1, 2}, {1, 0}, 2);
        },
        {leaf({1, 2, 6, 6}, 3)});
  }
  SECTION("avg_pool2d") {
    for (bool cip : {true, false}) {
      gradcheck([cip](const V& v) { return avg_pool2d(v[0], 3, 2, 1, false, cip); },
                {leaf({2, 2, 5, 5}, 4)});
      gradcheck([cip](const V& v) { return avg_pool2d(v[0], 2, 2, 1, true, cip); },
                {leaf({1, 2, 5, 4}, 5)});
    }
  }
  SECTION("adaptive_avg_pool2d") {
    gradcheck(
        [](const V& v) {
          return adaptive_avg_pool2d(v[0], {3, 2});
        },
        {leaf({2, 2, 7, 5}, 6)});
    gradcheck([](const V& v) { return adaptive_avg_pool2d(v[0], 1); }, {leaf({2, 3, 3, 3}, 7)});
  }
  SECTION("channels-last and non-contiguous leaves") {
    Tensor x = randn({2, 3, 5, 5}, DType::f64).contiguous(MemoryFormat::ChannelsLast);
    x.requires_grad_();
    gradcheck([](const V& v) { return max_pool2d(v[0], 3, 2, 1); }, {x});
    REQUIRE(x.grad().suggest_memory_format() == MemoryFormat::ChannelsLast);
    gradcheck([](const V& v) { return avg_pool2d(v[0], 2, 1, 1, false, false); }, {x});
    gradcheck([](const V& v) { return adaptive_avg_pool2d(v[0], {2, 3}); }, {x});
    Tensor t = randn({5, 2, 3, 4}, DType::f64).transpose(0, 1);  // [2, 5, 3, 4]
    t.requires_grad_();
    gradcheck([](const V& v) { return max_pool2d(v[0], 2, 1); }, {t});
    gradcheck([](const V& v) { return avg_pool2d(v[0], 2, 1); }, {t});
  }
}

TEST_CASE("pool errors name the op", "[ops][pool][errors]") {
  Tensor x = zeros({1, 2, 4, 4});
  REQUIRE_THROWS_AS(max_pool2d(x, 3, 1, 2), dltrain::Error);
  REQUIRE_THROWS_WITH(max_pool2d(x, 3, 1, 2), Contains("max_pool2d") && Contains("padding"));
  REQUIRE_THROWS_WITH(max_pool2d(x, 5), Contains("max_pool2d") && Contains("[1, 2, 4, 4]"));
  REQUIRE_THROWS_WITH(max_pool2d(zeros({4, 4}), 2), Contains("max_pool2d"));
  REQUIRE_THROWS_WITH(max_pool2d(ones({1, 1, 4, 4}, DType::i64), 2), Contains("max_pool2d"));
  REQUIRE_THROWS_WITH(avg_pool2d(x, 0), Contains("avg_pool2d"));
  REQUIRE_THROWS_WITH(avg_pool2d(x, 2, Int2(0)), Contains("avg_pool2d"));
  REQUIRE_THROWS_WITH(adaptive_avg_pool2d(x, {0, 2}), Contains("adaptive_avg_pool2d"));
  REQUIRE_THROWS_WITH(adaptive_avg_pool2d(zeros({2, 4}), 2), Contains("adaptive_avg_pool2d"));
}

TEST_CASE("max_pool2d 2x2/2 fast path: ties pick the first, NaN propagates (last NaN)",
          "[ops][pool]") {
  // Small integers make many ties; odd sizes leave a dropped last row/column.
  Generator g(5);
  Tensor x = randint(0, 3, {2, 3, 7, 9}, DType::i64, &g).to(DType::f32);
  float* p = x.data<float>();
  p[9] = NAN;  // row 1, col 0: window (0, 0)
  p[1] = NAN;  // row 0, col 1: the same window, an earlier NaN (the later one wins)
  p[2 * 63 + 5 * 9 + 3] = NAN;
  auto [y, idx] = max_pool2d_with_indices(x, 2);
  REQUIRE(y.shape() == Shape{2, 3, 3, 4});
  Tensor gy = randn({2, 3, 3, 4}, DType::f32, &g);
  const float* gyp = gy.data<float>();
  std::vector<float> want_gx(2 * 3 * 7 * 9, 0.0f);
  const float* yp = y.data<float>();
  const int64_t* ip = idx.data<int64_t>();
  for (int64_t pl = 0; pl < 6; ++pl) {
    for (int64_t oh = 0; oh < 3; ++oh) {
      for (int64_t ow = 0; ow < 4; ++ow) {
        float best = -INFINITY;
        int64_t bi = -1;
        for (int64_t i = 0; i < 2; ++i) {
          for (int64_t j = 0; j < 2; ++j) {
            int64_t at = (2 * oh + i) * 9 + 2 * ow + j;
            float v = p[pl * 63 + at];
            if (bi < 0 || v > best || std::isnan(v)) {
              best = v;
              bi = at;
            }
          }
        }
        int64_t o = pl * 12 + oh * 4 + ow;
        INFO("plane " << pl << " out " << oh << "," << ow);
        REQUIRE(ip[o] == bi);
        want_gx[static_cast<size_t>(pl * 63 + bi)] += gyp[o];
        if (std::isnan(best)) {
          REQUIRE(std::isnan(yp[o]));
        } else {
          REQUIRE(yp[o] == best);
        }
      }
    }
  }
  // max_pool2d (no indices: the backward finds each maximum again in the saved input) gives
  // the same values and routes the gradient to the same elements, NaN windows included.
  Tensor xl = x.detach().clone().requires_grad_();
  Tensor y2 = max_pool2d(xl, 2);
  y2.backward(gy);
  Tensor y2d = y2.detach();
  REQUIRE(allclose(masked_fill(y2d, ne(y2d, y2d), 7.0), masked_fill(y, ne(y, y), 7.0), 0, 0));
  REQUIRE(xl.grad().to_vector<float>() == want_gx);
}
