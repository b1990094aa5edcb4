// Reductions on CUDA against the CPU: sum/mean/var/stddev over every kind of dim set (inner,
// outer, middle, several, all, keepdim), max/min/argmax/argmin with first-extreme indices and
// NaN, sum_to for bias-gradient shapes (NCHW and channels-last), sizes that take the split
// (two-pass) paths, and the gradients of all of them. f32/f64 with tight bounds (the GPU
// accumulates f32 in float, the CPU in double), f16/bf16 against the CPU's f32 result on the
// same half-rounded inputs, integers and bool exactly.
// GPU-only: without a GPU, tests/cuda/main.cpp skips every test (exit code 4).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "tests/cuda/cuda_test_util.hpp"

using namespace dltrain;
using namespace dltrain::test;
using Catch::Contains;

namespace {

// Bounds for a sum of about n terms of magnitude ~1 in dt.
struct Tol {
  double rtol, atol;
};
Tol sum_tol(DType dt, int64_t n) {
  const double s = std::sqrt(static_cast<double>(std::max<int64_t>(n, 1)));
  switch (dt) {
    case DType::f64:
      return {1e-12, 1e-12 * s};
    case DType::f32:
      return {1e-5, 2e-6 * s};
    case DType::f16:
      return {1e-2, 2e-3 * s};
    case DType::bf16:
      return {2e-2, 1e-2 * s};
    default:
      return {0, 0};
  }
}

// Random values: floats are N(0, 1) rounded to dt, integers uniform in [-50, 50) ([0, 2) bool).
Tensor input(const Shape& shape, DType dt) {
  if (dt == DType::b8) return randint(0, 2, shape, DType::i64).to(dt);
  if (dt == DType::u8) return randint(0, 200, shape, DType::i64).to(dt);
  if (!is_floating(dt)) return randint(-50, 50, shape, DType::i64).to(dt);
  return randn(shape, DType::f32).to(dt);
}

// sum over dims of x (CPU) and of x on CUDA, compared; the CUDA tensor is given as a view
// (transposed, sliced, channels-last) of a device copy when `dev` is defined.
void check_sum(const Tensor& x, const Tensor& dev, const Shape& dims, bool keepdim,
               const std::string& what) {
  const DType dt = x.dtype();
  INFO(what << " " << dt_str(dt) << " dims " << shape_str(dims) << " keepdim " << keepdim);
  const Tensor want = sum(x.to(ref_dtype(dt)), dims, keepdim);
  const Tensor got = sum(dev, dims, keepdim);
  REQUIRE(got.device() == kCuda);
  REQUIRE(got.dtype() == (is_floating(dt) ? dt : DType::i64));
  REQUIRE(got.shape() == want.shape());
  const int64_t n = want.numel() == 0 ? 0 : x.numel() / std::max<int64_t>(want.numel(), 1);
  const Tol t = sum_tol(dt, n);
  check_close(got, want, t.rtol, t.atol, what);
}

const std::vector<Shape> kDimSets = {{},        {0},       {1},         {2},    {3},
                                     {-1},      {0, 2},    {1, 3},      {0, 3}, {-1, -2},
                                     {0, 1, 2}, {1, 2, 3}, {0, 1, 2, 3}};

}  // namespace

