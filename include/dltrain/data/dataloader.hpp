// DataLoader: splits a sampler's order into batches and builds them with
// Dataset::get_batch, synchronously or on background worker threads.
//
// Iterating a DataLoader (`for (const Batch& b : loader)`) runs one epoch: the
// sampler's indices for the current epoch are cut into consecutive batches of
// batch_size (the last one smaller unless drop_last), and batch k holds exactly
// the indices k*batch_size ... of that order. With num_workers = 0 the consumer
// builds each batch when it advances; with num_workers >= 1 that many threads build
// batches ahead, at most num_workers * prefetch_factor in flight, and deliver them
// in order, so the batches are identical to the synchronous ones. An exception
// thrown while building a batch is rethrown to the consumer when it reaches that
// batch; destroying the iterator (leaving the loop early) stops and joins the
// workers. The loader itself is not modified by iteration.
//
// Datasets whose samples depend on the epoch (random augmentation) derive from
// EpochDataset: an iteration passes them the loader's epoch at begin(), so augmentation
// is a pure function of (seed, epoch, index) however many workers build the batches.
// Worker threads are marked (in_loader_worker()), so a dataset can build a batch serially
// there (the workers are the parallelism) and split it over the CPU pool otherwise.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <vector>

#include "dltrain/data/dataset.hpp"
#include "dltrain/data/sampler.hpp"

namespace dltrain::data {

/// True on a DataLoader worker thread (false in the consumer thread and the CPU pool).
bool in_loader_worker();
/// Runs body(begin, end) over the samples [0, n) of a batch being built: split over the CPU
/// pool when called from the consumer, serially on a loader worker (there the workers are
/// the parallelism, and the pool runs one job at a time, so workers would serialise on it).
void for_each_sample(int64_t n, const std::function<void(int64_t, int64_t)>& body);

/// A Dataset whose samples depend on the epoch, e.g. through random augmentation.
/// get_batch_for_epoch() must be a pure function of (indices, epoch) and thread-safe; a
/// DataLoader calls it with its own epoch (DataLoader::set_epoch), while get() and
/// get_batch() use the dataset's epoch set with set_epoch() (default 0).
class EpochDataset : public Dataset {
 public:
  /// Samples `indices` as they are in epoch `epoch`.
  virtual Batch get_batch_for_epoch(const std::vector<int64_t>& indices, int64_t epoch) const = 0;
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    return get_batch_for_epoch(indices, epoch());
  }
  /// Selects the epoch get() and get_batch() use (>= 0; throws dltrain::Error otherwise).
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> epoch_{0};
};

/// DataLoader configuration.
struct DataLoaderOptions {
  /// Samples per batch (> 0).
  int64_t batch_size = 1;
  /// Visit samples in a RandomSampler order (seeded by `seed`, reshuffled by set_epoch).
  bool shuffle = false;
  /// Drop the last batch when it has fewer than batch_size samples.
  bool drop_last = false;
  /// Seed of the shuffle order.
  uint64_t seed = 0;
  /// Background threads building batches; 0 builds them in the consuming thread.
  int64_t num_workers = 0;
  /// Batches each worker may have in flight ahead of the consumer (>= 1).
  int64_t prefetch_factor = 2;
  /// Deliver batches in page-locked host memory (from the CUDA backend's pinned pool, copied
  /// there on the worker that built the batch), so that `to(device, true)` and
  /// DevicePrefetcher copy them to the GPU asynchronously. Needs a CUDA device.
  bool pin_memory = false;
  /// Keep the worker threads alive from one epoch to the next (with whatever per-thread state
  /// the dataset keeps, such as open shard files) instead of starting num_workers threads at
  /// every begin(). Needs num_workers > 0. The threads stop when the loader is destroyed.
  bool persistent_workers = false;
};

/// How long the consumer waited for its batches during one epoch: the time spent inside the
/// iterator's increment (building the batch itself when num_workers = 0, waiting for a
/// worker otherwise). Large compared with the step time means input is the bottleneck.
struct LoaderStats {
  int64_t batches = 0;
  double wait_seconds = 0;
  double max_wait_seconds = 0;
  /// Mean wait per batch in seconds (0 before the first batch).
  double mean_wait_seconds() const {
    return batches ? wait_seconds / static_cast<double>(batches) : 0.0;
  }
};

/// Batches of a Dataset in a Sampler's order. See the file comment.
class DataLoader {
  struct Epoch;
  struct Pool;

