// Packed image datasets: an image folder re-encoded once into a few large HDF5 shard files
// (pack_image_folder, tools/dltrain-pack), and PackedImageDataset, which reads them with a
// handful of open files instead of a million small ones.
//
// Format (version 2). A pack with prefix PREFIX is the files
//   PREFIX-00000.h5, PREFIX-00001.h5, ...   the shards, each holding consecutive images
//   PREFIX-index.h5                          written last: the pack is complete
// Every file's root group carries the int64 attributes `format_version` (2), `num_shards`,
// `num_images` (its own images for a shard, all of them for the index), `max_side`,
// `quality` and `plan_hash` (a 64-bit hash of the source listing, file sizes and the pack
// options; a shard belongs to the index with the same hash), and the dataset `classes`
// (fixed-length strings [C], the class names; a dataset rather than an attribute, which
// HDF5 limits to 64 KiB). A shard also has the attributes `shard_index`,
// `first_image` (the packed index of its first image), `tables_crc` (the CRC-32 of its
// offsets, labels and crc32 data as stored, in that order) and `complete` (1, written last),
// and the datasets
//   jpeg     uint8 [total bytes]   every image's JPEG bytes, concatenated (contiguous)
//   offsets  int64 [n + 1]         image i is jpeg[offsets[i], offsets[i + 1])
//   labels   int64 [n]             class index of image i
//   crc32    uint32 [n]            zlib's CRC-32 of image i's JPEG bytes
//   sources  int64 [n]             image i's index in the source folder's listing
//   paths    fixed-length string [n]   image i's path relative to the source folder
// The index holds `shard_counts` int64 [num_shards]. Images are in the source folder's
// ImageFolder order (torchvision's), so packed image i is ImageFolder sample i unless
// CorruptPolicy::Skip dropped a corrupt source before it. An image whose longer side
// exceeds max_side is decoded (DCT-scaled to no less than max_side), resized bilinearly so
// that its longer side is max_side, and re-encoded at `quality` (4:2:0); any other image
// keeps its original bytes.
//
// Integrity (issue 16): every file is written with HDF5 format bounds [1.8, 1.10]
// (superblock v2 and v2 object headers, which HDF5 checksums; h5py on HDF5 1.10 reads them).
// The index starts with dltrain's verified header, a 512-byte HDF5 user block holding the
// magic "dltrain pack\r\n\x1a\n" and the CRC-32 of the whole file, checked before HDF5
// opens it. A shard is checked before HDF5 opens it for a superblock of version 2 or later
// whose recorded size fits the file; its tables against `tables_crc` when the dataset opens;
// and each image's bytes against `crc32` at every read. So a damaged file gives a
// dltrain::Error naming it and the fix, never a crash inside HDF5 or silently altered data
// (the `paths` and `sources` strings, used only in messages, are not covered). Packs of
// format 1 (no header, superblock v0) are refused with "repack with dltrain-pack"; a
// resumed pack rewrites their shards.
//
// Writing is crash-safe per shard: each shard is written to a temporary file that gets
// its `complete` attribute last and is fsynced and renamed into place, and the index is
// removed when packing starts and written after the last shard. Packing again with
// `resume` keeps every shard that opens, is complete and has the same plan hash, and
// rewrites the others (a shard cut off mid-write never got its final name).
//
// HDF5 in a serial build is not thread-safe, so every HDF5 call made here holds one
// process-wide mutex; JPEG decoding and transforms run outside it, in parallel. Without
// HDF5 (io::hdf5_supported() == false) the functions here raise dltrain::Error saying to
// install libhdf5-dev and rebuild.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dltrain/data/dataloader.hpp"
#include "dltrain/data/image_folder.hpp"
#include "dltrain/data/transforms.hpp"

