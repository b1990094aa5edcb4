// Packed image datasets: a pack of a generated image folder reads back as the same
// classes, labels, order, bytes and batches as ImageFolder on that folder; max_side
// resizing; shard splitting; resume after an interruption (only the missing or broken
// shards are rewritten, and the result equals a fresh pack byte for byte); errors naming
// the file for missing, truncated, corrupt, foreign and newer-format files; the LRU cap on
// open shards; DataLoader batches with and without workers; and (issue 16) corrupt,
// truncated and old-format files, which must give a dltrain::Error naming the file and the
// fix, never a crash or silently altered data. In a build without HDF5
// every test only checks that the functions raise the error saying how to get it.
#include <catch2/catch.hpp>
#ifdef DLTRAIN_TEST_HDF5
#include <hdf5.h>
#endif

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "data/data_test_util.hpp"
#include "dltrain/data/augment.hpp"
#include "dltrain/data/dataloader.hpp"
#include "dltrain/data/image.hpp"
#include "dltrain/data/image_folder.hpp"
#include "dltrain/data/packed.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/io/checkpoint.hpp"
#include "src/data/packed_attribute.hpp"

using namespace dltrain;
using namespace dltrain::data;
using Catch::Contains;
using dltrain::testing::read_bytes;
using dltrain::testing::TempDir;
using dltrain::testing::write_bytes;
namespace fs = std::filesystem;

namespace {

// Skips a test in a build without TurboJPEG or HDF5, after checking that the packed-data
// functions then say what to install.
#define REQUIRE_PACKED()                                                                  \
  do {                                                                                    \
    if (!io::hdf5_supported()) {                                                          \
      REQUIRE_THROWS_WITH(PackedImageDataset("/nonexistent/p"), Contains("libhdf5-dev")); \
      REQUIRE_THROWS_WITH(pack_image_folder("/nonexistent", "/nonexistent/p"),            \
                          Contains("libhdf5-dev"));                                       \
      REQUIRE_THROWS_WITH(read_packed_index("/nonexistent/p"), Contains("libhdf5-dev"));  \
      WARN("this build has no HDF5: packed datasets are not tested");                     \
      return;                                                                             \
    }                                                                                     \
    if (!jpeg_supported()) {                                                              \
      WARN("this build has no TurboJPEG: packed datasets are not tested");                \
      return;                                                                             \
    }                                                                                     \
  } while (0)

// A generated folder of `classes` x `per_class` JPEGs, shorter sides in [48, 80].
void make_folder(const std::string& dir, int64_t classes = 3, int64_t per_class = 8) {
  Generator g(21);
  const int64_t n = 10 * per_class;
  const Tensor images = randint(0, 256, {n, 28, 28}, DType::u8, &g);
  std::vector<int64_t> lab;
  for (int64_t i = 0; i < n; ++i) lab.push_back(i % classes);
  MakeImageFolderOptions mo;
  mo.classes = classes;
  mo.per_class = per_class;
  mo.size = 64;
  mo.seed = 3;
  REQUIRE(write_image_folder(dir, images, from_vector(lab, {n}), mo) == classes * per_class);
}

std::vector<int> pixels(const Tensor& t) { return t.contiguous().to_vector<int>(); }

std::vector<std::string> relative_paths(const ImageFolder& f) {
  std::vector<std::string> out;
  for (const auto& s : f.samples())
    out.push_back(fs::path(s.first).lexically_relative(f.root()).generic_string());
  return out;
}

PackOptions pack_opts(int64_t per_shard, int64_t max_side = 0) {
  PackOptions o;
  o.images_per_shard = per_shard;
  o.max_side = max_side;
  o.num_threads = 2;
  return o;
}

// Every file of a pack (shards and index), by name.
std::map<std::string, std::vector<uint8_t>> pack_files(const std::string& prefix) {
  std::map<std::string, std::vector<uint8_t>> out;
  const std::string stem = fs::path(prefix).filename().string();
  for (const auto& e : fs::directory_iterator(fs::path(prefix).parent_path())) {
    const std::string name = e.path().filename().string();
    if (name.rfind(stem + "-", 0) == 0) out[name.substr(stem.size())] = read_bytes(e.path());
  }
  return out;
}

void truncate_file(const std::string& path, double keep) {
  const auto bytes = read_bytes(path);
  write_bytes(path, std::vector<uint8_t>(bytes.begin(),
                                         bytes.begin() + static_cast<long>(bytes.size() * keep)));
}

}  // namespace

