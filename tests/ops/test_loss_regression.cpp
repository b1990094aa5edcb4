// l1, smooth_l1 (beta 0.5 and 0), huber, kl_div (all four reductions, log_target),
// binary_cross_entropy (weighted) and gaussian_nll (full, eps clamp, a var with a last dim of
// 1): PyTorch's values and gradients of every differentiable input (research_reference.txt) in
// f64 and f32; f64 finite-difference gradients; the nn modules; errors.
#include <catch2/catch.hpp>

#include "gradcheck.hpp"
#include "reference_file.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::leaf;
using V = std::vector<Tensor>;
using F = std::function<Tensor(const V&)>;

namespace {

const char* const kResearchReference = DLTRAIN_REFERENCE_DIR "/research_reference.txt";
Tensor R(const std::string& name) {
  return dltrain::testing::reference_tensor(kResearchReference, name);
}
bool has(const std::string& name) {
  return dltrain::testing::cached_reference(kResearchReference).count(name) > 0;
}

// f on the reference inputs p.<name> (fresh leaves in dt), compared with p.y and, for every
// input with a stored gradient p.g<name>, that gradient.
void against_torch(const std::string& p, const std::vector<std::string>& names, const F& f) {
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(p << " dtype " << dt);
    const double tol = dt == DType::f64 ? 1e-12 : 2e-5;
    V in;
    for (const auto& n : names) {
      Tensor t = R(p + "." + n).to(dt).clone();
      if (has(p + ".g" + n)) t.requires_grad_();
      in.push_back(t);
    }
    Tensor y = f(in);
    CHECK(y.dtype() == dt);
    REQUIRE(y.shape() == R(p + ".y").shape());
    CHECK(allclose(y.to(DType::f64), R(p + ".y"), tol, tol));
    y.backward(R(p + ".gy").to(dt));
    for (size_t i = 0; i < names.size(); ++i) {
      if (!has(p + ".g" + names[i])) continue;
      INFO("gradient of " << names[i]);
      CHECK(allclose(in[i].grad().to(DType::f64), R(p + ".g" + names[i]), tol, tol));
    }
  }
}

const std::pair<const char*, Reduction> kReductions[] = {
    {"none", Reduction::None}, {"mean", Reduction::Mean}, {"sum", Reduction::Sum}};

}  // namespace

TEST_CASE("regression losses match PyTorch", "[ops][loss]") {
  for (const auto& [name, r] : kReductions) {
    const std::string s = name;
    const Reduction red = r;
    against_torch("l1_" + s, {"x", "t"}, [red](const V& v) { return l1_loss(v[0], v[1], red); });
    against_torch("smooth_l1_" + s, {"x", "t"},
                  [red](const V& v) { return smooth_l1_loss(v[0], v[1], red, 0.5); });
    against_torch("huber_" + s, {"x", "t"},
                  [red](const V& v) { return huber_loss(v[0], v[1], red, 0.7); });
    against_torch("bce_" + s, {"x", "t"}, [red](const V& v) {
      return binary_cross_entropy(v[0], v[1], {.reduction = red});
    });
    against_torch("gnll_" + s, {"x", "t", "v"}, [red](const V& v) {
      return gaussian_nll_loss(v[0], v[1], v[2], false, 1e-6, red);
    });
  }
  against_torch("smooth_l1_beta0", {"x", "t"},
                [](const V& v) { return smooth_l1_loss(v[0], v[1], Reduction::Mean, 0.0); });
  const Tensor bw = R("bce_weight.w");
  against_torch("bce_weight", {"x", "t"}, [&](const V& v) {
    return binary_cross_entropy(v[0], v[1], {.weight = bw.to(v[0].dtype())});
  });
  against_torch("gnll_full", {"x", "t", "v"},
                [](const V& v) { return gaussian_nll_loss(v[0], v[1], v[2], true, 1e-3); });
  against_torch("gnll_var1", {"x", "t", "v"},
                [](const V& v) { return gaussian_nll_loss(v[0], v[1], v[2]); });
}

TEST_CASE("kl_div matches PyTorch in every reduction", "[ops][loss]") {
  const std::pair<const char*, KLDivReduction> reds[] = {{"none", KLDivReduction::None},
                                                         {"mean", KLDivReduction::Mean},
                                                         {"sum", KLDivReduction::Sum},
                                                         {"batchmean", KLDivReduction::BatchMean}};
  for (const auto& [name, r] : reds) {
    const KLDivReduction red = r;
    against_torch(std::string("kl_div_") + name, {"x", "t"},
                  [red](const V& v) { return kl_div(v[0], v[1], red); });
  }
  against_torch("kl_div_logtarget", {"x", "t"},
                [](const V& v) { return kl_div(v[0], v[1], KLDivReduction::BatchMean, true); });
}

