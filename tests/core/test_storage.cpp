// The CPU block cache behind Storage: freed large blocks are reused by same-class
// allocations, the cap is honoured, and empty_cache returns everything.
#include <catch2/catch.hpp>

#include "dltrain/dltrain.hpp"

using namespace dltrain;

TEST_CASE("CPU storage: large freed blocks are cached and reused", "[core]") {
  cpu_empty_cache();
  void* first = nullptr;
  {
    Storage s(3 << 20, Device::cpu());
    first = s.data();
    REQUIRE(reinterpret_cast<uintptr_t>(first) % 64 == 0);
  }
  REQUIRE(cpu_cached_bytes() >= (size_t{3} << 20));
  {
    // Same size class (3 MiB rounds to a 256 KiB multiple): the cached block comes back.
    Storage s((3 << 20) - 1000, Device::cpu());
    REQUIRE(s.data() == first);
    REQUIRE(cpu_cached_bytes() == 0);
    // Tensor data written through the block stays intact while in use.
    Tensor t = full({1000}, 2.5);
    REQUIRE(sum(t).item<double>() == 2500.0);
  }
  cpu_empty_cache();
  REQUIRE(cpu_cached_bytes() == 0);
}

TEST_CASE("CPU storage: the cache limit is honoured and 0 disables it", "[core]") {
  cpu_empty_cache();
  set_cpu_cache_limit(0);
  { Storage s(1 << 20, Device::cpu()); }
  REQUIRE(cpu_cached_bytes() == 0);
  set_cpu_cache_limit(size_t{1} << 20);
  { Storage a(1 << 20, Device::cpu()), b(1 << 20, Device::cpu()); }
  REQUIRE(cpu_cached_bytes() == (size_t{1} << 20));  // only one fits under the cap
  set_cpu_cache_limit(size_t{2} << 30);
  cpu_empty_cache();
  // Small blocks bypass the cache.
  { Storage s(1000, Device::cpu()); }
  REQUIRE(cpu_cached_bytes() == 0);
}

TEST_CASE("CPU memory statistics: bytes of live tensors and their peak, to the byte", "[core]") {
  // Counted: the bytes each Storage asked for (not the size class of the cache, not the blocks
  // the cache keeps). Nothing else allocates tensors while this test runs.
  const size_t base = memory_allocated();
  reset_peak_memory_stats();
  REQUIRE(max_memory_allocated() == base);
  {
    Tensor small = empty({1000}, DType::f32);       // 4,000 bytes: operator new path
    Tensor large = empty({3, 100000}, DType::f64);  // 2,400,000 bytes: cached-block path
    CHECK(memory_allocated() == base + 4000 + 2400000);
    Tensor view = large.narrow(1, 10, 5);     // a view allocates nothing
    Tensor none = empty({0, 7}, DType::f32);  // zero bytes
    CHECK(memory_allocated() == base + 4000 + 2400000);
    {
      Tensor tmp = empty({500}, DType::i64);  // 4,000 bytes, freed at the end of the scope
      CHECK(memory_allocated() == base + 8000 + 2400000);
    }
    CHECK(memory_allocated() == base + 4000 + 2400000);
    CHECK(max_memory_allocated() == base + 8000 + 2400000);
  }
  // Freed blocks kept by the cache are not tensor memory.
  CHECK(memory_allocated() == base);
  CHECK(max_memory_allocated() == base + 8000 + 2400000);
  reset_peak_memory_stats();
  CHECK(max_memory_allocated() == base);
  // The same block reused from the cache counts again, once.
  {
    Tensor again = empty({3, 100000}, DType::f64);
    CHECK(memory_allocated() == base + 2400000);
  }
  CHECK(max_memory_allocated() == base + 2400000);
  // Memory wrapped from elsewhere is its owner's, not counted.
  std::vector<float> outside(1000);
  {
    Storage wrapped(outside.data(), outside.size() * sizeof(float), Device::cpu(), [](void*) {});
    CHECK(memory_allocated() == base);
  }
  // A CUDA device asks the CUDA allocator: 0 without CUDA or a GPU, never the CPU's count.
  if (!cuda::is_available()) CHECK(memory_allocated(Device::cuda(0)) == 0);
}