TEST_CASE("A packed folder reads back as ImageFolder reads the folder", "[packed]") {
  REQUIRE_PACKED();
  TempDir dir("packed_same");
  const std::string root = dir.file("images"), prefix = dir.file("train");
  make_folder(root);
  std::vector<int64_t> shard_sizes;
  PackOptions po = pack_opts(10);
  po.on_progress = [&](const PackProgress& p) {
    REQUIRE(p.images_total == 24);
    REQUIRE(p.shards_total == 3);
    if (p.shard_finished) shard_sizes.push_back(p.images_done);
  };
  const PackResult r = pack_image_folder(root, prefix, po);
  REQUIRE(r.images == 24);
  REQUIRE(r.shards == 3);
  REQUIRE(r.shards_written == 3);
  REQUIRE(r.shards_kept == 0);
  REQUIRE(r.resized == 0);
  REQUIRE(r.skipped == 0);
  REQUIRE(shard_sizes == std::vector<int64_t>{10, 20, 24});

  ImageFolderOptions fo;
  fo.transform = ImagePipeline::eval(80, 64);
  const ImageFolder folder(root, fo);
  int64_t source_bytes = 0;
  for (const auto& s : folder.samples())
    source_bytes += static_cast<int64_t>(fs::file_size(s.first));
  REQUIRE(r.jpeg_bytes == source_bytes);
  REQUIRE(r.source_bytes == source_bytes);

  const PackedIndex ix = read_packed_index(prefix);
  REQUIRE(ix.format_version == kPackedFormatVersion);
  REQUIRE(ix.num_images == 24);
  REQUIRE(ix.max_side == 0);
  REQUIRE(ix.quality == 90);
  REQUIRE(ix.classes == image_folder_class_names(3));
  REQUIRE(ix.shard_counts == std::vector<int64_t>{10, 10, 4});
  REQUIRE(ix.shard_files == std::vector<std::string>{prefix + "-00000.h5", prefix + "-00001.h5",
                                                     prefix + "-00002.h5"});
  for (const auto& f : ix.shard_files) REQUIRE(fs::exists(f));
  REQUIRE(fs::exists(prefix + "-index.h5"));

  PackedOptions o;
  o.transform = ImagePipeline::eval(80, 64);
  PackedImageDataset ds(prefix, o);
  REQUIRE(ds.size() == 24);
  REQUIRE(ds.classes() == folder.classes());
  REQUIRE(ds.targets() == folder.targets());
  const auto rel = relative_paths(folder);
  for (int64_t i = 0; i < 24; ++i) {
    REQUIRE(ds.source_path(i) == rel[static_cast<size_t>(i)]);
    REQUIRE(ds.read_jpeg(i) == read_bytes(folder.samples()[static_cast<size_t>(i)].first));
  }

  // Eval batches: bitwise those of ImageFolder, in any order, across shards.
  const std::vector<int64_t> idx{23, 0, 11, 10, 9, 5, 20, 19, 2};
  const Batch a = ds.get_batch(idx), b = folder.get_batch(idx);
  REQUIRE(a.data.shape() == Shape{9, 64, 64, 3});
  REQUIRE(a.data.dtype() == DType::u8);
  REQUIRE(a.target.to_vector<int64_t>() == std::vector<int64_t>{2, 0, 1, 1, 1, 0, 2, 2, 0});
  REQUIRE(a.target.to_vector<int64_t>() == b.target.to_vector<int64_t>());
  REQUIRE(pixels(a.data) == pixels(b.data));
  const Example e = ds.get(11);
  REQUIRE(e.target.item<int64_t>() == 1);
  REQUIRE(pixels(e.data) == pixels(a.data.select(0, 2)));

  // Training augmentation is a function of (seed, epoch, index), so it matches too.
  PackedOptions to;
  to.transform = ImagePipeline::train(48);
  to.seed = 7;
  ImageFolderOptions tfo;
  tfo.transform = ImagePipeline::train(48);
  tfo.seed = 7;
  const PackedImageDataset tds(prefix, to);
  const ImageFolder tfolder(root, tfo);
  const Batch t2 = tds.get_batch_for_epoch(idx, 2);
  REQUIRE(pixels(t2.data) == pixels(tfolder.get_batch_for_epoch(idx, 2).data));
  REQUIRE(pixels(t2.data) != pixels(tds.get_batch_for_epoch(idx, 3).data));
  // With augmentations after the crop and flip (issue 30): the same pure function.
  const std::vector<std::shared_ptr<const Augmentation>> augs{
      make_auto_augment("trivial"), std::make_shared<RandomErasing>(RandomErasing::imagenet(0.5))};
  to.transform.augment = augs;
  tfo.transform.augment = augs;
  const PackedImageDataset ads(prefix, to);
  const ImageFolder afolder(root, tfo);
  const Batch a2 = ads.get_batch_for_epoch(idx, 2);
  REQUIRE(pixels(a2.data) == pixels(afolder.get_batch_for_epoch(idx, 2).data));
  REQUIRE(pixels(a2.data) != pixels(t2.data));

  REQUIRE_THROWS_WITH(ds.get_batch({24}), Contains("index 24 is out of range for 24"));
  REQUIRE_THROWS_WITH(ds.get_batch({}), Contains("empty"));
  REQUIRE_THROWS_WITH(ds.read_jpeg(-1), Contains("index -1 is out of range"));
}

