// Softmax family, dropout and losses: values against naive references (PyTorch semantics for
// cross_entropy's weights / ignore_index / label smoothing), f64 gradients, dropout masks, errors.
#include <catch2/catch.hpp>

#include <cmath>

#include "gradcheck.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::leaf;
using V = std::vector<Tensor>;

namespace {

void require_close(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == Approx(b[i]).margin(tol));
}

// Naive cross-entropy on logits [N, C, S] (row-major) and targets [N, S], PyTorch semantics.
double naive_ce(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t N, int64_t C,
                int64_t S, const std::vector<double>& w, int64_t ignore, double eps, Reduction red,
                std::vector<double>* per_sample = nullptr) {
  double total = 0, wsum = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t s = 0; s < S; ++s) {
      const int64_t ti = t[n * S + s];
      double loss = 0;
      if (ti != ignore) {
        double mx = -1e300;
        for (int64_t c = 0; c < C; ++c) mx = std::max(mx, x[(n * C + c) * S + s]);
        double se = 0;
        for (int64_t c = 0; c < C; ++c) se += std::exp(x[(n * C + c) * S + s] - mx);
        const double lse = mx + std::log(se);
        double smooth = 0;
        for (int64_t c = 0; c < C; ++c) smooth += -w[c] * (x[(n * C + c) * S + s] - lse);
        loss = (1 - eps) * -w[ti] * (x[(n * C + ti) * S + s] - lse) + eps / double(C) * smooth;
        wsum += w[ti];
      }
      if (per_sample) per_sample->push_back(loss);
      total += loss;
    }
  if (red == Reduction::Mean) return total / wsum;
  return total;
}

}  // namespace

TEST_CASE("softmax and log_softmax values", "[ops][loss]") {
  Generator g(1);
  Tensor x = mul(randn({2, 3, 4}, DType::f64, &g), 3.0);
  for (int64_t dim : {0, 1, 2, -1}) {
    Tensor y = softmax(x, dim), ly = log_softmax(x, dim);
    const int64_t d = dim < 0 ? dim + 3 : dim;
    // Reference with ops: exp(x - max) / sum.
    Tensor e = exp(sub(x, std::get<0>(max(x, d, true))));
    Tensor ref = div(e, sum(e, {d}, true));
    require_close(y.to_vector<double>(), ref.to_vector<double>(), 1e-12);
    require_close(ly.to_vector<double>(), log(ref).to_vector<double>(), 1e-12);
  }
  // Stable for large logits.
  Tensor big = tensor({1000.0, 1001.0, 1002.0}, DType::f64);
  REQUIRE(softmax(big, 0).to_vector<double>()[2] == Approx(0.6652409557748219));
  REQUIRE(log_softmax(big, 0).to_vector<double>()[0] == Approx(-2.4076059644443806));
  // f32 and bf16 agree with f64.
  require_close(softmax(x.to(DType::f32), 1).to_vector<double>(), softmax(x, 1).to_vector<double>(),
                1e-6);
  require_close(log_softmax(x.to(DType::bf16), 1).to_vector<double>(),
                log_softmax(x, 1).to_vector<double>(), 0.1);
  require_close(softmax(x.to(DType::f16), 2).to_vector<double>(), softmax(x, 2).to_vector<double>(),
                0.01);
}

TEST_CASE("softmax gradients", "[ops][loss][grad]") {
  auto x = leaf({3, 4, 2}, 1);
  for (int64_t dim : {0, 1, 2}) {
    gradcheck([dim](const V& v) { return softmax(v[0], dim); }, {x});
    gradcheck([dim](const V& v) { return log_softmax(v[0], dim); }, {x});
  }
  // Transposed (non-contiguous) leaf.
  auto t = leaf({4, 3}, 2);
  gradcheck([](const V& v) { return softmax(v[0].t(), 1); }, {t});
  gradcheck([](const V& v) { return log_softmax(v[0].t(), 0); }, {t});
}

