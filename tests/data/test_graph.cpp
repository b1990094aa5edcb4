// Graph batches: collate_graphs (node offsets on edge_index, the batch and ptr vectors, edge
// features and node/edge/graph-level targets concatenated or stacked), GraphBatch <-> Batch,
// GraphDataset through a DataLoader with workers and pinned memory off, and the errors
// malformed graphs raise.
#include <catch2/catch.hpp>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using Catch::Contains;

namespace {

Tensor ei(const std::vector<int64_t>& v) {
  return from_vector(v, {2, static_cast<int64_t>(v.size()) / 2});
}

data::Graph graph(int64_t n, const std::vector<int64_t>& edges, double base) {
  const int64_t E = static_cast<int64_t>(edges.size()) / 2;
  return {add(arange(static_cast<double>(n * 2)).reshape({n, 2}), base), ei(edges),
          full({E, 1}, base), full({E}, base)};
}

}  // namespace

TEST_CASE("collate_graphs offsets edges and builds batch and ptr", "[data][graph]") {
  const std::vector<data::Graph> gs{graph(3, {0, 1, 1, 2}, 0.0), graph(2, {1, 0}, 10.0),
                                    graph(4, {3, 0, 2, 1, 0, 3}, 20.0)};
  const data::GraphBatch b = data::collate_graphs(gs);
  CHECK(b.num_graphs == 3);
  CHECK(b.x.shape() == Shape{9, 2});
  CHECK(b.edge_index.to_vector<int64_t>() ==
        std::vector<int64_t>{0, 1, 4, 8, 5, 7, 1, 2, 3, 6, 5, 8});
  CHECK(b.batch.to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0, 1, 1, 2, 2, 2, 2});
  CHECK(b.ptr.to_vector<int64_t>() == std::vector<int64_t>{0, 3, 5, 9});
  CHECK(b.edge_attr.shape() == Shape{6, 1});
  CHECK(b.y.to_vector<float>() == std::vector<float>{0, 0, 10, 20, 20, 20});
  // Round trip through a data::Batch.
  const data::Batch db = b.to_batch();
  CHECK(db.size() == 3);
  CHECK(db.data.shape() == Shape{9, 2});
  const data::GraphBatch back = data::GraphBatch::from(db);
  CHECK(back.edge_index.to_vector<int64_t>() == b.edge_index.to_vector<int64_t>());
  CHECK(back.num_graphs == 3);
  REQUIRE_THROWS_WITH(data::GraphBatch::from(data::Batch{ones({2}), ones({2})}),
                      Contains("no field 'edge_index'"));
  // Per-graph pooling with the batch vector.
  CHECK(segment_sum(b.x, b.batch, b.num_graphs).shape() == Shape{3, 2});
  // 0-d (graph-level) targets stack.
  std::vector<data::Graph> g0 = gs;
  for (auto& g : g0) g.y = scalar_tensor(1.5);
  CHECK(data::collate_graphs(g0).y.shape() == Shape{3});
}

TEST_CASE("GraphDataset batches through a DataLoader with workers", "[data][graph]") {
  std::vector<data::Graph> gs;
  for (int64_t k = 0; k < 7; ++k) gs.push_back(graph(2 + k % 3, {0, 1, 1, 0}, 1.0 * k));
  auto ds = std::make_shared<data::GraphDataset>(gs);
  CHECK(ds->get(3).data.shape() == Shape{2, 2});
  for (int64_t workers : {0, 2}) {
    data::DataLoader loader(ds, {.batch_size = 3, .num_workers = workers});
    std::vector<int64_t> sizes;
    int64_t nodes = 0;
    for (const data::Batch& b : loader) {
      sizes.push_back(b.size());
      const data::GraphBatch g = data::GraphBatch::from(b);
      CHECK(g.ptr.numel() == b.size() + 1);
      CHECK(g.edge_index.size(1) == 2 * b.size());
      nodes += g.x.size(0);
    }
    CHECK(sizes == std::vector<int64_t>{3, 3, 1});
    CHECK(nodes == 2 + 3 + 4 + 2 + 3 + 4 + 2);
  }
}

TEST_CASE("Malformed graphs raise errors naming the graph", "[data][graph][errors]") {
  data::Graph bad = graph(3, {0, 5}, 0.0);
  REQUIRE_THROWS_WITH(data::collate_graphs({graph(2, {0, 1}, 0.0), bad}),
                      Contains("graph 1") && Contains("node 5") && Contains("3 nodes"));
  data::Graph f = graph(3, {0, 1}, 0.0);
  f.edge_index = f.edge_index.to(DType::i32);
  REQUIRE_THROWS_WITH(data::GraphDataset({f}), Contains("int64 [2, E]"));
  data::Graph noattr = graph(2, {0, 1}, 0.0);
  noattr.edge_attr = Tensor();
  REQUIRE_THROWS_WITH(data::collate_graphs({graph(2, {0, 1}, 0.0), noattr}),
                      Contains("graph 1 has no edge_attr"));
  data::Graph wide = graph(2, {0, 1}, 0.0);
  wide.x = ones({2, 3});
  REQUIRE_THROWS_WITH(data::collate_graphs({graph(2, {0, 1}, 0.0), wide}),
                      Contains("graph 1 has node features [2, 3]"));
  REQUIRE_THROWS_WITH(data::collate_graphs({}), Contains("empty"));
  data::Batch b;
  b.set_field("a", ones({1}));
  REQUIRE_THROWS_WITH(b.field("b"), Contains("no field 'b'") && Contains("a"));
}
