// dltrain-pack: packs an image folder (one sub-folder per class, ImageNet's layout) into
// HDF5 shards of pre-resized JPEG bytes plus an index (see include/dltrain/data/packed.hpp),
// which data::PackedImageDataset reads with a few open files instead of one per image; and
// lists a pack.
//
//   dltrain-pack IMAGE_DIR OUT_PREFIX [--max-side 512] [--quality 90] [--per-shard 1024]
//                [--threads N] [--resume] [--skip-corrupt]
//   dltrain-pack --list PREFIX
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "apps/common/cli.hpp"
#include "dltrain/data/packed.hpp"

namespace {

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// "12.3 MiB", or KiB below 1 MiB.
std::string human(int64_t bytes) {
  char buf[32];
  if (bytes < 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(bytes) / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", mib(bytes));
  return buf;
}

int list(const std::string& prefix) {
  const auto ix = dltrain::data::read_packed_index(prefix);
  std::printf(
      "packed dataset %s: format %lld, %lld images, %zu classes, %zu shards "
      "(max side %lld, quality %lld)\n",
      prefix.c_str(), static_cast<long long>(ix.format_version),
      static_cast<long long>(ix.num_images), ix.classes.size(), ix.shard_files.size(),
      static_cast<long long>(ix.max_side), static_cast<long long>(ix.quality));
  int64_t total = 0;
  for (size_t k = 0; k < ix.shard_files.size(); ++k) {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(ix.shard_files[k], ec);
    total += ec ? 0 : static_cast<int64_t>(bytes);
    std::printf("  %s  %6lld images  %12s\n", ix.shard_files[k].c_str(),
                static_cast<long long>(ix.shard_counts[k]),
                ec ? "(missing)" : human(static_cast<int64_t>(bytes)).c_str());
  }
  std::printf("classes:");
  for (const auto& c : ix.classes) std::printf(" %s", c.c_str());
  std::printf("\ntotal %s\n", human(total).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string root, prefix, list_prefix;
  dltrain::data::PackOptions o;
  bool skip_corrupt = false;
  dltrain::cli::Flags f(
      "dltrain-pack",
      "Writes OUT_PREFIX-00000.h5, ... (JPEG bytes, labels, offsets, source paths) and "
      "OUT_PREFIX-index.h5 (written last) from an image folder (one sub-folder per class); or "
      "lists a pack with --list PREFIX.");
  f.add("IMAGE_DIR", &root, "the image folder (IMAGE_DIR/<class>/*.JPEG)");
  f.add("OUT_PREFIX", &prefix, "the pack's path prefix");
  f.group("Packing");
  f.add("--max-side", &o.max_side,
        "images with a longer side are resized to it and re-encoded (0 keeps every image's bytes)")
      .min(0);
  f.add("--quality", &o.quality, "JPEG quality of re-encoded images (1-100)").min(1);
  f.add("--per-shard", &o.images_per_shard, "images per shard file").positive();
  f.add("--threads", &o.num_threads, "decode/encode threads (0: all cores)").min(0);
  f.add_switch("--resume", &o.resume,
               "keep the shards an earlier, interrupted run of the same command completed");
  f.add_switch("--skip-corrupt", &skip_corrupt,
               "leave undecodable files out (counted) instead of stopping");
  f.group("Listing");
  f.add("--list", &list_prefix, "list the pack at PREFIX instead of packing").value_name("PREFIX");
  f.parse(argc, argv);
  if (o.quality > 100) f.fail("--quality: '" + std::to_string(o.quality) + "' must be <= 100");
  if (skip_corrupt) o.on_corrupt = dltrain::data::CorruptPolicy::Skip;
  if (list_prefix.empty() && (root.empty() || prefix.empty()))
    f.fail("IMAGE_DIR and OUT_PREFIX are required (or --list PREFIX)");
  try {
    if (!list_prefix.empty()) return list(list_prefix);
    o.on_progress = [](const dltrain::data::PackProgress& p) {
      const double rate = p.seconds > 0 ? static_cast<double>(p.images_done) / p.seconds : 0;
      std::printf("shard %lld/%lld%s  images %lld/%lld  %.0f images/s  %.0f s\n",
                  static_cast<long long>(p.shards_done), static_cast<long long>(p.shards_total),
                  p.shard_finished ? " done" : "", static_cast<long long>(p.images_done),
                  static_cast<long long>(p.images_total), rate, p.seconds);
      std::fflush(stdout);
    };
    const auto r = dltrain::data::pack_image_folder(root, prefix, o);
    std::printf(
        "packed %lld images into %lld shards (%lld written, %lld kept from an earlier "
        "run) at %s-*.h5 in %.1f s: %lld resized to max side %lld, %lld corrupt files "
        "skipped, %s of JPEG",
        static_cast<long long>(r.images), static_cast<long long>(r.shards),
        static_cast<long long>(r.shards_written), static_cast<long long>(r.shards_kept),
        prefix.c_str(), r.seconds, static_cast<long long>(r.resized),
        static_cast<long long>(o.max_side), static_cast<long long>(r.skipped),
        human(r.jpeg_bytes).c_str());
    if (r.source_bytes > 0)
      std::printf(" (sources of the written shards: %s)", human(r.source_bytes).c_str());
    std::printf("\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dltrain-pack: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
