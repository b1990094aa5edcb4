// The one CRC-32 (src/io/crc32.hpp): known values, continuation across chunks, and the table
// version against zlib's (when built in) on every length and alignment up to a few blocks.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "src/io/crc32.hpp"

using dltrain::io::detail::crc32_update;
using dltrain::io::detail::crc32_update_portable;

TEST_CASE("crc32 gives the standard check values", "[io][crc32]") {
  // The CRC-32/ISO-HDLC catalogue's check value, and two values zlib's crc32 gives.
  const std::string digits = "123456789";
  for (auto f : {crc32_update, crc32_update_portable}) {
    CHECK(f(0, digits.data(), digits.size()) == 0xCBF43926u);
    CHECK(f(0, "", 0) == 0u);
    const std::string fox = "The quick brown fox jumps over the lazy dog";
    CHECK(f(0, fox.data(), fox.size()) == 0x414FA339u);
  }
}

TEST_CASE("crc32 continues across chunks and the two versions agree", "[io][crc32]") {
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(300);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t off = 0; off < 8; ++off) {      // every alignment of the 8-byte steps
    for (size_t n = 0; n + off <= 64; ++n) {  // lengths around the step size
      const uint32_t want = crc32_update(0, buf.data() + off, n);
      REQUIRE(crc32_update_portable(0, buf.data() + off, n) == want);
    }
  }
  const uint32_t whole = crc32_update(0, buf.data(), buf.size());
  for (size_t cut = 0; cut <= buf.size(); cut += 37) {
    const uint32_t a = crc32_update(0, buf.data(), cut);
    CHECK(crc32_update(a, buf.data() + cut, buf.size() - cut) == whole);
    const uint32_t p = crc32_update_portable(0, buf.data(), cut);
    CHECK(crc32_update_portable(p, buf.data() + cut, buf.size() - cut) == whole);
  }
}
