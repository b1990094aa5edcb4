// Graph data: one graph (node features, edge index, edge features, target), the collate that
// turns a list of graphs into one disjoint-union batch (PyG's Batch.from_data_list), and
// GraphDataset, the in-memory dataset whose get_batch is that collate, so a DataLoader (workers,
// pinning, DevicePrefetcher) delivers graph batches unchanged.
//
// A graph batch travels as a data::Batch: data = x, target = y, fields "edge_index", "batch",
// "ptr" and, when the graphs have them, "edge_attr"; num_samples = the number of graphs.
// GraphBatch is the typed view (GraphBatch::from(batch)). Collation rules (PyG's): x, edge_attr
// and y concatenate along dim 0 (node- or edge-level targets, or graph-level ones given as
// [1, ...]); 0-d targets stack into [B]; edge_index concatenates along dim 1 with each graph's
// node offset added, so edges keep pointing at their own graph's nodes.
#pragma once

#include <cstdint>
#include <vector>

#include "dltrain/data/dataset.hpp"

namespace dltrain::data {

/// One graph. Tensors hold no gradient.
struct Graph {
  /// Node features [N, F].
  Tensor x;
  /// int64 [2, E]: source (row 0) and destination (row 1) node of each edge, in [0, N).
  Tensor edge_index;
  /// Edge features [E, D] (optional).
  Tensor edge_attr;
  /// Target (optional): per node [N, ...], per edge [E, ...], or per graph ([1, ...] or 0-d).
  Tensor y;
};

/// Several graphs as one disjoint graph.
struct GraphBatch {
  /// Node features of all graphs [sum N, F].
  Tensor x;
  /// int64 [2, sum E], node offsets applied.
  Tensor edge_index;
  /// [sum E, D] or undefined.
  Tensor edge_attr;
  /// Targets (concatenated, or 0-d ones stacked) or undefined.
  Tensor y;
  /// int64 [sum N]: the graph each node belongs to (for per-graph pooling: segment_sum(x, batch,
  /// num_graphs)).
  Tensor batch;
  /// int64 [B + 1]: the first node of each graph, then the total node count.
  Tensor ptr;
  int64_t num_graphs = 0;

  /// As a data::Batch (see the file comment for the field names).
  Batch to_batch() const;
  /// The graph batch carried by `b` (made by to_batch or GraphDataset); throws dltrain::Error
  /// naming the missing field when `b` is not one.
  static GraphBatch from(const Batch& b);
  /// A copy on `device` (non_blocking as Tensor::to).
  GraphBatch to(Device device, bool non_blocking = false) const;
};

/// Collates `graphs` (at least one) into one GraphBatch. Throws dltrain::Error naming the
/// graph when one is malformed (x not 2-d, edge_index not int64 [2, E] or pointing outside
/// [0, N), edge_attr rows != E) or when the graphs disagree (feature sizes, dtypes, some with
/// edge_attr or y and some without).
GraphBatch collate_graphs(const std::vector<Graph>& graphs);

/// Graphs held in memory. get(i) is (x, y) of graph i; get_batch(indices) is
/// collate_graphs(...).to_batch() of those graphs, in order.
class GraphDataset : public Dataset {
 public:
  /// Checks every graph as collate_graphs does (on the CPU) and keeps them.
  explicit GraphDataset(std::vector<Graph> graphs);
  int64_t size() const override { return static_cast<int64_t>(graphs_.size()); }
  Example get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  const Graph& graph(int64_t index) const;

 private:
  std::vector<Graph> graphs_;
};

}  // namespace dltrain::data
