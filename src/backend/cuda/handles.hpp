// cuBLASLt and cuDNN handles for the CUDA backend's library calls (internal header, CUDA types
// allowed). A handle belongs to one device and, while in use, to one thread: each thread gets
// its own per device, created lazily with that device current, and gives it back to a
// process-wide pool when it exits, so threads that come and go reuse handles instead of
// creating (slow) or leaking them. Pooled handles are never destroyed (a process-lifetime
// cache, freed by the driver at exit). cudnn_handle() binds the handle to the calling
// thread's current stream of the device on every call, so all cuDNN work is enqueued there;
// cuBLASLt takes the stream per call (pass stream(device)). Also: small helpers shared by the
// cuDNN sources (dtype names, address alignment).
#pragma once

#include <cublasLt.h>
#include <cudnn.h>

#include <cstdint>

#include "dltrain/core/dtype.hpp"

namespace dltrain::backend::cuda {

/// The calling thread's cuBLASLt handle for `device`.
cublasLtHandle_t cublaslt_handle(int device);
/// The calling thread's cuDNN handle for `device`, bound to stream(device).
cudnnHandle_t cudnn_handle(int device);

/// cuDNN's name for a floating dtype; throws naming `op` for other dtypes.
cudnnDataType_t cudnn_data_type(DType t, const char* op);

/// Alignment of a device address in bytes: the largest power of two dividing it, at most 256
/// (what cuBLASLt's and cuDNN's kernel choices care about).
inline uint32_t address_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

}  // namespace dltrain::backend::cuda
