// sort_lines for floating keys: f32, f64, f16, bf16 (kernels/sort.cuh: the CUB instantiations
// are split in two files by dtype kind, so that they compile in parallel).
#include "kernels/sort_impl.cuh"

namespace dltrain::backend::cuda {
template void sort_lines_as<float>(const Tensor&, const Tensor&, int64_t, int64_t, bool);
template void sort_lines_as<double>(const Tensor&, const Tensor&, int64_t, int64_t, bool);
template void sort_lines_as<__half>(const Tensor&, const Tensor&, int64_t, int64_t, bool);
template void sort_lines_as<__nv_bfloat16>(const Tensor&, const Tensor&, int64_t, int64_t, bool);
}  // namespace dltrain::backend::cuda
