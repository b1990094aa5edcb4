// conv2d: values against a naive loop (stride, padding, dilation, groups,
// bias, 1x1, batch sizes that take both parallel paths), f16/bf16, channels-
// last in and out (the output channels-last when the input or the weight is,
// 1-channel inputs included), finite-difference gradients of input, weight and
// bias in f64 (including non-contiguous and channels-last leaves),
// conv_output_size, and errors.
#include <catch2/catch.hpp>

#include <cmath>

#include "gradcheck.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::leaf;
using dltrain::testing::rnd;
using V = std::vector<Tensor>;

namespace {

struct Cfg {
  int64_t N, Cin, H, W, Cout, kh, kw;
  Int2 stride, pad, dil;
  int64_t groups;
  bool bias;
};

// Naive cross-correlation in double; returns row-major [N, Cout, Ho, Wo].
std::vector<double> naive_conv(const Tensor& x, const Tensor& w, const Tensor& b, const Cfg& c,
                               int64_t Ho, int64_t Wo) {
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const auto bv = b.defined() ? b.to_vector<double>() : std::vector<double>(c.Cout, 0.0);
  const int64_t cg = c.Cin / c.groups, og = c.Cout / c.groups;
  std::vector<double> y(static_cast<size_t>(c.N * c.Cout * Ho * Wo));
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t o = 0; o < c.Cout; ++o)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          double s = bv[o];
          const int64_t g = o / og;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t i = 0; i < c.kh; ++i)
              for (int64_t j = 0; j < c.kw; ++j) {
                const int64_t ih = oh * c.stride.h - c.pad.h + i * c.dil.h;
                const int64_t iw = ow * c.stride.w - c.pad.w + j * c.dil.w;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                s += xv[((n * c.Cin + g * cg + ci) * c.H + ih) * c.W + iw] *
                     wv[((o * cg + ci) * c.kh + i) * c.kw + j];
              }
          y[((n * c.Cout + o) * Ho + oh) * Wo + ow] = s;
        }
  return y;
}

void require_close(const Tensor& t, const std::vector<double>& ref, double tol) {
  const std::vector<double> v = t.to_vector<double>();
  REQUIRE(v.size() == ref.size());
  for (size_t i = 0; i < v.size(); ++i)
    if (std::abs(v[i] - ref[i]) > tol * (1.0 + std::abs(ref[i])))
      FAIL("element " << i << ": got " << v[i] << " expected " << ref[i]);
}

const std::vector<Cfg> kConfigs = {
    {2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, true},             // 3x3 pad 1
    {3, 4, 9, 8, 6, 3, 2, {2, 1}, {1, 0}, 1, 2, false},  // groups 2, non-square
    {4, 4, 9, 9, 4, 3, 3, 2, 2, 2, 2, true},             // stride 2, dilation 2, groups 2
    {1, 5, 6, 6, 7, 1, 1, 1, 0, 1, 1, true},             // 1x1 stride 1 (no im2col)
    {4, 6, 8, 8, 3, 1, 1, 2, 0, 1, 1, false},            // 1x1 stride 2
    {8, 2, 5, 5, 4, 5, 5, 1, 2, 1, 1, true},             // 5x5 pad 2
    {1, 3, 12, 12, 8, 7, 7, 2, 3, 1, 1, false},          // stem-like 7x7/2, batch 1
    {2, 6, 5, 5, 6, 3, 3, 1, 1, 1, 6, true},             // depthwise
};

}  // namespace

