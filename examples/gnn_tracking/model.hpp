// The GNN tracking example's model (header-only), shared by examples/gnn_tracking and
// benchmarks/soak: an interaction network classifying the candidate edges of a detector event
// (detector.hpp) as an nn::Chain of encoder, K interaction layers and edge classifier.
#pragma once

#include <cstdint>
#include <memory>
#include <tuple>

#include "dltrain/dltrain.hpp"

namespace gnn_tracking {

namespace nn = dltrain::nn;
using dltrain::Tensor;

// Linear-ReLU-Linear, with a final ReLU unless it produces logits.
inline std::shared_ptr<nn::Sequential> mlp(int64_t in, int64_t hidden, int64_t out,
                                           bool final_relu) {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(in, hidden))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::Linear>(hidden, out));
  if (final_relu) m->push_back(std::make_shared<nn::ReLU>());
  return m;
}

using Graph3 = std::tuple<Tensor, Tensor, Tensor>;  // (x, edge_index, e)

// Node and edge features to the hidden size.
struct Encoder : nn::Module {
  std::shared_ptr<nn::Sequential> node, edge;
  Encoder(int64_t node_in, int64_t edge_in, int64_t h) : nn::Module("Encoder") {
    node = register_module("node", mlp(node_in, h, h, true));
    edge = register_module("edge", mlp(edge_in, h, h, true));
  }
  Graph3 forward(const Tensor& x, const Tensor& edge_index, const Tensor& edge_attr) {
    return {node->forward(x), edge_index, edge->forward(edge_attr)};
  }
};

// One interaction-network iteration: edge messages from both ends and the edge's own state,
// summed into the nodes at either end (index_add), nodes updated from themselves and the two
// sums; both updates residual.
struct Interaction : nn::Module {
  std::shared_ptr<nn::Sequential> edge_mlp, node_mlp;
  explicit Interaction(int64_t h) : nn::Module("Interaction") {
    edge_mlp = register_module("edge_mlp", mlp(3 * h, h, h, true));
    node_mlp = register_module("node_mlp", mlp(3 * h, h, h, true));
  }
  Graph3 forward(const Tensor& x, const Tensor& edge_index, const Tensor& e) {
    const Tensor src = edge_index.select(0, 0), dst = edge_index.select(0, 1);
    const Tensor m = edge_mlp->forward(
        dltrain::cat({dltrain::index_select(x, 0, src), dltrain::index_select(x, 0, dst), e}, 1));
    const Tensor zero = dltrain::zeros_like(x);
    const Tensor in = dltrain::index_add(zero, 0, dst, m);   // from the inner-layer neighbours
    const Tensor out = dltrain::index_add(zero, 0, src, m);  // from the outer-layer neighbours
    const Tensor x2 = dltrain::add(x, node_mlp->forward(dltrain::cat({x, in, out}, 1)));
    return {x2, edge_index, dltrain::add(e, m)};
  }
};

// The K iterations, in a typed list (state-dict keys "1.layers.0.edge_mlp.0.weight", ...).
struct Processor : nn::Module {
  std::shared_ptr<nn::ModuleListOf<Interaction>> layers;
  Processor(int64_t h, int64_t k) : nn::Module("Processor") {
    layers = register_module("layers", std::make_shared<nn::ModuleListOf<Interaction>>());
    for (int64_t i = 0; i < k; ++i) layers->push_back(std::make_shared<Interaction>(h));
  }
  Graph3 forward(Tensor x, const Tensor& edge_index, Tensor e) {
    for (const auto& layer : layers->modules())
      std::tie(x, std::ignore, e) = layer->forward(x, edge_index, e);
    return {x, edge_index, e};
  }
};

// One logit per edge.
struct EdgeClassifier : nn::Module {
  std::shared_ptr<nn::Sequential> net;
  explicit EdgeClassifier(int64_t h) : nn::Module("EdgeClassifier") {
    net = register_module("net", mlp(3 * h, h, 1, false));
  }
  Tensor forward(const Tensor& x, const Tensor& edge_index, const Tensor& e) {
    const Tensor src = edge_index.select(0, 0), dst = edge_index.select(0, 1);
    return net
        ->forward(dltrain::cat(
            {dltrain::index_select(x, 0, src), dltrain::index_select(x, 0, dst), e}, 1))
        .squeeze(1);
  }
};

inline auto make_model(int64_t hidden, int64_t iterations) {
  return nn::chain(std::make_shared<Encoder>(3, 4, hidden),
                   std::make_shared<Processor>(hidden, iterations),
                   std::make_shared<EdgeClassifier>(hidden));
}

}  // namespace gnn_tracking
