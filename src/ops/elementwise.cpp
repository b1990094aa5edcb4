// Broadcasting elementwise ops and their gradients.
//
// Each op converts its inputs to the promoted dtype, runs one strided loop in the
// accumulation type (float for f16/bf16) -- on the CPU, or the CUDA kernel of the same op
// code (backend::cuda, src/backend/cuda/elementwise.hpp) when the inputs are on a CUDA
// device -- and records a node whose backward is written with ops; gradients of broadcast
// inputs are reduced back with sum_to. The unary maps and the fused gradient kernels take
// their formula from one functor per op (src/ops/elementwise_ops.hpp), which the CUDA kernels
// run too; the op code also gives the error-message name. Unary outputs keep the input's
// memory format.
#include "dltrain/ops/elementwise.hpp"

#include <cmath>

#include "dltrain/autograd/node.hpp"
#include "dltrain/ops/reduction.hpp"
#include "src/backend/cpu/cast.hpp"
#include "src/backend/cpu/loops.hpp"
#include "src/backend/cuda/elementwise.hpp"
#include "src/core/trace.hpp"
#include "src/ops/common.hpp"
#include "src/ops/elementwise_ops.hpp"

namespace dltrain {

using backend::cpu::binary_map;
using backend::cpu::cast;
using backend::cpu::ternary_map;
using backend::cpu::unary_map;
namespace cu = backend::cuda;
using cu::BinaryOp;
using cu::CompareOp;
using cu::GradOp;
using cu::UnaryOp;

namespace {

using ew::math::kInvSqrt2Pi;
using ew::math::kSqrt2OverPi;

constexpr auto kHigher = autograd::HigherOrder::Supported;

// True inside a backward function run by a create_graph backward: formulas then use
// differentiable ops instead of fused gradient kernels (the kernels stay the fast path).
bool creating_graph() { return autograd::grad_mode_enabled(); }

// g where mask holds, else 0 (differentiable in g; the mask is piecewise constant).
Tensor grad_where(const Tensor& mask, const Tensor& g) {
  return where(mask, g, zeros({}, g.options()));
}

// Output for `shape`, in `like`'s memory format when like has that shape.
Tensor out_like(const Shape& shape, DType dt, const Tensor& like) {
  const MemoryFormat fmt =
      like.shape() == shape ? like.suggest_memory_format() : MemoryFormat::Contiguous;
  return empty(shape, fmt, TensorOptions(dt).with_device(like.device()));
}

// Applies the map Op (its functor's fwd in src/ops/elementwise_ops.hpp, parameters a, b) to a
// floating tensor (ints are computed as float32), on the CPU or CUDA.
template <UnaryOp Op>
Tensor unary_float(const Tensor& x, double a = 0, double b = 0) {
  const char* name = cu::op_name(Op);
  detail::check_defined(name, x, "input");
  const DType dt = is_floating(x.dtype()) ? x.dtype() : DType::f32;
  Tensor xin = x.dtype() == dt ? x : x.detach().to(dt);
  Tensor out = out_like(x.shape(), dt, x);
  if (x.device().is_cuda()) {
    cu::unary(Op, out, xin, a, b);
    return out;
  }
  dispatch_floating(dt, name, [&]<class T>() {
    using A = acc_t<T>;
    using Fn = typename ew::unary_fn<Op>::type;
    const A pa = static_cast<A>(a), pb = static_cast<A>(b);
    unary_map<T, T>(out, xin, [pa, pb](T v) { return T(Fn::fwd(static_cast<A>(v), pa, pb)); });
  });
  return out;
}

// op(acc a, acc b) -> acc on two floating tensors (promoted, broadcasting): backward kernels
// (code a GradOp, parameters p0, p1) and pow (BinaryOp::Pow).
template <class Code, class Op>
Tensor binary_float(Code code, const Tensor& a, const Tensor& b, Op op, double p0 = 0,
                    double p1 = 0) {
  const char* name = cu::op_name(code);
  detail::check_same_device(name, {&a, &b});
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  const DType dt = promote_types(a.dtype(), b.dtype());
  Tensor ac = a.dtype() == dt ? a : a.to(dt), bc = b.dtype() == dt ? b : b.to(dt);
  Tensor out = out_like(shape, dt, a);
  if (a.device().is_cuda()) {
    if constexpr (std::is_same_v<Code, BinaryOp>)
      cu::binary(code, out, ac, bc, p0);
    else
      cu::binary_grad(code, out, ac, bc, p0, p1);
    return out;
  }
  dispatch_floating(dt, name, [&]<class T>() {
    binary_map<T, T, T>(out, ac, bc, [&](T x, T y) {
      return T(op(static_cast<acc_t<T>>(x), static_cast<acc_t<T>>(y)));
    });
  });
  return out;
}

// The fused gradient kernel Op (its functor's bwd in src/ops/elementwise_ops.hpp): out =
// bwd(g, v) with parameters a, b, promoted and broadcast, on the CPU or CUDA.
template <GradOp Op>
Tensor grad_float(const Tensor& g, const Tensor& v, double a = 0, double b = 0) {
  using Fn = typename ew::grad_fn<Op>::type;
  return binary_float(
      Op, g, v,
      [a, b](auto gv, auto vv) {
        using A = decltype(vv);
        return Fn::bwd(gv, vv, A(a), A(b));
      },
      a, b);
}

// Raw arithmetic with promotion and broadcasting (no autograd); kind is Add, Sub, Mul, Div,
// Max or Min.
Tensor binary_raw(BinaryOp kind, const Tensor& a, const Tensor& b, double alpha) {
  const char* name = cu::op_name(kind);
  detail::check_defined(name, a, "self");
  detail::check_defined(name, b, "other");
  detail::check_same_device(name, {&a, &b});
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  DType dt = promote_types(a.dtype(), b.dtype());
  if (kind == BinaryOp::Div && !is_floating(dt)) dt = DType::f32;  // true division
  if (dt == DType::b8) dt = DType::u8;
  Tensor ac = a.dtype() == dt ? a : a.detach().to(dt);
  Tensor bc = b.dtype() == dt ? b : b.detach().to(dt);
  Tensor out = out_like(shape, dt, a);
  if (a.device().is_cuda()) {
    cu::binary(kind, out, ac, bc, alpha);
    return out;
  }
  dispatch_numeric(dt, name, [&]<class T>() {
    using A = acc_t<T>;
    const A al = static_cast<A>(alpha);
    auto run = [&](auto f) {
      binary_map<T, T, T>(out, ac, bc,
                          [&](T x, T y) { return cast<T>(f(cast<A>(x), cast<A>(y))); });
    };
    switch (kind) {
      case BinaryOp::Add:
        if (alpha == 1.0)
          run([](A x, A y) { return x + y; });
        else
          run([al](A x, A y) { return x + al * y; });
        break;
      case BinaryOp::Sub:
        if (alpha == 1.0)
          run([](A x, A y) { return x - y; });
        else
          run([al](A x, A y) { return x - al * y; });
        break;
      case BinaryOp::Mul:
        run([](A x, A y) { return x * y; });
        break;
      case BinaryOp::Div:
        if constexpr (std::is_floating_point_v<A>) run([](A x, A y) { return x / y; });
        break;
      case BinaryOp::Max:
        run([](A x, A y) { return (x > y || x != x) ? x : y; });
        break;
      case BinaryOp::Min:
        run([](A x, A y) { return (x < y || x != x) ? x : y; });
        break;
      case BinaryOp::Pow:
        DLTRAIN_FAIL("binary_raw: pow goes through binary_float");
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

Tensor compare(const char* name, const Tensor& a, const Tensor& b, CompareOp kind) {
  // A scope of its own: the profiler times it, and export_onnx records it (Equal, Less, ...).
  DLTRAIN_OP_SCOPE(name, a, b);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({a, b}, {}, [&] { return compare(name, a, b, kind); });
    });
  detail::check_defined(name, a, "self");
  detail::check_defined(name, b, "other");
  detail::check_same_device(name, {&a, &b});
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  const DType dt = promote_types(a.dtype(), b.dtype());
  Tensor ac = a.dtype() == dt ? a : a.detach().to(dt), bc = b.dtype() == dt ? b : b.detach().to(dt);
  Tensor out = empty(shape, TensorOptions(DType::b8).with_device(a.device()));
  if (a.device().is_cuda()) {
    cu::compare(kind, out, ac, bc);
    return out;
  }
  dispatch_all(dt, [&]<class T>() {
    using A = acc_t<T>;
    auto run = [&](auto f) {
      binary_map<bool, T, T>(out, ac, bc, [&](T x, T y) { return f(cast<A>(x), cast<A>(y)); });
    };
    switch (kind) {
      case CompareOp::Eq:
        run([](A x, A y) { return x == y; });
        break;
      case CompareOp::Ne:
        run([](A x, A y) { return x != y; });
        break;
      case CompareOp::Lt:
        run([](A x, A y) { return x < y; });
        break;
      case CompareOp::Le:
        run([](A x, A y) { return x <= y; });
        break;
      case CompareOp::Gt:
        run([](A x, A y) { return x > y; });
        break;
      case CompareOp::Ge:
        run([](A x, A y) { return x >= y; });
        break;
    }
  });
  return out;
}

}  // namespace

// --- binary arithmetic ------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  DLTRAIN_OP_SCOPE("add", a, b);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({a, b}, {{"alpha", alpha}}, [&] { return add(a, b, alpha); });
    });
  Tensor out = binary_raw(BinaryOp::Add, a, b, alpha);
  autograd::record(
      "add", {a, b}, {out},
      [a = meta(a), b = meta(b), alpha](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{
            a.requires_grad ? grad_for(g[0], a) : Tensor(),
            b.requires_grad ? grad_for(alpha == 1 ? g[0] : mul(g[0], alpha), b) : Tensor()};
      },
      kHigher);
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  DLTRAIN_OP_SCOPE("sub", a, b);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({a, b}, {{"alpha", alpha}}, [&] { return sub(a, b, alpha); });
    });
  Tensor out = binary_raw(BinaryOp::Sub, a, b, alpha);
  autograd::record(
      "sub", {a, b}, {out},
      [a = meta(a), b = meta(b), alpha](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{a.requires_grad ? grad_for(g[0], a) : Tensor(),
                                   b.requires_grad ? grad_for(mul(g[0], -alpha), b) : Tensor()};
      },
      kHigher);
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  DLTRAIN_OP_SCOPE("mul", a, b);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({a, b}, {}, [&] { return mul(a, b); });
    });
  Tensor out = binary_raw(BinaryOp::Mul, a, b, 1.0);
  autograd::record(
      "mul", {a, b}, {out},
      [a, b, ra = a.requires_grad(), rb = b.requires_grad()](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{ra ? grad_for(mul(g[0], b), a) : Tensor(),
                                   rb ? grad_for(mul(g[0], a), b) : Tensor()};
      },
      kHigher);
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  DLTRAIN_OP_SCOPE("div", a, b);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({a, b}, {}, [&] { return div(a, b); });
    });
  Tensor out = binary_raw(BinaryOp::Div, a, b, 1.0);
  autograd::record(
      "div", {a, b}, {out},
      [a, b, ra = a.requires_grad(), rb = b.requires_grad()](const std::vector<Tensor>& g) {
        Tensor ga, gb;
        if (ra) ga = grad_for(div(g[0], b), a);
        if (rb) gb = grad_for(neg(div(mul(g[0], a), mul(b, b))), b);
        return std::vector<Tensor>{ga, gb};
      },
      kHigher);
  return out;
}

