// cross_entropy with class-probability ("soft") targets (issue 30): values and gradients against
// PyTorch, agreement with the class-index path on one-hot targets, f64 gradcheck and
// gradgradcheck (logits and target), autocast, errors.
#include <catch2/catch.hpp>

#include <cmath>

#include "dltrain/amp/autocast.hpp"
#include "gradcheck.hpp"

using namespace dltrain;
using Catch::Contains;
using dltrain::testing::gradcheck;
using dltrain::testing::gradgradcheck;
using dltrain::testing::leaf;
using V = std::vector<Tensor>;

namespace {

void require_close(const Tensor& a, const std::vector<double>& b, double tol) {
  const std::vector<double> av = a.to_vector<double>();
  REQUIRE(av.size() == b.size());
  for (size_t i = 0; i < av.size(); ++i) REQUIRE(av[i] == Approx(b[i]).margin(tol).epsilon(tol));
}

struct Golden {
  Reduction red;
  bool weighted;  // weight {0.5, 2, 1, 1.5} and label_smoothing 0.2
  std::vector<double> loss, gx, gt;
};

}  // namespace

// Golden values: torch 2.15.0 (/work/main/.venv-peers), float64,
//   x = [[0.5, -1.25, 2, 0], [1.5, 0.25, -0.75, -2], [-0.5, 0.75, 1, 0.125]]
//   t = [[0.1, 0.2, 0.3, 0.4], [0, 1, 0, 0], [0.25, 0.25, 0.5, 0]]
//   l = F.cross_entropy(x, t, weight=w, reduction=red, label_smoothing=ls)
//   l.backward(ones_like(l)); print(l, x.grad, t.grad)
// (the mean reduction with weights divides by N = 3, not by the weights: 2.52 = 7.56 / 3).
TEST_CASE("cross_entropy with class probabilities matches PyTorch", "[ops][loss][soft]") {
  const Tensor x0 =
      tensor({0.5, -1.25, 2.0, 0.0, 1.5, 0.25, -0.75, -2.0, -0.5, 0.75, 1.0, 0.125}, DType::f64)
          .reshape({3, 4});
  const Tensor t0 =
      tensor({0.1, 0.2, 0.3, 0.4, 0.0, 1.0, 0.0, 0.0, 0.25, 0.25, 0.5, 0.0}, DType::f64)
          .reshape({3, 4});
  const Tensor w = tensor({0.5, 2.0, 1.0, 1.5}, DType::f64);
  const std::vector<double> gx_plain_sum{
      0.059693550032108245, -0.1722494220673196, 0.41569683778238437,  -0.303140965747173,
      0.7031847353455322,   -0.7985342002446417, 0.07411512582915888,  0.021234339069950595,
      -0.15775144314912268, 0.07197910074047803, -0.08657065100696337, 0.17234299341560813};
  const std::vector<double> gt_plain_sum{
      1.8344986126036624,  3.5844986126036624, 0.33449861260366254, 2.3344986126036624,
      0.35213564026212013, 1.60213564026212,   2.6021356402621203,  3.8521356402621203,
      2.383268640076796,   1.133268640076796,  0.883268640076796,   1.758268640076796};
  const std::vector<double> gx_w_sum{
      0.147392421542704,     -0.3830917313495351, 0.6618767942505712,   -0.4261774844437401,
      1.2758917603892346,    -1.3272882704525875, 0.08711298278394394,  -0.035716472720591405,
      -0.018914159621491088, -0.1297240341484503, 0.025443751341992074, 0.12319444242794933};
  const std::vector<double> gt_w_sum{0.733799445041465,  5.73519778016586,    0.26759889008293003,
                                     2.801398335124395,  0.14085425610484806, 2.563417024419392,
                                     2.0817085122096963, 4.622562768314545,   0.9533074560307185,
                                     1.8132298241228737, 0.7066149120614368,  2.109922368092155};
  auto third = [](std::vector<double> v) {
    for (double& e : v) e /= 3.0;
    return v;
  };
  const std::vector<Golden> cases{
      {Reduction::Mean, false, {1.6191342976475263}, third(gx_plain_sum), third(gt_plain_sum)},
      {Reduction::Mean, true, {2.5209060084453694}, third(gx_w_sum), third(gt_w_sum)},
      {Reduction::Sum, false, {4.857402892942579}, gx_plain_sum, gt_plain_sum},
      {Reduction::Sum, true, {7.562718025336109}, gx_w_sum, gt_w_sum},
      {Reduction::None,
       false,
       {1.9344986126036625, 1.60213564026212, 1.3207686400767962},
       gx_plain_sum,
       gt_plain_sum},
      {Reduction::None,
       true,
       {3.0173831547628716, 3.151450934484922, 1.3938839360883155},
       gx_w_sum,
       gt_w_sum},
  };
  for (const Golden& c : cases) {
    INFO("reduction " << static_cast<int>(c.red) << " weighted " << c.weighted);
    Tensor x = x0.clone().requires_grad_();
    Tensor t = t0.clone().requires_grad_();
    CrossEntropyOptions o;
    o.reduction = c.red;
    if (c.weighted) {
      o.weight = w;
      o.label_smoothing = 0.2;
    }
    Tensor l = cross_entropy(x, t, o);
    REQUIRE(l.shape() == (c.red == Reduction::None ? Shape{3} : Shape{}));
    require_close(l, c.loss, 1e-13);
    l.backward(ones_like(l));
    require_close(x.grad(), c.gx, 1e-13);
    require_close(t.grad(), c.gt, 1e-13);
  }
  // Through nn-style f32 inputs the same loss to f32 precision.
  REQUIRE(cross_entropy(x0.to(DType::f32), t0.to(DType::f32)).item() ==
          Approx(1.6191342976475263).epsilon(1e-6));
  // Unbatched: logits [C] with probabilities [C] is sample 0 of the batch.
  CrossEntropyOptions none;
  none.reduction = Reduction::None;
  Tensor u = cross_entropy(x0.select(0, 0), t0.select(0, 0), none);
  REQUIRE(u.dim() == 0);
  REQUIRE(u.item() == Approx(1.9344986126036625).epsilon(1e-14));
  REQUIRE(cross_entropy(x0.select(0, 0), t0.select(0, 0)).item() ==
          Approx(1.9344986126036625).epsilon(1e-14));
}

