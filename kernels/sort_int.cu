// sort_lines for integer keys: i32, i64, u8 (kernels/sort.cuh: the CUB instantiations are split
// in two files by dtype kind, so that they compile in parallel).
#include "kernels/sort_impl.cuh"

namespace dltrain::backend::cuda {
template void sort_lines_as<int32_t>(const Tensor&, const Tensor&, int64_t, int64_t, bool);
template void sort_lines_as<int64_t>(const Tensor&, const Tensor&, int64_t, int64_t, bool);
template void sort_lines_as<uint8_t>(const Tensor&, const Tensor&, int64_t, int64_t, bool);
}  // namespace dltrain::backend::cuda