TEST_CASE("cuda sum over every kind of dim set, dtype and layout", "[cuda][gpu][reduction]") {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32,
                   DType::u8, DType::b8}) {
    const Tensor x = input({6, 7, 8, 9}, dt);
    const Tensor xd = x.to(kCuda);
    for (const Shape& dims : kDimSets)
      for (bool keepdim : {false, true}) check_sum(x, xd, dims, keepdim, "contiguous");
    // Non-contiguous views of the same data.
    for (const Shape& dims : {Shape{}, Shape{0}, Shape{3}, Shape{1, 2}}) {
      check_sum(x.transpose(1, 3), xd.transpose(1, 3), dims, false, "transposed");
      check_sum(x.slice(2, 1, 8, 3), xd.slice(2, 1, 8, 3), dims, true, "sliced");
      check_sum(x.permute({3, 0, 2, 1}), xd.permute({3, 0, 2, 1}), dims, false, "permuted");
    }
    // Channels-last: reducing C, the spatial dims, N, or N and the spatial dims.
    const Tensor cl = x.contiguous(MemoryFormat::ChannelsLast);
    const Tensor cld = cl.to(kCuda);
    REQUIRE(cld.is_contiguous(MemoryFormat::ChannelsLast));
    for (const Shape& dims : {Shape{1}, Shape{2, 3}, Shape{0}, Shape{0, 2, 3}, Shape{}})
      check_sum(cl, cld, dims, true, "channels-last");
  }
  // sum of a scalar and of expanded (stride 0) inputs.
  const Tensor s = scalar_tensor(2.5);
  check_sum(s, s.to(kCuda), {}, false, "0-d");
  const Tensor e = randn({1, 5});
  for (const Shape& dims : {Shape{0}, Shape{1}, Shape{}})
    check_sum(e.expand({7, 5}), e.to(kCuda).expand({7, 5}), dims, false, "expanded (stride 0)");
}

TEST_CASE("cuda sums large enough to split the reduced range", "[cuda][gpu][reduction]") {
  struct Case {
    Shape shape;
    Shape dims;
    MemoryFormat fmt;
  };
  const std::vector<Case> cases = {
      {{3, 200003}, {1}, MemoryFormat::Contiguous},             // few long rows
      {{1 << 20}, {}, MemoryFormat::Contiguous},                // everything (loss mean)
      {{200003, 5}, {0}, MemoryFormat::Contiguous},             // few long columns
      {{65536, 64}, {0}, MemoryFormat::Contiguous},             // linear bias gradient
      {{16, 64, 28, 28}, {0, 2, 3}, MemoryFormat::Contiguous},  // NCHW conv bias gradient
      {{16, 64, 28, 28}, {0, 2, 3}, MemoryFormat::ChannelsLast},
      {{16, 64, 28, 28}, {2, 3}, MemoryFormat::Contiguous},  // global average pooling
      {{16, 64, 28, 28}, {2, 3}, MemoryFormat::ChannelsLast},
      {{2, 3000, 700}, {0, 2}, MemoryFormat::Contiguous},  // outer and inner reduced
  };
  for (const Case& c : cases) {
    for (DType dt : {DType::f32, DType::f16, DType::i32}) {
      const Tensor x = input(c.shape, dt).contiguous(c.fmt);
      const Tensor xd = x.to(kCuda);
      check_sum(x, xd, c.dims, false, "large " + shape_str(c.shape));
      // Deterministic: the same reduction twice gives the same bits.
      REQUIRE(sum(xd, c.dims).to_vector<double>() == sum(xd, c.dims).to_vector<double>());
    }
  }
}

TEST_CASE("cuda sum of empty tensors and sum errors", "[cuda][gpu][reduction]") {
  const Tensor e = zeros({3, 0, 2}, kCuda);
  check_close(sum(e, {1}), zeros({3, 2}), 0, 0, "empty reduced dim");
  check_close(sum(e), zeros({}), 0, 0, "empty everything");
  REQUIRE(sum(e, {0}).shape() == Shape{0, 2});
  REQUIRE_THROWS_WITH(sum(ones({2, 3}, kCuda), {1, 1}), Contains("sum") && Contains("more than"));
  REQUIRE_THROWS_WITH(sum(ones({2, 3}, kCuda), {2}), Contains("sum"));
  REQUIRE_THROWS_WITH(max(zeros({0}, kCuda)), Contains("max") && Contains("empty"));
}

