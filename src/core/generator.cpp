// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
#include "dltrain/core/generator.hpp"

namespace dltrain {

namespace {
inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t& hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}
}  // namespace

std::array<uint32_t, 4> philox4x32(uint64_t counter, uint64_t subsequence, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(subsequence), c3 = static_cast<uint32_t>(subsequence >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(0xD2511F53u, c0, hi0);
    const uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
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
