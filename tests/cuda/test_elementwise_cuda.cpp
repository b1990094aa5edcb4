// Elementwise ops on CUDA against the CPU: every unary, binary, comparison, selection and
// in-place op of dltrain/ops/elementwise.hpp, forward and backward, from the same random
// inputs, in f32 and f64 (tight bounds), f16 and bf16 (against the CPU's f32 result on the
// same half-rounded inputs) and the integer dtypes (exact), with broadcast, transposed,
// sliced and channels-last operands.
// GPU-only: without a GPU, tests/cuda/main.cpp skips every test (exit code 4).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "tests/cuda/cuda_test_util.hpp"

using namespace dltrain;
using namespace dltrain::test;
using Catch::Contains;

namespace {

// Bounds for comparing a result in `dt` with the CPU reference.
struct Tol {
  double rtol, atol;
};
Tol tol_for(DType dt) {
  switch (dt) {
    case DType::f64:
      return {1e-12, 1e-12};
    case DType::f32:
      return {1e-5, 1e-6};
    case DType::f16:
      return {1e-2, 1e-3};
    case DType::bf16:
      return {4e-2, 1e-2};
    default:
      return {0, 0};
  }
}

void check_close(const Tensor& got, const Tensor& want, Tol t, const std::string& what,
                 double norm = 0) {
  dltrain::test::check_close(got, want, t.rtol, t.atol, what, norm);
}
// The `norm` bound for gradients of dt that went through sums of rounded terms.
double grad_norm(DType dt) { return dt == DType::f16 ? 1e-2 : (dt == DType::bf16 ? 4e-2 : 0.0); }

// Random input in dt (CPU); `positive` maps it into [0.1, ~4).
Tensor input(const Shape& shape, DType dt, bool positive = false) {
  Tensor x = randn(shape, DType::f32);
  if (positive) x = add(abs(x), 0.1);
  return x.to(dt);
}

using Unary = std::function<Tensor(const Tensor&)>;

std::vector<std::pair<std::string, Unary>> unary_ops() {
  return {
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.2); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, true); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.7); }},
      {"clamp_max", [](const Tensor& x) { return clamp(x, std::nullopt, 0.3); }},
      {"clamp_min", [](const Tensor& x) { return clamp(x, -0.2, std::nullopt); }},
      {"pow2", [](const Tensor& x) { return pow(x, 2.0); }},
      {"pow3", [](const Tensor& x) { return pow(x, 3.0); }},
      {"square", [](const Tensor& x) { return square(x); }},
  };
}

// Ops that need a positive input.
std::vector<std::pair<std::string, Unary>> positive_ops() {
  return {
      {"log", [](const Tensor& x) { return log(x); }},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }},
      {"pow_half", [](const Tensor& x) { return pow(x, 0.5); }},
      {"pow_neg", [](const Tensor& x) { return pow(x, -1.5); }},
  };
}

// Runs f on (CPU reference of) x and on x moved to CUDA, forward only.
void check_unary_forward(const std::string& name, const Unary& f, const Tensor& x_cpu_view,
                         const Tensor& x_dev_view, DType dt) {
  const Tensor want = f(x_cpu_view.to(ref_dtype(dt)));
  const Tensor got = f(x_dev_view);
  INFO(name << " " << dt_str(dt));
  REQUIRE(got.device() == kCuda);
  REQUIRE(got.dtype() == dt);
  check_close(got, want, tol_for(dt), name);
}

