// conv_transpose2d and nn::ConvTranspose2d: values against a naive scatter loop (stride,
// padding, output_padding, dilation, groups, bias) in f32/f64, NCHW and channels-last, on the
// oneDNN and the im2col paths; PyTorch's values and gradients (research_reference.txt); f64
// finite-difference gradients; f16/bf16; the module; errors.
#include <catch2/catch.hpp>

#include <cmath>

#include "gradcheck.hpp"
#include "reference_file.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::leaf;
using dltrain::testing::rnd;
using V = std::vector<Tensor>;

namespace {

struct Cfg {
  int64_t N, Cin, H, W, Cout, kh, kw;
  Int2 stride, pad, opad, dil;
  int64_t groups;
  bool bias;
};

int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t op, int64_t d) {
  return (in - 1) * s - 2 * p + d * (k - 1) + op + 1;
}

// Naive transposed convolution in double: every input element scatters w into the output.
std::vector<double> naive(const Tensor& x, const Tensor& w, const Tensor& b, const Cfg& c) {
  const int64_t Ho = out_size(c.H, c.kh, c.stride.h, c.pad.h, c.opad.h, c.dil.h);
  const int64_t Wo = out_size(c.W, c.kw, c.stride.w, c.pad.w, c.opad.w, c.dil.w);
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const auto bv = b.defined() ? b.to_vector<double>() : std::vector<double>(c.Cout, 0.0);
  const int64_t cg = c.Cin / c.groups, og = c.Cout / c.groups;
  std::vector<double> y(static_cast<size_t>(c.N * c.Cout * Ho * Wo));
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t o = 0; o < c.Cout; ++o)
      for (int64_t i = 0; i < Ho * Wo; ++i) y[(n * c.Cout + o) * Ho * Wo + i] = bv[o];
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t ci = 0; ci < c.Cin; ++ci)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t ww = 0; ww < c.W; ++ww) {
          const double v = xv[((n * c.Cin + ci) * c.H + h) * c.W + ww];
          const int64_t g = ci / cg;
          for (int64_t oc = 0; oc < og; ++oc)
            for (int64_t i = 0; i < c.kh; ++i)
              for (int64_t j = 0; j < c.kw; ++j) {
                const int64_t oh = h * c.stride.h - c.pad.h + i * c.dil.h;
                const int64_t ow = ww * c.stride.w - c.pad.w + j * c.dil.w;
                if (oh < 0 || oh >= Ho || ow < 0 || ow >= Wo) continue;
                y[((n * c.Cout + g * og + oc) * Ho + oh) * Wo + ow] +=
                    v * wv[((ci * og + oc) * c.kh + i) * c.kw + j];
              }
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
    {2, 3, 4, 5, 4, 3, 3, 1, 0, 0, 1, 1, true},  // plain 3x3
    {2, 4, 5, 4, 6, 3, 3, 2, 1, 1, 1, 2, true},  // stride 2, output_padding, groups
    {1, 3, 3, 4, 2, 3, 2, {2, 3}, {0, 1}, {1, 2}, {2, 1}, 1, false},  // non-square everything
    {3, 2, 4, 4, 2, 4, 4, 2, 1, 0, 1, 1, true},                       // DCGAN-style 4x4/2
    {2, 6, 3, 3, 6, 3, 3, 2, 1, 1, 1, 6, true},                       // depthwise
    {1, 2, 4, 5, 3, 3, 3, 1, 1, 1, 2, 1, true},                       // output_padding >= stride
    {2, 5, 3, 3, 7, 1, 1, 1, 0, 0, 1, 1, false},                      // 1x1
};