TEST_CASE("Packing resizes images longer than max_side and keeps the others' bytes", "[packed]") {
  REQUIRE_PACKED();
  TempDir dir("packed_resize");
  const std::string root = dir.file("images"), prefix = dir.file("p");
  make_folder(root);
  const int64_t max_side = 80;
  const PackResult r = pack_image_folder(root, prefix, pack_opts(7, max_side));
  REQUIRE(r.shards == 4);
  const ImageFolder folder(root);
  PackedOptions o;
  o.transform = ImagePipeline::eval(40, 32);
  const PackedImageDataset ds(prefix, o);
  REQUIRE(ds.index().max_side == max_side);
  int64_t resized = 0, kept = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto orig = read_bytes(folder.samples()[static_cast<size_t>(i)].first);
    const auto packed = ds.read_jpeg(i);
    const ImageInfo a = read_jpeg_header(orig), b = read_jpeg_header(packed);
    const int64_t long_side = std::max(a.width, a.height);
    if (long_side <= max_side) {
      REQUIRE(packed == orig);
      ++kept;
      continue;
    }
    ++resized;
    REQUIRE(packed != orig);
    REQUIRE(std::max(b.width, b.height) == max_side);
    // The shorter side keeps the aspect ratio (rounded).
    const int64_t short_side = std::min(a.width, a.height);
    const int64_t expect = (short_side * max_side + long_side / 2) / long_side;
    REQUIRE(std::min(b.width, b.height) == expect);
    REQUIRE((a.width >= a.height) == (b.width >= b.height));
    // The pixels are the bilinear downscale of the original, up to JPEG loss.
    const Image want = resize(decode_jpeg(orig), b.height, b.width);
    const Image got = decode_jpeg(packed);
    double se = 0;
    for (size_t k = 0; k < got.pixels.size(); ++k) {
      const double d = double(got.pixels[k]) - double(want.pixels[k]);
      se += d * d;
    }
    const double psnr = 10 * std::log10(255.0 * 255.0 * double(got.pixels.size()) / se);
    REQUIRE(psnr > 30);
  }
  REQUIRE(resized == r.resized);
  REQUIRE(resized > 0);
  REQUIRE(kept > 0);
  REQUIRE(ds.get_batch({0, 23}).data.shape() == Shape{2, 32, 32, 3});
}

