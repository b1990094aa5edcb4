// Broadcasting elementwise ops and their gradients.
//
// Each op converts its inputs to the promoted dtype, runs one strided CPU loop
// in the accumulation type (float for f16/bf16), and records a node whose
// backward is written with ops; gradients of broadcast inputs are reduced back
// with sum_to. Unary outputs keep the input's memory format.
#include "dltrain/ops/elementwise.hpp"

#include <cmath>

#include "dltrain/autograd/node.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/backend/cpu/cast.hpp"
#include "src/backend/cpu/loops.hpp"
#include "src/ops/common.hpp"

namespace dltrain {

using backend::cpu::binary_map;
using backend::cpu::cast;
using backend::cpu::ternary_map;
using backend::cpu::unary_map;

namespace {

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kSqrt2OverPi = 0.79788456080286535588;

// Output for `shape`, in `like`'s memory format when like has that shape.
Tensor out_like(const Shape& shape, DType dt, const Tensor& like) {
  const MemoryFormat fmt =
      like.shape() == shape ? like.suggest_memory_format() : MemoryFormat::Contiguous;
  return empty(shape, fmt, TensorOptions(dt).with_device(like.device()));
}

// Applies op(acc) -> acc to a floating tensor (ints are computed as float32).
template <class Op>
Tensor unary_float(const char* name, const Tensor& x, Op op) {
  detail::check_defined(name, x, "input");
  detail::require_cpu(name, {&x});
  const DType dt = is_floating(x.dtype()) ? x.dtype() : DType::f32;
  Tensor xin = x.dtype() == dt ? x : x.detach().to(dt);
  Tensor out = out_like(x.shape(), dt, x);
  dispatch_floating(dt, name, [&]<class T>() {
    unary_map<T, T>(out, xin, [&](T v) { return T(op(static_cast<acc_t<T>>(v))); });
  });
  return out;
}

// op(acc a, acc b) -> acc on two same-dtype floating tensors (broadcasting), for backward kernels.
template <class Op>
Tensor binary_float(const char* name, const Tensor& a, const Tensor& b, Op op) {
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  const DType dt = promote_types(a.dtype(), b.dtype());
  Tensor ac = a.dtype() == dt ? a : a.to(dt), bc = b.dtype() == dt ? b : b.to(dt);
  Tensor out = out_like(shape, dt, a);
  dispatch_floating(dt, name, [&]<class T>() {
    binary_map<T, T, T>(out, ac, bc, [&](T x, T y) {
      return T(op(static_cast<acc_t<T>>(x), static_cast<acc_t<T>>(y)));
    });
  });
  return out;
}

enum class BinOp { Add, Sub, Mul, Div, Max, Min };

// Raw arithmetic with promotion and broadcasting (no autograd).
Tensor binary_raw(const char* name, BinOp kind, const Tensor& a, const Tensor& b, double alpha) {
  detail::check_defined(name, a, "self");
  detail::check_defined(name, b, "other");
  detail::require_cpu(name, {&a, &b});
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  DType dt = promote_types(a.dtype(), b.dtype());
  if (kind == BinOp::Div && !is_floating(dt)) dt = DType::f32;  // true division
  if (dt == DType::b8) dt = DType::u8;
  Tensor ac = a.dtype() == dt ? a : a.detach().to(dt);
  Tensor bc = b.dtype() == dt ? b : b.detach().to(dt);
  Tensor out = out_like(shape, dt, a);
  dispatch_numeric(dt, name, [&]<class T>() {
    using A = acc_t<T>;
    const A al = static_cast<A>(alpha);
    auto run = [&](auto f) {
      binary_map<T, T, T>(out, ac, bc,
                          [&](T x, T y) { return cast<T>(f(cast<A>(x), cast<A>(y))); });
    };
    switch (kind) {
      case BinOp::Add:
        if (alpha == 1.0)
          run([](A x, A y) { return x + y; });
        else
          run([al](A x, A y) { return x + al * y; });
        break;
      case BinOp::Sub:
        if (alpha == 1.0)
          run([](A x, A y) { return x - y; });
        else
          run([al](A x, A y) { return x - al * y; });
        break;
      case BinOp::Mul:
        run([](A x, A y) { return x * y; });
        break;
      case BinOp::Div:
        if constexpr (std::is_floating_point_v<A>) run([](A x, A y) { return x / y; });
        break;
      case BinOp::Max:
        run([](A x, A y) { return (x > y || x != x) ? x : y; });
        break;
      case BinOp::Min:
        run([](A x, A y) { return (x < y || x != x) ? x : y; });
        break;
    }
  });
  return out;
}

// A 0-d tensor holding `v` in the dtype a scalar op with `t` computes in.
Tensor wrap_scalar(const Tensor& t, double v) {
  DType dt = t.dtype();
  if (!is_floating(dt) && v != std::floor(v)) dt = DType::f32;
  if (dt == DType::b8) dt = DType::i64;
  return scalar_tensor(v, TensorOptions(dt).with_device(t.device()));
}

// What a backward closure needs to know of an input it does not otherwise use.
struct Meta {
  Shape shape;
  DType dtype;
  bool requires_grad;
};
Meta meta(const Tensor& t) { return {t.shape(), t.dtype(), t.requires_grad()}; }

Tensor grad_for(const Tensor& g, const Meta& m) { return sum_to(g, m.shape).to(m.dtype); }
Tensor grad_for(const Tensor& g, const Tensor& input) { return grad_for(g, meta(input)); }

void check_inplace(const char* op, const Tensor& self) {
  DLTRAIN_CHECK(self.defined(), op, ": self is undefined");
  DLTRAIN_CHECK(!(autograd::grad_mode_enabled() && self.requires_grad()), op,
                ": in-place update of a tensor that requires grad while grad mode is on; wrap the "
                "update in NoGradGuard (as optimizers do) or work on a detach()ed copy");
}

Tensor compare(const char* name, const Tensor& a, const Tensor& b, int kind) {
  detail::require_cpu(name, {&a, &b});
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  const DType dt = promote_types(a.dtype(), b.dtype());
  Tensor ac = a.dtype() == dt ? a : a.detach().to(dt), bc = b.dtype() == dt ? b : b.detach().to(dt);
  Tensor out = empty(shape, TensorOptions(DType::b8).with_device(a.device()));
  dispatch_all(dt, [&]<class T>() {
    using A = acc_t<T>;
    auto run = [&](auto f) {
      binary_map<bool, T, T>(out, ac, bc, [&](T x, T y) { return f(cast<A>(x), cast<A>(y)); });
    };
    switch (kind) {
      case 0:
        run([](A x, A y) { return x == y; });
        break;
      case 1:
        run([](A x, A y) { return x != y; });
        break;
      case 2:
        run([](A x, A y) { return x < y; });
        break;
      case 3:
        run([](A x, A y) { return x <= y; });
        break;
      case 4:
        run([](A x, A y) { return x > y; });
        break;
      default:
        run([](A x, A y) { return x >= y; });
        break;
    }
  });
  return out;
}

}  // namespace

// --- binary arithmetic ------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  Tensor out = binary_raw("add", BinOp::Add, a, b, alpha);
  autograd::record(
      "add", {a, b}, {out}, [a = meta(a), b = meta(b), alpha](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{
            a.requires_grad ? grad_for(g[0], a) : Tensor(),
            b.requires_grad ? grad_for(alpha == 1 ? g[0] : mul(g[0], alpha), b) : Tensor()};
      });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  Tensor out = binary_raw("sub", BinOp::Sub, a, b, alpha);
  autograd::record(
      "sub", {a, b}, {out}, [a = meta(a), b = meta(b), alpha](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{a.requires_grad ? grad_for(g[0], a) : Tensor(),
                                   b.requires_grad ? grad_for(mul(g[0], -alpha), b) : Tensor()};
      });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw("mul", BinOp::Mul, a, b, 1.0);
  autograd::record("mul", {a, b}, {out},
                   [a = a.detach(), b = b.detach(), ra = a.requires_grad(),
                    rb = b.requires_grad()](const std::vector<Tensor>& g) {
                     return std::vector<Tensor>{ra ? grad_for(mul(g[0], b), a) : Tensor(),
                                                rb ? grad_for(mul(g[0], a), b) : Tensor()};
                   });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw("div", BinOp::Div, a, b, 1.0);
  autograd::record("div", {a, b}, {out},
                   [a = a.detach(), b = b.detach(), ra = a.requires_grad(),
                    rb = b.requires_grad()](const std::vector<Tensor>& g) {
                     Tensor ga, gb;
                     if (ra) ga = grad_for(div(g[0], b), a);
                     if (rb) gb = grad_for(neg(div(mul(g[0], a), mul(b, b))), b);
                     return std::vector<Tensor>{ga, gb};
                   });
  return out;
}