void check_configs(bool dnnl) {
  const bool was = cpu::dnnl_enabled();
  cpu::set_dnnl_enabled(dnnl);
  for (DType dt : {DType::f32, DType::f64}) {
    const double tol = dt == DType::f32 ? 1e-4 : 1e-12;
    for (const Cfg& c : kConfigs) {
      INFO("dtype " << dt << " config Cin " << c.Cin << " k " << c.kh << "x" << c.kw << " groups "
                    << c.groups << " oneDNN " << dnnl);
      Tensor x = rnd({c.N, c.Cin, c.H, c.W}, 1, dt);
      Tensor w = rnd({c.Cin, c.Cout / c.groups, c.kh, c.kw}, 2, dt);
      Tensor b = c.bias ? rnd({c.Cout}, 3, dt) : Tensor();
      const std::vector<double> ref = naive(x, w, b, c);
      Tensor y = conv_transpose2d(x, w, b, c.stride, c.pad, c.opad, c.groups, c.dil);
      CHECK(y.dtype() == dt);
      require_close(y, ref, tol);
      Tensor ycl = conv_transpose2d(x.contiguous(MemoryFormat::ChannelsLast), w, b, c.stride, c.pad,
                                    c.opad, c.groups, c.dil);
      CHECK(ycl.suggest_memory_format() == MemoryFormat::ChannelsLast);
      require_close(ycl, ref, tol);
    }
  }
  cpu::set_dnnl_enabled(was);
}

const char* const kResearchReference = DLTRAIN_REFERENCE_DIR "/research_reference.txt";
Tensor R(const std::string& name) {
  return dltrain::testing::reference_tensor(kResearchReference, name);
}

}  // namespace

TEST_CASE("conv_transpose2d values against a naive loop", "[ops][conv_transpose]") {
  set_num_threads(2);
  SECTION("im2col path") { check_configs(false); }
  if (cpu::dnnl_compiled()) {
    SECTION("oneDNN path") { check_configs(true); }
  }
}

TEST_CASE("conv_transpose2d matches PyTorch, forward and gradients", "[ops][conv_transpose]") {
  struct Case {
    const char* name;
    Int2 stride, pad, opad, dil;
    int64_t groups;
    bool bias;
  };
  const Case cases[] = {{"convt_a", 2, 1, 1, 1, 2, true},
                        {"convt_b", {2, 3}, {0, 1}, {1, 2}, {2, 1}, 1, false},
                        {"convt_c", 1, 1, 1, 2, 1, true}};
  const bool was = cpu::dnnl_enabled();
  for (bool dnnl : {false, true}) {
    if (dnnl && !cpu::dnnl_compiled()) continue;
    cpu::set_dnnl_enabled(dnnl);
    for (const Case& k : cases)
      for (DType dt : {DType::f64, DType::f32})
        for (MemoryFormat fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
          const std::string p = k.name;
          INFO(p << " dtype " << dt << " channels-last " << (fmt == MemoryFormat::ChannelsLast)
                 << " oneDNN " << dnnl);
          const double tol = dt == DType::f64 ? 1e-10 : 2e-4;
          // Fresh leaves (never mark the cached reference tensors themselves).
          Tensor x = R(p + ".x").to(dt).clone().contiguous(fmt).detach();
          Tensor w = R(p + ".w").to(dt).clone(), b = k.bias ? R(p + ".b").to(dt).clone() : Tensor();
          x.requires_grad_();
          w.requires_grad_();
          if (b.defined()) b.requires_grad_();
          Tensor y = conv_transpose2d(x, w, b, k.stride, k.pad, k.opad, k.groups, k.dil);
          CHECK(y.suggest_memory_format() == fmt);
          REQUIRE(y.shape() == R(p + ".y").shape());
          CHECK(allclose(y.to(DType::f64), R(p + ".y"), tol, tol));
          y.backward(R(p + ".gy").to(dt));
          CHECK(x.grad().suggest_memory_format() == fmt);
          CHECK(allclose(x.grad().to(DType::f64), R(p + ".gx"), tol, tol));
          CHECK(allclose(w.grad().to(DType::f64), R(p + ".gw"), tol, tol));
          if (b.defined()) CHECK(allclose(b.grad().to(DType::f64), R(p + ".gb"), tol, tol));
        }
  }
  cpu::set_dnnl_enabled(was);
}