TEST_CASE("Interrupted packs resume, rewriting only missing or broken shards", "[packed]") {
  REQUIRE_PACKED();
  TempDir dir("packed_resume");
  const std::string root = dir.file("images"), prefix = dir.file("out/train"),
                    fresh = dir.file("fresh/train");
  make_folder(root);
  fs::create_directories(dir.file("out"));
  fs::create_directories(dir.file("fresh"));
  REQUIRE(pack_image_folder(root, fresh, pack_opts(5)).shards_written == 5);
  const auto fresh_files = pack_files(fresh);
  REQUIRE(fresh_files.size() == 6);  // 5 shards + index

  // Interrupt after the second shard: the callback throws, as a Ctrl-C handler might.
  PackOptions po = pack_opts(5);
  po.on_progress = [](const PackProgress& p) {
    if (p.shard_finished && p.shards_done == 2) throw std::runtime_error("interrupted");
  };
  REQUIRE_THROWS_WITH(pack_image_folder(root, prefix, po), Contains("interrupted"));
  REQUIRE(fs::exists(prefix + "-00001.h5"));
  REQUIRE_FALSE(fs::exists(prefix + "-00002.h5"));
  REQUIRE_FALSE(fs::exists(prefix + "-index.h5"));
  REQUIRE_THROWS_WITH(PackedImageDataset(prefix), Contains(prefix + "-index.h5") &&
                                                      Contains("missing") && Contains("--resume"));
  // A temporary file a killed writer left behind is removed.
  write_bytes(prefix + "-00002.h5.tmp-999999", {1, 2, 3});

  PackOptions resume = pack_opts(5);
  resume.resume = true;
  PackResult r = pack_image_folder(root, prefix, resume);
  REQUIRE(r.shards_written == 3);
  REQUIRE(r.shards_kept == 2);
  REQUIRE(r.images == 24);
  REQUIRE_FALSE(fs::exists(prefix + "-00002.h5.tmp-999999"));
  REQUIRE(pack_files(prefix) == fresh_files);
  REQUIRE(read_packed_index(prefix).shard_counts == std::vector<int64_t>{5, 5, 5, 5, 4});

  // Nothing to do: every shard is kept and none is touched.
  std::vector<fs::file_time_type> mtimes;
  for (int k = 0; k < 5; ++k) mtimes.push_back(fs::last_write_time(packed_shard_path(prefix, k)));
  r = pack_image_folder(root, prefix, resume);
  REQUIRE(r.shards_written == 0);
  REQUIRE(r.shards_kept == 5);
  REQUIRE(r.images == 24);
  REQUIRE(r.jpeg_bytes == pack_image_folder(root, fresh, resume).jpeg_bytes);

  // A truncated shard and a shard without its completion mark are rewritten, nothing else.
  truncate_file(packed_shard_path(prefix, 3), 0.5);
  data::detail::set_packed_int_attribute(packed_shard_path(prefix, 1), "complete", 0);
  REQUIRE_THROWS_WITH(PackedImageDataset(prefix),
                      Contains(packed_shard_path(prefix, 1)) && Contains("not completely written"));
  mtimes[1] = fs::last_write_time(packed_shard_path(prefix, 1));
  r = pack_image_folder(root, prefix, resume);
  REQUIRE(r.shards_written == 2);
  REQUIRE(r.shards_kept == 3);
  for (int k : {0, 2, 4})
    REQUIRE(fs::last_write_time(packed_shard_path(prefix, k)) == mtimes[static_cast<size_t>(k)]);
  REQUIRE(pack_files(prefix) == fresh_files);
  REQUIRE(PackedImageDataset(prefix).size() == 24);

  // Other options make another plan: every shard is rewritten.
  PackOptions other = resume;
  other.max_side = 60;
  r = pack_image_folder(root, prefix, other);
  REQUIRE(r.shards_written == 5);
  REQUIRE(r.shards_kept == 0);
  REQUIRE(read_packed_index(prefix).max_side == 60);
  // And without resume, everything is rewritten even when it could be kept.
  other.resume = false;
  REQUIRE(pack_image_folder(root, prefix, other).shards_written == 5);
}