TEST_CASE("conv2d values against a naive loop", "[ops][conv]") {
  set_num_threads(2);
  for (DType dt : {DType::f32, DType::f64}) {
    const double tol = dt == DType::f32 ? 1e-4 : 1e-12;
    for (const Cfg& c : kConfigs) {
      Tensor x = rnd({c.N, c.Cin, c.H, c.W}, 1, dt);
      Tensor w = rnd({c.Cout, c.Cin / c.groups, c.kh, c.kw}, 2, dt);
      Tensor b = c.bias ? rnd({c.Cout}, 3, dt) : Tensor();
      const int64_t Ho = conv_output_size(c.H, c.kh, c.stride.h, c.pad.h, c.dil.h);
      const int64_t Wo = conv_output_size(c.W, c.kw, c.stride.w, c.pad.w, c.dil.w);
      Tensor y = conv2d(x, w, b, c.stride, c.pad, c.dil, c.groups);
      REQUIRE(y.shape() == Shape{c.N, c.Cout, Ho, Wo});
      REQUIRE(y.dtype() == dt);
      REQUIRE(y.is_contiguous());
      const auto ref = naive_conv(x, w, b, c, Ho, Wo);
      require_close(y, ref, tol);
      // Channels-last input gives a channels-last output with the same values.
      if (c.Cin > 1 && Ho * Wo > 1 && c.Cout > 1) {
        Tensor ycl = conv2d(x.contiguous(MemoryFormat::ChannelsLast), w, b, c.stride, c.pad, c.dil,
                            c.groups);
        REQUIRE(ycl.suggest_memory_format() == MemoryFormat::ChannelsLast);
        require_close(ycl, ref, tol);
      }
    }
  }
  // One thread takes the serial path.
  set_num_threads(1);
  const Cfg& c = kConfigs[2];
  Tensor x = rnd({c.N, c.Cin, c.H, c.W}, 1), w = rnd({c.Cout, c.Cin / c.groups, c.kh, c.kw}, 2);
  Tensor b = rnd({c.Cout}, 3);
  require_close(
      conv2d(x, w, b, c.stride, c.pad, c.dil, c.groups),
      naive_conv(x, w, b, c, conv_output_size(c.H, 3, 2, 2, 2), conv_output_size(c.W, 3, 2, 2, 2)),
      1e-12);
  set_num_threads(2);
}

TEST_CASE("conv2d in f16 and bf16 computes in float", "[ops][conv]") {
  Tensor x = rnd({2, 3, 6, 6}, 4, DType::f32), w = rnd({4, 3, 3, 3}, 5, DType::f32);
  Tensor b = rnd({4}, 6, DType::f32);
  const auto ref = conv2d(x, w, b, 1, 1).to_vector<double>();
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor y = conv2d(x.to(dt), w.to(dt), b.to(dt), 1, 1);
    REQUIRE(y.dtype() == dt);
    require_close(y, ref, dt == DType::f16 ? 2e-2 : 8e-2);
  }
  // Gradients flow back in the input dtype.
  Tensor xh = x.to(DType::bf16);
  xh.requires_grad_();
  Tensor wh = w.to(DType::bf16);
  wh.requires_grad_();
  sum(conv2d(xh, wh, Tensor(), 1, 1)).backward();
  REQUIRE(xh.grad().dtype() == DType::bf16);
  REQUIRE(wh.grad().shape() == w.shape());
}

TEST_CASE("conv2d gradients", "[ops][conv][grad]") {
  set_num_threads(2);
  auto conv = [](Int2 s, Int2 p, Int2 d, int64_t g) {
    return
        [=](const V& v) { return conv2d(v[0], v[1], v.size() > 2 ? v[2] : Tensor(), s, p, d, g); };
  };
  SECTION("3x3 pad 1 with bias") {
    gradcheck(conv(1, 1, 1, 1), {leaf({2, 3, 5, 5}, 1), leaf({4, 3, 3, 3}, 2), leaf({4}, 3)});
  }
  SECTION("stride 2, dilation 2, groups 2, no bias") {
    gradcheck(conv(2, 2, 2, 2), {leaf({2, 4, 7, 6}, 4), leaf({6, 2, 3, 3}, 5)});
  }
  SECTION("non-square stride/padding, groups 3") {
    gradcheck(conv({2, 1}, {1, 0}, 1, 3),
              {leaf({1, 3, 6, 5}, 6), leaf({3, 1, 3, 2}, 7), leaf({3}, 8)});
  }
  SECTION("1x1 stride 1 and stride 2") {
    gradcheck(conv(1, 0, 1, 1), {leaf({4, 3, 4, 4}, 9), leaf({5, 3, 1, 1}, 10), leaf({5}, 11)});
    gradcheck(conv(2, 0, 1, 1), {leaf({2, 3, 5, 5}, 12), leaf({2, 3, 1, 1}, 13)});
  }
  SECTION("channels-last input and non-contiguous weight") {
    Tensor x = randn({2, 3, 5, 5}, DType::f64).contiguous(MemoryFormat::ChannelsLast);
    x.requires_grad_();
    Tensor w = randn({3, 4, 3, 3}, DType::f64).transpose(0, 1);  // [4, 3, 3, 3], not contiguous
    w.requires_grad_();
    REQUIRE(x.is_contiguous(MemoryFormat::ChannelsLast));
    REQUIRE_FALSE(w.is_contiguous());
    gradcheck(conv(1, 1, 1, 1), {x, w, leaf({4}, 14)});
    REQUIRE(x.grad().suggest_memory_format() == MemoryFormat::ChannelsLast);
  }
  SECTION("only some inputs require grad") {
    Tensor x = rnd({2, 3, 4, 4}, 15);
    gradcheck(conv(1, 1, 1, 1), {x, leaf({2, 3, 3, 3}, 16), leaf({2}, 17)});
    Tensor w = rnd({2, 3, 3, 3}, 18);
    gradcheck(conv(1, 1, 1, 1), {leaf({2, 3, 4, 4}, 19), w});
  }
  SECTION("batch large enough to split images over threads") {
    gradcheck(conv(1, 1, 1, 1), {leaf({4, 2, 3, 3}, 20), leaf({3, 2, 3, 3}, 21), leaf({3}, 22)});
  }
}

