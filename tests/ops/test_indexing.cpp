// Indexing ops: embedding, index_select, gather, scatter_add, segment_sum/mean, one_hot.
// Values against naive loops, repeated indices, f64 gradients, out-of-range and dtype errors.
#include <catch2/catch.hpp>

#include "gradcheck.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::leaf;
using V = std::vector<Tensor>;

namespace {
Tensor idx(const std::vector<int64_t>& v, const Shape& s = {}) {
  return from_vector<int64_t>(v, s.empty() ? Shape{static_cast<int64_t>(v.size())} : s);
}
}  // namespace

TEST_CASE("embedding values, padding_idx and gradient", "[ops][indexing]") {
  Tensor w = arange(12.0, DType::f64).reshape({4, 3});
  Tensor i = idx({3, 0, 3, 2}, {2, 2});
  Tensor e = embedding(w, i);
  REQUIRE(e.shape() == Shape{2, 2, 3});
  REQUIRE(e.to_vector<double>() == std::vector<double>{9, 10, 11, 0, 1, 2, 9, 10, 11, 6, 7, 8});
  REQUIRE(embedding(w, i.to(DType::i32)).to_vector<double>() == e.to_vector<double>());

  auto lw = leaf({4, 3}, 1);
  gradcheck([&](const V& v) { return embedding(v[0], i); }, {lw});
  // padding_idx rows get no gradient; repeated rows accumulate.
  lw.set_grad(Tensor());
  Tensor out = embedding(lw, i, 3);
  sum(out).backward();
  const auto g = lw.grad().to_vector<double>();
  REQUIRE(g == std::vector<double>{1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0});
  lw.set_grad(Tensor());
  sum(embedding(lw, i, -1)).backward();  // -1 wraps to row 3
  REQUIRE(lw.grad().to_vector<double>()[9] == 0.0);
  lw.set_grad(Tensor());
  sum(embedding(lw, i)).backward();
  REQUIRE(lw.grad().to_vector<double>()[9] == 2.0);
}

TEST_CASE("index_select", "[ops][indexing]") {
  Tensor x = arange(24.0, DType::f64).reshape({2, 3, 4});
  Tensor s = index_select(x, 1, idx({2, 0, 2}));
  REQUIRE(s.shape() == Shape{2, 3, 4});
  const auto xv = x.to_vector<double>(), sv = s.to_vector<double>();
  const int64_t pick[3] = {2, 0, 2};
  for (int a = 0; a < 2; ++a)
    for (int k = 0; k < 3; ++k)
      for (int c = 0; c < 4; ++c) REQUIRE(sv[(a * 3 + k) * 4 + c] == xv[(a * 3 + pick[k]) * 4 + c]);
  REQUIRE(index_select(x, -1, idx({3})).shape() == Shape{2, 3, 1});
  auto lx = leaf({3, 4}, 2);
  gradcheck([](const V& v) { return index_select(v[0], 0, idx({2, 2, 0, 1})); }, {lx});
  gradcheck([](const V& v) { return index_select(v[0].t(), 1, idx({0, 0, 2})); }, {lx});
}

TEST_CASE("gather and scatter_add", "[ops][indexing]") {
  Tensor x = arange(12.0, DType::f64).reshape({3, 4});
  Tensor i = idx({3, 0, 1, 1, 2, 0}, {3, 2});
  Tensor g = gather(x, 1, i);
  REQUIRE(g.to_vector<double>() == std::vector<double>{3, 0, 5, 5, 10, 8});
  Tensor g0 = gather(x, 0, idx({2, 0, 1, 1}, {1, 4}));
  REQUIRE(g0.to_vector<double>() == std::vector<double>{8, 1, 6, 7});

  // scatter_add with repeated indices accumulates.
  Tensor base = ones({2, 4}, DType::f64);
  Tensor src = tensor({1, 2, 3, 4, 5, 6}, DType::f64).reshape({2, 3});
  Tensor si = idx({0, 0, 3, 1, 1, 1}, {2, 3});
  Tensor r = scatter_add(base, 1, si, src);
  REQUIRE(r.to_vector<double>() == std::vector<double>{4, 1, 1, 4, 1, 16, 1, 1});
  REQUIRE(base.to_vector<double>() == std::vector<double>(8, 1.0));  // input untouched
  // dim 0, index smaller than src.
  Tensor r0 = scatter_add(zeros({3, 2}, DType::f64), 0, idx({2, 2}, {1, 2}), src);
  REQUIRE(r0.to_vector<double>() == std::vector<double>{0, 0, 0, 0, 1, 2});

  auto lx = leaf({3, 4}, 3);
  gradcheck([&](const V& v) { return gather(v[0], 1, i); }, {lx});
  gradcheck([&](const V& v) { return gather(v[0].t(), 0, idx({2, 0, 1, 1, 2, 2}, {2, 3})); }, {lx});
  auto lb = leaf({2, 4}, 4), ls = leaf({2, 3}, 5);
  gradcheck([&](const V& v) { return scatter_add(v[0], 1, si, v[1]); }, {lb, ls});
  gradcheck(
      [&](const V& v) {
        return scatter_add(v[0], 0, idx({1, 1}, {1, 2}), v[1]);
      },
      {leaf({3, 2}, 6), leaf({2, 3}, 7)});
}