TEST_CASE("conv_transpose2d gradients", "[ops][conv_transpose][grad]") {
  auto ct = [](Int2 s, Int2 p, Int2 op, int64_t g, Int2 d) {
    return [=](const V& v) {
      return conv_transpose2d(v[0], v[1], v.size() > 2 ? v[2] : Tensor(), s, p, op, g, d);
    };
  };
  SECTION("stride 2, output_padding 1, bias") {
    gradcheck(ct(2, 1, 1, 1, 1), {leaf({2, 3, 3, 4}, 1), leaf({3, 2, 3, 3}, 2), leaf({2}, 3)});
  }
  SECTION("groups, dilation, non-square") {
    gradcheck(ct({2, 1}, {1, 0}, {1, 0}, 2, {1, 2}),
              {leaf({2, 4, 3, 3}, 4), leaf({4, 3, 2, 3}, 5), leaf({6}, 6)});
  }
  SECTION("output_padding >= stride (below the dilation)") {
    gradcheck(ct(1, 1, 1, 1, 2), {leaf({1, 2, 3, 4}, 7), leaf({2, 3, 3, 3}, 8), leaf({3}, 9)});
  }
  SECTION("channels-last and non-contiguous leaves") {
    Tensor x = randn({2, 3, 3, 3}, DType::f64).contiguous(MemoryFormat::ChannelsLast);
    x.requires_grad_();
    Tensor w = leaf({4, 3, 2, 2}, 10).transpose(0, 1).detach();  // [3, 4, 2, 2], non-contiguous
    w.requires_grad_();
    gradcheck(ct(2, 0, 0, 1, 1), {x, w, leaf({4}, 11)});
    CHECK(x.grad().suggest_memory_format() == MemoryFormat::ChannelsLast);
  }
  SECTION("channels-last weight, NCHW input, one output channel (a decoder's last layer)") {
    Tensor x = leaf({2, 3, 3, 4}, 15);
    Tensor w = rnd({3, 1, 4, 4}, 16).contiguous(MemoryFormat::ChannelsLast).requires_grad_();
    REQUIRE(w.suggest_memory_format() == MemoryFormat::ChannelsLast);
    const Tensor y = conv_transpose2d(x.detach(), w.detach(), Tensor(), 2, 1);
    CHECK(y.suggest_memory_format() == MemoryFormat::ChannelsLast);  // as conv2d's rule
    CHECK(allclose(y, conv_transpose2d(x.detach(), w.detach().contiguous(), Tensor(), 2, 1), 1e-12,
                   1e-12));
    gradcheck(ct(2, 1, 0, 1, 1), {x, w, leaf({1}, 17)});
    CHECK(x.grad().suggest_memory_format() == MemoryFormat::Contiguous);
    CHECK(w.grad().suggest_memory_format() == MemoryFormat::ChannelsLast);
  }
  SECTION("im2col path with oneDNN off") {
    const bool was = cpu::dnnl_enabled();
    cpu::set_dnnl_enabled(false);
    gradcheck(ct(3, 1, 2, 1, 1), {leaf({1, 2, 3, 2}, 12), leaf({2, 2, 3, 3}, 13), leaf({2}, 14)});
    cpu::set_dnnl_enabled(was);
  }
}

TEST_CASE("conv_transpose2d in f16 and bf16 computes in float", "[ops][conv_transpose]") {
  Tensor x = rnd({2, 4, 5, 5}, 21), w = rnd({4, 3, 3, 3}, 22), b = rnd({3}, 23);
  Tensor ref = conv_transpose2d(x, w, b, 2, 1, 1);
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor y = conv_transpose2d(x.to(dt), w.to(dt), b.to(dt), 2, 1, 1);
    CHECK(y.dtype() == dt);
    const double tol = dt == DType::f16 ? 2e-2 : 1e-1;
    CHECK(allclose(y.to(DType::f64), ref, tol, tol));
  }
}

TEST_CASE("nn::ConvTranspose2d doubles the resolution of a decoder", "[ops][conv_transpose][nn]") {
  manual_seed(5);
  nn::ConvTranspose2d up(8, 4, 4, {.stride = 2, .padding = 1});
  CHECK(up.weight.shape() == Shape{8, 4, 4, 4});
  CHECK(up.bias.shape() == Shape{4});
  // PyTorch's bound: 1/sqrt(fan_in), fan_in = weight.size(1) * kH * kW = 64.
  CHECK(max(abs(up.weight)).item<double>() <= 1.0 / 8.0 + 1e-7);
  Tensor x = randn({2, 8, 7, 7});
  Tensor y = up.forward(x);
  CHECK(y.shape() == Shape{2, 4, 14, 14});
  CHECK(allclose(y, conv_transpose2d(x, up.weight, up.bias, 2, 1)));
  sum(y).backward();
  CHECK(up.weight.grad().shape() == up.weight.shape());
  CHECK(up.extra_repr() == "8, 4, kernel_size=(4, 4), stride=(2, 2), padding=(1, 1)");
  const auto sd = up.state_dict();
  CHECK(sd.size() == 2);
  nn::ConvTranspose2d g(4, 6, 3, {.stride = 2, .output_padding = 1, .groups = 2, .bias = false});
  CHECK(g.weight.shape() == Shape{4, 3, 3, 3});
  CHECK(!g.bias.defined());
  CHECK(g.extra_repr() ==
        "4, 6, kernel_size=(3, 3), stride=(2, 2), output_padding=(1, 1), groups=2, bias=False");
  CHECK_THROWS_WITH(nn::ConvTranspose2d(4, 6, 3, {.output_padding = 1}),
                    Contains("output_padding (1, 1) must be smaller than either stride"));
}

