// The oneDNN batch-norm and pooling paths against dltrain's own kernels: forward, input gradient,
// weight/bias gradients and running statistics, f32 tight and bf16 within bounds set from
// measurement, NCHW and channels-last (the output and gradient keep the input's layout). The
// reference is the own kernel in f64 (which oneDNN never takes), and for max pooling with ties
// the own kernel in the same dtype (the winner of a tie depends on the rounded values). Without
// oneDNN built in the same checks run on the own kernels (set_dnnl_enabled is then a no-op).
// The f64 gradchecks of both ops stay in test_norm.cpp and test_pool.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>

#include "dltrain/backend/cpu.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;

namespace {

struct Result {
  Tensor y, gx, gw, gb, rm, rv;
};

// max |a - b| / max |b|
double rel(const Tensor& a, const Tensor& b) {
  return max(abs(sub(a, b))).item<double>() / std::max(1e-30, max(abs(b)).item<double>());
}

Tensor f64(const Tensor& t) { return t.to(DType::f64).contiguous(); }

// batch_norm (training) of x [shape] in dt and layout fmt; sum(y * r) backward; all in f64.
Result run_bn(const Shape& shape, bool affine, DType dt, MemoryFormat fmt, bool dnnl) {
  cpu::set_dnnl_enabled(dnnl);
  Generator g(7);
  const int64_t C = shape[1];
  Tensor x = add(mul(randn(shape, DType::f64, &g), 2.0), 0.5).to(dt).contiguous(fmt);
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
  Tensor r = randn(y.shape(), DType::f64, &g).to(dt);
  sum(mul(y.to(DType::f64), r.to(DType::f64))).backward();
  if (shape.size() == 4) CHECK(x.grad().is_contiguous(fmt));
  CHECK(x.grad().dtype() == dt);
  Result out{
      f64(y),  f64(x.grad()), affine ? f64(w.grad()) : Tensor(), affine ? f64(b.grad()) : Tensor(),
      f64(rm), f64(rv)};
  cpu::set_dnnl_enabled(true);
  return out;
}

using PoolFn = std::function<Tensor(const Tensor&)>;

// pool(x) of x [shape] (with `ties`, relu'd: windows of equal zeros) in dt and fmt; sum(y * r)
// backward; results in f64.
Result run_pool(const PoolFn& pool, const Shape& shape, bool ties, DType dt, MemoryFormat fmt,
                bool dnnl) {
  cpu::set_dnnl_enabled(dnnl);
  Generator g(11);
  Tensor x = randn(shape, DType::f64, &g);
  if (ties) x = relu(x);  // half zeros: windows with ties
  x = x.to(dt).contiguous(fmt).detach().requires_grad_();
  Tensor y = pool(x);
  CHECK(y.dtype() == dt);
  CHECK(y.is_contiguous(fmt));
  Tensor r = randn(y.shape(), DType::f64, &g).to(dt);
  sum(mul(y.to(DType::f64), r.to(DType::f64))).backward();
  CHECK(x.grad().is_contiguous(fmt));
  Result out{f64(y), f64(x.grad()), {}, {}, {}, {}};
  cpu::set_dnnl_enabled(true);
  return out;
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
    const Result ref = run_bn(c.x, c.affine, DType::f64, MemoryFormat::Contiguous, false);
    for (MemoryFormat fmt : kFormats) {
      if (fmt == MemoryFormat::ChannelsLast && c.x.size() != 4) continue;
      for (DType dt : {DType::f32, DType::bf16}) {
        INFO("x " << shape_str(c.x) << " " << dtype_name(dt) << " " << name(fmt));
        const Result got = run_bn(c.x, c.affine, dt, fmt, true);
        // f32: summation order (measured worst 1.4e-7 of the largest value); bf16: 8-bit
        // mantissas in and out (measured worst 5.1e-3 on these shapes), statistics in f32.
        const double tol = dt == DType::f32 ? 1e-6 : 1.5e-2;
        CHECK(rel(got.y, ref.y) < tol);
        CHECK(rel(got.gx, ref.gx) < tol);
        if (c.affine) {
          CHECK(rel(got.gw, ref.gw) < tol);
          CHECK(rel(got.gb, ref.gb) < tol);
        }
        // Running statistics are f32 whatever the input: only the input's rounding differs.
        // (measured worst: f32 1.0e-7, bf16 3.5e-4)
        const double stol = dt == DType::f32 ? 1e-6 : 2e-3;
        CHECK(rel(got.rm, ref.rm) < stol);
        CHECK(rel(got.rv, ref.rv) < stol);
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
  };
  const Case cases[] = {
      {"max 3x3/2 pad 1 (ResNet stem)",
       [](const Tensor& x) { return max_pool2d(x, 3, 2, 1); },
       {2, 5, 13, 12},
       true},
      {"max 2x2/2", [](const Tensor& x) { return max_pool2d(x, 2, 2); }, {2, 4, 9, 8}, true},
      {"max 3x3/2 ceil",
       [](const Tensor& x) { return max_pool2d(x, 3, 2, 0, 1, true); },
       {1, 3, 10, 10},
       true},
      {"max 3x2/(1,2)",
       [](const Tensor& x) {
         return max_pool2d(x, {3, 2}, Int2{1, 2});
       },
       {2, 3, 7, 9},
       false},
      {"avg 3x3/2 pad 1",
       [](const Tensor& x) { return avg_pool2d(x, 3, 2, 1); },
       {2, 6, 11, 11},
       false},
      {"avg 3x3/2 pad 1 exclude pad",
       [](const Tensor& x) { return avg_pool2d(x, 3, 2, 1, false, false); },
       {2, 6, 11, 11},
       false},
      {"avg 3x3/2 ceil (own kernel: windows past the padding)",
       [](const Tensor& x) { return avg_pool2d(x, 3, 2, 1, true); },
       {1, 4, 10, 10},
       false},
      {"adaptive 7 -> 1 (ResNet head)",
       [](const Tensor& x) { return adaptive_avg_pool2d(x, 1); },
       {2, 16, 7, 7},
       false},
      {"adaptive 6 -> 3",
       [](const Tensor& x) { return adaptive_avg_pool2d(x, 3); },
       {2, 4, 6, 6},
       false},
      {"adaptive 7 -> 3 (own kernel: overlapping windows)",
       [](const Tensor& x) { return adaptive_avg_pool2d(x, 3); },
       {2, 4, 7, 7},
       false},
  };
  for (const Case& c : cases) {
    for (MemoryFormat fmt : kFormats) {
      for (DType dt : {DType::f32, DType::bf16}) {
        INFO(c.what << " x " << shape_str(c.x) << " " << dtype_name(dt) << " " << name(fmt));
        const Result got = run_pool(c.f, c.x, c.ties, dt, fmt, true);
        // Ties: the own kernel in the same dtype must pick the same winner (exact).
        const Result same = run_pool(c.f, c.x, c.ties, dt, MemoryFormat::Contiguous, false);
        const Result ref = run_pool(c.f, c.x, c.ties, DType::f64, MemoryFormat::Contiguous, false);
        // Against the own kernel in the same dtype: max pooling moves values and averages sum
        // few terms in float (measured: identical). Against f64: the input's and output's
        // rounding (measured worst: f32 8.4e-8, bf16 4.6e-3 of the largest value).
        CHECK(rel(got.y, same.y) < 1e-6);
        CHECK(rel(got.gx, same.gx) < 1e-6);
        const double tol = dt == DType::f32 ? 1e-6 : 1.5e-2;
        CHECK(rel(got.y, ref.y) < tol);
        if (!c.ties) CHECK(rel(got.gx, ref.gx) < tol);
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
