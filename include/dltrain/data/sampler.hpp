// Samplers: the order in which a DataLoader visits a dataset's indices.
//
// A sampler's order for an epoch is a pure function of its constructor arguments
// and the epoch set with set_epoch(), never of how many times indices() was called,
// so a resumed run (or another rank) sees exactly the same order. indices() returns
// size() indices in [0, n).
#pragma once

#include <cstdint>
#include <vector>

namespace dltrain::data {

/// Base of all samplers.
class Sampler {
 public:
  virtual ~Sampler() = default;
  /// Number of indices one epoch yields.
  virtual int64_t size() const = 0;
  /// The indices of the current epoch, in visiting order.
  virtual std::vector<int64_t> indices() const = 0;
  /// Selects the epoch whose order indices() returns (default 0; >= 0).
  virtual void set_epoch(int64_t epoch);
  /// The current epoch.
  int64_t epoch() const { return epoch_; }

 protected:
  int64_t epoch_ = 0;
};

/// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  /// Throws dltrain::Error when n < 0.
  explicit SequentialSampler(int64_t n);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices() const override;

 private:
  int64_t n_;
};

/// A random permutation of 0..n-1 per epoch: epoch e's order is randperm(n) drawn from
/// a Generator seeded with `seed` whose offset is e * 2^40 counters, so epochs use
/// disjoint Philox streams and the order depends only on (seed, epoch).
class RandomSampler : public Sampler {
 public:
  /// Throws dltrain::Error when n < 0.
  RandomSampler(int64_t n, uint64_t seed);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices() const override;
  uint64_t seed() const { return seed_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

}  // namespace dltrain::data
