// Packed image datasets: pack_image_folder (scan, parallel re-encode, crash-safe shard
// writes, resume) and PackedImageDataset (index and shard checks, hyperslab reads).
//
// Invariants: every HDF5 call runs with hdf5_mutex() held and no HDF5 identifier outlives
// it unlocked except those in PackedImageDataset::Shards, which are only touched (and
// closed) under it; JPEG decoding and encoding never run under it. Samples are read without
// it: a shard's `jpeg` dataset is contiguous and unfiltered (as dltrain-pack writes it), so its
// file offset, found once at construction, lets each reader pread() the bytes directly; the
// HDF5 hyperslab read under the lock remains for any other layout. A file at a shard's
// final name was complete when it was renamed there; the index exists only when every
// shard of its plan does.
//
// Corrupt files (issue 16): HDF5 never parses a pack file dltrain has not checked first. The
// index carries the verified header (src/io/verified_header.hpp: CRC of the whole file,
// checked before H5Fopen). Shards are too large to read whole at every open, so they are
// written with format bounds [1.8, 1.10], whose superblock (v2) and object headers HDF5
// checksums itself, and a shard is refused before HDF5 sees it unless its superblock is v2 or
// later and the end of file it records fits in the file. The raw data HDF5 does not checksum
// is covered by dltrain's own CRCs: each sample's JPEG bytes (`crc32`, checked at every read)
// and the tables the reader keeps (offsets, labels, crc32: the `tables_crc` attribute, in the
// checksummed object header, checked at construction). Every length read from a file is
// checked against the file's size before anything is allocated.
#include "dltrain/data/packed.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "dltrain/core/error.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/data/image.hpp"

#ifdef DLTRAIN_WITH_HDF5
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>

#include "src/io/hdf5_util.hpp"
#include "src/io/verified_header.hpp"
#endif

namespace dltrain::data {

namespace fs = std::filesystem;

std::string packed_shard_path(const std::string& prefix, int64_t shard) {
  char num[32];
  std::snprintf(num, sizeof num, "-%05lld.h5", static_cast<long long>(shard));
  return prefix + num;
}

std::string packed_index_path(const std::string& prefix) { return prefix + "-index.h5"; }

#ifndef DLTRAIN_WITH_HDF5

namespace {
[[noreturn]] void no_hdf5(const char* what, const std::string& path) {
  DLTRAIN_FAIL(what, "('", path, "'): this dltrain was built without HDF5, which packed ",
               "datasets need; install libhdf5-dev (scripts/setup.sh) and rebuild with ",
               "-DDLTRAIN_HDF5=ON");
}
}  // namespace

struct PackedImageDataset::Shards {};

PackResult pack_image_folder(const std::string&, const std::string& prefix, const PackOptions&) {
  no_hdf5("pack_image_folder", prefix);
}
PackedIndex read_packed_index(const std::string& prefix) { no_hdf5("read_packed_index", prefix); }
PackedImageDataset::PackedImageDataset(std::string prefix, PackedOptions options)
    : prefix_(std::move(prefix)), options_(std::move(options)) {
  no_hdf5("PackedImageDataset", prefix_);
}
PackedImageDataset::~PackedImageDataset() = default;
Batch PackedImageDataset::get_batch_for_epoch(const std::vector<int64_t>&, int64_t) const {
  no_hdf5("PackedImageDataset", prefix_);
}
Example PackedImageDataset::get(int64_t) const { no_hdf5("PackedImageDataset", prefix_); }
std::vector<uint8_t> PackedImageDataset::read_jpeg(int64_t) const {
  no_hdf5("PackedImageDataset", prefix_);
}
std::string PackedImageDataset::source_path(int64_t) const {
  no_hdf5("PackedImageDataset", prefix_);
}
void detail::set_packed_int_attribute(const std::string& path, const std::string&, int64_t) {
  no_hdf5("set_packed_int_attribute", path);
}

#else

namespace {

// The lock, quieting, Hid and checks are shared with checkpoints (src/io/hdf5_util.hpp).
using io::h5::hdf5_mutex;
using io::h5::Hid;
using io::h5::sync_path;
using io::h5::try_int_attr;

void quiet_hdf5() { io::h5::quiet(); }

hid_t check_id(hid_t id, const std::string& path, const char* what) {
  return io::h5::check_id(id, "packed dataset file", path, what);
}

void check_status(herr_t st, const std::string& path, const char* what) {
  io::h5::check_status(st, "packed dataset file", path, what);
}

void write_int_attr(hid_t loc, const char* name, int64_t v, const std::string& path) {
  io::h5::write_int_attr(loc, name, v, "packed dataset file", path);
}

int64_t read_int_attr(hid_t loc, const char* name, const std::string& path) {
  const auto v = try_int_attr(loc, name);
  DLTRAIN_CHECK(v.has_value(), "packed dataset file '", path, "': missing attribute '", name,
                "'; the file is not part of a packed dataset or is corrupt");
  return *v;
}

// The index's verified header (the kind's words for its errors).
io::detail::HeaderKind index_kind() {
  return {"dltrain pack\r\n\x1a\n", "packed dataset index", "pack_image_folder",
          "packed dataset index",
          "repack with dltrain-pack (a pack writes its index last: if one was interrupted, run "
          "it again with --resume)"};
}

// Index files start with the verified header, shards with the HDF5 superblock.
Hid create_file(const std::string& path, bool index) {
  Hid fcpl(check_id(H5Pcreate(H5P_FILE_CREATE), path, "make file-creation properties"), H5Pclose);
  // No object timestamps, so that packing the same folder twice writes identical files.
  H5Pset_obj_track_times(fcpl, false);
  // Root attributes stay in the (checksummed) object header rather than a separate heap.
  check_status(H5Pset_attr_phase_change(fcpl, 32, 24), path, "keep attributes compact");
  if (index)
    check_status(H5Pset_userblock(fcpl, io::detail::kVerifiedHeaderBytes), path,
                 "reserve the index header");
  // Format bounds [1.8, 1.10]: checksummed metadata (io::h5::create_checksummed_file).
  return io::h5::create_checksummed_file(path, fcpl, "packed dataset file");
}

// The size of an open file, for checking lengths read from it before allocating.
hsize_t file_size(hid_t file, const std::string& path) {
  hsize_t size = 0;
  check_status(H5Fget_filesize(file, &size), path, "get the file size");
  return size;
}

void write_dataset(hid_t file, const char* name, hid_t mem_type, hid_t file_type, hsize_t n,
                   const void* data, const std::string& path) {
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_obj_track_times(dcpl, false);
  Hid space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Hid ds(check_id(H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), path,
                  "create a dataset"),
         H5Dclose);
  if (n > 0)
    check_status(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), path,
                 "write a dataset");
}

