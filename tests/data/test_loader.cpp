// Dataset, TensorDataset, samplers and DataLoader: gather equals stacking, samplers
// are permutations fixed by (seed, epoch), batches cover every index once, threaded
// loading gives the synchronous batches in order, propagates worker errors, keeps at
// most num_workers * prefetch_factor batches in flight and stops cleanly when the
// loop is left early.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "dltrain/data/dataloader.hpp"
#include "dltrain/data/dataset.hpp"
#include "dltrain/data/sampler.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;
using namespace dltrain::data;
using Catch::Contains;
using I = std::vector<int64_t>;

namespace {

// Sample i: data = [i, i + 0.5] (f32), target = i * 10 (i64). Only size/get: the default
// get_batch path. Optionally throws for one index or sleeps per sample.
class IotaDataset : public Dataset {
 public:
  explicit IotaDataset(int64_t n, int64_t bad = -1, int sleep_us = 0)
      : n_(n), bad_(bad), sleep_us_(sleep_us) {}
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    DLTRAIN_CHECK(i >= 0 && i < n_, "IotaDataset: index ", i, " out of range");
    if (i == bad_) throw Error("IotaDataset: sample " + std::to_string(i) + " is broken");
    if (sleep_us_) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    return {tensor({static_cast<double>(i), i + 0.5}), scalar_tensor(i * 10.0, DType::i64)};
  }

 private:
  int64_t n_, bad_;
  int sleep_us_;
};

// Counts get_batch calls (to observe prefetching).
class CountingDataset : public TensorDataset {
 public:
  explicit CountingDataset(int64_t n)
      : TensorDataset(arange(n, DType::i64), arange(n, DType::i64)) {}
  Batch get_batch(const std::vector<int64_t>& idx) const override {
    built++;
    return TensorDataset::get_batch(idx);
  }
  mutable std::atomic<int64_t> built{0};
};

std::shared_ptr<TensorDataset> iota_tensors(int64_t n) {
  return std::make_shared<TensorDataset>(arange(n, DType::i64), mul(arange(n, DType::i64), 10));
}

// All batches of one epoch as index lists (read back from the data, which holds i).
std::vector<I> run_epoch(const DataLoader& loader) {
  std::vector<I> out;
  for (const Batch& b : loader) {
    REQUIRE(b.target.to_vector<int64_t>().size() == static_cast<size_t>(b.size()));
    out.push_back(b.data.to_vector<int64_t>());
  }
  return out;
}

bool is_permutation_of_iota(I v) {
  std::sort(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != static_cast<int64_t>(i)) return false;
  return true;
}

}  // namespace

TEST_CASE("TensorDataset get, get_batch and errors", "[data][dataset]") {
  Generator g(1);
  const Tensor x = randn({6, 2, 3}, DType::f32, &g);
  const Tensor y = tensor({5, 4, 3, 2, 1, 0}, DType::i64);
  TensorDataset ds(x, y);
  REQUIRE(ds.size() == 6);
  const Example e = ds.get(4);
  REQUIRE(e.data.shape() == Shape{2, 3});
  REQUIRE(e.data.to_vector<float>() == x.select(0, 4).to_vector<float>());
  REQUIRE(e.target.item<int64_t>() == 1);

  const I idx{5, 0, 5, 2};  // any order, repeats allowed
  const Batch b = ds.get_batch(idx);
  REQUIRE(b.size() == 4);
  REQUIRE(b.data.shape() == Shape{4, 2, 3});
  REQUIRE(b.data.is_contiguous());
  REQUIRE(b.target.to_vector<int64_t>() == I{0, 5, 0, 3});
  // The gather agrees with the default (stacked get()) path and with index_select.
  const Batch ref = ds.Dataset::get_batch(idx);
  REQUIRE(b.data.to_vector<float>() == ref.data.to_vector<float>());
  REQUIRE(b.target.to_vector<int64_t>() == ref.target.to_vector<int64_t>());
  REQUIRE(b.data.to_vector<float>() == index_select(x, 0, from_vector(idx)).to_vector<float>());
  // The batch is a copy: writing to it leaves the dataset alone.
  Tensor written = b.data;
  written.fill_(7.0);
  REQUIRE(ds.get(5).data.to_vector<float>() == x.select(0, 5).to_vector<float>());

  REQUIRE_THROWS_WITH(ds.get(6), Contains("index 6") && Contains("6 samples"));
  REQUIRE_THROWS_WITH(ds.get(-1), Contains("index -1"));
  REQUIRE_THROWS_WITH(ds.get_batch({1, 9}), Contains("index 9") && Contains("6 samples"));
  REQUIRE_THROWS_WITH(ds.get_batch({}), Contains("empty"));
  REQUIRE_THROWS_WITH(TensorDataset(zeros({5, 2}), zeros({4})),
                      Contains("[5, 2]") && Contains("[4]"));
  REQUIRE_THROWS_WITH(TensorDataset(scalar_tensor(1.0), zeros({1})), Contains("0-d"));
}

