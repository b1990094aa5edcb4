// One definition per elementwise op, shared by the CPU loops (src/ops/elementwise.cpp) and
// the CUDA kernels (kernels/elementwise_unary.cu, kernels/elementwise_grad.cu): internal
// header, compiled for the host by every compiler and for the device by nvcc.
//
// - DLTRAIN_UNARY_OPS lists the floating unary maps and DLTRAIN_GRAD_OPS the fused gradient
//   kernels, each entry X(Name, "public name"). The lists generate the op enums
//   (UnaryOp::Name, GradOp::Name), their names for error messages and the dispatch
//   (visit_unary / visit_grad) that both backends use, so an op cannot be in one backend and
//   missing from the other: a missing functor is a compile error on both sides.
// - ew::Name is the op's functor: `fwd(v, a, b)` (the map) and/or `bwd(g, v, a, b)` (its
//   gradient kernel: g the incoming gradient, v the saved tensor the GradOp list names). They
//   compute in the accumulation type A (float for f16/bf16 tensors, double for f64), with the
//   parameters a, b converted to A; math goes through ew::math (elementwise_math.hpp), std:: on
//   the host and CUDA's functions on the device (the same formulas, so results agree to a few
//   ulps).
//
// Adding an elementwise op: one list line, one functor here, the public function
// (include/dltrain/ops/elementwise.hpp and src/ops/elementwise.cpp) and its op case
// (tests/op_cases.cpp). docs/adding-an-op.md has the checklist.
#pragma once

#include <cmath>
#include <cstddef>

#include "src/core/hd.hpp"
#include "src/ops/elementwise_math.hpp"

// Floating unary maps. Parameters: LeakyRelu a = negative slope; Clamp [a, b] (infinite for
// an absent bound); Pow a = exponent; Softplus a = beta, b = threshold; Elu a = alpha.
#define DLTRAIN_UNARY_OPS(X) \
  X(Neg, "neg")              \
  X(Exp, "exp")              \
  X(Log, "log")              \
  X(Log2, "log2")            \
  X(Log10, "log10")          \
  X(Sqrt, "sqrt")            \
  X(Rsqrt, "rsqrt")          \
  X(Abs, "abs")              \
  X(Relu, "relu")            \
  X(LeakyRelu, "leaky_relu") \
  X(GeluErf, "gelu")         \
  X(GeluTanh, "gelu")        \
  X(Sigmoid, "sigmoid")      \
  X(Tanh, "tanh")            \
  X(Clamp, "clamp")          \
  X(Pow, "pow")              \
  X(Silu, "silu")            \
  X(Softplus, "softplus")    \
  X(Elu, "elu")              \
  X(Mish, "mish")            \
  X(Hardswish, "hardswish")  \
  X(Sin, "sin")              \
  X(Cos, "cos")              \
  X(Log1p, "log1p")          \
  X(Expm1, "expm1")          \
  X(Sign, "sign")

// Fused gradient kernels, out = bwd(g, v): Relu: v = output; LeakyRelu: v = input, a =
// slope; GeluErf, GeluTanh, Abs: v = input; Sigmoid, Tanh: v = output; Clamp: v = input,
// [a, b] the bounds; MaxWeight / MinWeight: (g, v) are the operands (a, b) of maximum /
// minimum and the result is a's share of the gradient: 1 where a wins, 0.5 on ties, 0 where
// b wins; Silu, Mish, Hardswish: v = input; Softplus: v = input, a = beta, b = threshold;
// Elu: v = input, a = alpha.
#define DLTRAIN_GRAD_OPS(X)           \
  X(Relu, "relu_backward")            \
  X(LeakyRelu, "leaky_relu_backward") \
  X(GeluErf, "gelu_backward")         \
  X(GeluTanh, "gelu_backward")        \
  X(Sigmoid, "sigmoid_backward")      \
  X(Tanh, "tanh_backward")            \
  X(Clamp, "clamp_backward")          \
  X(Abs, "abs_backward")              \
  X(MaxWeight, "extremum_backward")   \
  X(MinWeight, "extremum_backward")   \
  X(Silu, "silu_backward")            \
  X(Softplus, "softplus_backward")    \
  X(Elu, "elu_backward")              \
  X(Mish, "mish_backward")            \
  X(Hardswish, "hardswish_backward")

