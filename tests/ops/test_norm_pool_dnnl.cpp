// The oneDNN batch-norm and pooling paths against dltrain's own kernels: forward, input gradient,
// weight/bias gradients and running statistics, NCHW and channels-last (the output and gradient
// keep the input's layout). Batch norm's reference is the own kernel in f64 (which oneDNN never
// takes). Pooling's is the own kernel in f64 on the values the f32/bf16 run sees, and every
// result must be that exact value rounded once after a float accumulation, whatever the CPU's
// ISA (oneDNN's AVX-512 bf16 kernels round partial sums to bf16; see src/ops/pool.cpp). Without
// oneDNN built in the same checks run on the own kernels (set_dnnl_enabled is then a no-op).
// The f64 gradchecks of both ops stay in test_norm.cpp and test_pool.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "dltrain/backend/cpu.hpp"
#include "dltrain/dltrain.hpp"
#include "rounding.hpp"

using namespace dltrain;

namespace {

struct Result {
  Tensor y, gx, gw, gb, rm, rv;
  Tensor x, gy, w, b;  // the input, dL/dy, weight and bias the run saw, in f64
};

// max |a - b| / max |b|
double rel(const Tensor& a, const Tensor& b) {
  return max(abs(sub(a, b))).item<double>() / std::max(1e-30, max(abs(b)).item<double>());
}

Tensor f64(const Tensor& t) { return t.to(DType::f64).contiguous(); }

// batch_norm (training) of x [shape] in dt and layout fmt; sum(y * r) backward; all in f64. x
// and r are drawn in f64 and rounded to `values` (default dt) first: the f64 run of the values
// a bf16 run sees is its exact reference.
Result run_bn(const Shape& shape, bool affine, DType dt, MemoryFormat fmt, bool dnnl,
              std::optional<DType> values = std::nullopt) {
  cpu::set_dnnl_enabled(dnnl);
  const DType vt = values.value_or(dt);
  Generator g(7);
  const int64_t C = shape[1];
  Tensor x = add(mul(randn(shape, DType::f64, &g), 2.0), 0.5).to(vt).to(dt).contiguous(fmt);
  x = x.detach().requires_grad_();
  Tensor w, b;
  if (affine) {
    w = add(randn({C}, DType::f64, &g), 1.0).to(DType::f32).detach().requires_grad_();
    b = randn({C}, DType::f64, &g).to(DType::f32).detach().requires_grad_();
  }
  Tensor rm = randn({C}, DType::f64, &g).to(DType::f32);
  Tensor rv = add(abs(randn({C}, DType::f64, &g)), 0.5).to(DType::f32);
  Tensor y = batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5);
  CHECK(y.dtype() == dt);
  if (shape.size() == 4) CHECK(y.is_contiguous(fmt));
  Tensor r = randn(y.shape(), DType::f64, &g).to(vt).to(dt);
  sum(mul(y.to(DType::f64), r.to(DType::f64))).backward();
  if (shape.size() == 4) CHECK(x.grad().is_contiguous(fmt));
  CHECK(x.grad().dtype() == dt);
  Result out{f64(y),
             f64(x.grad()),
             affine ? f64(w.grad()) : Tensor(),
             affine ? f64(b.grad()) : Tensor(),
             f64(rm),
             f64(rv),
             f64(x),
             f64(r),
             affine ? f64(w) : Tensor(),
             affine ? f64(b) : Tensor()};
  cpu::set_dnnl_enabled(true);
  return out;
}

// How much a batch norm computed in float (statistics over K values per channel, then
// y = (x - mean) * rstd * w + b, and its backward) may differ from the exact result on the same
// values before the output's own rounding, from first-order bounds with u = 2^-24: the mean's
// error K u A, the variance's (one or two passes) 3 K u A^2 relative to it, rstd's half of that;
// x^ = (x - mean) * rstd is then off by R (D e_r + e_m); the backward sums K terms of dL/dy and
// dL/dy * x^. A, D, G: the largest |x|, |x - mean|, |dL/dy|; V: the smallest variance; R, W, B:
// the largest rstd, |w|, |b|. Constants round up the few roundings per element.
struct BnSlack {
  double y, gx, gw, gb, rm, rv;
};

