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
