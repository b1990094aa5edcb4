// Gradient helpers of the unary and extremum ops on CUDA: out = bwd(g, v), one launch_map per
// (op, dtype), the op chosen at compile time from DLTRAIN_GRAD_OPS in
// src/ops/elementwise_ops.hpp, whose functors are the CPU backend's formulas too, evaluated in
// acc_t.
#include "kernels/common.cuh"
#include "src/backend/cuda/elementwise.hpp"

namespace dltrain::backend::cuda {

namespace {

template <class Fn, class T>
struct GradKernel {
  using A = acc_t<T>;
  A a, b;
  __device__ __forceinline__ T operator()(T g, T v) const {
    return convert<T>(Fn::bwd(convert<A>(g), convert<A>(v), a, b));
  }
};

}  // namespace

void binary_grad(GradOp op, const Tensor& out, const Tensor& g, const Tensor& v, double a,
                 double b) {
  DLTRAIN_CHECK(g.dtype() == out.dtype() && v.dtype() == out.dtype(), op_name(op),
                " (cuda): operand dtypes ", g.dtype(), " and ", v.dtype(),
                " differ from the output's ", out.dtype());
  cu_dispatch_floating(out.dtype(), op_name(op), [&]<class T>() {
    using A = acc_t<T>;
    const bool known = ew::visit_grad(op, [&]<class Fn>() {
      launch_map<T, T, T>(out, GradKernel<Fn, T>{static_cast<A>(a), static_cast<A>(b)}, g, v);
    });
    DLTRAIN_CHECK(known, "cuda binary_grad: unknown op code ", static_cast<int>(op));
  });
}

}  // namespace dltrain::backend::cuda