TEST_CASE("cross_entropy matches PyTorch semantics", "[ops][loss]") {
  Generator g(4);
  Tensor x = randn({5, 4}, DType::f64, &g);
  const std::vector<int64_t> tv{0, 3, -100, 2, 1};
  Tensor t = from_vector<int64_t>(tv, {5});
  const auto xv = x.to_vector<double>();
  const std::vector<double> w1(4, 1.0), wv{0.5, 2.0, 1.0, 3.0};
  Tensor w = from_vector<double>(wv, {4});

  CrossEntropyOptions o;
  REQUIRE(cross_entropy(x, t, o).item() ==
          Approx(naive_ce(xv, tv, 5, 4, 1, w1, -100, 0, Reduction::Mean)));
  o.reduction = Reduction::Sum;
  REQUIRE(cross_entropy(x, t, o).item() ==
          Approx(naive_ce(xv, tv, 5, 4, 1, w1, -100, 0, Reduction::Sum)));
  o.reduction = Reduction::None;
  std::vector<double> per;
  naive_ce(xv, tv, 5, 4, 1, w1, -100, 0, Reduction::None, &per);
  Tensor none = cross_entropy(x, t, o);
  REQUIRE(none.shape() == Shape{5});
  require_close(none.to_vector<double>(), per, 1e-12);
  REQUIRE(none.to_vector<double>()[2] == 0.0);

  // Weights + label smoothing + ignore_index, mean divides by the summed weight.
  o = CrossEntropyOptions{};
  o.weight = w;
  o.label_smoothing = 0.2;
  REQUIRE(cross_entropy(x, t, o).item() ==
          Approx(naive_ce(xv, tv, 5, 4, 1, wv, -100, 0.2, Reduction::Mean)));
  // A second small case with non-uniform weights.
  Tensor lx = tensor({1.0, 2.0, 0.5, -1.0, 0.0, 3.0}, DType::f64).reshape({2, 3});
  Tensor lt = from_vector<int64_t>({2, 0}, {2});
  CrossEntropyOptions lo;
  lo.label_smoothing = 0.1;
  lo.weight = tensor({1.0, 2.0, 0.5}, DType::f64);
  REQUIRE(cross_entropy(lx, lt, lo).item() ==
          Approx(naive_ce(lx.to_vector<double>(), {2, 0}, 2, 3, 1, {1.0, 2.0, 0.5}, -100, 0.1,
                          Reduction::Mean)));
  // Custom ignore_index inside the class range.
  o = CrossEntropyOptions{};
  o.ignore_index = 3;
  REQUIRE_THROWS_WITH(cross_entropy(x, t, o), Contains("-100") && Contains("ignore_index (3)"));
  Tensor t2 = from_vector<int64_t>({0, 3, 1, 2, 1}, {5});
  REQUIRE(cross_entropy(x, t2, o).item() ==
          Approx(naive_ce(xv, {0, 3, 1, 2, 1}, 5, 4, 1, w1, 3, 0, Reduction::Mean)));
  // int32 targets are accepted; f32 logits agree.
  REQUIRE(cross_entropy(x.to(DType::f32), t2.to(DType::i32)).item() ==
          Approx(cross_entropy(x, t2).item()).epsilon(1e-5));
  // Unbatched logits [C] with a 0-d target.
  Tensor u = cross_entropy(x.select(0, 0), from_vector<int64_t>({0}, {1}).reshape({}));
  REQUIRE(u.dim() == 0);
  REQUIRE(u.item() == Approx(per[0]));
}

