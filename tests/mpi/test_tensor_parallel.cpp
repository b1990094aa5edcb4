// Tensor parallelism on 2, 3 and 4 ranks (the default group as the tensor-parallel group):
// the region operators pass the f64 gradient checks (first and second order) of the global
// function they compute; ColumnParallelLinear and RowParallelLinear equal nn::Linear built from
// the same seed, forward and backward (input gradients and gathered weight gradients), within
// the bounds of the arithmetic; state dicts gather to the ordinary layer's names and shapes and
// load back; sizes that do not divide fail with a message.
//
// Bounds: two evaluations of the same K-term sum in different orders (GEMM blocking, the
// partial sums of a row-parallel layer added by the all-reduce) each differ from the exact sum
// by at most K * u * sum |terms| (u = 2^-53 in f64, first order; Higham 3.1), so from each
// other by at most 2 * K * u * sum |terms|, element by element. sum |terms| is the same product
// on the absolute values (|x| |W|^T + |b|), which the tests compute.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <string>

#include "dltrain/dltrain.hpp"
#include "tests/gradcheck.hpp"

using namespace dltrain;
using namespace dltrain::distributed;

namespace {

constexpr double kU = 0x1p-53;  // unit roundoff of f64
const TensorOptions kF64(DType::f64);

// Sizes divisible by 2, 3 and 4.
constexpr int64_t kIn = 12, kOut = 24, kBatch = 2, kSeq = 5;

// Replicated random values (the same seed on every rank).
Tensor replicated(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, DType::f64, &g);
}

Tensor leaf_of(const Tensor& t) {
  Tensor l = t.detach().clone();
  l.requires_grad_();
  return l;
}

// Checks |got - want| <= bound element by element; prints the worst ratio.
void check_within(const char* what, const Tensor& got, const Tensor& want, const Tensor& bound) {
  REQUIRE(got.defined());
  REQUIRE(got.shape() == want.shape());
  const Tensor err = abs(sub(got, want));
  // Where the bound is 0 (an exact zero) the values must be equal.
  const double worst = max(sub(err, bound)).item<double>();
  const double ratio = max(div(err, add(bound, 1e-300))).item<double>();
  if (rank() == 0) std::printf("  %-44s max err / bound = %.3g\n", what, ratio);
  INFO(what << ": worst excess " << worst);
  CHECK(worst <= 0.0);
}

// Bound of two orders of a K-term sum whose absolute terms sum to `abs_sum`.
Tensor sum_bound(const Tensor& abs_sum, int64_t terms) {
  return mul(abs_sum, 2.0 * static_cast<double>(terms) * kU);
}

// Bounds of y = x W^T + b and its gradients for an incoming gradient gy, where the two sides
// may each sum in any order, with `extra` terms more (the p partial sums of a row-parallel
// layer, the bias).
struct LinearBounds {
  Tensor y, dx, dw, db;
};
LinearBounds linear_bounds(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& gy,
                           int64_t extra) {
  const Tensor ax = abs(x), aw = abs(w), ag = abs(gy);
  const int64_t rows = x.numel() / x.size(-1);
  LinearBounds lb;
  lb.y = sum_bound(linear(ax, aw, b.defined() ? abs(b) : Tensor()), x.size(-1) + extra);
  lb.dx = sum_bound(matmul(ag, aw), w.size(0) + extra);
  const Tensor ag2 = ag.reshape({rows, w.size(0)}), ax2 = ax.reshape({rows, w.size(1)});
  lb.dw = sum_bound(matmul(ag2.t(), ax2), rows + extra);
  lb.db = sum_bound(sum(ag2, {0}), rows + extra);
  return lb;
}

// Same shape and bit-identical values.
bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && (a.numel() == 0 || max(abs(sub(a, b))).item<double>() == 0.0);
}

const Tensor& grad_named(const nn::NamedTensors& grads, const std::string& name) {
  for (const auto& [n, g] : grads)
    if (n == name) return g;
  FAIL("no gradient named " << name);
  static Tensor none;
  return none;
}

}  // namespace