// Strings as one fixed-length (null-padded) string dataset.
void write_strings(hid_t file, const char* name, const std::vector<std::string>& v,
                   const std::string& path) {
  size_t len = 1;
  for (const auto& s : v) len = std::max(len, s.size());
  std::vector<char> buf(len * v.size(), '\0');
  for (size_t i = 0; i < v.size(); ++i) std::memcpy(buf.data() + i * len, v[i].data(), v[i].size());
  Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
  check_status(H5Tset_size(type, len), path, "make a string type");
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  write_dataset(file, name, type, type, v.size(), buf.data(), path);
}

Hid open_dataset(hid_t file, const char* name, const std::string& path) {
  DLTRAIN_CHECK(H5Lexists(file, name, H5P_DEFAULT) > 0, "packed dataset file '", path,
                "': missing dataset '", name,
                "'; the file is not part of a packed dataset or is "
                "corrupt");
  Hid ds(check_id(H5Dopen2(file, name, H5P_DEFAULT), path, "open a dataset"), H5Dclose);
  // Only the layouts dltrain-pack writes: contiguous (or compact) and unfiltered. HDF5
  // checksums a version-2 object header (so the layout read here is what was written) but not
  // the version-1 B-tree that indexes a chunked dataset's chunks in files with HDF5 1.8
  // bounds, which it would follow on a read: a file from another program gets an error here
  // rather than a walk through unchecked metadata (issue 28).
  Hid dcpl(check_id(H5Dget_create_plist(ds), path, "read a dataset's layout"), H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(dcpl);
  DLTRAIN_CHECK((layout == H5D_CONTIGUOUS || layout == H5D_COMPACT) && H5Pget_nfilters(dcpl) == 0,
                "packed dataset file '", path, "': dataset '", name,
                "' is chunked or filtered, which dltrain-pack never writes (the file comes from "
                "another program, or is corrupt); repack the images with dltrain-pack");
  return ds;
}

hsize_t dataset_length(hid_t ds, const std::string& path, const char* name) {
  Hid space(H5Dget_space(ds), H5Sclose);
  DLTRAIN_CHECK(H5Sget_simple_extent_ndims(space) == 1, "packed dataset file '", path,
                "': dataset '", name, "' is not 1-d; the file is corrupt");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  return n;
}

// The `expect` values of a 1-d dataset, as `mem_type` (T's HDF5 type).
template <class T>
std::vector<T> read_values(hid_t file, const char* name, hsize_t expect, hid_t mem_type,
                           const std::string& path) {
  Hid ds = open_dataset(file, name, path);
  const hsize_t n = dataset_length(ds, path, name);
  DLTRAIN_CHECK(n == expect, "packed dataset file '", path, "': dataset '", name, "' holds ", n,
                " values, expected ", expect, "; the file is corrupt or from a different pack");
  DLTRAIN_CHECK(n <= file_size(file, path) / sizeof(T), "packed dataset file '", path,
                "': dataset '", name, "' claims ", n,
                " values, more than the file holds; the file is corrupt");
  std::vector<T> v(n);
  if (n > 0)
    check_status(H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), path,
                 "read a dataset (truncated file?)");
  return v;
}

std::vector<int64_t> read_ints(hid_t file, const char* name, hsize_t expect,
                               const std::string& path) {
  return read_values<int64_t>(file, name, expect, H5T_NATIVE_INT64, path);
}

std::vector<uint32_t> read_crcs(hid_t file, hsize_t expect, const std::string& path) {
  return read_values<uint32_t>(file, "crc32", expect, H5T_NATIVE_UINT32, path);
}

// Element `i` of a fixed-length string dataset, or all of them (i < 0).
std::vector<std::string> read_strings(hid_t file, const char* name, const std::string& path,
                                      int64_t i = -1) {
  Hid ds = open_dataset(file, name, path);
  Hid ftype(H5Dget_type(ds), H5Tclose);
  DLTRAIN_CHECK(H5Tget_class(ftype) == H5T_STRING && H5Tis_variable_str(ftype) <= 0,
                "packed dataset file '", path, "': dataset '", name,
                "' does not hold fixed-length strings; the file is corrupt");
  const size_t len = H5Tget_size(ftype);
  Hid mtype(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mtype, len);
  H5Tset_strpad(mtype, H5T_STR_NULLPAD);
  const hsize_t n = dataset_length(ds, path, name);
  DLTRAIN_CHECK(len >= 1 && n <= file_size(file, path) / len, "packed dataset file '", path,
                "': dataset '", name, "' claims ", n, " strings of ", len,
                " bytes, more than the file holds; the file is corrupt");
  hsize_t count = n;
  Hid fspace(H5Dget_space(ds), H5Sclose);
  if (i >= 0) {
    DLTRAIN_CHECK(static_cast<hsize_t>(i) < n, "packed dataset file '", path, "': dataset '", name,
                  "' has no element ", i);
    const hsize_t start = static_cast<hsize_t>(i);
    count = 1;
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &count, nullptr);
  }
  Hid mspace(H5Screate_simple(1, &count, nullptr), H5Sclose);
  std::vector<char> buf(len * count + 1, '\0');
  if (count > 0)
    check_status(H5Dread(ds, mtype, mspace, fspace, H5P_DEFAULT, buf.data()), path,
                 "read strings (truncated file?)");
  std::vector<std::string> out;
  for (hsize_t k = 0; k < count; ++k) {
    const char* s = buf.data() + k * len;
    out.emplace_back(s, strnlen(s, len));
  }
  return out;
}

