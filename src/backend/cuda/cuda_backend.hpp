// The CUDA backend's runtime entry points used by core (internal header, no CUDA types).
//
// With DLTRAIN_WITH_CUDA these are implemented in src/backend/cuda/runtime.cpp over the
// CUDA runtime; without it, src/backend/cuda/stub.cpp implements them by raising a clear
// dltrain::Error (the link-time split of DESIGN.md). A CUDA build on a machine without a
// GPU or driver reports zero devices. The op entry points live in one header per op
// family beside this one (elementwise.hpp, reduce.hpp, blas.hpp, dnn.hpp, ...), each
// with its stub_*.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/device.hpp"
#include "dltrain/core/dtype.hpp"

namespace dltrain::backend::cuda {

/// Raises the "built without CUDA" error naming `what` (defined by the stubs only).
[[noreturn]] void unavailable(const char* what);

/// True when this build contains the CUDA backend.
bool compiled();
/// Number of usable CUDA devices (0 without driver or GPU, or without CUDA support).
int device_count();
/// Device memory for `device` from its stream-ordered pool, allocated on the thread's current
/// stream and freed (by the returned pointer's deleter) on that same stream. Throws
/// dltrain::Error naming the size and the current/peak usage when memory runs out.
std::shared_ptr<void> allocate(size_t nbytes, Device device);
/// Page-locked host memory (pooled by size class, see host_block_cache.hpp); throws without
/// CUDA.
std::shared_ptr<void> allocate_pinned(size_t nbytes);
/// Adds `s` to the streams that use `block` (a block from allocate or allocate_pinned; no-op
/// for other memory): its memory is reused only after `s` has passed the free point.
void record_stream(const std::shared_ptr<void>& block, const dltrain::cuda::Stream& s);
/// Copies between host and device or device and device. `async` enqueues on the current
/// stream of the device involved and returns at once (only safe from pinned host memory or
/// between devices); otherwise the call returns when the copy is done.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
                bool async = false);
/// Writes `value` (converted to dtype) into n contiguous elements at p on `device`.
void fill(void* p, DType dtype, int64_t n, double value, Device device);

}  // namespace dltrain::backend::cuda
