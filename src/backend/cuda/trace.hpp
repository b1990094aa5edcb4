// The CUDA side of op tracing (internal header, no CUDA types): NVTX ranges so Nsight Systems
// shows op names, and CUDA events around each traced scope so train::Profiler can report GPU
// time per op. Implemented in trace.cpp on CUDA builds; a CUDA-less build makes every call a no-op
// (usable() false) without CUDA. Marks are pooled events, recorded on the calling thread's
// current stream of the current device.
#pragma once

#include "src/backend/cuda/entry.hpp"

namespace dltrain::backend::cuda::trace {

/// An event recorded on a stream (opaque); null when recording failed.
using Mark = void*;

/// True when this build has CUDA and a device is visible: the other calls do something.
DLTRAIN_CUDA_ANSWER(bool, usable, (), false);
/// The current device (0 when none).
DLTRAIN_CUDA_ANSWER(int, current_device, (), 0);
/// Pushes / pops an NVTX range on this thread.
DLTRAIN_CUDA_ANSWER(void, range_push, (const char* name));
DLTRAIN_CUDA_ANSWER(void, range_pop, ());
/// Records a pooled event on the current stream of the current device.
DLTRAIN_CUDA_ANSWER(Mark, mark, (), nullptr);
/// GPU milliseconds from `from` to `to`, waiting for `to`; negative when they cannot be
/// compared (recorded on different devices, or an error).
DLTRAIN_CUDA_ANSWER(double, elapsed_ms, (Mark from, Mark to), -1);
/// Returns a mark's event to the pool.
DLTRAIN_CUDA_ANSWER(void, recycle, (Mark m));

}  // namespace dltrain::backend::cuda::trace
