// Binary arithmetic on CUDA: add/sub (with alpha), mul, div, maximum/minimum (NaN
// propagating) and pow, broadcasting, any strides. One launch_map per (op, dtype): Add, Sub,
// Mul, Max and Min for every numeric dtype, Div and Pow for the floating ones; arithmetic in
// acc_t with the CPU backend's integer promotions and wrap-around, so results equal the CPU's.
#include "kernels/common.cuh"
#include "src/backend/cuda/elementwise.hpp"

namespace dltrain::backend::cuda {

namespace {

template <class A>
__device__ __forceinline__ bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>)
    return v != v;
  else
    return false;
}

template <BinaryOp Op, class T>
struct BinaryF {
  using A = acc_t<T>;
  A alpha;
  __device__ __forceinline__ T operator()(T xin, T yin) const {
    const A x = convert<A>(xin), y = convert<A>(yin);
    if constexpr (Op == BinaryOp::Add) {
      return convert<T>(x + alpha * y);
    } else if constexpr (Op == BinaryOp::Sub) {
      return convert<T>(x - alpha * y);
    } else if constexpr (Op == BinaryOp::Mul) {
      return convert<T>(x * y);
    } else if constexpr (Op == BinaryOp::Div) {
      return convert<T>(x / y);
    } else if constexpr (Op == BinaryOp::Max) {
      return (x > y || is_nan(x)) ? xin : yin;
    } else if constexpr (Op == BinaryOp::Min) {
      return (x < y || is_nan(x)) ? xin : yin;
    } else {
      static_assert(Op == BinaryOp::Pow);
      if constexpr (std::is_same_v<A, float>)
        return convert<T>(powf(x, y));
      else
        return convert<T>(::pow(x, y));
    }
  }
};

template <BinaryOp... Ops, class F>
bool with_op(BinaryOp op, F&& f) {
  return ((op == Ops ? (f.template operator()<Ops>(), true) : false) || ...);
}

}  // namespace

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, double alpha) {
  DLTRAIN_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), op_name(op),
                " (cuda): operand dtypes ", a.dtype(), " and ", b.dtype(),
                " differ from the output's ", out.dtype());
  if (op == BinaryOp::Div || op == BinaryOp::Pow) {
    cu_dispatch_floating(out.dtype(), op_name(op), [&]<class T>() {
      with_op<BinaryOp::Div, BinaryOp::Pow>(op, [&]<BinaryOp O>() {
        launch_map<T, T, T>(out, BinaryF<O, T>{static_cast<acc_t<T>>(alpha)}, a, b);
      });
    });
    return;
  }
  cu_dispatch_numeric(out.dtype(), op_name(op), [&]<class T>() {
    const bool hit =
        with_op<BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max, BinaryOp::Min>(
            op, [&]<BinaryOp O>() {
              launch_map<T, T, T>(out, BinaryF<O, T>{static_cast<acc_t<T>>(alpha)}, a, b);
            });
    DLTRAIN_CHECK(hit, "cuda binary: unknown op code ", static_cast<int>(op));
  });
}

}  // namespace dltrain::backend::cuda
