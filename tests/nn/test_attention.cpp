// scaled_dot_product_attention, nn::MultiheadAttention, nn::TransformerEncoderLayer and
// nn::TransformerEncoder: f64 gradchecks of the op (masks, causal, broadcasting, dropout),
// golden outputs and gradients from PyTorch 1.13 in f64 and f32 with PyTorch's weights loaded
// from .pth files (tests/reference/make_attention_reference.py), mask conventions, the
// one-tensor interface, and the errors for bad arguments.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "attention_reference.hpp"
#include "dltrain/dltrain.hpp"
#include "gradcheck.hpp"

using namespace dltrain;
using namespace dltrain::testing;
using Catch::Contains;

namespace {

using Inputs = std::map<std::string, Tensor>;

}  // namespace

// --- the op --------------------------------------------------------------------------------

TEST_CASE("scaled_dot_product_attention gradcheck (f64): plain, broadcast batch, L != S, scale") {
  gradcheck(
      [](const std::vector<Tensor>& t) { return scaled_dot_product_attention(t[0], t[1], t[2]); },
      {leaf({2, 3, 4, 5}, 1), leaf({2, 3, 6, 5}, 2), leaf({2, 3, 6, 3}, 3)});
  // key/value shared across heads ([N, 1, S, E]) and a custom scale
  gradcheck(
      [](const std::vector<Tensor>& t) {
        return scaled_dot_product_attention(t[0], t[1], t[2], Tensor(), 0.0, false, 0.7);
      },
      {leaf({2, 3, 4, 5}, 4), leaf({2, 1, 6, 5}, 5), leaf({2, 1, 6, 2}, 6)});
  // 2-d (no batch dims)
  gradcheck(
      [](const std::vector<Tensor>& t) { return scaled_dot_product_attention(t[0], t[1], t[2]); },
      {leaf({3, 4}, 7), leaf({5, 4}, 8), leaf({5, 2}, 9)});
}

TEST_CASE("scaled_dot_product_attention gradcheck (f64): bool mask, float mask, causal") {
  Generator g(11);
  Tensor keep = gt(rand({4, 6}, DType::f64, &g), 0.3);
  keep = logical_or(keep, lt(arange(6.0, DType::i64), 1).unsqueeze(0));  // key 0 always kept
  gradcheck(
      [&](const std::vector<Tensor>& t) {
        return scaled_dot_product_attention(t[0], t[1], t[2], keep);
      },
      {leaf({2, 4, 3}, 12), leaf({2, 6, 3}, 13), leaf({2, 6, 3}, 14)});
  // float mask [N, 1, L, S] broadcast over heads; its gradient too
  gradcheck(
      [](const std::vector<Tensor>& t) {
        return scaled_dot_product_attention(t[0], t[1], t[2], t[3]);
      },
      {leaf({2, 2, 4, 3}, 15), leaf({2, 2, 5, 3}, 16), leaf({2, 2, 5, 3}, 17),
       leaf({2, 1, 4, 5}, 18)});
  // causal, L < S and L > S (top-left alignment)
  for (auto [l, s] : {std::pair<int64_t, int64_t>{4, 6}, {5, 3}}) {
    gradcheck(
        [](const std::vector<Tensor>& t) {
          return scaled_dot_product_attention(t[0], t[1], t[2], Tensor(), 0.0, true);
        },
        {leaf({2, l, 3}, 19), leaf({2, s, 3}, 20), leaf({2, s, 4}, 21)});
  }
}

TEST_CASE("scaled_dot_product_attention gradcheck (f64) with dropout (fixed generator)") {
  gradcheck(
      [](const std::vector<Tensor>& t) {
        Generator g(99);  // the same dropout mask on every evaluation
        return scaled_dot_product_attention(t[0], t[1], t[2], Tensor(), 0.3, false, std::nullopt,
                                            &g);
      },
      {leaf({2, 4, 3}, 22), leaf({2, 5, 3}, 23), leaf({2, 5, 3}, 24)});
  // dropout zeroes some weights and rescales the rest by 1 / (1 - p)
  Generator g(5);
  auto [o, w] = scaled_dot_product_attention_with_weights(rnd({2, 8, 4}, 1), rnd({2, 8, 4}, 2),
                                                          rnd({2, 8, 4}, 3), Tensor(), 0.5, false,
                                                          std::nullopt, &g);
  const auto wv = w.to_vector<double>();
  const auto zeros_seen = std::count(wv.begin(), wv.end(), 0.0);
  CHECK(zeros_seen > 20);
  CHECK(zeros_seen < 108);
  CHECK(sum(w).item<double>() == Approx(16.0).epsilon(0.3));
}