TEST_CASE("conv2d output is channels-last when the input or the weight is (PyTorch's rule)",
          "[ops][conv][channels_last]") {
  const MemoryFormat nchw = MemoryFormat::Contiguous, nhwc = MemoryFormat::ChannelsLast;
  for (DType dt : {DType::f32, DType::f64}) {  // oneDNN (when built in) and im2col + Eigen
    INFO(dtype_name(dt));
    const double tol = dt == DType::f32 ? 1e-5 : 1e-12;
    // A 1-channel image and its weight [Cout, 1, k, k] are dense in both layouts: the strides
    // of the size-1 dim label them (as in PyTorch), and a channels-last weight makes the output
    // channels-last, as in a model moved to channels-last whose input is grey-scale.
    Tensor x = rnd({2, 1, 9, 8}, 1, dt), w = rnd({5, 1, 3, 3}, 2, dt), b = rnd({5}, 3, dt);
    REQUIRE(x.suggest_memory_format() == nchw);
    const Tensor wcl = w.contiguous(nhwc);
    REQUIRE(wcl.suggest_memory_format() == nhwc);
    REQUIRE(wcl.data_ptr() == w.data_ptr());  // re-labelled, not copied
    const Tensor y = conv2d(x, w, b, 1, 1);
    REQUIRE(y.suggest_memory_format() == nchw);
    const Tensor ycl = conv2d(x, wcl, b, 1, 1);
    CHECK(ycl.suggest_memory_format() == nhwc);
    CHECK(allclose(ycl, y, tol, tol));
    // A channels-last 1-channel input with an NCHW weight: channels-last too.
    CHECK(conv2d(x.contiguous(nhwc), w, b, 1, 1).suggest_memory_format() == nhwc);
    // Many channels: either operand channels-last makes the output channels-last.
    Tensor x3 = rnd({2, 3, 7, 6}, 4, dt), w3 = rnd({4, 3, 3, 3}, 5, dt);
    const Tensor y3 = conv2d(x3, w3, Tensor(), 2, 1);
    for (auto [xf, wf] : {std::pair{nchw, nhwc}, std::pair{nhwc, nchw}, std::pair{nhwc, nhwc}}) {
      const Tensor got = conv2d(x3.contiguous(xf), w3.contiguous(wf), Tensor(), 2, 1);
      CHECK(got.suggest_memory_format() == nhwc);
      CHECK(allclose(got, y3, tol, tol));
    }
    CHECK(y3.suggest_memory_format() == nchw);
  }
}

TEST_CASE("conv2d gradients with a 1-channel input and a channels-last weight",
          "[ops][conv][channels_last][grad]") {
  auto conv = [](const V& v) { return conv2d(v[0], v[1], v[2], 2, 1); };
  Tensor x = leaf({2, 1, 7, 6}, 31);  // NCHW
  Tensor w = rnd({4, 1, 3, 3}, 32).contiguous(MemoryFormat::ChannelsLast).requires_grad_();
  REQUIRE(w.suggest_memory_format() == MemoryFormat::ChannelsLast);
  gradcheck(conv, {x, w, leaf({4}, 33)});
  // Each gradient in its operand's layout.
  CHECK(x.grad().suggest_memory_format() == MemoryFormat::Contiguous);
  CHECK(w.grad().suggest_memory_format() == MemoryFormat::ChannelsLast);
  // A channels-last weight with many input channels and an NCHW input.
  Tensor x3 = leaf({2, 3, 5, 5}, 34);
  Tensor w3 = rnd({4, 3, 3, 3}, 35).contiguous(MemoryFormat::ChannelsLast).requires_grad_();
  gradcheck(conv, {x3, w3, leaf({4}, 36)});
  CHECK(x3.grad().suggest_memory_format() == MemoryFormat::Contiguous);
  CHECK(w3.grad().suggest_memory_format() == MemoryFormat::ChannelsLast);
}