Tensor add(const Tensor& a, double b) { return add(a, wrap_scalar(a, b)); }
Tensor sub(const Tensor& a, double b) { return sub(a, wrap_scalar(a, b)); }
Tensor add(double a, const Tensor& b) { return add(b, a); }
Tensor sub(double a, const Tensor& b) { return sub(wrap_scalar(b, a), b); }
Tensor mul(double a, const Tensor& b) { return mul(b, a); }
Tensor div(double a, const Tensor& b) { return div(wrap_scalar(b, a), b); }
Tensor mul(const Tensor& a, double b) { return mul(a, wrap_scalar(a, b)); }
Tensor div(const Tensor& a, double b) { return div(a, wrap_scalar(a, b)); }

namespace {
Tensor extremum(BinaryOp kind, const Tensor& a, const Tensor& b) {
  // A scope of its own: the profiler times it, and export_onnx records it (Max, Min).
  DLTRAIN_OP_SCOPE(cu::op_name(kind), a, b);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({a, b}, {}, [&] { return extremum(kind, a, b); });
    });
  Tensor out = binary_raw(kind, a, b, 1.0);
  autograd::record(
      cu::op_name(kind), {a, b}, {out},
      [a = a.detach(), b = b.detach(), ra = a.requires_grad(), rb = b.requires_grad(),
       kind](const std::vector<Tensor>& g) {
        // Share of the gradient that goes to a: 1 where a wins, 0.5 on ties, 0 where b
        // wins.
        Tensor wa = kind == BinaryOp::Max ? grad_float<GradOp::MaxWeight>(a, b)
                                          : grad_float<GradOp::MinWeight>(a, b);
        Tensor ga, gb;
        if (ra) ga = grad_for(mul(g[0], wa), a);
        if (rb) gb = grad_for(mul(g[0], add(neg(wa), 1.0)), b);
        return std::vector<Tensor>{ga, gb};
      },
      kHigher);
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::Max, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::Min, a, b); }

