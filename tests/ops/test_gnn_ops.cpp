// The second batch of issue-14 ops (the ones GNNs and research losses need): scatter_reduce,
// index_add, segment_max, segment_softmax, logsumexp, cumsum, prod, norm, sort, argsort, topk,
// any, all, nonzero, repeat, flip, roll, tril, triu. PyTorch's values and gradients
// (gnn_ops_reference.txt) in f64 and f32, f64 finite-difference gradients, 16-bit scatters
// accumulating in f32, and the errors bad arguments raise.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "gradcheck.hpp"
#include "reference_file.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::leaf;
using V = std::vector<Tensor>;
using Fn = std::function<Tensor(const V&)>;

namespace {

const char* const kRef = DLTRAIN_REFERENCE_DIR "/gnn_ops_reference.txt";
Tensor R(const std::string& name) { return dltrain::testing::reference_tensor(kRef, name); }
Tensor Ri(const std::string& name) { return R(name).to(DType::i64); }

// Element-wise |a - b| <= tol * (1 + |b|), NaN matching NaN, same shape.
bool close(const Tensor& a, const Tensor& b, double tol) {
  if (a.shape() != b.shape()) return false;
  const auto x = a.to(DType::f64).to_vector<double>(), y = b.to(DType::f64).to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) && std::isnan(y[i])) continue;
    if (x[i] == y[i]) continue;
    if (!(std::abs(x[i] - y[i]) <= tol * (1 + std::abs(y[i])))) return false;
  }
  return true;
}

// f on the golden inputs `names` of record `p` (those in `index` as int64, the others in dt as
// leaves); checks the output and every floating input's gradient against PyTorch.
void check_ref(const std::string& p, const Fn& f, const std::vector<std::string>& names,
               const std::vector<std::string>& index = {}) {
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(p << " in " << dt);
    const double tol = dt == DType::f64 ? 1e-12 : 2e-5;
    V in;
    std::vector<bool> is_idx;
    for (const std::string& n : names) {
      const bool ix = std::find(index.begin(), index.end(), n) != index.end();
      Tensor t = ix ? Ri(p + "." + n) : R(p + "." + n).to(dt).clone();
      if (!ix) t.requires_grad_();
      in.push_back(t);
      is_idx.push_back(ix);
    }
    Tensor y = f(in);
    CHECK(y.dtype() == dt);
    CHECK(close(y, R(p + ".y"), tol));
    y.backward(R(p + ".gy").to(dt));
    for (size_t i = 0; i < names.size(); ++i) {
      if (is_idx[i]) continue;
      INFO("gradient of " << names[i]);
      REQUIRE(in[i].grad().defined());
      CHECK(close(in[i].grad(), R(p + ".g" + names[i]), tol));
    }
  }
}

const std::vector<std::pair<std::string, ScatterReduce>> kReduces{{"sum", ScatterReduce::Sum},
                                                                  {"mean", ScatterReduce::Mean},
                                                                  {"amax", ScatterReduce::Amax},
                                                                  {"amin", ScatterReduce::Amin}};

Tensor idx(const std::vector<int64_t>& v, const Shape& s = {}) {
  return from_vector(v, s.empty() ? Shape{static_cast<int64_t>(v.size())} : s);
}

}  // namespace

TEST_CASE("scatter_reduce matches PyTorch", "[ops][gnn][scatter]") {
  for (const char* data : {"rand", "ties"})
    for (const auto& [name, r] : kReduces)
      for (bool inc : {true, false}) {
        const std::string p =
            std::string("scatter_reduce_") + data + "_" + name + "_" + (inc ? "self" : "noself");
        check_ref(p,
                  [r = r, inc](const V& v) { return scatter_reduce(v[0], 0, v[2], v[1], r, inc); },
                  {"x", "src", "index"}, {"index"});
      }
  for (const auto& [name, r] : kReduces)
    check_ref("scatter_reduce_dim1_" + name,
              [r = r](const V& v) { return scatter_reduce(v[0], 1, v[2], v[1], r, false); },
              {"x", "src", "index"}, {"index"});
}