 public:
  /// Samples in order 0..N-1, or shuffled when options.shuffle. Throws dltrain::Error
  /// when the dataset is null or empty, batch_size <= 0, num_workers < 0 or
  /// prefetch_factor < 1.
  DataLoader(std::shared_ptr<Dataset> dataset, DataLoaderOptions options = {});
  /// Samples in `sampler`'s order (e.g. a DistributedSampler). options.shuffle must be
  /// false (the sampler decides the order); the other checks are as above. (options has
  /// no default so that `DataLoader(ds, {})` stays unambiguous.)
  DataLoader(std::shared_ptr<Dataset> dataset, std::shared_ptr<Sampler> sampler,
             DataLoaderOptions options);

  /// Input iterator over one epoch's batches; end() is the past-the-end sentinel.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = const Batch*;
    using reference = const Batch&;

    Iterator() = default;
    const Batch& operator*() const { return current_; }
    const Batch* operator->() const { return &current_; }
    /// Moves to the next batch; rethrows an error raised while building it.
    Iterator& operator++();
    /// Equal when both are past the end (or are the same position of one epoch).
    bool operator==(const Iterator& o) const { return epoch_ == o.epoch_; }

   private:
    friend class DataLoader;
    explicit Iterator(std::shared_ptr<Epoch> epoch);
    std::shared_ptr<Epoch> epoch_;
    Batch current_;
  };

  /// Starts an epoch with the current sampler order and returns its first batch.
  Iterator begin() const;
  Iterator end() const { return Iterator(); }

  /// Number of batches per epoch.
  int64_t size() const;
  /// Selects the epoch (reshuffles deterministically when shuffling) and resets the start
  /// batch to 0.
  void set_epoch(int64_t epoch) {
    sampler_->set_epoch(epoch);
    start_batch_ = 0;
    start_sample_ = 0;
  }
  /// Makes iterations of the current epoch begin at batch `batch` (0 <= batch <= size()):
  /// how a run resumed from a mid-epoch checkpoint skips the batches it already trained on,
  /// seeing exactly the rest of the same order. Cleared by set_epoch().
  void set_start_batch(int64_t batch);
  int64_t start_batch() const { return start_batch_; }
  /// Makes iterations of the current epoch skip the first `samples` samples of its order,
  /// counted over all ranks: the position to resume at when the run that wrote the
  /// checkpoint had another global batch (other ranks or per-rank batch; see
  /// io::TrainingProgress::samples_in_epoch). With a DistributedSampler the sampler shares
  /// out the rest of the epoch (DistributedSampler::set_start_sample); with any other sampler
  /// (one process) the loader skips `samples` indices of its order. Batches are then cut from
  /// the rest, so no sample of the epoch is seen twice or skipped. Resets the start batch;
  /// cleared by set_epoch().
  void set_start_sample(int64_t samples);
  /// Samples of an epoch counted as set_start_sample counts them: over all ranks with a
  /// DistributedSampler (the dataset's size), else the sampler's. A resumable position is
  /// min(epoch_samples(), samples before + batches x global batch).
  int64_t epoch_samples() const;
  /// The epoch's data position, in samples over all ranks, after `batches` batches of this
  /// iteration: the start (set_start_sample / set_start_batch) plus batches x batch size x
  /// world size (a DistributedSampler's, else 1), at most epoch_samples() (a last partial
  /// batch ends the epoch). What a checkpoint saves as TrainingProgress::samples_in_epoch.
  int64_t samples_after(int64_t batches) const;
  int64_t epoch() const { return sampler_->epoch(); }
  /// The index lists of this epoch's batches, in order (what iteration will build).
  std::vector<std::vector<int64_t>> batch_indices() const;

  const std::shared_ptr<Dataset>& dataset() const { return dataset_; }
  const std::shared_ptr<Sampler>& sampler() const { return sampler_; }
  const DataLoaderOptions& options() const { return options_; }
  /// Wait statistics of the epoch being (or last) iterated; reset when an iteration begins.
  LoaderStats stats() const { return *stats_; }

 private:
  std::shared_ptr<Dataset> dataset_;
  std::shared_ptr<Sampler> sampler_;
  DataLoaderOptions options_;
  int64_t start_batch_ = 0;
  int64_t start_sample_ = 0;  // skipped by the loader (samplers other than DistributedSampler)
  std::shared_ptr<LoaderStats> stats_ = std::make_shared<LoaderStats>();
  // persistent_workers: the threads, started by the first begin(). Copies of a loader get
  // their own (a copy starts without threads).
  struct PoolHolder {
    std::shared_ptr<Pool> pool;
    PoolHolder() = default;
    PoolHolder(const PoolHolder&) {}
    PoolHolder& operator=(const PoolHolder&) { return *this; }
    PoolHolder(PoolHolder&&) = default;
    PoolHolder& operator=(PoolHolder&&) = default;
  };
  mutable PoolHolder pool_;
};

}  // namespace dltrain::data
