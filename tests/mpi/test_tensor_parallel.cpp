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

// --- blocks ------------------------------------------------------------------------------------

namespace {

// Sizes of the blocks: heads and features divisible by 2, 3 and 4.
constexpr int64_t kE = 24, kHeads = 12, kF = 48, kL = 5, kN = 2;

// Norm-wise bound for the blocks with softmax and layer norms, where an element-wise chain
// is not worth its length: two evaluations that sum each of the T terms of the path (all the
// reductions a value goes through, one after the other) in other orders differ by at most
// 2 T u times the magnitude of the terms; the magnitude is taken as max |reference| times a
// gain G = 64 that covers what the nonlinear stages and cancellation may amplify: softmax
// (<= 2 in the max norm), the layer norms (|gamma| / sigma, 1 with their default init on
// unit-variance inputs), the residual adds (2), and sums of random-sign terms whose absolute sum
// exceeds the result (about sqrt(K) <= 7 for K <= 48), with a factor 2 of margin: 2*1*2*7*2 = 56.
void check_norm(const char* what, const Tensor& got, const Tensor& want, int64_t terms) {
  REQUIRE(got.defined());
  REQUIRE(got.shape() == want.shape());
  const double scale = max(abs(want)).item<double>();
  const double bound = 2.0 * static_cast<double>(terms) * kU * scale * 64.0;
  const double err = max(abs(sub(got, want))).item<double>();
  if (rank() == 0)
    std::printf("  %-44s max err %.3g, bound %.3g (ratio %.3g)\n", what, err, bound, err / bound);
  INFO(what << ": max err " << err << " bound " << bound);
  CHECK(err <= bound);
}

// The gathered gradients of a tensor-parallel module against the ordinary one's, by name.
void check_grads(const nn::Module& tp, const nn::Module& ref, int64_t terms) {
  const nn::NamedTensors grads = gather_grads(tp), want = ref.named_parameters();
  REQUIRE(grads.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    REQUIRE(grads[i].first == want[i].first);
    check_norm((want[i].first + " gradient").c_str(), grads[i].second, want[i].second.grad(),
               terms);
  }
}

}  // namespace

