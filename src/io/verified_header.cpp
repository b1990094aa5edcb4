// The verified header (layout and invariant in verified_header.hpp): stamped after HDF5 has
// closed the temporary file, verified before HDF5 opens a file; and the raw superblock look
// packed shards use. Plain POSIX I/O and the CRC-32 of crc32.hpp (zlib's: about 3 GB/s here,
// ~70 ms for a 200 MB ResNet-50 checkpoint with its optimizer state, read from the page cache).
#include "src/io/verified_header.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "dltrain/core/error.hpp"
#include "dltrain/io/file_format.hpp"
#include "dltrain/version.hpp"
#include "src/io/raw_file.hpp"

namespace dltrain::io::detail {

namespace {

constexpr uint32_t kHeaderVersion = 1;
constexpr size_t kCrcOffset = 20;
constexpr size_t kChunk = size_t{1} << 20;

void put_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// The CRC of `header` (its CRC field read as zero) followed by bytes [header size, size) of
// the file open as `fd`.
uint32_t file_crc(const uint8_t* header, int fd, uint64_t size, const std::string& path,
                  const char* op) {
  std::vector<uint8_t> zeroed(header, header + kVerifiedHeaderBytes);
  std::memset(zeroed.data() + kCrcOffset, 0, 4);
  uint32_t crc = crc32_update(0, zeroed.data(), zeroed.size());
  std::vector<uint8_t> buf(kChunk);
  for (uint64_t off = kVerifiedHeaderBytes; off < size;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, size - off));
    const ssize_t got = ::pread(fd, buf.data(), want, static_cast<off_t>(off));
    if (got < 0 && errno == EINTR) continue;
    DLTRAIN_CHECK(got > 0, op, "('", path, "'): reading the file to check its CRC failed: ",
                  got < 0 ? std::strerror(errno) : "unexpected end of file",
                  "; check the file and the storage it lives on");
    crc = crc32_update(crc, buf.data(), static_cast<size_t>(got));
    off += static_cast<uint64_t>(got);
  }
  return crc;
}

}  // namespace

