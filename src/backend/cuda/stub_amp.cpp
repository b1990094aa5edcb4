// The GradScaler family of a build without CUDA (see amp.hpp): every entry point raises the
// "built without CUDA" error.
#include "src/backend/cuda/amp.hpp"
#include "src/backend/cuda/cuda_backend.hpp"

namespace dltrain::backend::cuda {

void amp_unscale(const std::vector<Tensor>&, const Tensor&, const Tensor&) {
  unavailable("GradScaler::unscale_ on CUDA gradients");
}
void amp_update_scale(const Tensor&, const Tensor&, const Tensor&, double, double, int64_t) {
  unavailable("GradScaler::update with a scale on a CUDA device");
}

}  // namespace dltrain::backend::cuda