TEST_CASE("Packed dataset errors name the file and the fix", "[packed]") {
  REQUIRE_PACKED();
  TempDir dir("packed_errors");
  const std::string root = dir.file("images"), prefix = dir.file("p");
  make_folder(root);
  const PackOptions po = pack_opts(10);
  auto repack = [&] { pack_image_folder(root, prefix, po); };
  repack();
  const std::string s0 = packed_shard_path(prefix, 0), s1 = packed_shard_path(prefix, 1),
                    s2 = packed_shard_path(prefix, 2), index = packed_index_path(prefix);

  fs::remove(s1);
  REQUIRE_THROWS_WITH(PackedImageDataset(prefix),
                      Contains(s1) && Contains("missing") && Contains("--resume"));
  repack();
  truncate_file(s2, 0.6);
  REQUIRE_THROWS_WITH(PackedImageDataset(prefix), Contains(s2) && Contains("truncated"));
  repack();
  {
    auto bytes = read_bytes(s0);
    std::fill(bytes.begin(), bytes.begin() + 4096, uint8_t{0});
    write_bytes(s0, bytes);
  }
  REQUIRE_THROWS_WITH(PackedImageDataset(prefix), Contains(s0) && Contains("not an HDF5 file"));
  repack();
  data::detail::set_packed_int_attribute(s0, "format_version", 99);
  REQUIRE_THROWS_WITH(PackedImageDataset(prefix),
                      Contains(s0) && Contains("format 99") && Contains("upgrade dltrain"));
  repack();
  data::detail::set_packed_int_attribute(index, "format_version", kPackedFormatVersion + 1);
  const std::string newer = "format " + std::to_string(kPackedFormatVersion + 1);
  REQUIRE_THROWS_WITH(PackedImageDataset(prefix), Contains(index) && Contains(newer));
  REQUIRE_THROWS_WITH(read_packed_index(prefix), Contains(index) && Contains(newer));
  repack();
  data::detail::set_packed_int_attribute(s2, "num_images", 3);
  REQUIRE_THROWS_WITH(PackedImageDataset(prefix), Contains(s2) && Contains("holds 3 images") &&
                                                      Contains("index") && Contains("says 4"));
  repack();
  // A shard of another pack (other options) in this pack's place.
  {
    const std::string other = dir.file("other");
    pack_image_folder(root, other, pack_opts(10, 60));
    fs::copy_file(packed_shard_path(other, 1), s1, fs::copy_options::overwrite_existing);
  }
  REQUIRE_THROWS_WITH(PackedImageDataset(prefix), Contains(s1) && Contains("different pack"));
  repack();
  fs::remove(index);
  REQUIRE_THROWS_WITH(PackedImageDataset(prefix), Contains(index) && Contains("dltrain-pack"));
  repack();

  // Damaged JPEG data inside a shard: found when the sample is read (its CRC-32).
  {
    PackedOptions o;
    o.transform = ImagePipeline::eval(40, 32);
    const PackedImageDataset good(prefix, o);
    const auto jpeg = good.read_jpeg(12);
    const std::string src = good.source_path(12);
    auto bytes = read_bytes(s1);
    const auto at = std::search(bytes.begin(), bytes.end(), jpeg.begin(), jpeg.end());
    REQUIRE(at != bytes.end());
    // An end-of-image marker halfway through the entropy-coded data.
    const auto mid = at + static_cast<long>(jpeg.size() / 2);
    mid[0] = 0xFF;
    mid[1] = 0xD9;
    write_bytes(s1, bytes);
    const PackedImageDataset bad(prefix, o);
    REQUIRE_NOTHROW(bad.get_batch({11, 13}));
    REQUIRE_THROWS_WITH(bad.get_batch({11, 12}), Contains(s1) && Contains("sample 12") &&
                                                     Contains(src) && Contains("corrupt"));
  }
  repack();

  // Corrupt source files: an error naming the file, or skipped and counted.
  const ImageFolder folder(root);
  const std::string victim = folder.samples()[9].first;
  truncate_file(victim, 0.5);
  REQUIRE_THROWS_WITH(pack_image_folder(root, prefix, po),
                      Contains(victim) && Contains("CorruptPolicy::Skip"));
  PackOptions skip = po;
  skip.on_corrupt = CorruptPolicy::Skip;
  const PackResult r = pack_image_folder(root, prefix, skip);
  REQUIRE(r.skipped == 1);
  REQUIRE(r.images == 23);
  REQUIRE(read_packed_index(prefix).shard_counts == std::vector<int64_t>{9, 10, 4});
  const PackedImageDataset ds(prefix);
  REQUIRE(ds.size() == 23);
  auto rel = relative_paths(folder);
  auto labels = folder.targets();
  rel.erase(rel.begin() + 9);
  labels.erase(labels.begin() + 9);
  REQUIRE(ds.targets() == labels);
  for (int64_t i = 0; i < 23; ++i) REQUIRE(ds.source_path(i) == rel[static_cast<size_t>(i)]);

  // Bad options.
  PackOptions bad = po;
  bad.quality = 0;
  REQUIRE_THROWS_WITH(pack_image_folder(root, prefix, bad), Contains("quality"));
  bad = po;
  bad.images_per_shard = 0;
  REQUIRE_THROWS_WITH(pack_image_folder(root, prefix, bad), Contains("images_per_shard"));
  REQUIRE_THROWS_WITH(pack_image_folder(root, dir.file("nodir/p"), po),
                      Contains("nodir") && Contains("does not exist"));
  REQUIRE_THROWS_WITH(pack_image_folder(dir.file("missing"), prefix, po),
                      Contains("missing") && Contains("does not exist"));
}

TEST_CASE("Packed batches: identical with loader workers and with few open shards",
          "[packed][loader]") {
  REQUIRE_PACKED();
  TempDir dir("packed_loader");
  const std::string root = dir.file("images"), prefix = dir.file("p");
  make_folder(root);
  pack_image_folder(root, prefix, pack_opts(4));  // 6 shards
  PackedOptions o;
  o.transform = ImagePipeline::train(48);
  o.seed = 9;
  auto ds = std::make_shared<PackedImageDataset>(prefix, o);
  ImageFolderOptions fo;
  fo.transform = o.transform;
  fo.seed = 9;
  auto folder = std::make_shared<ImageFolder>(root, fo);

  auto run = [](std::shared_ptr<Dataset> d, int64_t workers, int64_t epoch) {
    DataLoaderOptions lo;
    lo.batch_size = 5;
    lo.shuffle = true;
    lo.seed = 4;
    lo.num_workers = workers;
    DataLoader loader(std::move(d), lo);
    loader.set_epoch(epoch);
    std::vector<std::vector<int>> data;
    std::vector<int64_t> targets;
    for (const Batch& b : loader) {
      data.push_back(pixels(b.data));
      for (int64_t t : b.target.to_vector<int64_t>()) targets.push_back(t);
    }
    return std::make_pair(data, targets);
  };
  const auto sync0 = run(ds, 0, 0);
  REQUIRE(sync0.first.size() == 5);
  REQUIRE(sync0.second.size() == 24);
  REQUIRE(run(ds, 2, 0) == sync0);
  REQUIRE(run(folder, 0, 0) == sync0);
  const auto sync1 = run(ds, 0, 1);
  REQUIRE(run(ds, 2, 1) == sync1);
  REQUIRE(sync1.first != sync0.first);
  REQUIRE(sync1.second != sync0.second);

  // With at most 2 shard files open, reads that hop between all 6 still give the same data.
  PackedOptions few = o;
  few.max_open_shards = 2;
  auto small = std::make_shared<PackedImageDataset>(prefix, few);
  REQUIRE(run(small, 2, 0) == sync0);
  const std::vector<int64_t> hop{0, 23, 5, 17, 9, 13, 1, 22, 6};
  REQUIRE(pixels(small->get_batch(hop).data) == pixels(ds->get_batch(hop).data));
}