TEST_CASE("scaled_dot_product_attention matches PyTorch (f64 and f32)") {
  nn::Module none;
  for (DType dt : {DType::f64, DType::f32}) {
    check_case(none, "sdpa_plain", dt, {"q", "k", "v"}, {}, [](Inputs& in) {
      return std::vector<Tensor>{scaled_dot_product_attention(in["q"], in["k"], in["v"])};
    });
    check_case(none, "sdpa_bool", dt, {"q", "k", "v", "mask"}, {"mask"}, [](Inputs& in) {
      return std::vector<Tensor>{
          scaled_dot_product_attention(in["q"], in["k"], in["v"], in["mask"])};
    });
    check_case(none, "sdpa_float", dt, {"q", "k", "v", "mask"}, {}, [](Inputs& in) {
      return std::vector<Tensor>{
          scaled_dot_product_attention(in["q"], in["k"], in["v"], in["mask"])};
    });
    check_case(none, "sdpa_causal", dt, {"q", "k", "v"}, {}, [](Inputs& in) {
      return std::vector<Tensor>{
          scaled_dot_product_attention(in["q"], in["k"], in["v"], Tensor(), 0.0, true)};
    });
  }
}

TEST_CASE("scaled_dot_product_attention: causal equals the causal bool mask, masked keys get 0") {
  const Tensor q = rnd({2, 5, 4}, 1), k = rnd({2, 7, 4}, 2), v = rnd({2, 7, 3}, 3);
  auto [o1, w1] = scaled_dot_product_attention_with_weights(q, k, v, Tensor(), 0.0, true);
  auto [o2, w2] = scaled_dot_product_attention_with_weights(q, k, v, causal_mask(5, 7));
  CHECK(allclose(o1, o2, 0, 0));
  // weight of key j > i is exactly 0; rows sum to 1
  const Tensor above = logical_not(causal_mask(5, 7));
  CHECK(sum(where(above, w1, zeros({}, DType::f64))).item<double>() == 0.0);
  CHECK(allclose(sum(w1, {-1}), ones({2, 5}, DType::f64), 1e-12, 1e-12));
  // a float mask of 0 / -inf is the same as the bool mask
  const Tensor fm = where(causal_mask(5, 7), zeros({}, DType::f64),
                          full({}, -std::numeric_limits<double>::infinity(), DType::f64));
  CHECK(allclose(scaled_dot_product_attention(q, k, v, fm), o1, 1e-12, 1e-12));
}

TEST_CASE("scaled_dot_product_attention rejects bad arguments with the fix") {
  const Tensor q = rnd({2, 4, 3}, 1, DType::f32), k = rnd({2, 5, 3}, 2, DType::f32),
               v = rnd({2, 5, 6}, 3, DType::f32);
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, rnd({2, 5, 4}, 2, DType::f32), v),
                    Contains("same embedding size E"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, rnd({2, 4, 6}, 3, DType::f32)),
                    Contains("same number of keys S"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(rnd({4}, 1, DType::f32), k, v),
                    Contains("at least 2 dims"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, rnd({3, 5, 3}, 2, DType::f32), v),
                    Contains("do not broadcast"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, v, ones({4, 4}, DType::b8)),
                    Contains("does not broadcast to the attention scores' shape [2, 4, 5]"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, v, zeros({4, 5}, DType::f64)),
                    Contains("of the query's dtype"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, v, ones({4, 5}, DType::b8), 0.0, true),
                    Contains("pass one"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, v, Tensor(), 1.0),
                    Contains("dropout_p must be in [0, 1)"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, v.to(DType::f64)),
                    Contains("share one floating dtype"));
}

