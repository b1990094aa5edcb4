// DataLoader epochs, synchronous or with worker threads.
//
// An Epoch owns a snapshot of the batch index lists, so set_epoch() on the loader
// during an iteration does not affect it. With workers, batch k is claimed by the
// first free worker once k < delivered + capacity (capacity = num_workers *
// prefetch_factor), built outside the lock, and parked in `ready` under its number;
// the consumer waits for exactly the batch it needs next, so delivery is in order
// whatever order the workers finish in. The destructor raises `stop`, wakes every
// worker and joins them; a worker mid-batch finishes that batch first. The epoch number
// is also snapshotted and handed to EpochDatasets with every batch.
//
// With persistent_workers the threads belong to the loader's Pool instead: begin() hands the
// new Epoch to the pool, whose threads run Epoch::work() until that epoch is fully claimed or
// stopped, then wait for the next one. The consumer's handle to the Epoch stops it (raises
// `stop`) when the last iterator copy goes, so an abandoned epoch never holds the threads;
// the Pool's destructor stops the current epoch and joins the threads.
#include "dltrain/data/dataloader.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "dltrain/autograd/node.hpp"
#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/core/parallel.hpp"

namespace dltrain::data {

namespace {
thread_local bool t_loader_worker = false;
}  // namespace

bool in_loader_worker() { return t_loader_worker; }

void for_each_sample(int64_t n, const std::function<void(int64_t, int64_t)>& body) {
  if (in_loader_worker() || n == 1) {
    body(0, n);
  } else {
    parallel_for(0, n, 1, body);
  }
}

void EpochDataset::set_epoch(int64_t epoch) {
  DLTRAIN_CHECK(epoch >= 0, "EpochDataset::set_epoch: epoch must be >= 0, got ", epoch);
  epoch_.store(epoch, std::memory_order_relaxed);
}

struct DataLoader::Epoch {
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };

  std::shared_ptr<LoaderStats> stats;  // the loader's, updated by the consumer only
  std::shared_ptr<Dataset> dataset;
  const EpochDataset* epoch_dataset;  // dataset as an EpochDataset, or null
  int64_t epoch_number;
  std::vector<std::vector<int64_t>> batches;
  int64_t next = 0;  // next batch the consumer takes

  // Worker state (unused when synchronous); everything below is guarded by mu.
  std::mutex mu;
  std::condition_variable work_cv, ready_cv;
  int64_t claimed = 0;    // batches handed to workers so far
  int64_t delivered = 0;  // batches taken by the consumer so far
  int64_t capacity = 0;
  bool pin_memory = false;
  bool async = false;  // batches come from worker threads (own or a Pool's)
  bool stop = false;
  std::map<int64_t, Slot> ready;
  std::vector<std::thread> workers;

  Epoch(std::shared_ptr<Dataset> ds, int64_t epoch, std::vector<std::vector<int64_t>> b,
        int64_t num_workers, int64_t prefetch, bool pin, bool spawn,
        std::shared_ptr<LoaderStats> st)
      : stats(std::move(st)),
        dataset(std::move(ds)),
        epoch_dataset(dynamic_cast<const EpochDataset*>(dataset.get())),
        epoch_number(epoch),
        batches(std::move(b)),
        capacity(num_workers * prefetch),
        pin_memory(pin),
        async(num_workers > 0) {
    if (!spawn || num_workers == 0 || batches.empty()) return;
    try {
      for (int64_t w = 0; w < num_workers; ++w) workers.emplace_back([this] { work(); });
    } catch (...) {
      shutdown();
      throw;
    }
  }
  ~Epoch() { shutdown(); }