TEST_CASE("Packed reads: lock-free and concurrent, evicting descriptors, truncation caught",
          "[packed][loader]") {
  REQUIRE_PACKED();
  TempDir dir("packed_pread");
  const std::string root = dir.file("images"), prefix = dir.file("p");
  make_folder(root);
  pack_image_folder(root, prefix, pack_opts(4));  // 6 shards, the source files' bytes kept
  PackedOptions o;
  o.max_open_shards = 2;  // descriptors evicted while other threads read through them
  const PackedImageDataset ds(prefix, o);
  std::vector<std::vector<uint8_t>> expected;
  for (int64_t i = 0; i < ds.size(); ++i)
    expected.push_back(read_bytes((fs::path(root) / ds.source_path(i)).string()));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep)
        for (int64_t i = 0; i < ds.size(); ++i) {
          const int64_t j = (i * (2 * t + 1) + rep) % ds.size();  // a different order per thread
          if (ds.read_jpeg(j) != expected[static_cast<size_t>(j)]) ++mismatches;
        }
    });
  for (auto& th : threads) th.join();
  CHECK(mismatches == 0);

  // A shard cut short after the dataset opened it: a clear error, not garbage bytes.
  const std::string shard = packed_shard_path(prefix, 5);
  truncate_file(shard, 0.5);
  bool failed = false;
  for (int64_t i = 20; i < 24; ++i) {
    try {
      (void)ds.read_jpeg(i);
    } catch (const Error& e) {
      failed = true;
      CHECK_THAT(e.what(), Contains(shard) && Contains("truncated or corrupt") &&
                               Contains("dltrain-pack --resume"));
    }
  }
  CHECK(failed);
}