// Checks a pack file before HDF5 parses any of it (file comment): the index against its
// verified header, then for every file a superblock of version 2 or later whose recorded end
// of file fits in the file. Plain reads.
void check_before_hdf5(const std::string& path, bool index, const char* role,
                       const std::string& fix) {
  std::error_code ec;
  DLTRAIN_CHECK(fs::exists(path, ec), "packed dataset: ", role, " '", path, "' is missing; ", fix);
  const char* repack =
      "repack with dltrain-pack (this dltrain only reads pack files it can check before HDF5 "
      "parses them: HDF5 1.10 can crash on damaged metadata)";
  if (index) {
    const std::optional<int64_t> format = io::detail::verify_header(path, index_kind());
    DLTRAIN_CHECK(format.has_value(), "packed dataset index '", path,
                  "' was written by an older dltrain (packed format 1, without an integrity "
                  "header); ",
                  repack);
    DLTRAIN_CHECK(*format >= 2 && *format <= kPackedFormatVersion, "packed dataset file '", path,
                  "' is written in packed format ", *format,
                  " but this dltrain reads formats 2 to ", kPackedFormatVersion,
                  "; upgrade dltrain (or repack with this one)");
  }
  const auto sb = io::detail::find_hdf5_superblock(path, "packed dataset");
  DLTRAIN_CHECK(sb.has_value(), "packed dataset: ", role, " '", path,
                "' is not an HDF5 file (or is truncated before its header); ", fix);
  DLTRAIN_CHECK(sb->version >= 2, "packed dataset: ", role, " '", path,
                "' has an HDF5 superblock of version ", sb->version,
                ", without metadata checksums: it was written by an older dltrain (packed format "
                "1) or its first bytes are corrupt; ",
                repack);
  const uint64_t size = fs::file_size(path, ec);
  DLTRAIN_CHECK(ec || sb->end <= size, "packed dataset: ", role, " '", path,
                "' is truncated (or its superblock is corrupt): it has ", size,
                " bytes but HDF5 recorded ", sb->end, "; ", fix);
}

// Opens an existing file read-only, with errors that say what is wrong with it.
Hid open_readonly(const std::string& path, bool index, const char* role, const std::string& fix) {
  check_before_hdf5(path, index, role, fix);
  // Readers need no file locks (a pack's files are never modified in place: writers
  // rename new files over them), and locking fails on some cluster file systems.
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10 && H5_VERS_RELEASE >= 7) || H5_VERSION_GE(1, 12, 1)
  H5Pset_file_locking(fapl, false, true);
#endif
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  DLTRAIN_CHECK(id >= 0, "packed dataset: ", role, " '", path,
                "' cannot be opened by HDF5: it is truncated or corrupt (its metadata fails "
                "HDF5's checksums); ",
                fix);
  return Hid(id, H5Fclose);
}

void check_version(hid_t file, const std::string& path) {
  const int64_t v = read_int_attr(file, "format_version", path);
  DLTRAIN_CHECK(v >= 2 && v <= kPackedFormatVersion, "packed dataset file '", path,
                "' is written in packed format ", v, " but this dltrain reads formats 2 to ",
                kPackedFormatVersion, "; upgrade dltrain (or repack with this one)");
}

void rename_into_place(const std::string& tmp, const std::string& path) {
  sync_path(tmp, false);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    DLTRAIN_FAIL("pack_image_folder: cannot rename '", tmp, "' to '", path, "' (", why, ")");
  }
  const fs::path parent = fs::path(path).parent_path();
  sync_path(parent.empty() ? "." : parent.string(), true);
}

std::string tmp_name(const std::string& path) {
  return path + ".tmp-" + std::to_string(::getpid());
}

// --- packing -------------------------------------------------------------------------

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  void i64(int64_t v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    bytes(s.data(), s.size());
  }
};

struct Source {
  std::string path, rel;
  int64_t label = 0;
};

// One source image as packed (or its error).
struct Encoded {
  std::vector<uint8_t> bytes;
  int64_t source_bytes = 0;
  bool resized = false;
  bool corrupt = false;
  std::string error;
};

Encoded encode_one(const Source& s, const PackOptions& o) {
  Encoded e;
  std::vector<uint8_t> raw;
  read_file_bytes(s.path, raw);  // unreadable files are errors under either policy
  e.source_bytes = static_cast<int64_t>(raw.size());
  try {
    const ImageInfo info = read_jpeg_header(raw);
    const int64_t w = info.width, h = info.height, long_side = std::max(w, h);
    if (o.max_side > 0 && long_side > o.max_side) {
      const Image img =
          decode_jpeg_scaled(raw.data(), raw.size(), jpeg_scale_for(long_side, o.max_side));
      const int64_t nh = std::max<int64_t>(1, (h * o.max_side + long_side / 2) / long_side);
      const int64_t nw = std::max<int64_t>(1, (w * o.max_side + long_side / 2) / long_side);
      e.bytes = encode_jpeg(resize(img, nh, nw), o.quality);
      e.resized = true;
    } else {
      // Entropy decoding covers the whole file even at 1/8 scale, so this validates the
      // data (truncation, corrupt segments) at a fraction of a full decode.
      (void)decode_jpeg_scaled(raw.data(), raw.size(), {1, 8});
      e.bytes = std::move(raw);
    }
  } catch (const Error& err) {
    e.corrupt = true;
    e.error = err.what();
    e.bytes.clear();
  }
  return e;
}

struct ShardPlan {
  int64_t index = 0, num_shards = 0, first_image = 0, max_side = 0, quality = 0;
  uint64_t plan_hash = 0;
  std::vector<std::string> classes;
};

void write_common_attrs(hid_t file, const ShardPlan& p, int64_t num_images,
                        const std::string& path) {
  write_int_attr(file, "format_version", kPackedFormatVersion, path);
  write_int_attr(file, "num_shards", p.num_shards, path);
  write_int_attr(file, "num_images", num_images, path);
  write_int_attr(file, "max_side", p.max_side, path);
  write_int_attr(file, "quality", p.quality, path);
  write_int_attr(file, "plan_hash", static_cast<int64_t>(p.plan_hash), path);
  write_strings(file, "classes", p.classes, path);
}