TEST_CASE("segment_sum and segment_mean", "[ops][indexing]") {
  Tensor src = tensor({1, 2, 3, 4, 5, 6, 7, 8}, DType::f64).reshape({4, 2});
  Tensor ids = idx({2, 0, 2, 2});
  Tensor s = segment_sum(src, ids, 4);
  REQUIRE(s.shape() == Shape{4, 2});
  REQUIRE(s.to_vector<double>() == std::vector<double>{3, 4, 0, 0, 13, 16, 0, 0});
  Tensor m = segment_mean(src, ids, 4);
  REQUIRE(m.to_vector<double>() == std::vector<double>{3, 4, 0, 0, 13.0 / 3, 16.0 / 3, 0, 0});
  REQUIRE(segment_sum(tensor({1, 2, 3}, DType::f64), idx({1, 1, 0}), 2).to_vector<double>() ==
          std::vector<double>{3, 3});
  REQUIRE(segment_sum(src, ids.to(DType::i32), 3).shape() == Shape{3, 2});

  auto ls = leaf({4, 2}, 1);
  gradcheck([&](const V& v) { return segment_sum(v[0], ids, 4); }, {ls});
  gradcheck([&](const V& v) { return segment_mean(v[0], ids, 3); }, {ls});
  gradcheck([&](const V& v) { return segment_sum(v[0].t(), idx({0, 1}), 2); }, {ls});
}

TEST_CASE("one_hot", "[ops][indexing]") {
  Tensor o = one_hot(idx({2, 0, 1}));
  REQUIRE(o.dtype() == DType::i64);
  REQUIRE(o.shape() == Shape{3, 3});
  REQUIRE(o.to_vector<int64_t>() == std::vector<int64_t>{0, 0, 1, 1, 0, 0, 0, 1, 0});
  REQUIRE(one_hot(idx({1, 0}, {2, 1}), 4).shape() == Shape{2, 1, 4});
  REQUIRE_THROWS_WITH(one_hot(idx({1, 5}), 4),
                      Contains("one_hot") && Contains("5") && Contains("[0, 4)"));
  REQUIRE_THROWS_WITH(one_hot(idx({-1})), Contains("one_hot") && Contains("-1"));
  REQUIRE_THROWS_WITH(one_hot(tensor({1.0})), Contains("one_hot") && Contains("int64"));
}

TEST_CASE("indexing errors", "[ops][indexing][errors]") {
  Tensor w = randn({4, 3});
  REQUIRE_THROWS_WITH(embedding(w, idx({1, 4})),
                      Contains("embedding") && Contains("4") && Contains("[0, 4)"));
  REQUIRE_THROWS_WITH(embedding(w, idx({-1})), Contains("embedding") && Contains("-1"));
  REQUIRE_THROWS_WITH(embedding(w, tensor({1.0})), Contains("embedding") && Contains("int64"));
  REQUIRE_THROWS_WITH(embedding(w, idx({1}), 7), Contains("embedding") && Contains("padding_idx"));
  REQUIRE_THROWS_WITH(embedding(randn({4}), idx({1})), Contains("embedding") && Contains("[4]"));
  REQUIRE_THROWS_WITH(index_select(w, 1, idx({3})),
                      Contains("index_select") && Contains("3") && Contains("[0, 3)"));
  REQUIRE_THROWS_WITH(index_select(w, 2, idx({0})), Contains("index_select"));
  REQUIRE_THROWS_WITH(index_select(w, 0, idx({0, 1}, {1, 2})),
                      Contains("index_select") && Contains("1-d"));
  REQUIRE_THROWS_WITH(gather(w, 1, idx({0, 3}, {1, 2})), Contains("gather") && Contains("3"));
  REQUIRE_THROWS_WITH(gather(w, 1, idx({0, 1})), Contains("gather") && Contains("dimensions"));
  REQUIRE_THROWS_WITH(gather(w, 1, idx({0, 0, 0, 0, 0}, {5, 1})),
                      Contains("gather") && Contains("[5, 1]"));
  REQUIRE_THROWS_WITH(scatter_add(w, 0, idx({4}, {1, 1}), ones({1, 1})),
                      Contains("scatter_add") && Contains("4") && Contains("[0, 4)"));
  REQUIRE_THROWS_WITH(scatter_add(w, 0, idx({0}, {1, 1}), ones({1, 1}, DType::f64)),
                      Contains("scatter_add") && Contains("float64"));
  REQUIRE_THROWS_WITH(scatter_add(w, 0, idx({0, 1}, {1, 2}), ones({1, 1})),
                      Contains("scatter_add"));
  REQUIRE_THROWS_WITH(segment_sum(w, idx({0, 1, 2, 5}), 3),
                      Contains("segment_sum") && Contains("5") && Contains("[0, 3)"));
  REQUIRE_THROWS_WITH(segment_sum(w, idx({0, 1}), 3), Contains("segment_sum") && Contains("[2]"));
  REQUIRE_THROWS_WITH(segment_sum(w, tensor({0, 1, 2, 0}), 3),
                      Contains("segment_sum") && Contains("int64"));
  REQUIRE_THROWS_WITH(segment_mean(w, idx({0, 1, 2, 3}), 3),
                      Contains("segment_sum") && Contains("3"));
}
