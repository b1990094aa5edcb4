// The HDF5 backend of dltrain/io/checkpoint.hpp: write_checkpoint and read_checkpoint
// (compiled when HDF5 is found; a build without it compiles no_hdf5.cpp instead:
// src/io/CMakeLists.txt). The module-level save/load_checkpoint are in checkpoint.cpp.
//
// Layout and crash-safety invariants: dltrain/io/checkpoint.hpp.
//
// Corrupt files (issue 16): a checkpoint carries a CRC of all its bytes in a header before
// the HDF5 data (src/io/checkpoint_header.hpp), checked before HDF5 sees the file, because
// HDF5 1.10 can crash or read freed memory while parsing damaged metadata. The HDF5 part is
// written with library-version bounds [1.8, 1.10]: superblock v2 and object headers v2,
// whose metadata HDF5 checksums itself (so h5py also notices damage), and nothing newer
// than HDF5 1.10 can read. Files from before the header (format 1, no CRC) are refused by
// read_checkpoint (issue 28: damaged ones crashed HDF5); dltrain-convert restamp reads them
// in a child process through detail::read_unverified_checkpoint, where every size read from
// the file is checked against the file's size before anything is allocated.
#include "dltrain/io/checkpoint.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include "dltrain/amp/grad_scaler.hpp"
#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/core/generator.hpp"
#include "dltrain/nn/module.hpp"
#include "dltrain/optim/optimizer.hpp"
#include "dltrain/optim/scheduler.hpp"
#include "dltrain/version.hpp"

#include "src/io/checkpoint_header.hpp"
#ifndef DLTRAIN_WITH_ZLIB
#error \
    "checkpoints need zlib for their CRC: cmake/DltrainDependencies.cmake turns HDF5 off without it"
#endif
#include "src/io/hdf5_util.hpp"

namespace dltrain::io {

bool hdf5_supported() { return true; }

namespace {

using h5::hdf5_mutex;
using h5::Hid;

hid_t check_id(hid_t id, const std::string& path, const char* what) {
  return h5::check_id(id, "checkpoint", path, what);
}

void check_status(herr_t st, const std::string& path, const char* what) {
  h5::check_status(st, "checkpoint", path, what);
}

hid_t h5_type(DType t) {
  switch (t) {
    case DType::f32:
      return H5T_NATIVE_FLOAT;
    case DType::f64:
      return H5T_NATIVE_DOUBLE;
    case DType::f16:
    case DType::bf16:
      return H5T_NATIVE_UINT16;  // bit patterns; the "dtype" attribute says which
    case DType::i32:
      return H5T_NATIVE_INT32;
    case DType::i64:
      return H5T_NATIVE_INT64;
    case DType::u8:
    case DType::b8:
      return H5T_NATIVE_UINT8;
  }
  return H5T_NATIVE_UINT8;
}

DType dtype_from_name(const std::string& n, const std::string& path, const std::string& key) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64,
                  DType::u8, DType::b8}) {
    if (n == dtype_name(t)) return t;
  }
  DLTRAIN_FAIL("checkpoint '", path, "': entry '", key, "' has unknown dtype '", n,
               "'; was it written by a newer dltrain?");
}

void write_string_attr(hid_t loc, const std::string& name, const std::string& value,
                       const std::string& path) {
  Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
  check_status(H5Tset_size(type, std::max<size_t>(1, value.size())), path, "make a string type");
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid attr(check_id(H5Acreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), path,
                    "create an attribute"),
           H5Aclose);
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  check_status(H5Awrite(attr, type, padded.data()), path, "write an attribute");
}

// Sizes read from a file are checked against this before anything is allocated.
uint64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::string read_string_attr(hid_t loc, const std::string& name, const std::string& path) {
  DLTRAIN_CHECK(H5Aexists(loc, name.c_str()) > 0, "checkpoint '", path, "': missing attribute '",
                name, "'; the file is not a dltrain checkpoint or is corrupt");
  Hid attr(check_id(H5Aopen(loc, name.c_str(), H5P_DEFAULT), path, "open an attribute"), H5Aclose);
  Hid ftype(check_id(H5Aget_type(attr), path, "read an attribute's type"), H5Tclose);
  DLTRAIN_CHECK(H5Tget_class(ftype) == H5T_STRING && H5Tis_variable_str(ftype) == 0, "checkpoint '",
                path, "': attribute '", name,
                "' is not a fixed-length string; the file is corrupt");
  const size_t n = H5Tget_size(ftype);
  DLTRAIN_CHECK(n >= 1 && n <= file_size(path), "checkpoint '", path, "': attribute '", name,
                "' claims ", n, " bytes, more than the file holds; the file is corrupt");
  Hid mtype(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mtype, n);
  std::string s(n, '\0');
  check_status(H5Aread(attr, mtype, s.data()), path, "read an attribute");
  return std::string(s.c_str());
}