TEST_CASE("scatter_reduce gradients", "[ops][gnn][scatter][grad]") {
  // src larger than index in both dims (its extra elements get no gradient); row 3 of x
  // receives nothing.
  const Tensor index = idx({0, 1, 2, 0, 4, 1, 2, 2, 0, 4}, {5, 2});
  for (const auto& [name, r] : kReduces)
    for (bool inc : {true, false}) {
      INFO(name << " include_self " << inc);
      gradcheck([&, r = r](const V& v) { return scatter_reduce(v[0], 0, index, v[1], r, inc); },
                {leaf({5, 3}, 1), leaf({6, 3}, 2)});
    }
}

TEST_CASE("scatter_reduce and index_add accumulate 16-bit floats in f32", "[ops][gnn][scatter]") {
  // 4096 ones into one element: f16 additions would stop at 2048 (2048 + 1 rounds to 2048).
  const Tensor ids = zeros({4096}, DType::i64);
  for (DType dt : {DType::f16, DType::bf16}) {
    INFO(dt);
    const Tensor src = ones({4096}, dt);
    Tensor s = scatter_reduce(zeros({2}, dt), 0, ids, src, ScatterReduce::Sum);
    CHECK(s.dtype() == dt);
    CHECK(s.to(DType::f32).to_vector<float>() == std::vector<float>{4096.f, 0.f});
    CHECK(index_add(zeros({2}, dt), 0, ids, src).to(DType::f32).to_vector<float>() ==
          std::vector<float>{4096.f, 0.f});
    Tensor m = scatter_reduce(zeros({2}, dt), 0, ids, src, ScatterReduce::Mean, false);
    CHECK(m.to(DType::f32).to_vector<float>() == std::vector<float>{1.f, 0.f});
  }
  // 16-bit against f32 on the same rounded inputs.
  const Tensor x = dltrain::testing::rnd({6, 4}, 3, DType::f32);
  const Tensor src = dltrain::testing::rnd({9, 4}, 4, DType::f32);
  const Tensor index = idx({1, 4, 4, 1, 4, 1, 1, 1, 4, 4, 1, 4, 1, 4, 4, 4, 1, 1,
                            4, 1, 4, 4, 1, 1, 1, 4, 4, 1, 1, 1, 4, 1, 4, 4, 1, 4},
                           {9, 4});
  for (const auto& [name, r] : kReduces)
    for (DType dt : {DType::f16, DType::bf16}) {
      INFO(name << " " << dt);
      const Tensor got = scatter_reduce(x.to(dt), 0, index, src.to(dt), r, false);
      const Tensor want =
          scatter_reduce(x.to(dt).to(DType::f32), 0, index, src.to(dt).to(DType::f32), r, false);
      CHECK(close(got, want.to(dt), 0));
    }
}

TEST_CASE("scatter_reduce, index_add and segment ops reject bad arguments", "[ops][gnn][errors]") {
  const Tensor x = zeros({3, 2}), src = ones({4, 2});
  REQUIRE_THROWS_WITH(
      scatter_reduce(x, 0, idx({0, 1, 3, 0, 0, 0, 0, 0}, {4, 2}), src, ScatterReduce::Amax),
      Contains("scatter_reduce") && Contains("index 3") && Contains("[0, 3)"));
  REQUIRE_THROWS_WITH(scatter_reduce(x, 0, zeros({4, 2}), src, ScatterReduce::Sum),
                      Contains("scatter_reduce") && Contains("int64"));
  REQUIRE_THROWS_WITH(
      scatter_reduce(x, 0, zeros({4, 2}, DType::i64), src.to(DType::f64), ScatterReduce::Sum),
      Contains("src has dtype") && Contains(".to("));
  REQUIRE_THROWS_WITH(scatter_reduce(x.to(DType::i64), 0, zeros({4, 2}, DType::i64),
                                     src.to(DType::i64), ScatterReduce::Sum),
                      Contains("floating-point"));
  REQUIRE_THROWS_WITH(
      scatter_reduce(x, 0, zeros({4, 3}, DType::i64), ones({4, 3}), ScatterReduce::Sum),
      Contains("larger than the input"));
  REQUIRE_THROWS_WITH(
      scatter_reduce(x, 0, zeros({4, 2}, DType::i64), ones({3, 2}), ScatterReduce::Sum),
      Contains("larger than src"));
  REQUIRE_THROWS_WITH(index_add(x, 0, idx({0, 5, 1, 1}), src),
                      Contains("index_add") && Contains("index 5") && Contains("[0, 3)"));
  REQUIRE_THROWS_WITH(index_add(x, 0, idx({0, 1}), src),
                      Contains("index_add") && Contains("src must have shape [2, 2]"));
  REQUIRE_THROWS_WITH(index_add(x, 0, idx({0, 1, 2, 0}), src.to(DType::f64)),
                      Contains("src has dtype"));
  REQUIRE_THROWS_WITH(segment_max(src, idx({0, 1, 7, 0}), 3),
                      Contains("segment_max") && Contains("index 7") && Contains("num_segments"));
  REQUIRE_THROWS_WITH(segment_max(src, idx({0, 1, 2}), 3), Contains("segment_ids must be [4]"));
  REQUIRE_THROWS_WITH(segment_softmax(src, idx({0, 1, 2, -1}), 3),
                      Contains("index -1") && Contains("num_segments"));
}