// --- unary ----------------------------------------------------------------------

Tensor neg(const Tensor& x) {
  DLTRAIN_OP_SCOPE("neg", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return neg(x); }); });
  Tensor out = is_floating(x.dtype()) ? unary_float<UnaryOp::Neg>(x) : mul(x.detach(), -1.0);
  autograd::record(
      "neg", {x}, {out},
      [](const std::vector<Tensor>& g) { return std::vector<Tensor>{neg(g[0])}; }, kHigher);
  return out;
}

Tensor exp(const Tensor& x) {
  DLTRAIN_OP_SCOPE("exp", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return exp(x); }); });
  if (auto ac = amp::detail::autocast_args(amp::Op::exp, {&x})) return exp((*ac)[0]);
  Tensor out = unary_float<UnaryOp::Exp>(x);
  autograd::record(
      "exp", {x}, {out},
      [o = autograd::SavedOutput(out)](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{mul(g[0], o.get())};
      },
      kHigher);
  return out;
}

Tensor log(const Tensor& x) {
  DLTRAIN_OP_SCOPE("log", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return log(x); }); });
  if (auto ac = amp::detail::autocast_args(amp::Op::log, {&x})) return log((*ac)[0]);
  Tensor out = unary_float<UnaryOp::Log>(x);
  autograd::record(
      "log", {x}, {out},
      [x](const std::vector<Tensor>& g) { return std::vector<Tensor>{div(g[0], x)}; }, kHigher);
  return out;
}

namespace {
// log2 and log10: log_b(x) = ln(x) / ln(b), so d/dx = 1 / (x ln(b)).
template <UnaryOp Op>
Tensor log_base(const char* name, const Tensor& x, double ln_base) {
  DLTRAIN_OP_SCOPE(name, x);
  if (auto ac = amp::detail::autocast_args(amp::Op::log, {&x}))
    return log_base<Op>(name, (*ac)[0], ln_base);
  Tensor out = unary_float<Op>(x);
  autograd::record(
      name, {x}, {out},
      [x, ln_base](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{div(g[0], mul(x, ln_base))};
      },
      kHigher);
  return out;
}
}  // namespace