// Forward and backward of f on a leaf of `shape`/dt against the CPU (f32 reference for 16-bit
// dtypes): loss = sum(f(x) * w).
void check_unary_grad(const std::string& name, const Unary& f, const Tensor& x0, DType dt) {
  INFO(name << " backward " << dt_str(dt));
  Tensor x = leaf(x0, ref_dtype(dt), Device::cpu());
  Tensor xd = leaf(x0, dt, kCuda);
  const Tensor y = f(x), yd = f(xd);
  const Tensor w = randn(y.shape(), DType::f32).to(dt);
  sum(mul(y, w.to(ref_dtype(dt)))).backward();
  sum(mul(yd, w.to(kCuda))).backward();
  REQUIRE(xd.grad().device() == kCuda);
  REQUIRE(xd.grad().dtype() == dt);
  Tol t = tol_for(dt);
  if (dt == DType::f16) t = {1e-2, 1e-2};
  if (dt == DType::bf16) t = {4e-2, 4e-2};
  if (dt == DType::f32) t = {1e-5, 1e-5};
  check_close(xd.grad(), x.grad(), t, name + " grad");
}

const std::vector<DType> kFloats = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("cuda unary ops match the CPU in every floating dtype", "[cuda][gpu][elementwise]") {
  for (DType dt : kFloats) {
    const Tensor x = input({37, 53}, dt);  // odd sizes: the vector loop's tail runs
    const Tensor p = input({37, 53}, dt, true);
    const Tensor xd = x.to(kCuda), pd = p.to(kCuda);
    for (const auto& [name, f] : unary_ops()) check_unary_forward(name, f, x, xd, dt);
    for (const auto& [name, f] : positive_ops()) check_unary_forward(name, f, p, pd, dt);
  }
}

TEST_CASE("cuda unary ops on transposed, sliced, offset and channels-last inputs",
          "[cuda][gpu][elementwise]") {
  for (DType dt : {DType::f32, DType::f16}) {
    const Tensor base = input({24, 31}, dt);
    const Tensor base_d = base.to(kCuda);
    for (const auto& [name, f] : unary_ops()) {
      check_unary_forward(name + " transposed", f, base.t(), base_d.t(), dt);
      check_unary_forward(name + " sliced", f, base.slice(1, 3, 31, 2), base_d.slice(1, 3, 31, 2),
                          dt);
      check_unary_forward(name + " offset row", f, base.select(0, 5), base_d.select(0, 5), dt);
    }
    const Tensor cl = input({2, 5, 3, 7}, dt).contiguous(MemoryFormat::ChannelsLast);
    const Tensor cl_d = cl.to(kCuda);
    REQUIRE(cl_d.is_contiguous(MemoryFormat::ChannelsLast));
    for (const auto& [name, f] : unary_ops()) {
      const Tensor got = f(cl_d);
      INFO(name);
      CHECK(got.is_contiguous(MemoryFormat::ChannelsLast));
      check_unary_forward(name + " channels-last", f, cl, cl_d, dt);
    }
  }
  // Integer inputs compute in f32, as on the CPU.
  const Tensor xi = randint(-5, 6, {17}, DType::i64);
  const Tensor got = exp(xi.to(kCuda));
  REQUIRE(got.dtype() == DType::f32);
  check_close(got, exp(xi), tol_for(DType::f32), "exp(i64)");
  check_close(neg(xi.to(kCuda)), neg(xi), 0, 0, "neg(i64)");
  REQUIRE(neg(xi.to(kCuda)).dtype() == neg(xi).dtype());
}

TEST_CASE("cuda unary gradients match the CPU", "[cuda][gpu][elementwise][grad]") {
  for (DType dt : kFloats) {
    const Tensor x = input({9, 33}, dt);
    const Tensor p = input({9, 33}, dt, true);
    for (const auto& [name, f] : unary_ops()) check_unary_grad(name, f, x, dt);
    for (const auto& [name, f] : positive_ops()) check_unary_grad(name, f, p, dt);
  }
  // Through a non-contiguous view of a leaf.
  const Tensor x0 = input({12, 10}, DType::f32);
  for (const auto& [name, f] : unary_ops())
    check_unary_grad(
        name + " on a transposed view", [&](const Tensor& t) { return f(t.t()); }, x0, DType::f32);
}

