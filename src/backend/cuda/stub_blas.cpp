// The matrix-product family of a build without CUDA (see blas.hpp).
#include "src/backend/cuda/blas.hpp"
#include "src/backend/cuda/cuda_backend.hpp"

namespace dltrain::backend::cuda {

void gemm(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  unavailable("matrix product on a CUDA tensor");
}

}  // namespace dltrain::backend::cuda