namespace dltrain::data {

/// The packed format version this dltrain writes and the newest it reads.
inline constexpr int64_t kPackedFormatVersion = 2;

/// Progress of pack_image_folder, passed to PackOptions::on_progress.
struct PackProgress {
  /// Source images handled (packed, skipped as corrupt, or in a kept shard) / in total.
  int64_t images_done = 0;
  int64_t images_total = 0;
  /// Shards finished (written or kept) / in total.
  int64_t shards_done = 0;
  int64_t shards_total = 0;
  /// Seconds since packing started.
  double seconds = 0;
  /// True once per shard, right after it was written or kept; false for the periodic
  /// reports in between.
  bool shard_finished = false;
};

/// pack_image_folder configuration.
struct PackOptions {
  /// Longer side, in pixels, above which an image is resized and re-encoded; 0 keeps every
  /// image's original bytes.
  int64_t max_side = 512;
  /// JPEG quality (1..100) of re-encoded images.
  int quality = 90;
  /// Source images per shard (the last shard holds the rest; Skip may leave fewer).
  int64_t images_per_shard = 1024;
  /// Threads decoding and re-encoding; 0 uses get_num_threads().
  int64_t num_threads = 0;
  /// Keep the shards a previous pack of the same folder with the same options completed.
  bool resume = false;
  /// What to do with a source file that is not a decodable JPEG: Error names it, Skip
  /// leaves it out and counts it in PackResult::skipped.
  CorruptPolicy on_corrupt = CorruptPolicy::Error;
  /// File extensions to pack (ImageFolder's rule).
  std::vector<std::string> extensions{".jpg", ".jpeg", ".JPEG"};
  /// Called on the calling thread after each shard and about once a second while one is
  /// being encoded. An exception it throws stops packing (the finished shards stay, so a
  /// later resume continues).
  std::function<void(const PackProgress&)> on_progress;
};

/// What pack_image_folder did.
struct PackResult {
  /// Images in the pack, and corrupt sources left out (CorruptPolicy::Skip).
  int64_t images = 0;
  int64_t skipped = 0;
  /// Images re-encoded because their longer side exceeded max_side (this run only).
  int64_t resized = 0;
  /// Shards in the pack, written by this run, and kept from an earlier one (resume).
  int64_t shards = 0;
  int64_t shards_written = 0;
  int64_t shards_kept = 0;
  /// Bytes of JPEG data in the pack, and of the source files packed by this run.
  int64_t jpeg_bytes = 0;
  int64_t source_bytes = 0;
  double seconds = 0;
};

/// Packs the image folder `root` (ImageFolder's layout and ordering) into the shards and
/// index of `prefix` (see the file comment; the directory of prefix must exist). Throws
/// dltrain::Error naming the path on an unreadable or empty folder, a corrupt source with
/// CorruptPolicy::Error, bad options, or a file that cannot be written; shards finished
/// before the error stay on disk for a resume.
PackResult pack_image_folder(const std::string& root, const std::string& prefix,
                             const PackOptions& options = {});

/// What a pack's index says (read_packed_index).
struct PackedIndex {
  int64_t format_version = 0;
  int64_t num_images = 0;
  int64_t max_side = 0;
  int64_t quality = 0;
  std::vector<std::string> classes;
  /// Per shard: its file name and number of images.
  std::vector<std::string> shard_files;
  std::vector<int64_t> shard_counts;
};

/// The shard file name of shard `shard` of `prefix`: PREFIX-00003.h5.
std::string packed_shard_path(const std::string& prefix, int64_t shard);
/// The index file name of `prefix`: PREFIX-index.h5.
std::string packed_index_path(const std::string& prefix);

/// Reads PREFIX-index.h5 (not the shards). Throws dltrain::Error naming the file when it is
/// missing (an unfinished pack), not a pack index, truncated or corrupt (its CRC), of format 1
/// (repack) or of a newer format version.
PackedIndex read_packed_index(const std::string& prefix);

/// PackedImageDataset configuration.
struct PackedOptions {
  /// The per-sample transform (default: the ImageNet training pipeline).
  ImagePipeline transform = ImagePipeline::train(224);
  /// Seed of the augmentation streams.
  uint64_t seed = 0;
  /// Most shard files held open at once (least recently used closed first); 0: half the
  /// process's open-file limit (RLIMIT_NOFILE), at least 16.
  int64_t max_open_shards = 0;
};

/// A packed image dataset; batches are those of ImageFolder: u8 [N, size, size, 3] (NHWC)
/// and int64 targets [N], sample i augmented from SampleRandom(seed, epoch, i). So a pack
/// that kept the original bytes (max_side 0 or large enough, nothing skipped) gives
/// bitwise the batches of ImageFolder on the source folder. Construction reads the index
/// and every shard's offsets and labels and checks them; a shard file is then opened on
/// first use and shared by all threads (HDF5 already shares one file descriptor per file
/// inside a process). Each sample's bytes are one hyperslab read under the HDF5 mutex, then
/// decoded and transformed outside it. get/get_batch are const and thread-safe.
class PackedImageDataset : public EpochDataset {
 public:
  /// Opens the pack `prefix`. Throws dltrain::Error naming the file and the fix when the
  /// index or a shard is missing, not HDF5, truncated or corrupt (CRCs, HDF5's checksums), of
  /// format 1 or a newer format version, or does not match the index (counts, shard numbers,
  /// plan hash), or when options.transform is invalid.
  explicit PackedImageDataset(std::string prefix, PackedOptions options = {});
  ~PackedImageDataset() override;
  PackedImageDataset(const PackedImageDataset&) = delete;
  PackedImageDataset& operator=(const PackedImageDataset&) = delete;

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  /// Sample `index` of the current epoch: data u8 [size, size, 3], target int64 0-d.
  Example get(int64_t index) const override;
  /// data u8 [N, size, size, 3] and targets int64 [N]. Decodes in parallel over the CPU
  /// pool, or serially on a DataLoader worker thread. Throws dltrain::Error on an empty
  /// list, an index out of range, or an image that fails to read, fails its CRC-32 or does not
  /// decode (naming the shard file, the sample and its source path).
  Batch get_batch_for_epoch(const std::vector<int64_t>& indices, int64_t epoch) const override;

