// Samplers: the order in which a DataLoader visits a dataset's indices.
//
// A sampler's order for an epoch is a pure function of its constructor arguments
// and the epoch set with set_epoch(), never of how many times indices() was called,
// so a resumed run (or another rank) sees exactly the same order. indices() returns
// size() indices in [0, n).
#pragma once

#include <cstdint>
#include <memory>
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

/// One rank's share of the data for data-parallel training (torch's DistributedSampler):
/// the epoch's order (a RandomSampler permutation when `shuffle`, else 0..n-1) is padded by
/// repeating its start to a multiple of world_size (or cut down to one when drop_last), and
/// rank r takes positions r, r + world_size, ... So the ranks' shares are disjoint (up to
/// the padding), equal in size, and a pure function of (seed, epoch, rank, world_size).
class DistributedSampler : public Sampler {
 public:
  /// Throws dltrain::Error when n < 0, world_size < 1, rank outside [0, world_size), or
  /// drop_last leaves a rank nothing.
  DistributedSampler(int64_t n, int64_t rank, int64_t world_size, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);
  /// This process's share: the rank and world size of the job distributed::init() joined (as
  /// torch's DistributedSampler(dataset) reads them from the default group); a world of one
  /// for a single process. Throws dltrain::Error when init() has not run.
  static std::shared_ptr<DistributedSampler> for_default_group(int64_t n, bool shuffle = true,
                                                               uint64_t seed = 0,
                                                               bool drop_last = false);
  int64_t size() const override { return per_rank_; }
  std::vector<int64_t> indices() const override;
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_; }
  /// Samples of an epoch over all ranks (the dataset's size), the range of set_start_sample.
  int64_t total_size() const { return n_; }
  /// Selects the epoch and clears set_start_sample.
  void set_epoch(int64_t epoch) override;
  /// Resumes the current epoch after its first `samples` positions (in [0, n]), which a run
  /// with any number of ranks and any per-rank batch has trained: the rest of the epoch's
  /// order (positions samples, samples + 1, ..., n - 1) is shared out as a whole epoch is
  /// (rank r takes samples + r, samples + r + world_size, ...; padded by repeating the
  /// order's start to a multiple of world_size, or cut down to one with drop_last). So the
  /// interrupted and the resumed run together see every sample of the epoch once, whatever
  /// the rank counts and batches on either side, up to the same padding or cut as an
  /// uninterrupted epoch. With samples = k * global batch and the same world size this is
  /// exactly what skipping k batches on every rank gives. Cleared by set_epoch().
  void set_start_sample(int64_t samples);
  int64_t start_sample() const { return start_; }

 private:
  void resize();
  int64_t n_, rank_, world_, per_rank_;
  bool shuffle_, drop_last_;
  uint64_t seed_;
  int64_t start_ = 0;
};

}  // namespace dltrain::data