// Issue 16: the index is checked whole (CRC) and a shard's metadata by HDF5's checksums
// (superblock v2, checked before HDF5 sees the file), its tables and JPEG bytes by dltrain's
// CRCs. Every damaged file gives a dltrain::Error naming the file and the fix.
TEST_CASE("Corrupt, truncated and old-format pack files give errors naming the file and the fix",
          "[packed][corrupt]") {
  REQUIRE_PACKED();
  TempDir dir("packed_corrupt");
  const std::string root = dir.file("images"), prefix = dir.file("p");
  make_folder(root);
  const PackOptions po = pack_opts(10);
  auto repack = [&] { pack_image_folder(root, prefix, po); };
  repack();
  const std::string s0 = packed_shard_path(prefix, 0), index = packed_index_path(prefix);
  const auto good_index = read_bytes(index), good_shard = read_bytes(s0);

  // Round trip, and the layout: the index starts with its verified header and its HDF5 part
  // (superblock v2) at byte 512; a shard starts with a v2 superblock.
  const ImageFolder folder(root);
  std::vector<std::vector<uint8_t>> jpegs;
  {
    const PackedImageDataset ds(prefix);
    REQUIRE(ds.size() == folder.size());
    REQUIRE(ds.targets() == folder.targets());
    for (int64_t i = 0; i < ds.size(); ++i) {
      jpegs.push_back(ds.read_jpeg(i));
      REQUIRE(jpegs.back() == read_bytes(folder.samples()[static_cast<size_t>(i)].first));
    }
  }
  REQUIRE(std::memcmp(good_index.data(), "dltrain pack\r\n\x1a\n", 16) == 0);
  REQUIRE(std::memcmp(good_index.data() + 512, "\x89HDF\r\n\x1a\n", 8) == 0);
  REQUIRE(good_index[512 + 8] == 2);
  REQUIRE(std::memcmp(good_shard.data(), "\x89HDF\r\n\x1a\n", 8) == 0);
  REQUIRE(good_shard[8] == 2);

  auto require_error = [&](const std::string& file, const std::vector<std::string>& words) {
    for (int pass = 0; pass < 2; ++pass) {
      try {
        if (pass == 0)
          (void)PackedImageDataset(prefix);
        else
          (void)read_packed_index(prefix);
        FAIL("no error for a damaged '" << file << "'");
      } catch (const Error& e) {
        const std::string what = e.what();
        CHECK_THAT(what, Contains(file));
        for (const auto& w : words) CHECK_THAT(what, Contains(w));
      }
    }
  };

  // A truncated index, at several lengths (inside the header, the HDF5 part, the end).
  for (const double keep : {0.01, 0.2, 0.5, 0.9, 0.999}) {
    INFO("index truncated to " << keep);
    truncate_file(index, keep);
    require_error(index, {"dltrain-pack"});
    write_bytes(index, good_index);
  }
  // A byte-flipped index: in the magic, the CRC field, the size field, the note, the HDF5
  // superblock, its metadata and data.
  for (const size_t at : {size_t{0}, size_t{21}, size_t{33}, size_t{100}, size_t{512 + 8},
                          size_t{700}, good_index.size() / 2, good_index.size() - 1}) {
    INFO("index byte " << at << " flipped");
    auto bytes = good_index;
    bytes[at] ^= 0x5a;
    write_bytes(index, bytes);
    require_error(index, {"dltrain-pack"});
  }
  write_bytes(index, good_index);

  // A truncated shard, at several lengths.
  for (const double keep : {0.001, 0.01, 0.3, 0.6, 0.95}) {
    INFO("shard truncated to " << keep);
    truncate_file(s0, keep);
    REQUIRE_THROWS_WITH(PackedImageDataset(prefix),
                        Contains(s0) && (Contains("truncated") || Contains("not an HDF5 file")) &&
                            Contains("dltrain-pack"));
    write_bytes(s0, good_shard);
  }

  // A byte flipped anywhere in a shard: every byte of its first KiB (superblock, root object
  // header, ...), then every 61st: an error naming the shard, or exactly the packed data.
  int errors = 0, intact = 0;
  PackedOptions o;
  o.transform = ImagePipeline::eval(16, 16);
  for (size_t at = 0; at < good_shard.size(); at += at < 1024 ? 1 : 61) {
    auto bytes = good_shard;
    bytes[at] ^= 0xff;
    write_bytes(s0, bytes);
    try {
      const PackedImageDataset ds(prefix, o);
      bool same = ds.targets() == folder.targets();
      for (int64_t i = 0; i < ds.size(); ++i)
        same = same && ds.read_jpeg(i) == jpegs[static_cast<size_t>(i)];
      if (!same) FAIL("shard byte " << at << " flipped: the data changed without an error");
      ++intact;
    } catch (const Error& e) {
      INFO("shard byte " << at << " flipped");
      REQUIRE_THAT(e.what(), Contains(s0) && (Contains("dltrain-pack") || Contains("repack")));
      ++errors;
    }
  }
  write_bytes(s0, good_shard);
  INFO("flipped shard bytes: " << errors << " errors, " << intact << " intact");
  CHECK(errors > 600);

  // An old-format pack (format 1, dltrain 0.1: no index header, superblock v0 shards).
  const std::string old = dir.file("old");
  for (const char* name : {"p-index.h5", "p-00000.h5"})
    fs::copy_file(fs::path(DLTRAIN_REFERENCE_DIR) / "data/pack_format1" / name,
                  fs::path(dir.file(std::string("old") + (name + 1))));
  REQUIRE_THROWS_WITH(PackedImageDataset(old), Contains(packed_index_path(old)) &&
                                                   Contains("older dltrain") &&
                                                   Contains("repack with dltrain-pack"));
  REQUIRE_THROWS_WITH(read_packed_index(old),
                      Contains(packed_index_path(old)) && Contains("older dltrain"));
  // An old shard in a new pack.
  fs::copy_file(fs::path(DLTRAIN_REFERENCE_DIR) / "data/pack_format1/p-00000.h5", s0,
                fs::copy_options::overwrite_existing);
  REQUIRE_THROWS_WITH(PackedImageDataset(prefix), Contains(s0) &&
                                                      Contains("superblock of version 0") &&
                                                      Contains("repack with dltrain-pack"));
  // dltrain-pack --resume rewrites it.
  PackOptions resume = po;
  resume.resume = true;
  REQUIRE(pack_image_folder(root, prefix, resume).shards_written == 1);
  REQUIRE(read_bytes(s0) == good_shard);
}