TEST_CASE("cross_entropy with spatial dims", "[ops][loss]") {
  Generator g(6);
  Tensor x = randn({2, 3, 2, 2}, DType::f64, &g);
  const std::vector<int64_t> tv{0, 1, 2, -100, 2, 2, 1, 0};
  Tensor t = from_vector<int64_t>(tv, {2, 2, 2});
  CrossEntropyOptions o;
  o.weight = tensor({1.0, 0.5, 2.0}, DType::f64);
  o.label_smoothing = 0.3;
  REQUIRE(cross_entropy(x, t, o).item() ==
          Approx(naive_ce(x.to_vector<double>(), tv, 2, 3, 4, {1.0, 0.5, 2.0}, -100, 0.3,
                          Reduction::Mean)));
  o.reduction = Reduction::None;
  REQUIRE(cross_entropy(x, t, o).shape() == Shape{2, 2, 2});
}

TEST_CASE("cross_entropy and nll_loss gradients", "[ops][loss][grad]") {
  Tensor t = from_vector<int64_t>({0, 3, -100, 2, 1, 3}, {6});
  Tensor w = tensor({0.5, 2.0, 1.0, 3.0}, DType::f64);
  auto x = leaf({6, 4}, 1);
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    CrossEntropyOptions o;
    o.reduction = r;
    gradcheck([&](const V& v) { return cross_entropy(v[0], t, o); }, {x});
    o.weight = w;
    o.label_smoothing = 0.15;
    gradcheck([&](const V& v) { return cross_entropy(v[0], t, o); }, {x});
    NLLLossOptions n;
    n.reduction = r;
    n.weight = w;
    gradcheck([&](const V& v) { return nll_loss(log_softmax(v[0], 1), t, n); }, {x});
  }
  // Spatial, non-contiguous logits.
  Tensor ts = from_vector<int64_t>({0, 1, 2, -100, 2, 2}, {2, 3});
  CrossEntropyOptions o;
  o.label_smoothing = 0.1;
  o.weight = tensor({1.0, 0.5, 2.0}, DType::f64);
  gradcheck([&](const V& v) { return cross_entropy(v[0].transpose(1, 2), ts, o); },
            {leaf({2, 3, 3}, 2)});
}

TEST_CASE("nll_loss values", "[ops][loss]") {
  Generator g(8);
  Tensor lp = log_softmax(randn({4, 3}, DType::f64, &g), 1);
  Tensor t = from_vector<int64_t>({2, 0, 1, -100}, {4});
  const auto v = lp.to_vector<double>();
  REQUIRE(nll_loss(lp, t).item() == Approx(-(v[2] + v[3] + v[7]) / 3));
  NLLLossOptions o;
  o.weight = tensor({1.0, 2.0, 4.0}, DType::f64);
  REQUIRE(nll_loss(lp, t, o).item() == Approx(-(4 * v[2] + v[3] + 2 * v[7]) / 7));
  o.reduction = Reduction::None;
  require_close(nll_loss(lp, t, o).to_vector<double>(), {-4 * v[2], -v[3], -2 * v[7], 0.0}, 1e-12);
  // cross_entropy == nll_loss(log_softmax)
  Tensor x = randn({4, 3}, DType::f64, &g);
  REQUIRE(cross_entropy(x, t).item() == Approx(nll_loss(log_softmax(x, 1), t).item()));
}

TEST_CASE("class weights that require grad are refused, as PyTorch does", "[ops][loss][errors]") {
  // The losses are not differentiable in the class weights: a weight that requires grad would
  // be left without a gradient, silently. Detached, or under no_grad, it is used as before.
  Tensor x = leaf({4, 3}, 5);
  Tensor t = from_vector<int64_t>({0, 2, 1, 2}, {4});
  Tensor w = tensor({1.0, 0.5, 2.0}, DType::f64);
  w.requires_grad_();
  CrossEntropyOptions co;
  co.weight = w;
  NLLLossOptions no;
  no.weight = w;
  CHECK_THROWS_WITH(cross_entropy(x, t, co),
                    Contains("class weights require grad") && Contains("weight.detach()"));
  CHECK_THROWS_WITH(nll_loss(log_softmax(x, 1), t, no), Contains("class weights require grad"));
  co.weight = w.detach();
  no.weight = w.detach();
  const double ce = cross_entropy(x, t, co).item();
  const double nll = nll_loss(log_softmax(x, 1), t, no).item();
  CHECK(ce == Approx(nll).epsilon(1e-12));
  NoGradGuard no_grad;
  co.weight = w;
  CHECK(cross_entropy(x, t, co).item() == ce);
}