TEST_CASE("cuda mean, var and stddev", "[cuda][gpu][reduction]") {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    const Tensor x = input({5, 6, 7, 8}, dt);
    const Tensor xd = x.to(kCuda), xr = x.to(ref_dtype(dt));
    const double rtol = dt == DType::f64 ? 1e-12 : (dt == DType::f32 ? 1e-5 : 4e-2);
    const double atol = dt == DType::f64 ? 1e-12 : (dt == DType::f32 ? 1e-5 : 2e-2);
    INFO(dt_str(dt));
    check_close(mean(xd), mean(xr), rtol, atol, "mean all");
    for (const Shape& dims : {Shape{0}, Shape{3}, Shape{1, 2}, Shape{0, 2, 3}}) {
      for (bool keepdim : {false, true}) {
        INFO(shape_str(dims) << " keepdim " << keepdim);
        check_close(mean(xd, dims, keepdim), mean(xr, dims, keepdim), rtol, atol, "mean");
        for (int64_t correction : {0, 1}) {
          check_close(var(xd, dims, correction, keepdim), var(xr, dims, correction, keepdim), rtol,
                      atol, "var");
          check_close(stddev(xd, dims, correction, keepdim), stddev(xr, dims, correction, keepdim),
                      rtol, atol, "stddev");
        }
      }
    }
  }
  // Integer mean computes in f32.
  const Tensor i = input({4, 9}, DType::i64);
  REQUIRE(mean(i.to(kCuda), {1}).dtype() == DType::f32);
  check_close(mean(i.to(kCuda), {1}), mean(i, {1}), 1e-6, 1e-6, "integer mean");
}

TEST_CASE("cuda max/min/argmax/argmin pick the first extreme and NaN like the CPU",
          "[cuda][gpu][reduction]") {
  for (DType dt :
       {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8}) {
    INFO(dt_str(dt));
    // Few distinct values: many ties, so "first extreme" matters.
    const Tensor x = randint(0, 4, {5, 7, 9}, DType::i64).to(dt);
    const Tensor xd = x.to(kCuda);
    for (int64_t dim : {0, 1, 2, -1}) {
      for (bool keepdim : {false, true}) {
        INFO("dim " << dim << " keepdim " << keepdim);
        for (bool is_max : {true, false}) {
          auto [v, i] = is_max ? max(x, dim, keepdim) : min(x, dim, keepdim);
          auto [vd, id] = is_max ? max(xd, dim, keepdim) : min(xd, dim, keepdim);
          REQUIRE(vd.dtype() == dt);
          REQUIRE(id.dtype() == DType::i64);
          check_close(vd, v, 0, 0, "values");
          check_close(id, i, 0, 0, "indices");
        }
        check_close(argmax(xd, dim, keepdim), argmax(x, dim, keepdim), 0, 0, "argmax");
        check_close(argmin(xd, dim, keepdim), argmin(x, dim, keepdim), 0, 0, "argmin");
        // Non-contiguous input.
        check_close(argmax(xd.transpose(0, 2), dim, keepdim),
                    argmax(x.transpose(0, 2), dim, keepdim), 0, 0, "argmax transposed");
        check_close(max(xd.slice(1, 1, 7, 2), dim, keepdim).second,
                    max(x.slice(1, 1, 7, 2), dim, keepdim).second, 0, 0, "max sliced");
      }
    }
    check_close(max(xd), max(x), 0, 0, "max all");
    check_close(min(xd), min(x), 0, 0, "min all");
  }
  // NaN wins, the first one.
  Tensor x = randn({6, 10});
  {
    NoGradGuard g;
    x.select(0, 1).narrow(0, 3, 1).fill_(NAN);
    x.select(0, 1).narrow(0, 7, 1).fill_(NAN);
    x.select(0, 4).narrow(0, 0, 1).fill_(NAN);
    x.select(1, 2).narrow(0, 5, 1).fill_(NAN);
  }
  const Tensor xd = x.to(kCuda);
  for (int64_t dim : {0, 1}) {
    check_close(argmax(xd, dim), argmax(x, dim), 0, 0, "argmax NaN");
    check_close(argmin(xd, dim), argmin(x, dim), 0, 0, "argmin NaN");
    check_close(max(xd, dim).first, max(x, dim).first, 0, 0, "max NaN values");
  }
  REQUIRE(std::isnan(max(xd).item<double>()));
  // Long rows and columns (split paths) with a planted extreme and ties.
  Tensor big = randn({3, 300001});
  {
    NoGradGuard g;
    big.select(0, 1).narrow(0, 123457, 1).fill_(100.0);
    big.select(0, 1).narrow(0, 250000, 1).fill_(100.0);
  }
  const Tensor bigd = big.to(kCuda);
  check_close(argmax(bigd, 1), argmax(big, 1), 0, 0, "argmax long rows");
  check_close(argmin(bigd, 1), argmin(big, 1), 0, 0, "argmin long rows");
  check_close(argmax(bigd.t().contiguous(), 0), argmax(big.t().contiguous(), 0), 0, 0,
              "argmax long columns");
  check_close(max(bigd), max(big), 0, 0, "max of everything");
}