// Golden values: torch 2.15.0, float64,
//   x4 = sin(0.37 * arange(24).reshape(2, 3, 2, 2)) * 2
//   t4 = |cos(0.53 * arange(24))|.reshape(2, 3, 2, 2), normalised over dim 1
//   F.cross_entropy(x4, t4, weight=[1, 0.5, 2], label_smoothing=0.1) and x4.grad
TEST_CASE("cross_entropy with class probabilities over spatial dims matches PyTorch",
          "[ops][loss][soft]") {
  const Tensor ar = arange(24.0, DType::f64).reshape({2, 3, 2, 2});
  Tensor x = mul(sin(mul(ar, 0.37)), 2.0).requires_grad_();
  Tensor t = abs(cos(mul(ar, 0.53)));
  t = div(t, sum(t, {1}, true));
  CrossEntropyOptions o;
  o.weight = tensor({1.0, 0.5, 2.0}, DType::f64);
  o.label_smoothing = 0.1;
  Tensor l = cross_entropy(x, t, o);
  REQUIRE(l.item() == Approx(2.060579632353719).epsilon(1e-13));
  l.backward();
  require_close(
      x.grad(),
      {-0.046923460732042885, -0.03585546847462266,  0.023869467193790513,  0.09903528712903066,
       0.08673946946757229,   0.043979898325104384,  0.040587824353541066,  0.02065726349082975,
       -0.03981600873552942,  -0.00812442985048171,  -0.06445729154733157,  -0.1196925506198604,
       -0.0582629909028846,   -0.051835690426414636, -0.024990262595659497, -0.005437336140782856,
       -0.009077837023483457, -0.016748422412519108, 0.0011821166180461342, 0.042125561452777883,
       0.06734082792636806,   0.06858411283893374,   0.02380814597761336,   -0.03668822531199502},
      1e-13);
  o.reduction = Reduction::None;
  REQUIRE(cross_entropy(x, t, o).shape() == Shape{2, 2, 2});
}

TEST_CASE("cross_entropy with one-hot probabilities equals the class-index path",
          "[ops][loss][soft]") {
  Generator g(11);
  const std::vector<int64_t> tv{0, 3, 2, 2, 1, 3};
  const Tensor idx = from_vector<int64_t>(tv, {6});
  for (DType dt : {DType::f64, DType::f32}) {
    INFO("dtype " << dt);
    const Tensor x = randn({6, 4}, dt, &g);
    const Tensor oh = one_hot(idx, 4).to(dt);
    const double ulp = dt == DType::f64 ? 1e-15 : 1e-6;
    for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      for (bool weighted : {false, true}) {
        CrossEntropyOptions o;
        o.reduction = r;
        if (weighted) {
          o.label_smoothing = 0.15;
          o.weight = tensor({0.5, 2.0, 1.0, 3.0}, dt);
          // With weights the index path's mean divides by sum_i w[t_i], the soft path by N.
          if (r == Reduction::Mean) continue;
        }
        Tensor xi = x.clone().requires_grad_(), xs = x.clone().requires_grad_();
        Tensor li = cross_entropy(xi, idx, o), ls = cross_entropy(xs, oh, o);
        REQUIRE(allclose(ls, li, 4 * ulp, 4 * ulp));
        li.backward(ones_like(li));
        ls.backward(ones_like(ls));
        REQUIRE(allclose(xs.grad(), xi.grad(), 4 * ulp, 4 * ulp));
      }
    }
  }
}

