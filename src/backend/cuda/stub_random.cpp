// The random factories' CUDA entry point in a build without CUDA (see random.hpp).
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/random.hpp"

namespace dltrain::backend::cuda {

void random_fill(const Tensor&, RandomKind, double, double, uint64_t, uint64_t) {
  unavailable("drawing random numbers on a CUDA device");
}

void multinomial(const Tensor&, const Tensor&, bool, uint64_t, uint64_t, const Tensor&) {
  unavailable("multinomial on a CUDA device");
}

}  // namespace dltrain::backend::cuda