TEST_CASE("cuda binary arithmetic: broadcasting, promotion, integers", "[cuda][gpu][elementwise]") {
  using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, Binary>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"add_alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, 2.0); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"sub_alpha", [](const Tensor& a, const Tensor& b) { return sub(a, b, 3.0); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
  };
  // Floating: a [4, 1, 6] with b [6, 1] -> [4, 6, 6].
  for (DType dt : kFloats) {
    const Tensor a = input({4, 1, 6}, dt), b = input({6, 1}, dt, true);
    const Tensor ad = a.to(kCuda), bd = b.to(kCuda);
    for (const auto& [name, f] : ops) {
      INFO(name << " " << dt_str(dt));
      const Tensor got = f(ad, bd);
      REQUIRE(got.dtype() == dt);
      REQUIRE(got.shape() == Shape{4, 6, 6});
      check_close(got, f(a.to(ref_dtype(dt)), b.to(ref_dtype(dt))), tol_for(dt), name);
      // Transposed and broadcast the other way round.
      check_close(f(bd.t(), ad), f(b.t().to(ref_dtype(dt)), a.to(ref_dtype(dt))), tol_for(dt),
                  name + " swapped");
    }
    // Scalars (a 0-d operand on the device) and scalars on the left.
    const Tensor ar = a.to(ref_dtype(dt));
    check_close(add(ad, 1.5), add(ar, 1.5), tol_for(dt), "add scalar");
    check_close(sub(ad, 0.25), sub(ar, 0.25), tol_for(dt), "sub scalar");
    check_close(mul(ad, -3.0), mul(ar, -3.0), tol_for(dt), "mul scalar");
    check_close(div(ad, 7.0), div(ar, 7.0), tol_for(dt), "div scalar");
    check_close(2.0 - ad, 2.0 - ar, tol_for(dt), "scalar - tensor");
    check_close(8.0 / bd, 8.0 / b.to(ref_dtype(dt)), tol_for(dt), "scalar / tensor");
  }
  // Integers: exact, with C++ wrap-around; alpha converts to the integer type as on the CPU.
  for (DType dt : {DType::i64, DType::i32, DType::u8}) {
    const Tensor a = randint(0, 100, {3, 1, 7}, dt), b = randint(1, 50, {4, 1}, dt);
    const Tensor ad = a.to(kCuda), bd = b.to(kCuda);
    for (const auto& [name, f] : ops) {
      INFO(name << " " << dt_str(dt));
      const Tensor want = f(a, b), got = f(ad, bd);
      REQUIRE(got.dtype() == want.dtype());
      check_close(got, want, 0, 0, name);
    }
    check_close(mul(ad, 3.0), mul(a, 3.0), 0, 0, "int * integral scalar");
    REQUIRE(mul(ad, 3.0).dtype() == dt);
    check_close(mul(ad, 2.5), mul(a, 2.5), tol_for(DType::f32), "int * fractional scalar");
    REQUIRE(mul(ad, 2.5).dtype() == DType::f32);
  }
  const Tensor u = tensor({200, 100, 255}, DType::u8);
  check_close(add(u.to(kCuda), u.to(kCuda)), add(u, u), 0, 0, "u8 wrap-around");
  // Mixed dtypes promote as on the CPU.
  const Tensor h = input({3, 4}, DType::f16), f = input({4}, DType::f32);
  const Tensor i = randint(-3, 4, {3, 1}, DType::i64);
  for (const auto& [name, op] : ops) {
    INFO(name);
    const Tensor got = op(h.to(kCuda), f.to(kCuda)), want = op(h, f);
    REQUIRE(got.dtype() == want.dtype());
    check_close(got, want, tol_for(DType::f32), name + " f16 with f32");
    const Tensor got2 = op(i.to(kCuda), f.to(kCuda)), want2 = op(i, f);
    REQUIRE(got2.dtype() == want2.dtype());
    check_close(got2, want2, tol_for(DType::f32), name + " i64 with f32");
  }
  REQUIRE(add(ones({2}, DType::bf16).to(kCuda), ones({2}, DType::f16).to(kCuda)).dtype() ==
          DType::f32);
  const Tensor bools = tensor({1, 0, 1}, DType::b8);
  check_close(add(bools.to(kCuda), bools.to(kCuda)), add(bools, bools), 0, 0, "bool + bool");
}