TEST_CASE("mse_loss and binary_cross_entropy_with_logits", "[ops][loss]") {
  Tensor a = tensor({1, 2, 3}, DType::f64), b = tensor({0, 2, 5}, DType::f64);
  REQUIRE(mse_loss(a, b).item() == Approx(5.0 / 3));
  REQUIRE(mse_loss(a, b, Reduction::Sum).item() == Approx(5.0));
  REQUIRE(mse_loss(a, b, Reduction::None).to_vector<double>() == std::vector<double>{1, 0, 4});
  gradcheck([](const V& v) { return mse_loss(v[0], v[1]); }, {leaf({3, 4}, 1), leaf({3, 4}, 2)});
  // A broadcast target, asked for explicitly (a different shape alone is refused).
  gradcheck(
      [](const V& v) {
        return mse_loss(v[0], v[1].expand({3, 4}));
      },
      {leaf({3, 4}, 1), leaf({4}, 2)});

  Tensor x = tensor({-2.0, 0.5, 3.0, 50.0, -50.0, 0.0}, DType::f64).reshape({2, 3});
  Tensor y = tensor({0.0, 1.0, 0.3, 1.0, 0.0, 1.0}, DType::f64).reshape({2, 3});
  Tensor pw = tensor({2.0, 0.5, 1.5}, DType::f64);
  const auto xv = x.to_vector<double>(), yv = y.to_vector<double>(), pv = pw.to_vector<double>();
  std::vector<double> ref, refw;
  for (int i = 0; i < 6; ++i) {
    const double s = 1 / (1 + std::exp(-xv[i]));
    ref.push_back(-(yv[i] * std::log(s) + (1 - yv[i]) * std::log(1 - s)));
    refw.push_back(-(pv[i % 3] * yv[i] * std::log(s) + (1 - yv[i]) * std::log(1 - s)));
  }
  ref[3] = 0.0;  // log(1 - s) underflows for |x| = 50 in the naive form; the stable form gives ~0
  refw[3] = 0.0;
  ref[4] = 0.0;
  refw[4] = 0.0;
  require_close(
      binary_cross_entropy_with_logits(x, y, {.reduction = Reduction::None}).to_vector<double>(),
      ref, 1e-12);
  require_close(
      binary_cross_entropy_with_logits(x, y, {.reduction = Reduction::None, .pos_weight = pw})
          .to_vector<double>(),
      refw, 1e-12);
  double m = 0;
  for (double v : ref) m += v;
  REQUIRE(binary_cross_entropy_with_logits(x, y).item() == Approx(m / 6));
  REQUIRE(binary_cross_entropy_with_logits(x, y, {.reduction = Reduction::Sum}).item() ==
          Approx(m));
  Tensor big = tensor({1000.0, -1000.0}, DType::f32);
  REQUIRE(std::isfinite(binary_cross_entropy_with_logits(big, tensor({0.0, 1.0})).item()));
  REQUIRE(binary_cross_entropy_with_logits(big, tensor({0.0, 1.0})).item() == Approx(1000.0));

  auto lx = leaf({2, 3}, 3), ly = leaf({2, 3}, 4), lp = leaf({3}, 5);
  gradcheck([](const V& v) { return binary_cross_entropy_with_logits(v[0], v[1]); }, {lx, ly});
  gradcheck(
      [](const V& v) {
        return binary_cross_entropy_with_logits(
            v[0], v[1], {.reduction = Reduction::None, .pos_weight = add(abs(v[2]), 0.5)});
      },
      {lx, ly, lp});
}