BnSlack bn_slack(const Result& exact, const Shape& shape, bool affine, double momentum,
                 double eps) {
  const double u = testing::kFloatUnit;
  const int64_t C = shape[1];
  const double K = static_cast<double>(exact.x.numel() / C);
  const Tensor xc = exact.x.transpose(0, 1).reshape({C, -1});
  const Tensor m = mean(xc, {1}, true), v = var(xc, {1}, 0, true);
  const double A = max(abs(xc)).item<double>(), D = max(abs(sub(xc, m))).item<double>();
  const double V = min(v).item<double>(), Vmax = max(v).item<double>();
  const double R = 1.0 / std::sqrt(V + eps), X = D * R;
  const double G = max(abs(exact.gy)).item<double>(), Y = max(abs(exact.y)).item<double>();
  const double Wm = affine ? max(abs(exact.w)).item<double>() : 1.0;
  const double Bm = affine ? max(abs(exact.b)).item<double>() : 0.0;
  const double e_v = 3 * K * u * A * A / V, e_r = e_v / 2 + 2 * u, e_m = K * u * A;
  const double dx = R * (D * e_r + e_m) + 2 * u * X;  // error of x^
  const double T = 2 * G + X * G * X;                 // the backward's terms per element
  BnSlack s{};
  s.y = Wm * dx + 4 * u * (Y + Bm);
  s.gx = Wm * R * (T * (e_r + 4 * u) + K * u * G + X * (K * u * G * X + G * dx) + dx * G * X);
  s.gw = K * G * (K * u * X + dx);
  s.gb = K * K * u * G;
  s.rm = momentum * e_m + 2 * u * (A + max(abs(exact.rm)).item<double>());
  s.rv = momentum * e_v * Vmax * K / (K - 1) + 2 * u * max(abs(exact.rv)).item<double>();
  return s;
}

using PoolFn = std::function<Tensor(const Tensor&)>;

struct PoolResult {
  Tensor y, gx;
  double max_x, max_gy;  // max |x| and max |dL/dy|: the scale of each direction's terms
};

// pool(x) of x [shape] (with `ties`, relu'd: windows of equal zeros) in dt and fmt; sum(y * r)
// backward; results in f64. x and r are drawn in f64 and rounded to `values` (default dt) before
// they are cast to dt: the f64 run of the values a bf16 run sees is the exact reference of that
// run, ties and winners included.
PoolResult run_pool(const PoolFn& pool, const Shape& shape, bool ties, DType dt, MemoryFormat fmt,
                    bool dnnl, std::optional<DType> values = std::nullopt) {
  cpu::set_dnnl_enabled(dnnl);
  const DType vt = values.value_or(dt);
  Generator g(11);
  Tensor x = randn(shape, DType::f64, &g);
  if (ties) x = relu(x);  // half zeros: windows with ties
  x = x.to(vt).to(dt).contiguous(fmt).detach().requires_grad_();
  Tensor y = pool(x);
  CHECK(y.dtype() == dt);
  CHECK(y.is_contiguous(fmt));
  Tensor r = randn(y.shape(), DType::f64, &g).to(vt).to(dt);
  sum(mul(y.to(DType::f64), r.to(DType::f64))).backward();
  CHECK(x.grad().is_contiguous(fmt));
  PoolResult out{f64(y), f64(x.grad()), max(abs(f64(x))).item<double>(),
                 max(abs(f64(r))).item<double>()};
  cpu::set_dnnl_enabled(true);
  return out;
}

// The float error of a pool result whose largest window has `terms` terms, each at most `scale`
// (max |x| forward, max |dL/dy| backward) in magnitude: a float sum of at most `terms` of them
// (a max pooling gradient sums an input's winning windows; an average divides once).
double pool_slack(int64_t terms, double scale) {
  return static_cast<double>(terms * terms + 1) * testing::kFloatUnit * scale;
}