  void request_stop() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    work_cv.notify_all();
    ready_cv.notify_all();
  }

  void shutdown() {
    request_stop();
    for (auto& t : workers) t.join();
    workers.clear();
  }

  Batch build(int64_t k) const {
    const auto& idx = batches[static_cast<size_t>(k)];
    Batch b = epoch_dataset ? epoch_dataset->get_batch_for_epoch(idx, epoch_number)
                            : dataset->get_batch(idx);
    if (pin_memory) {
      if (b.data.defined() && b.data.device().is_cpu()) b.data = b.data.pin_memory();
      if (b.target.defined() && b.target.device().is_cpu()) b.target = b.target.pin_memory();
      for (auto& f : b.fields)
        if (f.second.defined() && f.second.device().is_cpu()) f.second = f.second.pin_memory();
    }
    return b;
  }

  void work() {
    autograd::NoGradGuard no_grad;
    t_loader_worker = true;
    const int64_t total = static_cast<int64_t>(batches.size());
    for (;;) {
      int64_t k;
      {
        std::unique_lock<std::mutex> lk(mu);
        work_cv.wait(lk,
                     [&] { return stop || claimed >= total || claimed < delivered + capacity; });
        if (stop || claimed >= total) return;
        k = claimed++;
      }
      Slot s;
      try {
        s.batch = build(k);
      } catch (...) {
        s.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lk(mu);
        ready.emplace(k, std::move(s));
      }
      ready_cv.notify_all();
    }
  }

  // Stores batch `next` in `out` and advances, timing the wait; false past the last batch.
  bool take(Batch& out) {
    if (next >= static_cast<int64_t>(batches.size())) return false;
    const auto t0 = std::chrono::steady_clock::now();
    const bool got = take_untimed(out);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats->batches += 1;
    stats->wait_seconds += dt;
    stats->max_wait_seconds = std::max(stats->max_wait_seconds, dt);
    return got;
  }

  bool take_untimed(Batch& out) {
    const int64_t k = next++;
    if (!async) {
      out = build(k);
      return true;
    }
    Slot s;
    {
      std::unique_lock<std::mutex> lk(mu);
      // A stopped epoch still receives the batches its workers had claimed; an unclaimed one
      // never comes (persistent_workers: a newer begin() took the threads).
      ready_cv.wait(lk, [&] { return ready.count(k) != 0 || (stop && k >= claimed); });
      auto it = ready.find(k);
      DLTRAIN_CHECK(it != ready.end(),
                    "DataLoader: this epoch's iteration was superseded by a newer begin() of the "
                    "same loader (with persistent_workers the worker threads serve one epoch at "
                    "a time); finish or drop the old iterator before starting another");
      s = std::move(it->second);
      ready.erase(it);
      delivered = k + 1;
    }
    work_cv.notify_all();
    if (s.error) std::rethrow_exception(s.error);
    out = std::move(s.batch);
    return true;
  }
};

struct DataLoader::Pool {
  std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<Epoch> epoch;  // the epoch being served
  uint64_t generation = 0;       // bumped by every serve()
  bool stop = false;
  std::vector<std::thread> threads;

  explicit Pool(int64_t n) {
    try {
      for (int64_t w = 0; w < n; ++w) threads.emplace_back([this] { run(); });
    } catch (...) {
      close();
      throw;
    }
  }
  ~Pool() { close(); }

  void close() {
    std::shared_ptr<Epoch> e;
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
      e = std::move(epoch);
    }
    if (e) e->request_stop();
    cv.notify_all();
    for (auto& t : threads) t.join();
    threads.clear();
  }

  void serve(std::shared_ptr<Epoch> e) {
    std::shared_ptr<Epoch> previous;
    {
      std::lock_guard<std::mutex> lk(mu);
      previous = std::exchange(epoch, std::move(e));
      ++generation;
    }
    if (previous) previous->request_stop();
    cv.notify_all();
  }

  void run() {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Epoch> e;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || generation != seen; });
        if (stop) return;
        seen = generation;
        e = epoch;
      }
      if (e) e->work();
    }
  }
};

namespace {
void check_options(const std::shared_ptr<Dataset>& dataset, const DataLoaderOptions& o) {
  DLTRAIN_CHECK(dataset != nullptr, "DataLoader: the dataset is null");
  DLTRAIN_CHECK(dataset->size() > 0,
                "DataLoader: the dataset is empty (size 0); check that it "
                "loaded the files you expected");
  DLTRAIN_CHECK(o.batch_size > 0, "DataLoader: batch_size must be > 0, got ", o.batch_size);
  DLTRAIN_CHECK(o.num_workers >= 0,
                "DataLoader: num_workers must be >= 0 (0 = build batches in "
                "the calling thread), got ",
                o.num_workers);
  DLTRAIN_CHECK(o.prefetch_factor >= 1, "DataLoader: prefetch_factor must be >= 1, got ",
                o.prefetch_factor);
  DLTRAIN_CHECK(!o.pin_memory || cuda::is_available(),
                "DataLoader: pin_memory needs a CUDA device and none is visible",
                cuda::device_count() == 0 ? " (no GPU or driver on this machine)" : "",
                "; set pin_memory = false");
  DLTRAIN_CHECK(!o.persistent_workers || o.num_workers > 0,
                "DataLoader: persistent_workers needs num_workers > 0 (there are no worker "
                "threads to keep); set num_workers or drop persistent_workers");
}

std::shared_ptr<Sampler> default_sampler(const std::shared_ptr<Dataset>& dataset,
                                         const DataLoaderOptions& o) {
  check_options(dataset, o);
  if (o.shuffle) return std::make_shared<RandomSampler>(dataset->size(), o.seed);
  return std::make_shared<SequentialSampler>(dataset->size());
}
}  // namespace