Tensor log2(const Tensor& x) { return log_base<UnaryOp::Log2>("log2", x, std::log(2.0)); }
Tensor log10(const Tensor& x) { return log_base<UnaryOp::Log10>("log10", x, std::log(10.0)); }

Tensor sqrt(const Tensor& x) {
  DLTRAIN_OP_SCOPE("sqrt", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return sqrt(x); }); });
  Tensor out = unary_float<UnaryOp::Sqrt>(x);
  autograd::record(
      "sqrt", {x}, {out},
      [o = autograd::SavedOutput(out)](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{div(mul(g[0], 0.5), o.get())};
      },
      kHigher);
  return out;
}

Tensor rsqrt(const Tensor& x) {
  DLTRAIN_OP_SCOPE("rsqrt", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return rsqrt(x); }); });
  if (auto ac = amp::detail::autocast_args(amp::Op::rsqrt, {&x})) return rsqrt((*ac)[0]);
  Tensor out = unary_float<UnaryOp::Rsqrt>(x);
  autograd::record(
      "rsqrt", {x}, {out},
      [o = autograd::SavedOutput(out)](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{mul(g[0], mul(pow(o.get(), 3.0), -0.5))};
      },
      kHigher);
  return out;
}

Tensor abs(const Tensor& x) {
  DLTRAIN_OP_SCOPE("abs", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return abs(x); }); });
  Tensor out = unary_float<UnaryOp::Abs>(x);
  autograd::record(
      "abs", {x}, {out},
      [x = x.detach()](const std::vector<Tensor>& g) {
        if (creating_graph()) return std::vector<Tensor>{mul(g[0], sign(x))};
        return std::vector<Tensor>{grad_float<GradOp::Abs>(g[0], x)};
      },
      kHigher);
  return out;
}

Tensor square(const Tensor& x) { return mul(x, x); }

Tensor pow(const Tensor& x, double e) {
  DLTRAIN_OP_SCOPE("pow", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"exponent", e}}, [&] { return pow(x, e); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::pow, {&x})) return pow((*ac)[0], e);
  Tensor out = unary_float<UnaryOp::Pow>(x, e);
  autograd::record(
      "pow", {x}, {out},
      [x, e](const std::vector<Tensor>& g) {
        if (e == 0.0) return std::vector<Tensor>{zeros_like(x)};
        return std::vector<Tensor>{mul(g[0], mul(pow(x, e - 1.0), e))};
      },
      kHigher);
  return out;
}

Tensor pow(const Tensor& x, const Tensor& y) {
  DLTRAIN_OP_SCOPE("pow", x, y);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x, y}, {}, [&] { return pow(x, y); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::pow, {&x, &y})) return pow((*ac)[0], (*ac)[1]);
  detail::check_defined("pow", x, "self");
  detail::check_defined("pow", y, "exponent");
  Tensor out = binary_float(BinaryOp::Pow, x, y, [](auto a, auto b) { return std::pow(a, b); });
  autograd::record(
      "pow", {x, y}, {out},
      [x, y, o = autograd::SavedOutput(out), rx = x.requires_grad(),
       ry = y.requires_grad()](const std::vector<Tensor>& g) {
        Tensor gx, gy;
        if (rx) gx = grad_for(mul(g[0], mul(y, pow(x, sub(y, 1.0)))), x);
        if (ry) gy = grad_for(mul(g[0], mul(o.get(), log(x))), y);
        return std::vector<Tensor>{gx, gy};
      },
      kHigher);
  return out;
}

namespace {
// relu's and relu_'s backward, from the output (positive exactly where the input was).
autograd::BackwardFn relu_backward(const Tensor& out) {
  return [o = out.detach()](const std::vector<Tensor>& g) {
    if (creating_graph()) return std::vector<Tensor>{grad_where(gt(o, 0.0), g[0])};
    return std::vector<Tensor>{grad_float<GradOp::Relu>(g[0], o)};
  };
}
}  // namespace

Tensor relu(const Tensor& x) {
  DLTRAIN_OP_SCOPE("relu", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return relu(x); }); });
  Tensor out = unary_float<UnaryOp::Relu>(x);
  autograd::record("relu", {x}, {out}, relu_backward(out), kHigher);
  return out;
}

Tensor& relu_(Tensor& self) {
  DLTRAIN_OP_SCOPE("relu_", self);
  if (dltrain_op_scope_.graph()) [[unlikely]] {
    detail::graph_cold(
        [&] { return detail::graph_record({self}, {}, [&] { return relu_(self); }); });
    return self;
  }
  detail::check_defined("relu_", self, "self");
  DLTRAIN_CHECK(is_floating(self.dtype()), "relu_: self must be floating-point but has dtype ",
                self.dtype(), "; use relu(), which returns a floating tensor");
  const bool track = autograd::grad_mode_enabled() && self.requires_grad();
  if (track) {
    DLTRAIN_CHECK(!self.is_leaf(),
                  "relu_: in-place change of a leaf that requires grad (a "
                  "parameter or an input marked requires_grad); use relu()");
    DLTRAIN_CHECK(self.impl()->storage.share_count() == 1,
                  "relu_: the tensor shares its memory with another tensor (a view of it, or a "
                  "copy an op kept for its backward), whose gradient history could not follow "
                  "an in-place change; use relu() (out of place), or nn::ReLU without inplace");
  }
  self.bump_version("relu_");
  if (self.numel() > 0) {
    if (self.device().is_cuda()) {
      cu::unary(UnaryOp::Relu, self, self, 0, 0);
    } else {
      dispatch_floating(self.dtype(), "relu_", [&]<class T>() {
        using A = acc_t<T>;
        unary_map<T, T>(self, self, [](T v) { return T(ew::Relu::fwd(A(v), A(0), A(0))); });
      });
    }
  }
  // The history of self now runs through relu_ (its input edge is self's old history).
  if (track) autograd::record("relu_", {self}, {self}, relu_backward(self), kHigher);
  return self;
}

