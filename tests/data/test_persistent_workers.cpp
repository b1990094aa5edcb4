// DataLoader persistent_workers: the same batches as fresh workers, the same threads from
// one epoch to the next, early exits, a superseded iteration's clear error, and the option
// check.
#include <catch2/catch.hpp>

#include <mutex>
#include <set>
#include <thread>

#include "dltrain/dltrain.hpp"

using namespace dltrain;

namespace {
// Records which threads built its batches.
class ThreadRecorder : public data::Dataset {
 public:
  explicit ThreadRecorder(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  data::Example get(int64_t i) const override {
    return {full({1}, static_cast<double>(i)), full({}, static_cast<double>(i), DType::i64)};
  }
  data::Batch get_batch(const std::vector<int64_t>& idx) const override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ids_.insert(std::this_thread::get_id());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return data::Dataset::get_batch(idx);
  }
  std::set<std::thread::id> take_ids() const {
    std::lock_guard<std::mutex> lk(mu_);
    return std::exchange(ids_, {});
  }

 private:
  int64_t n_;
  mutable std::mutex mu_;
  mutable std::set<std::thread::id> ids_;
};

std::vector<std::vector<float>> epoch_values(const data::DataLoader& loader) {
  std::vector<std::vector<float>> out;
  for (const data::Batch& b : loader) out.push_back(b.data.to_vector<float>());
  return out;
}
}  // namespace

TEST_CASE("persistent workers deliver the same batches and keep their threads", "[data]") {
  auto ds = std::make_shared<ThreadRecorder>(64);
  data::DataLoaderOptions o{.batch_size = 4, .shuffle = true, .seed = 9, .num_workers = 3};
  data::DataLoader fresh(ds, o);
  o.persistent_workers = true;
  data::DataLoader persistent(ds, o);
  std::set<std::thread::id> first;
  for (int64_t e = 0; e < 3; ++e) {
    fresh.set_epoch(e);
    persistent.set_epoch(e);
    const auto want = epoch_values(fresh);
    ds->take_ids();
    REQUIRE(epoch_values(persistent) == want);
    const auto ids = ds->take_ids();
    REQUIRE_FALSE(ids.count(std::this_thread::get_id()));
    if (e == 0) {
      first = ids;
    } else {
      for (const auto& id : ids) REQUIRE(first.count(id) == 1);  // no new threads
    }
  }
}

TEST_CASE("persistent workers survive an early break and a superseded iteration", "[data]") {
  auto ds = std::make_shared<ThreadRecorder>(40);
  data::DataLoader loader(ds, {.batch_size = 2, .num_workers = 2, .persistent_workers = true});
  int64_t seen = 0;
  for (const data::Batch& b : loader) {
    (void)b;
    if (++seen == 3) break;  // leaves batches claimed or parked: the next epoch must not care
  }
  REQUIRE(epoch_values(loader).size() == 20);
  // Two live iterations of one persistent loader: the older one reports the conflict.
  auto old_it = loader.begin();
  auto new_it = loader.begin();
  REQUIRE(new_it->data.to_vector<float>() == std::vector<float>{0, 1});
  REQUIRE_THROWS_WITH(
      [&] {
        for (int k = 0; k < 20; ++k) ++old_it;
      }(),
      Catch::Contains("superseded by a newer begin()"));
}

TEST_CASE("persistent_workers needs worker threads", "[data]") {
  auto ds = std::make_shared<ThreadRecorder>(4);
  REQUIRE_THROWS_WITH(data::DataLoader(ds, {.batch_size = 2, .persistent_workers = true}),
                      Catch::Contains("persistent_workers needs num_workers > 0"));
}