void write_int_attr(hid_t loc, const char* name, int64_t v, const std::string& path) {
  h5::write_int_attr(loc, name, v, "checkpoint", path);
}

int64_t read_int_attr(hid_t loc, const char* name, const std::string& path) {
  const auto v = h5::try_int_attr(loc, name);
  DLTRAIN_CHECK(v.has_value(), "checkpoint '", path, "': missing attribute '", name,
                "'; the file is not a dltrain checkpoint or is corrupt");
  return *v;
}

Hid create_group(hid_t file, const char* name, const std::string& path) {
  // Track creation order so a StateDict comes back in the order it was saved.
  Hid gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  return Hid(
      check_id(H5Gcreate2(file, name, H5P_DEFAULT, gcpl, H5P_DEFAULT), path, "create a group"),
      H5Gclose);
}

void write_state(hid_t file, const char* group, const StateDict& sd, const std::string& path) {
  Hid g = create_group(file, group, path);
  for (const auto& [key, t0] : sd) {
    DLTRAIN_CHECK(key.find('/') == std::string::npos && !key.empty() && key != ".", "checkpoint '",
                  path, "': key '", key, "' in ", group, " cannot be an HDF5 name (no '/')");
    Tensor t = t0.detach().to(Device::cpu()).contiguous();
    std::vector<hsize_t> dims(t.shape().begin(), t.shape().end());
    Hid space(t.dim() == 0 ? H5Screate(H5S_SCALAR)
                           : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
              H5Sclose);
    Hid ds(check_id(H5Dcreate2(g, key.c_str(), h5_type(t.dtype()), space, H5P_DEFAULT, H5P_DEFAULT,
                               H5P_DEFAULT),
                    path, "create a dataset"),
           H5Dclose);
    if (t.numel() > 0) {
      check_status(H5Dwrite(ds, h5_type(t.dtype()), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()),
                   path, "write a dataset");
    }
    write_string_attr(ds, "dtype", dtype_name(t.dtype()), path);
  }
}

// The names of a group's links in creation order (names longer than the file are corruption).
std::vector<std::string> link_names(hid_t g, const std::string& path) {
  H5G_info_t info;
  check_status(H5Gget_info(g, &info), path, "list a group");
  const uint64_t fsize = file_size(path);
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t n =
        H5Lget_name_by_idx(g, ".", H5_INDEX_CRT_ORDER, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    check_status(static_cast<herr_t>(n < 0 || static_cast<uint64_t>(n) > fsize ? -1 : 0), path,
                 "read an entry name");
    std::string key(static_cast<size_t>(n) + 1, '\0');
    check_status(static_cast<herr_t>(H5Lget_name_by_idx(g, ".", H5_INDEX_CRT_ORDER, H5_ITER_INC, i,
                                                        key.data(), key.size(), H5P_DEFAULT) < 0
                                         ? -1
                                         : 0),
                 path, "read an entry name");
    key.resize(static_cast<size_t>(n));
    names.push_back(std::move(key));
  }
  return names;
}