// --- MultiheadAttention ---------------------------------------------------------------------

TEST_CASE("MultiheadAttention matches PyTorch with its weights (f64 and f32)") {
  for (DType dt : {DType::f64, DType::f32}) {
    SECTION(std::string("self-attention, seq-first, averaged weights ") + dtype_name(dt)) {
      nn::MultiheadAttention m(8, 2);
      load_reference_weights(m, "mha_self");
      check_case(m, "mha_self", dt, {"x"}, {}, [&](Inputs& in) {
        auto [o, w] = m(in["x"], in["x"], in["x"]);
        return std::vector<Tensor>{o, w};
      });
    }
    SECTION(std::string("batch_first, key = value, float attn_mask, bool key_padding_mask, "
                        "per-head weights ") +
            dtype_name(dt)) {
      nn::MultiheadAttention m(8, 2, {.batch_first = true});
      load_reference_weights(m, "mha_kv_batch_first");
      check_case(m, "mha_kv_batch_first", dt, {"q", "kv", "attn_mask", "key_padding_mask"},
                 {"key_padding_mask"}, [&](Inputs& in) {
                   auto [o, w] = m(in["q"], in["kv"], in["kv"], in["key_padding_mask"], true,
                                   in["attn_mask"], /*average_attn_weights=*/false);
                   return std::vector<Tensor>{o, w};
                 });
    }
    SECTION(std::string("kdim/vdim (q/k/v_proj_weight), 3-d bool attn_mask ") + dtype_name(dt)) {
      nn::MultiheadAttention m(8, 2, {.kdim = 5, .vdim = 7});
      load_reference_weights(m, "mha_kdim_vdim");
      check_case(m, "mha_kdim_vdim", dt, {"q", "k", "v", "attn_mask"}, {"attn_mask"},
                 [&](Inputs& in) {
                   auto [o, w] = m(in["q"], in["k"], in["v"], Tensor(), true, in["attn_mask"]);
                   return std::vector<Tensor>{o, w};
                 });
    }
    SECTION(std::string("no bias, 4 heads ") + dtype_name(dt)) {
      nn::MultiheadAttention m(8, 4, {.bias = false});
      load_reference_weights(m, "mha_nobias");
      check_case(m, "mha_nobias", dt, {"q", "k", "v", "attn_mask"}, {"attn_mask"}, [&](Inputs& in) {
        auto [o, w] = m(in["q"], in["k"], in["v"], Tensor(), true, in["attn_mask"]);
        return std::vector<Tensor>{o, w};
      });
    }
    SECTION(std::string("unbatched with key_padding_mask ") + dtype_name(dt)) {
      nn::MultiheadAttention m(8, 2);
      load_reference_weights(m, "mha_unbatched");
      check_case(m, "mha_unbatched", dt, {"q", "k", "v", "key_padding_mask"}, {"key_padding_mask"},
                 [&](Inputs& in) {
                   auto [o, w] = m(in["q"], in["k"], in["v"], in["key_padding_mask"]);
                   return std::vector<Tensor>{o, w};
                 });
    }
  }
}

