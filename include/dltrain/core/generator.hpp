// Counter-based random numbers (Philox-4x32-10).
//
// A Generator is (seed, offset). Element i of a random tensor depends only on
// (seed, offset, i), never on the thread that computes it, so the same seed
// gives the same tensor whatever DLTRAIN_NUM_THREADS is, and the CUDA backend
// can reproduce the CPU stream. Each call that draws n values advances the
// offset by the number of 128-bit counters it used.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

namespace dltrain {

/// Philox-4x32-10 block function: 4 uniform 32-bit words from (counter, key).
std::array<uint32_t, 4> philox4x32(uint64_t counter, uint64_t subsequence, uint64_t key);

/// A seeded, counter-based random generator. Thread-safe.
class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ull) : seed_(seed) {}
  void manual_seed(uint64_t seed);
  uint64_t seed() const { return seed_; }
  /// Position in the stream, in 128-bit counters (what a checkpoint saves).
  uint64_t offset() const;
  void set_offset(uint64_t offset);
  /// Reserves `counters` 128-bit counters and returns the first one.
  uint64_t reserve(uint64_t counters);

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
  mutable std::mutex mu_;
};

/// The process-wide default generator used when an op is given none.
Generator& default_generator();
/// Seeds the default generator (like torch.manual_seed).
void manual_seed(uint64_t seed);

}  // namespace dltrain
