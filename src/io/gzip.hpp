// gzip files over zlib's gz* API (internal header): the IDX reader and writer
// (src/data/idx.cpp) use it. zlib.cpp implements it when dltrain is built with zlib; a build
// without zlib compiles no_zlib.cpp instead (src/io/CMakeLists.txt), whose functions raise an
// error that says how to do without (gunzip the file first, or write it plain).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace dltrain::io::detail {

/// True when this build has zlib (gzip files; zlib's CRC-32, crc32.hpp).
bool zlib_built_in();

/// A gzip file read sequentially.
class GzipReader {
 public:
  /// Opens the gzip file `path`; `op` names the caller in errors (the reader keeps the pointer:
  /// pass a string literal).
  GzipReader(const std::string& path, const char* op);
  ~GzipReader();
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  /// Reads up to n bytes into dst; returns fewer only at the end of the data. Raises on a
  /// corrupt or truncated stream.
  size_t read(void* dst, size_t n);

 private:
  void* gz_ = nullptr;  // gzFile
  std::string path_;
  const char* op_;
};

/// Writes the concatenation of `parts` (pointer, byte count) as the gzip file `path`. Raises
/// naming `op` when the file cannot be created or written.
void write_gzip_file(const std::string& path,
                     const std::vector<std::pair<const void*, size_t>>& parts, const char* op);

}  // namespace dltrain::io::detail