constexpr MemoryFormat kFormats[] = {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast};
const char* name(MemoryFormat f) { return f == MemoryFormat::ChannelsLast ? "nhwc" : "nchw"; }

}  // namespace

TEST_CASE("batch_norm training (oneDNN when built in) matches the f64 reference, both layouts",
          "[ops][norm][dnnl]") {
  struct Case {
    Shape x;
    bool affine;
  };
  const Case cases[] = {
      {{4, 3, 5, 5}, true}, {{2, 16, 7, 6}, true}, {{3, 8, 4, 4}, false},
      {{16, 5}, true},      {{4, 6, 10}, true},    {{5, 4, 1, 1}, true},
  };
  for (const Case& c : cases) {
    for (MemoryFormat fmt : kFormats) {
      if (fmt == MemoryFormat::ChannelsLast && c.x.size() != 4) continue;
      for (DType dt : {DType::f32, DType::bf16}) {
        INFO("x " << shape_str(c.x) << " " << dtype_name(dt) << " " << name(fmt));
        const Result got = run_bn(c.x, c.affine, dt, fmt, true);
        const Result exact = run_bn(c.x, c.affine, DType::f64, MemoryFormat::Contiguous, false, dt);
        // Each output is the exact result rounded once to its dtype (x's for y and dL/dx, f32
        // for the parameters' gradients and the running statistics), up to the float error.
        const BnSlack sl = bn_slack(exact, c.x, c.affine, 0.1, 1e-5);
        CHECK(testing::beyond_rounding(got.y, exact.y, dt, sl.y) <= 0);
        CHECK(testing::beyond_rounding(got.gx, exact.gx, dt, sl.gx) <= 0);
        if (c.affine) {
          CHECK(testing::beyond_rounding(got.gw, exact.gw, DType::f32, sl.gw) <= 0);
          CHECK(testing::beyond_rounding(got.gb, exact.gb, DType::f32, sl.gb) <= 0);
        }
        CHECK(testing::beyond_rounding(got.rm, exact.rm, DType::f32, sl.rm) <= 0);
        CHECK(testing::beyond_rounding(got.rv, exact.rv, DType::f32, sl.rv) <= 0);
      }
    }
  }
}

TEST_CASE("batch_norm oneDNN and own kernels agree in f32 (same rounding of the input)",
          "[ops][norm][dnnl]") {
  for (MemoryFormat fmt : kFormats) {
    INFO(name(fmt));
    const Result a = run_bn({8, 32, 14, 14}, true, DType::f32, fmt, true);
    const Result b = run_bn({8, 32, 14, 14}, true, DType::f32, fmt, false);
    CHECK(rel(a.y, b.y) < 1e-6);
    CHECK(rel(a.gx, b.gx) < 1e-6);
    CHECK(rel(a.gw, b.gw) < 1e-6);
    CHECK(rel(a.gb, b.gb) < 1e-6);
    CHECK(rel(a.rv, b.rv) < 1e-6);
  }
}

