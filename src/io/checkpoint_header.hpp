// The integrity header of checkpoint files; private to src/io.
//
// A checkpoint carries the verified header of src/io/verified_header.hpp (a 512-byte HDF5 user
// block holding a magic, the checkpoint format, the file size and the CRC-32 of the whole file)
// with the magic "dltrain ckpt\r\n\x1a\n". Files written before the header existed start with
// the HDF5 signature itself; io::read_checkpoint refuses them, and dltrain-convert restamp
// reads them with read_unverified_checkpoint in a child process it can lose.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dltrain/io/checkpoint.hpp"
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

/// io::read_checkpoint without its refusal of files that have no integrity header: such a
/// file goes to HDF5 unverified (every size read from it is still checked against the file's
/// size before anything is allocated), and HDF5 1.10 can crash on its damaged metadata. Only
/// for a process whose crash loses nothing: dltrain-convert restamp runs it in a child
/// process started with posix_spawn and reports the child's death as an error. Files with
/// the header are checked and read as read_checkpoint does.
Checkpoint read_unverified_checkpoint(const std::string& path);

}  // namespace dltrain::io::detail