Tensor add(const Tensor& a, double b) { return add(a, wrap_scalar(a, b)); }
Tensor sub(const Tensor& a, double b) { return sub(a, wrap_scalar(a, b)); }
Tensor mul(const Tensor& a, double b) { return mul(a, wrap_scalar(a, b)); }
Tensor div(const Tensor& a, double b) { return div(a, wrap_scalar(a, b)); }

namespace {
Tensor extremum(const char* name, BinOp kind, const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw(name, kind, a, b, 1.0);
  autograd::record(name, {a, b}, {out},
                   [a = a.detach(), b = b.detach(), ra = a.requires_grad(), rb = b.requires_grad(),
                    kind](const std::vector<Tensor>& g) {
                     // Share of the gradient that goes to a: 1 where a wins, 0.5 on ties, 0 where b
                     // wins.
                     Tensor wa = binary_float("extremum_backward", a, b, [kind](auto x, auto y) {
                       using A = decltype(x);
                       if (x == y) return A(0.5);
                       return (kind == BinOp::Max ? x > y : x < y) ? A(1) : A(0);
                     });
                     Tensor ga, gb;
                     if (ra) ga = grad_for(mul(g[0], wa), a);
                     if (rb) gb = grad_for(mul(g[0], add(neg(wa), 1.0)), b);
                     return std::vector<Tensor>{ga, gb};
                   });
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum("maximum", BinOp::Max, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum("minimum", BinOp::Min, a, b); }

// --- unary ----------------------------------------------------------------------

Tensor neg(const Tensor& x) {
  Tensor out = is_floating(x.dtype()) ? unary_float("neg", x, [](auto v) { return -v; })
                                      : mul(x.detach(), -1.0);
  autograd::record("neg", {x}, {out},
                   [](const std::vector<Tensor>& g) { return std::vector<Tensor>{neg(g[0])}; });
  return out;
}

Tensor exp(const Tensor& x) {
  Tensor out = unary_float("exp", x, [](auto v) { return std::exp(v); });
  autograd::record("exp", {x}, {out}, [o = out.detach()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{mul(g[0], o)};
  });
  return out;
}

Tensor log(const Tensor& x) {
  Tensor out = unary_float("log", x, [](auto v) { return std::log(v); });
  autograd::record("log", {x}, {out}, [x = x.detach()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{div(g[0], x)};
  });
  return out;
}

Tensor sqrt(const Tensor& x) {
  Tensor out = unary_float("sqrt", x, [](auto v) { return std::sqrt(v); });
  autograd::record("sqrt", {x}, {out}, [o = out.detach()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{div(mul(g[0], 0.5), o)};
  });
  return out;
}

Tensor rsqrt(const Tensor& x) {
  Tensor out = unary_float("rsqrt", x, [](auto v) { return decltype(v)(1) / std::sqrt(v); });
  autograd::record("rsqrt", {x}, {out}, [o = out.detach()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{mul(g[0], mul(pow(o, 3.0), -0.5))};
  });
  return out;
}

Tensor abs(const Tensor& x) {
  Tensor out = unary_float("abs", x, [](auto v) { return std::abs(v); });
  autograd::record("abs", {x}, {out}, [x = x.detach()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{binary_float("abs_backward", g[0], x, [](auto gv, auto v) {
      using A = decltype(v);
      return v > A(0) ? gv : (v < A(0) ? -gv : A(0));
    })};
  });
  return out;
}

Tensor square(const Tensor& x) { return mul(x, x); }

Tensor pow(const Tensor& x, double e) {
  Tensor out =
      unary_float("pow", x, [e](auto v) { return std::pow(v, static_cast<decltype(v)>(e)); });
  autograd::record("pow", {x}, {out}, [x = x.detach(), e](const std::vector<Tensor>& g) {
    if (e == 0.0) return std::vector<Tensor>{zeros_like(x)};
    return std::vector<Tensor>{mul(g[0], mul(pow(x, e - 1.0), e))};
  });
  return out;
}

Tensor pow(const Tensor& x, const Tensor& y) {
  detail::require_cpu("pow", {&x, &y});
  Tensor out = binary_float("pow", x, y, [](auto a, auto b) { return std::pow(a, b); });
  autograd::record("pow", {x, y}, {out},
                   [x = x.detach(), y = y.detach(), o = out.detach(), rx = x.requires_grad(),
                    ry = y.requires_grad()](const std::vector<Tensor>& g) {
                     Tensor gx, gy;
                     if (rx) gx = grad_for(mul(g[0], mul(y, pow(x, sub(y, 1.0)))), x);
                     if (ry) gy = grad_for(mul(g[0], mul(o, log(x))), y);
                     return std::vector<Tensor>{gx, gy};
                   });
  return out;
}

Tensor relu(const Tensor& x) {
  Tensor out =
      unary_float("relu", x, [](auto v) { return v > decltype(v)(0) ? v : decltype(v)(0); });
  autograd::record("relu", {x}, {out}, [o = out.detach()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{binary_float("relu_backward", g[0], o, [](auto gv, auto v) {
      return v > decltype(v)(0) ? gv : decltype(v)(0);
    })};
  });
  return out;
}

Tensor leaky_relu(const Tensor& x, double slope) {
  Tensor out = unary_float("leaky_relu", x, [slope](auto v) {
    return v > decltype(v)(0) ? v : v * static_cast<decltype(v)>(slope);
  });
  autograd::record("leaky_relu", {x}, {out}, [x = x.detach(), slope](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{
        binary_float("leaky_relu_backward", g[0], x, [slope](auto gv, auto v) {
          return v > decltype(v)(0) ? gv : gv * static_cast<decltype(v)>(slope);
        })};
  });
  return out;
}

Tensor gelu(const Tensor& x, bool approximate) {
  Tensor out = unary_float("gelu", x, [approximate](auto v) {
    using A = decltype(v);
    if (approximate)
      return A(0.5) * v * (A(1) + std::tanh(A(kSqrt2OverPi) * (v + A(0.044715) * v * v * v)));
    return A(0.5) * v * (A(1) + std::erf(v * A(kSqrt1_2)));
  });
  autograd::record("gelu", {x}, {out}, [x = x.detach(), approximate](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{
        binary_float("gelu_backward", g[0], x, [approximate](auto gv, auto v) {
          using A = decltype(v);
          if (approximate) {
            const A inner = A(kSqrt2OverPi) * (v + A(0.044715) * v * v * v);
            const A t = std::tanh(inner);
            const A dinner = A(kSqrt2OverPi) * (A(1) + A(3 * 0.044715) * v * v);
            return gv * (A(0.5) * (A(1) + t) + A(0.5) * v * (A(1) - t * t) * dinner);
          }
          const A cdf = A(0.5) * (A(1) + std::erf(v * A(kSqrt1_2)));
          const A pdf = A(kInvSqrt2Pi) * std::exp(A(-0.5) * v * v);
          return gv * (cdf + v * pdf);
        })};
  });
  return out;
}

Tensor sigmoid(const Tensor& x) {
  Tensor out = unary_float("sigmoid", x, [](auto v) {
    using A = decltype(v);
    return v >= A(0) ? A(1) / (A(1) + std::exp(-v)) : std::exp(v) / (A(1) + std::exp(v));
  });
  autograd::record("sigmoid", {x}, {out}, [o = out.detach()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{binary_float("sigmoid_backward", g[0], o, [](auto gv, auto s) {
      return gv * s * (decltype(s)(1) - s);
    })};
  });
  return out;
}

Tensor tanh(const Tensor& x) {
  Tensor out = unary_float("tanh", x, [](auto v) { return std::tanh(v); });
  autograd::record("tanh", {x}, {out}, [o = out.detach()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{binary_float(
        "tanh_backward", g[0], o, [](auto gv, auto t) { return gv * (decltype(t)(1) - t * t); })};
  });
  return out;
}

Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  DLTRAIN_CHECK(!(lo && hi && *lo > *hi), "clamp: min (", *lo, ") is greater than max (", *hi, ")");
  const double l = lo.value_or(-INFINITY), h = hi.value_or(INFINITY);
  Tensor out = unary_float("clamp", x, [l, h](auto v) {
    using A = decltype(v);
    return v < A(l) ? A(l) : (v > A(h) ? A(h) : v);
  });
  autograd::record("clamp", {x}, {out}, [x = x.detach(), l, h](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{binary_float("clamp_backward", g[0], x, [l, h](auto gv, auto v) {
      using A = decltype(v);
      return (v >= A(l) && v <= A(h)) ? gv : A(0);
    })};
  });
  return out;
}

// --- selection --------------------------------------------------------------------

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  detail::require_cpu("where", {&cond, &a, &b});
  DLTRAIN_CHECK(cond.dtype() == DType::b8 || cond.dtype() == DType::u8,
                "where: condition must be a bool tensor but has dtype ", cond.dtype(),
                "; build it with a comparison such as gt(x, 0)");
  const Shape shape =
      broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  const DType dt = promote_types(a.dtype(), b.dtype());
  Tensor ac = a.dtype() == dt ? a.detach() : a.detach().to(dt);
  Tensor bc = b.dtype() == dt ? b.detach() : b.detach().to(dt);
  Tensor c = cond.dtype() == DType::b8 ? cond : ne(cond, 0.0);
  Tensor out = out_like(shape, dt, a);
  dispatch_all(dt, [&]<class T>() {
    ternary_map<T, bool, T, T>(out, c, ac, bc, [](bool k, T x, T y) { return k ? x : y; });
  });
  autograd::record(
      "where", {a, b}, {out}, [c, a = meta(a), b = meta(b)](const std::vector<Tensor>& g) {
        Tensor z = zeros({}, g[0].options());
        return std::vector<Tensor>{a.requires_grad ? grad_for(where(c, g[0], z), a) : Tensor(),
                                   b.requires_grad ? grad_for(where(c, z, g[0]), b) : Tensor()};
      });
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  DLTRAIN_CHECK(broadcast_shapes(x.shape(), mask.shape(), "masked_fill") == x.shape(),
                "masked_fill: mask of shape ", shape_str(mask.shape()),
                " does not broadcast to the input's shape ", shape_str(x.shape()));
  return where(mask, scalar_tensor(value, TensorOptions(x.dtype()).with_device(x.device())), x);
}

