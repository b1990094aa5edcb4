// rand_like / randn_like: the draw of rand / randn for the same generator state, with the
// tensor's shape, dtype and memory format; the generator advances as for rand / randn; the
// shared Philox definition (src/core/philox.hpp) still gives the Random123 known-answer
// vector; errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using Catch::Contains;

TEST_CASE("rand_like and randn_like draw like rand and randn", "[core][random]") {
  const Tensor t = zeros({2, 3, 4, 5}, TensorOptions(DType::f64));
  for (bool normal : {false, true}) {
    INFO((normal ? "randn_like" : "rand_like"));
    Generator a(11), b(11);
    Tensor want = normal ? randn(t.shape(), TensorOptions(DType::f64), &a)
                         : rand(t.shape(), TensorOptions(DType::f64), &a);
    Tensor got = normal ? randn_like(t, &b) : rand_like(t, &b);
    CHECK(got.shape() == t.shape());
    CHECK(got.dtype() == DType::f64);
    CHECK(got.to_vector<double>() == want.to_vector<double>());
    CHECK(a.offset() == b.offset());
    CHECK(a.offset() == static_cast<uint64_t>((t.numel() + 1) / 2));
  }
  // Memory format and dtype follow the tensor; values follow the logical order.
  const Tensor cl =
      zeros({2, 3, 4, 5}, TensorOptions(DType::f32)).contiguous(MemoryFormat::ChannelsLast);
  Generator a(3), b(3);
  Tensor r = randn_like(cl, &a);
  CHECK(r.dtype() == DType::f32);
  CHECK(r.is_contiguous(MemoryFormat::ChannelsLast));
  CHECK(r.contiguous().to_vector<float>() ==
        randn({2, 3, 4, 5}, TensorOptions(), &b).to_vector<float>());
  Tensor h = rand_like(zeros({100}, TensorOptions(DType::bf16)));
  CHECK(h.dtype() == DType::bf16);
  CHECK(min(h).item<double>() >= 0.0);
  CHECK(max(h).item<double>() <= 1.0);
}

TEST_CASE("Philox-4x32-10 known-answer vector", "[core][random]") {
  // Random123's kat_vectors: philox4x32_10 with counter (0, 0, 0, 0) and key (0, 0).
  CHECK(philox4x32(0, 0, 0) ==
        std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
}

TEST_CASE("rand_like errors", "[core][random][errors]") {
  CHECK_THROWS_WITH(rand_like(zeros({3}, TensorOptions(DType::i64))),
                    Contains("dtype must be floating"));
  CHECK_THROWS_WITH(randn_like(Tensor()), Contains("undefined"));
}

TEST_CASE("bernoulli draws 0/1 with the given probabilities", "[core][random]") {
  Generator g(7);
  const Tensor p = full({4, 5000}, 0.0, TensorOptions(DType::f64));
  Tensor probs = p.clone();
  // Rows with probabilities 0, 0.2, 0.7 and 1.
  const std::vector<double> rows{0.0, 0.2, 0.7, 1.0};
  for (int64_t r = 0; r < 4; ++r) probs.select(0, r).fill_(rows[static_cast<size_t>(r)]);
  const Tensor b = bernoulli(probs, &g);
  CHECK(b.dtype() == DType::f64);
  const Tensor m = mean(b, {1});
  const std::vector<double> mv = m.to_vector<double>();
  CHECK(mv[0] == 0.0);
  CHECK(std::abs(mv[1] - 0.2) < 0.02);
  CHECK(std::abs(mv[2] - 0.7) < 0.02);
  CHECK(mv[3] == 1.0);
  for (double v : b.to_vector<double>()) CHECK((v == 0.0 || v == 1.0));
  // Same generator state, same draw; scalar p with a tensor's shape.
  Generator a1(9), a2(9);
  CHECK(bernoulli(probs, &a1).to_vector<double>() == bernoulli(probs, &a2).to_vector<double>());
  const Tensor s = bernoulli(zeros({3, 4}, TensorOptions(DType::f32)), 0.5);
  CHECK(s.shape() == Shape{3, 4});
  CHECK(s.dtype() == DType::f32);
  CHECK_THROWS_WITH(bernoulli(probs, 1.5), Contains("p must be in [0, 1]"));
  CHECK_THROWS_WITH(bernoulli(zeros({2}, TensorOptions(DType::i64))), Contains("floating"));
}

TEST_CASE("multinomial draws categories by weight", "[core][random]") {
  Generator g(13);
  const Tensor p = from_vector(std::vector<double>{1, 2, 3, 4, 0});  // unnormalised, one zero
  const Tensor s = multinomial(p, 20000, true, &g);
  CHECK(s.shape() == Shape{20000});
  CHECK(s.dtype() == DType::i64);
  std::vector<int64_t> counts(5, 0);
  for (int64_t v : s.to_vector<int64_t>()) {
    REQUIRE((v >= 0 && v < 5));
    ++counts[static_cast<size_t>(v)];
  }
  CHECK(counts[4] == 0);
  for (int k = 0; k < 4; ++k) CHECK(std::abs(counts[k] / 20000.0 - (k + 1) / 10.0) < 0.015);
  // Without replacement: distinct indices per row, never a zero-weight category; n == number
  // of non-zero categories gives a permutation of them.
  const Tensor rows = from_vector(std::vector<float>{1, 0, 2, 3, 5, 1, 1, 0}, {2, 4});
  const Tensor w = multinomial(rows, 3, false, &g);
  CHECK(w.shape() == Shape{2, 3});
  const std::vector<int64_t> wv = w.to_vector<int64_t>();
  std::vector<int64_t> r0(wv.begin(), wv.begin() + 3), r1(wv.begin() + 3, wv.end());
  std::sort(r0.begin(), r0.end());
  std::sort(r1.begin(), r1.end());
  CHECK(r0 == std::vector<int64_t>{0, 2, 3});
  CHECK(r1 == std::vector<int64_t>{0, 1, 2});
  // The same generator state draws the same indices.
  Generator a(5), b(5);
  CHECK(multinomial(rows, 2, false, &a).to_vector<int64_t>() ==
        multinomial(rows, 2, false, &b).to_vector<int64_t>());
  CHECK(a.offset() == b.offset());
  CHECK_THROWS_WITH(multinomial(p, 6), Contains("cannot draw 6 samples without replacement"));
  CHECK_THROWS_WITH(multinomial(p, 5), Contains("only 4 non-zero categories"));
  CHECK_THROWS_WITH(multinomial(from_vector(std::vector<double>{1, -1}), 1),
                    Contains("must be finite and non-negative"));
  CHECK_THROWS_WITH(multinomial(zeros({2, 3}, TensorOptions(DType::f64)), 1, true),
                    Contains("sums to zero"));
  CHECK_THROWS_WITH(multinomial(zeros({2}, TensorOptions(DType::i64)), 1),
                    Contains("must be a floating"));
}