Tensor leaky_relu(const Tensor& x, double slope) {
  DLTRAIN_OP_SCOPE("leaky_relu", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"negative_slope", slope}},
                                  [&] { return leaky_relu(x, slope); });
    });
  Tensor out = unary_float<UnaryOp::LeakyRelu>(x, slope);
  autograd::record(
      "leaky_relu", {x}, {out},
      [x = x.detach(), slope](const std::vector<Tensor>& g) {
        if (creating_graph()) return std::vector<Tensor>{where(gt(x, 0.0), g[0], mul(g[0], slope))};
        return std::vector<Tensor>{grad_float<GradOp::LeakyRelu>(g[0], x, slope)};
      },
      kHigher);
  return out;
}

namespace {
// gelu'(x) as a differentiable tensor, for create_graph backward. The tanh form is a
// composite of ops; the erf form takes its value from the fused kernel (Phi has no op) and
// records its own derivative gelu''(x) = phi(x) (2 - x^2), itself a composite.
Tensor gelu_derivative(const Tensor& x, bool approximate) {
  if (approximate) {
    const Tensor x2 = mul(x, x);
    const Tensor t = tanh(mul(add(x, mul(mul(x2, x), 0.044715)), kSqrt2OverPi));
    const Tensor dinner = mul(add(mul(x2, 3 * 0.044715), 1.0), kSqrt2OverPi);
    return add(mul(add(t, 1.0), 0.5), mul(mul(mul(x, 0.5), add(neg(mul(t, t)), 1.0)), dinner));
  }
  Tensor d;
  {
    NoGradGuard no_grad;
    d = grad_float<GradOp::GeluErf>(ones_like(x), x.detach());
  }
  autograd::record(
      "gelu_derivative", {x}, {d},
      [x](const std::vector<Tensor>& g) {
        const Tensor pdf = mul(exp(mul(mul(x, x), -0.5)), kInvSqrt2Pi);
        return std::vector<Tensor>{mul(g[0], mul(pdf, add(neg(mul(x, x)), 2.0)))};
      },
      kHigher);
  return d;
}
}  // namespace

Tensor gelu(const Tensor& x, bool approximate) {
  DLTRAIN_OP_SCOPE("gelu", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"approximate", approximate}},
                                  [&] { return gelu(x, approximate); });
    });
  Tensor out = approximate ? unary_float<UnaryOp::GeluTanh>(x) : unary_float<UnaryOp::GeluErf>(x);
  autograd::record(
      "gelu", {x}, {out},
      [x, approximate](const std::vector<Tensor>& g) {
        if (creating_graph())
          return std::vector<Tensor>{mul(g[0], gelu_derivative(x, approximate))};
        return std::vector<Tensor>{approximate ? grad_float<GradOp::GeluTanh>(g[0], x)
                                               : grad_float<GradOp::GeluErf>(g[0], x)};
      },
      kHigher);
  return out;
}

Tensor sigmoid(const Tensor& x) {
  DLTRAIN_OP_SCOPE("sigmoid", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return sigmoid(x); }); });
  Tensor out = unary_float<UnaryOp::Sigmoid>(x);
  autograd::record(
      "sigmoid", {x}, {out},
      [so = autograd::SavedOutput(out)](const std::vector<Tensor>& g) {
        if (creating_graph()) {
          const Tensor o = so.get();
          return std::vector<Tensor>{mul(g[0], mul(o, add(neg(o), 1.0)))};
        }
        return std::vector<Tensor>{grad_float<GradOp::Sigmoid>(g[0], so.data())};
      },
      kHigher);
  return out;
}

Tensor tanh(const Tensor& x) {
  DLTRAIN_OP_SCOPE("tanh", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return tanh(x); }); });
  Tensor out = unary_float<UnaryOp::Tanh>(x);
  autograd::record(
      "tanh", {x}, {out},
      [so = autograd::SavedOutput(out)](const std::vector<Tensor>& g) {
        if (creating_graph()) {
          const Tensor o = so.get();
          return std::vector<Tensor>{mul(g[0], add(neg(mul(o, o)), 1.0))};
        }
        return std::vector<Tensor>{grad_float<GradOp::Tanh>(g[0], so.data())};
      },
      kHigher);
  return out;
}

Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  DLTRAIN_OP_SCOPE("clamp", x);
  DLTRAIN_CHECK(!(lo && hi && *lo > *hi), "clamp: min (", *lo, ") is greater than max (", *hi, ")");
  const double l = lo.value_or(-INFINITY), h = hi.value_or(INFINITY);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"min", l}, {"max", h}}, [&] { return clamp(x, lo, hi); });
    });
  Tensor out = unary_float<UnaryOp::Clamp>(x, l, h);
  autograd::record(
      "clamp", {x}, {out},
      [x = x.detach(), l, h](const std::vector<Tensor>& g) {
        if (creating_graph())
          return std::vector<Tensor>{grad_where(logical_and(ge(x, l), le(x, h)), g[0])};
        return std::vector<Tensor>{grad_float<GradOp::Clamp>(g[0], x, l, h)};
      },
      kHigher);
  return out;
}