TEST_CASE("cuda maximum/minimum propagate NaN and split gradients on ties like the CPU",
          "[cuda][gpu][elementwise]") {
  const Tensor a = tensor({NAN, 1, 2, 5, 3}), b = tensor({0, NAN, 3, 5, 1});
  check_close(maximum(a.to(kCuda), b.to(kCuda)), maximum(a, b), 0, 0, "maximum NaN");
  check_close(minimum(a.to(kCuda), b.to(kCuda)), minimum(a, b), 0, 0, "minimum NaN");
  for (auto op : {maximum, minimum}) {
    Tensor x = leaf(tensor({1, 2, 3, 4}), DType::f32, Device::cpu());
    Tensor y = leaf(tensor({1, 3, 2, 4}), DType::f32, Device::cpu());
    Tensor xd = leaf(x, DType::f32, kCuda), yd = leaf(y, DType::f32, kCuda);
    const Tensor w = tensor({1, 2, 3, 4});
    sum(mul(op(x, y), w)).backward();
    sum(mul(op(xd, yd), w.to(kCuda))).backward();
    check_close(xd.grad(), x.grad(), 0, 0, "extremum grad a");
    check_close(yd.grad(), y.grad(), 0, 0, "extremum grad b");
  }
}

TEST_CASE("cuda pow(tensor, tensor) forward and backward", "[cuda][gpu][elementwise][grad]") {
  for (DType dt : kFloats) {
    INFO(dt_str(dt));
    const Tensor x0 = input({5, 1, 4}, dt, true), y0 = input({3, 4}, dt);
    Tensor x = leaf(x0, ref_dtype(dt), Device::cpu()), y = leaf(y0, ref_dtype(dt), Device::cpu());
    Tensor xd = leaf(x0, dt, kCuda), yd = leaf(y0, dt, kCuda);
    const Tensor want = pow(x, y), got = pow(xd, yd);
    REQUIRE(got.dtype() == dt);
    check_close(got, want, tol_for(dt), "pow");
    sum(want).backward();
    sum(got).backward();
    const Tol t = dt == DType::f32   ? Tol{1e-5, 1e-5}
                  : dt == DType::f64 ? tol_for(dt)
                                     : Tol{5e-2, 5e-2};
    check_close(xd.grad(), x.grad(), t, "pow grad x", grad_norm(dt));
    check_close(yd.grad(), y.grad(), t, "pow grad y", grad_norm(dt));
  }
}