void stamp_verified_header(const std::string& path, const HeaderKind& kind,
                           int64_t format_version) {
  const char* op = kind.write_op;
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  DLTRAIN_CHECK(fd >= 0, op, "('", path, "'): cannot reopen the temporary file to stamp its ",
                "header: ", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  DLTRAIN_CHECK(::fstat(fd, &st) == 0, op, "('", path,
                "'): cannot stat the temporary file: ", std::strerror(errno));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  DLTRAIN_CHECK(size > kVerifiedHeaderBytes, op, "('", path, "'): the temporary file has only ",
                size, " bytes; HDF5 did not write it completely (disk full?)");
  uint8_t header[kVerifiedHeaderBytes] = {};
  std::memcpy(header, kind.magic, 16);
  put_le(header + 16, kHeaderVersion, 4);
  put_le(header + 24, static_cast<uint64_t>(format_version), 8);
  put_le(header + 32, size, 8);
  put_le(header + 40, kVerifiedHeaderBytes, 8);
  const std::string note = "dltrain " + std::string(kVersion) + " " + kind.noun +
                           ": an HDF5 file follows at byte 512 (h5py reads it as is); bytes "
                           "20-23 hold the CRC-32 of the whole file read with those four bytes "
                           "as zero.\n";
  std::memcpy(header + 48, note.data(), std::min<size_t>(note.size(), kVerifiedHeaderBytes - 48));
  put_le(header + kCrcOffset, file_crc(header, fd, size, path, op), 4);
  size_t done = 0;
  while (done < sizeof header) {
    const ssize_t put = ::pwrite(fd, header + done, sizeof header - done, static_cast<off_t>(done));
    if (put < 0 && errno == EINTR) continue;
    DLTRAIN_CHECK(put > 0, op, "('", path,
                  "'): writing the header failed: ", put < 0 ? std::strerror(errno) : "no progress",
                  "; check free space and quotas on that file system");
    done += static_cast<size_t>(put);
  }
  DLTRAIN_CHECK(::fsync(fd) == 0, op, "('", path,
                "'): flushing the file to disk failed: ", std::strerror(errno),
                "; check free space and quotas on that file system");
}

std::optional<int64_t> verify_header(const std::string& path, const HeaderKind& kind) {
  const char* op = kind.read_op;
  InputFile f(path, op);
  const uint64_t size = f.size();
  uint8_t header[kVerifiedHeaderBytes] = {};
  const uint64_t head = std::min<uint64_t>(size, kVerifiedHeaderBytes);
  f.read_at(0, header, head, "the header");
  if (size >= 8 && std::memcmp(header, kHdf5Signature, 8) == 0) return std::nullopt;
  if (head < 16 || std::memcmp(header, kind.magic, 16) != 0) {
    const FileFormat format = detect_file_format(path);
    if (kind.weights_hint) {
      DLTRAIN_CHECK(format != FileFormat::Safetensors, op, "('", path, "'): not a dltrain ",
                    kind.noun,
                    ": this is a safetensors file; load it with io::load_safetensors (or "
                    "convert it with dltrain-convert)");
      DLTRAIN_CHECK(format != FileFormat::TorchZip && format != FileFormat::TorchLegacy, op, "('",
                    path, "'): not a dltrain ", kind.noun, ": this is ",
                    describe_file_format(format),
                    "; load it with io::load_pth (or convert it with dltrain-convert)");
    }
    DLTRAIN_FAIL(op, "('", path, "'): not a dltrain ", kind.noun, ": this is ",
                 describe_file_format(format, path), " that starts with neither a ", kind.noun,
                 " header nor the HDF5 signature (another kind of file, or its first bytes are "
                 "corrupt); ",
                 kind.fix);
  }
  const uint64_t recorded_size = get_le(header + 32, 8);
  DLTRAIN_CHECK(size >= kVerifiedHeaderBytes, op, "('", path, "'): the file is truncated: it has ",
                size, " bytes, not even its ", kVerifiedHeaderBytes,
                "-byte header (interrupted copy?); ", kind.fix);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DLTRAIN_CHECK(fd >= 0, op, "('", path, "'): cannot open: ", std::strerror(errno));
  uint32_t crc = 0;
  try {
    crc = file_crc(header, fd, size, path, op);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  const uint32_t recorded_crc = static_cast<uint32_t>(get_le(header + kCrcOffset, 4));
  if (crc != recorded_crc) {
    DLTRAIN_CHECK(size == recorded_size, op, "('", path, "'): the file is ",
                  size < recorded_size ? "truncated" : "longer than written", ": it has ", size,
                  " bytes but its header says ", recorded_size,
                  " (an interrupted copy or download, or a damaged header); ", kind.fix);
    DLTRAIN_FAIL(op, "('", path, "'): the file is corrupt: its CRC-32 is ", crc, " but was ",
                 recorded_crc,
                 " when written (bytes changed on disk, in a copy, or by an edit after dltrain "
                 "wrote it); ",
                 kind.fix);
  }
  const uint64_t version = get_le(header + 16, 4);
  DLTRAIN_CHECK(version <= kHeaderVersion, op, "('", path, "'): its header is version ", version,
                " but this dltrain (", kVersion, ") reads up to version ", kHeaderVersion,
                "; upgrade dltrain");
  DLTRAIN_CHECK(size == recorded_size && get_le(header + 40, 8) == kVerifiedHeaderBytes, op, "('",
                path, "'): its header is inconsistent (size ", recorded_size, ", HDF5 offset ",
                get_le(header + 40, 8), "); the file is corrupt; ", kind.fix);
  return static_cast<int64_t>(get_le(header + 24, 8));
}

std::optional<Hdf5Superblock> find_hdf5_superblock(const std::string& path, const char* op) {
  InputFile f(path, op);
  const uint64_t size = f.size();
  // HDF5's own search (H5FD_locate_signature): offset 0, then every power of 2 from 512.
  for (uint64_t at = 0; at + 8 <= size; at = at == 0 ? 512 : at * 2) {
    uint8_t sb[48] = {};
    const uint64_t n = std::min<uint64_t>(sizeof sb, size - at);
    f.read_at(at, sb, n, "the HDF5 superblock");
    if (std::memcmp(sb, kHdf5Signature, 8) != 0) continue;
    Hdf5Superblock s;
    s.offset = at;
    s.version = n > 8 ? sb[8] : -1;
    // Versions 2 and 3: signature, version, size of offsets (O) and of lengths, flags, then
    // base address, extension address, end-of-file address and root address, O bytes each.
    // HDF5 compares the end-of-file address with the file's whole size (H5F__super_read:
    // user block included), so it is read as absolute here too.
    if ((s.version == 2 || s.version == 3) && n >= 12) {
      const unsigned o = sb[9];
      if (o >= 1 && o <= 8 && 12 + 3 * static_cast<uint64_t>(o) <= n)
        s.end = get_le(sb + 12 + 2 * o, static_cast<int>(o));
    }
    return s;
  }
  return std::nullopt;
}

}  // namespace dltrain::io::detail
