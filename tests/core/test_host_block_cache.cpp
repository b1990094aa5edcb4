// The pinned pool's reuse policy (src/backend/host_block_cache.hpp) with fake fences: size
// classes, reuse only once every fence has completed, smallest fit up to twice the request,
// the cap on cached bytes (ready blocks released largest first, pending ones kept), and
// empty_cache's clear. The CUDA instantiation (events as fences) is exercised by
// tests/cuda/test_cuda_runtime.cpp on a GPU. Also the CPU-only build's answers for the
// stream/pinned API.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "src/backend/host_block_cache.hpp"

using dltrain::backend::host_block_class;
using dltrain::backend::HostBlockCache;

namespace {

struct FakeFence {
  std::shared_ptr<bool> done = std::make_shared<bool>(false);
};

struct Harness {
  std::vector<void*> released;
  int recycled = 0;
  HostBlockCache<FakeFence> cache;
  explicit Harness(size_t limit)
      : cache({[](const FakeFence& f) { return *f.done; }, [this](FakeFence&) { ++recycled; },
               [this](void* p) { released.push_back(p); }},
              limit) {}
};

void* block(int k) { return reinterpret_cast<void*>(static_cast<uintptr_t>(k) * 4096); }

}  // namespace

TEST_CASE("pinned size classes cover the request and waste at most 1/8 above 32 KiB",
          "[core][pinned]") {
  CHECK(host_block_class(1) == 4096);
  CHECK(host_block_class(4096) == 4096);
  CHECK(host_block_class(4097) == 8192);
  for (size_t n = 1; n < (size_t{1} << 26); n = n * 3 / 2 + 7) {
    const size_t c = host_block_class(n);
    INFO("n = " << n << ", class = " << c);
    CHECK(c >= n);
    CHECK(c % 4096 == 0);
    if (n > 32768) CHECK(c - n < n / 8 + 1);
    CHECK(host_block_class(c) == c);  // a class is its own class
  }
}

TEST_CASE("a cached pinned block is reused only after every fence has completed",
          "[core][pinned]") {
  Harness h(size_t{1} << 30);
  CHECK(h.cache.take(8192).first == nullptr);
  FakeFence a, b;
  h.cache.give(block(1), 8192, {a, b});
  CHECK(h.cache.cached() == 8192);
  CHECK(h.cache.take(8192).first == nullptr);  // both copies pending
  *a.done = true;
  CHECK(h.cache.take(8192).first == nullptr);  // one still pending
  *b.done = true;
  const auto got = h.cache.take(8192);
  CHECK(got.first == block(1));
  CHECK(got.second == 8192);
  CHECK(h.recycled == 2);  // both fences handed back for reuse
  CHECK(h.cache.cached() == 0);
  // A block no stream used has no fence: reusable at once.
  h.cache.give(block(2), 4096, {});
  CHECK(h.cache.take(4096).first == block(2));
  CHECK(h.released.empty());
}

TEST_CASE("pinned reuse takes the smallest ready block of at most twice the request",
          "[core][pinned]") {
  Harness h(size_t{1} << 30);
  FakeFence pending;
  h.cache.give(block(1), 40960, {});
  h.cache.give(block(2), 24576, {pending});
  h.cache.give(block(3), 16384, {});
  // 12288: 16384 fits (<= 24576), the smallest ready one.
  CHECK(h.cache.take(12288).first == block(3));
  // 20480: 24576 is pending, 40960 is ready and <= 40960: taken.
  CHECK(h.cache.take(20480).first == block(1));
  // 8192: only the pending 24576 is left, and it is over twice the request anyway.
  CHECK(h.cache.take(8192).first == nullptr);
  *pending.done = true;
  CHECK(h.cache.take(8192).first == nullptr);    // 24576 > 2 x 8192: not wasted on it
  CHECK(h.cache.take(16384).first == block(2));  // the last, smaller batch of an epoch
}

TEST_CASE("the pinned cache cap releases ready blocks largest first and keeps pending ones",
          "[core][pinned]") {
  Harness h(32768);
  h.cache.give(block(1), 8192, {});
  h.cache.give(block(2), 16384, {});
  CHECK(h.cache.cached() == 24576);
  CHECK(h.released.empty());
  FakeFence pending;
  h.cache.give(block(3), 20480, {pending});  // 45056 > 32768: the largest ready goes first
  REQUIRE(h.released.size() == 1);
  CHECK(h.released[0] == block(2));
  CHECK(h.cache.cached() == 28672);
  FakeFence p2;
  h.cache.give(block(4), 12288, {p2});  // 40960: only block 1 is ready
  REQUIRE(h.released.size() == 2);
  CHECK(h.released[1] == block(1));
  CHECK(h.cache.cached() == 32768);
  // Over the cap only while fences are pending; the next trim releases what completed.
  FakeFence p3;
  h.cache.give(block(5), 4096, {p3});
  CHECK(h.cache.cached() == 36864);
  CHECK(h.released.size() == 2);
  *pending.done = true;
  h.cache.trim(h.cache.limit());
  REQUIRE(h.released.size() == 3);
  CHECK(h.released[2] == block(3));
  CHECK(h.cache.cached() == 16384);
  // Lowering the limit trims at once; 0 disables reuse for ready blocks.
  *p2.done = true;
  *p3.done = true;
  h.cache.set_limit(0);
  CHECK(h.cache.cached() == 0);
  CHECK(h.released.size() == 5);
  h.cache.give(block(6), 4096, {});
  CHECK(h.cache.cached() == 0);
  CHECK(h.released.back() == block(6));
}

TEST_CASE("empty_cache's clear waits for every fence and releases every block", "[core][pinned]") {
  Harness h(size_t{1} << 30);
  FakeFence a, b;
  h.cache.give(block(1), 4096, {a});
  h.cache.give(block(2), 8192, {b, a});
  int waited = 0;
  h.cache.clear([&](const FakeFence& f) {
    *f.done = true;
    ++waited;
  });
  CHECK(waited == 3);
  CHECK(h.recycled == 3);
  CHECK(h.released.size() == 2);
  CHECK(h.cache.cached() == 0);
  CHECK(h.cache.blocks() == 0);
}

TEST_CASE("record_stream refuses pageable memory, pinned statistics", "[core][pinned]") {
  using namespace dltrain;
  const Tensor pageable = ones({16});
  // Without CUDA: "built without CUDA"; with it: no stream reads pageable memory async.
  CHECK_THROWS_AS(cuda::record_stream(pageable, cuda::Stream()), Error);
  if (!cuda::is_available()) {
    CHECK(cuda::pinned_memory_allocated() == 0);
    CHECK(cuda::pinned_memory_cached() == 0);
    cuda::set_pinned_cache_limit(0);  // nothing to cap: accepted
    CHECK_THROWS_WITH(ones({4}).pin_memory(), Catch::Contains("CUDA"));
  } else {
    const size_t before = cuda::pinned_memory_allocated();
    {
      const Tensor p = ones({1000}).pin_memory();
      CHECK(cuda::pinned_memory_allocated() == before + host_block_class(4000));
    }
    CHECK(cuda::pinned_memory_allocated() == before);
  }
}