TEST_CASE("regression loss gradients", "[ops][loss][grad]") {
  // Differences kept away from the kinks (0, beta, delta) so central differences are smooth.
  const Tensor a = from_vector(std::vector<double>{-1.7, -0.9, -0.31, 0.2, 0.45, 1.3}, {2, 3});
  const Tensor b = from_vector(std::vector<double>{0.3, 0.1, 0.2, -0.6, 0.05, -0.2}, {2, 3});
  auto lf = [](const Tensor& t) {
    Tensor l = t.clone();
    l.requires_grad_();
    return l;
  };
  for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    gradcheck([red](const V& v) { return l1_loss(v[0], v[1], red); }, {lf(a), lf(b)});
    gradcheck([red](const V& v) { return smooth_l1_loss(v[0], v[1], red, 0.8); }, {lf(a), lf(b)});
    gradcheck([red](const V& v) { return huber_loss(v[0], v[1], red, 0.8); }, {lf(a), lf(b)});
    gradcheck(
        [red](const V& v) {
          return binary_cross_entropy(sigmoid(v[0]), sigmoid(v[1]),
                                      {.reduction = red, .weight = sigmoid(v[2])});
        },
        {leaf({2, 3}, 1), leaf({2, 3}, 2), leaf({2, 3}, 3)});
    gradcheck(
        [red](const V& v) { return gaussian_nll_loss(v[0], v[1], exp(v[2]), true, 1e-6, red); },
        {leaf({3, 2}, 4), leaf({3, 2}, 5), leaf({3}, 6)});
  }
  for (KLDivReduction red : {KLDivReduction::None, KLDivReduction::Mean, KLDivReduction::Sum,
                             KLDivReduction::BatchMean}) {
    gradcheck([red](const V& v) { return kl_div(log_softmax(v[0], 1), softmax(v[1], 1), red); },
              {leaf({3, 4}, 7), leaf({3, 4}, 8)});
    gradcheck(
        [red](const V& v) { return kl_div(log_softmax(v[0], 1), log_softmax(v[1], 1), red, true); },
        {leaf({3, 4}, 9), leaf({3, 4}, 10)});
  }
}

TEST_CASE("kl_div with zero target probabilities has finite gradients", "[ops][loss]") {
  Tensor x = log_softmax(randn({2, 3}, DType::f64), 1).detach();
  Tensor t = from_vector(std::vector<double>{0, 0.5, 0.5, 1, 0, 0}, {2, 3});
  x.requires_grad_();
  t.requires_grad_();
  Tensor l = kl_div(x, t, KLDivReduction::Sum);
  CHECK(std::isfinite(l.item<double>()));
  l.backward();
  for (double g : x.grad().to_vector<double>()) CHECK(std::isfinite(g));
  for (double g : t.grad().to_vector<double>()) CHECK(std::isfinite(g));
}

TEST_CASE("loss modules", "[ops][loss][nn]") {
  Tensor x = randn({4, 3}), t = randn({4, 3});
  CHECK(allclose(nn::L1Loss(Reduction::Sum)(x, t), l1_loss(x, t, Reduction::Sum), 0, 0));
  CHECK(allclose(nn::SmoothL1Loss(Reduction::Mean, 0.3)(x, t),
                 smooth_l1_loss(x, t, Reduction::Mean, 0.3), 0, 0));
  CHECK(allclose(nn::HuberLoss(Reduction::None, 2.0)(x, t), huber_loss(x, t, Reduction::None, 2.0),
                 0, 0));
  Tensor lp = log_softmax(x, 1), q = softmax(t, 1);
  CHECK(allclose(nn::KLDivLoss(KLDivReduction::BatchMean)(lp, q),
                 kl_div(lp, q, KLDivReduction::BatchMean), 0, 0));
  Tensor p = sigmoid(x), w = rand({3});
  nn::BCELoss bce(w);
  CHECK(bce.named_buffers().size() == 1);
  CHECK(allclose(bce(p, q), binary_cross_entropy(p, q, {.weight = w}), 0, 0));
  Tensor var = exp(randn({4, 3}));
  CHECK(allclose(nn::GaussianNLLLoss(true)(x, t, var), gaussian_nll_loss(x, t, var, true), 0, 0));
}

