// Normalisation ops: batch_norm (training, eval, running-stat update, channels-last) and
// layer_norm against naive references, f64 finite-difference gradients, errors.
#include <catch2/catch.hpp>

#include <cmath>

#include "gradcheck.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::leaf;
using V = std::vector<Tensor>;

namespace {

// Naive batch norm over [N, C, S] (row-major values); returns y and fills batch mean / biased var.
std::vector<double> naive_bn(const std::vector<double>& x, int64_t N, int64_t C, int64_t S,
                             const std::vector<double>& w, const std::vector<double>& b,
                             std::vector<double>& mean, std::vector<double>& var, bool use_given,
                             double eps) {
  if (!use_given) {
    mean.assign(C, 0.0);
    var.assign(C, 0.0);
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t n = 0; n < N; ++n)
        for (int64_t s = 0; s < S; ++s) mean[c] += x[(n * C + c) * S + s];
      mean[c] /= double(N * S);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t s = 0; s < S; ++s) {
          const double d = x[(n * C + c) * S + s] - mean[c];
          var[c] += d * d;
        }
      var[c] /= double(N * S);
    }
  }
  std::vector<double> y(x.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t i = (n * C + c) * S + s;
        y[i] = (x[i] - mean[c]) / std::sqrt(var[c] + eps) * w[c] + b[c];
      }
  return y;
}

void require_close(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == Approx(b[i]).margin(tol));
}

}  // namespace

TEST_CASE("batch_norm training forward and running statistics", "[ops][norm]") {
  Generator g(7);
  Tensor x = mul(randn({2, 3, 4, 5}, DType::f64, &g), 2.0);
  x = add(x, 1.5);
  Tensor w = tensor({0.5, 1.0, 2.0}, DType::f64), b = tensor({0.1, -0.2, 0.3}, DType::f64);
  Tensor rm = tensor({0.5, -1.0, 0.0}, DType::f64), rv = tensor({1.0, 2.0, 0.5}, DType::f64);
  Tensor y = batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5);
  std::vector<double> mean, var;
  const std::vector<double> ref = naive_bn(x.to_vector<double>(), 2, 3, 20, w.to_vector<double>(),
                                           b.to_vector<double>(), mean, var, false, 1e-5);
  require_close(y.to_vector<double>(), ref, 1e-10);
  // running = 0.9 * running + 0.1 * batch stat, with the unbiased batch variance.
  const std::vector<double> rm0{0.5, -1.0, 0.0}, rv0{1.0, 2.0, 0.5};
  const std::vector<double> rmv = rm.to_vector<double>(), rvv = rv.to_vector<double>();
  const double M = 40.0;
  for (int c = 0; c < 3; ++c) {
    REQUIRE(rmv[c] == Approx(0.9 * rm0[c] + 0.1 * mean[c]).epsilon(1e-12));
    REQUIRE(rvv[c] == Approx(0.9 * rv0[c] + 0.1 * var[c] * M / (M - 1)).epsilon(1e-12));
  }
  // f32 running stats are updated too, and f32 matches f64.
  Tensor rm32 = zeros({3}), rv32 = ones({3});
  Tensor y32 = batch_norm(x.to(DType::f32), w.to(DType::f32), b.to(DType::f32), rm32, rv32, true);
  require_close(y32.to_vector<double>(), ref, 1e-4);
  REQUIRE(rm32.to_vector<double>()[1] == Approx(0.1 * mean[1]).margin(1e-6));
  // No affine, no running stats.
  Tensor y2 = batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
  std::vector<double> ones3(3, 1.0), zeros3(3, 0.0);
  require_close(y2.to_vector<double>(),
                naive_bn(x.to_vector<double>(), 2, 3, 20, ones3, zeros3, mean, var, false, 1e-5),
                1e-10);
}

