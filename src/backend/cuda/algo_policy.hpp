// Two policies of the cuDNN convolution code (dnn_conv.cpp) written without CUDA types, so that
// they are tested on any machine (tests/core/test_cudnn_policy.cpp): which algorithm of cuDNN's
// ranking runs, and how the benchmark's workspace is sized when memory is short.
#pragma once

#include <cstddef>
#include <utility>

#include "dltrain/core/error.hpp"

namespace dltrain::backend::cuda {

/// The algorithm to run among `n` candidates in cuDNN's order (cudnnGet*_v7's heuristic
/// ranking, or cudnnFind*Ex's results sorted fastest first): the first one `usable(i)` accepts
/// (it ran, fits the workspace, has an allowed math type), restricted to those
/// `deterministic(i)` reports as deterministic when `deterministic_only`
/// (cuda::set_cudnn_deterministic). PyTorch's choice: determinism is asked for, not preferred.
/// -1 when none qualifies.
template <class Usable, class Deterministic>
int choose_algorithm(int n, Usable&& usable, Deterministic&& deterministic,
                     bool deterministic_only) {
  for (int i = 0; i < n; ++i)
    if (usable(i) && (!deterministic_only || deterministic(i))) return i;
  return -1;
}

/// `allocate(size)` for size = want, want / 2, want / 4, ... until one succeeds; `got` is that
/// size (0, and a default-constructed result, when none did). Only OutOfMemoryError (the CUDA
/// allocator's cudaErrorMemoryAllocation) makes it try half: any other error, a sticky CUDA
/// fault above all, propagates instead of being taken for a full device.
template <class Allocate>
auto halving_allocation(size_t want, Allocate&& allocate, size_t& got) -> decltype(allocate(want)) {
  for (size_t size = want; size > 0; size /= 2) {
    try {
      auto out = allocate(size);
      got = size;
      return out;
    } catch (const OutOfMemoryError&) {
      // too large for the free memory now: try half
    }
  }
  got = 0;
  return decltype(allocate(want))();
}

}  // namespace dltrain::backend::cuda
