// Output files of the train/ sinks (private): opened with their parent directories created, and
// every failure (a path under a regular file, no permission, a full disk) raised as
// dltrain::Error naming the path, the OS's reason and the fix, never a silently lost record.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "dltrain/core/error.hpp"

namespace dltrain::train {

/// Creates `dir` and its parents; `what` names the caller ("metrics CSV file").
inline void create_directories_for(const std::filesystem::path& dir, const std::string& what) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    DLTRAIN_FAIL("train: cannot create the directory '", dir.string(), "' for the ", what, ": ",
                 ec ? ec.message() : "a file of that name exists",
                 "; pass a path in a writable directory");
}

/// Owns a FILE* opened for writing (binary), with checked writes and flushes.
class OutputFile {
 public:
  OutputFile(const std::string& path, bool append, const std::string& what)
      : path_(path), what_(what) {
    create_directories_for(std::filesystem::path(path).parent_path(), what);
    f_ = std::fopen(path.c_str(), append ? "ab" : "wb");
    if (!f_)
      DLTRAIN_FAIL("train: cannot open the ", what, " '", path,
                   "' for writing: ", std::strerror(errno),
                   "; pass a path in a writable directory");
  }
  ~OutputFile() {
    if (f_) std::fclose(f_);
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t n) {
    if (n && std::fwrite(data, 1, n, f_) != n) fail("write to");
  }
  void write(const std::string& s) { write(s.data(), s.size()); }
  void flush() {
    if (std::fflush(f_) != 0) fail("flush");
  }
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(const char* verb) {
    const int e = errno;
    std::clearerr(f_);
    DLTRAIN_FAIL("train: cannot ", verb, " the ", what_, " '", path_, "': ", std::strerror(e),
                 e == ENOSPC || e == EFBIG ? "; free space on that file system or log elsewhere"
                                           : "; check the path and its file system");
  }
  std::string path_, what_;
  std::FILE* f_ = nullptr;
};

}  // namespace dltrain::train
