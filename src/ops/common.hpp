// Argument checks shared by the ops (internal header).
#pragma once

#include <initializer_list>

#include "dltrain/core/tensor.hpp"
#include "src/amp/dispatch.hpp"

namespace dltrain::detail {

/// Throws unless every defined tensor is on the same device.
void check_same_device(const char* op, std::initializer_list<const Tensor*> ts);
/// Throws unless `t` is defined.
void check_defined(const char* op, const Tensor& t, const char* name);
/// The CUDA backend of this op is not in this build: throw a clear error for a CUDA tensor.
void require_cpu(const char* op, std::initializer_list<const Tensor*> ts);
/// Throws unless t has `n` dimensions.
void check_dim(const char* op, const Tensor& t, int64_t n, const char* name);

}  // namespace dltrain::detail
