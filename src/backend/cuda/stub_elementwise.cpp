// The elementwise family of a build without CUDA (see elementwise.hpp): every entry point
// raises the "built without CUDA" error.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/elementwise.hpp"

namespace dltrain::backend::cuda {

void copy(const Tensor&, const Tensor&) { unavailable("copying a CUDA tensor"); }
void copy_scaled(const Tensor&, const Tensor&, double) { unavailable("copy_scaled_"); }
void unary(UnaryOp op, const Tensor&, const Tensor&, double, double) { unavailable(op_name(op)); }
void binary(BinaryOp op, const Tensor&, const Tensor&, const Tensor&, double) {
  unavailable(op_name(op));
}
void binary_grad(GradOp op, const Tensor&, const Tensor&, const Tensor&, double, double) {
  unavailable(op_name(op));
}
void compare(CompareOp, const Tensor&, const Tensor&, const Tensor&) { unavailable("compare"); }
void where(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { unavailable("where"); }
void ternary(TernaryOp op, const Tensor&, const Tensor&, const Tensor&, const Tensor&, double) {
  unavailable(op == TernaryOp::Addcmul ? "addcmul_" : "addcdiv_");
}

}  // namespace dltrain::backend::cuda
