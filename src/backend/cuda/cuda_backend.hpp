// The CUDA backend's entry points used by core and ops (internal header).
//
// With DLTRAIN_WITH_CUDA these are implemented in src/backend/cuda/*.cpp over
// the CUDA runtime; without it, src/backend/cuda/stub.cpp implements them by
// raising a clear dltrain::Error (the link-time split of DESIGN.md). A CUDA
// build on a machine without a GPU or driver reports zero devices.
#pragma once

#include <cstddef>

#include <cstdint>

#include "dltrain/core/device.hpp"
#include "dltrain/core/dtype.hpp"

namespace dltrain::backend::cuda {

/// True when this build contains the CUDA backend.
bool compiled();
/// Number of usable CUDA devices (0 without driver or GPU, or without CUDA support).
int device_count();
/// Device memory for `device`; throws dltrain::Error when it cannot be had.
void* allocate(size_t nbytes, Device device);
void deallocate(void* p, Device device);
/// Copies between host and device or device and device (synchronous for now).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);
/// Writes `value` (converted to dtype) into n contiguous elements at p on `device`.
void fill(void* p, DType dtype, int64_t n, double value, Device device);

}  // namespace dltrain::backend::cuda
