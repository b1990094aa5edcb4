// The image pipeline's CUDA entry point in a build without CUDA (see image.hpp).
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/image.hpp"

namespace dltrain::backend::cuda {

void normalize_image(const Tensor&, const Tensor&, const std::vector<float>&,
                     const std::vector<float>&) {
  unavailable("normalising an image batch on a CUDA device");
}

}  // namespace dltrain::backend::cuda
