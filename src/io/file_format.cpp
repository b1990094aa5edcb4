// File kinds by their first bytes (see dltrain/io/file_format.hpp). Each test is a fixed
// signature, except safetensors, which has none: its first 8 bytes are a little-endian header
// length that must fit in the file, followed by '{'.
#include "dltrain/io/file_format.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "src/io/checkpoint_header.hpp"
#include "src/io/raw_file.hpp"

namespace dltrain::io {

namespace {

using detail::kCheckpointMagic;
using detail::kHdf5Signature;

bool starts(const uint8_t* head, uint64_t n, const char* sig, size_t len) {
  return n >= len && std::memcmp(head, sig, len) == 0;
}

}  // namespace

FileFormat detect_file_format(const std::string& path) {
  detail::InputFile f(path, "detect_file_format");
  uint8_t head[16] = {};
  const uint64_t n = std::min<uint64_t>(f.size(), sizeof head);
  f.read_at(0, head, n, "the first bytes");
  if (starts(head, n, kCheckpointMagic, 16)) return FileFormat::Checkpoint;
  if (starts(head, n, kHdf5Signature, 8)) return FileFormat::Hdf5;
  if (starts(head, n, "PK\x03\x04", 4)) return FileFormat::TorchZip;
  if (n >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5) return FileFormat::TorchLegacy;
  if (f.size() >= 262) {
    char ustar[5];
    f.read_at(257, ustar, 5, "the tar signature");
    if (std::memcmp(ustar, "ustar", 5) == 0) return FileFormat::TorchLegacy;
  }
  if (n >= 9 && head[8] == '{') {
    uint64_t len = 0;
    for (int k = 7; k >= 0; --k) len = (len << 8) | head[k];
    if (len >= 2 && len <= f.size() - 8) return FileFormat::Safetensors;
  }
  // HDF5 also finds its superblock after a user block of 512, 1024, ... bytes.
  for (uint64_t at = 512; at + 8 <= f.size() && at <= (uint64_t{1} << 20); at *= 2) {
    char sig[8];
    f.read_at(at, sig, 8, "the HDF5 signature");
    if (std::memcmp(sig, kHdf5Signature, 8) == 0) return FileFormat::Hdf5;
  }
  return FileFormat::Other;
}

std::string describe_file_format(FileFormat fmt, const std::string& path) {
  switch (fmt) {
    case FileFormat::Checkpoint:
      return "a dltrain checkpoint (HDF5)";
    case FileFormat::Hdf5:
      return "an HDF5 file (a dltrain checkpoint from before integrity headers, or a packed "
             "image shard)";
    case FileFormat::TorchZip:
      return "a torch.save file (ZIP)";
    case FileFormat::TorchLegacy:
      return "a torch.save file in PyTorch's legacy (pre-1.6) format";
    case FileFormat::Safetensors:
      return "a safetensors file";
    case FileFormat::Other:
      break;
  }
  if (path.empty()) return "not a weights file";
  detail::InputFile f(path, "describe_file_format");
  uint8_t head[8] = {};
  const uint64_t n = std::min<uint64_t>(f.size(), sizeof head);
  if (n == 0) return "an empty file";
  f.read_at(0, head, n, "the first bytes");
  if (starts(head, n, "\x1f\x8b", 2)) return "a gzip file";
  if (starts(head, n, "\xff\xd8\xff", 3)) return "a JPEG image";
  if (starts(head, n, "\x89PNG", 4)) return "a PNG image";
  const bool text = std::all_of(head, head + n, [](uint8_t c) {
    return c == '\n' || c == '\r' || c == '\t' || (c >= 0x20 && c < 0x7f);
  });
  if (text) return "a text file";
  char hex[3 * sizeof head + 1] = {};
  for (uint64_t i = 0; i < n; ++i)
    std::snprintf(hex + 3 * i, sizeof hex - 3 * i, i + 1 < n ? "%02x " : "%02x", head[i]);
  std::string what = "an unrecognised file (first bytes ";
  what.append(hex).append(")");
  return what;
}

}  // namespace dltrain::io