TEST_CASE("index_add matches PyTorch", "[ops][gnn][scatter]") {
  check_ref("index_add_d0", [](const V& v) { return index_add(v[0], 0, v[2], v[1], 2.0); },
            {"x", "src", "index"}, {"index"});
  check_ref("index_add_d1", [](const V& v) { return index_add(v[0], 1, v[2], v[1]); },
            {"x", "src", "index"}, {"index"});
  const Tensor index = idx({2, 0, 2, 1});
  gradcheck([&](const V& v) { return index_add(v[0], 1, index, v[1], -0.5); },
            {leaf({2, 3, 2}, 5), leaf({2, 4, 2}, 6)});
  // Integer tensors add exactly.
  CHECK(index_add(zeros({3}, DType::i64), 0, idx({2, 2, 0}), idx({1, 2, 3})).to_vector<int64_t>() ==
        std::vector<int64_t>{3, 0, 3});
}

TEST_CASE("segment_max and segment_softmax match PyG", "[ops][gnn][segment]") {
  check_ref("segment_max", [](const V& v) { return segment_max(v[0], v[1], 5); }, {"src", "ids"},
            {"ids"});
  check_ref("segment_softmax", [](const V& v) { return segment_softmax(v[0], v[1], 5); },
            {"src", "ids"}, {"ids"});
  check_ref("segment_softmax_1d", [](const V& v) { return segment_softmax(v[0], v[1], 5); },
            {"src", "ids"}, {"ids"});
  const Tensor ids = idx({1, 0, 1, 3, 1, 0});
  gradcheck([&](const V& v) { return segment_max(v[0], ids, 4); }, {leaf({6, 3}, 7)});
  gradcheck([&](const V& v) { return segment_softmax(v[0], ids, 4); }, {leaf({6, 3}, 8, 3.0)});
  // Each segment's weights sum to 1, even with large logits.
  const Tensor a = segment_softmax(mul(leaf({6, 2}, 9), 200.0).detach(), ids, 4);
  const Tensor s = segment_sum(a, ids, 4);
  CHECK(close(s.narrow(0, 0, 2), ones({2, 2}, DType::f64), 1e-12));
  CHECK(close(s.narrow(0, 3, 1), ones({1, 2}, DType::f64), 1e-12));
  CHECK(close(s.narrow(0, 2, 1), zeros({1, 2}, DType::f64), 0));  // empty segment
}

TEST_CASE("logsumexp matches PyTorch", "[ops][gnn][reduction]") {
  check_ref("logsumexp_d1", [](const V& v) { return logsumexp(v[0], {1}); }, {"x"});
  check_ref("logsumexp_d02_keep", [](const V& v) { return logsumexp(v[0], {0, 2}, true); }, {"x"});
  check_ref("logsumexp_all", [](const V& v) { return logsumexp(v[0], {}); }, {"x"});
  gradcheck([](const V& v) { return logsumexp(v[0], {-1}); }, {leaf({3, 4}, 10)});
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor t = from_vector(std::vector<double>{-inf, -inf, inf, 1.0}, {2, 2});
  const auto r = logsumexp(t, {1}).to_vector<double>();
  CHECK(r[0] == -inf);
  CHECK(r[1] == inf);
  REQUIRE_THROWS_WITH(logsumexp(idx({1, 2}), {0}), Contains("floating-point"));
}

