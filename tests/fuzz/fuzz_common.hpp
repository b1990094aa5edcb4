// Shared by the libFuzzer targets (tests/fuzz/): a per-process scratch file for the parsers
// that read from a path, and the rule every target enforces: a malformed input may only
// raise dltrain::Error. Any other exception, a crash, a sanitizer report, a leak or an
// allocation over libFuzzer's -malloc_limit_mb is a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dltrain/core/error.hpp"

namespace dltrain::fuzz {

/// A scratch path unique to this process (under $TMPDIR, default /tmp), removed at exit.
inline const std::string& scratch_path(const char* suffix) {
  static const std::string path = [&] {
    const char* dir = std::getenv("TMPDIR");
    std::string p = std::string(dir && *dir ? dir : "/tmp") + "/dltrain-fuzz-" +
                    std::to_string(::getpid()) + suffix;
    static std::string keep;
    keep = p;
    std::atexit([] { std::remove(keep.c_str()); });
    return p;
  }();
  return path;
}

/// Writes `data` to `path` (truncating it); aborts on an I/O error, which is not a finding
/// about the parser.
inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
}

/// Runs `fn`, accepting only dltrain::Error (with a non-empty message) as a rejection.
template <class F>
void expect_clean(F&& fn) {
  try {
    fn();
  } catch (const dltrain::Error& e) {
    if (!*e.what()) {
      std::fprintf(stderr, "fuzz: dltrain::Error with an empty message\n");
      std::abort();
    }
  }
}

}  // namespace dltrain::fuzz