namespace dltrain::ew {

// --- the ops' enums and names, from the lists ------------------------------------------

#define DLTRAIN_EW_ENUM(name, str) name,
#define DLTRAIN_EW_NAME(name, str) str,
enum class UnaryOp { DLTRAIN_UNARY_OPS(DLTRAIN_EW_ENUM) };
enum class GradOp { DLTRAIN_GRAD_OPS(DLTRAIN_EW_ENUM) };
inline constexpr const char* kUnaryOpNames[] = {DLTRAIN_UNARY_OPS(DLTRAIN_EW_NAME)};
inline constexpr const char* kGradOpNames[] = {DLTRAIN_GRAD_OPS(DLTRAIN_EW_NAME)};
#undef DLTRAIN_EW_ENUM
#undef DLTRAIN_EW_NAME

#define DLTRAIN_EW_ONE(name, str) +1
inline constexpr int kUnaryOpCount = 0 DLTRAIN_UNARY_OPS(DLTRAIN_EW_ONE);
inline constexpr int kGradOpCount = 0 DLTRAIN_GRAD_OPS(DLTRAIN_EW_ONE);
#undef DLTRAIN_EW_ONE
static_assert(sizeof(kUnaryOpNames) / sizeof(kUnaryOpNames[0]) == kUnaryOpCount);
static_assert(sizeof(kGradOpNames) / sizeof(kGradOpNames[0]) == kGradOpCount);

/// The op's public name ("relu", "gelu", ...), for error messages.
constexpr const char* op_name(UnaryOp op) { return kUnaryOpNames[static_cast<int>(op)]; }
constexpr const char* op_name(GradOp op) { return kGradOpNames[static_cast<int>(op)]; }

// --- the functors ------------------------------------------------------------------------
// Formulas and edge rules are PyTorch's CPU kernels' (softplus's threshold, hardswish's
// closed interval [-3, 3] in backward, elu through expm1, sigmoid split at 0).

struct Neg {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return -v;
  }
};
struct Exp {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return math::exp(v);
  }
};
struct Log {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return math::log(v);
  }
};
struct Log2 {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return math::log2(v);
  }
};
struct Log10 {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return math::log10(v);
  }
};
struct Sqrt {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return math::sqrt(v);
  }
};
struct Rsqrt {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return A(1) / math::sqrt(v);
  }
};
struct Abs {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return math::fabs(v);
  }
  template <class A>
  DLTRAIN_HD static A bwd(A g, A v, A, A) {
    return v > A(0) ? g : (v < A(0) ? -g : A(0));
  }
};
struct Relu {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return v > A(0) ? v : A(0);
  }
  template <class A>  // v = the output
  DLTRAIN_HD static A bwd(A g, A v, A, A) {
    return v > A(0) ? g : A(0);
  }
};
struct LeakyRelu {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A slope, A) {
    return v > A(0) ? v : v * slope;
  }
  template <class A>
  DLTRAIN_HD static A bwd(A g, A v, A slope, A) {
    return v > A(0) ? g : g * slope;
  }
};
struct GeluErf {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return A(0.5) * v * (A(1) + math::erf(v * A(math::kSqrt1_2)));
  }
  template <class A>
  DLTRAIN_HD static A bwd(A g, A v, A, A) {
    const A cdf = A(0.5) * (A(1) + math::erf(v * A(math::kSqrt1_2)));
    const A pdf = A(math::kInvSqrt2Pi) * math::exp(A(-0.5) * v * v);
    return g * (cdf + v * pdf);
  }
};
struct GeluTanh {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return A(0.5) * v * (A(1) + math::tanh(A(math::kSqrt2OverPi) * (v + A(0.044715) * v * v * v)));
  }
  template <class A>
  DLTRAIN_HD static A bwd(A g, A v, A, A) {
    const A inner = A(math::kSqrt2OverPi) * (v + A(0.044715) * v * v * v);
    const A t = math::tanh(inner);
    const A dinner = A(math::kSqrt2OverPi) * (A(1) + A(3 * 0.044715) * v * v);
    return g * (A(0.5) * (A(1) + t) + A(0.5) * v * (A(1) - t * t) * dinner);
  }
};
struct Sigmoid {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return v >= A(0) ? A(1) / (A(1) + math::exp(-v)) : math::exp(v) / (A(1) + math::exp(v));
  }
  template <class A>  // s = the output
  DLTRAIN_HD static A bwd(A g, A s, A, A) {
    return g * s * (A(1) - s);
  }
};
struct Tanh {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return math::tanh(v);
  }
  template <class A>  // t = the output
  DLTRAIN_HD static A bwd(A g, A t, A, A) {
    return g * (A(1) - t * t);
  }
};
struct Clamp {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A lo, A hi) {
    return v < lo ? lo : (v > hi ? hi : v);
  }
  template <class A>
  DLTRAIN_HD static A bwd(A g, A v, A lo, A hi) {
    return (v >= lo && v <= hi) ? g : A(0);
  }
};
struct Pow {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A e, A) {
    return math::pow(v, e);
  }
};
struct Silu {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return v / (A(1) + math::exp(-v));
  }
  template <class A>
  DLTRAIN_HD static A bwd(A g, A v, A, A) {
    const A s = A(1) / (A(1) + math::exp(-v));
    return g * s * (A(1) + v * (A(1) - s));
  }
};
struct Softplus {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A beta, A threshold) {
    return v * beta > threshold ? v : math::log1p(math::exp(v * beta)) / beta;
  }
  template <class A>
  DLTRAIN_HD static A bwd(A g, A v, A beta, A threshold) {
    const A z = math::exp(v * beta);
    return v * beta > threshold ? g : g * z / (z + A(1));
  }
};
struct Elu {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A alpha, A) {
    return v > A(0) ? v : alpha * math::expm1(v);
  }
  template <class A>
  DLTRAIN_HD static A bwd(A g, A v, A alpha, A) {
    return v > A(0) ? g : g * alpha * math::exp(v);
  }
};
struct Mish {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return v * math::tanh(math::log1p(math::exp(v)));
  }
  template <class A>
  DLTRAIN_HD static A bwd(A g, A v, A, A) {
    const A t = math::tanh(math::log1p(math::exp(v)));
    const A s = A(1) / (A(1) + math::exp(-v));
    return g * (t + v * s * (A(1) - t * t));
  }
};
struct Hardswish {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return v <= A(-3) ? A(0) : (v >= A(3) ? v : v * (v + A(3)) / A(6));
  }
  template <class A>
  DLTRAIN_HD static A bwd(A g, A v, A, A) {
    return v < A(-3) ? A(0) : (v <= A(3) ? g * (v / A(3) + A(0.5)) : g);
  }
};
struct Sin {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return math::sin(v);
  }
};
struct Cos {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return math::cos(v);
  }
};
struct Log1p {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return math::log1p(v);
  }
};
struct Expm1 {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return math::expm1(v);
  }
};
struct Sign {
  template <class A>
  DLTRAIN_HD static A fwd(A v, A, A) {
    return A((A(0) < v) - (v < A(0)));
  }
};
struct MaxWeight {
  template <class A>  // (a, b) = the operands of maximum(a, b)
  DLTRAIN_HD static A bwd(A a, A b, A, A) {
    return a == b ? A(0.5) : (a > b ? A(1) : A(0));
  }
};
struct MinWeight {
  template <class A>  // (a, b) = the operands of minimum(a, b)
  DLTRAIN_HD static A bwd(A a, A b, A, A) {
    return a == b ? A(0.5) : (a < b ? A(1) : A(0));
  }
};