// The CRC of the tables a reader keeps of a shard (its `tables_crc` attribute).
int64_t tables_crc(const std::vector<int64_t>& offsets, const std::vector<int64_t>& labels,
                   const std::vector<uint32_t>& crcs) {
  uint32_t c = io::detail::crc32_update(0, offsets.data(), offsets.size() * sizeof(int64_t));
  c = io::detail::crc32_update(c, labels.data(), labels.size() * sizeof(int64_t));
  c = io::detail::crc32_update(c, crcs.data(), crcs.size() * sizeof(uint32_t));
  return c;
}

// Writes one shard to a temporary file and renames it into place. Returns its JPEG bytes.
int64_t write_shard(const std::string& path, const ShardPlan& p, const std::vector<Encoded>& enc,
                    const std::vector<Source>& sources, int64_t first_source) {
  std::vector<int64_t> offsets{0}, labels, src_index;
  std::vector<uint32_t> crcs;
  std::vector<std::string> rel;
  for (size_t i = 0; i < enc.size(); ++i) {
    if (enc[i].corrupt) continue;
    offsets.push_back(offsets.back() + static_cast<int64_t>(enc[i].bytes.size()));
    crcs.push_back(io::detail::crc32_update(0, enc[i].bytes.data(), enc[i].bytes.size()));
    const int64_t s = first_source + static_cast<int64_t>(i);
    labels.push_back(sources[static_cast<size_t>(s)].label);
    src_index.push_back(s);
    rel.push_back(sources[static_cast<size_t>(s)].rel);
  }
  std::vector<uint8_t> jpeg(static_cast<size_t>(offsets.back()));
  for (size_t i = 0, k = 0; i < enc.size(); ++i) {
    if (enc[i].corrupt) continue;
    std::memcpy(jpeg.data() + offsets[k++], enc[i].bytes.data(), enc[i].bytes.size());
  }
  const std::string tmp = tmp_name(path);
  try {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    quiet_hdf5();
    Hid file = create_file(tmp, /*index=*/false);
    write_dataset(file, "jpeg", H5T_NATIVE_UINT8, H5T_STD_U8LE, jpeg.size(), jpeg.data(), tmp);
    write_dataset(file, "offsets", H5T_NATIVE_INT64, H5T_STD_I64LE, offsets.size(), offsets.data(),
                  tmp);
    write_dataset(file, "labels", H5T_NATIVE_INT64, H5T_STD_I64LE, labels.size(), labels.data(),
                  tmp);
    write_dataset(file, "sources", H5T_NATIVE_INT64, H5T_STD_I64LE, src_index.size(),
                  src_index.data(), tmp);
    write_dataset(file, "crc32", H5T_NATIVE_UINT32, H5T_STD_U32LE, crcs.size(), crcs.data(), tmp);
    write_strings(file, "paths", rel, tmp);
    write_common_attrs(file, p, static_cast<int64_t>(labels.size()), tmp);
    write_int_attr(file, "tables_crc", tables_crc(offsets, labels, crcs), tmp);
    write_int_attr(file, "shard_index", p.index, tmp);
    write_int_attr(file, "first_image", p.first_image, tmp);
    write_int_attr(file, "complete", 1, tmp);  // last: the shard is whole
    check_status(H5Fflush(file, H5F_SCOPE_GLOBAL), tmp, "flush the file");
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  rename_into_place(tmp, path);
  return offsets.back();
}

struct KeptShard {
  int64_t images = 0, jpeg_bytes = 0;
};

// A shard left by an earlier pack that can be kept: it opens, is complete, and belongs to
// this plan at this position.
std::optional<KeptShard> keepable(const std::string& path, const ShardPlan& p) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  quiet_hdf5();
  try {
    check_before_hdf5(path, /*index=*/false, "shard", "");
  } catch (const Error&) {
    return std::nullopt;  // rewritten
  }
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file.get() < 0) return std::nullopt;
  auto is = [&](const char* name, int64_t v) { return try_int_attr(file, name) == v; };
  if (!is("complete", 1) || !is("format_version", kPackedFormatVersion) ||
      !is("shard_index", p.index) || !is("num_shards", p.num_shards) ||
      !is("plan_hash", static_cast<int64_t>(p.plan_hash)) || !is("first_image", p.first_image))
    return std::nullopt;
  const auto n = try_int_attr(file, "num_images");
  if (!n || H5Lexists(file, "jpeg", H5P_DEFAULT) <= 0) return std::nullopt;
  Hid ds(H5Dopen2(file, "jpeg", H5P_DEFAULT), H5Dclose);
  if (ds.get() < 0) return std::nullopt;
  Hid space(H5Dget_space(ds), H5Sclose);
  hsize_t bytes = 0;
  if (H5Sget_simple_extent_dims(space, &bytes, nullptr) != 1) return std::nullopt;
  return KeptShard{*n, static_cast<int64_t>(bytes)};
}

// Runs fn(i) for i in [0, n) on `threads` threads while the calling thread reports progress
// about once a second through report(done). The first exception (from fn or report) stops
// the work and is rethrown after every thread has finished.
void run_parallel(int64_t n, int64_t threads, const std::function<void(int64_t)>& fn,
                  const std::function<void(int64_t)>& report) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0}, done{0}, finished{0};
  std::atomic<bool> stop{false};
  std::mutex m;
  std::exception_ptr error;
  auto fail = [&] {
    std::lock_guard<std::mutex> lk(m);
    if (!error) error = std::current_exception();
    stop = true;
  };
  const int64_t nt = std::max<int64_t>(1, std::min(threads, n));
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(nt));
  for (int64_t t = 0; t < nt; ++t)
    pool.emplace_back([&] {
      while (!stop.load()) {
        const int64_t i = next.fetch_add(1);
        if (i >= n) break;
        try {
          fn(i);
        } catch (...) {
          fail();
        }
        done.fetch_add(1);
      }
      finished.fetch_add(1);
    });
  // Poll (no condition variable to miss): report about once a second until every worker is
  // out of its loop, then join.
  auto last = std::chrono::steady_clock::now();
  while (finished.load() < nt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto now = std::chrono::steady_clock::now();
    if (report && !stop.load() && now - last >= std::chrono::seconds(1)) {
      last = now;
      try {
        report(done.load());
      } catch (...) {
        fail();
      }
    }
  }
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

