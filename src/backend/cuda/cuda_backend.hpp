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
#include "src/backend/cuda/entry.hpp"

namespace dltrain::backend::cuda {

/// True when this build contains the CUDA backend.
DLTRAIN_CUDA_ANSWER(bool, compiled, (), false);
/// Number of usable CUDA devices (0 without driver or GPU, or without CUDA support).
DLTRAIN_CUDA_ANSWER(int, device_count, (), 0);
/// Device memory for `device` from its stream-ordered pool, allocated on the thread's current
/// stream and freed (by the returned pointer's deleter) on that same stream. Throws
/// dltrain::Error naming the size and the current/peak usage when memory runs out.
DLTRAIN_CUDA_ENTRY(std::shared_ptr<void>, allocate, (size_t nbytes, Device device),
                   "allocating CUDA memory");
/// Page-locked host memory (pooled by size class, see host_block_cache.hpp); throws without
/// CUDA.
DLTRAIN_CUDA_ENTRY(std::shared_ptr<void>, allocate_pinned, (size_t nbytes),
                   "allocating pinned host memory");
/// Adds `s` to the streams that use `block` (a block from allocate or allocate_pinned; no-op
/// for other memory): its memory is reused only after `s` has passed the free point.
DLTRAIN_CUDA_ENTRY(void, record_stream,
                   (const std::shared_ptr<void>& block, const dltrain::cuda::Stream& s),
                   "record_stream");
/// Copies between host and device or device and device. `async` enqueues on the current
/// stream of the device involved and returns at once (only safe from pinned host memory or
/// between devices); otherwise the call returns when the copy is done.
DLTRAIN_CUDA_ENTRY(void, copy_bytes,
                   (void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
                    bool async = false),
                   "copying to a CUDA device");
/// Writes `value` (converted to dtype) into n contiguous elements at p on `device`.
DLTRAIN_CUDA_ENTRY(void, fill, (void* p, DType dtype, int64_t n, double value, Device device),
                   "filling a CUDA tensor");

}  // namespace dltrain::backend::cuda
