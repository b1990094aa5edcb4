// RankLayout: how the ranks of a job are divided among pipeline stages, data-parallel replicas
// and tensor-parallel shards, and the process groups of each dimension.
//
// The world's N = P x D x T ranks are numbered with the tensor dimension fastest, then data,
// then pipeline (Megatron-LM's order: the ranks of a tensor-parallel group, which talk most, are
// neighbours, so they share a node): world rank = t + T * (d + D * p) for stage p, replica d and
// tensor rank t. Each rank belongs to exactly one group of each dimension: its pipeline group
// (the P ranks with its (d, t), ranked by stage), its data group (the D ranks with its (p, t),
// ranked by replica) and its tensor group (the T ranks with its (p, d)). A dimension of size 1
// still gets a group (of one rank), so code never special-cases it. Building the layout is
// collective over the parent group (three split() calls, in the same order on every rank).
#pragma once

#include <memory>
#include <string>

#include "dltrain/distributed/process_group.hpp"

namespace dltrain::distributed {

struct RankLayoutOptions {
  /// Pipeline stages P (>= 1).
  int pipeline = 1;
  /// Data-parallel replicas D; 0 = what is left: parent size / (P x T).
  int data = 0;
  /// Tensor-parallel shards T (>= 1).
  int tensor = 1;
  /// The group to divide; null = default_group().
  ProcessGroup* parent = nullptr;
  /// Rank 0 of the parent prints the layout (str()) on stdout once.
  bool print = true;
};

class RankLayout {
 public:
  /// Checks that P x D x T equals the parent's size and builds the three groups. Collective
  /// over the parent. Throws dltrain::Error (on every rank alike) for sizes that do not
  /// multiply to the number of ranks, naming the sizes that would.
  explicit RankLayout(const RankLayoutOptions& options = {});

  int pipeline_size() const { return p_; }
  int data_size() const { return d_; }
  int tensor_size() const { return t_; }
  /// This rank's coordinates: its stage, replica and tensor rank.
  int stage() const { return stage_; }
  int replica() const { return replica_; }
  int tensor_rank() const { return tensor_rank_; }
  /// The parent rank at the given coordinates; throws when one is out of range.
  int rank_of(int stage, int replica, int tensor_rank) const;

  /// This rank's groups (a dimension of size 1 gives a group of one).
  ProcessGroup& pipeline_group() const { return *pipeline_; }
  ProcessGroup& data_group() const { return *data_; }
  ProcessGroup& tensor_group() const { return *tensor_; }
  std::shared_ptr<ProcessGroup> pipeline_group_ptr() const { return pipeline_; }
  std::shared_ptr<ProcessGroup> data_group_ptr() const { return data_; }
  std::shared_ptr<ProcessGroup> tensor_group_ptr() const { return tensor_; }

  /// "4 ranks = 2 pipeline stages x 2 data-parallel replicas x 1 tensor-parallel shard", then
  /// one line per stage listing its ranks by replica and tensor rank.
  std::string str() const;

 private:
  int p_ = 1, d_ = 1, t_ = 1, size_ = 1;
  int stage_ = 0, replica_ = 0, tensor_rank_ = 0;
  std::shared_ptr<ProcessGroup> pipeline_, data_, tensor_;
};

}  // namespace dltrain::distributed
