// The softmax and loss family of a build without CUDA (see loss.hpp): every entry point
// raises the "built without CUDA" error.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/loss.hpp"

namespace dltrain::backend::cuda {

void softmax_forward(const Tensor&, const Tensor&, int64_t, int64_t, int64_t, bool) {
  unavailable("softmax on a CUDA tensor");
}
void softmax_backward(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, int64_t,
                      bool) {
  unavailable("softmax backward on a CUDA tensor");
}
void cross_entropy_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, const Tensor&, const ClassLoss&, double) {
  unavailable("cross_entropy on a CUDA tensor");
}
void cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, const Tensor&, const ClassLoss&, double) {
  unavailable("cross_entropy backward on a CUDA tensor");
}
void nll_loss_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const ClassLoss&) {
  unavailable("nll_loss on a CUDA tensor");
}
void nll_loss_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const ClassLoss&) {
  unavailable("nll_loss backward on a CUDA tensor");
}
void bce_with_logits(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  unavailable("binary_cross_entropy_with_logits on a CUDA tensor");
}
void softplus_neg(const Tensor&, const Tensor&) {
  unavailable("binary_cross_entropy_with_logits backward on a CUDA tensor");
}
void dropout_forward(const Tensor&, const Tensor&, const Tensor&, double, uint64_t, uint64_t) {
  unavailable("dropout on a CUDA tensor");
}
void dropout_backward(const Tensor&, const Tensor&, const Tensor&, double) {
  unavailable("dropout backward on a CUDA tensor");
}

}  // namespace dltrain::backend::cuda
