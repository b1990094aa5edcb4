// CRC-32 (IEEE 802.3, the polynomial of zlib, ZIP and PNG): the one implementation that the
// checkpoint and packed-dataset headers (verified_header.cpp), packed shards (packed_*.cpp) and
// the .pth ZIP reader (pth.cpp) use (internal header).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dltrain::io::detail {

/// The CRC-32 of `n` bytes continuing `crc` (0 to start): crc32_update(crc32_update(0, a), b)
/// is the CRC of a followed by b. zlib's crc32 when dltrain was built with zlib, otherwise a
/// slicing-by-8 table version; the two give the same values.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);

/// The table version alone, whatever the build (for the test that compares it with zlib's).
uint32_t crc32_update_portable(uint32_t crc, const void* data, size_t n);

}  // namespace dltrain::io::detail