TEST_CASE("binary cross-entropy options: weight in both forms, the earlier positional forms",
          "[ops][loss]") {
  // The rescaling weight multiplies each element's loss before the reduction, in the logits
  // form too (PyTorch's BCEWithLogitsLoss(weight=...)); f64, so the products are exact to
  // the ulp and both sides compute the same products.
  Tensor x = tensor({0.3, -1.2, 2.0, 0.7, -0.4, 1.1}, DType::f64).reshape({2, 3});
  Tensor y = tensor({0.0, 1.0, 0.3, 1.0, 0.0, 1.0}, DType::f64).reshape({2, 3});
  Tensor w = tensor({0.5, 2.0, 1.5}, DType::f64);
  Tensor pw = tensor({2.0, 0.5, 1.5}, DType::f64);
  const Tensor plain =
      binary_cross_entropy_with_logits(x, y, {.reduction = Reduction::None, .pos_weight = pw});
  const Tensor weighted = binary_cross_entropy_with_logits(
      x, y, {.reduction = Reduction::None, .weight = w, .pos_weight = pw});
  CHECK(allclose(weighted, mul(plain, w), 0, 0));
  CHECK(allclose(
      binary_cross_entropy_with_logits(x, y, {.reduction = Reduction::Sum, .weight = w}),
      sum(mul(binary_cross_entropy_with_logits(x, y, {.reduction = Reduction::None}), w)), 0, 0));
  auto lx = leaf({2, 3}, 3), ly = leaf({2, 3}, 4), lw = leaf({3}, 6), lp = leaf({3}, 5);
  gradcheck(
      [](const V& v) {
        return binary_cross_entropy_with_logits(
            v[0], v[1], {.weight = v[2], .pos_weight = add(abs(v[3]), 0.5)});
      },
      {lx, ly, lw, lp});
  CHECK_THROWS_WITH(
      binary_cross_entropy_with_logits(x, y, {.weight = tensor({1.0, 2.0}, DType::f64)}),
      Contains("[2, 3] and [2] cannot be broadcast"));
  const Tensor p = sigmoid(x);
  CHECK_THROWS_WITH(binary_cross_entropy(p, y, {.pos_weight = pw}),
                    Contains("pos_weight applies to binary_cross_entropy_with_logits only"));

  // The positional forms of earlier releases, kept one release, give the same results.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  CHECK(allclose(
      binary_cross_entropy_with_logits(x, y, Reduction::Sum, pw),
      binary_cross_entropy_with_logits(x, y, {.reduction = Reduction::Sum, .pos_weight = pw}), 0,
      0));
  CHECK(allclose(binary_cross_entropy(p, y, w, Reduction::None),
                 binary_cross_entropy(p, y, {.reduction = Reduction::None, .weight = w}), 0, 0));
#pragma GCC diagnostic pop
}

TEST_CASE("dropout", "[ops][loss]") {
  Tensor x = leaf({64, 64}, 1);
  REQUIRE(allclose(dropout(x, 0.0), x));
  REQUIRE(allclose(dropout(x, 0.7, false), x));
  Tensor z = dropout(x, 1.0);
  REQUIRE(sum(abs(z)).item() == 0.0);

  Generator g1(42), g2(42);
  const double p = 0.3;
  Tensor ones_big = ones({200, 100});
  Tensor d1 = dropout(ones_big, p, true, &g1);
  Tensor d2 = dropout(ones_big, p, true, &g2);
  REQUIRE(d1.to_vector<float>() == d2.to_vector<float>());  // same seed -> same mask
  Tensor d3 = dropout(ones_big, p, true, &g1);              // generator advanced -> new mask
  REQUIRE(d1.to_vector<float>() != d3.to_vector<float>());
  const auto v = d1.to_vector<float>();
  int64_t kept = 0;
  for (float e : v) {
    REQUIRE((e == 0.0f || e == Approx(1.0 / (1 - p))));
    kept += e != 0.0f;
  }
  REQUIRE(double(kept) / double(v.size()) == Approx(1 - p).margin(0.02));

  // Gradient equals mask / (1 - p).
  Generator g3(7), g4(7);
  Tensor y = dropout(x, 0.5, true, &g3);
  sum(y).backward();
  Tensor mask = dropout(ones({64, 64}, DType::f64), 0.5, true, &g4);
  REQUIRE(allclose(x.grad(), mask));
  REQUIRE(allclose(y, mul(x.detach(), mask)));
  REQUIRE_THROWS_WITH(dropout(x, 1.5), Contains("dropout"));
}

