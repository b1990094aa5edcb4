// The op-case registry (see op_cases.hpp): the cases, the exclusion lists and the harness that
// runs a case and checks it against the exact result.
#include "op_cases.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>

namespace dltrain::testing {

namespace {

using V = std::vector<Tensor>;

constexpr DType kF32 = DType::f32, kF16 = DType::f16, kBF16 = DType::bf16, kF64 = DType::f64;

// Draws a case's inputs: each call its own generator (seed, call number), values drawn in f64
// and rounded to dt, then moved to the device (4-d floating tensors laid out as fmt there).
struct G {
  uint64_t seed;
  DType dt;
  Device dev;
  MemoryFormat fmt;
  uint64_t k = 0;

  Generator gen() { return Generator(seed * 7919 + 104729 * ++k); }
  Tensor place(const Tensor& t64) {
    Tensor t = t64.to(dt).to(dev);
    return t.dim() == 4 ? t.contiguous(fmt) : t.contiguous();
  }
  /// scale * N(0, 1) + shift.
  Tensor normal(const Shape& s, double scale = 1.0, double shift = 0.0) {
    Generator g = gen();
    return place(add(mul(randn(s, kF64, &g), scale), shift));
  }
  /// Uniform in [lo, hi).
  Tensor uniform(const Shape& s, double lo, double hi) {
    Generator g = gen();
    return place(dltrain::uniform(s, lo, hi, kF64, &g));
  }
  /// N(0, 1) values moved at least `gap` away from 0 (a kink at 0: relu, abs, sign...).
  Tensor away(const Shape& s, double gap = 0.1) {
    Generator g = gen();
    const Tensor r = randn(s, kF64, &g);
    return place(mul(sign(r), add(abs(r), gap)));
  }
  /// Distinct values k/4 (k a permutation around 0), exact in every dtype for up to 512
  /// elements, at least 0.25 apart (max, sort, pooling: no ties, kinks away from the f64
  /// gradcheck's eps).
  Tensor distinct(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    Generator g = gen();
    return place(mul(sub(randperm(n, &g).to(kF64), static_cast<double>(n / 2)), 0.25).reshape(s));
  }
  /// Small integers in [0, hi) as floats (comparisons that must see equal values).
  Tensor small_ints(const Shape& s, int64_t hi) {
    Generator g = gen();
    return place(randint(0, hi, s, DType::i64, &g).to(kF64));
  }
  /// int64 indices in [0, hi).
  Tensor index(const Shape& s, int64_t hi) {
    Generator g = gen();
    return randint(0, hi, s, DType::i64, &g).to(dev);
  }
  /// A bool tensor, true with probability 1/2.
  Tensor mask(const Shape& s) {
    Generator g = gen();
    return lt(rand(s, kF64, &g), 0.5).to(dev);
  }
  Tensor ints(const std::vector<int64_t>& v, const Shape& s = {}) {
    return from_vector(v, s.empty() ? Shape{static_cast<int64_t>(v.size())} : s).to(dev);
  }
};

MakeInputs gen(std::function<V(G&)> f) {
  return [f = std::move(f)](uint64_t seed, DType dt, Device dev, MemoryFormat fmt) {
    G g{seed, dt, dev, fmt};
    return f(g);
  };
}

// Tolerance shorthands.
Tolerance elem(double cond = 1) { return {.cond = cond}; }
Tolerance reduce(int64_t K, int64_t Kg = 1, double cond = 1) {
  return {.terms = K, .grad_terms = Kg, .cond = cond};
}
Tolerance multilinear(int64_t K, int64_t Kg) {
  return {.terms = K, .grad_terms = Kg, .multilinear = true};
}
// t with `r` intermediate results rounded to the dtype (a composite: a GEMM then the bias, a
// sum then the division, a loss built from several ops; or K partial sums kept in the dtype).
Tolerance rounded(Tolerance t, int r) {
  t.roundings = r;
  return t;
}

const std::vector<DType> kAll{kF32, kF16, kBF16, kF64};
const std::vector<DType> kF32F64{kF32, kF64};

std::vector<OpCase> build() {
  std::vector<OpCase> v;
  auto unary = [&v](std::string name, std::vector<std::string> ops, std::function<Tensor(Tensor)> f,
                    std::function<Tensor(G&)> in, Tolerance tol = elem(), bool higher = true) {
    v.push_back({.name = std::move(name),
                 .ops = std::move(ops),
                 .fn = [f](const V& t) { return V{f(t[0])}; },
                 .make_inputs = gen([in](G& g) { return V{in(g)}; }),
                 .grad_inputs = {0},
                 .higher_order = higher,
                 .tol = tol});
  };
  auto binary = [&v](std::string name, std::vector<std::string> ops,
                     std::function<Tensor(Tensor, Tensor)> f, std::function<V(G&)> in,
                     Tolerance tol = elem(), std::vector<int> grads = {0, 1}, bool higher = true) {
    v.push_back({.name = std::move(name),
                 .ops = std::move(ops),
                 .fn = [f](const V& t) { return V{f(t[0], t[1])}; },
                 .make_inputs = gen(std::move(in)),
                 .grad_inputs = std::move(grads),
                 .higher_order = higher,
                 .tol = tol});
  };
  // ---- elementwise ------------------------------------------------------------------------
  // Broadcasting binary ops: [3, 4] with [4]; the [4] operand's gradient sums 3 terms.
  auto bcast = [](G& g) { return V{g.normal({3, 4}), g.normal({4})}; };
  auto bcast_pos = [](G& g) { return V{g.normal({3, 4}), g.uniform({4}, 0.5, 2.0)}; };
  const Tolerance bt = reduce(1, 3);
  binary(
      "add", {"add", "operator+"}, [](Tensor a, Tensor b) { return a + b; }, bcast, bt);
  binary(
      "add.alpha", {"add"}, [](Tensor a, Tensor b) { return add(a, b, -0.5); }, bcast, bt);
  binary(
      "sub", {"sub", "operator-"}, [](Tensor a, Tensor b) { return a - b; }, bcast, bt);
  binary(
      "sub.alpha", {"sub"}, [](Tensor a, Tensor b) { return sub(a, b, 2.0); }, bcast, bt);
  binary(
      "mul", {"mul", "operator*"}, [](Tensor a, Tensor b) { return a * b; }, bcast, bt);
  binary(
      "div", {"div", "operator/"}, [](Tensor a, Tensor b) { return a / b; }, bcast_pos, bt);
  // Tensor-scalar forms (their own code path: the scalar stays in the op).
  unary(
      "add.scalar", {"add", "operator+"}, [](Tensor x) { return add(x, 1.5) + 0.25; },
      [](G& g) {
        return g.normal({3, 4});
      },
      {.roundings = 1});
  unary(
      "add.scalar_first", {"add", "operator+"}, [](Tensor x) { return 0.5 + add(1.5, x); },
      [](G& g) {
        return g.normal({3, 4});
      },
      {.roundings = 1});
  unary(
      "sub.scalar", {"sub", "operator-"}, [](Tensor x) { return sub(x, 1.5) - 0.25; },
      [](G& g) {
        return g.normal({3, 4});
      },
      {.roundings = 1});
  unary(
      "sub.scalar_first", {"sub", "operator-"}, [](Tensor x) { return 0.5 - sub(1.5, x); },
      [](G& g) {
        return g.normal({3, 4});
      },
      {.roundings = 1});
  unary(
      "mul.scalar", {"mul", "operator*"}, [](Tensor x) { return mul(x, 1.5) * 0.75; },
      [](G& g) {
        return g.normal({3, 4});
      },
      {.roundings = 1});
  unary(
      "mul.scalar_first", {"mul", "operator*"}, [](Tensor x) { return 0.75 * mul(1.5, x); },
      [](G& g) {
        return g.normal({3, 4});
      },
      {.roundings = 1});
  unary(
      "div.scalar", {"div", "operator/"}, [](Tensor x) { return div(x, 1.5) / 3.0; },
      [](G& g) {
        return g.normal({3, 4});
      },
      {.roundings = 1});
  unary(
      "div.scalar_first", {"div", "operator/"}, [](Tensor x) { return div(1.5, x); },
      [](G& g) {
        return g.uniform({3, 4}, 0.5, 2.0);
      });
  unary(
      "div.scalar_first_op", {"operator/"}, [](Tensor x) { return 1.5 / x; },
      [](G& g) {
        return g.uniform({3, 4}, 0.5, 2.0);
      });
  unary(
      "neg", {"neg", "operator-"}, [](Tensor x) { return -neg(x); },
      [](G& g) {
        return g.normal({3, 4});
      });
  // maximum/minimum: distinct values (no ties; the f64 gradcheck stays away from the kink).
  auto two_distinct = [](G& g) {
    Tensor d = g.distinct({2, 3, 4});
    return V{d.select(0, 0).contiguous(), d.select(0, 1).contiguous()};
  };
  binary(
      "maximum", {"maximum"}, [](Tensor a, Tensor b) { return maximum(a, b); }, two_distinct);
  binary(
      "minimum", {"minimum"}, [](Tensor a, Tensor b) { return minimum(a, b); }, two_distinct);
  auto nrm = [](G& g) { return g.normal({3, 4}); };
  auto pos = [](G& g) { return g.uniform({3, 4}, 0.5, 2.0); };
  auto awy = [](G& g) { return g.away({3, 4}); };
  unary(
      "exp", {"exp"}, [](Tensor x) { return exp(x); }, nrm);
  unary(
      "log", {"log"}, [](Tensor x) { return log(x); }, pos);
  unary(
      "log2", {"log2"}, [](Tensor x) { return log2(x); }, pos);
  unary(
      "log10", {"log10"}, [](Tensor x) { return log10(x); }, pos);
  unary(
      "sqrt", {"sqrt"}, [](Tensor x) { return sqrt(x); }, pos);
  unary(
      "rsqrt", {"rsqrt"}, [](Tensor x) { return rsqrt(x); }, pos);
  unary(
      "abs", {"abs"}, [](Tensor x) { return abs(x); }, awy);
  unary(
      "square", {"square"}, [](Tensor x) { return square(x); }, nrm);
  unary(
      "pow.scalar", {"pow"}, [](Tensor x) { return pow(x, 2.5); }, pos);
  binary(
      "pow.tensor", {"pow"}, [](Tensor a, Tensor b) { return pow(a, b); },
      [](G& g) {
        return V{g.uniform({3, 4}, 0.5, 2.0), g.normal({4})};
      },
      bt);
  unary(
      "relu", {"relu"}, [](Tensor x) { return relu(x); }, awy);
  unary(
      "leaky_relu", {"leaky_relu"}, [](Tensor x) { return leaky_relu(x, 0.1); }, awy);
  unary(
      "gelu.erf", {"gelu"}, [](Tensor x) { return gelu(x, false); }, nrm);
  unary(
      "gelu.tanh", {"gelu"}, [](Tensor x) { return gelu(x, true); }, nrm);
  unary(
      "sigmoid", {"sigmoid"}, [](Tensor x) { return sigmoid(x); }, nrm);
  unary(
      "tanh", {"tanh"}, [](Tensor x) { return tanh(x); }, nrm);
  unary(
      "silu", {"silu"}, [](Tensor x) { return silu(x); }, nrm);
  unary(
      "softplus", {"softplus"}, [](Tensor x) { return softplus(x, 2.0, 20.0); }, nrm);
  // beta * x > threshold returns x itself: inputs on both sides of the threshold (2 * 1.5).
  unary(
      "softplus.threshold", {"softplus"}, [](Tensor x) { return softplus(x, 2.0, 3.0); },
      [](G& g) {
        return g.uniform({3, 4}, -1.0, 4.0);
      });
  unary(
      "elu", {"elu"}, [](Tensor x) { return elu(x, 1.5); }, awy);
  unary(
      "mish", {"mish"}, [](Tensor x) { return mish(x); }, nrm);
  // hardswish has kinks at -3 and 3: values in (-2.9, 2.9) and beyond +-3.1.
  unary(
      "hardswish", {"hardswish"}, [](Tensor x) { return hardswish(x); },
      [](G& g) {
        return g.away({3, 4}, 0.05);
      });
  unary(
      "hardswish.saturated", {"hardswish"}, [](Tensor x) { return hardswish(x); },
      [](G& g) {
        return g.away({3, 4}, 3.1);
      });
  unary(
      "sin", {"sin"}, [](Tensor x) { return sin(x); }, nrm);
  unary(
      "cos", {"cos"}, [](Tensor x) { return cos(x); }, nrm);
  unary(
      "log1p", {"log1p"}, [](Tensor x) { return log1p(x); },
      [](G& g) {
        return g.uniform({3, 4}, -0.5, 2.0);
      });
  unary(
      "expm1", {"expm1"}, [](Tensor x) { return expm1(x); }, nrm);
  // sign's gradient is zero with no graph: no second order to check.
  unary(
      "sign", {"sign"}, [](Tensor x) { return sign(x); }, awy, elem(), false);
  // clamp with tensor bounds (broadcast [4]) and with scalar bounds; x kept 0.05 from the bounds.
  v.push_back({.name = "clamp.tensor",
               .ops = {"clamp"},
               .fn = [](const V& t) { return V{clamp(t[0], t[1], t[2])}; },
               .make_inputs = gen([](G& g) {
                 return V{g.distinct({3, 4}), g.uniform({4}, -0.9, -0.6), g.uniform({4}, 0.6, 0.9)};
               }),
               .grad_inputs = {0, 1, 2},
               .higher_order = true,
               .tol = reduce(1, 3)});
  unary(
      "clamp.scalar", {"clamp"}, [](Tensor x) { return clamp(x, -0.6, 0.9); },
      [](G& g) {
        return g.distinct({3, 4});
      });
  unary(
      "clamp.min_only", {"clamp"}, [](Tensor x) { return clamp(x, -0.6, std::nullopt); },
      [](G& g) {
        return g.distinct({3, 4});
      });
  v.push_back({.name = "where",
               .ops = {"where"},
               .fn = [](const V& t) { return V{where(t[0], t[1], t[2])}; },
               .make_inputs = gen([](G& g) {
                 return V{g.mask({3, 4}), g.normal({3, 4}), g.normal({4})};
               }),
               .grad_inputs = {1, 2},
               .higher_order = true,
               .tol = reduce(1, 3)});
  v.push_back({.name = "masked_fill",
               .ops = {"masked_fill"},
               .fn = [](const V& t) { return V{masked_fill(t[0], t[1], -2.5)}; },
               .make_inputs = gen([](G& g) {
                 return V{g.normal({3, 4}), g.mask({4})};
               }),
               .grad_inputs = {0},
               .higher_order = true});
  // Comparisons and logical ops: bool results, equal on every backend; small integers so that
  // equal values occur.
  auto cmp = [&v](std::string name, std::vector<std::string> ops,
                  std::function<Tensor(Tensor, Tensor)> f) {
    v.push_back({.name = std::move(name),
                 .ops = std::move(ops),
                 .fn = [f](const V& t) { return V{f(t[0], t[1])}; },
                 .make_inputs = gen([](G& g) {
                   return V{g.small_ints({3, 4}, 3), g.small_ints({4}, 3)};
                 })});
  };
  cmp("eq", {"eq"}, [](Tensor a, Tensor b) { return eq(a, b); });
  cmp("ne", {"ne"}, [](Tensor a, Tensor b) { return ne(a, b); });
  cmp("lt", {"lt"}, [](Tensor a, Tensor b) { return lt(a, b); });
  cmp("le", {"le"}, [](Tensor a, Tensor b) { return le(a, b); });
  cmp("gt", {"gt"}, [](Tensor a, Tensor b) { return gt(a, b); });
  cmp("ge", {"ge"}, [](Tensor a, Tensor b) { return ge(a, b); });
  cmp("compare.scalar", {"eq", "ne", "lt", "le", "gt", "ge"}, [](Tensor a, Tensor) {
    return stack({eq(a, 1.0), ne(a, 1.0), lt(a, 1.0), le(a, 1.0), gt(a, 1.0), ge(a, 1.0)});
  });
  cmp("logical_not", {"logical_not"}, [](Tensor a, Tensor) { return logical_not(a); });
  cmp("logical_and", {"logical_and"}, [](Tensor a, Tensor b) { return logical_and(a, b); });
  cmp("logical_or", {"logical_or"}, [](Tensor a, Tensor b) { return logical_or(a, b); });
  cmp("logical_xor", {"logical_xor"}, [](Tensor a, Tensor b) { return logical_xor(a, b); });
  // In-place updates: forward only, on a copy (they record no autograd).
  auto inplace = [&v](std::string name, std::vector<std::string> ops,
                      std::function<void(Tensor&, const V&)> f, int n_extra,
                      Tolerance tol = {.roundings = 1}) {
    v.push_back({.name = std::move(name),
                 .ops = std::move(ops),
                 .fn =
                     [f](const V& t) {
                       Tensor s = t[0].clone();
                       f(s, t);
                       return V{s};
                     },
                 .make_inputs = gen([n_extra](G& g) {
                   V r{g.normal({3, 4})};
                   for (int i = 0; i < n_extra; ++i) r.push_back(g.uniform({4}, 0.5, 2.0));
                   return r;
                 }),
                 .tol = tol});
  };
  inplace("add_", {"add_"},
          [](Tensor& s, const V& t) {
            add_(s, t[1], 0.5);
            add_(s, 0.25);
          },
          1, {.roundings = 2});
  inplace("mul_", {"mul_"},
          [](Tensor& s, const V& t) {
            mul_(s, t[1]);
            mul_(s, 0.75);
          },
          1, {.roundings = 2});
  inplace(
      "addcmul_", {"addcmul_"}, [](Tensor& s, const V& t) { addcmul_(s, t[1], t[2], 0.5); }, 2);
  inplace(
      "addcdiv_", {"addcdiv_"}, [](Tensor& s, const V& t) { addcdiv_(s, t[1], t[2], 0.5); }, 2);
  inplace(
      "copy_scaled_", {"copy_scaled_"},
      [](Tensor& s, const V& t) {
        copy_scaled_(s, t[1].expand({3, 4}).contiguous(), 0.3);
      },
      1);
  // relu_ records autograd: through a clone (a non-leaf it may change).
  unary(
      "relu_", {"relu_"},
      [](Tensor x) {
        Tensor y = mul(x, 1.0);
        relu_(y);
        return y;
      },
      awy);

  // ---- linalg -------------------------------------------------------------------------------
  // f32 GEMMs take oneDNN's sgemm when built in (src/backend/cpu/gemm.cpp).
  auto gemm = [&v](std::string name, std::vector<std::string> ops,
                   std::function<Tensor(const V&)> f, std::function<V(G&)> in,
                   std::vector<int> grads, int64_t K, int64_t Kg, int r = 0) {
    v.push_back({.name = std::move(name),
                 .ops = std::move(ops),
                 .fn = [f](const V& t) { return V{f(t)}; },
                 .make_inputs = gen(std::move(in)),
                 .grad_inputs = std::move(grads),
                 .higher_order = true,
                 .dnnl = true,
                 .tol = rounded(multilinear(K, Kg), r)});
  };
  gemm(
      "mm", {"mm"}, [](const V& t) { return mm(t[0], t[1]); },
      [](G& g) {
        return V{g.normal({3, 5}), g.normal({5, 4})};
      },
      {0, 1}, 5, 4);
  gemm(
      "mm.transposed", {"mm"}, [](const V& t) { return mm(t[0].transpose(0, 1), t[1]); },
      [](G& g) {
        return V{g.normal({5, 3}), g.normal({5, 4})};
      },
      {0, 1}, 5, 4);
  gemm(
      "bmm", {"bmm"}, [](const V& t) { return bmm(t[0], t[1]); },
      [](G& g) {
        return V{g.normal({2, 2, 3}), g.normal({2, 3, 2})};
      },
      {0, 1}, 3, 2);
  gemm(
      "matmul.broadcast", {"matmul"}, [](const V& t) { return matmul(t[0], t[1]); },
      [](G& g) {
        return V{g.normal({2, 3, 5}), g.normal({5, 4})};
      },
      {0, 1}, 5, 6);
  gemm(
      "matmul.vector", {"matmul"}, [](const V& t) { return matmul(t[0], t[1]); },
      [](G& g) {
        return V{g.normal({5}), g.normal({5, 4})};
      },
      {0, 1}, 5, 4);
  gemm(
      "linear", {"linear"}, [](const V& t) { return linear(t[0], t[1], t[2]); },
      [](G& g) {
        return V{g.normal({2, 3, 5}), g.normal({4, 5}), g.normal({4})};
      },
      {0, 1, 2}, 6, 6, 1);
  gemm(
      "linear.nobias", {"linear"}, [](const V& t) { return linear(t[0], t[1]); },
      [](G& g) {
        return V{g.normal({3, 5}), g.normal({4, 5})};
      },
      {0, 1}, 5, 4);

  // ---- conv ---------------------------------------------------------------------------------
  auto conv = [&v](std::string name, std::vector<std::string> ops,
                   std::function<Tensor(const V&)> f, std::function<V(G&)> in,
                   std::vector<int> grads, int64_t K, int64_t Kg, bool four_d = true, int r = 0) {
    v.push_back({.name = std::move(name),
                 .ops = std::move(ops),
                 .fn = [f](const V& t) { return V{f(t)}; },
                 .make_inputs = gen(std::move(in)),
                 .grad_inputs = std::move(grads),
                 .four_d = four_d,
                 .higher_order = true,
                 .dnnl = true,
                 .tol = rounded(multilinear(K, Kg), r)});
  };
  // K forward: C_in/groups * kh * kw (+1 bias); gradients: x sums C_out * kh * kw, w sums
  // N * Ho * Wo, the bias N * Ho * Wo.
  conv(
      "conv2d", {"conv2d"}, [](const V& t) { return conv2d(t[0], t[1], t[2], 1, 1); },
      [](G& g) {
        return V{g.normal({1, 2, 4, 4}), g.normal({2, 2, 3, 3}), g.normal({2})};
      },
      {0, 1, 2}, 19, 18);
  conv(
      "conv2d.stride_dilation_groups", {"conv2d"},
      [](const V& t) { return conv2d(t[0], t[1], Tensor(), 2, 1, 2, 2); },
      [](G& g) {
        return V{g.normal({1, 4, 7, 6}), g.normal({4, 2, 3, 3})};
      },
      {0, 1}, 18, 18);
  conv(
      "conv1d", {"conv1d"}, [](const V& t) { return conv1d(t[0], t[1], t[2], 2, 1); },
      [](G& g) {
        return V{g.normal({1, 3, 7}), g.normal({2, 3, 3}), g.normal({2})};
      },
      {0, 1, 2}, 10, 6, false);
  conv(
      "conv_transpose2d", {"conv_transpose2d"},
      [](const V& t) { return conv_transpose2d(t[0], t[1], t[2], 2, 1, 1); },
      [](G& g) {
        return V{g.normal({1, 2, 4, 4}), g.normal({2, 3, 3, 3}), g.normal({3})};
      },
      {0, 1, 2}, 19, 64, true, 1);

  // ---- pool ---------------------------------------------------------------------------------
  auto pool = [&v](std::string name, std::vector<std::string> ops, std::function<V(const V&)> f,
                   Shape x, Tolerance tol, bool distinct) {
    v.push_back({.name = std::move(name),
                 .ops = std::move(ops),
                 .fn = std::move(f),
                 .make_inputs =
                     gen([x, distinct](G& g) { return V{distinct ? g.distinct(x) : g.normal(x)}; }),
                 .grad_inputs = {0},
                 .four_d = true,
                 .higher_order = true,
                 .dnnl = true,
                 .tol = tol});
  };
  // Max pooling moves values (forward exact); an input's gradient sums the windows holding it.
  pool(
      "max_pool2d", {"max_pool2d"}, [](const V& t) { return V{max_pool2d(t[0], 3, 2, 1)}; },
      {2, 3, 7, 7}, reduce(1, 4), true);
  pool(
      "max_pool2d.ceil", {"max_pool2d"},
      [](const V& t) { return V{max_pool2d(t[0], 3, 2, 0, 1, true)}; }, {1, 2, 8, 8}, reduce(1, 4),
      true);
  pool(
      "max_pool2d.dilation", {"max_pool2d"},
      [](const V& t) { return V{max_pool2d(t[0], 2, 1, 0, 2)}; }, {1, 2, 6, 6}, reduce(1, 4), true);
  pool(
      "max_pool2d_with_indices", {"max_pool2d_with_indices"},
      [](const V& t) {
        auto [y, i] = max_pool2d_with_indices(t[0], 2);
        return V{y, i};
      },
      {2, 3, 6, 6}, reduce(1, 1), true);
  pool(
      "avg_pool2d", {"avg_pool2d"}, [](const V& t) { return V{avg_pool2d(t[0], 3, 2, 1)}; },
      {2, 3, 7, 7}, multilinear(9, 4), false);
  pool(
      "avg_pool2d.exclude_pad", {"avg_pool2d"},
      [](const V& t) { return V{avg_pool2d(t[0], 3, 2, 1, false, false)}; }, {2, 3, 7, 7},
      multilinear(9, 4), false);
  pool(
      "avg_pool2d.ceil", {"avg_pool2d"},
      [](const V& t) { return V{avg_pool2d(t[0], 3, 2, 1, true)}; }, {1, 2, 8, 8},
      multilinear(9, 4), false);
  pool(
      "adaptive_avg_pool2d", {"adaptive_avg_pool2d"},
      [](const V& t) { return V{adaptive_avg_pool2d(t[0], 3)}; }, {2, 3, 7, 7}, multilinear(9, 4),
      false);
  pool(
      "adaptive_avg_pool2d.global", {"adaptive_avg_pool2d"},
      [](const V& t) { return V{adaptive_avg_pool2d(t[0], 1)}; }, {2, 3, 5, 5}, multilinear(25, 1),
      false);

  // ---- norm ---------------------------------------------------------------------------------
  // Normalisations: K values per statistic; x^ = (x - mean) * rstd has a relative error growing
  // with the spread (max |x - mean| / std, <= 3 for the normal inputs here) squared through the
  // variance: cond 9 (see tests/ops/test_norm_pool_dnnl.cpp's bn_slack for the full bound).
  v.push_back({.name = "batch_norm.train",
               .ops = {"batch_norm"},
               .fn =
                   [](const V& t) {
                     Tensor rm = t[3].clone(), rv = t[4].clone();
                     return V{batch_norm(t[0], t[1], t[2], rm, rv, true, 0.1, 1e-5)};
                   },
               .make_inputs = gen([](G& g) {
                 return V{g.normal({2, 3, 2, 2}, 1.0, 0.5), g.normal({3}, 0.5, 1.0), g.normal({3}),
                          g.normal({3}), g.uniform({3}, 0.5, 1.5)};
               }),
               .grad_inputs = {0, 1, 2},
               .four_d = true,
               .higher_order = true,
               .dnnl = true,
               .tol = reduce(8, 8, 9)});
  v.push_back(
      {.name = "batch_norm.running_stats",
       .ops = {"batch_norm"},
       .fn =
           [](const V& t) {
             Tensor rm = t[1].clone(), rv = t[2].clone();
             batch_norm(t[0], Tensor(), Tensor(), rm, rv, true, 0.1, 1e-5);
             return V{rm, rv};
           },
       .make_inputs = gen([](G& g) {
         return V{g.normal({2, 3, 2, 2}, 1.0, 0.5), g.normal({3}), g.uniform({3}, 0.5, 1.5)};
       }),
       .four_d = true,
       .dnnl = true,
       .tol = reduce(8, 1, 9)});
  v.push_back({.name = "batch_norm.eval",
               .ops = {"batch_norm"},
               .fn = [](const V& t) { return V{batch_norm(t[0], t[1], t[2], t[3], t[4], false)}; },
               .make_inputs = gen([](G& g) {
                 return V{g.normal({2, 3, 3, 3}), g.normal({3}, 0.5, 1.0), g.normal({3}),
                          g.normal({3}), g.uniform({3}, 0.5, 1.5)};
               }),
               .grad_inputs = {0, 1, 2},
               .four_d = true,
               .higher_order = true,
               .tol = reduce(1, 18)});
  v.push_back({.name = "layer_norm",
               .ops = {"layer_norm"},
               .fn = [](const V& t) { return V{layer_norm(t[0], {6}, t[1], t[2])}; },
               .make_inputs = gen([](G& g) {
                 return V{g.normal({4, 6}), g.normal({6}, 0.5, 1.0), g.normal({6})};
               }),
               .grad_inputs = {0, 1, 2},
               .higher_order = true,
               .tol = reduce(6, 6, 9)});
  v.push_back({.name = "group_norm",
               .ops = {"group_norm"},
               .fn = [](const V& t) { return V{group_norm(t[0], 2, t[1], t[2])}; },
               .make_inputs = gen([](G& g) {
                 return V{g.normal({2, 4, 2, 2}), g.normal({4}, 0.5, 1.0), g.normal({4})};
               }),
               .grad_inputs = {0, 1, 2},
               .four_d = true,
               .higher_order = true,
               .tol = reduce(8, 8, 9)});
  v.push_back(
      {.name = "instance_norm",
       .ops = {"instance_norm"},
       .fn = [](const V& t) { return V{instance_norm(t[0], Tensor(), Tensor(), t[1], t[2])}; },
       .make_inputs = gen([](G& g) {
         return V{g.normal({2, 3, 2, 2}), g.normal({3}, 0.5, 1.0), g.normal({3})};
       }),
       .grad_inputs = {0, 1, 2},
       .four_d = true,
       .higher_order = true,
       .tol = reduce(4, 8, 9)});

  // ---- reductions ---------------------------------------------------------------------------
  auto red = [&v](std::string name, std::vector<std::string> ops, std::function<V(const V&)> f,
                  std::function<V(G&)> in, Tolerance tol, bool grads = true, bool higher = true) {
    v.push_back({.name = std::move(name),
                 .ops = std::move(ops),
                 .fn = std::move(f),
                 .make_inputs = gen(std::move(in)),
                 .grad_inputs = grads ? std::vector<int>{0} : std::vector<int>{},
                 .higher_order = higher && grads,
                 .tol = tol});
  };
  auto x345 = [](G& g) { return V{g.normal({3, 4, 5})}; };
  auto d345 = [](G& g) { return V{g.distinct({3, 4, 5})}; };
  red(
      "sum", {"sum"}, [](const V& t) { return V{sum(t[0])}; }, x345, multilinear(60, 1));
  red(
      "sum.dims", {"sum"},
      [](const V& t) {
        return V{sum(t[0], {0, 2}, true)};
      },
      x345, multilinear(15, 1));
  red(
      "mean", {"mean"}, [](const V& t) { return V{mean(t[0])}; }, x345,
      rounded(multilinear(60, 1), 1));
  red(
      "mean.dims", {"mean"}, [](const V& t) { return V{mean(t[0], {1})}; }, x345,
      multilinear(4, 1));
  // var: the squared deviations' sum; relative to it the mean's error enters squared (cond 3).
  red(
      "var", {"var"}, [](const V& t) { return V{var(t[0], {1}, 1)}; }, x345,
      rounded(reduce(4, 4, 3), 3));
  red(
      "stddev", {"stddev"},
      [](const V& t) {
        return V{stddev(t[0], {0, 2}, 0, true)};
      },
      x345, rounded(reduce(15, 15, 3), 4));
  red(
      "max.dim", {"max"},
      [](const V& t) {
        auto [m, i] = max(t[0], 1);
        return V{m, i};
      },
      d345, elem());
  red(
      "min.dim", {"min"},
      [](const V& t) {
        auto [m, i] = min(t[0], 2, true);
        return V{m, i};
      },
      d345, elem());
  red(
      "max.all", {"max"}, [](const V& t) { return V{max(t[0])}; }, d345, elem());
  red(
      "min.all", {"min"}, [](const V& t) { return V{min(t[0])}; }, d345, elem());
  red(
      "argmax", {"argmax"}, [](const V& t) { return V{argmax(t[0], 1)}; }, d345, elem(), false);
  red(
      "argmin", {"argmin"}, [](const V& t) { return V{argmin(t[0], 0, true)}; }, d345, elem(),
      false);
  red(
      "logsumexp", {"logsumexp"}, [](const V& t) { return V{logsumexp(t[0], {2})}; }, x345,
      rounded(reduce(5, 5, 2), 3));
  red(
      "cumsum", {"cumsum"}, [](const V& t) { return V{cumsum(t[0], 1)}; }, x345, multilinear(4, 4));
  // prod: K factors, each rounding once relative to the product (no cancellation).
  red(
      "prod", {"prod"}, [](const V& t) { return V{prod(t[0])}; },
      [](G& g) {
        return V{g.uniform({2, 3}, 0.5, 1.5)};
      },
      reduce(6, 6, 2));
  red(
      "prod.dim", {"prod"}, [](const V& t) { return V{prod(t[0], 1)}; },
      [](G& g) {
        return V{g.uniform({3, 4}, 0.5, 1.5)};
      },
      reduce(4, 4, 2));
  red(
      "norm.p2", {"norm"}, [](const V& t) { return V{norm(t[0], 2.0, {1})}; }, x345,
      reduce(4, 4, 2));
  red(
      "norm.p1", {"norm"}, [](const V& t) { return V{norm(t[0], 1.0)}; },
      [](G& g) {
        return V{g.away({3, 4})};
      },
      reduce(12, 1, 2));
  red(
      "norm.p3", {"norm"}, [](const V& t) { return V{norm(t[0], 3.0, {0}, true)}; }, x345,
      reduce(3, 3, 4));
  red(
      "norm.inf", {"norm"}, [](const V& t) { return V{norm(t[0], INFINITY, {2})}; }, d345, elem());
  red(
      "norm.p0", {"norm"}, [](const V& t) { return V{norm(t[0], 0.0)}; },
      [](G& g) {
        return V{g.small_ints({3, 4}, 3)};
      },
      reduce(12, 1), false);
  red(
      "any", {"any"},
      [](const V& t) {
        return V{any(t[0], {1}), any(t[0])};
      },
      [](G& g) {
        return V{g.small_ints({3, 4}, 2)};
      },
      elem(), false);
  red(
      "all", {"all"},
      [](const V& t) {
        return V{all(t[0], {1}, true), all(t[0])};
      },
      [](G& g) {
        return V{gt(g.uniform({3, 4}, 0.0, 1.5), 0.2)};
      },
      elem(), false);
  red(
      "sum_to", {"sum_to"},
      [](const V& t) {
        return V{sum_to(t[0], {4, 1})};
      },
      x345, multilinear(15, 1));

  // ---- shape --------------------------------------------------------------------------------
  auto shp = [&v](std::string name, std::vector<std::string> ops, std::function<V(const V&)> f,
                  std::function<V(G&)> in, std::vector<int> grads, Tolerance tol = elem()) {
    v.push_back({.name = std::move(name),
                 .ops = std::move(ops),
                 .fn = std::move(f),
                 .make_inputs = gen(std::move(in)),
                 .grad_inputs = std::move(grads),
                 .higher_order = true,
                 .tol = tol});
  };
  auto two = [](G& g) { return V{g.normal({2, 3}), g.normal({2, 3})}; };
  shp("cat", {"cat"}, [](const V& t) { return V{cat({t[0], t[1]}, 1)}; }, two, {0, 1});
  shp("stack", {"stack"}, [](const V& t) { return V{stack({t[0], t[1]}, 1)}; }, two, {0, 1});
  shp(
      "split.size", {"split"}, [](const V& t) { return split(mul(t[0], 1.0), 2, 1); },
      [](G& g) {
        return V{g.normal({2, 5})};
      },
      {0});
  shp(
      "split.sizes", {"split"},
      [](const V& t) {
        return split(mul(t[0], 1.0), {1, 3, 1}, 1);
      },
      [](G& g) {
        return V{g.normal({2, 5})};
      },
      {0});
  shp(
      "chunk", {"chunk"}, [](const V& t) { return chunk(mul(t[0], 1.0), 3, 0); },
      [](G& g) {
        return V{g.normal({5, 2})};
      },
      {0});
  shp(
      "repeat", {"repeat"},
      [](const V& t) {
        return V{repeat(t[0], {2, 1, 3})};
      },
      [](G& g) {
        return V{g.normal({2, 3})};
      },
      {0}, multilinear(1, 6));
  shp(
      "flip", {"flip"},
      [](const V& t) {
        return V{flip(t[0], {0, 2})};
      },
      [](G& g) {
        return V{g.normal({2, 3, 4})};
      },
      {0});
  shp(
      "roll", {"roll"},
      [](const V& t) {
        return V{roll(t[0], {1, -2}, {0, 1})};
      },
      [](G& g) {
        return V{g.normal({3, 4})};
      },
      {0});
  shp(
      "roll.flat", {"roll"}, [](const V& t) { return V{roll(t[0], {5})}; },
      [](G& g) {
        return V{g.normal({3, 4})};
      },
      {0});
  shp(
      "tril", {"tril"}, [](const V& t) { return V{tril(t[0], -1)}; },
      [](G& g) {
        return V{g.normal({2, 4, 4})};
      },
      {0});
  shp(
      "triu", {"triu"}, [](const V& t) { return V{triu(t[0], 1)}; },
      [](G& g) {
        return V{g.normal({4, 5})};
      },
      {0});

  // ---- sort ---------------------------------------------------------------------------------
  shp("sort", {"sort"},
      [](const V& t) {
        auto [s, i] = sort(t[0], 1);
        return V{s, i};
      },
      d345, {0});
  shp("sort.descending", {"sort"},
      [](const V& t) {
        auto [s, i] = sort(t[0], 0, true);
        return V{s, i};
      },
      d345, {0});
  shp("argsort", {"argsort"}, [](const V& t) { return V{argsort(t[0], -1, true)}; }, d345, {});
  shp("topk", {"topk"},
      [](const V& t) {
        auto [s, i] = topk(t[0], 2, -1);
        return V{s, i};
      },
      d345, {0});
  shp("topk.smallest", {"topk"},
      [](const V& t) {
        auto [s, i] = topk(t[0], 3, 1, false);
        return V{s, i};
      },
      d345, {0});

  // ---- indexing -----------------------------------------------------------------------------
  shp(
      "embedding", {"embedding"}, [](const V& t) { return V{embedding(t[0], t[1])}; },
      [](G& g) {
        return V{g.normal({5, 3}), g.index({2, 4}, 5)};
      },
      {0}, multilinear(1, 8));
  shp(
      "embedding.padding_idx", {"embedding"},
      [](const V& t) { return V{embedding(t[0], t[1], 2)}; },
      [](G& g) {
        return V{g.normal({5, 3}), g.ints({2, 0, 2, 4, 1, 2}, {2, 3})};
      },
      {0}, multilinear(1, 6));
  // Rows equal to padding_idx get no gradient by definition (as PyTorch), although the forward
  // reads them: the finite differences cannot agree there. The dtype and backend runs check the
  // zero rows against the reference.
  v.back().no_gradcheck = "padding_idx rows get no gradient by definition";
  shp(
      "index_select", {"index_select"}, [](const V& t) { return V{index_select(t[0], 1, t[1])}; },
      [](G& g) {
        return V{g.normal({3, 4}), g.ints({3, 0, 3, 1, 3})};
      },
      {0}, multilinear(1, 5));
  shp(
      "gather", {"gather"}, [](const V& t) { return V{gather(t[0], 1, t[1])}; },
      [](G& g) {
        return V{g.normal({3, 4}), g.index({3, 5}, 4)};
      },
      {0}, multilinear(1, 5));
  shp(
      "scatter_add", {"scatter_add"},
      [](const V& t) { return V{scatter_add(t[0], 1, t[1], t[2])}; },
      [](G& g) {
        return V{g.normal({3, 4}), g.index({3, 5}, 4), g.normal({3, 5})};
      },
      {0, 2}, rounded(multilinear(6, 1), 6));
  shp(
      "index_add", {"index_add"}, [](const V& t) { return V{index_add(t[0], 0, t[1], t[2], 0.5)}; },
      [](G& g) {
        return V{g.normal({4, 3}), g.ints({1, 3, 1, 0, 1}), g.normal({5, 3})};
      },
      {0, 2}, multilinear(4, 1));
  shp(
      "segment_sum", {"segment_sum"}, [](const V& t) { return V{segment_sum(t[0], t[1], 4)}; },
      [](G& g) {
        return V{g.normal({6, 3}), g.ints({2, 0, 2, 3, 2, 0})};
      },
      {0}, rounded(multilinear(3, 1), 3));
  shp(
      "segment_mean", {"segment_mean"}, [](const V& t) { return V{segment_mean(t[0], t[1], 4)}; },
      [](G& g) {
        return V{g.normal({6, 3}), g.ints({2, 0, 2, 3, 2, 0})};
      },
      {0}, rounded(multilinear(3, 1), 4));
  shp(
      "segment_max", {"segment_max"}, [](const V& t) { return V{segment_max(t[0], t[1], 4)}; },
      [](G& g) {
        return V{g.distinct({6, 3}), g.ints({2, 0, 2, 3, 2, 0})};
      },
      {0});
  shp(
      "segment_softmax", {"segment_softmax"},
      [](const V& t) { return V{segment_softmax(t[0], t[1], 4)}; },
      [](G& g) {
        return V{g.normal({6, 3}), g.ints({2, 0, 2, 3, 2, 0})};
      },
      {0}, rounded(reduce(3, 3, 2), 4));
  const std::pair<ScatterReduce, const char*> scatter_modes[] = {{ScatterReduce::Sum, "sum"},
                                                                 {ScatterReduce::Mean, "mean"},
                                                                 {ScatterReduce::Amax, "amax"},
                                                                 {ScatterReduce::Amin, "amin"}};
  for (const auto& sm : scatter_modes) {
    const ScatterReduce mode = sm.first;
    const char* rname = sm.second;
    for (bool self : {true, false}) {
      const bool sum_like = mode == ScatterReduce::Sum || mode == ScatterReduce::Mean;
      shp(
          std::string("scatter_reduce.") + rname + (self ? "" : ".exclude_self"),
          {"scatter_reduce"},
          [mode, self](const V& t) { return V{scatter_reduce(t[0], 1, t[1], t[2], mode, self)}; },
          [sum_like](G& g) {
            if (sum_like) return V{g.normal({3, 4}), g.index({3, 5}, 4), g.normal({3, 5})};
            Tensor d = g.distinct({3, 9});
            return V{d.narrow(1, 0, 4).contiguous(), g.index({3, 5}, 4),
                     d.narrow(1, 4, 5).contiguous()};
          },
          {0, 2}, sum_like ? multilinear(6, 1) : elem());
    }
  }
  shp(
      "nonzero", {"nonzero"}, [](const V& t) { return V{nonzero(t[0])}; },
      [](G& g) {
        return V{g.small_ints({3, 4}, 2)};
      },
      {});
  shp(
      "one_hot", {"one_hot"}, [](const V& t) { return V{one_hot(t[0], 5)}; },
      [](G& g) {
        return V{g.index({2, 3}, 5)};
      },
      {});

  // ---- resample -----------------------------------------------------------------------------
  auto rs = [&v](std::string name, std::vector<std::string> ops, std::function<Tensor(Tensor)> f,
                 Shape x, Tolerance tol) {
    v.push_back({.name = std::move(name),
                 .ops = std::move(ops),
                 .fn = [f](const V& t) { return V{f(t[0])}; },
                 .make_inputs = gen([x](G& g) { return V{g.normal(x)}; }),
                 .grad_inputs = {0},
                 .four_d = x.size() == 4,
                 .higher_order = true,
                 .tol = tol});
  };
  rs(
      "interpolate.nearest", {"interpolate"},
      [](Tensor x) { return interpolate(x, {.scale_factor = 2.0}); }, {1, 2, 3, 4},
      multilinear(1, 4));
  rs(
      "interpolate.nearest_down", {"interpolate"},
      [](Tensor x) {
        return interpolate(x, {.size = Int2{3, 2}});
      },
      {1, 2, 5, 5}, multilinear(1, 1));
  rs(
      "interpolate.bilinear", {"interpolate"},
      [](Tensor x) {
        return interpolate(x, {.size = Int2{5, 7}, .mode = InterpolateMode::Bilinear});
      },
      {1, 2, 3, 4}, multilinear(4, 16));
  rs(
      "interpolate.bilinear_align_corners", {"interpolate"},
      [](Tensor x) {
        return interpolate(x, {.scale_factor = Double2{1.5, 2.0},
                               .mode = InterpolateMode::Bilinear,
                               .align_corners = true});
      },
      {1, 2, 4, 3}, multilinear(4, 16));
  rs(
      "pad.constant", {"pad"},
      [](Tensor x) {
        return pad(x, {1, 2, -1, 1}, PadMode::Constant, 0.5);
      },
      {1, 2, 3, 4}, elem());
  rs(
      "pad.reflect", {"pad"},
      [](Tensor x) {
        return pad(x, {2, 1, 1, 2}, PadMode::Reflect);
      },
      {1, 2, 3, 4}, multilinear(1, 3));
  rs(
      "pad.replicate", {"pad"},
      [](Tensor x) {
        return pad(x, {2, 1, 1, 2}, PadMode::Replicate);
      },
      {1, 2, 3, 4}, multilinear(1, 12));
  rs(
      "pixel_shuffle", {"pixel_shuffle"}, [](Tensor x) { return pixel_shuffle(x, 2); },
      {1, 8, 2, 3}, elem());
  rs(
      "pixel_unshuffle", {"pixel_unshuffle"}, [](Tensor x) { return pixel_unshuffle(x, 2); },
      {1, 2, 4, 6}, elem());

  // ---- softmax, dropout, losses -------------------------------------------------------------
  // softmax's backward s * (g - sum(g * s)) cancels: cond 2.
  red(
      "softmax", {"softmax"}, [](const V& t) { return V{softmax(t[0], 1)}; },
      [](G& g) {
        return V{g.normal({3, 5})};
      },
      reduce(5, 5, 2));
  red(
      "log_softmax", {"log_softmax"}, [](const V& t) { return V{log_softmax(t[0], 0)}; },
      [](G& g) {
        return V{g.normal({3, 5})};
      },
      reduce(3, 3, 2));
  // A seeded generator: the mask is the same draw on every device (rand_like's contract).
  red(
      "dropout", {"dropout"},
      [](const V& t) {
        Generator g(77);
        return V{dropout(t[0], 0.3, true, &g)};
      },
      [](G& g) {
        return V{g.normal({4, 5})};
      },
      {.roundings = 1});
  red(
      "dropout.eval", {"dropout"}, [](const V& t) { return V{dropout(t[0], 0.3, false)}; },
      [](G& g) {
        return V{g.normal({4, 5})};
      },
      elem());
  auto loss2 = [&v](std::string name, std::vector<std::string> ops,
                    std::function<Tensor(const V&)> f, std::function<V(G&)> in,
                    std::vector<int> grads, Tolerance tol) {
    v.push_back({.name = std::move(name),
                 .ops = std::move(ops),
                 .fn = [f](const V& t) { return V{f(t)}; },
                 .make_inputs = gen(std::move(in)),
                 .grad_inputs = std::move(grads),
                 .higher_order = true,
                 .tol = tol});
  };
  const std::pair<Reduction, const char*> reductions[] = {
      {Reduction::Mean, "mean"}, {Reduction::Sum, "sum"}, {Reduction::None, "none"}};
  auto logits = [](G& g) { return V{g.normal({4, 5}), g.ints({1, 4, 0, 2})}; };
  // Two [3, 4] operands whose values are distinct multiples of 1/4 (kinks of |a - b| away).
  auto distinct_pair = [](G& g) {
    Tensor d = g.distinct({2, 3, 4});
    return V{d.select(0, 0).contiguous(), d.select(0, 1).contiguous()};
  };
  for (const auto& rr : reductions) {
    const Reduction r = rr.first;
    const char* rn = rr.second;
    const Tolerance lt = rounded(reduce(r == Reduction::None ? 5 : 20, 5, 2), 3);
    loss2(
        std::string("cross_entropy.") + rn, {"cross_entropy"},
        [r](const V& t) { return cross_entropy(t[0], t[1], {.reduction = r}); }, logits, {0}, lt);
    loss2(
        std::string("nll_loss.") + rn, {"nll_loss"},
        [r](const V& t) { return nll_loss(t[0], t[1], {.reduction = r}); }, logits, {0},
        multilinear(4, 1));
    auto xy = [](G& g) { return V{g.normal({3, 4}), g.normal({3, 4})}; };
    // Losses are composites of elementwise ops and a reduction, each rounding to a 16-bit dtype.
    const Tolerance et = rounded(reduce(r == Reduction::None ? 1 : 12, 1, 2), 4);
    loss2(
        std::string("mse_loss.") + rn, {"mse_loss"},
        [r](const V& t) { return mse_loss(t[0], t[1], r); }, xy, {0, 1}, et);
    loss2(
        std::string("binary_cross_entropy_with_logits.") + rn, {"binary_cross_entropy_with_logits"},
        [r](const V& t) { return binary_cross_entropy_with_logits(t[0], t[1], {.reduction = r}); },
        [](G& g) {
          return V{g.normal({3, 4}), g.uniform({3, 4}, 0.0, 1.0)};
        },
        {0, 1}, et);
    loss2(
        std::string("l1_loss.") + rn, {"l1_loss"},
        [r](const V& t) { return l1_loss(t[0], t[1], r); }, distinct_pair, {0, 1}, et);
    loss2(
        std::string("smooth_l1_loss.") + rn, {"smooth_l1_loss"},
        [r](const V& t) { return smooth_l1_loss(t[0], t[1], r, 0.6); },
        distinct_pair,  // differences of k/4, never at +-beta = 0.6
        {0, 1}, et);
    loss2(
        std::string("huber_loss.") + rn, {"huber_loss"},
        [r](const V& t) { return huber_loss(t[0], t[1], r, 0.6); }, distinct_pair, {0, 1}, et);
    loss2(
        std::string("binary_cross_entropy.") + rn, {"binary_cross_entropy"},
        [r](const V& t) { return binary_cross_entropy(t[0], t[1], {.reduction = r}); },
        [](G& g) {
          return V{g.uniform({3, 4}, 0.1, 0.9), g.uniform({3, 4}, 0.0, 1.0)};
        },
        {0, 1}, et);
    loss2(
        std::string("gaussian_nll_loss.") + rn, {"gaussian_nll_loss"},
        [r](const V& t) { return gaussian_nll_loss(t[0], t[1], t[2], false, 1e-6, r); },
        [](G& g) {
          return V{g.normal({3, 4}), g.normal({3, 4}), g.uniform({3, 4}, 0.5, 2.0)};
        },
        {0, 1, 2}, et);
  }
  loss2(
      "cross_entropy.smoothing_weight_ignore", {"cross_entropy"},
      [](const V& t) {
        return cross_entropy(t[0], t[1],
                             {.ignore_index = 3, .label_smoothing = 0.1, .weight = t[2]});
      },
      [](G& g) {
        return V{g.normal({4, 5}), g.ints({1, 3, 0, 2}), g.uniform({5}, 0.5, 1.5)};
      },
      {0}, reduce(20, 5, 2));
  loss2(
      "cross_entropy.spatial", {"cross_entropy"},
      [](const V& t) { return cross_entropy(t[0], t[1]); },
      [](G& g) {
        return V{g.normal({2, 3, 2, 2}), g.index({2, 2, 2}, 3)};
      },
      {0}, reduce(24, 3, 2));
  // Class-probability ("soft") targets (issue 30): a floating target of the input's shape;
  // both the logits and the target are differentiated.
  auto probs = [](G& g) { return V{g.normal({4, 5}), g.uniform({4, 5}, 0.0, 0.4)}; };
  for (const auto& rr : reductions) {
    const Reduction r = rr.first;
    loss2(
        std::string("cross_entropy.soft.") + rr.second, {"cross_entropy"},
        [r](const V& t) { return cross_entropy(t[0], t[1], {.reduction = r}); }, probs, {0, 1},
        rounded(reduce(r == Reduction::None ? 5 : 20, 5, 2), 3));
  }
  loss2(
      "cross_entropy.soft.smoothing_weight", {"cross_entropy"},
      [](const V& t) {
        return cross_entropy(t[0], t[1], {.label_smoothing = 0.1, .weight = t[2]});
      },
      [](G& g) {
        return V{g.normal({4, 5}), g.uniform({4, 5}, 0.0, 0.4), g.uniform({5}, 0.5, 1.5)};
      },
      {0, 1}, rounded(reduce(20, 5, 2), 3));
  loss2(
      "cross_entropy.soft.spatial", {"cross_entropy"},
      [](const V& t) { return cross_entropy(t[0], t[1]); },
      [](G& g) {
        return V{g.normal({2, 3, 2, 2}), g.uniform({2, 3, 2, 2}, 0.0, 0.6)};
      },
      {0, 1}, rounded(reduce(24, 3, 2), 3));
  loss2(
      "nll_loss.weight", {"nll_loss"},
      [](const V& t) { return nll_loss(t[0], t[1], {.weight = t[2]}); },
      [](G& g) {
        return V{g.normal({4, 5}), g.ints({1, 4, 0, 2}), g.uniform({5}, 0.5, 1.5)};
      },
      {0}, rounded(reduce(8, 4, 2), 3));  // no gradient for the class weights (as PyTorch)
  loss2(
      "binary_cross_entropy_with_logits.pos_weight", {"binary_cross_entropy_with_logits"},
      [](const V& t) {
        return binary_cross_entropy_with_logits(t[0], t[1],
                                                {.reduction = Reduction::Mean, .pos_weight = t[2]});
      },
      [](G& g) {
        return V{g.normal({3, 4}), g.uniform({3, 4}, 0.0, 1.0), g.uniform({4}, 0.5, 2.0)};
      },
      {0, 1}, rounded(reduce(12, 3, 2), 4));
  loss2(
      "binary_cross_entropy.weight", {"binary_cross_entropy"},
      [](const V& t) { return binary_cross_entropy(t[0], t[1], {.weight = t[2]}); },
      [](G& g) {
        return V{g.uniform({3, 4}, 0.1, 0.9), g.uniform({3, 4}, 0.0, 1.0),
                 g.uniform({4}, 0.5, 1.5)};
      },
      {0, 1}, rounded(reduce(12, 1, 2), 4));
  loss2(
      "gaussian_nll_loss.full_homoscedastic", {"gaussian_nll_loss"},
      [](const V& t) { return gaussian_nll_loss(t[0], t[1], t[2], true); },
      [](G& g) {
        return V{g.normal({3, 4}), g.normal({3, 4}), g.uniform({3, 1}, 0.5, 2.0)};
      },
      {0, 1, 2}, rounded(reduce(12, 4, 2), 4));
  const std::pair<KLDivReduction, const char*> kl[] = {{KLDivReduction::None, "none"},
                                                       {KLDivReduction::Mean, "mean"},
                                                       {KLDivReduction::Sum, "sum"},
                                                       {KLDivReduction::BatchMean, "batchmean"}};
  for (const auto& kr : kl) {
    const KLDivReduction r = kr.first;
    const char* rn = kr.second;
    for (bool log_target : {false, true}) {
      loss2(
          std::string("kl_div.") + rn + (log_target ? ".log_target" : ""), {"kl_div"},
          [r, log_target](const V& t) {
            return kl_div(t[0], log_target ? log(t[1]) : t[1], r, log_target);
          },
          [](G& g) {
            return V{g.normal({3, 4}, 0.5, -1.0), g.uniform({3, 4}, 0.1, 1.0)};
          },
          {0, 1}, rounded(reduce(r == KLDivReduction::None ? 1 : 12, 1, 4), 4));
    }
  }

  // ---- attention ----------------------------------------------------------------------------
  // Composed of matmul, softmax, add/masked_fill: each rounds to a 16-bit dtype (4 roundings);
  // K: the head size and the keys per query.
  auto qkv = [](G& g) { return V{g.normal({2, 3, 4}), g.normal({2, 5, 4}), g.normal({2, 5, 3})}; };
  const Tolerance at{.terms = 5, .grad_terms = 5, .roundings = 4, .cond = 4};
  loss2(
      "scaled_dot_product_attention", {"scaled_dot_product_attention"},
      [](const V& t) { return scaled_dot_product_attention(t[0], t[1], t[2]); }, qkv, {0, 1, 2},
      at);
  loss2(
      "scaled_dot_product_attention.causal", {"scaled_dot_product_attention", "causal_mask"},
      [](const V& t) {
        return scaled_dot_product_attention(t[0], t[1], t[2], causal_mask(3, 5, t[0].device()));
      },
      qkv, {0, 1, 2}, at);
  loss2(
      "scaled_dot_product_attention.is_causal", {"scaled_dot_product_attention"},
      [](const V& t) {
        return scaled_dot_product_attention(t[0], t[1], t[2], Tensor(), 0.0, true, 0.5);
      },
      qkv, {0, 1, 2}, at);
  v.push_back(
      {.name = "scaled_dot_product_attention.float_mask",
       .ops = {"scaled_dot_product_attention"},
       .fn = [](const V& t) { return V{scaled_dot_product_attention(t[0], t[1], t[2], t[3])}; },
       .make_inputs = gen([](G& g) {
         return V{g.normal({2, 3, 4}), g.normal({2, 5, 4}), g.normal({2, 5, 3}), g.normal({3, 5})};
       }),
       .grad_inputs = {0, 1, 2, 3},
       .higher_order = true,
       .tol = at});
  v.push_back({.name = "scaled_dot_product_attention_with_weights",
               .ops = {"scaled_dot_product_attention_with_weights"},
               .fn =
                   [](const V& t) {
                     auto [o, w] = scaled_dot_product_attention_with_weights(t[0], t[1], t[2]);
                     return V{o, w};
                   },
               .make_inputs = gen(qkv),
               .grad_inputs = {0, 1, 2},
               .higher_order = true,
               .tol = at});
  v.push_back({.name = "causal_mask",
               .ops = {"causal_mask"},
               .fn = [](const V& t) { return V{causal_mask(3, 5, t[0].device())}; },
               .make_inputs = gen([](G& g) { return V{g.normal({1})}; })});
  return v;
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = build();
  return cases;
}

const std::vector<OpExclusion>& op_exclusions() {
  static const std::vector<OpExclusion> v{
      // Nothing here yet: in-place ops run as forward cases on a copy, random ops with a
      // seeded generator (the same draw on every device), index-returning ops compare their
      // indices exactly.
  };
  return v;
}

const std::vector<OpExclusion>& op_not_yet_covered() {
  static const std::vector<OpExclusion> v{};
  return v;
}

std::vector<Tensor> to_reference(const std::vector<Tensor>& in) {
  std::vector<Tensor> r;
  for (const Tensor& t : in) {
    if (!t.defined()) {
      r.push_back(t);
      continue;
    }
    Tensor c = t.detach().to(Device::cpu());
    r.push_back(is_floating(c.dtype()) ? c.to(kF64).contiguous() : c.contiguous());
  }
  return r;
}

CaseRun run_case(const OpCase& c, std::vector<Tensor> in, bool backward, bool abs_terms,
                 const std::vector<DType>* w_dtypes) {
  for (int i : c.grad_inputs) {
    Tensor& t = in[static_cast<size_t>(i)];
    t = (abs_terms ? abs(t.detach()) : t.detach().clone(MemoryFormat::Preserve)).detach();
    t.requires_grad_();
  }
  if (abs_terms)
    for (Tensor& t : in)
      if (t.defined() && !t.requires_grad() && is_floating(t.dtype())) t = abs(t);
  std::vector<Tensor> out = c.fn(in);
  CaseRun r;
  Tensor loss;
  for (size_t k = 0; k < out.size(); ++k) {
    const Tensor& o = out[k];
    r.out_dtype.push_back(o.dtype());
    r.out.push_back(o.detach().to(Device::cpu()).to(kF64).contiguous());
    if (!backward || !is_floating(o.dtype()) || !o.requires_grad()) continue;
    Generator g(1234 + k);
    const DType wdt = w_dtypes && k < w_dtypes->size() ? (*w_dtypes)[k] : o.dtype();
    Tensor w = randn(o.shape(), kF64, &g).to(wdt).to(kF64).to(o.device());
    if (abs_terms) w = abs(w);
    Tensor term = sum(mul(o.to(kF64), w));
    loss = loss.defined() ? add(loss, term) : term;
  }
  if (backward && !c.grad_inputs.empty()) {
    if (loss.defined()) loss.backward();
    for (int i : c.grad_inputs) {
      const Tensor& t = in[static_cast<size_t>(i)];
      r.grad_dtype.push_back(t.dtype());
      r.grad.push_back(t.grad().defined() ? t.grad().to(Device::cpu()).to(kF64).contiguous()
                                          : zeros(t.shape(), kF64));
    }
  }
  return r;
}

double acc_unit(DType dt) { return dt == kF64 ? 0x1p-53 : 0x1p-24; }

double dtype_unit(DType dt) {
  switch (dt) {
    case DType::f64:
      return 0x1p-53;
    case DType::f32:
      return 0x1p-24;
    case DType::f16:
      return 0x1p-11;
    case DType::bf16:
      return 0x1p-8;
    default:
      return 0;
  }
}

namespace {

// One tensor's check; returns "" when it holds.
std::string check_tensor(const std::string& what, const Tensor& got, DType dt, const Tensor& exact,
                         const Tensor* scale, int64_t K, int roundings, const Tolerance& tol) {
  std::ostringstream os;
  os << std::setprecision(6);
  if (got.shape() != exact.shape()) {
    os << what << ": shape " << shape_str(got.shape()) << ", expected " << shape_str(exact.shape());
    return os.str();
  }
  const std::vector<double> g = got.to_vector<double>(), e = exact.to_vector<double>();
  if (!is_floating(dt)) {
    for (size_t i = 0; i < g.size(); ++i)
      if (g[i] != e[i]) {
        os << what << " (" << dt << "): element " << i << " is " << g[i] << ", expected " << e[i];
        return os.str();
      }
    return "";
  }
  // exact rounded once to dt: its own rounding error, the part no kernel can avoid
  const std::vector<double> er = exact.to(dt).to(kF64).to_vector<double>();
  std::vector<double> s;
  if (scale) s = scale->to_vector<double>();
  double emax = 0;
  for (double x : e)
    if (std::isfinite(x)) emax = std::max(emax, std::abs(x));
  const double per =
      tol.cond * (static_cast<double>(K + 2) * acc_unit(dt) + roundings * dtype_unit(dt));
  double worst = 0;
  size_t wi = 0;
  double wbound = 0;
  bool bad = false;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(e[i]) && std::isnan(g[i])) continue;
    if (std::isinf(e[i]) && g[i] == e[i]) continue;
    const double S = scale ? std::abs(s[i]) : emax;
    const double bound = std::abs(er[i] - e[i]) + 2 * per * S;
    const double err = std::abs(g[i] - e[i]);
    if (!(err <= bound) && (!bad || err - bound > worst - wbound)) {
      bad = true;
      worst = err;
      wi = i;
      wbound = bound;
    }
  }
  if (!bad) return "";
  os << what << " (" << dt << "): element " << wi << " is " << g[wi] << ", exact " << e[wi]
     << ", error " << worst << " > bound " << wbound;
  return os.str();
}

}  // namespace