TEST_CASE("cuda comparisons, logical_not, where and masked_fill", "[cuda][gpu][elementwise]") {
  using Cmp = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, Cmp>> cmps = {
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }},
  };
  // Small integers (as every dtype) so that ties are frequent.
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32,
                   DType::u8, DType::b8}) {
    const int64_t hi = dt == DType::b8 ? 2 : 4;
    const Tensor a = randint(0, hi, {6, 1, 5}, DType::i64).to(dt);
    const Tensor b = randint(0, hi, {5, 5}, DType::i64).to(dt);
    for (const auto& [name, f] : cmps) {
      INFO(name << " " << dt_str(dt));
      const Tensor got = f(a.to(kCuda), b.to(kCuda));
      REQUIRE(got.dtype() == DType::b8);
      REQUIRE(got.to_vector<bool>() == f(a, b).to_vector<bool>());
      REQUIRE(f(b.to(kCuda).t(), b.to(kCuda)).to_vector<bool>() == f(b.t(), b).to_vector<bool>());
    }
    REQUIRE(logical_not(a.to(kCuda)).to_vector<bool>() == logical_not(a).to_vector<bool>());
  }
  const Tensor x = input({7, 9}, DType::f32), xd = x.to(kCuda);
  REQUIRE(gt(xd, 0.1).to_vector<bool>() == gt(x, 0.1).to_vector<bool>());
  REQUIRE(le(xd, -0.3).to_vector<bool>() == le(x, -0.3).to_vector<bool>());
  REQUIRE(eq(xd, xd).to_vector<bool>() == eq(x, x).to_vector<bool>());
  REQUIRE(ne(xd.to(DType::f16), 0.0).to_vector<bool>() ==
          ne(x.to(DType::f16), 0.0).to_vector<bool>());
  REQUIRE(lt(tensor({NAN}).to(kCuda), 1.0).to_vector<bool>() == std::vector<bool>{false});

  // where: broadcast condition and operands, promotion, u8 condition, exact selection.
  const Tensor cond = gt(randn({4, 1, 6}), 0.0);
  const Tensor a = input({5, 6}, DType::f32), b = input({4, 5, 1}, DType::f16);
  const Tensor got = where(cond.to(kCuda), a.to(kCuda), b.to(kCuda));
  REQUIRE(got.dtype() == DType::f32);
  check_close(got, where(cond, a, b), 0, 0, "where");
  check_close(where(cond.to(DType::u8).to(kCuda), a.to(kCuda), b.to(kCuda)), where(cond, a, b), 0,
              0, "where u8 condition");
  const Tensor ints = randint(-9, 9, {4, 5, 6}, DType::i64);
  check_close(where(cond.to(kCuda), ints.to(kCuda), zeros({}, DType::i64).to(kCuda)),
              where(cond, ints, zeros({}, DType::i64)), 0, 0, "where i64");
  check_close(masked_fill(a.to(kCuda), cond.select(0, 1).to(kCuda), -7.5),
              masked_fill(a, cond.select(0, 1), -7.5), 0, 0, "masked_fill");
  REQUIRE_THROWS_WITH(where(a.to(kCuda), a.to(kCuda), a.to(kCuda)),
                      Contains("where") && Contains("bool"));

  // where backward routes the gradient to the chosen operand, summed over broadcast dims.
  Tensor wa = leaf(a, DType::f32, Device::cpu()), wb = leaf(b, DType::f32, Device::cpu());
  Tensor wad = leaf(a, DType::f32, kCuda), wbd = leaf(b, DType::f32, kCuda);
  const Tensor w = randn({4, 5, 6});
  sum(mul(where(cond, wa, wb), w)).backward();
  sum(mul(where(cond.to(kCuda), wad, wbd), w.to(kCuda))).backward();
  check_close(wad.grad(), wa.grad(), 1e-5, 1e-6, "where grad a");
  check_close(wbd.grad(), wb.grad(), 1e-5, 1e-6, "where grad b");
}