TEST_CASE("MultiheadAttention: parameters, init, need_weights, is_causal, dropout in eval") {
  nn::MultiheadAttention m(12, 3, {.dropout = 0.5}, DType::f64);
  CHECK(m.in_proj_weight.shape() == Shape{36, 12});
  CHECK(m.in_proj_bias.shape() == Shape{36});
  CHECK(m.out_proj->weight.shape() == Shape{12, 12});
  CHECK(m.head_dim == 4);
  // xavier_uniform bound sqrt(6 / (12 + 36)); zero biases
  CHECK(max(abs(m.in_proj_weight)).item<double>() <= std::sqrt(6.0 / 48.0));
  CHECK(max(abs(m.in_proj_weight)).item<double>() > 0.8 * std::sqrt(6.0 / 48.0));
  CHECK(max(abs(m.in_proj_bias)).item<double>() == 0.0);
  CHECK(max(abs(m.out_proj->bias)).item<double>() == 0.0);
  m.eval();
  const Tensor x = rnd({6, 2, 12}, 1);
  auto [o1, w1] = m(x, x, x);
  auto [o2, w2] = m(x, x, x, Tensor(), /*need_weights=*/false);
  CHECK_FALSE(w2.defined());
  CHECK(allclose(o1, o2, 1e-12, 1e-12));
  CHECK(w1.shape() == Shape{2, 6, 6});
  // is_causal = the float causal mask = the bool "not allowed" mask
  auto [oc, wc] = m(x, x, x, Tensor(), true, Tensor(), true, /*is_causal=*/true);
  auto [of, wf] = m(x, x, x, Tensor(), true, nn::generate_square_subsequent_mask(6, DType::f64));
  auto [ob, wb] = m(x, x, x, Tensor(), true, logical_not(causal_mask(6, 6)));
  CHECK(allclose(oc, of, 1e-12, 1e-12));
  CHECK(allclose(oc, ob, 1e-12, 1e-12));
  CHECK(allclose(wc, wb, 1e-12, 1e-12));
  CHECK_FALSE(allclose(oc, o1, 1e-6, 1e-6));
  // the same query, key and value through separate tensors give the fused result
  auto [os, ws] = m(x, x.clone(), x.clone());
  CHECK(allclose(os, o1, 1e-12, 1e-12));
  // training mode applies dropout to the weights
  m.train();
  auto [ot, wt] = m(x, x, x);
  CHECK_FALSE(allclose(ot, o1, 1e-6, 1e-6));
}

TEST_CASE("MultiheadAttention rejects bad configurations and inputs with the fix") {
  CHECK_THROWS_WITH(nn::MultiheadAttention(10, 3), Contains("must be divisible by num_heads"));
  CHECK_THROWS_WITH(nn::MultiheadAttention(8, 0), Contains("num_heads must be > 0"));
  nn::MultiheadAttention m(8, 2);
  const Tensor x = rnd({5, 3, 8}, 1, DType::f32);
  CHECK_THROWS_WITH(m(rnd({5, 3, 6}, 1, DType::f32), x, x), Contains("embed_dim is 8"));
  CHECK_THROWS_WITH(m(rnd({2, 5, 3, 8}, 1, DType::f32), x, x), Contains("or unbatched [L, E]"));
  CHECK_THROWS_WITH(m(x, rnd({5, 8}, 1, DType::f32), x), Contains("must have the query's rank"));
  CHECK_THROWS_WITH(m(x, rnd({4, 2, 8}, 1, DType::f32), rnd({4, 2, 8}, 1, DType::f32)),
                    Contains("batch size 3"));
  CHECK_THROWS_WITH(m(x, x, x, Tensor(), true, ones({5, 4}, DType::b8)),
                    Contains("must be [L, S] = [5, 5]"));
  CHECK_THROWS_WITH(m(x, x, x, Tensor(), true, ones({2, 5, 5}, DType::b8)),
                    Contains("[N * num_heads, L, S] = [6, 5, 5]"));
  CHECK_THROWS_WITH(m(x, x, x, ones({5, 3}, DType::b8)), Contains("must be [N, S] = [3, 5]"));
  CHECK_THROWS_WITH(m(x, x, x, ones({3, 5}, DType::i64)),
                    Contains("convert it with .to(DType::b8)"));
  CHECK_THROWS_WITH(m.forward(x), Contains("does not take a single tensor"));
}

// --- TransformerEncoderLayer / TransformerEncoder -------------------------------------------

TEST_CASE("TransformerEncoderLayer matches PyTorch (post/pre-norm, seq/batch first, masks)") {
  for (bool norm_first : {false, true}) {
    for (bool batch_first : {false, true}) {
      const std::string c =
          std::string("enc_") + (norm_first ? "pre" : "post") + "_" + (batch_first ? "bf" : "sf");
      for (DType dt : {DType::f64, DType::f32}) {
        INFO(c << " " << dtype_name(dt));
        nn::TransformerEncoderLayer layer(8, 2,
                                          {.dim_feedforward = 16,
                                           .dropout = 0.0,
                                           .activation = norm_first ? "gelu" : "relu",
                                           .batch_first = batch_first,
                                           .norm_first = norm_first});
        load_reference_weights(layer, c);
        if (batch_first) {
          check_case(layer, c, dt, {"x", "src_mask", "src_key_padding_mask"},
                     {"src_key_padding_mask"}, [&](Inputs& in) {
                       return std::vector<Tensor>{
                           layer(in["x"], in["src_mask"], in["src_key_padding_mask"])};
                     });
        } else {
          check_case(layer, c, dt, {"x"}, {},
                     [&](Inputs& in) { return std::vector<Tensor>{layer(in["x"])}; });
        }
      }
    }
  }
}