TEST_CASE("tensor parallel: f, g, scatter and gather pass the f64 gradient checks", "[mpi][tp]") {
  ProcessGroup& g = default_group();
  const int64_t p = g.size(), r = g.rank(), m = kOut / p, k = kIn / p;
  const Tensor x = testing::leaf({3, kIn}, 1), w = testing::leaf({kOut, kIn}, 2),
               w2 = testing::leaf({4, kOut}, 3);
  // Every input is replicated and perturbed alike on every rank, and every output is
  // replicated, so the checks see the global function. A rank's slice of a replicated weight
  // goes through f, whose backward sums the ranks' slices into the full gradient.
  // Column (f, this rank's rows of w1), tanh, row (this rank's columns of w2, g): the MLP's
  // pattern.
  auto column_row = [&](const std::vector<Tensor>& in) {
    const Tensor w1 = copy_to_tensor_parallel_region(in[1], g).narrow(0, r * m, m);
    const Tensor w2 = copy_to_tensor_parallel_region(in[2], g).narrow(1, r * m, m);
    const Tensor h = tanh(linear(copy_to_tensor_parallel_region(in[0], g), w1));
    return reduce_from_tensor_parallel_region(linear(h, w2), g);
  };
  auto gathered = [&](const std::vector<Tensor>& in) {
    const Tensor wl = copy_to_tensor_parallel_region(in[1], g).narrow(0, r * m, m);
    return gather_from_tensor_parallel_region(
        tanh(linear(copy_to_tensor_parallel_region(in[0], g), wl)), g);
  };
  auto scattered = [&](const std::vector<Tensor>& in) {
    const Tensor wl = copy_to_tensor_parallel_region(in[1], g).narrow(1, r * k, k);
    return reduce_from_tensor_parallel_region(
        linear(tanh(scatter_to_tensor_parallel_region(in[0], g)), wl), g);
  };
  for (const auto& [name, f] :
       {std::pair<const char*, std::function<Tensor(const std::vector<Tensor>&)>>{"f and g",
                                                                                  column_row},
        {"gather", gathered},
        {"scatter", scattered}}) {
    INFO(name);
    // gradcheck FAILs, naming the element, beyond its tolerance.
    testing::gradcheck(f, {x, w, w2});
    testing::gradgradcheck(f, {x, w, w2});
  }
  // Misuse.
  CHECK_THROWS_WITH(scatter_to_tensor_parallel_region(zeros({2, p * 3 + 1}, kF64), g),
                    Catch::Contains("must be divisible by the group size"));
}

TEST_CASE("tensor parallel: ColumnParallelLinear equals nn::Linear from the same seed",
          "[mpi][tp]") {
  ProcessGroup& g = default_group();
  const int64_t p = g.size(), r = g.rank(), m = kOut / p;
  manual_seed(5);
  nn::Linear ref(kIn, kOut, true, kF64);
  for (const bool gather : {true, false}) {
    INFO("gather_output " << gather);
    manual_seed(5);
    ColumnParallelLinear tp(kIn, kOut, g, {.gather_output = gather}, kF64);
    // Built from the same seed: exactly the ordinary layer's rows.
    CHECK(same(tp.weight, ref.weight.narrow(0, r * m, m)));
    CHECK(same(tp.bias, ref.bias.narrow(0, r * m, m)));
    CHECK(tp.weight.shape() == Shape{m, kIn});

    const Tensor x0 = replicated({kBatch, kSeq, kIn}, 7), gy = replicated({kBatch, kSeq, kOut}, 8);
    Tensor xr = leaf_of(x0), xt = leaf_of(x0);
    ref.zero_grad();
    tp.zero_grad();
    const Tensor yr = ref(xr);
    sum(mul(yr, gy)).backward();
    const Tensor yt = tp(xt);
    // Without gather each rank holds its block and its block of the loss: the input gradient
    // is the sum over the ranks (f's all-reduce), the weight gradients are the blocks'.
    const Tensor gyt = gather ? gy : gy.narrow(2, r * m, m);
    sum(mul(yt, gyt)).backward();

    const LinearBounds lb = linear_bounds(x0, ref.weight, ref.bias, gy, 1 + p);
    if (r == 0)
      std::printf("ColumnParallelLinear (gather_output %d) on %lld ranks\n", gather,
                  static_cast<long long>(p));
    check_within("forward", yt, gather ? yr.detach() : yr.detach().narrow(2, r * m, m),
                 gather ? lb.y : lb.y.narrow(2, r * m, m));
    check_within("input gradient", xt.grad(), xr.grad(), lb.dx);
    const nn::NamedTensors grads = gather_grads(tp);
    check_within("weight gradient (gathered)", grad_named(grads, "weight"), ref.weight.grad(),
                 lb.dw);
    check_within("bias gradient (gathered)", grad_named(grads, "bias"), ref.bias.grad(), lb.db);
  }
}