// Issue 28: shards carry no CRC of their own (a pack's are gigabytes); what stands between
// HDF5 and damage is the superblock check (version 2 or later: checksummed metadata), the
// layout check (no chunk index, which HDF5 does not checksum) and the tables' and images'
// CRCs. 1-4 random bytes changed, or a truncation, DLTRAIN_SHARD_MUTATIONS times (default
// 1000; seeded): each must give an error naming the shard, or exactly the packed data. A
// crash fails the test binary.
TEST_CASE("Randomly mutated and truncated shards: an error naming the shard, or the data intact",
          "[packed][corrupt]") {
  REQUIRE_PACKED();
  TempDir dir("packed_mutations");
  const std::string root = dir.file("images"), prefix = dir.file("p");
  make_folder(root, 3, 4);
  pack_image_folder(root, prefix, pack_opts(100));
  const std::string s0 = packed_shard_path(prefix, 0);
  const auto good_shard = read_bytes(s0);
  std::vector<std::vector<uint8_t>> jpegs;
  std::vector<int64_t> targets;
  {
    const PackedImageDataset ds(prefix);
    for (int64_t i = 0; i < ds.size(); ++i) jpegs.push_back(ds.read_jpeg(i));
    targets = ds.targets();
  }
  const char* env_n = std::getenv("DLTRAIN_SHARD_MUTATIONS");
  const int mutations = env_n ? std::atoi(env_n) : 1000;
  std::mt19937_64 rng(28);
  int errors = 0, intact = 0;
  std::vector<std::string> bad;
  for (int m = 0; m < mutations; ++m) {
    auto bytes = good_shard;
    std::string what;
    if (rng() % 8 == 0) {
      bytes.resize(rng() % bytes.size());
      what = "truncated to " + std::to_string(bytes.size());
    } else {
      what = "bytes";
      for (int j = 0, k = 1 + static_cast<int>(rng() % 4); j < k; ++j) {
        const size_t pos = rng() % bytes.size();
        bytes[pos] ^= static_cast<uint8_t>(1 + rng() % 255);
        what += ' ';  // not `" " + to_string`: GCC 12 warns falsely (-Wrestrict) on that
        what += std::to_string(pos);
      }
    }
    write_bytes(s0, bytes);
    try {
      const PackedImageDataset ds(prefix);
      bool same = ds.targets() == targets;
      for (int64_t i = 0; i < ds.size(); ++i)
        same = same && ds.read_jpeg(i) == jpegs[static_cast<size_t>(i)];
      if (same)
        ++intact;
      else
        bad.push_back(what + ": the data changed without an error");
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (msg.find(s0) == std::string::npos)
        bad.push_back(what + ": the error does not name the shard: " + msg);
      ++errors;
    }
  }
  write_bytes(s0, good_shard);
  std::printf("shard mutations: %d of a %zu-byte shard: %d errors naming it, %d intact, %zu bad\n",
              mutations, good_shard.size(), errors, intact, bad.size());
  INFO(bad.size() << " bad; first: " << (bad.empty() ? "" : bad.front()));
  REQUIRE(bad.empty());
}

#ifdef DLTRAIN_TEST_HDF5
TEST_CASE("A shard whose datasets are chunked (another program's layout) is refused",
          "[packed][corrupt]") {
  REQUIRE_PACKED();
  TempDir dir("packed_chunked");
  const std::string root = dir.file("images"), prefix = dir.file("p");
  make_folder(root, 2, 3);
  pack_image_folder(root, prefix, pack_opts(100));
  const std::string s0 = packed_shard_path(prefix, 0);
  // The same values in a chunked dataset: what h5py writes with chunks=True.
  hid_t f = H5Fopen(s0.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t ds = H5Dopen2(f, "labels", H5P_DEFAULT);
  hid_t space = H5Dget_space(ds);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  std::vector<int64_t> labels(n);
  REQUIRE(H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()) >= 0);
  H5Dclose(ds);
  REQUIRE(H5Ldelete(f, "labels", H5P_DEFAULT) >= 0);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  const hsize_t chunk = 2;
  H5Pset_chunk(dcpl, 1, &chunk);
  ds = H5Dcreate2(f, "labels", H5T_STD_I64LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  REQUIRE(ds >= 0);
  REQUIRE(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()) >= 0);
  H5Dclose(ds);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
  REQUIRE_THROWS_WITH(PackedImageDataset(prefix), Contains(s0) && Contains("'labels'") &&
                                                      Contains("chunked or filtered") &&
                                                      Contains("dltrain-pack"));
}
#endif