  /// The stored JPEG bytes of sample `index`. Throws as get_batch.
  std::vector<uint8_t> read_jpeg(int64_t index) const;
  /// The source path of sample `index`, relative to the packed folder (read from its shard).
  std::string source_path(int64_t index) const;

  /// Class names; the class index is the position.
  const std::vector<std::string>& classes() const { return index_.classes; }
  /// The class index of every sample.
  const std::vector<int64_t>& targets() const { return labels_; }
  /// The pack's index (shard files and counts, max_side, quality).
  const PackedIndex& index() const { return index_; }
  const std::string& prefix() const { return prefix_; }
  const PackedOptions& options() const { return options_; }

 private:
  struct Shards;
  // Reads sample `index`'s bytes into `out` (pread, or HDF5 under its mutex).
  void read_into(int64_t index, std::vector<uint8_t>& out) const;
  // Opens shard k (with hdf5_mutex() held), checks it against the index and appends its
  // offsets, labels and CRCs.
  void check_shard(int64_t k, uint64_t plan_hash);
  // Throws naming the sample and its shard unless `bytes` have sample `index`'s CRC-32.
  void check_crc(int64_t index, const std::vector<uint8_t>& bytes) const;
  // (shard, position in the shard) of a sample index.
  std::pair<int64_t, int64_t> locate(int64_t index) const;

  std::string prefix_;
  PackedOptions options_;
  PackedIndex index_;
  std::vector<int64_t> labels_;
  // first_[k] is the index of shard k's first sample; first_.back() == size().
  std::vector<int64_t> first_;
  // Per sample, its byte offset in its shard's `jpeg` dataset (n + 1 per shard, packed).
  std::vector<int64_t> offsets_;
  // Per sample, the CRC-32 of its JPEG bytes (the shard's `crc32`).
  std::vector<uint32_t> crcs_;
  std::unique_ptr<Shards> shards_;
};

}  // namespace dltrain::data
