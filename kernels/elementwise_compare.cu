// Comparisons on CUDA (eq, ne, lt, le, gt, ge): bool outputs, broadcasting, any strides and
// dtypes (bool included), compared in acc_t as on the CPU. One launch_map per (op, dtype).
#include "kernels/common.cuh"
#include "src/backend/cuda/elementwise.hpp"

namespace dltrain::backend::cuda {

namespace {

template <CompareOp Op, class T>
struct CompareF {
  using A = acc_t<T>;
  __device__ __forceinline__ bool operator()(T xin, T yin) const {
    const A x = convert<A>(xin), y = convert<A>(yin);
    if constexpr (Op == CompareOp::Eq) {
      return x == y;
    } else if constexpr (Op == CompareOp::Ne) {
      return x != y;
    } else if constexpr (Op == CompareOp::Lt) {
      return x < y;
    } else if constexpr (Op == CompareOp::Le) {
      return x <= y;
    } else if constexpr (Op == CompareOp::Gt) {
      return x > y;
    } else {
      static_assert(Op == CompareOp::Ge);
      return x >= y;
    }
  }
};

template <CompareOp... Ops, class F>
void with_op(CompareOp op, F&& f) {
  const bool hit = ((op == Ops ? (f.template operator()<Ops>(), true) : false) || ...);
  DLTRAIN_CHECK(hit, "cuda compare: unknown op code ", static_cast<int>(op));
}

}  // namespace

void compare(CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  DLTRAIN_CHECK(out.dtype() == DType::b8 && a.dtype() == b.dtype(),
                "compare (cuda): expected a bool output and operands of one dtype but got ",
                out.dtype(), ", ", a.dtype(), " and ", b.dtype());
  cu_dispatch_all(a.dtype(), "compare", [&]<class T>() {
    with_op<CompareOp::Eq, CompareOp::Ne, CompareOp::Lt, CompareOp::Le, CompareOp::Gt,
            CompareOp::Ge>(
        op, [&]<CompareOp O>() { launch_map<bool, T, T>(out, CompareF<O, T>{}, a, b); });
  });
}

}  // namespace dltrain::backend::cuda