TEST_CASE("cuda in-place updates on views, with broadcast operands", "[cuda][gpu][elementwise]") {
  NoGradGuard no_grad;
  for (DType dt : kFloats) {
    INFO(dt_str(dt));
    // A chain of updates: FMA contraction on the GPU may move a value by an ulp, which later
    // cancellation can expose, so the absolute bound is the relative one.
    const Tol t = {tol_for(dt).rtol, tol_for(dt).rtol};
    // self is a transposed view: the base must change accordingly.
    Tensor base = input({6, 8}, dt), base_d = base.to(kCuda);
    Tensor self = base.t(), self_d = base_d.t();
    const Tensor other = input({1, 6}, dt), t1 = input({8, 1}, dt), t2 = input({6}, dt, true);
    add_(self, other, 0.5);
    add_(self_d, other.to(kCuda), 0.5);
    check_close(base_d, base, t, "add_");
    mul_(self, t1);
    mul_(self_d, t1.to(kCuda));
    check_close(base_d, base, t, "mul_");
    mul_(self, 1.25);
    mul_(self_d, 1.25);
    check_close(base_d, base, t, "mul_ scalar");
    add_(self, -0.75);
    add_(self_d, -0.75);
    check_close(base_d, base, t, "add_ scalar");
    addcmul_(self, t1, t2, 0.3);
    addcmul_(self_d, t1.to(kCuda), t2.to(kCuda), 0.3);
    check_close(base_d, base, t, "addcmul_");
    addcdiv_(self, t1, t2, -0.6);
    addcdiv_(self_d, t1.to(kCuda), t2.to(kCuda), -0.6);
    check_close(base_d, base, t, "addcdiv_");
    // Operand of another dtype converts to self's.
    add_(self, other.to(DType::f64));
    add_(self_d, other.to(DType::f64).to(kCuda));
    check_close(base_d, base, t, "add_ f64 operand");
  }
  // Contiguous self and a sliced (strided) self in f32, against the same ops on the CPU.
  Tensor a = input({1000}, DType::f32), a_d = a.to(kCuda);
  Tensor s = a.slice(0, 1, 1000, 3), s_d = a_d.slice(0, 1, 1000, 3);
  const Tensor o = input({333}, DType::f32);
  add_(s, o, 2.0);
  add_(s_d, o.to(kCuda), 2.0);
  addcmul_(a, a, a, 0.1);
  addcmul_(a_d, a_d, a_d, 0.1);
  check_close(a_d, a, tol_for(DType::f32), "strided and aliased in-place");
  // Integers.
  Tensor n = randint(-20, 20, {5, 4}, DType::i64), n_d = n.to(kCuda);
  const Tensor m = randint(1, 5, {4}, DType::i64);
  add_(n, m, 3.0);
  add_(n_d, m.to(kCuda), 3.0);
  mul_(n, m);
  mul_(n_d, m.to(kCuda));
  addcmul_(n, m, m, 2.0);
  addcmul_(n_d, m.to(kCuda), m.to(kCuda), 2.0);
  addcdiv_(n, n, m, 1.0);
  addcdiv_(n_d, n_d, m.to(kCuda), 1.0);
  check_close(n_d, n, 0, 0, "i64 in-place");
}

TEST_CASE("cuda in-place and binary ops check devices and grad mode",
          "[cuda][gpu][elementwise][errors]") {
  const Tensor xd = ones({3}, kCuda), xc = ones({3});
  REQUIRE_THROWS_WITH(add(xd, xc), Contains("add") && Contains("device"));
  REQUIRE_THROWS_WITH(eq(xd, xc), Contains("eq") && Contains("device"));
  REQUIRE_THROWS_WITH(where(gt(xd, 0.0), xd, xc), Contains("where") && Contains("device"));
  Tensor param = ones({3}, kCuda).requires_grad_();
  REQUIRE_THROWS_WITH(add_(param, xd), Contains("add_") && Contains("NoGradGuard"));
  Tensor self = zeros({3}, kCuda);
  REQUIRE_THROWS_WITH(add_(self, xc), Contains("add_") && Contains("device"));
  REQUIRE_THROWS_WITH(add_(self, ones({4}, kCuda)), Contains("add_") && Contains("broadcast"));
  REQUIRE_THROWS_WITH(add(zeros({3}, kCuda), zeros({4}, kCuda)), Contains("add"));
  Tensor flags = zeros({3}, TensorOptions(DType::b8).with_device(kCuda));
  REQUIRE_THROWS_WITH(mul_(flags, flags), Contains("mul_") && Contains("bool"));
  REQUIRE(allclose(xd, xd));
  REQUIRE_FALSE(allclose(xd, add(xd, 1.0)));
}

