// The shared helpers of the packed dataset files (src/data/packed_format.hpp).
#include "src/data/packed_format.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "dltrain/core/error.hpp"
#include "src/io/crc32.hpp"

namespace dltrain::data::packed_file {

namespace fs = std::filesystem;

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
                                      int64_t i) {
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

// The CRC of the tables a reader keeps of a shard (its `tables_crc` attribute).
int64_t tables_crc(const std::vector<int64_t>& offsets, const std::vector<int64_t>& labels,
                   const std::vector<uint32_t>& crcs) {
  uint32_t c = io::detail::crc32_update(0, offsets.data(), offsets.size() * sizeof(int64_t));
  c = io::detail::crc32_update(c, labels.data(), labels.size() * sizeof(int64_t));
  c = io::detail::crc32_update(c, crcs.data(), crcs.size() * sizeof(uint32_t));
  return c;
}

}  // namespace dltrain::data::packed_file
