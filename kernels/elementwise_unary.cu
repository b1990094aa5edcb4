// Floating unary maps on CUDA: one launch_map per (op, dtype), the op chosen at compile time
// from the list in src/ops/elementwise_ops.hpp, whose functors are the CPU backend's formulas
// too, evaluated in acc_t (float for f16/bf16), so results agree with the CPU to a few ulps of
// the dtype.
#include "kernels/common.cuh"
#include "src/backend/cuda/elementwise.hpp"

namespace dltrain::backend::cuda {

namespace {

template <class Fn, class T>
struct UnaryKernel {
  using A = acc_t<T>;
  A a, b;
  __device__ __forceinline__ T operator()(T in) const {
    return convert<T>(Fn::fwd(convert<A>(in), a, b));
  }
};

}  // namespace

void unary(UnaryOp op, const Tensor& out, const Tensor& x, double a, double b) {
  DLTRAIN_CHECK(x.dtype() == out.dtype(), op_name(op), " (cuda): input dtype ", x.dtype(),
                " differs from the output's ", out.dtype());
  cu_dispatch_floating(out.dtype(), op_name(op), [&]<class T>() {
    using A = acc_t<T>;
    const bool known = ew::visit_unary(op, [&]<class Fn>() {
      launch_map<T, T>(out, UnaryKernel<Fn, T>{static_cast<A>(a), static_cast<A>(b)}, x);
    });
    DLTRAIN_CHECK(known, "cuda unary: unknown op code ", static_cast<int>(op));
  });
}

}  // namespace dltrain::backend::cuda