TEST_CASE("TensorDataset keeps dtypes, handles no targets and layouts", "[data][dataset]") {
  const Tensor img = arange(24, DType::u8).reshape({2, 3, 4});
  TensorDataset ds(img.transpose(1, 2));  // non-contiguous input, no targets
  const Batch b = ds.get_batch({1});
  REQUIRE(b.data.dtype() == DType::u8);
  REQUIRE(!b.target.defined());
  REQUIRE(!ds.get(0).target.defined());
  REQUIRE(b.data.shape() == Shape{1, 4, 3});
  REQUIRE(b.data.to_vector<int>() == img.transpose(1, 2).select(0, 1).to_vector<int>());
  // A dataset whose data requires grad hands out detached tensors.
  TensorDataset g(ones({3, 2}, DType::f64).requires_grad_(), zeros({3}));
  REQUIRE(!g.get_batch({0, 2}).data.requires_grad());
}

TEST_CASE("Dataset default get_batch stacks get()", "[data][dataset]") {
  IotaDataset ds(5);
  const Batch b = ds.get_batch({3, 1});
  REQUIRE(b.data.shape() == Shape{2, 2});
  REQUIRE(b.data.to_vector<float>() == std::vector<float>{3, 3.5, 1, 1.5});
  REQUIRE(b.target.to_vector<int64_t>() == I{30, 10});
  REQUIRE_THROWS_WITH(ds.get_batch({}), Contains("empty"));
}

TEST_CASE("SequentialSampler and RandomSampler", "[data][sampler]") {
  SequentialSampler seq(5);
  REQUIRE(seq.size() == 5);
  REQUIRE(seq.indices() == I{0, 1, 2, 3, 4});
  seq.set_epoch(3);
  REQUIRE(seq.indices() == I{0, 1, 2, 3, 4});

  RandomSampler a(100, 42), b(100, 42), c(100, 43);
  const I a0 = a.indices();
  REQUIRE(a0.size() == 100);
  REQUIRE(is_permutation_of_iota(a0));
  REQUIRE(a0 != SequentialSampler(100).indices());
  REQUIRE(a.indices() == a0);  // no hidden state: same epoch, same order
  REQUIRE(b.indices() == a0);  // same seed, same order
  REQUIRE(c.indices() != a0);  // another seed, another order
  a.set_epoch(1);
  const I a1 = a.indices();
  REQUIRE(is_permutation_of_iota(a1));
  REQUIRE(a1 != a0);
  b.set_epoch(1);
  REQUIRE(b.indices() == a1);
  a.set_epoch(0);
  REQUIRE(a.indices() == a0);  // a pure function of (seed, epoch)
  // The documented derivation: randperm from Generator(seed) at offset epoch * 2^40.
  Generator gen(42);
  gen.set_offset(uint64_t{1} << 40);
  REQUIRE(randperm(100, &gen).to_vector<int64_t>() == a1);
  REQUIRE(RandomSampler(0, 1).indices().empty());
  REQUIRE_THROWS_WITH(a.set_epoch(-1), Contains("epoch"));
  REQUIRE_THROWS_WITH(RandomSampler(-1, 0), Contains("n must be >= 0"));
}

