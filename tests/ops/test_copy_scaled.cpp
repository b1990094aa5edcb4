// copy_scaled_(dst, src, scale) on the CPU: dst = src x scale converted to dst's dtype in one
// pass, equal bit for bit to the two passes it replaces (mul by scale in src's dtype, then
// copy_), for every pair of floating dtypes and strided, broadcast and empty operands; and its
// errors. (Not differentiable, like the other in-place updates: no gradcheck.) The CUDA kernel
// is checked against this in tests/cuda/test_copy_scaled_cuda.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using Catch::Contains;

namespace {

// Bit patterns, so that -0.0, NaN and rounding differences all count.
std::vector<int64_t> bits(const Tensor& t) {
  const Tensor c = t.contiguous();
  const int64_t n = c.numel();
  std::vector<int64_t> out(static_cast<size_t>(n));
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  const size_t w = c.element_size();
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = 0;
    for (size_t b = 0; b < w; ++b) v |= static_cast<int64_t>(p[i * w + b]) << (8 * b);
    out[static_cast<size_t>(i)] = v;
  }
  return out;
}

}  // namespace

TEST_CASE("copy_scaled_ equals mul then copy_, bit for bit, for every floating pair") {
  const DType dts[] = {DType::f32, DType::f64, DType::f16, DType::bf16};
  manual_seed(5);
  // Values spanning the 16-bit ranges, a few exact cases and a NaN.
  std::vector<double> v = mul(randn({63}), 300.0).to(DType::f64).to_vector<double>();
  v[0] = 65504.0 * 2;  // f16's largest x 2: finite after x 0.5
  v[1] = -0.0;
  v[2] = std::numeric_limits<double>::quiet_NaN();
  v[3] = 1e-30;
  const Tensor base = from_vector(v).reshape({7, 9});
  for (double scale : {0.5, 1.0 / 3, 1.0 / 8, 3.0}) {
    for (DType sdt : dts) {
      for (DType ddt : dts) {
        INFO("src " << sdt << " -> dst " << ddt << ", scale " << scale);
        const Tensor src = base.to(sdt);
        Tensor dst = empty({7, 9}, ddt);
        copy_scaled_(dst, src, scale);
        Tensor ref = empty({7, 9}, ddt);
        ref.copy_(mul(src, scale));
        CHECK(bits(dst) == bits(ref));
        // A transposed source into a transposed destination.
        Tensor dst_t = empty({9, 7}, ddt);
        copy_scaled_(dst_t, src.t(), scale);
        CHECK(bits(dst_t) == bits(ref.t()));
        Tensor dst_nt = empty({7, 9}, ddt).t().contiguous().t();  // column-major dst
        copy_scaled_(dst_nt, src, scale);
        CHECK(bits(dst_nt.contiguous()) == bits(ref));
      }
    }
  }
  // Scaling before the cast is what keeps an f16 result finite.
  Tensor big = full({3}, 100000.0);
  Tensor h = empty({3}, DType::f16);
  copy_scaled_(h, big, 0.5);
  for (double x : h.to(DType::f64).to_vector<double>()) CHECK(std::abs(x - 50000.0) <= 16.0);
}

TEST_CASE("copy_scaled_ broadcasts, accepts empty tensors, and returns dst") {
  Tensor row = arange(4, DType::f32);
  Tensor dst = empty({3, 4}, DType::bf16);
  Tensor& r = copy_scaled_(dst, row, 2.0);
  CHECK(&r == &dst);
  CHECK(dst.to(DType::f64).to_vector<double>() ==
        std::vector<double>{0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6});
  Tensor e = empty({0, 4}, DType::f16);
  CHECK_NOTHROW(copy_scaled_(e, empty({0, 4}), 0.25));
  // f64 stays exact: src x scale in double.
  Tensor d = empty({2}, DType::f64);
  copy_scaled_(d, from_vector(std::vector<double>{1.0 / 3, 7.0}), 0.1);
  CHECK(d.to_vector<double>() == std::vector<double>{1.0 / 3 * 0.1, 7.0 * 0.1});
}

TEST_CASE("copy_scaled_ rejects what it cannot do, naming the problem") {
  Tensor f = zeros({4});
  Tensor i = zeros({4}, DType::i32);
  CHECK_THROWS_WITH(copy_scaled_(i, f, 0.5), Contains("floating") && Contains("int32"));
  CHECK_THROWS_WITH(copy_scaled_(f, i, 0.5), Contains("floating"));
  Tensor wrong = zeros({3});
  CHECK_THROWS_WITH(copy_scaled_(wrong, f, 0.5), Contains("cannot be broadcast"));
  CHECK_THROWS_WITH(copy_scaled_(f, zeros({2, 4}), 0.5),
                    Contains("source shape [2, 4] does not broadcast to destination shape [4]"));
  Tensor leaf = zeros({4}).requires_grad_();
  CHECK_THROWS_WITH(copy_scaled_(leaf, f, 0.5), Contains("NoGradGuard"));
  {
    NoGradGuard g;
    CHECK_NOTHROW(copy_scaled_(leaf, f, 0.5));
  }
  Tensor undef;
  CHECK_THROWS_WITH(copy_scaled_(f, undef, 0.5), Contains("undefined"));
}
