// The optimizer family of a build without CUDA (see optim.hpp): every entry point raises the
// "built without CUDA" error.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/optim.hpp"

namespace dltrain::backend::cuda {

void sgd_step(const SgdHyper&, const std::vector<SgdTensors>&) {
  unavailable("stepping SGD on CUDA parameters");
}
void adam_step(const AdamHyper&, const std::vector<AdamTensors>&) {
  unavailable("stepping Adam on CUDA parameters");
}
void lars_step(const LarsHyper&, const std::vector<LarsTensors>&) {
  unavailable("stepping LARS on CUDA parameters");
}
void lamb_step(const LambHyper&, const std::vector<LambTensors>&) {
  unavailable("stepping LAMB on CUDA parameters");
}
void grad_norm(const Tensor&, const Tensor&, const std::vector<Tensor>&, double, double) {
  unavailable("clip_grad_norm_ on CUDA gradients");
}
void scale_grads(const std::vector<Tensor>&, const Tensor&) {
  unavailable("clip_grad_norm_ on CUDA gradients");
}
void clamp_grads(const std::vector<Tensor>&, double, double) {
  unavailable("clip_grad_value_ on CUDA gradients");
}

}  // namespace dltrain::backend::cuda
