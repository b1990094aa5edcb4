// Modules with several inputs and outputs, tried on the three shapes issue 14 names: a VAE
// (encoder returning (mu, logvar) through operator(), a reparameterisation taking both, a
// decoder), an interaction-network GNN (layers taking and returning (x, edge_index, e), chained
// and in a ModuleListOf, aggregating with segment ops), and a U-Net whose down blocks return
// (features, skip) and whose up blocks take both. Checked: typed results, state-dict keys,
// printing, to(dtype), gradients reaching every parameter, and the one-tensor interface of a
// Chain (inside a Sequential; an error naming the fix when the chain is not one-tensor).
#include <catch2/catch.hpp>

#include <string>
#include <tuple>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using Catch::Contains;

namespace {

struct Encoder : nn::Module {
  std::shared_ptr<nn::Linear> hidden, mu, logvar;
  Encoder(int64_t in, int64_t z) : nn::Module("Encoder") {
    hidden = register_module("hidden", std::make_shared<nn::Linear>(in, 16));
    mu = register_module("mu", std::make_shared<nn::Linear>(16, z));
    logvar = register_module("logvar", std::make_shared<nn::Linear>(16, z));
  }
  // One tensor in, two out: operator(), since forward(const Tensor&) is the virtual.
  std::pair<Tensor, Tensor> operator()(const Tensor& x) {
    const Tensor h = relu(hidden->forward(x));
    return {mu->forward(h), logvar->forward(h)};
  }
};

struct Reparameterize : nn::Module {
  Reparameterize() : nn::Module("Reparameterize") {}
  std::tuple<Tensor, Tensor, Tensor> forward(const Tensor& mu, const Tensor& logvar) {
    Generator g(7);
    const Tensor eps = randn(mu.shape(), mu.dtype(), &g);
    return {add(mu, mul(exp(mul(logvar, 0.5)), eps)), mu, logvar};
  }
};

struct Decoder : nn::Module {
  std::shared_ptr<nn::Linear> out;
  Decoder(int64_t z, int64_t o) : nn::Module("Decoder") {
    out = register_module("out", std::make_shared<nn::Linear>(z, o));
  }
  // (recon, mu, logvar): the decoder passes the statistics through for the KL term.
  std::tuple<Tensor, Tensor, Tensor> forward(const Tensor& z, const Tensor& mu,
                                             const Tensor& logvar) {
    return {sigmoid(out->forward(z)), mu, logvar};
  }
};

// Interaction network layer: edge update from (x_src, x_dst, e), node update from (x, sum of
// incoming edge messages).
struct Interaction : nn::Module {
  std::shared_ptr<nn::Linear> edge_mlp, node_mlp;
  explicit Interaction(int64_t h) : nn::Module("Interaction") {
    edge_mlp = register_module("edge_mlp", std::make_shared<nn::Linear>(3 * h, h));
    node_mlp = register_module("node_mlp", std::make_shared<nn::Linear>(2 * h, h));
  }
  std::tuple<Tensor, Tensor, Tensor> forward(const Tensor& x, const Tensor& edge_index,
                                             const Tensor& e) {
    const Tensor src = edge_index.select(0, 0), dst = edge_index.select(0, 1);
    const Tensor m =
        relu(edge_mlp->forward(cat({index_select(x, 0, src), index_select(x, 0, dst), e}, 1)));
    // Attention-style weights over each node's incoming edges, then a weighted sum.
    const Tensor w = segment_softmax(sum(m, {1}, true), dst, x.size(0));
    const Tensor agg = segment_sum(mul(w, m), dst, x.size(0));
    return {add(x, relu(node_mlp->forward(cat({x, agg}, 1)))), edge_index, add(e, m)};
  }
};

struct EdgeHead : nn::Module {
  std::shared_ptr<nn::Linear> lin;
  explicit EdgeHead(int64_t h) : nn::Module("EdgeHead") {
    lin = register_module("lin", std::make_shared<nn::Linear>(2 * h, 1));
  }
  Tensor forward(const Tensor& x, const Tensor& edge_index, const Tensor& e) {
    return lin->forward(cat({e, index_select(x, 0, edge_index.select(0, 1))}, 1)).reshape({-1});
  }
};

struct Down : nn::Module {
  std::shared_ptr<nn::Conv2d> conv;
  Down(int64_t in, int64_t out) : nn::Module("Down") {
    conv = register_module(
        "conv", std::make_shared<nn::Conv2d>(in, out, 3, nn::Conv2dOptions{.padding = 1}));
  }
  // (pooled features, skip connection)
  std::pair<Tensor, Tensor> operator()(const Tensor& x) {
    const Tensor f = relu(conv->forward(x));
    return {max_pool2d(f, 2), f};
  }
};

struct Up : nn::Module {
  std::shared_ptr<nn::ConvTranspose2d> up;
  std::shared_ptr<nn::Conv2d> conv;
  Up(int64_t in, int64_t skip, int64_t out) : nn::Module("Up") {
    up = register_module("up", std::make_shared<nn::ConvTranspose2d>(
                                   in, in, 2, nn::ConvTranspose2dOptions{.stride = 2}));
    conv = register_module(
        "conv", std::make_shared<nn::Conv2d>(in + skip, out, 3, nn::Conv2dOptions{.padding = 1}));
  }
  Tensor forward(const Tensor& x, const Tensor& skip) {
    return relu(conv->forward(cat({up->forward(x), skip}, 1)));
  }
};

struct UNet : nn::Module {
  std::shared_ptr<nn::ModuleListOf<Down>> downs;
  std::shared_ptr<nn::ModuleListOf<Up>> ups;
  std::shared_ptr<nn::Conv2d> head;
  UNet() : nn::Module("UNet") {
    downs = register_module("downs", std::make_shared<nn::ModuleListOf<Down>>());
    downs->push_back(std::make_shared<Down>(1, 4)).push_back(std::make_shared<Down>(4, 8));
    ups = register_module("ups", std::make_shared<nn::ModuleListOf<Up>>());
    ups->push_back(std::make_shared<Up>(8, 8, 8)).push_back(std::make_shared<Up>(8, 4, 4));
    head = register_module("head", std::make_shared<nn::Conv2d>(4, 1, 1));
  }
  Tensor forward(const Tensor& x) override {
    std::vector<Tensor> skips;
    Tensor h = x;
    for (const auto& d : downs->modules()) {
      auto [pooled, skip] = (*d)(h);
      skips.push_back(skip);
      h = pooled;
    }
    for (int64_t i = 0; i < ups->size(); ++i)
      h = (*ups)[i]->forward(h, skips[skips.size() - 1 - static_cast<size_t>(i)]);
    return head->forward(h);
  }
};

void check_all_grads(const nn::Module& m) {
  for (const auto& [name, p] : m.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
  }
}

}  // namespace

