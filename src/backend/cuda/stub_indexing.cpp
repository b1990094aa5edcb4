// The indexing family of a build without CUDA (see indexing.hpp): every entry point raises
// the "built without CUDA" error.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/indexing.hpp"

namespace dltrain::backend::cuda {

void take_rows(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, int64_t) {
  unavailable("indexing a CUDA tensor");
}
void index_add_rows(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, int64_t,
                    int64_t) {
  unavailable("index_add on a CUDA tensor");
}
void gather_dim(const Tensor&, const Tensor&, int64_t, const Tensor&) {
  unavailable("gather on a CUDA tensor");
}
void scatter_add_dim(const Tensor&, int64_t, const Tensor&, const Tensor&) {
  unavailable("scatter_add on a CUDA tensor");
}
void scatter_extreme_dim(const Tensor&, int64_t, const Tensor&, const Tensor&, bool) {
  unavailable("scatter_reduce on a CUDA tensor");
}
void one_hot(const Tensor&, const Tensor&, int64_t) { unavailable("one_hot on a CUDA tensor"); }
void segment_counts(const Tensor&, const Tensor&, int64_t) {
  unavailable("segment_mean on a CUDA tensor");
}

}  // namespace dltrain::backend::cuda