Tensor clamp(const Tensor& x, const Tensor& lo, const Tensor& hi) {
  DLTRAIN_OP_SCOPE("clamp", x, lo, hi);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x, lo, hi}, {}, [&] { return clamp(x, lo, hi); });
    });
  detail::check_defined("clamp", x, "input");
  DLTRAIN_CHECK(lo.defined() || hi.defined(),
                "clamp: give at least one of min and max (both are undefined)");
  detail::check_same_device("clamp", {&x, &lo, &hi});
  Tensor y = x;
  if (lo.defined()) y = where(lt(y, lo), lo, y);
  if (hi.defined()) y = where(gt(y, hi), hi, y);
  return y;
}

// --- activations and unary math (issue 14) ---------------------------------------
// Their formulas (forward and fused backward) are the functors of src/ops/elementwise_ops.hpp,
// which the CUDA kernels run too.

Tensor silu(const Tensor& x) {
  DLTRAIN_OP_SCOPE("silu", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return silu(x); }); });
  Tensor out = unary_float<UnaryOp::Silu>(x);
  autograd::record(
      "silu", {x}, {out},
      [x](const std::vector<Tensor>& g) {
        if (creating_graph()) {
          const Tensor s = sigmoid(x);
          return std::vector<Tensor>{mul(g[0], mul(s, add(mul(x, add(neg(s), 1.0)), 1.0)))};
        }
        return std::vector<Tensor>{grad_float<GradOp::Silu>(g[0], x)};
      },
      kHigher);
  return out;
}

Tensor softplus(const Tensor& x, double beta, double threshold) {
  DLTRAIN_OP_SCOPE("softplus", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"beta", beta}, {"threshold", threshold}},
                                  [&] { return softplus(x, beta, threshold); });
    });
  if (auto ac = amp::detail::autocast_args(amp::Op::softplus, {&x}))
    return softplus((*ac)[0], beta, threshold);
  DLTRAIN_CHECK(beta != 0, "softplus: beta must be non-zero");
  Tensor out = unary_float<UnaryOp::Softplus>(x, beta, threshold);
  autograd::record(
      "softplus", {x}, {out},
      [x, beta, threshold](const std::vector<Tensor>& g) {
        if (creating_graph())
          return std::vector<Tensor>{
              where(gt(mul(x, beta), threshold), g[0], mul(g[0], sigmoid(mul(x, beta))))};
        return std::vector<Tensor>{grad_float<GradOp::Softplus>(g[0], x, beta, threshold)};
      },
      kHigher);
  return out;
}

Tensor elu(const Tensor& x, double alpha) {
  DLTRAIN_OP_SCOPE("elu", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x}, {{"alpha", alpha}}, [&] { return elu(x, alpha); });
    });
  Tensor out = unary_float<UnaryOp::Elu>(x, alpha);
  autograd::record(
      "elu", {x}, {out},
      [x, alpha](const std::vector<Tensor>& g) {
        if (creating_graph())
          return std::vector<Tensor>{where(gt(x, 0.0), g[0], mul(g[0], mul(exp(x), alpha)))};
        return std::vector<Tensor>{grad_float<GradOp::Elu>(g[0], x, alpha)};
      },
      kHigher);
  return out;
}

Tensor mish(const Tensor& x) {
  DLTRAIN_OP_SCOPE("mish", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return mish(x); }); });
  Tensor out = unary_float<UnaryOp::Mish>(x);
  autograd::record(
      "mish", {x}, {out},
      [x](const std::vector<Tensor>& g) {
        if (creating_graph()) {
          const Tensor t = tanh(softplus(x));
          const Tensor d = add(t, mul(mul(x, sigmoid(x)), add(neg(mul(t, t)), 1.0)));
          return std::vector<Tensor>{mul(g[0], d)};
        }
        return std::vector<Tensor>{grad_float<GradOp::Mish>(g[0], x)};
      },
      kHigher);
  return out;
}

Tensor hardswish(const Tensor& x) {
  DLTRAIN_OP_SCOPE("hardswish", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return hardswish(x); }); });
  Tensor out = unary_float<UnaryOp::Hardswish>(x);
  autograd::record(
      "hardswish", {x}, {out},
      [x](const std::vector<Tensor>& g) {
        if (creating_graph()) {
          const Tensor mid = where(le(x, 3.0), mul(g[0], add(div(x, 3.0), 0.5)), g[0]);
          return std::vector<Tensor>{grad_where(ge(x, -3.0), mid)};
        }
        return std::vector<Tensor>{grad_float<GradOp::Hardswish>(g[0], x)};
      },
      kHigher);
  return out;
}