StateDict read_state(hid_t file, const char* group, const std::string& path) {
  StateDict sd;
  if (H5Lexists(file, group, H5P_DEFAULT) <= 0) return sd;
  Hid g(check_id(H5Gopen2(file, group, H5P_DEFAULT), path, "open a group"), H5Gclose);
  const uint64_t fsize = file_size(path);
  for (const std::string& key : link_names(g, path)) {
    Hid ds(check_id(H5Dopen2(g, key.c_str(), H5P_DEFAULT), path, "open a dataset"), H5Dclose);
    const DType dt = dtype_from_name(read_string_attr(ds, "dtype", path), path, key);
    Hid space(check_id(H5Dget_space(ds), path, "read a dataset's shape"), H5Sclose);
    const int nd = H5Sget_simple_extent_ndims(space);
    check_status(nd, path, "read a dataset's shape");
    DLTRAIN_CHECK(nd <= H5S_MAX_RANK, "checkpoint '", path, "': entry '", group, "/", key,
                  "' claims ", nd, " dimensions; the file is corrupt");
    std::vector<hsize_t> dims(static_cast<size_t>(nd));
    if (nd > 0)
      check_status(H5Sget_simple_extent_dims(space, dims.data(), nullptr), path,
                   "read a dataset's shape");
    Hid ftype(check_id(H5Dget_type(ds), path, "read a dataset's type"), H5Tclose);
    DLTRAIN_CHECK(
        H5Tget_size(ftype) == dtype_size(dt) && H5Tget_class(ftype) == H5Tget_class(h5_type(dt)),
        "checkpoint '", path, "': entry '", group, "/", key, "' stores ", H5Tget_size(ftype),
        "-byte elements of HDF5 class ", H5Tget_class(ftype), " but says dtype ", dt,
        "; the file is corrupt");
    // The shape's byte count, checked against the file before allocating it (a corrupt
    // dataspace can claim terabytes); overflow counts as too large.
    uint64_t bytes = dtype_size(dt);
    for (hsize_t d : dims) {
      DLTRAIN_CHECK(d == 0 || bytes <= fsize / d, "checkpoint '", path, "': entry '", group, "/",
                    key, "' claims a shape larger than the file (", fsize,
                    " bytes); the file is corrupt");
      bytes *= d;
    }
    const uint64_t stored = bytes > 0 ? H5Dget_storage_size(ds) : 0;
    DLTRAIN_CHECK(stored == bytes, "checkpoint '", path, "': entry '", group, "/", key, "' has ",
                  stored, " bytes of data but its shape needs ", bytes,
                  "; the file is truncated or corrupt");
    Shape shape(dims.begin(), dims.end());
    Tensor t = empty(shape, dt);
    if (t.numel() > 0) {
      check_status(H5Dread(ds, h5_type(dt), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), path,
                   "read a dataset (truncated file?)");
    }
    sd.insert(key, t);
  }
  return sd;
}

std::string rotated(const std::string& path, int64_t i) { return path + "." + std::to_string(i); }

// Temporary files `name.tmp-<pid>` of earlier saves whose writer died mid-save (SIGKILL after
// Slurm's KillWait, the OOM killer): each can be as large as a checkpoint, and a job that is
// preempted again and again would pile them up. One is removed when its process no longer
// exists on this machine and the file has not changed for 10 minutes (so that a writer on
// another node sharing the directory, whose pid means nothing here, is never disturbed).
void remove_stale_temporaries(const std::filesystem::path& dir, const std::string& name) {
  namespace fs = std::filesystem;
  const std::string prefix = name + ".tmp-";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (file.size() <= prefix.size() || file.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = file.substr(prefix.size());
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code tec;
    const auto changed = fs::last_write_time(it->path(), tec);
    if (tec || fs::file_time_type::clock::now() - changed < std::chrono::minutes(10)) continue;
    fs::remove(it->path(), tec);
  }
}
using h5::sync_path;

}  // namespace