TEST_CASE("tensor parallel: TensorParallelMLP equals linear1, gelu, linear2", "[mpi][tp]") {
  ProcessGroup& g = default_group();
  const int64_t p = g.size();
  manual_seed(21);
  nn::Linear l1(kE, kF, true, kF64), l2(kF, kE, true, kF64);
  manual_seed(21);
  TensorParallelMLP tp(kE, kF, g, {.activation = "gelu"}, kF64);
  CHECK(tp.linear1->weight.shape() == Shape{kF / p, kE});
  // The ordinary pair's state dict under the block's names.
  StateDict want;
  want.merge(l1.state_dict(), "linear1.");
  want.merge(l2.state_dict(), "linear2.");
  const StateDict full = gather_state_dict(tp);
  REQUIRE(full.keys() == want.keys());
  for (const auto& [name, t] : want) CHECK(same(full.at(name), t));

  const Tensor x0 = replicated({kN, kL, kE}, 22), gy = replicated({kN, kL, kE}, 23);
  Tensor xr = leaf_of(x0), xt = leaf_of(x0);
  const Tensor yr = l2(gelu(l1(xr)));
  sum(mul(yr, gy)).backward();
  const Tensor yt = tp(xt);
  sum(mul(yt, gy)).backward();
  // Element-wise: the hidden pre-activation h as a column layer's output (E + 1 terms), gelu
  // 1.13-Lipschitz with |gelu''| <= 0.8, its own evaluation within 8 u of its value, then
  // linear2's bound; backward the same chain in reverse (dz = gelu'(h) (gy W2)).
  Tensor h = linear(x0, l1.weight, l1.bias).detach();
  h.requires_grad_();
  const Tensor a = gelu(h);
  const Tensor dgelu = autograd::grad({sum(a)}, {h})[0];
  const Tensor da = matmul(gy, l2.weight), dz = mul(da, dgelu);
  const LinearBounds b1 = linear_bounds(x0, l1.weight, l1.bias, dz, 1 + p);
  const LinearBounds b2 = linear_bounds(a.detach(), l2.weight, l2.bias, gy, 1 + p);
  const Tensor ba = add(mul(b1.y, 1.13), mul(abs(a.detach()), 8 * kU));  // error of a
  const Tensor bdz = add(add(mul(b2.dx, 1.13), mul(mul(b1.y, abs(da)), 0.8)), mul(abs(dz), 8 * kU));
  if (g.rank() == 0) std::printf("TensorParallelMLP on %lld ranks\n", static_cast<long long>(p));
  check_within("forward", yt, yr.detach(), add(b2.y, linear(ba, abs(l2.weight))));
  check_within("input gradient", xt.grad(), xr.grad(), add(b1.dx, matmul(bdz, abs(l1.weight))));
  const nn::NamedTensors grads = gather_grads(tp);
  const int64_t rows = kN * kL;
  check_within("linear1.weight gradient", grad_named(grads, "linear1.weight"), l1.weight.grad(),
               add(b1.dw, matmul(bdz.reshape({rows, kF}).t(), abs(x0).reshape({rows, kE}))));
  check_within("linear1.bias gradient", grad_named(grads, "linear1.bias"), l1.bias.grad(),
               add(b1.db, sum(bdz.reshape({rows, kF}), {0})));
  check_within("linear2.weight gradient", grad_named(grads, "linear2.weight"), l2.weight.grad(),
               add(b2.dw, matmul(abs(gy).reshape({rows, kE}).t(), ba.reshape({rows, kF}))));
  check_within("linear2.bias gradient", grad_named(grads, "linear2.bias"), l2.bias.grad(), b2.db);

  CHECK_THROWS_WITH(TensorParallelMLP(kE, 4 * 3 + 1, g, {}, kF64),
                    Catch::Contains("TensorParallelMLP: hidden_features (13) must be divisible"));
}

TEST_CASE("tensor parallel: TensorParallelMultiheadAttention equals nn::MultiheadAttention",
          "[mpi][tp]") {
  ProcessGroup& g = default_group();
  const int64_t p = g.size(), r = g.rank();
  struct Case {
    const char* name;
    nn::MultiheadAttentionOptions options;
    bool cross, masks, average;
  };
  const Case cases[] = {
      {"self-attention, seq first, masks, mean weights", {}, false, true, true},
      {"self-attention, batch first, per-head weights", {.batch_first = true}, false, false, false},
      {"cross-attention, kdim/vdim, masks, no bias",
       {.bias = false, .kdim = 8, .vdim = 12, .batch_first = true},
       true,
       true,
       false},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    if (r == 0)
      std::printf("TensorParallelMultiheadAttention on %lld ranks: %s\n", static_cast<long long>(p),
                  c.name);
    manual_seed(31);
    nn::MultiheadAttention ref(kE, kHeads, c.options, kF64);
    manual_seed(31);
    TensorParallelMultiheadAttention tp(kE, kHeads, g, c.options, kF64);
    CHECK(tp.heads_per_rank == kHeads / p);
    const StateDict full = gather_state_dict(tp), want = ref.state_dict();
    REQUIRE(full.keys() == want.keys());
    for (const auto& [name, t] : want) {
      INFO(name);
      CHECK(same(full.at(name), t));
    }
    const bool bf = c.options.batch_first;
    const int64_t S = c.cross ? 7 : kL;
    auto shape = [&](int64_t len, int64_t feat) {
      return bf ? Shape{kN, len, feat} : Shape{len, kN, feat};
    };
    const Tensor q0 = replicated(shape(kL, kE), 32);
    const Tensor k0 = c.cross ? replicated(shape(S, ref.kdim), 33) : q0;
    const Tensor v0 = c.cross ? replicated(shape(S, ref.vdim), 34) : q0;
    Tensor kpm, am;
    if (c.masks) {
      // Key 1 of batch 1 padded; per-head float masks (a different one per head, so that
      // taking another rank's heads would show).
      kpm = zeros({kN, S}, DType::b8);
      kpm.narrow(0, 1, 1).narrow(1, 1, 1).fill_(1.0);
      am = mul(replicated({kN * kHeads, kL, S}, 35), 0.5);
    }
    auto run = [&](auto& m, bool leaf_k) {
      Tensor q = leaf_of(q0), k = leaf_k ? leaf_of(k0) : q, v = leaf_k ? leaf_of(v0) : q;
      auto [out, w] = m(q, k, v, kpm, true, am, c.average);
      const Tensor gy = replicated(out.shape(), 36), gw = replicated(w.shape(), 37);
      add(sum(mul(out, gy)), sum(mul(w, gw))).backward();
      return std::vector<Tensor>{out.detach(), w.detach(), q.grad(), leaf_k ? k.grad() : Tensor(),
                                 leaf_k ? v.grad() : Tensor()};
    };
    ref.zero_grad();
    const std::vector<Tensor> want_v = run(ref, c.cross);
    const std::vector<Tensor> got_v = run(tp, c.cross);
    // The path: projection (E + 1), scores (D), softmax (S), weights times values (S),
    // out_proj (E + p + 1); backward goes through it once more.
    const int64_t T = kE + 1 + kE / kHeads + 2 * S + kE + p + 1;
    check_norm("output", got_v[0], want_v[0], T);
    check_norm("attention weights", got_v[1], want_v[1], T);
    check_norm("query gradient", got_v[2], want_v[2], 2 * T);
    if (c.cross) {
      check_norm("key gradient", got_v[3], want_v[3], 2 * T);
      check_norm("value gradient", got_v[4], want_v[4], 2 * T);
    }
    check_grads(tp, ref, 2 * T);
  }
  CHECK_THROWS_WITH(TensorParallelMultiheadAttention(26, 13, g, {}, kF64),
                    Catch::Contains("num_heads (13) must be divisible by the tensor-parallel"));
}