Tensor eq(const Tensor& a, const Tensor& b) { return compare("eq", a, b, 0); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare("ne", a, b, 1); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare("lt", a, b, 2); }
Tensor le(const Tensor& a, const Tensor& b) { return compare("le", a, b, 3); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare("gt", a, b, 4); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare("ge", a, b, 5); }
Tensor eq(const Tensor& a, double b) { return eq(a, wrap_scalar(a, b)); }
Tensor ne(const Tensor& a, double b) { return ne(a, wrap_scalar(a, b)); }
Tensor lt(const Tensor& a, double b) { return lt(a, wrap_scalar(a, b)); }
Tensor le(const Tensor& a, double b) { return le(a, wrap_scalar(a, b)); }
Tensor gt(const Tensor& a, double b) { return gt(a, wrap_scalar(a, b)); }
Tensor ge(const Tensor& a, double b) { return ge(a, wrap_scalar(a, b)); }

Tensor logical_not(const Tensor& x) { return eq(x, 0.0); }

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape()) return false;
  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) || std::isnan(vb[i])) return false;
    if (std::abs(va[i] - vb[i]) > atol + rtol * std::abs(vb[i])) return false;
  }
  return true;
}

// --- operators ------------------------------------------------------------------

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(double a, const Tensor& b) { return add(neg(b), a); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator/(double a, const Tensor& b) { return div(wrap_scalar(b, a), b); }

// --- in place --------------------------------------------------------------------

namespace {
template <class F>
Tensor& inplace(const char* name, Tensor& self, const std::vector<Tensor>& others, F f) {
  check_inplace(name, self);
  detail::require_cpu(name, {&self});
  for (const Tensor& o : others) {
    detail::require_cpu(name, {&self, &o});
    DLTRAIN_CHECK(broadcast_shapes(self.shape(), o.shape(), name) == self.shape(), name,
                  ": operand of shape ", shape_str(o.shape()),
                  " does not broadcast to self's shape ", shape_str(self.shape()));
  }
  dispatch_numeric(self.dtype(), name, [&]<class T>() {
    std::vector<Tensor> conv;
    for (const Tensor& o : others)
      conv.push_back(o.dtype() == self.dtype() ? o.detach() : o.detach().to(self.dtype()));
    f.template operator()<T>(conv);
  });
  return self;
}
}  // namespace

Tensor& add_(Tensor& self, const Tensor& other, double alpha) {
  return inplace("add_", self, {other}, [&]<class T>(const std::vector<Tensor>& o) {
    using A = acc_t<T>;
    const A al = static_cast<A>(alpha);
    binary_map<T, T, T>(self, self, o[0],
                        [al](T x, T y) { return cast<T>(cast<A>(x) + al * cast<A>(y)); });
  });
}

Tensor& mul_(Tensor& self, const Tensor& other) {
  return inplace("mul_", self, {other}, [&]<class T>(const std::vector<Tensor>& o) {
    using A = acc_t<T>;
    binary_map<T, T, T>(self, self, o[0],
                        [](T x, T y) { return cast<T>(cast<A>(x) * cast<A>(y)); });
  });
}

Tensor& mul_(Tensor& self, double v) { return mul_(self, wrap_scalar(self, v).to(self.dtype())); }
Tensor& add_(Tensor& self, double v) {
  return add_(self, wrap_scalar(self, v).to(self.dtype()), 1.0);
}

Tensor& addcmul_(Tensor& self, const Tensor& t1, const Tensor& t2, double value) {
  return inplace("addcmul_", self, {t1, t2}, [&]<class T>(const std::vector<Tensor>& o) {
    using A = acc_t<T>;
    const A v = static_cast<A>(value);
    ternary_map<T, T, T, T>(self, self, o[0], o[1], [v](T s, T x, T y) {
      return cast<T>(cast<A>(s) + v * cast<A>(x) * cast<A>(y));
    });
  });
}

Tensor& addcdiv_(Tensor& self, const Tensor& t1, const Tensor& t2, double value) {
  return inplace("addcdiv_", self, {t1, t2}, [&]<class T>(const std::vector<Tensor>& o) {
    using A = acc_t<T>;
    const A v = static_cast<A>(value);
    ternary_map<T, T, T, T>(self, self, o[0], o[1], [v](T s, T x, T y) {
      return cast<T>(cast<A>(s) + v * cast<A>(x) / cast<A>(y));
    });
  });
}

}  // namespace dltrain