TEST_CASE("tensor parallel: RowParallelLinear equals nn::Linear from the same seed", "[mpi][tp]") {
  ProcessGroup& g = default_group();
  const int64_t p = g.size(), r = g.rank(), k = kOut / p;
  manual_seed(6);
  nn::Linear ref(kOut, kIn, true, kF64);
  for (const bool parallel_in : {false, true}) {
    INFO("input_is_parallel " << parallel_in);
    manual_seed(6);
    RowParallelLinear tp(kOut, kIn, g, {.input_is_parallel = parallel_in}, kF64);
    CHECK(same(tp.weight, ref.weight.narrow(1, r * k, k)));
    CHECK(same(tp.bias, ref.bias));

    const Tensor x0 = replicated({kBatch, kSeq, kOut}, 9), gy = replicated({kBatch, kSeq, kIn}, 10);
    Tensor xr = leaf_of(x0), xt = leaf_of(parallel_in ? x0.narrow(2, r * k, k) : x0);
    ref.zero_grad();
    tp.zero_grad();
    const Tensor yr = ref(xr);
    sum(mul(yr, gy)).backward();
    const Tensor yt = tp(xt);
    sum(mul(yt, gy)).backward();

    const LinearBounds lb = linear_bounds(x0, ref.weight, ref.bias, gy, 1 + p);
    if (r == 0)
      std::printf("RowParallelLinear (input_is_parallel %d) on %lld ranks\n", parallel_in,
                  static_cast<long long>(p));
    check_within("forward", yt, yr.detach(), lb.y);
    check_within("input gradient", xt.grad(),
                 parallel_in ? xr.grad().narrow(2, r * k, k) : xr.grad(),
                 parallel_in ? lb.dx.narrow(2, r * k, k) : lb.dx);
    const nn::NamedTensors grads = gather_grads(tp);
    check_within("weight gradient (gathered)", grad_named(grads, "weight"), ref.weight.grad(),
                 lb.dw);
    check_within("bias gradient", grad_named(grads, "bias"), ref.bias.grad(), lb.db);
  }
}

TEST_CASE("tensor parallel: column then row (one all-reduce each way) equals two nn::Linear",
          "[mpi][tp]") {
  ProcessGroup& g = default_group();
  const int64_t p = g.size();
  manual_seed(7);
  nn::Linear ref1(kIn, kOut, true, kF64), ref2(kOut, kIn, true, kF64);
  ColumnParallelLinear tp1(ref1, g, /*gather_output=*/false);
  RowParallelLinear tp2(ref2, g, /*input_is_parallel=*/true);
  const Tensor x0 = replicated({kBatch, kSeq, kIn}, 11), gy = replicated({kBatch, kSeq, kIn}, 12);
  Tensor xr = leaf_of(x0), xt = leaf_of(x0);
  const Tensor hr = ref1(xr), yr = ref2(hr);
  sum(mul(yr, gy)).backward();
  const Tensor yt = tp2(tp1(xt));
  sum(mul(yt, gy)).backward();
  // The hidden layer's error (bounded as ColumnParallelLinear's) passes through |W2|, then
  // the second layer adds its own.
  const LinearBounds b1 = linear_bounds(x0, ref1.weight, ref1.bias, matmul(gy, ref2.weight), 1);
  const LinearBounds b2 = linear_bounds(hr.detach(), ref2.weight, ref2.bias, gy, 1 + p);
  if (g.rank() == 0) std::printf("Column -> Row on %lld ranks\n", static_cast<long long>(p));
  check_within("forward", yt, yr.detach(), add(b2.y, linear(b1.y, abs(ref2.weight))));
  // dx = (gy W2) W1: the inner product's error through |W1|, then the outer one's.
  check_within("input gradient", xt.grad(), xr.grad(), add(b1.dx, matmul(b2.dx, abs(ref1.weight))));
  StateDict full = gather_state_dict(tp1);
  CHECK(same(full.at("weight"), ref1.weight));
}