Tensor sin(const Tensor& x) {
  DLTRAIN_OP_SCOPE("sin", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return sin(x); }); });
  Tensor out = unary_float<UnaryOp::Sin>(x);
  autograd::record(
      "sin", {x}, {out},
      [x](const std::vector<Tensor>& g) { return std::vector<Tensor>{mul(g[0], cos(x))}; },
      kHigher);
  return out;
}

Tensor cos(const Tensor& x) {
  DLTRAIN_OP_SCOPE("cos", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return cos(x); }); });
  Tensor out = unary_float<UnaryOp::Cos>(x);
  autograd::record(
      "cos", {x}, {out},
      [x](const std::vector<Tensor>& g) { return std::vector<Tensor>{neg(mul(g[0], sin(x)))}; },
      kHigher);
  return out;
}

Tensor log1p(const Tensor& x) {
  DLTRAIN_OP_SCOPE("log1p", x);
  if (auto ac = amp::detail::autocast_args(amp::Op::log1p, {&x})) return log1p((*ac)[0]);
  Tensor out = unary_float<UnaryOp::Log1p>(x);
  autograd::record(
      "log1p", {x}, {out},
      [x](const std::vector<Tensor>& g) { return std::vector<Tensor>{div(g[0], add(x, 1.0))}; },
      kHigher);
  return out;
}

Tensor expm1(const Tensor& x) {
  DLTRAIN_OP_SCOPE("expm1", x);
  if (auto ac = amp::detail::autocast_args(amp::Op::expm1, {&x})) return expm1((*ac)[0]);
  Tensor out = unary_float<UnaryOp::Expm1>(x);
  autograd::record(
      "expm1", {x}, {out},
      [o = autograd::SavedOutput(out)](const std::vector<Tensor>& g) {
        return std::vector<Tensor>{mul(g[0], add(o.get(), 1.0))};
      },
      kHigher);
  return out;
}

Tensor sign(const Tensor& x) {
  DLTRAIN_OP_SCOPE("sign", x);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold(
        [&] { return detail::graph_record({x}, {}, [&] { return sign(x); }); });
  Tensor out = unary_float<UnaryOp::Sign>(x);
  autograd::record(
      "sign", {x}, {out},
      [x = x.detach()](const std::vector<Tensor>&) { return std::vector<Tensor>{zeros_like(x)}; },
      kHigher);
  return out;
}

// --- selection --------------------------------------------------------------------

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  DLTRAIN_OP_SCOPE("where", cond, a, b);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({cond, a, b}, {}, [&] { return where(cond, a, b); });
    });
  detail::check_defined("where", cond, "condition");
  detail::check_defined("where", a, "self");
  detail::check_defined("where", b, "other");
  detail::check_same_device("where", {&cond, &a, &b});
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
  if (out.device().is_cuda()) {
    cu::where(out, c, ac, bc);
  } else {
    dispatch_all(dt, [&]<class T>() {
      ternary_map<T, bool, T, T>(out, c, ac, bc, [](bool k, T x, T y) { return k ? x : y; });
    });
  }
  autograd::record(
      "where", {a, b}, {out},
      [c, a = meta(a), b = meta(b)](const std::vector<Tensor>& g) {
        Tensor z = zeros({}, g[0].options());
        return std::vector<Tensor>{a.requires_grad ? grad_for(where(c, g[0], z), a) : Tensor(),
                                   b.requires_grad ? grad_for(where(c, z, g[0]), b) : Tensor()};
      },
      kHigher);
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  DLTRAIN_OP_SCOPE("masked_fill", x, mask);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record({x, mask}, {{"value", value}},
                                  [&] { return masked_fill(x, mask, value); });
    });
  DLTRAIN_CHECK(broadcast_shapes(x.shape(), mask.shape(), "masked_fill") == x.shape(),
                "masked_fill: mask of shape ", shape_str(mask.shape()),
                " does not broadcast to the input's shape ", shape_str(x.shape()));
  return where(mask, scalar_tensor(value, TensorOptions(x.dtype()).with_device(x.device())), x);
}

Tensor eq(const Tensor& a, const Tensor& b) { return compare("eq", a, b, CompareOp::Eq); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare("ne", a, b, CompareOp::Ne); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare("lt", a, b, CompareOp::Lt); }
Tensor le(const Tensor& a, const Tensor& b) { return compare("le", a, b, CompareOp::Le); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare("gt", a, b, CompareOp::Gt); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare("ge", a, b, CompareOp::Ge); }
Tensor eq(const Tensor& a, double b) { return eq(a, wrap_scalar(a, b)); }
Tensor ne(const Tensor& a, double b) { return ne(a, wrap_scalar(a, b)); }
Tensor lt(const Tensor& a, double b) { return lt(a, wrap_scalar(a, b)); }
Tensor le(const Tensor& a, double b) { return le(a, wrap_scalar(a, b)); }
Tensor gt(const Tensor& a, double b) { return gt(a, wrap_scalar(a, b)); }
Tensor ge(const Tensor& a, double b) { return ge(a, wrap_scalar(a, b)); }

Tensor logical_not(const Tensor& x) { return eq(x, 0.0); }

