// interpolate's CUDA entry points in a build without CUDA (see resample.hpp).
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/resample.hpp"

namespace dltrain::backend::cuda {

void upsample2d_forward(const Tensor&, const Tensor&, const Upsample2d&) {
  unavailable("interpolate on a CUDA device");
}
void upsample2d_backward(const Tensor&, const Tensor&, const Upsample2d&) {
  unavailable("interpolate's backward on a CUDA device");
}

void pad2d_forward(const Tensor&, const Tensor&, const Pad2d&) {
  unavailable("reflect/replicate pad on a CUDA device");
}
void pad2d_backward(const Tensor&, const Tensor&, const Pad2d&) {
  unavailable("reflect/replicate pad's backward on a CUDA device");
}

}  // namespace dltrain::backend::cuda