void write_checkpoint(const std::string& path, const Checkpoint& ckpt, const SaveOptions& options) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  h5::quiet();
  DLTRAIN_CHECK(options.keep_last >= 1, "write_checkpoint: keep_last must be >= 1, got ",
                options.keep_last);
  DLTRAIN_CHECK(options.extra.empty(), "write_checkpoint('", path,
                "'): SaveOptions::extra is for save_checkpoint; put the states in "
                "Checkpoint::extra");
  // Before any file is made: a bad name must not cost the previous checkpoint anything.
  for (const auto& [name, sd] : ckpt.extra)
    DLTRAIN_CHECK(!name.empty() && name != "." && name.find('/') == std::string::npos,
                  "write_checkpoint('", path, "'): extra state name '", name,
                  "' cannot be an HDF5 group name; use a name without '/'");
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  DLTRAIN_CHECK(fs::is_directory(dir), "write_checkpoint('", path, "'): directory '", dir.string(),
                "' does not exist; create it first");
  remove_stale_temporaries(dir, target.filename().string());
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  try {
    // A user block for the integrity header, and format bounds [1.8, 1.10] (file comment).
    Hid fcpl(check_id(H5Pcreate(H5P_FILE_CREATE), tmp, "make file-creation properties"), H5Pclose);
    check_status(H5Pset_userblock(fcpl, detail::kCheckpointHeaderBytes), tmp,
                 "reserve the checkpoint header");
    Hid file = h5::create_checksummed_file(tmp, fcpl, "checkpoint");
    write_int_attr(file, "format_version", kCheckpointFormat, tmp);
    write_string_attr(file, "dltrain_version", kVersion, tmp);
    write_int_attr(file, "epoch", ckpt.progress.epoch, tmp);
    write_int_attr(file, "step", ckpt.progress.step, tmp);
    write_int_attr(file, "batch_in_epoch", ckpt.progress.batch_in_epoch, tmp);
    write_int_attr(file, "samples_in_epoch", ckpt.progress.samples_in_epoch, tmp);
    write_int_attr(file, "global_batch", ckpt.progress.global_batch, tmp);
    write_int_attr(file, "rng_seed", static_cast<int64_t>(ckpt.rng_seed), tmp);
    write_int_attr(file, "rng_offset", static_cast<int64_t>(ckpt.rng_offset), tmp);
    write_state(file, "model", ckpt.model, tmp);
    write_state(file, "optimizer", ckpt.optimizer, tmp);
    write_state(file, "scheduler", ckpt.scheduler, tmp);
    if (!ckpt.scaler.empty()) write_state(file, "scaler", ckpt.scaler, tmp);
    if (!ckpt.extra.empty()) {
      Hid extra = create_group(file, "extra", tmp);
      for (const auto& [name, sd] : ckpt.extra) write_state(extra, name.c_str(), sd, tmp);
    }
    {
      Hid meta = create_group(file, "metadata", tmp);
      for (const auto& [k, v] : ckpt.metadata) write_string_attr(meta, k, v, tmp);
    }
    check_status(H5Fflush(file, H5F_SCOPE_GLOBAL), tmp, "flush the file");
    check_status(H5Fclose(file.release()), tmp, "close the file (disk full?)");
    detail::stamp_checkpoint_header(tmp, kCheckpointFormat);  // also fsyncs
  } catch (const Error& e) {
    std::remove(tmp.c_str());
    DLTRAIN_FAIL("write_checkpoint('", path, "'): ", e.what(), ". '", path,
                 "' was not changed and the temporary file was removed");
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  // Rotate older checkpoints: path.(K-2) -> path.(K-1), ..., then path.1 becomes a hard link
  // to the current file, so `path` itself exists at every instant.
  std::error_code ec;
  if (options.keep_last > 1 && fs::exists(target)) {
    for (int64_t i = options.keep_last - 1; i >= 2; --i) {
      if (fs::exists(rotated(path, i - 1))) fs::rename(rotated(path, i - 1), rotated(path, i), ec);
    }
    fs::remove(rotated(path, 1), ec);
    fs::create_hard_link(target, rotated(path, 1), ec);
    if (ec) fs::copy_file(target, rotated(path, 1), fs::copy_options::overwrite_existing, ec);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    DLTRAIN_FAIL("write_checkpoint('", path, "'): cannot rename the temporary file over it (", why,
                 "); the previous checkpoint is untouched");
  }
  sync_path(dir.string(), true);
}