std::vector<std::string> check_run(const OpCase& c, const CaseRun& got, const CaseRun& exact,
                                   const CaseRun* scale) {
  std::vector<std::string> bad;
  const bool ml = c.tol.multilinear && scale;
  if (got.out.size() != exact.out.size()) {
    bad.push_back("number of outputs " + std::to_string(got.out.size()) + ", expected " +
                  std::to_string(exact.out.size()));
    return bad;
  }
  for (size_t k = 0; k < got.out.size(); ++k) {
    std::string m =
        check_tensor("output " + std::to_string(k), got.out[k], got.out_dtype[k], exact.out[k],
                     ml ? &scale->out[k] : nullptr, c.tol.terms, c.tol.roundings, c.tol);
    if (!m.empty()) bad.push_back(m);
  }
  for (size_t k = 0; k < got.grad.size() && k < exact.grad.size(); ++k) {
    std::string m = check_tensor("gradient of input " + std::to_string(c.grad_inputs[k]),
                                 got.grad[k], got.grad_dtype[k], exact.grad[k],
                                 ml ? &scale->grad[k] : nullptr, c.tol.grad_terms,
                                 c.tol.roundings + static_cast<int>(c.tol.grad_terms) + 2, c.tol);
    if (!m.empty()) bad.push_back(m);
  }
  return bad;
}

std::vector<MemoryFormat> case_formats(const OpCase& c) {
  if (c.four_d) return {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast};
  return {MemoryFormat::Contiguous};
}

const char* format_name(MemoryFormat f) {
  return f == MemoryFormat::ChannelsLast ? "channels_last" : "contiguous";
}

}  // namespace dltrain::testing
