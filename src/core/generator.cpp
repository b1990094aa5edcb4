// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
#include "dltrain/core/generator.hpp"

#include "src/core/philox.hpp"

namespace dltrain {

std::array<uint32_t, 4> philox4x32(uint64_t counter, uint64_t subsequence, uint64_t key) {
  const philox::Words w = philox::philox4x32_10(counter, subsequence, key);  // shared with CUDA
  return {w.w[0], w.w[1], w.w[2], w.w[3]};
}

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lk(mu_);
  seed_ = seed;
  offset_ = 0;
}

uint64_t Generator::offset() const {
  std::lock_guard<std::mutex> lk(mu_);
  return offset_;
}

void Generator::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lk(mu_);
  offset_ = offset;
}

uint64_t Generator::reserve(uint64_t counters) {
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t first = offset_;
  offset_ += counters;
  return first;
}

Generator& default_generator() {
  static Generator g;
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace dltrain