TEST_CASE("cross_entropy with class probabilities: gradients of every order",
          "[ops][loss][soft][grad]") {
  const Tensor w4 = tensor({0.5, 2.0, 1.0, 3.0}, DType::f64);
  const Tensor w3 = tensor({1.0, 0.5, 2.0}, DType::f64);
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (bool smooth_weight : {false, true}) {
      INFO("reduction " << static_cast<int>(r) << " smoothing+weight " << smooth_weight);
      CrossEntropyOptions o;
      o.reduction = r;
      if (smooth_weight) o.label_smoothing = 0.15;
      // 2-d: logits and an arbitrary (not normalised) target, both differentiated.
      o.weight = smooth_weight ? w4 : Tensor();
      auto f2 = [&](const V& v) { return cross_entropy(v[0], v[1], o); };
      const V in2{leaf({5, 4}, 1), leaf({5, 4}, 2, 0.5)};
      gradcheck(f2, in2);
      gradgradcheck(f2, in2);
      // 4-d [N, C, H, W] with the class dim strided (a transposed view).
      o.weight = smooth_weight ? w3 : Tensor();
      auto f4 = [&](const V& v) {
        return cross_entropy(v[0].transpose(1, 3), softmax(v[1], 1), o);
      };
      const V in4{leaf({2, 2, 3, 3}, 3), leaf({2, 3, 3, 2}, 4)};
      gradcheck(f4, in4);
      gradgradcheck(f4, in4);
    }
  }
  // Unbatched, logits only.
  Tensor t = softmax(dltrain::testing::rnd({5}, 9), 0);
  auto fu = [&](const V& v) { return cross_entropy(v[0], t); };
  gradcheck(fu, {leaf({5}, 5)});
  gradgradcheck(fu, {leaf({5}, 5)});
}

TEST_CASE("cross_entropy with class probabilities under autocast runs in f32",
          "[ops][loss][soft][amp]") {
  const Tensor x = dltrain::testing::rnd({4, 5}, 21, DType::f32);
  const Tensor t = softmax(dltrain::testing::rnd({4, 5}, 22, DType::f32), 1);
  for (DType low : {DType::bf16, DType::f16}) {
    INFO("autocast " << low);
    Tensor xl = x.to(low).requires_grad_();
    Tensor loss;
    {
      amp::autocast ac(DeviceType::CPU, low);
      loss = cross_entropy(xl, t.to(low));
    }
    CHECK(loss.dtype() == DType::f32);
    loss.backward();
    CHECK(xl.grad().dtype() == low);
    // The same as the casts written out.
    Tensor xr = x.to(low).requires_grad_();
    Tensor ref = cross_entropy(xr.to(DType::f32), t.to(low).to(DType::f32));
    ref.backward();
    CHECK(allclose(loss, ref, 0, 0));
    CHECK(allclose(xl.grad(), xr.grad(), 0, 0));
  }
}

TEST_CASE("cross_entropy with class probabilities: errors", "[ops][loss][soft][errors]") {
  const Tensor x = randn({3, 4});
  // Probabilities must have the input's shape.
  REQUIRE_THROWS_WITH(cross_entropy(x, rand({3, 5})), Contains("cross_entropy") &&
                                                          Contains("[3, 5]") &&
                                                          Contains("[3, 4]") && Contains("int64"));
  // An integer target of the input's shape: probabilities in the wrong dtype.
  REQUIRE_THROWS_WITH(cross_entropy(x, ones({3, 4}, DType::i64)),
                      Contains("class probabilities") && Contains("f32"));
  // A class ignore_index has no meaning for probabilities (PyTorch refuses it too).
  CrossEntropyOptions o;
  o.ignore_index = 1;
  REQUIRE_THROWS_WITH(cross_entropy(x, rand({3, 4}), o), Contains("ignore_index"));
  o = CrossEntropyOptions{};
  o.weight = ones({5});
  REQUIRE_THROWS_WITH(cross_entropy(x, rand({3, 4}), o), Contains("weight") && Contains("[4]"));
  o = CrossEntropyOptions{};
  o.label_smoothing = 1.5;
  REQUIRE_THROWS_WITH(cross_entropy(x, rand({3, 4}), o), Contains("label_smoothing"));
  // Negative or unnormalised probabilities are not checked (as in PyTorch): the formula applies.
  const Tensor tneg = tensor({-0.5f, 1.0f, 0.25f, 0.0f}).reshape({1, 4});
  const Tensor x1 = x.narrow(0, 0, 1);
  const double manual = -sum(mul(tneg, log_softmax(x1, 1))).item();
  REQUIRE(cross_entropy(x1, tneg).item() == Approx(manual).epsilon(1e-6));
}
