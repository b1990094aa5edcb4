// Graph collation (see data/graph.hpp). The checks run once per graph in GraphDataset's
// constructor and again in collate_graphs for graphs built elsewhere; edge indices are read
// on the CPU only (a CUDA graph's indices are not range-checked, as for the indexing ops).
#include "dltrain/data/graph.hpp"

#include <string>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/shape.hpp"

namespace dltrain::data {

namespace {

void check_graph(const Graph& g, size_t k, const Graph& first) {
  const char* op = "collate_graphs";
  DLTRAIN_CHECK(g.x.defined() && g.x.dim() == 2, op, ": graph ", k,
                ": x must be node features [N, F] but is ",
                g.x.defined() ? shape_str(g.x.shape()) : std::string("undefined"));
  DLTRAIN_CHECK(g.edge_index.defined() && g.edge_index.dtype() == DType::i64 &&
                    g.edge_index.dim() == 2 && g.edge_index.size(0) == 2,
                op, ": graph ", k, ": edge_index must be int64 [2, E] but is ",
                g.edge_index.defined() ? shape_str(g.edge_index.shape()) + " " +
                                             std::string(dtype_name(g.edge_index.dtype()))
                                       : std::string("undefined"),
                "; build it with from_vector<int64_t>(..., {2, E})");
  const int64_t N = g.x.size(0), E = g.edge_index.size(1);
  if (g.edge_index.device().is_cpu()) {
    const std::vector<int64_t> ei = g.edge_index.to_vector<int64_t>();
    for (size_t i = 0; i < ei.size(); ++i)
      DLTRAIN_CHECK(ei[i] >= 0 && ei[i] < N, op, ": graph ", k, ": edge ",
                    static_cast<int64_t>(i) % E, " points at node ", ei[i], " but the graph has ",
                    N, " nodes (valid range [0, ", N, "))");
  }
  DLTRAIN_CHECK(g.edge_attr.defined() == first.edge_attr.defined(), op, ": graph ", k,
                g.edge_attr.defined() ? " has" : " has no", " edge_attr but graph 0",
                first.edge_attr.defined() ? " has" : " has none", "; give all graphs or none");
  DLTRAIN_CHECK(g.y.defined() == first.y.defined(), op, ": graph ", k,
                g.y.defined() ? " has" : " has no", " target y but graph 0",
                first.y.defined() ? " has" : " has none", "; give all graphs or none");
  if (g.edge_attr.defined())
    DLTRAIN_CHECK(g.edge_attr.dim() >= 1 && g.edge_attr.size(0) == E, op, ": graph ", k,
                  ": edge_attr must have one row per edge (", E, ") but has shape ",
                  shape_str(g.edge_attr.shape()));
  DLTRAIN_CHECK(g.x.size(1) == first.x.size(1) && g.x.dtype() == first.x.dtype(), op, ": graph ", k,
                " has node features ", shape_str(g.x.shape()), " ", g.x.dtype(),
                " but graph 0 has ", shape_str(first.x.shape()), " ", first.x.dtype());
}

}  // namespace

GraphBatch collate_graphs(const std::vector<Graph>& graphs) {
  DLTRAIN_CHECK(!graphs.empty(), "collate_graphs: the list of graphs is empty");
  autograd::NoGradGuard ng;
  const Graph& first = graphs.front();
  std::vector<Tensor> xs, eis, eas, ys, bs;
  std::vector<int64_t> ptr{0};
  const bool scalar_y = first.y.defined() && first.y.dim() == 0;
  for (size_t k = 0; k < graphs.size(); ++k) {
    const Graph& g = graphs[k];
    check_graph(g, k, first);
    const int64_t N = g.x.size(0);
    xs.push_back(g.x);
    eis.push_back(add(g.edge_index, static_cast<double>(ptr.back())));
    if (g.edge_attr.defined()) eas.push_back(g.edge_attr);
    if (g.y.defined()) {
      DLTRAIN_CHECK((g.y.dim() == 0) == scalar_y, "collate_graphs: graph ", k, " has target ",
                    shape_str(g.y.shape()), " but graph 0 has ", shape_str(first.y.shape()),
                    "; targets are all 0-d (stacked) or all [n, ...] (concatenated)");
      ys.push_back(g.y);
    }
    bs.push_back(
        full({N}, static_cast<double>(k), TensorOptions(DType::i64).with_device(g.x.device())));
    ptr.push_back(ptr.back() + N);
  }
  GraphBatch b;
  b.num_graphs = static_cast<int64_t>(graphs.size());
  b.x = cat(xs, 0);
  b.edge_index = cat(eis, 1);
  if (!eas.empty()) b.edge_attr = cat(eas, 0);
  if (!ys.empty()) b.y = scalar_y ? stack(ys, 0) : cat(ys, 0);
  b.batch = cat(bs, 0);
  b.ptr = from_vector(ptr, {static_cast<int64_t>(ptr.size())}).to(first.x.device());
  return b;
}

Batch GraphBatch::to_batch() const {
  Batch b;
  b.data = x;
  b.target = y;
  b.num_samples = num_graphs;
  b.set_field("edge_index", edge_index);
  if (edge_attr.defined()) b.set_field("edge_attr", edge_attr);
  b.set_field("batch", batch);
  b.set_field("ptr", ptr);
  return b;
}

GraphBatch GraphBatch::from(const Batch& b) {
  GraphBatch g;
  g.x = b.data;
  g.y = b.target;
  g.edge_index = b.field("edge_index");
  if (b.has_field("edge_attr")) g.edge_attr = b.field("edge_attr");
  g.batch = b.field("batch");
  g.ptr = b.field("ptr");
  g.num_graphs = b.num_samples >= 0 ? b.num_samples : g.ptr.numel() - 1;
  return g;
}

GraphBatch GraphBatch::to(Device device, bool non_blocking) const {
  auto mv = [&](const Tensor& t) { return t.defined() ? t.to(device, non_blocking) : t; };
  GraphBatch g;
  g.x = mv(x);
  g.edge_index = mv(edge_index);
  g.edge_attr = mv(edge_attr);
  g.y = mv(y);
  g.batch = mv(batch);
  g.ptr = mv(ptr);
  g.num_graphs = num_graphs;
  return g;
}

GraphDataset::GraphDataset(std::vector<Graph> graphs) : graphs_(std::move(graphs)) {
  DLTRAIN_CHECK(!graphs_.empty(), "GraphDataset: the list of graphs is empty");
  for (size_t k = 0; k < graphs_.size(); ++k) {
    Graph& g = graphs_[k];
    check_graph(g, k, graphs_.front());
    for (Tensor* t : {&g.x, &g.edge_index, &g.edge_attr, &g.y})
      if (t->defined()) *t = t->detach().contiguous();
  }
}

const Graph& GraphDataset::graph(int64_t index) const {
  DLTRAIN_CHECK(index >= 0 && index < size(), "GraphDataset: index ", index,
                " is out of range for ", size(), " graphs");
  return graphs_[static_cast<size_t>(index)];
}

Example GraphDataset::get(int64_t index) const {
  const Graph& g = graph(index);
  return Example{g.x, g.y};
}

Batch GraphDataset::get_batch(const std::vector<int64_t>& indices) const {
  DLTRAIN_CHECK(!indices.empty(), "GraphDataset::get_batch: the index list is empty");
  std::vector<Graph> gs;
  gs.reserve(indices.size());
  for (int64_t i : indices) gs.push_back(graph(i));
  return collate_graphs(gs).to_batch();
}

}  // namespace dltrain::data