namespace {

// The HDF5 part of read_checkpoint, for a file whose header recorded `header_format`
// (checked: every byte matched its CRC) or, with nullopt, a file without a header
// (detail::read_unverified_checkpoint only).
Checkpoint read_hdf5_checkpoint(const std::string& path, std::optional<int64_t> header_format) {
  auto check_format = [&](int64_t f) {
    DLTRAIN_CHECK(f <= kCheckpointFormat, "read_checkpoint('", path,
                  "'): written in checkpoint format ", f, " but this dltrain (", kVersion,
                  ") reads up to format ", kCheckpointFormat, "; upgrade dltrain");
  };
  if (header_format) check_format(*header_format);
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  h5::quiet();
  if (!header_format) {
    htri_t is_h5 = H5Fis_hdf5(path.c_str());
    DLTRAIN_CHECK(is_h5 > 0, "read_checkpoint('", path,
                  "'): not an HDF5 file (or truncated before its header); it is not a dltrain "
                  "checkpoint");
  }
  Hid file(check_id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path,
                    "open the file (truncated?)"),
           H5Fclose);
  Checkpoint c;
  c.format_version = read_int_attr(file, "format_version", path);
  check_format(c.format_version);
  DLTRAIN_CHECK(!header_format || *header_format == c.format_version, "read_checkpoint('", path,
                "'): its header says format ", header_format.value_or(0),
                " but its HDF5 attribute says ", c.format_version, "; the file is corrupt");
  c.dltrain_version = read_string_attr(file, "dltrain_version", path);
  c.progress.epoch = read_int_attr(file, "epoch", path);
  c.progress.step = read_int_attr(file, "step", path);
  c.progress.batch_in_epoch = read_int_attr(file, "batch_in_epoch", path);
  c.progress.samples_in_epoch = h5::try_int_attr(file, "samples_in_epoch").value_or(-1);
  c.progress.global_batch = h5::try_int_attr(file, "global_batch").value_or(0);
  c.rng_seed = static_cast<uint64_t>(read_int_attr(file, "rng_seed", path));
  c.rng_offset = static_cast<uint64_t>(read_int_attr(file, "rng_offset", path));
  c.model = read_state(file, "model", path);
  c.optimizer = read_state(file, "optimizer", path);
  c.scheduler = read_state(file, "scheduler", path);
  c.scaler = read_state(file, "scaler", path);
  if (H5Lexists(file, "extra", H5P_DEFAULT) > 0) {
    Hid extra(check_id(H5Gopen2(file, "extra", H5P_DEFAULT), path, "open /extra"), H5Gclose);
    for (const std::string& name : link_names(extra, path))
      c.extra[name] = read_state(extra, name.c_str(), path);
  }
  if (H5Lexists(file, "metadata", H5P_DEFAULT) > 0) {
    Hid meta(check_id(H5Gopen2(file, "metadata", H5P_DEFAULT), path, "open /metadata"), H5Gclose);
    // H5Aiterate2 exists in HDF5 1.10 and later alike.
    std::vector<std::string> keys;
    auto collect = [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
      static_cast<std::vector<std::string>*>(out)->emplace_back(name);
      return 0;
    };
    check_status(H5Aiterate2(meta, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &keys), path,
                 "list /metadata");
    for (const auto& key : keys) c.metadata[key] = read_string_attr(meta, key, path);
  }
  return c;
}

void check_exists(const std::string& path, const char* op) {
  DLTRAIN_CHECK(std::filesystem::exists(path), op, ": no file '", path,
                "'; check the path (older checkpoints are kept as '", path, ".1', ...)");
}

}  // namespace

Checkpoint read_checkpoint(const std::string& path) {
  check_exists(path, "read_checkpoint");
  // Every byte checked before HDF5 parses any (outside the HDF5 lock: plain reads).
  const std::optional<int64_t> header_format = detail::verify_checkpoint_header(path);
  // A file without the header (dltrain 0.1.0's checkpoints, or HDF5 from another program)
  // never reaches HDF5 in this process: HDF5 1.10 can crash on its damaged metadata, and
  // nothing can tell damage from a good file before HDF5 parses it (docs/design.md,
  // "Files from outside").
  DLTRAIN_CHECK(header_format.has_value(), "read_checkpoint('", path,
                "'): the file has no dltrain integrity header (a checkpoint written by dltrain "
                "0.1.0, before checkpoints carried a CRC, or an HDF5 file from another program), "
                "and HDF5 can crash on damaged metadata, so dltrain does not open it unchecked; "
                "check it and add the header once with `dltrain-convert restamp ",
                path,
                "` (it reads the file in a separate process, then writes it back with the "
                "header and keeps the original as '",
                path, ".unstamped')");
  return read_hdf5_checkpoint(path, header_format);
}

Checkpoint detail::read_unverified_checkpoint(const std::string& path) {
  check_exists(path, "read_unverified_checkpoint");
  return read_hdf5_checkpoint(path, detail::verify_checkpoint_header(path));
}

}  // namespace dltrain::io