TEST_CASE("conv_transpose2d errors name the op and the fix", "[ops][conv_transpose][errors]") {
  Tensor x = randn({1, 4, 5, 5}), w = randn({4, 2, 3, 3});
  CHECK_THROWS_WITH(conv_transpose2d(randn({4, 5, 5}), w), Contains("expected a 4-d input"));
  CHECK_THROWS_WITH(conv_transpose2d(x, randn({2, 4, 3, 3})),
                    Contains("is [C_in, C_out/groups, kH, kW] with C_in = 2"));
  CHECK_THROWS_WITH(conv_transpose2d(x, w, randn({3})), Contains("bias must be [2]"));
  CHECK_THROWS_WITH(conv_transpose2d(x, w, Tensor(), 2, 0, 2),
                    Contains("output_padding (2, 2) must be smaller than either stride"));
  CHECK_THROWS_WITH(conv_transpose2d(x, w.to(DType::f64)), Contains("share one floating dtype"));
  CHECK_THROWS_WITH(conv_transpose2d(x, w, Tensor(), 1, 0, 0, 3),
                    Contains("which must divide C_in"));
  CHECK_THROWS_WITH(conv_transpose2d(randn({1, 4, 1, 1}), w, Tensor(), 1, 2),
                    Contains("gives an empty output"));
}

TEST_CASE("conv1d matches PyTorch and its gradients check", "[ops][conv1d]") {
  for (DType dt : {DType::f64, DType::f32}) {
    INFO("dtype " << dt);
    const double tol = dt == DType::f64 ? 1e-10 : 2e-4;
    Tensor x = R("conv1d.x").to(dt).clone(), w = R("conv1d.w").to(dt).clone(),
           b = R("conv1d.b").to(dt).clone();
    x.requires_grad_();
    w.requires_grad_();
    b.requires_grad_();
    Tensor y = conv1d(x, w, b, 2, 1, 2, 2);
    REQUIRE(y.shape() == R("conv1d.y").shape());
    CHECK(allclose(y.to(DType::f64), R("conv1d.y"), tol, tol));
    y.backward(R("conv1d.gy").to(dt));
    CHECK(allclose(x.grad().to(DType::f64), R("conv1d.gx"), tol, tol));
    CHECK(allclose(w.grad().to(DType::f64), R("conv1d.gw"), tol, tol));
    CHECK(allclose(b.grad().to(DType::f64), R("conv1d.gb"), tol, tol));
  }
  gradcheck([](const V& v) { return conv1d(v[0], v[1], v[2], 1, 2, 1, 1); },
            {leaf({2, 3, 6}, 31), leaf({4, 3, 3}, 32), leaf({4}, 33)});
  gradcheck([](const V& v) { return conv1d(v[0], v[1], Tensor(), 3, 0, 2, 3); },
            {leaf({1, 3, 9}, 34), leaf({6, 1, 2}, 35)});

  nn::Conv1d m(4, 6, 3, {.padding = 1, .groups = 2});
  CHECK(m.weight.shape() == Shape{6, 2, 3});
  CHECK(m.forward(randn({2, 4, 10})).shape() == Shape{2, 6, 10});
  CHECK(m.extra_repr() == "4, 6, kernel_size=(3,), stride=(1,), padding=(1,), groups=2");
  CHECK_THROWS_WITH(conv1d(randn({4, 10}), randn({6, 4, 3})), Contains("expected a 3-d input"));
  CHECK_THROWS_WITH(conv1d(randn({1, 4, 10}), randn({6, 4, 3, 1})),
                    Contains("expected a 3-d weight"));
}
