// The integrity header of checkpoint files; private to src/io.
//
// A checkpoint is an HDF5 file with a 512-byte user block (HDF5's name for bytes before the
// superblock, which the library skips: h5py and the HDF5 tools read the file as is). dltrain
// writes its header there once HDF5 has closed the file:
//
//   offset size  field (little-endian)
//        0   16  magic "dltrain ckpt\r\n\x1a\n" (the \r\n and \x1a catch text-mode copies)
//       16    4  header version (1)
//       20    4  CRC-32 (zlib's) of the whole file with these four bytes read as zero
//       24    8  checkpoint format version (kCheckpointFormat)
//       32    8  size of the whole file in bytes
//       40    8  offset of the HDF5 superblock (512)
//       48  464  a line of text saying the above, then zeros
//
// Invariant: a file with this header reaches the HDF5 library only after every one of its
// bytes has matched the CRC, so a corrupt checkpoint is reported before HDF5 parses damaged
// metadata (which can crash it: issue 16). Files written before the header existed start with
// the HDF5 signature itself; they load without that guarantee. Later header versions keep
// bytes 0-23 as they are.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dltrain::io::detail {

/// Bytes reserved before the HDF5 superblock (an HDF5 user block: 512 or a larger power of 2).
inline constexpr uint64_t kCheckpointHeaderBytes = 512;
/// The first 16 bytes of a checkpoint with an integrity header.
inline constexpr char kCheckpointMagic[17] = "dltrain ckpt\r\n\x1a\n";
/// The first 8 bytes of an HDF5 file without a user block.
inline constexpr char kHdf5Signature[9] = "\x89HDF\r\n\x1a\n";

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
