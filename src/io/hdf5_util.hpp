// What dltrain's two HDF5 users (checkpoints, packed image shards) share; private to the
// library and included only where DLTRAIN_WITH_HDF5 is defined.
//
// - hdf5_mutex(): serial HDF5 builds are not thread-safe, and a checkpoint may be saved
//   while loader workers read shards, so every HDF5 call is made under this one
//   process-wide lock; decoding and other work on the data read happen outside it.
// - quiet(): HDF5 prints its error stack by default (per thread in thread-safe builds);
//   dltrain reports errors as exceptions instead.
// - Hid: owns one identifier and closes it with the matching H5?close.
// - check_id / check_status: turn a failed call into a dltrain::Error naming the kind of
//   file, the path and the operation.
#pragma once

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "dltrain/core/error.hpp"

namespace dltrain::io::h5 {

/// The process-wide HDF5 mutex (inline: one instance across translation units).
inline std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

/// Silences HDF5's own error printing on this thread (call with hdf5_mutex() held).
inline void quiet() {
  thread_local bool done = false;
  if (!done) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    done = true;
  }
}

/// Owns one HDF5 identifier.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  ~Hid() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  /// Gives up ownership (for a close whose status the caller checks).
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }
  operator hid_t() const { return id_; }  // NOLINT: used as an hid_t in HDF5 calls

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

/// The operating-system error HDF5's file driver recorded on this thread's error stack for
/// the last failed call ("File too large", "No space left on device"), or "".
inline std::string os_error_on_stack() {
  std::string found;
  auto walk = [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
    if (e == nullptr || e->desc == nullptr) return 0;
    const std::string d = e->desc;
    const std::string key = "error message = '";
    const size_t p = d.find(key);
    if (p == std::string::npos) return 0;
    const size_t q = d.find('\'', p + key.size());
    *static_cast<std::string*>(out) = d.substr(p + key.size(), q - p - key.size());
    return 1;  // found: stop walking
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk, &found);
  return found;
}

/// `id`, or a dltrain::Error "<kind> '<path>': HDF5 failed to <what>; ..." when negative,
/// with the operating system's error when HDF5 recorded one (a full disk, a quota).
inline hid_t check_id(hid_t id, const char* kind, const std::string& path, const char* what) {
  if (id >= 0) return id;
  const std::string os = os_error_on_stack();
  DLTRAIN_CHECK(!os.empty(), kind, " '", path, "': HDF5 failed to ", what,
                "; the file may be truncated or corrupt (or the disk full)");
  DLTRAIN_FAIL(kind, " '", path, "': HDF5 failed to ", what, ": ", os,
               " (the operating system's error: check free disk space, quotas, `ulimit -f` and "
               "the storage)");
}

inline void check_status(herr_t st, const char* kind, const std::string& path, const char* what) {
  check_id(st, kind, path, what);
}

/// Creates (truncates) a file dltrain writes, with `fcpl` (the caller's creation properties:
/// user block, attribute storage) and format bounds [1.8, 1.10]: superblock v2 and object
/// headers v2, which HDF5 checksums, so corruption is found before HDF5 walks damaged
/// metadata, and nothing HDF5 1.10 (or h5py on it) cannot read. Call with hdf5_mutex() held.
inline Hid create_checksummed_file(const std::string& path, hid_t fcpl, const char* kind) {
  Hid fapl(check_id(H5Pcreate(H5P_FILE_ACCESS), kind, path, "make file-access properties"),
           H5Pclose);
#if H5_VERSION_GE(1, 10, 2)
  check_status(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V110), kind, path,
               "choose the HDF5 format versions");
#else
  check_status(H5Pset_libver_bounds(fapl, H5F_LIBVER_18, H5F_LIBVER_LATEST), kind, path,
               "choose the HDF5 format versions");
#endif
  return Hid(check_id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, fapl), kind, path,
                      "create the file (is the directory writable?)"),
             H5Fclose);
}

/// Writes (or replaces) a scalar int64 attribute.
inline void write_int_attr(hid_t loc, const char* name, int64_t v, const char* kind,
                           const std::string& path) {
  if (H5Aexists(loc, name) > 0) {
    check_status(H5Adelete(loc, name), kind, path, "replace an attribute");
  }
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid attr(check_id(H5Acreate2(loc, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), kind,
                    path, "create an attribute"),
           H5Aclose);
  check_status(H5Awrite(attr, H5T_NATIVE_INT64, &v), kind, path, "write an attribute");
}

/// A scalar int64 attribute, or nullopt when it is missing or unreadable.
inline std::optional<int64_t> try_int_attr(hid_t loc, const char* name) {
  if (H5Aexists(loc, name) <= 0) return std::nullopt;
  Hid attr(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
  int64_t v = 0;
  if (attr.get() < 0 || H5Aread(attr, H5T_NATIVE_INT64, &v) < 0) return std::nullopt;
  return v;
}

/// fsync of a file or directory, so a rename that follows is durable.
inline void sync_path(const std::string& p, bool directory) {
  int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace dltrain::io::h5