DataLoader::DataLoader(std::shared_ptr<Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  sampler_ = default_sampler(dataset_, options_);
}

DataLoader::DataLoader(std::shared_ptr<Dataset> dataset, std::shared_ptr<Sampler> sampler,
                       DataLoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options) {
  check_options(dataset_, options_);
  DLTRAIN_CHECK(sampler_ != nullptr, "DataLoader: the sampler is null");
  DLTRAIN_CHECK(!options_.shuffle,
                "DataLoader: shuffle = true conflicts with an explicit "
                "sampler (the sampler decides the order); set shuffle = false");
}

int64_t DataLoader::size() const {
  const int64_t n = sampler_->size() - start_sample_, bs = options_.batch_size;
  return options_.drop_last ? n / bs : (n + bs - 1) / bs;
}

std::vector<std::vector<int64_t>> DataLoader::batch_indices() const {
  std::vector<int64_t> order = sampler_->indices();
  order.erase(order.begin(), order.begin() + std::min(static_cast<std::ptrdiff_t>(start_sample_),
                                                      static_cast<std::ptrdiff_t>(order.size())));
  const size_t bs = static_cast<size_t>(options_.batch_size);
  std::vector<std::vector<int64_t>> out;
  out.reserve(order.size() / bs + 1);
  for (size_t b = 0; b < order.size(); b += bs) {
    const size_t e = std::min(order.size(), b + bs);
    if (options_.drop_last && e - b < bs) break;
    out.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(b),
                     order.begin() + static_cast<std::ptrdiff_t>(e));
  }
  return out;
}

void DataLoader::set_start_batch(int64_t batch) {
  DLTRAIN_CHECK(batch >= 0 && batch <= size(), "DataLoader::set_start_batch(", batch,
                "): the epoch has ", size(), " batches; pass a value in [0, ", size(), "]");
  start_batch_ = batch;
}

void DataLoader::set_start_sample(int64_t samples) {
  start_batch_ = 0;
  if (auto* d = dynamic_cast<DistributedSampler*>(sampler_.get())) {
    d->set_start_sample(samples);
    start_sample_ = 0;
    return;
  }
  DLTRAIN_CHECK(samples >= 0 && samples <= sampler_->size(), "DataLoader::set_start_sample(",
                samples, "): the epoch has ", sampler_->size(), " samples; pass a value in [0, ",
                sampler_->size(), "]");
  start_sample_ = samples;
}

int64_t DataLoader::epoch_samples() const {
  if (auto* d = dynamic_cast<const DistributedSampler*>(sampler_.get())) return d->total_size();
  return sampler_->size();
}

int64_t DataLoader::samples_after(int64_t batches) const {
  int64_t world = 1, start = start_sample_;
  if (auto* d = dynamic_cast<const DistributedSampler*>(sampler_.get())) {
    world = d->world_size();
    start = d->start_sample();
  }
  const int64_t global_batch = options_.batch_size * world;
  return std::min(epoch_samples(), start + (start_batch_ + batches) * global_batch);
}

DataLoader::Iterator DataLoader::begin() const {
  auto batches = batch_indices();
  batches.erase(batches.begin(), batches.begin() + static_cast<std::ptrdiff_t>(start_batch_));
  *stats_ = LoaderStats{};
  const bool persistent = options_.persistent_workers && options_.num_workers > 0;
  auto epoch = std::make_shared<Epoch>(dataset_, sampler_->epoch(), std::move(batches),
                                       options_.num_workers, options_.prefetch_factor,
                                       options_.pin_memory, /*spawn=*/!persistent, stats_);
  if (!persistent) return Iterator(std::move(epoch));
  if (!pool_.pool) pool_.pool = std::make_shared<Pool>(options_.num_workers);
  pool_.pool->serve(epoch);
  // The consumer's handle: when its last copy goes, the epoch stops (the pool lets go of it
  // at the next serve()).
  Epoch* raw = epoch.get();
  return Iterator(
      std::shared_ptr<Epoch>(raw, [keep = std::move(epoch)](Epoch*) { keep->request_stop(); }));
}

DataLoader::Iterator::Iterator(std::shared_ptr<Epoch> epoch) : epoch_(std::move(epoch)) { ++*this; }

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  if (!epoch_) return *this;
  if (!epoch_->take(current_)) {
    epoch_.reset();
    current_ = Batch{};
  }
  return *this;
}

}  // namespace dltrain::data