PackResult pack_image_folder(const std::string& root, const std::string& prefix,
                             const PackOptions& o) {
  DLTRAIN_CHECK(o.max_side >= 0, "pack_image_folder: max_side must be >= 0 (0 keeps every ",
                "image's bytes), got ", o.max_side);
  DLTRAIN_CHECK(o.quality >= 1 && o.quality <= 100,
                "pack_image_folder: quality must be in 1..100, got ", o.quality);
  DLTRAIN_CHECK(o.images_per_shard >= 1, "pack_image_folder: images_per_shard must be >= 1, got ",
                o.images_per_shard);
  DLTRAIN_CHECK(o.num_threads >= 0, "pack_image_folder: num_threads must be >= 0, got ",
                o.num_threads);
  DLTRAIN_CHECK(!prefix.empty() && fs::path(prefix).has_filename(),
                "pack_image_folder: the output prefix '", prefix,
                "' needs a file name part, e.g. out/train");
  const fs::path out_dir =
      fs::path(prefix).has_parent_path() ? fs::path(prefix).parent_path() : fs::path(".");
  DLTRAIN_CHECK(fs::is_directory(out_dir), "pack_image_folder: output directory '",
                out_dir.string(), "' does not exist; create it first");
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };

  // ImageFolder's scan gives torchvision's classes and order (and its errors).
  ImageFolderOptions fo;
  fo.extensions = o.extensions;
  const ImageFolder folder(root, fo);
  std::vector<Source> sources;
  Fnv plan;
  plan.i64(kPackedFormatVersion);
  plan.i64(o.max_side);
  plan.i64(o.quality);
  plan.i64(o.images_per_shard);
  plan.i64(o.on_corrupt == CorruptPolicy::Skip);
  for (const auto& c : folder.classes()) plan.str(c);
  for (const auto& [path, label] : folder.samples()) {
    Source s{path, fs::path(path).lexically_relative(root).generic_string(), label};
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    plan.str(s.rel);
    plan.i64(label);
    plan.i64(ec ? -1 : static_cast<int64_t>(size));
    sources.push_back(std::move(s));
  }
  const int64_t total = static_cast<int64_t>(sources.size());
  const int64_t num_shards = (total + o.images_per_shard - 1) / o.images_per_shard;
  const int64_t threads = o.num_threads > 0 ? o.num_threads : get_num_threads();

  // The index goes first, so no reader mistakes a half-rewritten pack for a whole one; so
  // do temporary files of interrupted runs.
  std::error_code ec;
  fs::remove(packed_index_path(prefix), ec);
  const std::string stem = fs::path(prefix).filename().string() + "-";
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(stem, 0) == 0 && name.find(".h5.tmp-") != std::string::npos)
      fs::remove(entry.path(), ec);
  }

  PackResult r;
  r.shards = num_shards;
  ShardPlan p;
  p.num_shards = num_shards;
  p.max_side = o.max_side;
  p.quality = o.quality;
  p.plan_hash = plan.h;
  p.classes = folder.classes();
  std::vector<int64_t> counts;
  auto progress = [&](int64_t done, bool shard_finished) {
    if (!o.on_progress) return;
    PackProgress pp;
    pp.images_done = done;
    pp.images_total = total;
    pp.shards_done = static_cast<int64_t>(counts.size());
    pp.shards_total = num_shards;
    pp.seconds = elapsed();
    pp.shard_finished = shard_finished;
    o.on_progress(pp);
  };
  for (int64_t k = 0; k < num_shards; ++k) {
    const int64_t begin = k * o.images_per_shard;
    const int64_t end = std::min(total, begin + o.images_per_shard);
    p.index = k;
    p.first_image = r.images;
    const std::string path = packed_shard_path(prefix, k);
    if (o.resume) {
      if (const auto kept = keepable(path, p)) {
        r.images += kept->images;
        r.skipped += (end - begin) - kept->images;
        r.jpeg_bytes += kept->jpeg_bytes;
        ++r.shards_kept;
        counts.push_back(kept->images);
        progress(end, true);
        continue;
      }
    }
    std::vector<Encoded> enc(static_cast<size_t>(end - begin));
    run_parallel(
        end - begin, threads,
        [&](int64_t i) {
          const Source& s = sources[static_cast<size_t>(begin + i)];
          Encoded e = encode_one(s, o);
          if (e.corrupt && o.on_corrupt == CorruptPolicy::Error)
            DLTRAIN_FAIL("pack_image_folder: cannot decode '", s.path, "': ", e.error,
                         ". Fix or delete the file, or pack with on_corrupt = "
                         "CorruptPolicy::Skip (dltrain-pack --skip-corrupt) to leave such files "
                         "out");
          enc[static_cast<size_t>(i)] = std::move(e);
        },
        [&](int64_t done) { progress(begin + done, false); });
    for (const Encoded& e : enc) {
      r.skipped += e.corrupt;
      r.resized += e.resized;
      r.source_bytes += e.source_bytes;
    }
    r.jpeg_bytes += write_shard(path, p, enc, sources, begin);
    const int64_t n = static_cast<int64_t>(
        std::count_if(enc.begin(), enc.end(), [](const Encoded& e) { return !e.corrupt; }));
    r.images += n;
    ++r.shards_written;
    counts.push_back(n);
    progress(end, true);
  }
  DLTRAIN_CHECK(r.images > 0, "pack_image_folder: none of the ", total, " files under '", root,
                "' could be decoded; are they JPEGs?");

  const std::string index = packed_index_path(prefix), tmp = tmp_name(index);
  try {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    quiet_hdf5();
    Hid file = create_file(tmp, /*index=*/true);
    write_common_attrs(file, p, r.images, tmp);
    write_dataset(file, "shard_counts", H5T_NATIVE_INT64, H5T_STD_I64LE, counts.size(),
                  counts.data(), tmp);
    check_status(H5Fflush(file, H5F_SCOPE_GLOBAL), tmp, "flush the file");
    check_status(H5Fclose(file.release()), tmp, "close the file (disk full?)");
    io::detail::stamp_verified_header(tmp, index_kind(), kPackedFormatVersion);  // and fsync
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  rename_into_place(tmp, index);
  r.seconds = elapsed();
  return r;
}