TEST_CASE("pooling (oneDNN when built in) matches dltrain's kernels, both layouts",
          "[ops][pool][dnnl]") {
  struct Case {
    const char* what;
    PoolFn f;
    Shape x;
    bool ties;
    int64_t window;  // the largest window (terms of an average, windows holding an input)
    bool max = false;
  };
  const Case cases[] = {
      {"max 3x3/2 pad 1 (ResNet stem)",
       [](const Tensor& x) { return max_pool2d(x, 3, 2, 1); },
       {2, 5, 13, 12},
       true,
       9,
       true},
      {"max 2x2/2",
       [](const Tensor& x) { return max_pool2d(x, 2, 2); },
       {2, 4, 9, 8},
       true,
       4,
       true},
      {"max 3x3/2 ceil",
       [](const Tensor& x) { return max_pool2d(x, 3, 2, 0, 1, true); },
       {1, 3, 10, 10},
       true,
       9,
       true},
      {"max 3x2/(1,2)",
       [](const Tensor& x) {
         return max_pool2d(x, {3, 2}, Int2{1, 2});
       },
       {2, 3, 7, 9},
       false,
       6,
       true},
      {"avg 3x3/2 pad 1",
       [](const Tensor& x) { return avg_pool2d(x, 3, 2, 1); },
       {2, 6, 11, 11},
       false,
       9},
      {"avg 3x3/2 pad 1 exclude pad",
       [](const Tensor& x) { return avg_pool2d(x, 3, 2, 1, false, false); },
       {2, 6, 11, 11},
       false,
       9},
      {"avg 3x3/2 ceil (own kernel: windows past the padding)",
       [](const Tensor& x) { return avg_pool2d(x, 3, 2, 1, true); },
       {1, 4, 10, 10},
       false,
       9},
      {"adaptive 7 -> 1 (ResNet head)",
       [](const Tensor& x) { return adaptive_avg_pool2d(x, 1); },
       {2, 16, 7, 7},
       false,
       49},
      {"adaptive 6 -> 3",
       [](const Tensor& x) { return adaptive_avg_pool2d(x, 3); },
       {2, 4, 6, 6},
       false,
       4},
      {"adaptive 7 -> 3 (own kernel: overlapping windows)",
       [](const Tensor& x) { return adaptive_avg_pool2d(x, 3); },
       {2, 4, 7, 7},
       false,
       9},
  };
  for (const Case& c : cases) {
    for (MemoryFormat fmt : kFormats) {
      for (DType dt : {DType::f32, DType::bf16}) {
        INFO(c.what << " x " << shape_str(c.x) << " " << dtype_name(dt) << " " << name(fmt));
        const PoolResult got = run_pool(c.f, c.x, c.ties, dt, fmt, true);
        const PoolResult same = run_pool(c.f, c.x, c.ties, dt, MemoryFormat::Contiguous, false);
        const PoolResult exact =
            run_pool(c.f, c.x, c.ties, DType::f64, MemoryFormat::Contiguous, false, dt);
        // Forward: a window of `window` terms; backward: an input's gradient sums the windows
        // that hold it (at most `window` of them). Both must be the exact result rounded once
        // to dt after a float accumulation (PyTorch's opmath rule), on every CPU and ISA:
        // oneDNN (`got`, either layout) and the own kernels (`same`) alike.
        for (const PoolResult* p : {&got, &same}) {
          INFO((p == &got ? "oneDNN when built in, " : "own kernels, ") << name(fmt));
          CHECK(testing::beyond_rounding(p->y, exact.y, dt, pool_slack(c.window, got.max_x)) <= 0);
          CHECK(testing::beyond_rounding(p->gx, exact.gx, dt, pool_slack(c.window, got.max_gy)) <=
                0);
        }
        // Max pooling moves values: the forward is exact in any dtype.
        if (c.max) CHECK(max(abs(sub(got.y, exact.y))).item<double>() == 0);
      }
    }
  }
}

TEST_CASE("max_pool2d propagates NaN with oneDNN built in, as PyTorch", "[ops][pool][dnnl]") {
  for (MemoryFormat fmt : kFormats) {
    INFO(name(fmt));
    Tensor x = randn({1, 2, 6, 6});
    x.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();  // plane 0, (1, 1)
    x = x.contiguous(fmt).requires_grad_();
    Tensor y = max_pool2d(x, 3, 2, 1);
    const Tensor y0 = y.contiguous();
    CHECK(std::isnan(y0.data<float>()[0]));        // window rows 0-1, cols 0-1 holds the NaN
    CHECK(std::isnan(y0.data<float>()[1]));        // rows 0-1, cols 1-3
    CHECK_FALSE(std::isnan(y0.data<float>()[9]));  // plane 1 has none
    sum(y).backward();
    CHECK(x.grad().contiguous().data<float>()[7] >= 1.0f);  // the NaN won its windows
  }
}