TEST_CASE("batch_norm eval uses running statistics", "[ops][norm]") {
  Tensor x = leaf({3, 2, 4}, 11);
  Tensor w = tensor({1.5, -0.5}, DType::f64), b = tensor({0.0, 1.0}, DType::f64);
  Tensor rm = tensor({0.2, -0.3}, DType::f64), rv = tensor({0.8, 1.7}, DType::f64);
  Tensor y = batch_norm(x, w, b, rm, rv, false);
  std::vector<double> mean = rm.to_vector<double>(), var = rv.to_vector<double>();
  require_close(y.to_vector<double>(),
                naive_bn(x.to_vector<double>(), 3, 2, 4, w.to_vector<double>(),
                         b.to_vector<double>(), mean, var, true, 1e-5),
                1e-12);
  REQUIRE(rm.to_vector<double>() == std::vector<double>{0.2, -0.3});  // untouched in eval
  gradcheck([&](const V& v) { return batch_norm(v[0], v[1], v[2], rm, rv, false); },
            {x, leaf({2}, 12), leaf({2}, 13)});
}

TEST_CASE("batch_norm channels-last keeps the layout and matches NCHW", "[ops][norm]") {
  Generator g(3);
  Tensor x = randn({2, 3, 4, 5}, DType::f64, &g);
  Tensor xcl = x.contiguous(MemoryFormat::ChannelsLast);
  REQUIRE(xcl.is_contiguous(MemoryFormat::ChannelsLast));
  Tensor w = tensor({0.5, 1.0, 2.0}, DType::f64), b = tensor({0.1, -0.2, 0.3}, DType::f64);
  Tensor rm1 = zeros({3}, DType::f64), rv1 = ones({3}, DType::f64);
  Tensor rm2 = zeros({3}, DType::f64), rv2 = ones({3}, DType::f64);
  Tensor y1 = batch_norm(x, w, b, rm1, rv1, true);
  Tensor y2 = batch_norm(xcl, w, b, rm2, rv2, true);
  REQUIRE(y2.is_contiguous(MemoryFormat::ChannelsLast));
  REQUIRE(!y2.is_contiguous());
  REQUIRE(y1.is_contiguous());
  require_close(y2.to_vector<double>(), y1.to_vector<double>(), 1e-12);
  require_close(rv2.to_vector<double>(), rv1.to_vector<double>(), 1e-12);
  // f32 channels-last
  Tensor y3 =
      batch_norm(xcl.to(DType::f32), w.to(DType::f32), b.to(DType::f32), Tensor(), Tensor(), true);
  REQUIRE(y3.is_contiguous(MemoryFormat::ChannelsLast));
  require_close(y3.to_vector<double>(), y1.to_vector<double>(), 1e-4);
}