// Logical and / or / xor: the truth of each operand (ne 0, any dtype) combined by where or
// ne, so the result is bool on every device and broadcasts.
Tensor logical_and(const Tensor& a, const Tensor& b) {
  DLTRAIN_OP_SCOPE("logical_and", a, b);
  detail::check_same_device("logical_and", {&a, &b});
  return where(ne(a, 0.0), ne(b, 0.0),
               scalar_tensor(0.0, TensorOptions(DType::b8).with_device(a.device())));
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  DLTRAIN_OP_SCOPE("logical_or", a, b);
  detail::check_same_device("logical_or", {&a, &b});
  return where(ne(a, 0.0), scalar_tensor(1.0, TensorOptions(DType::b8).with_device(a.device())),
               ne(b, 0.0));
}
Tensor logical_xor(const Tensor& a, const Tensor& b) {
  DLTRAIN_OP_SCOPE("logical_xor", a, b);
  detail::check_same_device("logical_xor", {&a, &b});
  return ne(ne(a, 0.0), ne(b, 0.0));
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  DLTRAIN_OP_SCOPE("allclose", a, b);
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
// Checks an in-place update of self by `others` (broadcast to self, converted to self's dtype),
// then runs cpu.template operator()<T>(converted) or cuda(converted) by self's device.
template <class Cpu, class Cuda>
Tensor& inplace(const char* name, Tensor& self, const std::vector<Tensor>& others, Cpu cpu,
                Cuda cuda) {
  check_inplace(name, self);
  for (const Tensor& o : others) {
    detail::check_defined(name, o, "other");
    detail::check_same_device(name, {&self, &o});
    DLTRAIN_CHECK(broadcast_shapes(self.shape(), o.shape(), name) == self.shape(), name,
                  ": operand of shape ", shape_str(o.shape()),
                  " does not broadcast to self's shape ", shape_str(self.shape()));
  }
  self.bump_version(name);
  dispatch_numeric(self.dtype(), name, [&]<class T>() {
    std::vector<Tensor> conv;
    for (const Tensor& o : others)
      conv.push_back(o.dtype() == self.dtype() ? o.detach() : o.detach().to(self.dtype()));
    if (self.device().is_cuda())
      cuda(conv);
    else
      cpu.template operator()<T>(conv);
  });
  return self;
}
}  // namespace

Tensor& add_(Tensor& self, const Tensor& other, double alpha) {
  DLTRAIN_OP_SCOPE("add_", other);
  return inplace(
      "add_", self, {other},
      [&]<class T>(const std::vector<Tensor>& o) {
        using A = acc_t<T>;
        const A al = static_cast<A>(alpha);
        binary_map<T, T, T>(self, self, o[0],
                            [al](T x, T y) { return cast<T>(cast<A>(x) + al * cast<A>(y)); });
      },
      [&](const std::vector<Tensor>& o) { cu::binary(BinaryOp::Add, self, self, o[0], alpha); });
}

Tensor& mul_(Tensor& self, const Tensor& other) {
  DLTRAIN_OP_SCOPE("mul_", other);
  return inplace(
      "mul_", self, {other},
      [&]<class T>(const std::vector<Tensor>& o) {
        using A = acc_t<T>;
        binary_map<T, T, T>(self, self, o[0],
                            [](T x, T y) { return cast<T>(cast<A>(x) * cast<A>(y)); });
      },
      [&](const std::vector<Tensor>& o) { cu::binary(BinaryOp::Mul, self, self, o[0]); });
}

Tensor& mul_(Tensor& self, double v) { return mul_(self, wrap_scalar(self, v).to(self.dtype())); }
Tensor& add_(Tensor& self, double v) {
  return add_(self, wrap_scalar(self, v).to(self.dtype()), 1.0);
}

Tensor& addcmul_(Tensor& self, const Tensor& t1, const Tensor& t2, double value) {
  DLTRAIN_OP_SCOPE("addcmul_", t1, t2);
  return inplace(
      "addcmul_", self, {t1, t2},
      [&]<class T>(const std::vector<Tensor>& o) {
        using A = acc_t<T>;
        const A v = static_cast<A>(value);
        ternary_map<T, T, T, T>(self, self, o[0], o[1], [v](T s, T x, T y) {
          return cast<T>(cast<A>(s) + v * cast<A>(x) * cast<A>(y));
        });
      },
      [&](const std::vector<Tensor>& o) {
        cu::ternary(cu::TernaryOp::Addcmul, self, self, o[0], o[1], value);
      });
}

Tensor& addcdiv_(Tensor& self, const Tensor& t1, const Tensor& t2, double value) {
  DLTRAIN_OP_SCOPE("addcdiv_", t1, t2);
  return inplace(
      "addcdiv_", self, {t1, t2},
      [&]<class T>(const std::vector<Tensor>& o) {
        using A = acc_t<T>;
        const A v = static_cast<A>(value);
        ternary_map<T, T, T, T>(self, self, o[0], o[1], [v](T s, T x, T y) {
          return cast<T>(cast<A>(s) + v * cast<A>(x) / cast<A>(y));
        });
      },
      [&](const std::vector<Tensor>& o) {
        cu::ternary(cu::TernaryOp::Addcdiv, self, self, o[0], o[1], value);
      });
}

}  // namespace dltrain
