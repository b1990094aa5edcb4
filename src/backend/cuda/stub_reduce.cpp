// The reduction family of a build without CUDA (see reduce.hpp): every entry point raises the
// "built without CUDA" error.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/reduce.hpp"

namespace dltrain::backend::cuda {

void sum(const Tensor&, const Tensor&) { unavailable("sum"); }
void extreme(const Tensor&, const Tensor&, const Tensor&, int64_t, bool is_max) {
  unavailable(is_max ? "max" : "min");
}
void extreme_backward(const Tensor&, const Tensor&, const Tensor&, int64_t) {
  unavailable("max/min backward");
}

}  // namespace dltrain::backend::cuda
