// Matrix products: mm, bmm, matmul (1-d, 2-d, broadcast batch dims), linear.
// Forward values against a naive triple loop, f16/bf16 against f32, layouts
// (transposed / strided views), finite-difference gradients in f64, errors.
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

// Naive [n,k] x [k,m] on row-major values.
std::vector<double> naive_mm(const std::vector<double>& a, const std::vector<double>& b, int64_t n,
                             int64_t k, int64_t m) {
  std::vector<double> c(static_cast<size_t>(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += a[i * k + p] * b[p * m + j];
      c[i * m + j] = s;
    }
  return c;
}

void require_close(const Tensor& t, const std::vector<double>& ref, double tol) {
  const std::vector<double> v = t.to_vector<double>();
  REQUIRE(v.size() == ref.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::abs(v[i] - ref[i]) > tol * (1.0 + std::abs(ref[i]))) {
      FAIL("element " << i << ": got " << v[i] << " expected " << ref[i]);
    }
  }
}

}  // namespace

TEST_CASE("mm values in f32 and f64, contiguous and transposed", "[ops][linalg]") {
  set_num_threads(2);
  for (DType dt : {DType::f32, DType::f64}) {
    const double tol = dt == DType::f32 ? 1e-4 : 1e-12;
    for (auto [n, k, m] : {std::array<int64_t, 3>{3, 4, 5}, {1, 7, 1}, {37, 129, 65}}) {
      Tensor a = rnd({n, k}, 1, dt), b = rnd({k, m}, 2, dt);
      const auto ref = naive_mm(a.to_vector<double>(), b.to_vector<double>(), n, k, m);
      Tensor c = mm(a, b);
      REQUIRE(c.shape() == Shape{n, m});
      REQUIRE(c.dtype() == dt);
      require_close(c, ref, tol);
      // Same product through transposed (column-major) views.
      Tensor a_cm = a.t().contiguous().t(), b_cm = b.t().contiguous().t();
      if (n > 1) REQUIRE_FALSE(a_cm.is_contiguous());
      require_close(mm(a_cm, b_cm), ref, tol);
      require_close(mm(a, b_cm), ref, tol);
      require_close(mm(a_cm, b), ref, tol);
    }
  }
}

TEST_CASE("mm on strided views that need a copy, and empty inner dim", "[ops][linalg]") {
  Tensor big = rnd({8, 12}, 3);
  Tensor a = big.slice(0, 0, 8, 2).slice(1, 0, 12, 3);  // [4, 4], both strides > 1
  Tensor b = rnd({4, 3}, 4);
  require_close(mm(a, b), naive_mm(a.to_vector<double>(), b.to_vector<double>(), 4, 4, 3), 1e-12);
  Tensor z = mm(zeros({3, 0}, DType::f64), zeros({0, 2}, DType::f64));
  REQUIRE(z.shape() == Shape{3, 2});
  REQUIRE(z.to_vector<double>() == std::vector<double>(6, 0.0));
}

TEST_CASE("mm in f16 and bf16 computes in float", "[ops][linalg]") {
  Tensor a = rnd({6, 10}, 5, DType::f32), b = rnd({10, 4}, 6, DType::f32);
  const auto ref = mm(a, b).to_vector<double>();
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor c = mm(a.to(dt), b.to(dt));
    REQUIRE(c.dtype() == dt);
    require_close(c, ref, dt == DType::f16 ? 2e-2 : 8e-2);
  }
}

TEST_CASE("bmm and matmul values with broadcasting", "[ops][linalg]") {
  set_num_threads(2);
  Tensor a = rnd({3, 4, 5}, 7), b = rnd({3, 5, 2}, 8);
  Tensor c = bmm(a, b);
  REQUIRE(c.shape() == Shape{3, 4, 2});
  for (int64_t i = 0; i < 3; ++i)
    require_close(
        c.select(0, i),
        naive_mm(a.select(0, i).to_vector<double>(), b.select(0, i).to_vector<double>(), 4, 5, 2),
        1e-12);
  // [2,1,4,5] x [3,5,2] -> [2,3,4,2]
  Tensor x = rnd({2, 1, 4, 5}, 9), y = rnd({3, 5, 2}, 10);
  Tensor z = matmul(x, y);
  REQUIRE(z.shape() == Shape{2, 3, 4, 2});
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      require_close(z.select(0, i).select(0, j),
                    naive_mm(x.select(0, i).select(0, 0).to_vector<double>(),
                             y.select(0, j).to_vector<double>(), 4, 5, 2),
                    1e-12);
  // 1-d cases
  Tensor v = rnd({5}, 11), w = rnd({5}, 12);
  double dot = 0;
  for (int64_t i = 0; i < 5; ++i) dot += v.to_vector<double>()[i] * w.to_vector<double>()[i];
  REQUIRE(matmul(v, w).dim() == 0);
  REQUIRE(matmul(v, w).item() == Approx(dot));
  Tensor m = rnd({5, 3}, 13);
  REQUIRE(matmul(v, m).shape() == Shape{3});
  require_close(matmul(v, m), naive_mm(v.to_vector<double>(), m.to_vector<double>(), 1, 5, 3),
                1e-12);
  REQUIRE(matmul(m.t(), v).shape() == Shape{3});
  REQUIRE(matmul(a, w).shape() == Shape{3, 4});
  REQUIRE(matmul(v, b).shape() == Shape{3, 2});
  REQUIRE(matmul(rnd({2, 3, 4, 5}, 14), rnd({5, 6}, 15)).shape() == Shape{2, 3, 4, 6});
}