namespace {

PackedIndex read_index_body(const std::string& prefix, uint64_t& plan_hash) {
  quiet_hdf5();
  const std::string path = packed_index_path(prefix);
  Hid file = open_readonly(path, /*index=*/true, "index file",
                           "pack the folder with dltrain-pack (a pack writes its index last: if "
                           "one was interrupted, run it again with --resume)");
  PackedIndex ix;
  check_version(file, path);
  ix.format_version = read_int_attr(file, "format_version", path);
  ix.num_images = read_int_attr(file, "num_images", path);
  ix.max_side = read_int_attr(file, "max_side", path);
  ix.quality = read_int_attr(file, "quality", path);
  plan_hash = static_cast<uint64_t>(read_int_attr(file, "plan_hash", path));
  const int64_t shards = read_int_attr(file, "num_shards", path);
  DLTRAIN_CHECK(shards >= 1 && ix.num_images >= 1, "packed dataset index '", path, "' lists ",
                shards, " shards and ", ix.num_images, " images; the file is corrupt");
  ix.classes = read_strings(file, "classes", path);
  ix.shard_counts = read_ints(file, "shard_counts", static_cast<hsize_t>(shards), path);
  int64_t sum = 0;
  for (int64_t k = 0; k < shards; ++k) {
    ix.shard_files.push_back(packed_shard_path(prefix, k));
    const int64_t c = ix.shard_counts[static_cast<size_t>(k)];
    DLTRAIN_CHECK(c >= 0 && c <= ix.num_images - sum, "packed dataset index '", path, "': shard ",
                  k, " holds ", c, " of its ", ix.num_images, " images; the file is corrupt");
    sum += c;
  }
  DLTRAIN_CHECK(sum == ix.num_images, "packed dataset index '", path, "': its shard counts sum to ",
                sum, " but it says ", ix.num_images, " images; the file is corrupt");
  return ix;
}

// Runs fn(); a dltrain::Error from it that does not say how to repair the file gets `fix`
// appended (the HDF5 and attribute checks name the file, not the pack's remedy).
template <class F>
auto with_fix(const char* fix, F&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find("dltrain-pack") != std::string::npos) throw;
    DLTRAIN_FAIL(what, "; ", fix);
  }
}

// read_packed_index plus the plan hash, with hdf5_mutex() held.
PackedIndex read_index_locked(const std::string& prefix, uint64_t& plan_hash) {
  return with_fix("repack with dltrain-pack", [&] { return read_index_body(prefix, plan_hash); });
}

}  // namespace

PackedIndex read_packed_index(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  uint64_t hash = 0;
  return read_index_locked(prefix, hash);
}

// --- PackedImageDataset ----------------------------------------------------------------

// Lazily opened shard files, shared by all threads. The HDF5 handles are only touched with
// hdf5_mutex() held; the plain descriptors of direct reads with fd_mutex held (only to look
// them up: a reader keeps its shared_ptr, so an evicted descriptor closes after its last read).
struct PackedImageDataset::Shards {
  struct Fd {
    int fd = -1;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  };
  // Per shard: the byte offset of its `jpeg` data in the file, or -1 to read through HDF5.
  std::vector<int64_t> direct;
  std::mutex fd_mutex;
  std::vector<std::shared_ptr<const Fd> > fds;
  std::vector<uint64_t> fd_last_use;
  int64_t fds_open = 0;
  uint64_t fd_tick = 0;

  // Shard k's descriptor (opening it; dropping the least recently used one at the cap).
  std::shared_ptr<const Fd> fd(int64_t k, const std::string& path, int64_t max_open) {
    std::lock_guard<std::mutex> lock(fd_mutex);
    auto& slot = fds[static_cast<size_t>(k)];
    if (!slot) {
      if (fds_open >= max_open) {
        size_t lru = fds.size();
        for (size_t i = 0; i < fds.size(); ++i)
          if (fds[i] && (lru == fds.size() || fd_last_use[i] < fd_last_use[lru])) lru = i;
        fds[lru].reset();
        --fds_open;
      }
      auto f = std::make_shared<Fd>();
      f->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      DLTRAIN_CHECK(f->fd >= 0, "PackedImageDataset: cannot open shard '", path,
                    "': ", std::strerror(errno),
                    "; check that the pack is still there and readable, or raise the open-files "
                    "limit (ulimit -n) or lower PackedOptions::max_open_shards");
      slot = std::move(f);
      ++fds_open;
    }
    fd_last_use[static_cast<size_t>(k)] = ++fd_tick;
    return slot;
  }

  struct Open {
    Hid file, jpeg, space;  // destroyed in reverse: space, jpeg, then file
    uint64_t last_use = 0;
  };
  std::vector<Open> open;
  int64_t open_count = 0, max_open = 16;
  uint64_t tick = 0;

  // The open shard k (opening it, and closing the least recently used one when at the cap).
  Open& get(int64_t k, const std::string& path) {
    Open& s = open[static_cast<size_t>(k)];
    if (s.file.get() < 0) {
      if (open_count >= max_open) {
        Open* lru = nullptr;
        for (auto& o : open)
          if (o.file.get() >= 0 && (!lru || o.last_use < lru->last_use)) lru = &o;
        *lru = Open{};
        --open_count;
      }
      Open fresh;
      fresh.file = open_readonly(path, /*index=*/false, "shard",
                                 "repack it (delete it and run dltrain-pack --resume)");
      fresh.jpeg = open_dataset(fresh.file, "jpeg", path);
      fresh.space = Hid(check_id(H5Dget_space(fresh.jpeg), path, "read a dataspace"), H5Sclose);
      s = std::move(fresh);
      ++open_count;
    }
    s.last_use = ++tick;
    return s;
  }
};