TEST_CASE("loss errors name the problem and the fix", "[ops][loss][errors]") {
  Tensor x = rand({2, 3}), t = rand({2, 3});
  CHECK_THROWS_WITH(l1_loss(x, t.to(DType::i64)), Contains("must be floating-point"));
  CHECK_THROWS_WITH(l1_loss(x, rand({4})), Contains("l1_loss"));
  CHECK_THROWS_WITH(smooth_l1_loss(x, t, Reduction::Mean, -1),
                    Contains("beta must be non-negative"));
  CHECK_THROWS_WITH(huber_loss(x, t, Reduction::Mean, 0), Contains("delta must be positive"));
  CHECK_THROWS_WITH(binary_cross_entropy(add(x, 1.5), t), Contains("apply sigmoid first"));
  CHECK_THROWS_WITH(binary_cross_entropy(x, rand({3, 2})),
                    Contains("target shape [3, 2] differs from input shape [2, 3]"));
  CHECK_THROWS_WITH(gaussian_nll_loss(x, t, rand({3})), Contains("fits neither input"));
  CHECK_THROWS_WITH(gaussian_nll_loss(x, t, sub(t, 2.0)), Contains("var has negative entries"));
  CHECK_THROWS_WITH(kl_div(randn({}), randn({}), KLDivReduction::BatchMean),
                    Contains("batchmean divides by the batch size"));
}

// Issue 28: a [4, 1, 8, 8] prediction against a [4, 8, 8] target broadcast silently to a
// [4, 4, 8, 8] loss. Every loss with an elementwise target refuses a target of another
// shape, naming both shapes and the fix; target.expand(input.shape()) broadcasts on purpose.
TEST_CASE("losses refuse a target whose shape differs from the input's", "[ops][loss][errors]") {
  Generator g(28);
  const Tensor p = rand({4, 1, 8, 8}, DType::f32, &g), t = rand({4, 8, 8}, DType::f32, &g);
  const Tensor logp = log_softmax(randn({4, 1, 8, 8}, DType::f32, &g), 1);
  using L = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, L>> losses{
      {"mse_loss", [](const Tensor& a, const Tensor& b) { return mse_loss(a, b); }},
      {"l1_loss", [](const Tensor& a, const Tensor& b) { return l1_loss(a, b); }},
      {"smooth_l1_loss", [](const Tensor& a, const Tensor& b) { return smooth_l1_loss(a, b); }},
      {"huber_loss", [](const Tensor& a, const Tensor& b) { return huber_loss(a, b); }},
      {"binary_cross_entropy",
       [](const Tensor& a, const Tensor& b) { return binary_cross_entropy(a, b); }},
      {"binary_cross_entropy_with_logits",
       [](const Tensor& a, const Tensor& b) { return binary_cross_entropy_with_logits(a, b); }},
      {"gaussian_nll_loss",
       [](const Tensor& a, const Tensor& b) { return gaussian_nll_loss(a, b, ones_like(a)); }},
      {"kl_div", [&](const Tensor& a, const Tensor& b) { return kl_div(a, b); }},
  };
  for (const auto& [name, loss] : losses) {
    INFO(name);
    const Tensor in = name == "kl_div" ? logp : p;
    CHECK_THROWS_WITH(loss(in, t), Contains(name + ": target shape [4, 8, 8] differs from input "
                                                   "shape [4, 1, 8, 8]") &&
                                       Contains("would give [4, 4, 8, 8]") &&
                                       Contains("target.unsqueeze(1) gives [4, 1, 8, 8]") &&
                                       Contains("input.squeeze(1) gives [4, 8, 8]") &&
                                       Contains("target.expand(input.shape())"));
    // The other way round: the target has the extra dimension.
    CHECK_THROWS_WITH(loss(in.squeeze(1), t.unsqueeze(1)),
                      Contains("target.squeeze(1) gives [4, 8, 8]"));
    // Shapes that broadcast to the input's own shape are refused too; expand is the way.
    const Tensor row = t.select(0, 0).select(0, 0);  // [8]
    CHECK_THROWS_WITH(loss(in.squeeze(1), row), Contains("reshape the target"));
    const Tensor matched = loss(in, t.unsqueeze(1));
    const Tensor expanded = loss(in.squeeze(1), row.expand(in.squeeze(1).shape()));
    CHECK(matched.dim() == 0);
    CHECK(expanded.dim() == 0);
  }
}
