// pack_image_folder (dltrain/data/packed.hpp): scan the folder, re-encode in parallel, write
// shards crash-safely (temporary file, fsync, rename), resume an interrupted pack, write the
// index last. File layout and invariants: src/data/packed_format.hpp.
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

#include <functional>
#include "dltrain/core/error.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/data/image.hpp"

#include "src/data/packed_format.hpp"
#include "src/io/crc32.hpp"

namespace dltrain::data {

namespace fs = std::filesystem;
using namespace packed_file;

namespace {

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

}  // namespace dltrain::data