TEST_CASE("linear values", "[ops][linalg]") {
  Tensor x = rnd({2, 3, 4}, 16), w = rnd({5, 4}, 17), b = rnd({5}, 18);
  Tensor y = linear(x, w, b);
  REQUIRE(y.shape() == Shape{2, 3, 5});
  auto ref = naive_mm(x.reshape({6, 4}).to_vector<double>(), w.t().contiguous().to_vector<double>(),
                      6, 4, 5);
  const auto bv = b.to_vector<double>();
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += bv[i % 5];
  require_close(y, ref, 1e-12);
  REQUIRE(linear(x, w).shape() == Shape{2, 3, 5});
}

TEST_CASE("mm, bmm, matmul, linear gradients", "[ops][linalg][grad]") {
  gradcheck([](const V& v) { return mm(v[0], v[1]); }, {leaf({3, 4}, 1), leaf({4, 2}, 2)});
  // Non-contiguous leaves.
  Tensor at = randn({4, 3}, DType::f64).transpose(0, 1);
  at.requires_grad_();
  Tensor bt = randn({2, 4}, DType::f64).transpose(0, 1);
  bt.requires_grad_();
  gradcheck([](const V& v) { return mm(v[0], v[1]); }, {at, bt});
  gradcheck([](const V& v) { return bmm(v[0], v[1]); }, {leaf({2, 3, 4}, 3), leaf({2, 4, 2}, 4)});
  // Broadcast batch dims: the gradient of y sums over the broadcast dim.
  gradcheck([](const V& v) { return matmul(v[0], v[1]); },
            {leaf({2, 1, 3, 4}, 5), leaf({3, 4, 2}, 6)});
  gradcheck([](const V& v) { return matmul(v[0], v[1]); }, {leaf({2, 3, 4}, 7), leaf({4, 2}, 8)});
  gradcheck([](const V& v) { return matmul(v[0], v[1]); }, {leaf({4}, 9), leaf({2, 4, 3}, 10)});
  gradcheck([](const V& v) { return matmul(v[0], v[1]); }, {leaf({4}, 11), leaf({4}, 12)});
  gradcheck([](const V& v) { return matmul(v[0], v[1]); }, {leaf({3, 4}, 13), leaf({4}, 14)});
  gradcheck([](const V& v) { return linear(v[0], v[1], v[2]); },
            {leaf({2, 3, 4}, 15), leaf({5, 4}, 16), leaf({5}, 17)});
  gradcheck([](const V& v) { return linear(v[0], v[1]); }, {leaf({3, 4}, 18), leaf({5, 4}, 19)});
}

TEST_CASE("linalg errors name the op and the shapes", "[ops][linalg][errors]") {
  Tensor a = zeros({2, 3}), b = zeros({4, 5});
  REQUIRE_THROWS_AS(mm(a, b), dltrain::Error);
  REQUIRE_THROWS_WITH(mm(a, b), Contains("mm") && Contains("[2, 3]") && Contains("[4, 5]"));
  REQUIRE_THROWS_WITH(mm(zeros({2, 3, 4}), b), Contains("mm"));
  REQUIRE_THROWS_WITH(mm(a, zeros({3, 2}, DType::f64)), Contains("mm") && Contains("dtype"));
  REQUIRE_THROWS_WITH(bmm(zeros({2, 3, 4}), zeros({3, 4, 5})), Contains("bmm"));
  REQUIRE_THROWS_WITH(matmul(zeros({2, 3}), zeros({4, 2})), Contains("matmul"));
  REQUIRE_THROWS_WITH(matmul(zeros({2, 2, 3}), zeros({3, 3, 2})), Contains("matmul"));
  REQUIRE_THROWS_WITH(linear(zeros({2, 3}), zeros({4, 5})), Contains("linear"));
  REQUIRE_THROWS_WITH(linear(zeros({2, 5}), zeros({4, 5}), zeros({3})), Contains("linear"));
  REQUIRE_THROWS_AS(mm(ones({2, 2}, DType::i64), ones({2, 2}, DType::i64)), dltrain::Error);
}
