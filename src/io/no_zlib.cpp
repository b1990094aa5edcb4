// What dltrain takes from zlib, in a build without it (src/io/CMakeLists.txt compiles this file
// instead of zlib.cpp): the CRC-32 is the portable table version (crc32.cpp), and gzip files
// raise an error that says how to do without them.
#include "dltrain/core/error.hpp"
#include "src/io/crc32.hpp"
#include "src/io/gzip.hpp"

namespace dltrain::io::detail {

bool zlib_built_in() { return false; }

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  return crc32_update_portable(crc, data, n);
}

GzipReader::GzipReader(const std::string& path, const char* op) : path_(path), op_(op) {
  DLTRAIN_FAIL(op_, ": '", path_,
               "' is gzip-compressed; this dltrain build has no zlib, so decompress it first "
               "(gunzip -k '",
               path_,
               "') and pass the uncompressed file, or rebuild dltrain with zlib (zlib1g-dev)");
}

// Never reached (the constructor throws); gz_ stays null.
GzipReader::~GzipReader() { gz_ = nullptr; }

size_t GzipReader::read(void*, size_t) {
  DLTRAIN_FAIL(op_, ": '", path_, "': this dltrain build has no zlib to read gzip files");
}

void write_gzip_file(const std::string& path, const std::vector<std::pair<const void*, size_t>>&,
                     const char* op) {
  DLTRAIN_FAIL(op, ": cannot write gzip file '", path,
               "': this dltrain build has no zlib; write it plain (gzip = false) or rebuild "
               "dltrain with zlib (zlib1g-dev)");
}

}  // namespace dltrain::io::detail