PackedImageDataset::PackedImageDataset(std::string prefix, PackedOptions options)
    : prefix_(std::move(prefix)), options_(std::move(options)), shards_(new Shards) {
  options_.transform.check();
  DLTRAIN_CHECK(options_.max_open_shards >= 0,
                "PackedImageDataset: max_open_shards must be >= 0 (0: automatic), got ",
                options_.max_open_shards);
  if (options_.max_open_shards > 0) {
    shards_->max_open = options_.max_open_shards;
  } else {
    rlimit lim{};
    const bool known = ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY;
    shards_->max_open = known ? std::max<int64_t>(16, static_cast<int64_t>(lim.rlim_cur / 2)) : 512;
  }
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  uint64_t plan_hash = 0;
  index_ = read_index_locked(prefix_, plan_hash);
  const int64_t num_shards = static_cast<int64_t>(index_.shard_counts.size());
  shards_->open.resize(static_cast<size_t>(num_shards));
  shards_->direct.assign(static_cast<size_t>(num_shards), -1);
  shards_->fds.resize(static_cast<size_t>(num_shards));
  shards_->fd_last_use.assign(static_cast<size_t>(num_shards), 0);
  first_.push_back(0);
  for (int64_t k = 0; k < num_shards; ++k) {
    with_fix("delete it and run dltrain-pack --resume to rewrite it",
             [&] { check_shard(k, plan_hash); });
  }
}

void PackedImageDataset::check_shard(int64_t k, uint64_t plan_hash) {
  const int64_t num_shards = static_cast<int64_t>(index_.shard_counts.size());
  const int64_t num_classes = static_cast<int64_t>(index_.classes.size());
  const std::string& path = index_.shard_files[static_cast<size_t>(k)];
  const int64_t n = index_.shard_counts[static_cast<size_t>(k)];
  Hid file = open_readonly(path, /*index=*/false, "shard",
                           "the pack is incomplete or damaged: run dltrain-pack again with "
                           "--resume to rewrite the shards that are missing or do not open");
  check_version(file, path);
  const auto attr = [&](const char* name) { return read_int_attr(file, name, path); };
  DLTRAIN_CHECK(attr("complete") == 1, "packed dataset shard '", path,
                "' was not completely written; run dltrain-pack again with --resume");
  DLTRAIN_CHECK(attr("shard_index") == k && attr("num_shards") == num_shards &&
                    static_cast<uint64_t>(attr("plan_hash")) == plan_hash,
                "packed dataset shard '", path, "' is shard ", attr("shard_index"), " of ",
                attr("num_shards"), " of a different pack than its index '",
                packed_index_path(prefix_), "' (shard ", k, " of ", num_shards,
                "); were packs mixed in one place? Repack the folder");
  DLTRAIN_CHECK(attr("num_images") == n && attr("first_image") == first_.back(),
                "packed dataset shard '", path, "' holds ", attr("num_images"),
                " images starting at ", attr("first_image"), " but the index '",
                packed_index_path(prefix_), "' says ", n, " starting at ", first_.back(),
                "; repack the folder");
  DLTRAIN_CHECK(n >= 0 && static_cast<hsize_t>(n) < file_size(file, path), "packed dataset shard '",
                path, "': the index '", packed_index_path(prefix_), "' says it holds ", n,
                " images, more than its size allows; repack the folder");
  auto off = read_ints(file, "offsets", static_cast<hsize_t>(n + 1), path);
  auto lab = read_ints(file, "labels", static_cast<hsize_t>(n), path);
  auto crc = read_crcs(file, static_cast<hsize_t>(n), path);
  const auto stored = read_int_attr(file, "tables_crc", path);
  DLTRAIN_CHECK(tables_crc(off, lab, crc) == stored, "packed dataset shard '", path,
                "' is corrupt: its offsets, labels or CRCs do not match their CRC-32 (",
                tables_crc(off, lab, crc), ", recorded ", stored,
                "); delete it and run dltrain-pack --resume");
  Hid jpeg = open_dataset(file, "jpeg", path);
  const hsize_t bytes = dataset_length(jpeg, path, "jpeg");
  DLTRAIN_CHECK(off.front() == 0 && static_cast<hsize_t>(off.back()) == bytes &&
                    std::is_sorted(off.begin(), off.end()) && bytes <= file_size(file, path),
                "packed dataset shard '", path,
                "': its image offsets do not tile its JPEG data; the file is corrupt");
  for (int64_t l : lab)
    DLTRAIN_CHECK(l >= 0 && l < num_classes, "packed dataset shard '", path, "': label ", l,
                  " is outside the ", num_classes, " classes; the file is corrupt");
  // Direct reads when the bytes lie in one contiguous, unfiltered run of 1-byte elements.
  if (bytes > 0) {
    Hid dcpl(H5Dget_create_plist(jpeg), H5Pclose);
    Hid type(H5Dget_type(jpeg), H5Tclose);
    if (dcpl.get() >= 0 && type.get() >= 0 && H5Pget_layout(dcpl) == H5D_CONTIGUOUS &&
        H5Pget_nfilters(dcpl) == 0 && H5Tget_size(type) == 1) {
      const haddr_t at = H5Dget_offset(jpeg);
      DLTRAIN_CHECK(
          at != HADDR_UNDEF && at <= file_size(file, path) && bytes <= file_size(file, path) - at,
          "packed dataset shard '", path, "': its JPEG data (", bytes, " bytes at offset ",
          at == HADDR_UNDEF ? -1 : static_cast<int64_t>(at),
          ") lies past its end; the file is truncated or corrupt: delete it and run "
          "dltrain-pack --resume");
      shards_->direct[static_cast<size_t>(k)] = static_cast<int64_t>(at);
    }
  }
  offsets_.insert(offsets_.end(), off.begin(), off.end());
  labels_.insert(labels_.end(), lab.begin(), lab.end());
  crcs_.insert(crcs_.end(), crc.begin(), crc.end());
  first_.push_back(first_.back() + n);
}

PackedImageDataset::~PackedImageDataset() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  shards_.reset();
}

std::pair<int64_t, int64_t> PackedImageDataset::locate(int64_t index) const {
  DLTRAIN_CHECK(index >= 0 && index < size(), "PackedImageDataset: index ", index,
                " is out of range for ", size(), " samples in '", prefix_, "'");
  const auto it = std::upper_bound(first_.begin(), first_.end(), index) - 1;
  const int64_t k = it - first_.begin();
  return {k, index - *it};
}