// --- enum -> functor, and the dispatch both backends use --------------------------------

template <UnaryOp Op>
struct unary_fn;
template <GradOp Op>
struct grad_fn;
#define DLTRAIN_EW_UNARY_FN(name, str) \
  template <>                          \
  struct unary_fn<UnaryOp::name> {     \
    using type = name;                 \
  };
#define DLTRAIN_EW_GRAD_FN(name, str) \
  template <>                         \
  struct grad_fn<GradOp::name> {      \
    using type = name;                \
  };
DLTRAIN_UNARY_OPS(DLTRAIN_EW_UNARY_FN)
DLTRAIN_GRAD_OPS(DLTRAIN_EW_GRAD_FN)
#undef DLTRAIN_EW_UNARY_FN
#undef DLTRAIN_EW_GRAD_FN

/// Calls f.template operator()<Fn>() with Fn the functor of `op` (host code). Returns false
/// for a code outside the list (a corrupted value), which the caller reports.
template <class F>
bool visit_unary(UnaryOp op, F&& f) {
  switch (op) {
#define DLTRAIN_EW_CASE(name, str) \
  case UnaryOp::name:              \
    f.template operator()<name>(); \
    return true;
    DLTRAIN_UNARY_OPS(DLTRAIN_EW_CASE)
#undef DLTRAIN_EW_CASE
  }
  return false;
}
template <class F>
bool visit_grad(GradOp op, F&& f) {
  switch (op) {
#define DLTRAIN_EW_CASE(name, str) \
  case GradOp::name:               \
    f.template operator()<name>(); \
    return true;
    DLTRAIN_GRAD_OPS(DLTRAIN_EW_CASE)
#undef DLTRAIN_EW_CASE
  }
  return false;
}

}  // namespace dltrain::ew
