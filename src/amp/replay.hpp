// Autocast state captured at one point and re-established later on the same or another
// thread: activation checkpointing re-runs a segment during backward (where autocast is
// suspended) with the settings its forward ran under, so that the recomputation casts exactly
// as the first pass did.
#pragma once

#include <array>

#include "dltrain/core/dtype.hpp"

namespace dltrain::amp::detail {

/// This thread's autocast settings, per device type (CPU, CUDA).
struct AutocastSnapshot {
  std::array<bool, 2> enabled{};
  std::array<DType, 2> dtype{};
  bool cache_enabled = true;
  bool suspended = false;  // inside an op's redispatch or a backward pass
};

AutocastSnapshot autocast_snapshot();

/// Re-establishes `s` for its lifetime and restores the settings it found on exit; the casts
/// it cached are dropped then (as at the end of any region).
class AutocastReplay {
 public:
  explicit AutocastReplay(const AutocastSnapshot& s);
  ~AutocastReplay();
  AutocastReplay(const AutocastReplay&) = delete;
  AutocastReplay& operator=(const AutocastReplay&) = delete;

 private:
  AutocastSnapshot saved_;
  int saved_suspended_ = 0;
};

}  // namespace dltrain::amp::detail
