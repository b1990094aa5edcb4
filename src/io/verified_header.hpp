// The integrity header dltrain puts before the HDF5 files it must never let HDF5 parse
// unchecked (checkpoints, packed dataset indexes), and a raw look at an HDF5 superblock;
// private to the library.
//
// Such a file is an HDF5 file with a 512-byte user block (HDF5's name for bytes before the
// superblock, which the library skips: h5py and the HDF5 tools read the file as is). dltrain
// writes its header there once HDF5 has closed the file:
//
//   offset size  field (little-endian)
//        0   16  magic, one per kind of file ("dltrain ckpt\r\n\x1a\n", "dltrain pack\r\n\x1a\n";
//                the \r\n and \x1a catch text-mode copies)
//       16    4  header version (1)
//       20    4  CRC-32 (zlib's) of the whole file with these four bytes read as zero
//       24    8  the kind's format version (kCheckpointFormat, kPackedFormatVersion)
//       32    8  size of the whole file in bytes
//       40    8  offset of the HDF5 superblock (512)
//       48  464  a line of text saying the above, then zeros
//
// Invariant: a file with this header reaches the HDF5 library only after every one of its
// bytes has matched the CRC, so a corrupt file is reported before HDF5 parses damaged
// metadata (which can crash HDF5 1.10: issue 16). Later header versions keep bytes 0-23 as
// they are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "src/io/crc32.hpp"

namespace dltrain::io::detail {

/// Bytes reserved before the HDF5 superblock (an HDF5 user block: 512 or a larger power of 2).
inline constexpr uint64_t kVerifiedHeaderBytes = 512;
/// The first 8 bytes of an HDF5 superblock (at 0 in a file without a user block).
inline constexpr char kHdf5Signature[9] = "\x89HDF\r\n\x1a\n";

/// What differs between the kinds of verified files: the words of their errors.
struct HeaderKind {
  /// The 16-byte magic at offset 0.
  const char* magic;
  /// "checkpoint", "packed dataset index": the file named in messages.
  const char* noun;
  /// The operations named in errors when writing and reading ("write_checkpoint").
  const char* write_op;
  const char* read_op;
  /// How to get a good file, appended to truncation and CRC errors ("repack with ...").
  std::string fix;
  /// Say "load it with io::load_safetensors / io::load_pth" when the file is one of those.
  bool weights_hint = false;
};

/// Writes the header into the first kVerifiedHeaderBytes of `path` (an HDF5 file created with
/// a user block of that size, closed), with the CRC of the whole file, and flushes the file
/// to disk. Throws dltrain::Error naming `path` and the OS error (e.g. a full disk).
void stamp_verified_header(const std::string& path, const HeaderKind& kind, int64_t format_version);

/// Checks `path` before HDF5 opens it. Returns the format version recorded in a verified
/// header, or nullopt for an HDF5 file without one (written before headers existed).
/// Throws dltrain::Error naming the path and kind.fix when the file is missing, shorter or
/// longer than its header says, fails the CRC, has a header of a newer version, or is
/// neither.
std::optional<int64_t> verify_header(const std::string& path, const HeaderKind& kind);

/// Where and which HDF5 superblock a file has, read without HDF5.
struct Hdf5Superblock {
  /// Offset of the signature (0, 512, 1024, ...).
  uint64_t offset = 0;
  /// The superblock version byte (0 and 1 are unchecksummed; 2 and 3 carry a checksum).
  int version = 0;
  /// For versions 2 and 3: the size of the whole file HDF5 recorded (its end-of-file
  /// address, which HDF5 compares with the file's size, user block included); 0 otherwise.
  uint64_t end = 0;
};

/// The first HDF5 superblock of `path` (HDF5's own search: offset 0, then 512, 1024, ...),
/// or nullopt when there is none. Throws dltrain::Error (naming `op`) when the file cannot
/// be opened or read.
std::optional<Hdf5Superblock> find_hdf5_superblock(const std::string& path, const char* op);

}  // namespace dltrain::io::detail
