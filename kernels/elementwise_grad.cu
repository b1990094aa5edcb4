// Gradient helpers of the unary and extremum ops on CUDA: out = f(g, v) for relu, leaky_relu,
// gelu (erf and tanh forms), sigmoid, tanh, clamp, abs, silu, softplus, elu, mish and
// hardswish backward, and the share of the
// gradient that goes to a in maximum(a, b) / minimum(a, b). One launch_map per (op, dtype)
// with the CPU backend's formulas (src/ops/elementwise.cpp) evaluated in acc_t.
#include "kernels/common.cuh"
#include "src/backend/cuda/elementwise.hpp"

namespace dltrain::backend::cuda {

namespace {

template <GradOp Op, class T>
struct GradF {
  using A = acc_t<T>;
  A a, b;
  __device__ __forceinline__ T operator()(T gin, T vin) const {
    const A g = convert<A>(gin), v = convert<A>(vin);
    A r;
    if constexpr (Op == GradOp::Relu) {
      r = v > A(0) ? g : A(0);
    } else if constexpr (Op == GradOp::LeakyRelu) {
      r = v > A(0) ? g : g * a;
    } else if constexpr (Op == GradOp::GeluErf) {
      const A cdf = A(0.5) * (A(1) + dm::erf(v * A(dm::kSqrt1_2)));
      const A pdf = A(dm::kInvSqrt2Pi) * dm::exp(A(-0.5) * v * v);
      r = g * (cdf + v * pdf);
    } else if constexpr (Op == GradOp::GeluTanh) {
      const A inner = A(dm::kSqrt2OverPi) * (v + A(0.044715) * v * v * v);
      const A t = dm::tanh(inner);
      const A dinner = A(dm::kSqrt2OverPi) * (A(1) + A(3 * 0.044715) * v * v);
      r = g * (A(0.5) * (A(1) + t) + A(0.5) * v * (A(1) - t * t) * dinner);
    } else if constexpr (Op == GradOp::Sigmoid) {
      r = g * v * (A(1) - v);
    } else if constexpr (Op == GradOp::Tanh) {
      r = g * (A(1) - v * v);
    } else if constexpr (Op == GradOp::Clamp) {
      r = (v >= a && v <= b) ? g : A(0);
    } else if constexpr (Op == GradOp::Abs) {
      r = v > A(0) ? g : (v < A(0) ? -g : A(0));
    } else if constexpr (Op == GradOp::Silu) {
      const A s = A(1) / (A(1) + dm::exp(-v));
      r = g * s * (A(1) + v * (A(1) - s));
    } else if constexpr (Op == GradOp::Softplus) {
      const A z = dm::exp(v * a);
      r = v * a > b ? g : g * z / (z + A(1));
    } else if constexpr (Op == GradOp::Elu) {
      r = v > A(0) ? g : g * a * dm::exp(v);
    } else if constexpr (Op == GradOp::Mish) {
      const A t = dm::tanh(dm::log1p(dm::exp(v)));
      const A s = A(1) / (A(1) + dm::exp(-v));
      r = g * (t + v * s * (A(1) - t * t));
    } else if constexpr (Op == GradOp::Hardswish) {
      r = v < A(-3) ? A(0) : (v <= A(3) ? g * (v / A(3) + A(0.5)) : g);
    } else if constexpr (Op == GradOp::MaxWeight) {
      r = g == v ? A(0.5) : (g > v ? A(1) : A(0));
    } else {
      static_assert(Op == GradOp::MinWeight);
      r = g == v ? A(0.5) : (g < v ? A(1) : A(0));
    }
    return convert<T>(r);
  }
};

template <GradOp... Ops, class F>
void with_op(GradOp op, F&& f) {
  const bool hit = ((op == Ops ? (f.template operator()<Ops>(), true) : false) || ...);
  DLTRAIN_CHECK(hit, "cuda binary_grad: unknown op code ", static_cast<int>(op));
}

}  // namespace

void binary_grad(GradOp op, const Tensor& out, const Tensor& g, const Tensor& v, double a,
                 double b) {
  DLTRAIN_CHECK(g.dtype() == out.dtype() && v.dtype() == out.dtype(), op_name(op),
                " (cuda): operand dtypes ", g.dtype(), " and ", v.dtype(),
                " differ from the output's ", out.dtype());
  cu_dispatch_floating(out.dtype(), op_name(op), [&]<class T>() {
    using A = acc_t<T>;
    with_op<GradOp::Relu, GradOp::LeakyRelu, GradOp::GeluErf, GradOp::GeluTanh, GradOp::Sigmoid,
            GradOp::Tanh, GradOp::Clamp, GradOp::Abs, GradOp::MaxWeight, GradOp::MinWeight,
            GradOp::Silu, GradOp::Softplus, GradOp::Elu, GradOp::Mish, GradOp::Hardswish>(
        op, [&]<GradOp O>() {
          launch_map<T, T, T>(out, GradF<O, T>{static_cast<A>(a), static_cast<A>(b)}, g, v);
        });
  });
}

}  // namespace dltrain::backend::cuda