void PackedImageDataset::read_into(int64_t index, std::vector<uint8_t>& out) const {
  const auto [k, pos] = locate(index);
  const size_t at = static_cast<size_t>(first_[static_cast<size_t>(k)] + k + pos);
  const hsize_t start = static_cast<hsize_t>(offsets_[at]);
  hsize_t count = static_cast<hsize_t>(offsets_[at + 1] - offsets_[at]);
  out.resize(count);
  const std::string& path = index_.shard_files[static_cast<size_t>(k)];
  if (const int64_t base = shards_->direct[static_cast<size_t>(k)]; base >= 0) {
    const auto fd = shards_->fd(k, path, shards_->max_open);
    size_t got = 0;
    while (got < count) {
      const ssize_t r = ::pread(fd->fd, out.data() + got, count - got,
                                static_cast<off_t>(base + static_cast<int64_t>(start + got)));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    if (got == count) return check_crc(index, out);
    std::string src = "unknown: the shard's paths do not read either";
    try {
      src = source_path(index);
    } catch (const Error&) {
    }
    DLTRAIN_FAIL("PackedImageDataset: cannot read sample ", index, " (source '", src, "') from '",
                 path, "': ", got, " of ", count, " bytes read",
                 "; the shard is truncated or corrupt: delete it and run dltrain-pack --resume");
  }
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  quiet_hdf5();
  Shards::Open& s = shards_->get(k, path);
  check_status(H5Sselect_hyperslab(s.space, H5S_SELECT_SET, &start, nullptr, &count, nullptr), path,
               "select an image's bytes");
  Hid mem(H5Screate_simple(1, &count, nullptr), H5Sclose);
  if (H5Dread(s.jpeg, H5T_NATIVE_UINT8, mem, s.space, H5P_DEFAULT, out.data()) < 0) {
    const std::string src = read_strings(s.file, "paths", path, pos).at(0);
    DLTRAIN_FAIL("PackedImageDataset: cannot read sample ", index, " (source '", src, "') from '",
                 path,
                 "'; the shard is truncated or corrupt: delete it and run dltrain-pack "
                 "--resume");
  }
  check_crc(index, out);
}

void PackedImageDataset::check_crc(int64_t index, const std::vector<uint8_t>& bytes) const {
  const uint32_t crc = io::detail::crc32_update(0, bytes.data(), bytes.size());
  const uint32_t want = crcs_[static_cast<size_t>(index)];
  if (crc == want) return;
  const auto [k, pos] = locate(index);
  (void)pos;
  std::string src = "unknown: the shard's paths do not read either";
  try {
    src = source_path(index);
  } catch (const Error&) {
  }
  DLTRAIN_FAIL("PackedImageDataset: sample ", index, " (source '", src, "') in '",
               index_.shard_files[static_cast<size_t>(k)],
               "' is corrupt: its JPEG bytes have CRC-32 ", crc, " but had ", want,
               " when packed; delete the shard and run dltrain-pack --resume");
}

std::vector<uint8_t> PackedImageDataset::read_jpeg(int64_t index) const {
  std::vector<uint8_t> out;
  read_into(index, out);
  return out;
}

std::string PackedImageDataset::source_path(int64_t index) const {
  const auto [k, pos] = locate(index);
  const std::string& path = index_.shard_files[static_cast<size_t>(k)];
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  quiet_hdf5();
  return read_strings(shards_->get(k, path).file, "paths", path, pos).at(0);
}

Batch PackedImageDataset::get_batch_for_epoch(const std::vector<int64_t>& indices,
                                              int64_t epoch) const {
  DLTRAIN_CHECK(!indices.empty(), "PackedImageDataset::get_batch: the index list is empty");
  DLTRAIN_CHECK(epoch >= 0, "PackedImageDataset::get_batch: epoch must be >= 0, got ", epoch);
  for (int64_t i : indices) locate(i);
  const int64_t n = static_cast<int64_t>(indices.size()), s = options_.transform.size;
  const int64_t sample_bytes = s * s * 3;
  Tensor data = empty({n, s, s, 3}, DType::u8);
  Tensor target = empty({n}, DType::i64);
  uint8_t* d = data.data<uint8_t>();
  int64_t* t = target.data<int64_t>();
  auto body = [&](int64_t b, int64_t e) {
    thread_local std::vector<uint8_t> buf;
    for (int64_t i = b; i < e; ++i) {
      const int64_t j = indices[static_cast<size_t>(i)];
      read_into(j, buf);
      try {
        options_.transform.apply_jpeg(buf.data(), buf.size(), options_.seed, epoch, j,
                                      d + i * sample_bytes);
      } catch (const Error& err) {
        const auto [k, pos] = locate(j);
        (void)pos;
        DLTRAIN_FAIL("PackedImageDataset: sample ", j, " (source '", source_path(j), "') in '",
                     index_.shard_files[static_cast<size_t>(k)], "' does not decode: ", err.what(),
                     ". The shard is corrupt: delete it and run dltrain-pack --resume");
      }
      t[i] = labels_[static_cast<size_t>(j)];
    }
  };
  for_each_sample(n, body);
  return {data, target};
}

Example PackedImageDataset::get(int64_t index) const {
  Batch b = get_batch_for_epoch({index}, epoch());
  return {b.data.select(0, 0), b.target.select(0, 0)};
}

void detail::set_packed_int_attribute(const std::string& path, const std::string& name,
                                      int64_t value) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  quiet_hdf5();
  Hid file(check_id(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), path, "open the file"),
           H5Fclose);
  write_int_attr(file, name.c_str(), value, path);
  check_status(H5Fclose(file.release()), path, "close the file");
  // An index gets its header (CRC) again, as if dltrain had written the change.
  char magic[16] = {};
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    const size_t got = std::fread(magic, 1, sizeof magic, f);
    std::fclose(f);
    if (got == sizeof magic && std::memcmp(magic, index_kind().magic, 16) == 0)
      io::detail::stamp_verified_header(path, index_kind(), kPackedFormatVersion);
  }
}

#endif  // DLTRAIN_WITH_HDF5

}  // namespace dltrain::data
