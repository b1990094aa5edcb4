// POSIX implementation of InputFile (pread) and AtomicOutputFile (write, fsync, rename).
#include "src/io/raw_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "dltrain/core/error.hpp"

namespace dltrain::io::detail {

namespace {
// One syscall moves at most this much (Linux caps a single read/write near 2 GiB).
constexpr uint64_t kChunk = uint64_t{1} << 30;
}  // namespace

void require_little_endian_host(const char* op) {
  DLTRAIN_CHECK(std::endian::native == std::endian::little, op,
                ": this host is big-endian, but safetensors and torch.save store little-endian "
                "data and dltrain does not byte-swap them; convert the weights on a little-endian "
                "machine");
}

InputFile::InputFile(const std::string& path, const char* op) : path_(path), op_(op) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    DLTRAIN_CHECK(err != ENOENT, op_, ": file '", path_, "' does not exist; check the path");
    DLTRAIN_FAIL(op_, ": cannot open '", path_, "': ", std::strerror(err),
                 "; check the path and its permissions");
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    ::close(fd_);
    fd_ = -1;
    DLTRAIN_FAIL(op_, ": '", path_, "' is ", dir ? "a directory" : "not a regular file",
                 "; pass the path of a weights file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(uint64_t offset, void* dst, uint64_t n, const std::string& what) const {
  DLTRAIN_CHECK(offset <= size_ && n <= size_ - offset, op_, ": '", path_, "' is truncated: ", what,
                " needs bytes [", offset, ", ", offset + n, ") but the file has only ", size_,
                " bytes; the file is incomplete (interrupted copy or download?), get a "
                "complete copy");
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got =
        ::pread(fd_, p, static_cast<size_t>(std::min(n, kChunk)), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    DLTRAIN_CHECK(got > 0, op_, ": reading ", what, " from '", path_,
                  "' failed: ", got < 0 ? std::strerror(errno) : "unexpected end of file",
                  "; check the file and the storage it lives on");
    p += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

AtomicOutputFile::AtomicOutputFile(const std::string& path, const char* op)
    : path_(path), tmp_(path + ".tmp"), op_(op) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DLTRAIN_CHECK(fd_ >= 0, op_, ": cannot create '", tmp_, "' (written first, then renamed to '",
                path_, "'): ", std::strerror(errno),
                "; check that the directory exists and is writable");
}

AtomicOutputFile::~AtomicOutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicOutputFile::write(const void* data, uint64_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd_, p, static_cast<size_t>(std::min(n, kChunk)));
    if (put < 0 && errno == EINTR) continue;
    DLTRAIN_CHECK(put > 0, op_, ": writing '", tmp_,
                  "' failed: ", put < 0 ? std::strerror(errno) : "no progress",
                  "; check free space and quotas on that file system ('", path_,
                  "' was not changed)");
    p += put;
    n -= static_cast<uint64_t>(put);
  }
}

void AtomicOutputFile::commit() {
  DLTRAIN_CHECK(::fsync(fd_) == 0, op_, ": flushing '", tmp_,
                "' to disk failed: ", std::strerror(errno), "; check the file system ('", path_,
                "' was not changed)");
  const int rc = ::close(fd_);
  fd_ = -1;
  DLTRAIN_CHECK(rc == 0, op_, ": closing '", tmp_, "' failed: ", std::strerror(errno),
                "; check free space ('", path_, "' was not changed)");
  DLTRAIN_CHECK(std::rename(tmp_.c_str(), path_.c_str()) == 0, op_, ": renaming '", tmp_, "' to '",
                path_, "' failed: ", std::strerror(errno), "; check that '", path_,
                "' is not a directory and the directory is writable");
  committed_ = true;
}

}  // namespace dltrain::io::detail
