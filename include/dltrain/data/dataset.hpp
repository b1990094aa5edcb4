// Dataset: the indexable source a DataLoader draws from, and TensorDataset, the
// in-memory one.
//
// A Dataset maps an index in [0, size()) to an Example (data, target). get() and
// get_batch() are const and must be safe to call from several threads at once
// (DataLoader workers do), so a dataset keeps no mutable state. get_batch(indices)
// returns the stacked examples in the order of `indices`; its default stacks get()
// results, and in-memory datasets override it with one gather, which is the hot
// path of every epoch. Datasets never hand out tensors that require grad.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dltrain/core/tensor.hpp"

namespace dltrain::data {

/// One sample: `data` (e.g. an image [C, H, W]) and its `target` (e.g. a 0-d int64
/// class label). `target` is undefined for datasets without targets.
struct Example {
  Tensor data;
  Tensor target;
};

/// A batch of samples stacked along a new leading dimension: data [B, ...] and
/// target [B, ...] (undefined when the dataset has no targets). Batches that are more than
/// {data, target} (a graph batch: edge indices, the node-to-graph vector, ...) carry the rest
/// as named `fields`; DataLoader pins them and DevicePrefetcher copies them exactly as data and
/// target, so a dataset's get_batch is the collate function (see data/graph.hpp).
struct Batch {
  Tensor data;
  Tensor target;
  /// Further named tensors, in insertion order (names unique).
  std::vector<std::pair<std::string, Tensor>> fields{};
  /// Number of samples when it is not data.size(0) (a graph batch's graphs, not its nodes);
  /// -1: data.size(0).
  int64_t num_samples = -1;
  /// Number of samples in the batch (num_samples when set, else data.size(0)).
  int64_t size() const { return num_samples >= 0 ? num_samples : data.size(0); }
  /// The field `name`; throws dltrain::Error listing the fields present when absent.
  const Tensor& field(const std::string& name) const;
  bool has_field(const std::string& name) const;
  /// Sets field `name` (replacing one of that name, else appending); returns *this.
  Batch& set_field(const std::string& name, Tensor t);
};

/// Abstract indexable dataset. Implementations override size() and get(), and
/// in-memory ones also get_batch(). All three must be thread-safe.
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of samples.
  virtual int64_t size() const = 0;
  /// Sample `index`, 0 <= index < size(); throws dltrain::Error naming the index and
  /// the size otherwise.
  virtual Example get(int64_t index) const = 0;
  /// Samples `indices` (in that order, repeats allowed) stacked into a Batch. The
  /// default stacks get() results with dltrain::stack (targets too, unless every
  /// target is undefined); it throws dltrain::Error on an empty index list, an index
  /// out of range, or examples whose shapes differ.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;
};

/// A dataset over tensors held in memory: sample i is (data[i], targets[i]).
/// get() returns views that share the dataset's storage; get_batch() gathers the
/// rows with one parallel memcpy per batch (CPU tensors) into fresh tensors.
class TensorDataset : public Dataset {
 public:
  /// `data` [N, ...] and `targets` [N, ...]. Both are detached and made contiguous.
  /// Throws dltrain::Error when either is undefined or 0-d, or when their first
  /// dimensions differ (the message names both shapes).
  TensorDataset(Tensor data, Tensor targets);
  /// A dataset without targets (Example::target and Batch::target are undefined).
  explicit TensorDataset(Tensor data);

  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  /// All samples [N, ...].
  const Tensor& data() const { return data_; }
  /// All targets [N, ...] (undefined for a dataset without targets).
  const Tensor& targets() const { return targets_; }

 private:
  Tensor data_;
  Tensor targets_;
  int64_t size_ = 0;
};

/// Rows `indices` of `t` along dim 0 as a fresh contiguous tensor [indices.size(), ...]:
/// one memcpy per row, split over the CPU pool (index_select for other devices). Throws
/// dltrain::Error naming `what`, the bad index and the size when an index is out of range.
Tensor gather_rows(const Tensor& t, const std::vector<int64_t>& indices, const char* what);

}  // namespace dltrain::data
