// Reductions and shape ops: values, keepdim, gradients (f64 finite differences), errors.
#include <catch2/catch.hpp>

#include "gradcheck.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::leaf;
using V = std::vector<Tensor>;

TEST_CASE("reduction values", "[ops][reduction]") {
  Tensor x = arange(24, DType::f64).reshape({2, 3, 4});
  REQUIRE(sum(x).item() == 276.0);
  REQUIRE(sum(x, {1}).shape() == Shape{2, 4});
  REQUIRE(sum(x, {1}).to_vector<double>()[0] == 0 + 4 + 8);
  REQUIRE(sum(x, {0, 2}, true).shape() == Shape{1, 3, 1});
  REQUIRE(sum(x, {0, 2}).to_vector<double>() == std::vector<double>{60, 92, 124});
  REQUIRE(sum(x, {-1}).to_vector<double>()[5] == 20 + 21 + 22 + 23);
  REQUIRE(mean(x).item() == 11.5);
  REQUIRE(mean(x, {2}).to_vector<double>()[0] == 1.5);
  REQUIRE(var(x, {2}).to_vector<double>()[0] == Approx(5.0 / 3.0));
  REQUIRE(var(x, {2}, 0).to_vector<double>()[0] == Approx(1.25));
  REQUIRE(stddev(x, {2}).to_vector<double>()[0] == Approx(std::sqrt(5.0 / 3.0)));
  auto [v, i] = max(x, 1);
  REQUIRE(v.to_vector<double>()[0] == 8.0);
  REQUIRE(i.dtype() == DType::i64);
  REQUIRE(i.to_vector<int64_t>()[0] == 2);
  auto [mv, mi] = min(x, 2, true);
  REQUIRE(mv.shape() == Shape{2, 3, 1});
  REQUIRE(mi.to_vector<int64_t>()[0] == 0);
  REQUIRE(argmax(tensor({1, 7, 7, 2}), 0).item() == 1);  // first of ties
  REQUIRE(argmin(tensor({3, 1, 2}), 0).item() == 1);
  REQUIRE(max(x).item() == 23.0);
  REQUIRE(sum(ones({5}, DType::i32)).dtype() == DType::i64);
  REQUIRE(sum(gt(x, 10.0)).item() == 13.0);
  // Long single-row sums split across threads stay exact.
  REQUIRE(sum(ones({1 << 20})).item() == double(1 << 20));
  REQUIRE(sum(x.permute({2, 0, 1}), {0}).to_vector<double>() == sum(x, {2}).to_vector<double>());
  REQUIRE(sum_to(ones({4, 2, 3}), {2, 1}).to_vector<float>() == std::vector<float>{12, 12});
}

TEST_CASE("reduction gradients", "[ops][reduction][grad]") {
  auto x = leaf({3, 4, 5}, 11);
  gradcheck([](const V& v) { return sum(v[0]); }, {x});
  gradcheck([](const V& v) { return sum(v[0], {0, 2}); }, {x});
  gradcheck([](const V& v) { return sum(v[0], {1}, true); }, {x});
  gradcheck([](const V& v) { return mean(v[0], {-1}); }, {x});
  gradcheck([](const V& v) { return mean(v[0]); }, {x});
  gradcheck([](const V& v) { return var(v[0], {1}); }, {x});
  gradcheck([](const V& v) { return var(v[0], {0, 2}, 0, true); }, {x});
  gradcheck([](const V& v) { return stddev(v[0], {2}); }, {x});
  gradcheck([](const V& v) { return max(v[0], 1).first; }, {x});
  gradcheck([](const V& v) { return min(v[0], 2, true).first; }, {x});
  gradcheck([](const V& v) { return max(v[0]); }, {x});
  gradcheck([](const V& v) { return min(v[0]); }, {x});
  Tensor nc = randn({5, 4}, DType::f64).t();
  nc.requires_grad_();
  gradcheck([](const V& v) { return sum(v[0], {1}); }, {nc});
  gradcheck([](const V& v) { return max(v[0], 0).first; }, {nc});
}

TEST_CASE("shape op values", "[ops][shape]") {
  Tensor a = arange(6).reshape({2, 3}), b = arange(6, 10).reshape({2, 2});
  Tensor c = cat({a, b}, 1);
  REQUIRE(c.shape() == Shape{2, 5});
  REQUIRE(c.to_vector<float>() == std::vector<float>{0, 1, 2, 6, 7, 3, 4, 5, 8, 9});
  Tensor s = stack({a, a}, 1);
  REQUIRE(s.shape() == Shape{2, 2, 3});
  auto parts = split(arange(10), 4);
  REQUIRE(parts.size() == 3);
  REQUIRE(parts[2].shape() == Shape{2});
  auto sp = split(arange(10), std::vector<int64_t>{3, 7});
  REQUIRE(sp[1].to_vector<float>()[0] == 3.f);
  REQUIRE(chunk(arange(10), 3).size() == 3);
  REQUIRE(chunk(arange(10), 3)[0].shape() == Shape{4});
  REQUIRE_THROWS_WITH(cat({a, arange(3)}, 0), Contains("cat"));
  REQUIRE_THROWS_WITH(split(arange(10), std::vector<int64_t>{3, 3}), Contains("split"));
  REQUIRE_THROWS_WITH(stack({a, b}), Contains("stack"));
}

TEST_CASE("shape op and view gradients", "[ops][shape][grad]") {
  auto a = leaf({2, 3}, 21), b = leaf({2, 2}, 22), x = leaf({2, 3, 4}, 23);
  gradcheck([](const V& v) { return cat({v[0], v[1]}, 1); }, {a, b});
  gradcheck([](const V& v) { return stack({v[0], mul(v[0], v[0])}, 0); }, {a});
  gradcheck([](const V& v) { return mul(split(v[0], 1, 1)[2], 2.0); }, {a});
  gradcheck([](const V& v) { return chunk(v[0], 2, 2)[1]; }, {x});
  gradcheck([](const V& v) { return v[0].view({6, 4}); }, {x});
  gradcheck([](const V& v) { return v[0].reshape({4, -1}); }, {x});
  gradcheck([](const V& v) { return v[0].permute({2, 0, 1}).reshape({-1}); }, {x});
  gradcheck([](const V& v) { return v[0].transpose(0, 2); }, {x});
  gradcheck([](const V& v) { return v[0].narrow(1, 1, 2); }, {x});
  gradcheck([](const V& v) { return v[0].slice(2, 0, 4, 2); }, {x});
  gradcheck([](const V& v) { return v[0].select(2, -1); }, {x});
  gradcheck([](const V& v) { return v[0].unsqueeze(1).expand({2, 5, 3}); }, {a});
  gradcheck([](const V& v) { return v[0].unsqueeze(0).squeeze(0).flatten(); }, {x});
  gradcheck([](const V& v) { return v[0].contiguous(MemoryFormat::ChannelsLast); },
            {leaf({2, 3, 2, 2}, 5)});
  gradcheck([](const V& v) { return v[0].to(DType::f32).to(DType::f64); }, {a}, 1e-3, 1e-4, 1e-3);
  gradcheck([](const V& v) { return v[0].clone(); }, {a});
}
