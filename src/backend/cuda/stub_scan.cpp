// The line ops of a build without CUDA (see scan.hpp): every entry point raises the "built
// without CUDA" error.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/scan.hpp"

namespace dltrain::backend::cuda {

void line_scan(const Tensor&, const Tensor&, int64_t, int64_t, int64_t, LineOp) {
  unavailable("cumsum/prod on a CUDA tensor");
}
void sort_lines(const Tensor&, const Tensor&, int64_t, int64_t, bool) {
  unavailable("sort on a CUDA tensor");
}
void nonzero_write(const Tensor&, const Tensor&, const Tensor&, const Shape&) {
  unavailable("nonzero on a CUDA tensor");
}

}  // namespace dltrain::backend::cuda