TEST_CASE("dropout on bf16/f16 scales by 1/keep in f32: no systematic bias", "[ops][loss]") {
  // Kept elements must average x / keep: with the scale rounded to bf16 first (1/0.9 ->
  // 1.109375) every kept element would shrink by 0.16%.
  for (DType dt : {DType::bf16, DType::f16}) {
    Generator gx(3), gd(4);
    Tensor x = add(rand({1 << 18}, TensorOptions(DType::f32), &gx), 1.0).to(dt);
    Tensor y = dropout(x, 0.1, true, &gd);
    CHECK(y.dtype() == dt);
    Tensor xf = x.to(DType::f64), yf = y.to(DType::f64);
    Tensor kept = ne(yf, 0.0).to(DType::f64);
    const double ratio = sum(yf).item<double>() / sum(mul(xf, kept)).item<double>();
    INFO(dtype_name(dt) << " ratio " << ratio);
    CHECK(std::abs(ratio * 0.9 - 1.0) < 2e-4);
  }
}

TEST_CASE("loss errors", "[ops][loss][errors]") {
  Tensor x = randn({3, 4});
  REQUIRE_THROWS_WITH(cross_entropy(x, from_vector<int64_t>({0, 4, 1}, {3})),
                      Contains("cross_entropy") && Contains("4") && Contains("[0, 4)"));
  REQUIRE_THROWS_WITH(cross_entropy(x, from_vector<int64_t>({0, -1, 1}, {3})),
                      Contains("cross_entropy") && Contains("-1"));
  REQUIRE_THROWS_WITH(cross_entropy(x, tensor({0, 1, 2})),
                      Contains("cross_entropy") && Contains("int64"));
  REQUIRE_THROWS_WITH(cross_entropy(x, from_vector<int64_t>({0, 1}, {2})),
                      Contains("cross_entropy") && Contains("[2]") && Contains("[3, 4]"));
  CrossEntropyOptions o;
  o.weight = ones({3});
  REQUIRE_THROWS_WITH(cross_entropy(x, from_vector<int64_t>({0, 1, 2}, {3}), o),
                      Contains("cross_entropy") && Contains("weight"));
  REQUIRE_THROWS_WITH(nll_loss(x, from_vector<int64_t>({0, 9, 1}, {3})),
                      Contains("nll_loss") && Contains("9"));
  REQUIRE_THROWS_WITH(nll_loss(x, tensor({0, 1, 2})), Contains("nll_loss"));
  REQUIRE_THROWS_WITH(mse_loss(x, randn({3, 5})), Contains("mse_loss"));
  REQUIRE_THROWS_WITH(mse_loss(x, ones({3, 4}, DType::i64)), Contains("mse_loss"));
  REQUIRE_THROWS_WITH(binary_cross_entropy_with_logits(x, randn({4, 3})),
                      Contains("binary_cross_entropy_with_logits"));
  REQUIRE_THROWS_WITH(softmax(ones({3}, DType::i64), 0), Contains("softmax"));
  REQUIRE_THROWS_WITH(softmax(x, 2), Contains("softmax"));
}