TEST_CASE("DataLoader batch count, order and last partial batch", "[data][loader]") {
  auto ds = iota_tensors(10);
  DataLoader keep(ds, {.batch_size = 3});
  REQUIRE(keep.size() == 4);
  const auto batches = run_epoch(keep);
  REQUIRE(batches == std::vector<I>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9}});
  REQUIRE(keep.batch_indices() == batches);

  DataLoader drop(ds, {.batch_size = 3, .drop_last = true});
  REQUIRE(drop.size() == 3);
  REQUIRE(run_epoch(drop) == std::vector<I>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}});

  DataLoader exact(ds, {.batch_size = 5, .drop_last = true});
  REQUIRE(exact.size() == 2);
  REQUIRE(run_epoch(exact).size() == 2);

  DataLoader too_big(ds, {.batch_size = 11, .drop_last = true});
  REQUIRE(too_big.size() == 0);
  REQUIRE(run_epoch(too_big).empty());
  REQUIRE(DataLoader(ds, {.batch_size = 11}).size() == 1);

  // Targets travel with their samples.
  for (const Batch& b : DataLoader(ds, {.batch_size = 4, .shuffle = true, .seed = 9})) {
    const auto xs = b.data.to_vector<int64_t>(), ys = b.target.to_vector<int64_t>();
    for (size_t i = 0; i < xs.size(); ++i) REQUIRE(ys[i] == xs[i] * 10);
  }
}

TEST_CASE("DataLoader shuffle covers every index once and is deterministic", "[data][loader]") {
  auto ds = iota_tensors(103);
  DataLoaderOptions o{.batch_size = 8, .shuffle = true, .seed = 1234};
  DataLoader a(ds, o), b(ds, o);
  std::vector<I> epochs;
  for (int64_t e = 0; e < 3; ++e) {
    a.set_epoch(e);
    REQUIRE(a.epoch() == e);
    const auto batches = run_epoch(a);
    REQUIRE(batches.size() == 13);
    REQUIRE(batches.back().size() == 103 % 8);
    I all;
    for (const auto& x : batches) all.insert(all.end(), x.begin(), x.end());
    REQUIRE(is_permutation_of_iota(all));
    epochs.push_back(all);
  }
  REQUIRE(epochs[0] != epochs[1]);
  REQUIRE(epochs[1] != epochs[2]);
  REQUIRE(epochs[0] != SequentialSampler(103).indices());
  b.set_epoch(1);  // another loader, same seed: epoch 1 alone reproduces
  I b1;
  for (const auto& x : run_epoch(b)) b1.insert(b1.end(), x.begin(), x.end());
  REQUIRE(b1 == epochs[1]);
  // Iterating does not advance anything: the same epoch again gives the same batches.
  a.set_epoch(2);
  I again;
  for (const auto& x : run_epoch(a)) again.insert(again.end(), x.begin(), x.end());
  REQUIRE(again == epochs[2]);
  // drop_last with shuffle: every batch full, no index twice.
  DataLoader d(ds, {.batch_size = 8, .shuffle = true, .drop_last = true, .seed = 1234});
  std::set<int64_t> seen;
  for (const auto& x : run_epoch(d)) {
    REQUIRE(x.size() == 8);
    for (int64_t i : x) REQUIRE(seen.insert(i).second);
  }
  REQUIRE(seen.size() == 96);
}

TEST_CASE("DataLoader set_start_batch resumes mid-epoch with the same order", "[data][loader]") {
  auto ds = iota_tensors(50);
  for (int64_t workers : {0, 2}) {
    DataLoader a(ds, {.batch_size = 4, .shuffle = true, .seed = 9, .num_workers = workers});
    a.set_epoch(3);
    const auto full = run_epoch(a);
    a.set_start_batch(5);
    REQUIRE(a.start_batch() == 5);
    const auto rest = run_epoch(a);
    REQUIRE(rest.size() == full.size() - 5);
    REQUIRE(std::equal(rest.begin(), rest.end(), full.begin() + 5));
    a.set_start_batch(a.size());
    REQUIRE(run_epoch(a).empty());
    a.set_epoch(4);  // a new epoch starts at its first batch again
    REQUIRE(a.start_batch() == 0);
    REQUIRE(run_epoch(a).size() == full.size());
    REQUIRE_THROWS_WITH(a.set_start_batch(a.size() + 1), Catch::Contains("set_start_batch"));
  }
}

