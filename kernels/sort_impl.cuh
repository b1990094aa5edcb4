// The definition of sort_lines_as<T> (kernels/sort.cuh): every row of a contiguous [lines, L]
// tensor sorted by CUB's DeviceSegmentedSort::StableSortPairs(Descending), keys = the values,
// payload = the position in the row, so the sorted payload is the stable argsort. CUB is the
// maintained library for this (radix sort for small and large segments alike); hand-writing a
// bitonic sort would only cover short rows.
//
// Order: CUB's radix order of floats puts a positive NaN above +inf and treats -0.0 as +0.0;
// the caller (src/ops/sort.cpp) turns every NaN into the positive canonical one first, so NaN
// sorts above every number, as PyTorch. Temporary storage comes from the device pool (a u8
// tensor), the sort runs on the device's current stream: no host sync.
//
// Included only by kernels/sort_float.cu and kernels/sort_int.cu, which instantiate it.
#pragma once

#include <cub/device/device_segmented_sort.cuh>

#include "kernels/common.cuh"
#include "kernels/sort.cuh"

namespace dltrain::backend::cuda {

template <class T>
void sort_lines_as(const Tensor& indices, const Tensor& x, int64_t lines, int64_t L,
                   bool descending) {
  const int64_t n = lines * L;
  const int dev = indices.device().index;
  Guard guard(dev);
  const TensorOptions i64 = TensorOptions(DType::i64).with_device(indices.device());
  const Tensor offsets = arange(0.0, static_cast<double>(n + 1), static_cast<double>(L), i64);
  const Tensor positions = arange(static_cast<double>(L), i64).expand({lines, L}).contiguous();
  Tensor keys_out = empty({lines, L}, x.options());
  const int64_t* begin = static_cast<const int64_t*>(offsets.data_ptr());
  const T* kin = static_cast<const T*>(x.data_ptr());
  T* kout = static_cast<T*>(keys_out.data_ptr());
  const int64_t* vin = static_cast<const int64_t*>(positions.data_ptr());
  int64_t* vout = static_cast<int64_t*>(indices.data_ptr());
  auto call = [&](void* tmp, size_t& bytes) {
    return descending
               ? cub::DeviceSegmentedSort::StableSortPairsDescending(
                     tmp, bytes, kin, kout, vin, vout, n, lines, begin, begin + 1, stream(dev))
               : cub::DeviceSegmentedSort::StableSortPairs(tmp, bytes, kin, kout, vin, vout, n,
                                                           lines, begin, begin + 1, stream(dev));
  };
  size_t bytes = 0;
  DLTRAIN_CUDA_CHECK(call(nullptr, bytes));
  Tensor tmp = empty({static_cast<int64_t>(bytes) + 1},
                     TensorOptions(DType::u8).with_device(indices.device()));
  DLTRAIN_CUDA_CHECK(call(tmp.data_ptr(), bytes));
}

}  // namespace dltrain::backend::cuda
