// Positioned binary reads and atomic binary writes for the weight-interchange formats
// (safetensors, .pth); private to src/io.
//
// InputFile reads exact byte ranges: a read that would pass the end of the file raises
// dltrain::Error naming the file, the range and what was being read, so parsers never
// see short data. AtomicOutputFile writes `path + ".tmp"` and only commit() makes it
// visible under `path` (fsync, then rename); if it is destroyed uncommitted (an
// exception while writing) the temporary file is removed and `path` is untouched.
// Both assume a POSIX system.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dltrain::io::detail {

/// Throws dltrain::Error naming `op` unless the host is little-endian (the byte order of
/// safetensors and of torch.save's storages, copied without swapping).
void require_little_endian_host(const char* op);

/// A file opened for positioned reads.
class InputFile {
 public:
  /// Opens `path`; throws naming `op` and the path when it is missing, a directory or
  /// unreadable.
  InputFile(const std::string& path, const char* op);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// Reads exactly `n` bytes at `offset` into `dst`; throws (naming `what`) when the file
  /// is shorter than offset + n or the read fails.
  void read_at(uint64_t offset, void* dst, uint64_t n, const std::string& what) const;

 private:
  std::string path_;
  const char* op_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// A file written to `path + ".tmp"` and renamed over `path` by commit().
class AtomicOutputFile {
 public:
  AtomicOutputFile(const std::string& path, const char* op);
  ~AtomicOutputFile();
  AtomicOutputFile(const AtomicOutputFile&) = delete;
  AtomicOutputFile& operator=(const AtomicOutputFile&) = delete;

  /// Appends `n` bytes; throws naming the file and the OS error on failure (disk full).
  void write(const void* data, uint64_t n);
  /// Flushes to disk, closes and renames the temporary file to `path`.
  void commit();

 private:
  std::string path_, tmp_;
  const char* op_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace dltrain::io::detail
