// Index-tensor checks and reads shared by the indexing ops (internal header): dtype checks,
// reading an index tensor to the host (CPU path, where every value is range-checked) or
// keeping it on the device as contiguous int64 (CUDA path, no host sync), and the shape rules
// of gather/scatter.
#pragma once

#include <vector>

#include "dltrain/core/tensor.hpp"
#include "src/ops/common.hpp"

namespace dltrain::detail {

/// Throws unless idx is a defined int64/int32 index tensor.
inline void check_index(const char* op, const Tensor& idx, const char* name) {
  check_defined(op, idx, name);
  DLTRAIN_CHECK(idx.dtype() == DType::i64 || idx.dtype() == DType::i32, op, ": '", name,
                "' must be an index tensor of dtype int64 (or int32) but has dtype ", idx.dtype(),
                "; convert it with .to(DType::i64)");
}

/// Reads an int64/int32 index tensor as int64 values in row-major order.
inline std::vector<int64_t> read_index(const char* op, const Tensor& idx, const char* name) {
  check_index(op, idx, name);
  return idx.detach().to_vector<int64_t>();
}

/// An index tensor as the CUDA kernels read it: int64, contiguous (row-major), on its device.
inline Tensor device_index(const char* op, const Tensor& idx, const char* name) {
  check_index(op, idx, name);
  return idx.detach().to(DType::i64).contiguous();
}

/// Throws on the first value outside [0, n), naming it, its position and `what`.
inline void check_range(const char* op, const std::vector<int64_t>& v, int64_t n,
                        const char* what) {
  for (size_t i = 0; i < v.size(); ++i)
    DLTRAIN_CHECK(v[i] >= 0 && v[i] < n, op, ": index ", v[i], " at position ", i,
                  " is out of range for ", what, " of size ", n, "; valid range is [0, ", n, ")");
}

/// The shared rules of gather/scatter: same ndim, index no larger than `x` outside dim.
inline void check_index_shape(const char* op, const Tensor& x, int64_t dim, const Tensor& index) {
  DLTRAIN_CHECK(index.dim() == x.dim(), op, ": index must have as many dimensions as the input (",
                x.dim(), ") but has shape ", shape_str(index.shape()), " for input ",
                shape_str(x.shape()));
  for (int64_t d = 0; d < x.dim(); ++d)
    DLTRAIN_CHECK(d == dim || index.size(d) <= x.size(d), op, ": index of shape ",
                  shape_str(index.shape()), " is larger than the input of shape ",
                  shape_str(x.shape()), " in dimension ", d, " (only dimension ", dim,
                  " may differ)");
}

}  // namespace dltrain::detail
