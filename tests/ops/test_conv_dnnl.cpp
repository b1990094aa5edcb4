// The oneDNN convolution path against dltrain's im2col + Eigen path in f64 on the same (rounded)
// values: forward and every gradient must be the exact result rounded once after a float
// accumulation (tests/rounding.hpp), in f32 and bf16, on every CPU and ISA (bf16 runs through
// oneDNN from AVX-512 on, through the im2col path below it), NCHW and channels-last (also
// mixed: input in one, weight in the other), with stride, padding, dilation, groups and bias.
// Without oneDNN built in the same checks run on the Eigen path (set_dnnl_enabled is then a
// no-op), which also serves f32 and bf16 there.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <optional>
#include <string>

#include "dltrain/backend/cpu.hpp"
#include "dltrain/dltrain.hpp"
#include "rounding.hpp"
#include "skip.hpp"

using namespace dltrain;

namespace {

struct Case {
  Shape x, w;
  Int2 stride, pad, dil;
  int64_t groups;
  bool bias;
};

struct Result {
  Tensor y, gx, gw, gb;
};

// Forward and backward of sum(conv(x, w, b) * r) in dt, x in layout fmt and w in w_fmt;
// results in f64 NCHW. y is channels-last when x or w is; each gradient in its operand's layout.
// x, w, b and r are drawn in f64 and rounded to `values` (default dt): the f64 run of a bf16
// run's values is its exact reference. `absolute` takes their magnitudes: every output is then
// the sum of the magnitudes of the terms that make the same output of the signed run.
Result run(const Case& c, DType dt, MemoryFormat fmt, bool dnnl,
           std::optional<MemoryFormat> w_fmt = std::nullopt,
           std::optional<DType> values = std::nullopt, bool absolute = false) {
  cpu::set_dnnl_enabled(dnnl);
  const DType vt = values.value_or(dt);
  auto draw = [&](Tensor t) {
    t = t.to(vt).to(dt);
    return absolute ? abs(t) : t;
  };
  Generator g(42);
  Tensor x = randn(c.x, DType::f64, &g), w = mul(randn(c.w, DType::f64, &g), 0.3);
  Tensor b = c.bias ? randn({c.w[0]}, DType::f64, &g) : Tensor();
  x = draw(x).contiguous(fmt).detach().requires_grad_();
  w = draw(w).contiguous(w_fmt.value_or(fmt)).detach().requires_grad_();
  if (b.defined()) b = draw(b).detach().requires_grad_();
  Tensor y = conv2d(x, w, b, c.stride, c.pad, c.dil, c.groups);
  Tensor r = draw(randn(y.shape(), DType::f64, &g));
  sum(mul(y, r)).backward();
  Result out{y.to(DType::f64).contiguous(), x.grad().to(DType::f64).contiguous(),
             w.grad().to(DType::f64).contiguous(),
             b.defined() ? b.grad().to(DType::f64) : Tensor()};
  const bool cl = fmt == MemoryFormat::ChannelsLast || w_fmt == MemoryFormat::ChannelsLast;
  CHECK(y.suggest_memory_format() == (cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous));
  CHECK(x.grad().is_contiguous(fmt));
  CHECK(w.grad().is_contiguous(w_fmt.value_or(fmt)));
  cpu::set_dnnl_enabled(true);
  return out;
}

// max |a - b| / max |b|
double rel(const Tensor& a, const Tensor& b) {
  return max(abs(sub(a, b))).item<double>() / std::max(1e-30, max(abs(b)).item<double>());
}

}  // namespace

