// Classic vision datasets held in memory: MNIST / Fashion-MNIST (IDX files) and
// CIFAR-10 (its binary version), plus the CIFAR-10 writer tests and tools use.
//
// Each dataset is a TensorDataset loaded eagerly in its constructor: images are
// float32 [N, C, H, W] scaled to [0, 1] and optionally normalised per channel
// ((x - mean) / std), targets are int64 [N] in [0, 10). Loading is one read of
// each file followed by one parallel u8 -> f32 pass. Any missing, truncated or
// inconsistent file raises dltrain::Error naming the file and what was wrong.
#pragma once

#include <string>
#include <vector>

#include "dltrain/data/dataset.hpp"

namespace dltrain::data {

/// How image datasets convert pixels: x = (u8 / 255 - mean[c]) / std[c]. Empty
/// vectors mean no normalisation; otherwise each holds 1 value (all channels) or
/// one per channel, and every std is > 0. Usual values: MNIST 0.1307 / 0.3081,
/// Fashion-MNIST 0.2860 / 0.3530, CIFAR-10 {0.4914, 0.4822, 0.4465} /
/// {0.2470, 0.2435, 0.2616}.
struct ImageOptions {
  std::vector<float> mean;
  std::vector<float> std;
};

/// MNIST or Fashion-MNIST (same file layout) from `root`, which holds
/// `{train,t10k}-images-idx3-ubyte` and `{train,t10k}-labels-idx1-ubyte`, each
/// plain or with a `.gz` suffix. data(): float32 [N, 1, 28, 28]; targets(): int64 [N].
class MNIST : public TensorDataset {
 public:
  /// Loads the train (60000) or test (10000) split. Throws dltrain::Error when a file
  /// is missing (naming the paths tried), an image file is not u8 [N, 28, 28], a label
  /// file is not u8 [N], the counts differ, or a label is >= 10.
  MNIST(const std::string& root, bool train, const ImageOptions& options = {});
  /// Number of classes (10).
  static constexpr int64_t num_classes = 10;
};

/// CIFAR-10, binary version, from `root` (or `root/cifar-10-batches-bin`): train
/// reads data_batch_1.bin .. data_batch_5.bin, test reads test_batch.bin. Each record
/// is 1 label byte then 3072 pixel bytes (R plane, G plane, B plane, 32x32 row-major).
/// data(): float32 [N, 3, 32, 32]; targets(): int64 [N].
class CIFAR10 : public TensorDataset {
 public:
  /// Loads the train (50000 in the real set) or test split. Throws dltrain::Error
  /// naming the file when one is missing, its size is not a positive multiple of
  /// 3073 bytes ("truncated or corrupt", with the size), or a label is >= 10.
  CIFAR10(const std::string& root, bool train, const ImageOptions& options = {});
  /// Number of classes (10).
  static constexpr int64_t num_classes = 10;
};

/// Writes images u8 [N, 3, 32, 32] and integer labels [N] (values in [0, 10)) as a
/// CIFAR-10 binary batch file. Throws dltrain::Error naming `path` on a wrong dtype,
/// shape or label, or a file that cannot be written.
void write_cifar10_binary(const std::string& path, const Tensor& images_u8, const Tensor& labels);

}  // namespace dltrain::data
