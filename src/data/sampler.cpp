// Sequential and random samplers. RandomSampler derives each epoch's order from a
// fresh Generator(seed) moved to offset epoch * 2^40, so no state carries over
// between epochs and any epoch can be recomputed on its own.
#include "dltrain/data/sampler.hpp"

#include <numeric>

#include "dltrain/core/error.hpp"
#include "dltrain/core/generator.hpp"
#include "dltrain/core/tensor.hpp"
#include "dltrain/distributed/process_group.hpp"

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

DistributedSampler::DistributedSampler(int64_t n, int64_t rank, int64_t world_size, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : n_(n),
      rank_(rank),
      world_(world_size),
      per_rank_(0),
      shuffle_(shuffle),
      drop_last_(drop_last),
      seed_(seed) {
  DLTRAIN_CHECK(n >= 0, "DistributedSampler: n must be >= 0, got ", n);
  DLTRAIN_CHECK(world_size >= 1, "DistributedSampler: world_size must be >= 1, got ", world_size,
                "; check the WORLD_SIZE / SLURM_NTASKS of the job");
  DLTRAIN_CHECK(rank >= 0 && rank < world_size, "DistributedSampler: rank ", rank,
                " is outside [0, ", world_size, "); check the RANK / SLURM_PROCID of the job");
  per_rank_ = drop_last ? n / world_size : (n + world_size - 1) / world_size;
  DLTRAIN_CHECK(per_rank_ > 0 || n == 0, "DistributedSampler: drop_last with ", n, " samples over ",
                world_size, " ranks leaves each rank nothing");
}

std::shared_ptr<DistributedSampler> DistributedSampler::for_default_group(int64_t n, bool shuffle,
                                                                          uint64_t seed,
                                                                          bool drop_last) {
  DLTRAIN_CHECK(distributed::is_initialized(),
                "DistributedSampler::for_default_group: no process group; call "
                "distributed::init() first (a single process needs no launcher)");
  return std::make_shared<DistributedSampler>(n, distributed::rank(), distributed::world_size(),
                                              shuffle, seed, drop_last);
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (shuffle_) {
    RandomSampler r(n_, seed_);
    r.set_epoch(epoch_);
    order = r.indices();
  } else {
    order.resize(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) order[static_cast<size_t>(i)] = i;
  }
  // Positions [start_, start_ + total) of the order, the ones past n_ repeating its start.
  const int64_t total = per_rank_ * world_;
  for (int64_t i = n_; i < start_ + total; ++i)
    order.push_back(order[static_cast<size_t>((i - n_) % n_)]);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank_));
  for (int64_t i = start_ + rank_; i < start_ + total; i += world_)
    mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

void DistributedSampler::resize() {
  const int64_t left = n_ - start_;
  per_rank_ = drop_last_ ? left / world_ : (left + world_ - 1) / world_;
}

void DistributedSampler::set_epoch(int64_t epoch) {
  Sampler::set_epoch(epoch);
  start_ = 0;
  resize();
}

void DistributedSampler::set_start_sample(int64_t samples) {
  DLTRAIN_CHECK(samples >= 0 && samples <= n_, "DistributedSampler::set_start_sample(", samples,
                "): the epoch has ", n_, " samples; pass the number already trained, in [0, ", n_,
                "]");
  start_ = samples;
  resize();
}

}  // namespace dltrain::data
