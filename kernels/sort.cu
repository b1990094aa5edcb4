// Segmented sorting on CUDA (entry point sort_lines in src/backend/cuda/scan.hpp): the dtype
// dispatch. The sort itself (CUB's DeviceSegmentedSort, see kernels/sort_impl.cuh) is compiled
// in kernels/sort_float.cu and kernels/sort_int.cu, which compile in parallel.
#include "kernels/common.cuh"
#include "kernels/sort.cuh"
#include "src/backend/cuda/scan.hpp"

namespace dltrain::backend::cuda {

void sort_lines(const Tensor& indices, const Tensor& x, int64_t lines, int64_t L, bool descending) {
  if (lines * L == 0) return;
  cu_dispatch_numeric(x.dtype(), "sort",
                      [&]<class T>() { sort_lines_as<T>(indices, x, lines, L, descending); });
}

}  // namespace dltrain::backend::cuda