TEST_CASE("TransformerEncoder (2 layers + final norm) matches PyTorch") {
  for (DType dt : {DType::f64, DType::f32}) {
    auto layer = std::make_shared<nn::TransformerEncoderLayer>(
        8, 2,
        nn::TransformerEncoderLayerOptions{
            .dim_feedforward = 16, .dropout = 0.0, .layer_norm_eps = 1e-6});
    nn::TransformerEncoder enc(layer, 2, std::make_shared<nn::LayerNorm>(Shape{8}));
    load_reference_weights(enc, "encoder_2");
    check_case(enc, "encoder_2", dt, {"x", "mask"}, {},
               [&](Inputs& in) { return std::vector<Tensor>{enc(in["x"], in["mask"])}; });
  }
}

TEST_CASE("TransformerEncoder copies the layer, the layers nest in a Sequential") {
  auto layer = std::make_shared<nn::TransformerEncoderLayer>(
      8, 2, nn::TransformerEncoderLayerOptions{.dim_feedforward = 16, .dropout = 0.0}, DType::f64);
  nn::TransformerEncoder enc(layer, 3);
  REQUIRE(enc.layers->size() == 3);
  // each layer starts from the given layer's weights, in its own storage
  const Tensor w0 = enc.layers->operator[](0)->linear1->weight;
  const Tensor w2 = enc.layers->operator[](2)->linear1->weight;
  CHECK(allclose(w0, layer->linear1->weight, 0, 0));
  CHECK(allclose(w2, layer->linear1->weight, 0, 0));
  CHECK(w0.data_ptr() != w2.data_ptr());
  CHECK(w0.dtype() == DType::f64);
  CHECK(enc.state_dict().size() == 3 * layer->state_dict().size());
  CHECK(enc.state_dict().contains("layers.2.self_attn.out_proj.bias"));
  // one-tensor forward: usable in a Sequential, same result as the typed call
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back(layer).push_back(std::make_shared<nn::ReLU>());
  const Tensor x = rnd({4, 2, 8}, 3);
  CHECK(allclose((*seq)(x), relu((*layer)(x, Tensor())), 0, 0));
  // the layer's printout lists PyTorch's children
  const std::string s = layer->str();
  CHECK_THAT(s, Contains("(self_attn): MultiheadAttention"));
  CHECK_THAT(s, Contains("(linear1): Linear(in_features=8, out_features=16, bias=True)"));
  CHECK_THAT(s, Contains("(norm2): LayerNorm((8,), eps=1e-05, elementwise_affine=True)"));
}

TEST_CASE("TransformerEncoderLayer bias=false has no bias parameters, bad arguments raise") {
  nn::TransformerEncoderLayer layer(8, 2, {.dim_feedforward = 16, .bias = false});
  for (const auto& [k, v] : layer.state_dict()) CHECK(k.find("bias") == std::string::npos);
  CHECK(layer.state_dict().size() == 6);  // in_proj, out_proj, linear1/2, norm1/2 weights
  CHECK(layer(rnd({3, 2, 8}, 1, DType::f32)).shape() == Shape{3, 2, 8});
  CHECK_THROWS_WITH(nn::TransformerEncoderLayer(8, 2, {.activation = "tanh"}),
                    Contains("\"relu\" or \"gelu\""));
  CHECK_THROWS_WITH(nn::TransformerEncoderLayer(8, 3), Contains("divisible by num_heads"));
  CHECK_THROWS_WITH(layer(rnd({8}, 1, DType::f32)), Contains("or unbatched [L, E]"));
}