TEST_CASE("tensor parallel: TensorParallelTransformerEncoderLayer equals the ordinary layer",
          "[mpi][tp]") {
  ProcessGroup& g = default_group();
  const int64_t p = g.size();
  for (const bool norm_first : {false, true}) {
    const nn::TransformerEncoderLayerOptions o{.dim_feedforward = kF,
                                               .dropout = 0.0,
                                               .activation = norm_first ? "gelu" : "relu",
                                               .batch_first = true,
                                               .norm_first = norm_first};
    INFO("norm_first " << norm_first);
    if (g.rank() == 0)
      std::printf("TensorParallelTransformerEncoderLayer on %lld ranks, norm_first %d\n",
                  static_cast<long long>(p), norm_first);
    manual_seed(41);
    nn::TransformerEncoderLayer ref(kE, kHeads, o, kF64);
    manual_seed(41);
    TensorParallelTransformerEncoderLayer tp(kE, kHeads, g, o, kF64);
    const StateDict full = gather_state_dict(tp), want = ref.state_dict();
    REQUIRE(full.keys() == want.keys());
    for (const auto& [name, t] : want) {
      INFO(name);
      CHECK(same(full.at(name), t));
    }
    const Tensor x0 = replicated({kN, kL, kE}, 42), gy = replicated({kN, kL, kE}, 43);
    const Tensor causal = nn::generate_square_subsequent_mask(kL, kF64);
    Tensor kpm = zeros({kN, kL}, DType::b8);
    kpm.narrow(0, 0, 1).narrow(1, kL - 1, 1).fill_(1.0);
    Tensor xr = leaf_of(x0), xt = leaf_of(x0);
    ref.zero_grad();
    const Tensor yr = ref(xr, causal, kpm);
    sum(mul(yr, gy)).backward();
    const Tensor yt = tp(xt, causal, kpm);
    sum(mul(yt, gy)).backward();
    // Attention's path, a layer norm (2 E: mean and variance), the feed-forward (E + 1,
    // F + p + 1), the second layer norm; backward once more.
    const int64_t T =
        (kE + 1 + 2 + 2 * kL + kE + p + 1) + 2 * kE + (kE + 1) + (kF + p + 1) + 2 * kE;
    check_norm("forward", yt, yr.detach(), T);
    check_norm("input gradient", xt.grad(), xr.grad(), 2 * T);
    check_grads(tp, ref, 2 * T);

    // Round trips: the gathered state into a single process gives the same outputs (equal
    // weights: equal results); another ordinary layer's state into the tensor-parallel one.
    // Through a file, as a single process (or PyTorch's safetensors) would read it: rank 0
    // writes the gathered state, every rank loads it into an ordinary layer.
    const std::string path = "tp_encoder_layer_np" + std::to_string(p) + ".safetensors";
    on_main_process([&] { io::save_safetensors(path, full); });
    manual_seed(1000);
    nn::TransformerEncoderLayer single(kE, kHeads, o, kF64);
    single.load_state_dict(io::load_safetensors(path));
    barrier();
    on_main_process([&] { std::remove(path.c_str()); });
    CHECK(same(single(x0, causal, kpm), ref(x0, causal, kpm).detach()));
    manual_seed(1001);
    nn::TransformerEncoderLayer other(kE, kHeads, o, kF64);
    load_full_state_dict(tp, other.state_dict());
    for (const auto& [name, t] : gather_state_dict(tp)) {
      INFO(name);
      CHECK(same(t, other.state_dict().at(name)));
    }
    NoGradGuard ng;
    check_norm("forward after loading another state", tp(x0, causal, kpm), other(x0, causal, kpm),
               T);
  }
  CHECK_THROWS_WITH(
      TensorParallelTransformerEncoderLayer(kE, kHeads, g, {.dim_feedforward = 13}, kF64),
      Catch::Contains("dim_feedforward (13) must be divisible by the tensor-parallel group size"));
  CHECK_THROWS_WITH(TensorParallelTransformerEncoderLayer(26, 13, g, {}, kF64),
                    Catch::Contains("nhead (13) must be divisible"));
}