TEST_CASE("Chain runs a VAE: encoder pair, reparameterisation, decoder", "[nn][multi_io]") {
  auto vae = nn::chain(std::make_shared<Encoder>(6, 3), std::make_shared<Reparameterize>(),
                       std::make_shared<Decoder>(3, 6));
  const Tensor x = rand({5, 6});
  auto [recon, mu, logvar] = (*vae)(x);
  static_assert(std::is_same_v<decltype(recon), Tensor>);
  CHECK(recon.shape() == Shape{5, 6});
  CHECK(mu.shape() == Shape{5, 3});
  const Tensor kl = mul(sum(sub(add(exp(logvar), mul(mu, mu)), add(logvar, 1.0))), 0.5);
  add(mse_loss(recon, x), kl).backward();
  check_all_grads(*vae);
  const StateDict sd = vae->state_dict();
  CHECK(sd.contains("0.hidden.weight"));
  CHECK(sd.contains("2.out.bias"));
  CHECK(vae->str().find("Sequential(") == 0);
  CHECK(vae->str().find("(1): Reparameterize") != std::string::npos);
  vae->to(DType::f64);
  CHECK(vae->get<2>()->out->weight.dtype() == DType::f64);
  // Not one tensor to one tensor: the Module interface says so and names the fix.
  REQUIRE_THROWS_WITH(vae->forward(x), Contains("operator()") && Contains("Sequential"));
}