TEST_CASE("conv_output_size", "[ops][conv]") {
  REQUIRE(conv_output_size(224, 7, 2, 3, 1) == 112);
  REQUIRE(conv_output_size(56, 3, 1, 1, 1) == 56);
  REQUIRE(conv_output_size(56, 1, 2, 0, 1) == 28);
  REQUIRE(conv_output_size(9, 3, 2, 2, 2) == 5);
  REQUIRE(conv_output_size(5, 2, 2, 0, 1, false) == 2);
  REQUIRE(conv_output_size(5, 2, 2, 0, 1, true) == 3);
  REQUIRE(conv_output_size(4, 2, 2, 1, 1, true) == 3);  // last window would start in the padding
}

TEST_CASE("conv2d errors name the op and the shapes", "[ops][conv][errors]") {
  Tensor x = zeros({1, 4, 5, 5});
  REQUIRE_THROWS_AS(conv2d(x, zeros({2, 3, 3, 3})), dltrain::Error);
  REQUIRE_THROWS_WITH(conv2d(x, zeros({2, 3, 3, 3})),
                      Contains("conv2d") && Contains("[1, 4, 5, 5]") && Contains("[2, 3, 3, 3]"));
  REQUIRE_THROWS_WITH(conv2d(x, zeros({3, 2, 3, 3}), Tensor(), 1, 0, 1, 2), Contains("groups"));
  REQUIRE_THROWS_WITH(conv2d(x, zeros({2, 4, 3, 3}), zeros({3})),
                      Contains("conv2d") && Contains("bias"));
  REQUIRE_THROWS_WITH(conv2d(zeros({4, 5, 5}), zeros({2, 4, 3, 3})), Contains("conv2d"));
  REQUIRE_THROWS_WITH(conv2d(x, zeros({2, 4, 7, 7})), Contains("conv2d") && Contains("smaller"));
  REQUIRE_THROWS_WITH(conv2d(x, zeros({2, 4, 3, 3}), Tensor(), 0), Contains("conv2d"));
  REQUIRE_THROWS_WITH(conv2d(x, zeros({2, 4, 3, 3}, DType::f64)),
                      Contains("conv2d") && Contains("dtype"));
  REQUIRE_THROWS_AS(conv2d(x, zeros({2, 4, 3, 3}), Tensor(), 1, 0, 1, 0), dltrain::Error);
}

TEST_CASE("conv2d on large images (row-chunked im2col): values and adjoint gradients",
          "[ops][conv][grad]") {
  set_num_threads(2);
  // f64, 16 channels, 3x3: one output row of columns is 16*9*64*8 bytes, so the 64-row
  // output is cut into several chunks. Gradients are checked with the adjoint identities
  // <gx, dx> = <conv(dx, w), gy> and <gw, dw> = <conv(x, dw), gy>.
  for (const Cfg& c : {Cfg{2, 16, 64, 64, 4, 3, 3, 1, 1, 1, 1, true},
                       Cfg{1, 16, 96, 80, 6, 3, 3, 2, 2, 2, 2, false}}) {
    Tensor x = rnd({c.N, c.Cin, c.H, c.W}, 31);
    Tensor w = rnd({c.Cout, c.Cin / c.groups, c.kh, c.kw}, 32);
    Tensor b = c.bias ? rnd({c.Cout}, 33) : Tensor();
    const int64_t Ho = conv_output_size(c.H, c.kh, c.stride.h, c.pad.h, c.dil.h);
    const int64_t Wo = conv_output_size(c.W, c.kw, c.stride.w, c.pad.w, c.dil.w);
    require_close(conv2d(x, w, b, c.stride, c.pad, c.dil, c.groups), naive_conv(x, w, b, c, Ho, Wo),
                  1e-12);
    Tensor xl = x.detach(), wl = w.detach();
    xl.requires_grad_();
    wl.requires_grad_();
    Tensor gy = rnd({c.N, c.Cout, Ho, Wo}, 34);
    conv2d(xl, wl, Tensor(), c.stride, c.pad, c.dil, c.groups).backward(gy);
    Tensor dx = rnd(x.shape(), 35), dw = rnd(w.shape(), 36);
    const double lhs_x = sum(mul(xl.grad(), dx)).item();
    const double rhs_x =
        sum(mul(conv2d(dx, w, Tensor(), c.stride, c.pad, c.dil, c.groups), gy)).item();
    REQUIRE(lhs_x == Approx(rhs_x).epsilon(1e-10));
    const double lhs_w = sum(mul(wl.grad(), dw)).item();
    const double rhs_w =
        sum(mul(conv2d(x, dw, Tensor(), c.stride, c.pad, c.dil, c.groups), gy)).item();
    REQUIRE(lhs_w == Approx(rhs_w).epsilon(1e-10));
  }
}