TEST_CASE("cuda backward through composite elementwise expressions",
          "[cuda][gpu][elementwise][grad]") {
  // Broadcast shapes force sum_to in every binary backward.
  auto f = [](const Tensor& x, const Tensor& y) {
    Tensor a = sigmoid(add(mul(x, y), 1.0));
    Tensor b = div(gelu(y), add(abs(x), 1.0));
    Tensor c = maximum(tanh(x), mul(y, 0.5));
    Tensor d = clamp(sub(exp(mul(x, 0.3)), leaky_relu(y, 0.1), 0.5), -1.0, 2.0);
    return add(sub(mul(a, tanh(x)), b), add(c, relu(d)));
  };
  for (DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    INFO(dt_str(dt));
    const Tensor x0 = input({8, 1, 5}, dt), y0 = input({6, 5}, dt);
    Tensor x = leaf(x0, ref_dtype(dt), Device::cpu()), y = leaf(y0, ref_dtype(dt), Device::cpu());
    Tensor xd = leaf(x0, dt, kCuda), yd = leaf(y0, dt, kCuda);
    const Tensor w = randn({8, 6, 5}).to(dt);
    const Tensor want = f(x, y), got = f(xd, yd);
    const Tol tf = dt == DType::f64   ? tol_for(dt)
                   : dt == DType::f32 ? Tol{1e-5, 1e-5}
                   : dt == DType::f16 ? Tol{3e-2, 3e-2}
                                      : Tol{1e-1, 1e-1};
    check_close(got, want, tf, "composite forward", grad_norm(dt));
    sum(mul(want, w.to(ref_dtype(dt)))).backward();
    sum(mul(got, w.to(kCuda))).backward();
    // f16/bf16 gradients go through several roundings of sums over up to 8 * 6 terms.
    const Tol t = dt == DType::f64   ? Tol{1e-10, 1e-10}
                  : dt == DType::f32 ? Tol{1e-4, 1e-4}
                  : dt == DType::f16 ? Tol{5e-2, 5e-2}
                                     : Tol{1.5e-1, 1.5e-1};
    check_close(xd.grad(), x.grad(), t, "composite grad x", grad_norm(dt));
    check_close(yd.grad(), y.grad(), t, "composite grad y", grad_norm(dt));
  }
  // Channels-last leaf: gradient keeps the layout, values match.
  const Tensor c0 = input({2, 3, 4, 5}, DType::f32).contiguous(MemoryFormat::ChannelsLast);
  Tensor c = leaf(c0, DType::f32, Device::cpu()), cd = leaf(c0, DType::f32, kCuda);
  const Tensor bias = input({3, 1, 1}, DType::f32);
  sum(mul(gelu(add(c, bias)), c)).backward();
  sum(mul(gelu(add(cd, bias.to(kCuda))), cd)).backward();
  CHECK(cd.grad().is_contiguous(MemoryFormat::ChannelsLast));
  check_close(cd.grad(), c.grad(), 1e-5, 1e-5, "channels-last grad");
}

// relu_ (issue 28) runs the relu kernel with its output aliasing its input: exact against
// the CPU in every floating dtype, on a strided view too, and with autograd (its history
// continues through relu_).
TEST_CASE("cuda relu_ in place matches the CPU, strided views and gradients included",
          "[cuda][gpu][elementwise]") {
  Generator g(28);
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    INFO(dt_str(dt));
    const Tensor x = randn({5, 7}, DType::f32, &g).to(dt);
    Tensor d = x.to(kCuda);
    relu_(d);
    CHECK(allclose(d.to(Device::cpu()).to(DType::f64), relu(x).to(DType::f64), 0, 0));
    // In place through a transposed view: only the viewed elements change, exactly.
    Tensor base = x.to(kCuda);
    Tensor view = base.t();
    relu_(view);
    CHECK(allclose(base.to(Device::cpu()).to(DType::f64), relu(x).to(DType::f64), 0, 0));
  }
  const Tensor x = randn({4, 6}, DType::f32, &g);
  Tensor wc = x.clone().requires_grad_(), wg = x.to(kCuda).requires_grad_();
  Tensor yc = mul(wc, 2.0), yg = mul(wg, 2.0);
  relu_(yc);
  relu_(yg);
  sum(mul(yc, yc)).backward();
  sum(mul(yg, yg)).backward();
  CHECK(allclose(wg.grad().to(Device::cpu()), wc.grad(), 0, 0));
}
