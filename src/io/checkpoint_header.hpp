// The integrity header of checkpoint files; private to src/io.
//
// A checkpoint carries the verified header of src/io/verified_header.hpp (a 512-byte HDF5 user
// block holding a magic, the checkpoint format, the file size and the CRC-32 of the whole file)
// with the magic "dltrain ckpt\r\n\x1a\n". Files written before the header existed start with
// the HDF5 signature itself; they load without the CRC's guarantee.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "src/io/verified_header.hpp"

namespace dltrain::io::detail {

/// Bytes reserved before the HDF5 superblock (an HDF5 user block: 512 or a larger power of 2).
inline constexpr uint64_t kCheckpointHeaderBytes = kVerifiedHeaderBytes;
/// The first 16 bytes of a checkpoint with an integrity header.
inline constexpr char kCheckpointMagic[17] = "dltrain ckpt\r\n\x1a\n";

/// Writes the header into the first kCheckpointHeaderBytes of `path` (an HDF5 file created
/// with a user block of that size, closed), with the CRC of the whole file, and flushes the
/// file to disk. Throws dltrain::Error naming `path` and the OS error (e.g. a full disk).
void stamp_checkpoint_header(const std::string& path, int64_t format_version);

/// Checks `path` before HDF5 opens it. Returns the format version recorded in a verified
/// header, or nullopt for an HDF5 file without one (written before headers existed).
/// Throws dltrain::Error naming the path when the file is missing, shorter or longer than its
/// header says, fails the CRC, has a header of a newer version, or is neither.
std::optional<int64_t> verify_checkpoint_header(const std::string& path);

}  // namespace dltrain::io::detail