namespace {

// `layers` ordinary encoder layers and their tensor-parallel form over `g`, from the same seed
// (so the same weights), in f64.
std::pair<std::shared_ptr<nn::Sequential>, std::shared_ptr<nn::Sequential>> encoder_pair(
    uint64_t seed, int layers, ProcessGroup& g) {
  const nn::TransformerEncoderLayerOptions o{
      .dim_feedforward = kF, .dropout = 0.0, .activation = "gelu", .batch_first = true};
  auto ref = std::make_shared<nn::Sequential>(), tp = std::make_shared<nn::Sequential>();
  manual_seed(seed);
  for (int i = 0; i < layers; ++i)
    ref->push_back(std::make_shared<nn::TransformerEncoderLayer>(kE, kHeads, o, kF64));
  manual_seed(seed);
  for (int i = 0; i < layers; ++i)
    tp->push_back(std::make_shared<TensorParallelTransformerEncoderLayer>(kE, kHeads, g, o, kF64));
  return {ref, tp};
}

// `steps` SGD steps of both models on replicated batches (x from seed x_seed + step, the
// target from y_seed + step).
void train_both(nn::Module& ref, optim::Optimizer& opt_ref, nn::Module& tp,
                optim::Optimizer& opt_tp, int steps, uint64_t x_seed, uint64_t y_seed) {
  for (int step = 0; step < steps; ++step) {
    const auto k = static_cast<uint64_t>(step);
    const Tensor x = replicated({kN, kL, kE}, x_seed + k), y = replicated({kN, kL, kE}, y_seed + k);
    opt_ref.zero_grad();
    mse_loss(ref.forward(x), y).backward();
    opt_ref.step();
    opt_tp.zero_grad();
    mse_loss(tp.forward(x), y).backward();
    opt_tp.step();
  }
}

// |got - want| / |want| over all the tensors of two state dicts with the same keys.
double relative_diff(const StateDict& got, const StateDict& want) {
  REQUIRE(got.keys() == want.keys());
  double num = 0, den = 0;
  for (const auto& [name, t] : want) {
    const Tensor w = t.to(DType::f64), d = sub(got.at(name).to(DType::f64), w);
    num += sum(mul(d, d)).item<double>();
    den += sum(mul(w, w)).item<double>();
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("tensor parallel: two encoder layers train like one process for 10 SGD steps",
          "[mpi][tp]") {
  // Element-wise optimizers update each shard as the ordinary optimizer updates that block;
  // the replicated parameters get the same gradient on every rank, so they stay replicated.
  // f64, the house bound of 1e-12 relative over all parameters. SGD with momentum, not Adam:
  // the key part of in_proj_bias has an exact gradient of zero (softmax ignores a shift of a
  // row of scores), so what any implementation computes there is rounding noise, which Adam
  // divides by its own square root into up to +-lr per step; two summation orders can then
  // differ by far more than rounding (10 AdamW steps gave 1.1e-12 here, SGD 5e-17).
  ProcessGroup& g = default_group();
  const auto [ref_ptr, tp_ptr] = encoder_pair(51, 2, g);
  nn::Sequential &ref = *ref_ptr, &tp = *tp_ptr;
  const optim::SGDOptions so{.lr = 0.05, .momentum = 0.9};
  optim::SGD opt_ref(ref.parameters(), so), opt_tp(tp.parameters(), so);
  train_both(ref, opt_ref, tp, opt_tp, 10, 60, 80);
  const double rel = relative_diff(gather_state_dict(tp), ref.state_dict());
  if (g.rank() == 0)
    std::printf("two TP encoder layers, 10 SGD steps on %d ranks: relative difference %.3g\n",
                g.size(), rel);
  CHECK(rel < 1e-12);
}

// The optimizer state of a tensor-parallel model gathers to the ordinary model's optimizer
// state: SGD momentum buffers of sharded weights are the blocks of the ordinary buffers, so
// after the same steps they agree to the training bound above (1e-12 relative); slicing and
// gathering move values only, so the round trips are exact.
TEST_CASE("tensor parallel: the optimizer state gathers to one process's and loads back",
          "[mpi][tp]") {
  ProcessGroup& g = default_group();
  const auto [ref_ptr, tp_ptr] = encoder_pair(52, 1, g);
  nn::Sequential &ref = *ref_ptr, &tp = *tp_ptr;
  const optim::SGDOptions so{.lr = 0.05, .momentum = 0.9};
  optim::SGD opt_ref(optim::param_groups_no_decay(ref, 0.01), so);
  optim::SGD opt_tp(optim::param_groups_no_decay(tp, 0.01), so);
  train_both(ref, opt_ref, tp, opt_tp, 4, 90, 140);
  const StateDict full = gather_optimizer_state_dict(tp, opt_tp);
  CHECK(relative_diff(full, opt_ref.state_dict()) < 1e-12);
  // Back onto a fresh tensor-parallel optimizer, and the single process's state onto one.
  const auto other = encoder_pair(7, 1, g);
  nn::Sequential& tp2 = *other.second;
  optim::SGD opt_tp2(optim::param_groups_no_decay(tp2, 0.01), so);
  load_full_optimizer_state_dict(tp2, opt_tp2, full);
  CHECK(relative_diff(gather_optimizer_state_dict(tp2, opt_tp2), full) == 0.0);
  load_full_optimizer_state_dict(tp2, opt_tp2, opt_ref.state_dict());
  CHECK(relative_diff(gather_optimizer_state_dict(tp2, opt_tp2), opt_ref.state_dict()) == 0.0);
  // Resumed: the loaded state continues as the uninterrupted one.
  load_full_optimizer_state_dict(tp, opt_tp, full);
  train_both(ref, opt_ref, tp, opt_tp, 3, 95, 145);
  CHECK(relative_diff(gather_optimizer_state_dict(tp, opt_tp), opt_ref.state_dict()) < 1e-12);
  CHECK(relative_diff(gather_state_dict(tp), ref.state_dict()) < 1e-12);
  // An optimizer over another module's parameters is refused.
  CHECK_THROWS_WITH(gather_optimizer_state_dict(tp2, opt_tp),
                    Catch::Contains("is not one of the module's"));
}

TEST_CASE("tensor parallel: dropout draws a mask per shard inside the region, one outside",
          "[mpi][tp]") {
  ProcessGroup& g = default_group();
  const int64_t p = g.size(), Hl = kHeads / p;
  manual_seed(71);
  manual_seed_tensor_parallel(71, g);
  TensorParallelMultiheadAttention tp(kE, kHeads, g, {.dropout = 0.5, .batch_first = true}, kF64);
  tp.train();
  const Tensor x = replicated({kN, kL, kE}, 72);
  Tensor w;
  {
    NoGradGuard ng;
    w = tp(x, x, x, Tensor(), true, Tensor(), /*average_attn_weights=*/false).second;
  }
  // [N, H, L, S] after dropout: a dropped weight is exactly 0. The first head of each rank
  // has its own pattern (one shared generator would give every rank's heads the same one).
  const Tensor dropped = eq(w, 0.0).to(DType::f64);
  const double kept = 1.0 - mean(dropped).item<double>();
  CHECK(kept > 0.3);
  CHECK(kept < 0.7);
  for (int64_t q = 1; q < p; ++q) {
    const Tensor a = dropped.narrow(1, 0, 1), b = dropped.narrow(1, q * Hl, 1);
    CHECK(max(abs(sub(a, b))).item<double>() == 1.0);
  }
  // The default generator stays the same on every rank (replicated dropouts agree).
  const Tensor draw = randn({4}, DType::f64);
  Tensor all = empty({p * 4}, kF64);
  g.all_gather(all, draw).wait();
  for (int64_t q = 1; q < p; ++q) CHECK(same(all.narrow(0, q * 4, 4), draw));
}

TEST_CASE("tensor parallel: clip_grad_norm_tensor_parallel_ equals clip_grad_norm_ of the model",
          "[mpi][tp]") {
  ProcessGroup& g = default_group();
  const nn::TransformerEncoderLayerOptions o{.dim_feedforward = kF, .dropout = 0.0};
  manual_seed(91);
  nn::TransformerEncoderLayer ref(kE, kHeads, o, kF64);
  manual_seed(91);
  TensorParallelTransformerEncoderLayer tp(kE, kHeads, g, o, kF64);
  const Tensor x = replicated({kL, kN, kE}, 92), y = replicated({kL, kN, kE}, 93);
  mse_loss(ref(x), y).backward();
  mse_loss(tp(x), y).backward();
  const double want = optim::clip_grad_norm_(ref.parameters(), 0.01).item<double>();
  const double got = clip_grad_norm_tensor_parallel_(tp, 0.01);
  // The norm squared sums the P parameters' squares (positive terms: two orders differ by
  // 2 P u relative) of gradients that differ by the encoder test's bound (2 T' u max|g| x 64,
  // T' = 2 T the backward path; relative to the norm it is at most that).
  const int64_t T = (kE + 1 + 2 + 2 * kL + kE + 2 + 1) + 2 * kE + (kE + 1) + (kF + 5) + 2 * kE;
  const double P = static_cast<double>(ref.num_parameters());
  const double rel = 2 * P * kU + 2.0 * 2 * static_cast<double>(T) * kU * 64;
  INFO("norm " << got << " against " << want << ", relative bound " << rel);
  CHECK(std::abs(got - want) <= rel * want);
  CHECK(want > 0.01);  // the gradients were clipped
  // The clipped gradients, gathered, are the ordinary ones clipped (the same bound, with the
  // coefficient's own error: P more terms).
  const nn::NamedTensors grads = gather_grads(tp), ref_grads = ref.named_parameters();
  for (size_t i = 0; i < ref_grads.size(); ++i)
    check_norm((ref_grads[i].first + " clipped gradient").c_str(), grads[i].second,
               ref_grads[i].second.grad(), 2 * T + static_cast<int64_t>(P));
}
