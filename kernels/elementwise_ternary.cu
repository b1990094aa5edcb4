// Three-input maps on CUDA: where(cond, a, b) for every dtype, and the fused in-place updates
// addcmul (s + v * t1 * t2) and addcdiv (s + v * t1 / t2) for every numeric dtype, computed in
// acc_t as on the CPU. out may be s itself (each element is read, then written, by one thread).
#include "kernels/common.cuh"
#include "src/backend/cuda/elementwise.hpp"

namespace dltrain::backend::cuda {

namespace {

template <class T>
struct WhereF {
  __device__ __forceinline__ T operator()(bool c, T x, T y) const { return c ? x : y; }
};

template <TernaryOp Op, class T>
struct TernaryF {
  using A = acc_t<T>;
  A value;
  __device__ __forceinline__ T operator()(T s, T x, T y) const {
    if constexpr (Op == TernaryOp::Addcmul)
      return convert<T>(convert<A>(s) + value * convert<A>(x) * convert<A>(y));
    else
      return convert<T>(convert<A>(s) + value * convert<A>(x) / convert<A>(y));
  }
};

}  // namespace

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  DLTRAIN_CHECK(cond.dtype() == DType::b8 && a.dtype() == out.dtype() && b.dtype() == out.dtype(),
                "where (cuda): expected a bool condition and operands of the output's dtype ",
                out.dtype(), " but got ", cond.dtype(), ", ", a.dtype(), " and ", b.dtype());
  cu_dispatch_all(out.dtype(), "where",
                  [&]<class T>() { launch_map<T, bool, T, T>(out, WhereF<T>{}, cond, a, b); });
}

void ternary(TernaryOp op, const Tensor& out, const Tensor& s, const Tensor& t1, const Tensor& t2,
             double value) {
  const char* name = op == TernaryOp::Addcmul ? "addcmul_" : "addcdiv_";
  DLTRAIN_CHECK(s.dtype() == out.dtype() && t1.dtype() == out.dtype() && t2.dtype() == out.dtype(),
                name, " (cuda): operand dtypes differ from the output's ", out.dtype());
  cu_dispatch_numeric(out.dtype(), name, [&]<class T>() {
    const acc_t<T> v = static_cast<acc_t<T>>(value);
    if (op == TernaryOp::Addcmul)
      launch_map<T, T, T, T>(out, TernaryF<TernaryOp::Addcmul, T>{v}, s, t1, t2);
    else
      launch_map<T, T, T, T>(out, TernaryF<TernaryOp::Addcdiv, T>{v}, s, t1, t2);
  });
}

}  // namespace dltrain::backend::cuda