TEST_CASE("cumsum and prod match PyTorch", "[ops][gnn][reduction]") {
  check_ref("cumsum_d1", [](const V& v) { return cumsum(v[0], 1); }, {"x"});
  check_ref("cumsum_dlast", [](const V& v) { return cumsum(v[0], -1); }, {"x"});
  const Tensor ci = cumsum(Ri("cumsum_int.x").to(DType::i32), 0);
  CHECK(ci.dtype() == DType::i64);
  CHECK(close(ci, R("cumsum_int.y"), 0));
  check_ref("prod_d1", [](const V& v) { return prod(v[0], 1); }, {"x"});
  check_ref("prod_d0_keep", [](const V& v) { return prod(v[0], 0, true); }, {"x"});
  check_ref("prod_all", [](const V& v) { return prod(v[0]); }, {"x"});
  gradcheck([](const V& v) { return cumsum(v[0], 0); },
            {leaf({4, 3}, 11).transpose(0, 1).detach().requires_grad_()});
  Tensor z = leaf({3, 4}, 12).detach();
  z.select(0, 1).select(0, 2).fill_(0.0);
  z.select(0, 2).narrow(0, 0, 2).fill_(0.0);
  z.requires_grad_();
  gradcheck([](const V& v) { return prod(v[0], 1); }, {z});
  gradcheck([](const V& v) { return prod(v[0]); }, {leaf({2, 3}, 13)});
  CHECK(prod(from_vector(std::vector<int32_t>{2, 3, 4})).item<int64_t>() == 24);
  CHECK(prod(from_vector(std::vector<int32_t>{2, 3, 4})).dtype() == DType::i64);
}

TEST_CASE("norm matches torch.linalg.vector_norm", "[ops][gnn][reduction]") {
  const double inf = std::numeric_limits<double>::infinity();
  check_ref("norm_2_all", [](const V& v) { return norm(v[0]); }, {"x"});
  check_ref("norm_2_d2", [](const V& v) { return norm(v[0], 2, {2}); }, {"x"});
  check_ref("norm_1_d1", [](const V& v) { return norm(v[0], 1, {1}); }, {"x"});
  check_ref("norm_inf_d02_keep",
            [inf](const V& v) {
              return norm(v[0], inf, {0, 2}, true);
            },
            {"x"});
  check_ref("norm_3_d2", [](const V& v) { return norm(v[0], 3, {2}); }, {"x"});
  CHECK(close(norm(R("norm_0_d2.x"), 0, {2}), R("norm_0_d2.y"), 0));
  for (double p : {1.0, 2.0, 3.0, 1.5, inf}) {
    INFO("p = " << p);
    gradcheck([p](const V& v) { return norm(v[0], p, {1}); }, {leaf({3, 4}, 14)});
  }
  // 16-bit inputs compute in f32 (x * x would overflow f16) and keep their dtype.
  const Tensor big = full({4}, 300.0, DType::f16);
  CHECK(norm(big).dtype() == DType::f16);
  CHECK(norm(big).to(DType::f32).item<float>() == 600.f);
  REQUIRE_THROWS_WITH(norm(ones({2}), 0.5), Contains("p = 0.5") && Contains("not supported"));
  REQUIRE_THROWS_WITH(norm(idx({1, 2})), Contains("floating-point"));
}

