// Floating unary maps on CUDA (neg, exp, log, sqrt, rsqrt, abs, relu, leaky_relu, gelu,
// sigmoid, tanh, clamp, pow by a scalar, silu, softplus, elu, mish, hardswish, sin, cos, log1p,
// expm1, sign): one launch_map per (op, dtype), the op chosen at
// compile time. Each formula is the CPU backend's (src/ops/elementwise.cpp), evaluated in
// acc_t (float for f16/bf16), so results agree with the CPU to a few ulps of the dtype.
#include <cmath>

#include "kernels/common.cuh"
#include "src/backend/cuda/elementwise.hpp"

namespace dltrain::backend::cuda {

namespace {

template <UnaryOp Op, class T>
struct UnaryF {
  using A = acc_t<T>;
  A a, b;
  __device__ __forceinline__ T operator()(T in) const {
    const A v = convert<A>(in);
    A r;
    if constexpr (Op == UnaryOp::Neg) {
      r = -v;
    } else if constexpr (Op == UnaryOp::Exp) {
      r = dm::exp(v);
    } else if constexpr (Op == UnaryOp::Log) {
      r = dm::log(v);
    } else if constexpr (Op == UnaryOp::Sqrt) {
      r = dm::sqrt(v);
    } else if constexpr (Op == UnaryOp::Rsqrt) {
      r = A(1) / dm::sqrt(v);
    } else if constexpr (Op == UnaryOp::Abs) {
      r = dm::fabs(v);
    } else if constexpr (Op == UnaryOp::Relu) {
      r = v > A(0) ? v : A(0);
    } else if constexpr (Op == UnaryOp::LeakyRelu) {
      r = v > A(0) ? v : v * a;
    } else if constexpr (Op == UnaryOp::GeluErf) {
      r = A(0.5) * v * (A(1) + dm::erf(v * A(dm::kSqrt1_2)));
    } else if constexpr (Op == UnaryOp::GeluTanh) {
      r = A(0.5) * v * (A(1) + dm::tanh(A(dm::kSqrt2OverPi) * (v + A(0.044715) * v * v * v)));
    } else if constexpr (Op == UnaryOp::Sigmoid) {
      r = v >= A(0) ? A(1) / (A(1) + dm::exp(-v)) : dm::exp(v) / (A(1) + dm::exp(v));
    } else if constexpr (Op == UnaryOp::Tanh) {
      r = dm::tanh(v);
    } else if constexpr (Op == UnaryOp::Clamp) {
      r = v < a ? a : (v > b ? b : v);
    } else if constexpr (Op == UnaryOp::Silu) {
      r = v / (A(1) + dm::exp(-v));
    } else if constexpr (Op == UnaryOp::Softplus) {
      r = v * a > b ? v : dm::log1p(dm::exp(v * a)) / a;
    } else if constexpr (Op == UnaryOp::Elu) {
      r = v > A(0) ? v : a * dm::expm1(v);
    } else if constexpr (Op == UnaryOp::Mish) {
      r = v * dm::tanh(dm::log1p(dm::exp(v)));
    } else if constexpr (Op == UnaryOp::Hardswish) {
      r = v <= A(-3) ? A(0) : (v >= A(3) ? v : v * (v + A(3)) / A(6));
    } else if constexpr (Op == UnaryOp::Sin) {
      r = dm::sin(v);
    } else if constexpr (Op == UnaryOp::Cos) {
      r = dm::cos(v);
    } else if constexpr (Op == UnaryOp::Log1p) {
      r = dm::log1p(v);
    } else if constexpr (Op == UnaryOp::Expm1) {
      r = dm::expm1(v);
    } else if constexpr (Op == UnaryOp::Sign) {
      r = A((A(0) < v) - (v < A(0)));
    } else {
      static_assert(Op == UnaryOp::Pow);
      r = dm::pow(v, a);
    }
    return convert<T>(r);
  }
};

// Calls f.template operator()<O>() for the O among Ops equal to op.
template <UnaryOp... Ops, class F>
void with_op(UnaryOp op, F&& f) {
  const bool hit = ((op == Ops ? (f.template operator()<Ops>(), true) : false) || ...);
  DLTRAIN_CHECK(hit, "cuda unary: unknown op code ", static_cast<int>(op));
}

}  // namespace

void unary(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b) {
  DLTRAIN_CHECK(x.dtype() == out.dtype(), op_name(op), " (cuda): input dtype ", x.dtype(),
                " differs from the output's ", out.dtype());
  cu_dispatch_floating(out.dtype(), op_name(op), [&]<class T>() {
    using A = acc_t<T>;
    with_op<UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt, UnaryOp::Abs,
            UnaryOp::Relu, UnaryOp::LeakyRelu, UnaryOp::GeluErf, UnaryOp::GeluTanh,
            UnaryOp::Sigmoid, UnaryOp::Tanh, UnaryOp::Clamp, UnaryOp::Pow, UnaryOp::Silu,
            UnaryOp::Softplus, UnaryOp::Elu, UnaryOp::Mish, UnaryOp::Hardswish, UnaryOp::Sin,
            UnaryOp::Cos, UnaryOp::Log1p, UnaryOp::Expm1, UnaryOp::Sign>(op, [&]<UnaryOp O>() {
      launch_map<T, T>(out, UnaryF<O, T>{static_cast<A>(a), static_cast<A>(b)}, x);
    });
  });
}

}  // namespace dltrain::backend::cuda