TEST_CASE("Chain of one-tensor modules works inside a Sequential", "[nn][multi_io]") {
  auto block = nn::chain(std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::ReLU>());
  nn::Sequential seq{block, std::make_shared<nn::Linear>(8, 2)};
  const Tensor y = seq.forward(randn({3, 4}));
  CHECK(y.shape() == Shape{3, 2});
  CHECK(seq.state_dict().contains("0.0.weight"));
  CHECK(allclose((*block)(ones({1, 4})), block->forward(ones({1, 4}))));
}

TEST_CASE("Chain and ModuleListOf run an interaction-network GNN on a graph batch",
          "[nn][multi_io][graph]") {
  const int64_t H = 8;
  std::vector<data::Graph> graphs;
  for (int64_t k = 0; k < 4; ++k) {
    const int64_t N = 5 + k, E = 2 * N;
    Generator g(100 + static_cast<uint64_t>(k));
    const Tensor ei = mul(rand({2, E}, DType::f64, &g), static_cast<double>(N)).to(DType::i64);
    graphs.push_back({randn({N, H}, DType::f32, &g), ei, randn({E, H}, DType::f32, &g),
                      gt(rand({E}, DType::f32, &g), 0.5).to(DType::f32)});
  }
  auto ds = std::make_shared<data::GraphDataset>(graphs);
  data::DataLoader loader(ds, {.batch_size = 2});
  auto gnn = nn::chain(std::make_shared<Interaction>(H), std::make_shared<Interaction>(H),
                       std::make_shared<EdgeHead>(H));
  int64_t batches = 0;
  for (const data::Batch& b : loader) {
    const data::GraphBatch gb = data::GraphBatch::from(b);
    CHECK(b.size() == 2);
    const Tensor logits = (*gnn)(gb.x, gb.edge_index, gb.edge_attr);
    CHECK(logits.shape() == Shape{gb.edge_index.size(1)});
    binary_cross_entropy_with_logits(logits, gb.y).backward();
    ++batches;
  }
  CHECK(batches == 2);
  check_all_grads(*gnn);
  CHECK(gnn->state_dict().contains("1.edge_mlp.weight"));
  // The same layers in a ModuleListOf, looped by hand.
  nn::ModuleListOf<Interaction> layers{gnn->get<0>(), gnn->get<1>()};
  const data::GraphBatch gb = data::collate_graphs(graphs);
  Tensor x = gb.x, e = gb.edge_attr;
  for (const auto& layer : layers.modules())
    std::tie(x, std::ignore, e) = layer->forward(x, gb.edge_index, e);
  CHECK(allclose(gnn->get<2>()->forward(x, gb.edge_index, e),
                 (*gnn)(gb.x, gb.edge_index, gb.edge_attr)));
  CHECK(layers.state_dict().contains("0.node_mlp.bias"));
  layers.replace_module("1", std::make_shared<nn::Linear>(2, 2));
  REQUIRE_THROWS_WITH(layers[1], Contains("Linear") && Contains("not the list's module type"));
}

TEST_CASE("ModuleListOf runs a U-Net with skip connections", "[nn][multi_io]") {
  UNet net;
  const Tensor y = net.forward(randn({2, 1, 8, 8}));
  CHECK(y.shape() == Shape{2, 1, 8, 8});
  sum(y).backward();
  check_all_grads(net);
  CHECK(net.state_dict().contains("downs.1.conv.weight"));
  CHECK(net.state_dict().contains("ups.0.up.weight"));
  CHECK(net.str().find("(downs): ModuleList(") != std::string::npos);
}