TEST_CASE("sort, argsort and topk match PyTorch", "[ops][gnn][sort]") {
  for (const char* tag : {"asc", "desc"}) {
    const bool desc = std::string(tag) == "desc";
    check_ref(std::string("sort_") + tag, [desc](const V& v) { return sort(v[0], 1, desc).first; },
              {"x"});
    const Tensor x = R(std::string("sort_") + tag + ".x");
    CHECK(close(sort(x, 1, desc).second, R(std::string("sort_") + tag + ".i"), 0));
    CHECK(close(argsort(x, -1, desc), R(std::string("sort_") + tag + ".i"), 0));
    CHECK(close(argsort(x.to(DType::f32), 0, desc), R(std::string("sort_d0_") + tag + ".i"), 0));
    // Integer sort: same order (no NaN in column 0-5 of row 0, 1, 3).
    const Tensor xi = x.narrow(0, 0, 2).to(DType::i64);
    CHECK(close(argsort(xi, 1, desc), R(std::string("sort_") + tag + ".i").narrow(0, 0, 2), 0));
  }
  check_ref("topk_largest", [](const V& v) { return topk(v[0], 3, 1).first; }, {"x"});
  CHECK(close(topk(R("topk_largest.x"), 3, 1).second, R("topk_largest.i"), 0));
  check_ref("topk_smallest_d0", [](const V& v) { return topk(v[0], 2, 0, false).first; }, {"x"});
  CHECK(close(topk(R("topk_smallest_d0.x"), 2, 0, false).second, R("topk_smallest_d0.i"), 0));
  gradcheck([](const V& v) { return sort(v[0], 0, true).first; }, {leaf({5, 3}, 15)});
  gradcheck([](const V& v) { return topk(v[0], 2, -1).first; }, {leaf({3, 5}, 16)});
  REQUIRE_THROWS_WITH(topk(ones({2, 3}), 4), Contains("topk") && Contains("k = 4"));
  CHECK(sort(scalar_tensor(2.0)).first.item<double>() == 2.0);
  CHECK(argsort(from_vector(std::vector<uint8_t>{3, 1, 2})).to_vector<int64_t>() ==
        std::vector<int64_t>{1, 2, 0});
}

TEST_CASE("any, all and nonzero", "[ops][gnn][reduction]") {
  const Tensor t = from_vector(std::vector<double>{0, 1, 0, 0, NAN, 2}, {2, 3});
  CHECK(any(t).item<bool>());
  CHECK_FALSE(all(t).item<bool>());
  CHECK(any(t, {1}).dtype() == DType::b8);
  CHECK(any(t, {0}).to(DType::i64).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 1});
  CHECK(all(t, {0}).to(DType::i64).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0});
  CHECK(all(add(t, 1.0), {1}, true).shape() == Shape{2, 1});
  CHECK_FALSE(any(zeros({0})).item<bool>());
  CHECK(all(zeros({0})).item<bool>());
  const Tensor nz = nonzero(R("nonzero.x"));
  CHECK(nz.dtype() == DType::i64);
  CHECK(close(nz, R("nonzero.y"), 0));
  CHECK(nonzero(zeros({2, 2})).shape() == Shape{0, 2});
}

TEST_CASE("repeat, flip, roll, tril and triu match PyTorch", "[ops][gnn][shape]") {
  check_ref("repeat", [](const V& v) { return repeat(v[0], {2, 1, 3}); }, {"x"});
  check_ref("flip", [](const V& v) { return flip(v[0], {0, 2}); }, {"x"});
  check_ref("roll", [](const V& v) { return roll(v[0], {1, -2}, {0, 1}); }, {"x"});
  check_ref("roll_flat", [](const V& v) { return roll(v[0], {5}); }, {"x"});
  for (int64_t k : {0, 1, -1}) {
    check_ref("tril_" + std::to_string(k), [k](const V& v) { return tril(v[0], k); }, {"x"});
    check_ref("triu_" + std::to_string(k), [k](const V& v) { return triu(v[0], k); }, {"x"});
  }
  gradcheck([](const V& v) { return repeat(v[0], {2, 2}); }, {leaf({2, 3}, 17)});
  gradcheck([](const V& v) { return roll(v[0], {-1}, {1}); }, {leaf({2, 3}, 18)});
  CHECK(tril(ones({3, 3}, DType::i64)).to_vector<int64_t>() ==
        std::vector<int64_t>{1, 0, 0, 1, 1, 0, 1, 1, 1});
  REQUIRE_THROWS_WITH(repeat(ones({2, 3}), {2}), Contains("repeat") && Contains("fewer"));
  REQUIRE_THROWS_WITH(tril(ones({3})), Contains("tril") && Contains("at least 2"));
  REQUIRE_THROWS_WITH(flip(ones({3}), {0, 0}), Contains("more than once"));
}
