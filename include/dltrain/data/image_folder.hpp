// ImageFolder: a folder of JPEGs, one sub-folder per class (torchvision's layout, the
// layout of ImageNet's train/ and val/), decoded and augmented straight into u8 batches;
// and write_image_folder, which builds such a folder from Fashion-MNIST for tests,
// benchmarks and course exercises.
//
// Indexing follows torchvision.datasets.ImageFolder exactly: classes are the
// sub-folder names sorted by code point, class i is the i-th; samples are all files
// whose extension matches (case-insensitively) found by a recursive walk that follows
// symbolic links, ordered by directory path then file name, class by class. Sample i is
// therefore the same file in dltrain and in torchvision. A batch is one u8 tensor
// [N, size, size, 3] (NHWC, what crosses PCIe; normalise with to_float_batch or on the
// GPU) plus int64 targets [N], every sample written in place by the fused
// decode+transform of its ImagePipeline, whose randomness is a pure function of (seed,
// epoch, index). The file list is fixed at construction; get/get_batch are const and
// thread-safe (the skip counter is atomic).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dltrain/data/dataloader.hpp"
#include "dltrain/data/transforms.hpp"

namespace dltrain::data {

/// What ImageFolder does with a file that fails to decode.
enum class CorruptPolicy {
  /// Throw dltrain::Error naming the file and libjpeg's message.
  Error,
  /// Replace the sample by the next decodable one (index + 1, + 2, ... modulo size(), with
  /// that sample's label and augmentation) and count it in skipped().
  Skip,
};

/// ImageFolder configuration.
struct ImageFolderOptions {
  /// The per-sample transform (default: the ImageNet training pipeline).
  ImagePipeline transform = ImagePipeline::train(224);
  /// File extensions to load, compared case-insensitively (torchvision's rule).
  std::vector<std::string> extensions{".jpg", ".jpeg", ".JPEG"};
  /// Seed of the augmentation streams.
  uint64_t seed = 0;
  CorruptPolicy on_corrupt = CorruptPolicy::Error;
};

/// A class-per-folder JPEG dataset; see the file comment.
class ImageFolder : public EpochDataset {
 public:
  /// Scans `root`. Throws dltrain::Error when root is missing or not a directory, holds no
  /// class folder, or a class folder holds no file with an accepted extension (naming the
  /// folder and the extensions), or when options.transform is invalid.
  explicit ImageFolder(std::string root, ImageFolderOptions options = {});

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  /// Sample `index` of the current epoch: data u8 [size, size, 3], target int64 0-d.
  Example get(int64_t index) const override;
  /// data u8 [N, size, size, 3] and targets int64 [N]. Decodes in parallel over the CPU pool,
  /// or serially on a DataLoader worker thread (the workers are the parallelism). Throws
  /// dltrain::Error on an empty list or an index out of range, and on a corrupt file with
  /// CorruptPolicy::Error (naming the path), or when every file fails with Skip.
  Batch get_batch_for_epoch(const std::vector<int64_t>& indices, int64_t epoch) const override;

  /// Class names (sub-folder names), sorted; the class index is the position.
  const std::vector<std::string>& classes() const { return classes_; }
  /// (path, class index) of every sample, in index order.
  const std::vector<std::pair<std::string, int64_t>>& samples() const { return samples_; }
  /// The class index of every sample (torchvision's `targets`).
  std::vector<int64_t> targets() const;
  const std::string& root() const { return root_; }
  const ImageFolderOptions& options() const { return options_; }
  /// How many samples CorruptPolicy::Skip has replaced so far (each occurrence counts).
  int64_t skipped() const { return skipped_.load(); }

 private:
  // Writes the transformed sample `index` to `out`; returns its label (that of the sample
  // actually used, under Skip).
  int64_t load_into(int64_t index, int64_t epoch, uint8_t* out, std::vector<uint8_t>& buf) const;

  std::string root_;
  ImageFolderOptions options_;
  std::vector<std::string> classes_;
  std::vector<std::pair<std::string, int64_t>> samples_;
  mutable std::atomic<int64_t> skipped_{0};
};

/// write_image_folder configuration.
struct MakeImageFolderOptions {
  /// Classes to write (1..10: the Fashion-MNIST classes in label order).
  int64_t classes = 10;
  /// Images per class.
  int64_t per_class = 50;
  /// Mean shorter side of the images, in pixels (each image's is uniform in [0.75, 1.25] x
  /// size, its aspect ratio log-uniform in [3/4, 4/3]).
  int64_t size = 256;
  uint64_t seed = 0;
  /// JPEG quality.
  int quality = 90;
};

/// The folder names write_image_folder uses: "n0000000<c>_<name>" (ImageNet-like wnids, so
/// they sort in label order), name in tshirt, trouser, pullover, dress, coat, sandal, shirt,
/// sneaker, bag, boot.
std::vector<std::string> image_folder_class_names(int64_t classes);

/// Writes a learnable colour JPEG image folder under `out_dir` (created if needed): for
/// each class c, `per_class` Fashion-MNIST images of label c (drawn at random from the
/// split), each upscaled bilinearly to its own random size and aspect ratio and colourised
/// with a random background and foreground colour plus a little noise, saved as
/// out_dir/<class folder>/<class folder>_<k>.JPEG (k = 00000 ...). Deterministic for a seed
/// (images are written in parallel). `images` u8 [N, 28, 28] or f32 [N, 1, 28, 28] in
/// [0, 1] (as data::MNIST holds it) and `labels` integers [N]. Returns the number of files
/// written. Throws dltrain::Error on bad options, too few images of a class, or a file that
/// cannot be written.
int64_t write_image_folder(const std::string& out_dir, const Tensor& images, const Tensor& labels,
                           const MakeImageFolderOptions& options = {});

}  // namespace dltrain::data
