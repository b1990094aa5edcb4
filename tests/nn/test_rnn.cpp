// nn::LSTM and nn::GRU against PyTorch 1.13 (tests/reference/make_attention_reference.py):
// PyTorch's weights loaded from .pth (names and order checked), outputs, final states, input,
// state and parameter gradients in f64 and f32; layouts (seq-first, batch_first, unbatched),
// bidirectional, bias = false, several layers; printing, dropout between layers, errors.
#include <catch2/catch.hpp>

#include "attention_reference.hpp"
#include "dltrain/dltrain.hpp"
#include "gradcheck.hpp"

using namespace dltrain;
using namespace dltrain::testing;
using Catch::Contains;

namespace {
using Inputs = std::map<std::string, Tensor>;
}  // namespace

TEST_CASE("LSTM matches PyTorch (layers, bidirectional, batch_first, no bias, unbatched)") {
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(dtype_name(dt));
    {
      nn::LSTM m(4, 5, {.num_layers = 2});
      load_reference_weights(m, "lstm_2layer");
      check_case(m, "lstm_2layer", dt, {"x", "h0", "c0"}, {}, [&](Inputs& in) {
        auto [y, hc] = m(in["x"], {in["h0"], in["c0"]});
        return std::vector<Tensor>{y, hc.first, hc.second};
      });
    }
    {
      nn::LSTM m(4, 5,
                 {.num_layers = 2, .bias = false, .batch_first = true, .bidirectional = true});
      load_reference_weights(m, "lstm_bidir_bf_nobias");
      check_case(m, "lstm_bidir_bf_nobias", dt, {"x"}, {}, [&](Inputs& in) {
        auto [y, hc] = m(in["x"]);
        return std::vector<Tensor>{y, hc.first, hc.second};
      });
    }
    {
      nn::LSTM m(4, 5, {.bidirectional = true});
      load_reference_weights(m, "lstm_unbatched");
      check_case(m, "lstm_unbatched", dt, {"x", "h0", "c0"}, {}, [&](Inputs& in) {
        auto [y, hc] = m(in["x"], {in["h0"], in["c0"]});
        return std::vector<Tensor>{y, hc.first, hc.second};
      });
    }
  }
}

TEST_CASE("GRU matches PyTorch (layers, bidirectional, batch_first, no bias, unbatched)") {
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(dtype_name(dt));
    {
      nn::GRU m(4, 5, {.num_layers = 2, .bidirectional = true});
      load_reference_weights(m, "gru_2layer_bidir");
      check_case(m, "gru_2layer_bidir", dt, {"x", "h0"}, {}, [&](Inputs& in) {
        auto [y, h] = m(in["x"], in["h0"]);
        return std::vector<Tensor>{y, h};
      });
    }
    {
      nn::GRU m(4, 5, {.bias = false, .batch_first = true});
      load_reference_weights(m, "gru_bf_nobias");
      check_case(m, "gru_bf_nobias", dt, {"x"}, {}, [&](Inputs& in) {
        auto [y, h] = m(in["x"]);
        return std::vector<Tensor>{y, h};
      });
    }
    {
      nn::GRU m(4, 5, {.num_layers = 2});
      load_reference_weights(m, "gru_unbatched");
      check_case(m, "gru_unbatched", dt, {"x", "h0"}, {}, [&](Inputs& in) {
        auto [y, h] = m(in["x"], in["h0"]);
        return std::vector<Tensor>{y, h};
      });
    }
  }
}

TEST_CASE("LSTM / GRU gradcheck (f64) through time, with initial states") {
  nn::LSTM lstm(3, 4, {.bidirectional = true}, DType::f64);
  gradcheck(
      [&](const std::vector<Tensor>& t) {
        auto [y, hc] = lstm(t[0], {t[1], t[2]});
        return add(sum(y), add(sum(mul(hc.first, hc.first)), sum(hc.second)));
      },
      {leaf({5, 2, 3}, 1), leaf({2, 2, 4}, 2), leaf({2, 2, 4}, 3)});
  nn::GRU gru(3, 4, {.num_layers = 2}, DType::f64);
  gradcheck(
      [&](const std::vector<Tensor>& t) {
        auto [y, h] = gru(t[0], t[1]);
        return cat({y.flatten(), h.flatten()}, 0);
      },
      {leaf({5, 2, 3}, 4), leaf({2, 2, 4}, 5)});
}

TEST_CASE("LSTM / GRU: printing, init bound, dropout between layers, errors") {
  nn::LSTM a(10, 20, {.num_layers = 2, .batch_first = true, .dropout = 0.5, .bidirectional = true});
  CHECK(a.str() == "LSTM(10, 20, num_layers=2, batch_first=True, dropout=0.5, bidirectional=True)");
  CHECK(nn::GRU(3, 4, {.bias = false}).str() == "GRU(3, 4, bias=False)");
  CHECK(a.weights()[2].w_ih.shape() == Shape{80, 40});  // layer 1 takes both directions
  CHECK(a.state_dict().size() == 16);
  CHECK(max(abs(a.weights()[0].w_hh)).item<double>() <= 1.0 / std::sqrt(20.0));
  // dropout only in training mode
  const Tensor x = randn({3, 6, 10});
  a.eval();
  const Tensor e1 = a(x).first, e2 = a(x).first;
  CHECK(allclose(e1, e2, 0, 0));
  a.train();
  CHECK_FALSE(allclose(a(x).first, e1, 1e-4, 1e-4));
  CHECK(a(x).first.shape() == Shape{3, 6, 40});

  nn::GRU g(4, 5, {.num_layers = 2});
  CHECK_THROWS_WITH(g(randn({6, 3, 7})), Contains("input_size is 4"));
  CHECK_THROWS_WITH(g(randn({6, 3, 4}), randn({1, 3, 5})),
                    Contains("[num_layers * directions, N, hidden_size] = [2, 3, 5]"));
  CHECK_THROWS_WITH(g(randn({2, 6, 3, 4})), Contains("or unbatched [T, input_size]"));
  CHECK_THROWS_WITH(nn::LSTM(4, 5)(randn({6, 3, 4}), {randn({1, 3, 5}), Tensor()}),
                    Contains("both h0 and c0"));
  CHECK_THROWS_WITH(nn::LSTM(4, 0), Contains("must be > 0"));
  CHECK_THROWS_WITH(g.forward(randn({6, 3, 4})), Contains("does not take a single tensor"));
}
