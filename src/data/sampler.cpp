// Sequential and random samplers. RandomSampler derives each epoch's order from a
// fresh Generator(seed) moved to offset epoch * 2^40, so no state carries over
// between epochs and any epoch can be recomputed on its own.
#include "dltrain/data/sampler.hpp"

#include <numeric>

#include "dltrain/core/error.hpp"
#include "dltrain/core/generator.hpp"
#include "dltrain/core/tensor.hpp"

namespace dltrain::data {

void Sampler::set_epoch(int64_t epoch) {
  DLTRAIN_CHECK(epoch >= 0, "Sampler::set_epoch: epoch must be >= 0, got ", epoch);
  epoch_ = epoch;
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  DLTRAIN_CHECK(n >= 0, "SequentialSampler: n must be >= 0, got ", n);
}

std::vector<int64_t> SequentialSampler::indices() const {
  std::vector<int64_t> v(static_cast<size_t>(n_));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  DLTRAIN_CHECK(n >= 0, "RandomSampler: n must be >= 0, got ", n);
}

std::vector<int64_t> RandomSampler::indices() const {
  // randperm(n) uses (n + 1) / 2 counters, far below the 2^40 each epoch owns.
  constexpr uint64_t kEpochStride = uint64_t{1} << 40;
  Generator gen(seed_);
  gen.set_offset(static_cast<uint64_t>(epoch_) * kEpochStride);
  return randperm(n_, &gen).to_vector<int64_t>();
}

}  // namespace dltrain::data