TEST_CASE("conv2d (oneDNN when built in) matches the f64 reference in f32 and bf16, both layouts",
          "[ops][conv][dnnl]") {
  const Case cases[] = {
      {{2, 3, 9, 9}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
      {{2, 4, 11, 10}, {6, 4, 3, 3}, {2, 2}, {1, 0}, {1, 1}, 1, false},
      {{1, 8, 12, 12}, {8, 2, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 4, true},    // groups + dilation
      {{3, 16, 7, 7}, {32, 16, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, false},  // pointwise
      {{2, 3, 16, 16}, {8, 3, 7, 7}, {2, 2}, {3, 3}, {1, 1}, 1, false},   // a ResNet stem
      {{2, 6, 8, 8}, {6, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 6, true},      // depthwise
  };
  for (const Case& c : cases) {
    // Terms per output: y sums Cin/groups * kh * kw products (and the bias); dL/dx at most
    // Cout/groups * kh * kw; dL/dw and dL/db sum over N * Ho * Wo positions.
    const int64_t Cin_g = c.x[1] / c.groups, Cout_g = c.w[0] / c.groups, kk = c.w[2] * c.w[3];
    for (MemoryFormat fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      for (DType dt : {DType::f32, DType::bf16}) {
        INFO("x " << shape_str(c.x) << " w " << shape_str(c.w) << " groups " << c.groups << " "
                  << dtype_name(dt) << (fmt == MemoryFormat::ChannelsLast ? " nhwc" : " nchw"));
        const Result got = run(c, dt, fmt, true);
        const Result exact =
            run(c, DType::f64, MemoryFormat::Contiguous, false, std::nullopt, dt, false);
        const Result mag =
            run(c, DType::f64, MemoryFormat::Contiguous, false, std::nullopt, dt, true);
        const int64_t positions = got.y.numel() / got.y.size(1);
        auto slack = [](const Tensor& sum_abs, int64_t terms) {
          return mul(sum_abs, static_cast<double>(terms) * testing::kFloatUnit);
        };
        CHECK(testing::beyond_rounding(got.y, exact.y, dt, slack(mag.y, Cin_g * kk + 1)) <= 0);
        CHECK(testing::beyond_rounding(got.gx, exact.gx, dt, slack(mag.gx, Cout_g * kk)) <= 0);
        CHECK(testing::beyond_rounding(got.gw, exact.gw, dt, slack(mag.gw, positions)) <= 0);
        if (c.bias)
          CHECK(testing::beyond_rounding(got.gb, exact.gb, dt, slack(mag.gb, positions)) <= 0);
      }
    }
  }
}

TEST_CASE("conv2d with the input and the weight in different layouts (oneDNN when built in)",
          "[ops][conv][dnnl]") {
  // PyTorch's rule: channels-last when either is; a 1-channel input (dense in both layouts)
  // with a channels-last weight, as in the first layer of a model moved to channels-last.
  const Case cases[] = {
      {{2, 1, 12, 11}, {8, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
      {{2, 1, 28, 28}, {32, 1, 4, 4}, {2, 2}, {1, 1}, {1, 1}, 1, true},  // the VAE's encoder
      {{2, 3, 9, 9}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, false},
      {{2, 8, 7, 7}, {16, 8, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, true},
  };
  const MemoryFormat nchw = MemoryFormat::Contiguous, nhwc = MemoryFormat::ChannelsLast;
  for (const Case& c : cases) {
    const Result ref = run(c, DType::f64, nchw, false);
    for (auto [xf, wf] : {std::pair{nchw, nhwc}, std::pair{nhwc, nchw}}) {
      for (bool dnnl : {true, false}) {
        INFO("x " << shape_str(c.x) << (xf == nhwc ? " nhwc" : " nchw") << " w " << shape_str(c.w)
                  << (wf == nhwc ? " nhwc" : " nchw") << (dnnl ? " oneDNN" : " Eigen"));
        const Result got = run(c, DType::f32, xf, dnnl, wf);
        CHECK(rel(got.y, ref.y) < 2e-6);
        CHECK(rel(got.gx, ref.gx) < 2e-6);
        CHECK(rel(got.gw, ref.gw) < 2e-6);
        if (c.bias) CHECK(rel(got.gb, ref.gb) < 2e-6);
      }
    }
  }
}

TEST_CASE("set_dnnl_enabled switches the path and DLTRAIN_DNNL documents it", "[ops][conv][dnnl]") {
  cpu::set_dnnl_enabled(false);
  CHECK_FALSE(cpu::dnnl_enabled());
  cpu::set_dnnl_enabled(true);
  CHECK(cpu::dnnl_enabled() == cpu::dnnl_compiled());
}

TEST_CASE("oneDNN reports its ISA, and ONEDNN_MAX_CPU_ISA caps it", "[ops][conv][dnnl][isa]") {
  if (!cpu::dnnl_compiled()) {
    CHECK(std::string(cpu::dnnl_isa()).empty());
    testing::skip("built without oneDNN");
    return;
  }
  const std::string isa = cpu::dnnl_isa();
  WARN("oneDNN runs its " << isa << " kernels here");
  CHECK_FALSE(isa.empty());
  CHECK(isa != "unknown");
  // ctest's ops_dnnl_isa_avx2 runs these tests again with the cap: it must have taken effect,
  // or that run would test the native path twice.
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap && std::string(cap) == "AVX2") CHECK(isa.rfind("avx512", 0) == std::string::npos);
}
