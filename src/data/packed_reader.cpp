// PackedImageDataset and read_packed_index (dltrain/data/packed.hpp): the index and every
// shard checked before HDF5 parses them, samples read by pread() at offsets found once,
// each checked against its CRC. File layout and invariants: src/data/packed_format.hpp.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

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

#include "src/data/packed_attribute.hpp"
#include "src/data/packed_format.hpp"
#include "src/io/crc32.hpp"

namespace dltrain::data {

namespace fs = std::filesystem;
using namespace packed_file;

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

}  // namespace dltrain::data