TEST_CASE("batch_norm gradients", "[ops][norm][grad]") {
  auto w = leaf({3}, 2), b = leaf({3}, 3);
  auto bn = [](const V& v) { return batch_norm(v[0], v[1], v[2], Tensor(), Tensor(), true); };
  gradcheck(bn, {leaf({2, 3, 4, 5}, 1), w, b});
  gradcheck(bn, {leaf({5, 3}, 4), w, b});     // [N, C]
  gradcheck(bn, {leaf({2, 3, 6}, 5), w, b});  // [N, C, L]
  // Channels-last input.
  Tensor x = randn({2, 3, 4, 5}, DType::f64).contiguous(MemoryFormat::ChannelsLast);
  x.requires_grad_();
  gradcheck(bn, {x, w, b});
  REQUIRE(x.grad().is_contiguous(MemoryFormat::ChannelsLast));
  // Non-contiguous (permuted) input, no affine.
  Tensor base = leaf({4, 3, 2}, 6);
  gradcheck(
      [](const V& v) {
        return batch_norm(v[0].permute({0, 2, 1}), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      {base});
  // With running stats being updated during the check (they do not affect the output).
  Tensor rm = zeros({3}, DType::f64), rv = ones({3}, DType::f64);
  gradcheck([&](const V& v) { return batch_norm(v[0], v[1], v[2], rm, rv, true, 0.2); },
            {leaf({3, 3, 2}, 7), w, b});
}

TEST_CASE("batch_norm 16-bit inputs compute in float", "[ops][norm]") {
  Generator g(5);
  Tensor x = randn({4, 2, 3, 3}, DType::f32, &g);
  Tensor ref = batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor y = batch_norm(x.to(dt), Tensor(), Tensor(), Tensor(), Tensor(), true);
    REQUIRE(y.dtype() == dt);
    require_close(y.to_vector<double>(), ref.to_vector<double>(), 0.06);
  }
}

TEST_CASE("batch_norm errors", "[ops][norm][errors]") {
  Tensor x = randn({2, 3, 4});
  REQUIRE_THROWS_WITH(batch_norm(randn({3}), Tensor(), Tensor(), Tensor(), Tensor(), true),
                      Contains("batch_norm") && Contains("[3]"));
  REQUIRE_THROWS_WITH(batch_norm(x, ones({4}), Tensor(), Tensor(), Tensor(), true),
                      Contains("batch_norm") && Contains("weight") && Contains("[4]"));
  REQUIRE_THROWS_WITH(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false),
                      Contains("batch_norm") && Contains("running_mean"));
  REQUIRE_THROWS_WITH(batch_norm(randn({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true),
                      Contains("batch_norm") && Contains("more than 1 value"));
  REQUIRE_THROWS_WITH(
      batch_norm(ones({2, 3}, DType::i64), Tensor(), Tensor(), Tensor(), Tensor(), true),
      Contains("batch_norm"));
}

TEST_CASE("layer_norm forward", "[ops][norm]") {
  Generator g(9);
  Tensor x = randn({3, 4, 5}, DType::f64, &g);
  Tensor w = randn({4, 5}, DType::f64, &g), b = randn({4, 5}, DType::f64, &g);
  Tensor y = layer_norm(x, {4, 5}, w, b, 1e-5);
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> ref(xv.size());
  for (int r = 0; r < 3; ++r) {
    double m = 0, v = 0;
    for (int j = 0; j < 20; ++j) m += xv[r * 20 + j];
    m /= 20;
    for (int j = 0; j < 20; ++j) v += (xv[r * 20 + j] - m) * (xv[r * 20 + j] - m);
    v /= 20;
    for (int j = 0; j < 20; ++j)
      ref[r * 20 + j] = (xv[r * 20 + j] - m) / std::sqrt(v + 1e-5) * wv[j] + bv[j];
  }
  require_close(y.to_vector<double>(), ref, 1e-10);
  Tensor y32 = layer_norm(x.to(DType::f32), {5});
  REQUIRE(y32.dtype() == DType::f32);
  Tensor y64 = layer_norm(x, {5});
  require_close(y32.to_vector<double>(), y64.to_vector<double>(), 1e-5);
  Tensor yh = layer_norm(x.to(DType::bf16), {5});
  require_close(yh.to_vector<double>(), y64.to_vector<double>(), 0.05);
}

TEST_CASE("layer_norm gradients", "[ops][norm][grad]") {
  gradcheck(
      [](const V& v) {
        return layer_norm(v[0], {4, 5}, v[1], v[2]);
      },
      {leaf({3, 4, 5}, 1), leaf({4, 5}, 2), leaf({4, 5}, 3)});
  gradcheck([](const V& v) { return layer_norm(v[0], {6}); }, {leaf({2, 6}, 4)});
  // Non-contiguous input: a transposed leaf.
  gradcheck([](const V& v) { return layer_norm(v[0].t(), {3}, v[1], Tensor()); },
            {leaf({3, 4}, 5), leaf({3}, 6)});
}

TEST_CASE("layer_norm errors", "[ops][norm][errors]") {
  REQUIRE_THROWS_WITH(layer_norm(randn({2, 3}), {4}), Contains("layer_norm") && Contains("[4]"));
  REQUIRE_THROWS_WITH(layer_norm(randn({2, 3}), {3}, ones({2})),
                      Contains("layer_norm") && Contains("weight"));
  REQUIRE_THROWS_WITH(layer_norm(randn({2, 3}), {}), Contains("layer_norm"));
}
