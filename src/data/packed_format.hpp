// The packed dataset files (dltrain/data/packed.hpp), as HDF5 sees them: the helpers the
// writer (packed_writer.cpp) and the reader (packed_reader.cpp) share (internal header,
// HDF5 builds only; packed_format.cpp defines them).
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
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dltrain/data/packed.hpp"
#include "src/io/hdf5_util.hpp"
#include "src/io/verified_header.hpp"

namespace dltrain::data::packed_file {

// The lock, quieting, Hid and checks are shared with checkpoints (src/io/hdf5_util.hpp).
using io::h5::hdf5_mutex;
using io::h5::Hid;
using io::h5::sync_path;
using io::h5::try_int_attr;

// HDF5 prints nothing (its errors become dltrain::Errors).
void quiet_hdf5();

hid_t check_id(hid_t id, const std::string& path, const char* what);
void check_status(herr_t st, const std::string& path, const char* what);
void write_int_attr(hid_t loc, const char* name, int64_t v, const std::string& path);
int64_t read_int_attr(hid_t loc, const char* name, const std::string& path);

// The index's verified header (the kind's words for its errors).
io::detail::HeaderKind index_kind();

// Index files start with the verified header, shards with the HDF5 superblock.
Hid create_file(const std::string& path, bool index);

// The size of an open file, for checking lengths read from it before allocating.
hsize_t file_size(hid_t file, const std::string& path);
void write_dataset(hid_t file, const char* name, hid_t mem_type, hid_t file_type, hsize_t n,
                   const void* data, const std::string& path);

// Strings as one fixed-length (null-padded) string dataset.
void write_strings(hid_t file, const char* name, const std::vector<std::string>& v,
                   const std::string& path);
Hid open_dataset(hid_t file, const char* name, const std::string& path);
hsize_t dataset_length(hid_t ds, const std::string& path, const char* name);
std::vector<int64_t> read_ints(hid_t file, const char* name, hsize_t expect,
                               const std::string& path);
std::vector<uint32_t> read_crcs(hid_t file, hsize_t expect, const std::string& path);

// Element `i` of a fixed-length string dataset, or all of them (i < 0).
std::vector<std::string> read_strings(hid_t file, const char* name, const std::string& path,
                                      int64_t i = -1);

// Checks a pack file before HDF5 parses any of it (file comment): the index against its

// verified header, then for every file a superblock of version 2 or later whose recorded end

// of file fits in the file. Plain reads.
void check_before_hdf5(const std::string& path, bool index, const char* role,
                       const std::string& fix);

// Opens an existing file read-only, with errors that say what is wrong with it.
Hid open_readonly(const std::string& path, bool index, const char* role, const std::string& fix);
void check_version(hid_t file, const std::string& path);
void rename_into_place(const std::string& tmp, const std::string& path);
std::string tmp_name(const std::string& path);

// The CRC of the tables a reader keeps of a shard (its `tables_crc` attribute).
int64_t tables_crc(const std::vector<int64_t>& offsets, const std::vector<int64_t>& labels,
                   const std::vector<uint32_t>& crcs);

}  // namespace dltrain::data::packed_file