TEST_CASE("tensor parallel: linear state dicts gather to the ordinary layer's and load back",
          "[mpi][tp]") {
  ProcessGroup& g = default_group();
  const int64_t p = g.size();
  // A model mixing ordinary and tensor-parallel layers, as a Sequential.
  manual_seed(8);
  auto ref = std::make_shared<nn::Sequential>();
  ref->push_back(std::make_shared<nn::Linear>(kIn, kOut, true, kF64))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::Linear>(kOut, kIn, true, kF64))
      .push_back(std::make_shared<nn::Linear>(kIn, 3, true, kF64));
  manual_seed(8);
  auto tp = std::make_shared<nn::Sequential>();
  tp->push_back(std::make_shared<nn::ColumnParallelLinear>(
                    kIn, kOut, g, nn::ColumnParallelLinearOptions{.gather_output = false}, kF64))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::RowParallelLinear>(
          kOut, kIn, g, nn::RowParallelLinearOptions{.input_is_parallel = true}, kF64))
      .push_back(std::make_shared<nn::Linear>(kIn, 3, true, kF64));

  // Gathered: the ordinary names, shapes and (built from the same seed) values, on every rank.
  const StateDict full = gather_state_dict(*tp), want = ref->state_dict();
  REQUIRE(full.keys() == want.keys());
  for (const auto& [name, t] : want) {
    INFO(name);
    CHECK(full.at(name).shape() == t.shape());
    CHECK(same(full.at(name), t));
  }
  // The per-rank state dict holds the blocks.
  CHECK(tp->state_dict().at("0.weight").shape() == Shape{kOut / p, kIn});
  CHECK(tp->state_dict().at("2.weight").shape() == Shape{kIn, kOut / p});

  // Saved gathered, loaded by one process: same outputs (the bound of the pair, as above, is
  // far below 1e-13 for these sizes; equality of the weights is exact).
  manual_seed(99);
  auto single = std::make_shared<nn::Sequential>();
  single->push_back(std::make_shared<nn::Linear>(kIn, kOut, true, kF64))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::Linear>(kOut, kIn, true, kF64))
      .push_back(std::make_shared<nn::Linear>(kIn, 3, true, kF64));
  single->load_state_dict(full);
  const Tensor x = replicated({4, kIn}, 13);
  CHECK(same(single->forward(x), ref->forward(x)));

  // An ordinary state dict (another seed) loaded into the tensor-parallel model: its slices,
  // and it gathers back to the same values.
  manual_seed(100);
  nn::Sequential other;
  other.push_back(std::make_shared<nn::Linear>(kIn, kOut, true, kF64))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::Linear>(kOut, kIn, true, kF64))
      .push_back(std::make_shared<nn::Linear>(kIn, 3, true, kF64));
  load_full_state_dict(*tp, other.state_dict());
  for (const auto& [name, t] : gather_state_dict(*tp)) {
    INFO(name);
    CHECK(same(t, other.state_dict().at(name)));
  }
  const Tensor yo = other.forward(x), yt = tp->forward(x);
  const double rel = max(abs(sub(yt, yo))).item<double>() / max(abs(yo)).item<double>();
  // Three layers of at most 24 terms each: 2 * (24 + 4 + 1) * 3 u relative to the largest
  // |term| sums, which for these O(1) weights are within 10 x the largest output.
  CHECK(rel <= 10 * 2 * (kOut + 4 + 1) * 3 * kU);

  // A full tensor of the wrong shape names the parameter; strict loading names missing keys.
  StateDict wrong = other.state_dict();
  wrong.insert("0.weight", zeros({kOut + p, kIn}, kF64));
  CHECK_THROWS_WITH(
      load_full_state_dict(*tp, wrong),
      Catch::Contains("parameter 'weight'") && Catch::Contains("same model configuration"));
  StateDict partial;
  for (const auto& [name, t] : other.state_dict())
    if (name != "2.weight") partial.insert(name, t);
  CHECK_THROWS_WITH(load_full_state_dict(*tp, partial), Catch::Contains("2.weight"));
}

TEST_CASE("tensor parallel: sizes not divisible by the group size are refused", "[mpi][tp]") {
  ProcessGroup& g = default_group();
  const int64_t bad = 4 * 3 + 1;  // divisible by none of 2, 3, 4
  REQUIRE(g.size() > 1);
  CHECK_THROWS_WITH(ColumnParallelLinear(kIn, bad, g, {}, kF64),
                    Catch::Contains("ColumnParallelLinear: out_features (13) must be divisible "
                                    "by the tensor-parallel group size"));
  CHECK_THROWS_WITH(RowParallelLinear(bad, kIn, g, {}, kF64),
                    Catch::Contains("RowParallelLinear: in_features (13) must be divisible"));
  RowParallelLinear row(kOut, kIn, g, {.input_is_parallel = true}, kF64);
  CHECK_THROWS_WITH(row(zeros({2, kOut}, kF64)), Catch::Contains("input_is_parallel is set"));
}