TEST_CASE("cuda sum_to for bias and broadcast gradients", "[cuda][gpu][reduction]") {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    for (MemoryFormat fmt : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      const Tensor g = input({8, 16, 10, 12}, dt).contiguous(fmt);
      const Tensor gd = g.to(kCuda);
      for (const Shape& to :
           {Shape{1, 16, 1, 1}, Shape{16, 1, 1}, Shape{1, 1, 1, 12}, Shape{8, 1, 10, 1},
            Shape{1, 1, 1, 1}, Shape{}, Shape{8, 16, 10, 12}}) {
        INFO(dt_str(dt) << " to " << shape_str(to));
        const Tensor got = sum_to(gd, to), want = sum_to(g.to(ref_dtype(dt)), to);
        REQUIRE(got.shape() == to);
        const Tol t = sum_tol(dt, g.numel() / std::max<int64_t>(shape_numel(to), 1));
        check_close(got, want, t.rtol, t.atol, "sum_to");
      }
    }
  }
  const Tensor lin = input({128, 10}, DType::f32);
  check_close(sum_to(lin.to(kCuda), {10}), sum_to(lin, {10}), 1e-5, 1e-4, "linear bias");
}

TEST_CASE("cuda reduction gradients", "[cuda][gpu][reduction][grad]") {
  for (DType dt : {DType::f32, DType::f64, DType::f16}) {
    INFO(dt_str(dt));
    const double tol = dt == DType::f64 ? 1e-12 : (dt == DType::f32 ? 1e-5 : 2e-2);
    const Tensor x0 = input({4, 5, 6}, dt);
    using F = std::function<Tensor(const Tensor&)>;
    const std::vector<std::pair<std::string, F>> fs = {
        {"sum", [](const Tensor& x) { return sum(x); }},
        {"sum dims",
         [](const Tensor& x) {
           return sum(x, {0, 2});
         }},
        {"mean keepdim", [](const Tensor& x) { return mean(x, {1}, true); }},
        {"var", [](const Tensor& x) { return var(x, {2}); }},
        {"stddev",
         [](const Tensor& x) {
           return stddev(x, {0, 1}, 0, true);
         }},
        {"max dim", [](const Tensor& x) { return max(x, 1).first; }},
        {"min dim keepdim", [](const Tensor& x) { return min(x, 2, true).first; }},
        {"max transposed", [](const Tensor& x) { return max(x.transpose(0, 2), 0).first; }},
        {"max all", [](const Tensor& x) { return max(x); }},
        {"min all", [](const Tensor& x) { return min(x); }},
        {"sum_to",
         [](const Tensor& x) {
           return sum_to(x, {5, 1});
         }},
    };
    for (const auto& [name, f] : fs) {
      INFO(name);
      Tensor x = leaf(x0, ref_dtype(dt), Device::cpu()), xd = leaf(x0, dt, kCuda);
      const Tensor y = f(x), yd = f(xd);
      const Tensor wy = input(y.shape(), dt);
      sum(mul(y, wy.to(ref_dtype(dt)))).backward();
      sum(mul(yd, wy.to(kCuda))).backward();
      REQUIRE(xd.grad().dtype() == dt);
      check_close(xd.grad(), x.grad(), tol, tol, name + " grad");
    }
    // Ties in max/min of everything split the gradient.
    Tensor t = leaf(tensor({1, 3, 3, 2, 3}), dt, Device::cpu()), td = leaf(t, dt, kCuda);
    max(t).backward();
    max(td).backward();
    check_close(td.grad(), t.grad(), tol, tol, "max ties grad");
  }
}