TEST_CASE("DataLoader with an explicit sampler and the default get_batch", "[data][loader]") {
  auto ds = std::make_shared<IotaDataset>(7);
  auto sampler = std::make_shared<RandomSampler>(7, 5);
  DataLoader loader(ds, sampler, {.batch_size = 2});
  REQUIRE(loader.size() == 4);
  I seen;
  for (const Batch& b : loader) {
    REQUIRE(b.data.shape()[1] == 2);
    for (float v : b.data.select(1, 0).to_vector<float>()) seen.push_back(static_cast<int64_t>(v));
  }
  REQUIRE(seen == sampler->indices());
  REQUIRE_THROWS_WITH(DataLoader(ds, sampler, {.shuffle = true}), Contains("shuffle"));
  REQUIRE_THROWS_WITH(DataLoader(ds, nullptr, {}), Contains("sampler is null"));
}

TEST_CASE("DataLoader option errors", "[data][loader]") {
  auto ds = iota_tensors(4);
  REQUIRE_THROWS_WITH(DataLoader(ds, {.batch_size = 0}), Contains("batch_size must be > 0"));
  REQUIRE_THROWS_WITH(DataLoader(ds, {.batch_size = -3}), Contains("got -3"));
  REQUIRE_THROWS_WITH(DataLoader(iota_tensors(0), {}), Contains("empty"));
  REQUIRE_THROWS_WITH(DataLoader(nullptr, {}), Contains("null"));
  REQUIRE_THROWS_WITH(DataLoader(ds, {.num_workers = -1}), Contains("num_workers"));
  REQUIRE_THROWS_WITH(DataLoader(ds, {.num_workers = 1, .prefetch_factor = 0}),
                      Contains("prefetch_factor"));
}

TEST_CASE("Threaded DataLoader delivers the synchronous batches in order",
          "[data][loader][threads]") {
  auto tensors = iota_tensors(257);
  auto slow = std::make_shared<IotaDataset>(61, -1, 200);  // uneven worker finishing times
  for (bool shuffle : {false, true}) {
    for (int64_t bs : {1, 7, 64}) {
      DataLoader sync(tensors, {.batch_size = bs, .shuffle = shuffle, .seed = 3});
      sync.set_epoch(2);
      const auto want = run_epoch(sync);
      for (int64_t w : {1, 2, 4}) {
        DataLoader threaded(tensors, {.batch_size = bs,
                                      .shuffle = shuffle,
                                      .seed = 3,
                                      .num_workers = w,
                                      .prefetch_factor = 1 + w % 2});
        threaded.set_epoch(2);
        INFO("shuffle " << shuffle << " batch " << bs << " workers " << w);
        REQUIRE(run_epoch(threaded) == want);
      }
    }
  }
  DataLoader s(slow, {.batch_size = 3, .shuffle = true, .seed = 8});
  DataLoader t(slow, {.batch_size = 3, .shuffle = true, .seed = 8, .num_workers = 3});
  std::vector<std::vector<float>> a, b;
  for (const Batch& x : s) a.push_back(x.data.to_vector<float>());
  for (const Batch& x : t) b.push_back(x.data.to_vector<float>());
  REQUIRE(a.size() == 21);
  REQUIRE(a == b);
}

TEST_CASE("Threaded DataLoader rethrows worker errors in the consumer", "[data][loader][threads]") {
  auto ds = std::make_shared<IotaDataset>(20, /*bad=*/9);
  for (int64_t w : {0, 1, 3}) {
    DataLoader loader(ds, {.batch_size = 4, .num_workers = w});
    int64_t delivered = 0;
    auto consume = [&] {
      for (const Batch& b : loader) {
        REQUIRE(b.size() == 4);
        ++delivered;
      }
    };
    INFO("workers " << w);
    REQUIRE_THROWS_WITH(consume(), Contains("sample 9 is broken"));
    REQUIRE(delivered == 2);  // batches 0 and 1 arrive; batch 2 holds index 9
  }
}

