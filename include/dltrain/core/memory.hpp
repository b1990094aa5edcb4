// Memory you can measure: bytes held by live tensors on a device, and their peak.
//
// The same three calls for every device type, as PyTorch's torch.cuda.memory_allocated family:
// on the CPU they read the CPU allocator's counters (src/core/storage.cpp), on a CUDA device the
// CUDA backend's (include/dltrain/backend/cuda.hpp). What a model's activations cost is the rise
// of memory_allocated over a forward, or the peak over a step after reset_peak_memory_stats:
// figures the process's RSS cannot give, since it mixes tensors with the allocator's cache, the
// libraries, the dataset and the heap's fragmentation.
#pragma once

#include <cstddef>

#include "dltrain/core/device.hpp"

namespace dltrain {

/// Bytes held by live tensors allocated on `device`. On the CPU: the sizes requested by every
/// Storage the library allocated, exactly (freed blocks kept in the block cache, pinned
/// memory, and memory wrapped from elsewhere are not counted); on a CUDA device: the CUDA
/// allocator's count (0 in a build without CUDA or without a GPU). Kept with one relaxed
/// atomic add per allocation and per free, so it is always on.
size_t memory_allocated(Device device = Device::cpu());
/// Peak of memory_allocated(device) since the start or the last reset_peak_memory_stats.
size_t max_memory_allocated(Device device = Device::cpu());
/// Sets the peak of `device` to what is allocated now (call it before the step to measure).
void reset_peak_memory_stats(Device device = Device::cpu());

}  // namespace dltrain