TEST_CASE("Threaded DataLoader bounds prefetching and stops early cleanly",
          "[data][loader][threads]") {
  auto ds = std::make_shared<CountingDataset>(1000);
  DataLoader loader(ds, {.batch_size = 10, .num_workers = 2, .prefetch_factor = 2});
  {
    auto it = loader.begin();
    REQUIRE(it->data.to_vector<int64_t>().front() == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // One batch taken, at most 2 workers * 2 in flight beyond it.
    REQUIRE(ds->built.load() <= 1 + 4);
    REQUIRE(ds->built.load() >= 2);  // the workers did run ahead
  }  // iterator destroyed mid-epoch: workers are stopped and joined here
  const int64_t after = ds->built.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(ds->built.load() == after);  // nothing runs any more

  int64_t count = 0;
  for (const Batch& b : loader) {
    REQUIRE(b.data.to_vector<int64_t>().front() == count * 10);
    if (++count == 3) break;  // leave the loop early
  }
  REQUIRE(count == 3);
  // A full pass afterwards still sees all 100 batches.
  REQUIRE(run_epoch(loader).size() == 100);
}

TEST_CASE("DistributedSampler::for_default_group needs distributed::init()", "[data][sampler]") {
  // This binary never calls init(): the rank and world size are unknown, not silently 0 of 1.
  CHECK_THROWS_WITH(data::DistributedSampler::for_default_group(10),
                    Catch::Contains("call distributed::init() first"));
}

TEST_CASE("DistributedSampler splits each epoch's order across ranks like torch",
          "[data][sampler]") {
  // 10 samples over 3 ranks: padded to 12 by repeating the start; rank r takes r, r+3, ...
  DistributedSampler r0(10, 0, 3, /*shuffle=*/false), r2(10, 2, 3, false);
  REQUIRE(r0.size() == 4);
  REQUIRE(r0.indices() == std::vector<int64_t>{0, 3, 6, 9});
  REQUIRE(r2.indices() == std::vector<int64_t>{2, 5, 8, 1});
  DistributedSampler d1(10, 1, 3, false, 0, /*drop_last=*/true);
  REQUIRE(d1.indices() == std::vector<int64_t>{1, 4, 7});
  // Shuffled: the ranks together cover the epoch's permutation, and each rank's share is a
  // pure function of (seed, epoch, rank, world size).
  for (int64_t epoch : {0, 1}) {
    RandomSampler all(12, 7);
    all.set_epoch(epoch);
    const auto perm = all.indices();
    std::vector<int64_t> merged(12);
    for (int64_t rank = 0; rank < 4; ++rank) {
      DistributedSampler d(12, rank, 4, true, 7);
      d.set_epoch(epoch);
      const auto mine = d.indices();
      REQUIRE(mine.size() == 3);
      for (size_t i = 0; i < mine.size(); ++i) merged[static_cast<size_t>(rank) + 4 * i] = mine[i];
      DistributedSampler again(12, rank, 4, true, 7);
      again.set_epoch(epoch);
      REQUIRE(again.indices() == mine);
    }
    REQUIRE(merged == perm);
  }
  REQUIRE_THROWS_WITH(DistributedSampler(10, 3, 3), Catch::Contains("RANK"));
  REQUIRE_THROWS_WITH(DistributedSampler(10, 0, 0), Catch::Contains("WORLD_SIZE"));
  REQUIRE_THROWS_WITH(DistributedSampler(2, 0, 3, true, 0, true), Catch::Contains("nothing"));
  // A DataLoader over a rank's share.
  auto ds = iota_tensors(10);
  DataLoader loader(ds, std::make_shared<DistributedSampler>(10, 1, 3, false), {.batch_size = 2});
  REQUIRE(run_epoch(loader) == std::vector<I>{{1, 4}, {7, 0}});
}

TEST_CASE("set_start_sample: a run resumed with other ranks and batches sees the rest once",
          "[data][sampler]") {
  const int64_t n = 50;
  auto ds = iota_tensors(n);
  RandomSampler all(n, 3);
  all.set_epoch(1);
  const auto perm = all.indices();
  // `world` ranks with `batch` each, from `start` samples into epoch 1; `steps` steps (-1: to
  // the end). Returns how often each sample was seen.
  auto run = [&](int64_t world, int64_t batch, int64_t start, int64_t steps) {
    std::vector<int64_t> seen(n);
    for (int64_t r = 0; r < world; ++r) {
      DataLoader loader(ds, std::make_shared<DistributedSampler>(n, r, world, true, 3),
                        {.batch_size = batch});
      loader.set_epoch(1);
      loader.set_start_sample(start);
      int64_t s = 0;
      for (const auto& b : run_epoch(loader)) {
        if (steps >= 0 && s++ == steps) break;
        for (int64_t i : b) ++seen[static_cast<size_t>(i)];
      }
    }
    return seen;
  };
  // Written on 2 ranks x 4 (global 16) for 3 steps = 48 samples... of 50: resumed on 3 x 5.
  for (auto [w1, b1, steps, w2, b2] :
       {std::array<int64_t, 5>{2, 4, 3, 3, 5}, std::array<int64_t, 5>{2, 8, 2, 3, 4},
        std::array<int64_t, 5>{3, 4, 2, 2, 8}, std::array<int64_t, 5>{3, 2, 5, 1, 7}}) {
    const int64_t done = w1 * b1 * steps, left = n - done;
    auto first = run(w1, b1, 0, steps), second = run(w2, b2, done, -1);
    int64_t total = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = first[static_cast<size_t>(i)] + second[static_cast<size_t>(i)];
      REQUIRE(c >= 1);  // nothing skipped
      total += c;
    }
    // Repeated: only the padding of the rest to a multiple of w2 (the order's first samples).
    const int64_t padding = (w2 - left % w2) % w2;
    REQUIRE(total == n + padding);
    for (int64_t k = 0; k < padding; ++k)
      REQUIRE(first[static_cast<size_t>(perm[static_cast<size_t>(k)])] +
                  second[static_cast<size_t>(perm[static_cast<size_t>(k)])] ==
              2);
  }
  // Same world size, start = k global batches: exactly set_start_batch(k).
  for (int64_t r = 0; r < 2; ++r) {
    DataLoader a(ds, std::make_shared<DistributedSampler>(n, r, 2, true, 3), {.batch_size = 5});
    DataLoader b(ds, std::make_shared<DistributedSampler>(n, r, 2, true, 3), {.batch_size = 5});
    a.set_epoch(1);
    b.set_epoch(1);
    a.set_start_batch(2);
    b.set_start_sample(2 * 5 * 2);
    REQUIRE(run_epoch(a) == run_epoch(b));
    b.set_epoch(1);  // clears the start
    REQUIRE(run_epoch(b).size() == 5);
  }
  // One process, any sampler: the loader skips that many samples of its order.
  DataLoader one(ds, {.batch_size = 4, .shuffle = true, .seed = 3});
  one.set_epoch(1);
  one.set_start_sample(7);
  REQUIRE(one.size() == 11);
  I rest;
  for (const auto& b : run_epoch(one)) rest.insert(rest.end(), b.begin(), b.end());
  REQUIRE(rest == I(perm.begin() + 7, perm.end()));
  REQUIRE_THROWS_WITH(one.set_start_sample(n + 1), Contains("set_start_sample"));
  DistributedSampler d(n, 0, 2);
  REQUIRE_THROWS_WITH(d.set_start_sample(-1), Contains("already trained"));

  // samples_after: the position a checkpoint saves, in samples over all ranks.
  REQUIRE(one.epoch_samples() == n);
  REQUIRE(one.samples_after(0) == 7);
  REQUIRE(one.samples_after(2) == 7 + 2 * 4);
  REQUIRE(one.samples_after(100) == n);  // the last partial batch ends the epoch
  DataLoader r1(ds, std::make_shared<DistributedSampler>(n, 1, 3, true, 3), {.batch_size = 4});
  r1.set_epoch(1);
  REQUIRE(r1.epoch_samples() == n);
  REQUIRE(r1.samples_after(2) == 2 * 4 * 3);
  r1.set_start_sample(24);
  REQUIRE(r1.samples_after(1) == 24 + 12);
  r1.set_epoch(1);        // clears the start sample
  r1.set_start_batch(1);  // one global batch (3 ranks x 4) into the epoch
  REQUIRE(r1.samples_after(2) == 3 * 12);
}

TEST_CASE("DataLoader reports how long the consumer waited for batches", "[data][loader]") {
  auto ds = iota_tensors(40);
  for (int64_t workers : {0, 2}) {
    DataLoader loader(ds, {.batch_size = 4, .num_workers = workers});
    REQUIRE(loader.stats().batches == 0);
    run_epoch(loader);
    const LoaderStats st = loader.stats();
    REQUIRE(st.batches == 10);
    REQUIRE(st.wait_seconds >= 0.0);
    REQUIRE(st.max_wait_seconds <= st.wait_seconds);
    REQUIRE(st.mean_wait_seconds() * 10 == Approx(st.wait_seconds));
    run_epoch(loader);  // a new iteration starts a new count
    REQUIRE(loader.stats().batches == 10);
  }
}
