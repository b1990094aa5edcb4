// LSTM and GRU as compositions of ops. Per layer and direction the input projection of the whole
// sequence is one GEMM; the recurrence is one small GEMM and a few elementwise ops per step
// (sigmoid over all gates at once, the unused slice being cheaper than a second launch per
// step). Outputs are stacked along time and the two directions concatenated on the feature dim,
// which is PyTorch's layout.
//
// For io::export_onnx each forward is one op ("lstm", "gru") that hands the exporter its input,
// initial states, weights and options, which it writes as ONNX's LSTM/GRU operators (one per
// layer); the steps inside are not recorded, so the exported graph does not depend on the
// sequence length and builds no zero state of the traced batch size.
#include "dltrain/nn/rnn.hpp"

#include <cmath>
#include <string>

#include "dltrain/autograd/node.hpp"
#include "dltrain/nn/init.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/linalg.hpp"
#include "dltrain/ops/loss.hpp"
#include "dltrain/ops/shape.hpp"
#include "src/core/graph_trace.hpp"
#include "src/core/trace.hpp"

namespace dltrain::nn {

RNNBase::RNNBase(const char* type_name, int64_t gates, int64_t input_size_, int64_t hidden_size_,
                 const RNNOptions& options_, TensorOptions opts)
    : Module(type_name),
      input_size(input_size_),
      hidden_size(hidden_size_),
      options(options_),
      gates_(gates) {
  DLTRAIN_CHECK(input_size > 0 && hidden_size > 0 && options.num_layers > 0, type_name,
                ": input_size, hidden_size and num_layers must be > 0 but are ", input_size, ", ",
                hidden_size, " and ", options.num_layers);
  DLTRAIN_CHECK(options.dropout >= 0.0 && options.dropout <= 1.0, type_name,
                ": dropout must be in [0, 1] but is ", options.dropout);
  opts.requires_grad = false;
  const int64_t D = options.bidirectional ? 2 : 1, G = gates * hidden_size;
  for (int64_t k = 0; k < options.num_layers; ++k) {
    for (int64_t d = 0; d < D; ++d) {
      const std::string sfx = "_l" + std::to_string(k) + (d == 1 ? "_reverse" : "");
      const int64_t in = k == 0 ? input_size : hidden_size * D;
      LayerWeights w;
      w.w_ih = register_parameter("weight_ih" + sfx, empty({G, in}, opts));
      w.w_hh = register_parameter("weight_hh" + sfx, empty({G, hidden_size}, opts));
      if (options.bias) {
        w.b_ih = register_parameter("bias_ih" + sfx, empty({G}, opts));
        w.b_hh = register_parameter("bias_hh" + sfx, empty({G}, opts));
      }
      weights_.push_back(w);
    }
  }
  reset_parameters();
}

void RNNBase::reset_parameters() {
  NoGradGuard ng;
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden_size));
  for (auto& w : weights_)
    for (Tensor* t : {&w.w_ih, &w.w_hh, &w.b_ih, &w.b_hh})
      if (t->defined()) init::uniform_(*t, -bound, bound);
}

std::string RNNBase::extra_repr() const {
  std::string s = std::to_string(input_size) + ", " + std::to_string(hidden_size);
  if (options.num_layers != 1) s += ", num_layers=" + std::to_string(options.num_layers);
  if (!options.bias) s += ", bias=False";
  if (options.batch_first) s += ", batch_first=True";
  if (options.dropout != 0.0) {
    std::string p = std::to_string(options.dropout);
    p.erase(p.find_last_not_of('0') + 1);
    if (p.back() == '.') p += '0';
    s += ", dropout=" + p;
  }
  if (options.bidirectional) s += ", bidirectional=True";
  return s;
}

Tensor RNNBase::prepare(const Tensor& input, std::initializer_list<const Tensor*> states,
                        bool& batched) const {
  const char* op = type_name().c_str();
  DLTRAIN_CHECK(input.defined() && (input.dim() == 3 || input.dim() == 2), op, ": input must be ",
                options.batch_first ? "[N, T, input_size]" : "[T, N, input_size]",
                " or unbatched [T, input_size] but is ",
                input.defined() ? shape_str(input.shape()) : std::string("undefined"));
  DLTRAIN_CHECK(input.size(-1) == input_size, op, ": input ", shape_str(input.shape()), " has ",
                input.size(-1), " features in its last dim but input_size is ", input_size);
  batched = input.dim() == 3;
  const Tensor x = !batched              ? input.unsqueeze(1)
                   : options.batch_first ? input.transpose(0, 1)
                                         : input;
  const int64_t LD = options.num_layers * (options.bidirectional ? 2 : 1);
  const Shape want = batched ? Shape{LD, x.size(1), hidden_size} : Shape{LD, hidden_size};
  for (const Tensor* h : states) {
    if (!h->defined()) continue;
    DLTRAIN_CHECK(h->shape() == want, op, ": the initial state ", shape_str(h->shape()),
                  " must be [num_layers * directions, ", batched ? "N, " : "",
                  "hidden_size] = ", shape_str(want), " (it is never batch-first)");
    DLTRAIN_CHECK(h->dtype() == input.dtype(), op, ": the initial state has dtype ", h->dtype(),
                  " but the input ", input.dtype(), "; convert it with .to(", input.dtype(), ")");
  }
  return x;
}

Tensor RNNBase::initial_state(const Tensor& h, const Tensor& x, bool batched) const {
  const int64_t LD = options.num_layers * (options.bidirectional ? 2 : 1);
  if (!h.defined()) return zeros({LD, x.size(1), hidden_size}, x.options());
  return batched ? h : h.unsqueeze(1);
}

Tensor RNNBase::finish_output(const Tensor& y, bool batched) const {
  if (!batched) return y.squeeze(1);
  return options.batch_first ? y.transpose(0, 1) : y;
}

namespace {

// Runs the layers over x [T, N, in]: for each layer and direction, `step(xw_t, state, w)` maps
// the projected input at time t and the state to the new state, whose first tensor is the
// output. States are vectors (h) or (h, c) indexed by layer * D + d.
template <class Step>
Tensor run_layers(const RNNBase& m, Tensor x, std::vector<std::vector<Tensor>>& state,
                  const Step& step) {
  const int64_t D = m.options.bidirectional ? 2 : 1, T = x.size(0);
  for (int64_t k = 0; k < m.options.num_layers; ++k) {
    std::vector<Tensor> dir_out;
    for (int64_t d = 0; d < D; ++d) {
      const auto& w = m.weights()[static_cast<size_t>(k * D + d)];
      const Tensor xw = linear(x, w.w_ih, w.b_ih);  // [T, N, G*H]: one GEMM for all steps
      auto& s = state[static_cast<size_t>(k * D + d)];
      std::vector<Tensor> outs(static_cast<size_t>(T));
      for (int64_t i = 0; i < T; ++i) {
        const int64_t t = d == 0 ? i : T - 1 - i;
        s = step(xw.select(0, t), s, w);
        outs[static_cast<size_t>(t)] = s[0];
      }
      dir_out.push_back(stack(outs, 0));
    }
    x = D == 1 ? dir_out[0] : cat(dir_out, 2);
    if (k + 1 < m.options.num_layers && m.is_training() && m.options.dropout > 0.0)
      x = dropout(x, m.options.dropout, true);
  }
  return x;
}

// The exporter's view of a recurrent forward: input, initial states (undefined when not given),
// then w_ih, w_hh, b_ih, b_hh of each layer and direction; options as attributes.
std::vector<Tensor> graph_inputs(const RNNBase& m, std::initializer_list<const Tensor*> head) {
  std::vector<Tensor> v;
  for (const Tensor* t : head) v.push_back(*t);
  for (const auto& w : m.weights()) v.insert(v.end(), {w.w_ih, w.w_hh, w.b_ih, w.b_hh});
  return v;
}

std::vector<detail::GraphAttr> graph_attrs(const RNNBase& m) {
  return {{"hidden_size", m.hidden_size},
          {"num_layers", m.options.num_layers},
          {"bidirectional", m.options.bidirectional},
          {"batch_first", m.options.batch_first},
          {"bias", m.options.bias}};
}

}  // namespace

// --- LSTM ------------------------------------------------------------------------------------

LSTM::LSTM(int64_t input_size_, int64_t hidden_size_, const RNNOptions& options_,
           TensorOptions opts)
    : RNNBase("LSTM", 4, input_size_, hidden_size_, options_, opts) {}

std::pair<Tensor, std::pair<Tensor, Tensor>> LSTM::forward(const Tensor& input,
                                                           const std::pair<Tensor, Tensor>& hx) {
  DLTRAIN_OP_SCOPE("lstm", input, hx.first, hx.second);
  if (dltrain_op_scope_.graph()) [[unlikely]] {
    const std::vector<Tensor> r = detail::graph_cold([&] {
      return detail::graph_record(
          graph_inputs(*this, {&input, &hx.first, &hx.second}), graph_attrs(*this), [&] {
            const auto o = forward(input, hx);
            return std::vector<Tensor>{o.first, o.second.first, o.second.second};
          });
    });
    return {r[0], {r[1], r[2]}};
  }
  DLTRAIN_CHECK(hx.first.defined() == hx.second.defined(),
                "LSTM: give both h0 and c0 or neither (zeros)");
  bool batched = true;
  const Tensor x = prepare(input, {&hx.first, &hx.second}, batched);
  const Tensor h0 = initial_state(hx.first, x, batched), c0 = initial_state(hx.second, x, batched);
  std::vector<std::vector<Tensor>> state;
  for (int64_t j = 0; j < h0.size(0); ++j) state.push_back({h0.select(0, j), c0.select(0, j)});
  const int64_t H = hidden_size;
  const Tensor y = run_layers(
      *this, x, state, [H](const Tensor& xw, const std::vector<Tensor>& s, const LayerWeights& w) {
        const Tensor g = add(xw, linear(s[0], w.w_hh, w.b_hh));  // [N, 4H]: i, f, g, o
        const Tensor sg = sigmoid(g);
        const Tensor c = add(mul(sg.narrow(1, H, H), s[1]),
                             mul(sg.narrow(1, 0, H), tanh(g.narrow(1, 2 * H, H))));
        return std::vector<Tensor>{mul(sg.narrow(1, 3 * H, H), tanh(c)), c};
      });
  std::vector<Tensor> hn, cn;
  for (const auto& s : state) {
    hn.push_back(s[0]);
    cn.push_back(s[1]);
  }
  Tensor h = stack(hn, 0), c = stack(cn, 0);
  if (!batched) {
    h = h.squeeze(1);
    c = c.squeeze(1);
  }
  return {finish_output(y, batched), {h, c}};
}

// --- GRU -------------------------------------------------------------------------------------

GRU::GRU(int64_t input_size_, int64_t hidden_size_, const RNNOptions& options_, TensorOptions opts)
    : RNNBase("GRU", 3, input_size_, hidden_size_, options_, opts) {}

std::pair<Tensor, Tensor> GRU::forward(const Tensor& input, const Tensor& hx) {
  DLTRAIN_OP_SCOPE("gru", input, hx);
  if (dltrain_op_scope_.graph()) [[unlikely]]
    return detail::graph_cold([&] {
      return detail::graph_record(graph_inputs(*this, {&input, &hx}), graph_attrs(*this),
                                  [&] { return forward(input, hx); });
    });
  bool batched = true;
  const Tensor x = prepare(input, {&hx}, batched);
  const Tensor h0 = initial_state(hx, x, batched);
  std::vector<std::vector<Tensor>> state;
  for (int64_t j = 0; j < h0.size(0); ++j) state.push_back({h0.select(0, j)});
  const int64_t H = hidden_size;
  const Tensor y = run_layers(
      *this, x, state, [H](const Tensor& xw, const std::vector<Tensor>& s, const LayerWeights& w) {
        const Tensor gh = linear(s[0], w.w_hh, w.b_hh);  // [N, 3H]: r, z, n
        const Tensor rz = sigmoid(add(xw.narrow(1, 0, 2 * H), gh.narrow(1, 0, 2 * H)));
        const Tensor n =
            tanh(add(xw.narrow(1, 2 * H, H), mul(rz.narrow(1, 0, H), gh.narrow(1, 2 * H, H))));
        // (1 - z) n + z h = n + z (h - n)
        return std::vector<Tensor>{add(n, mul(rz.narrow(1, H, H), sub(s[0], n)))};
      });
  std::vector<Tensor> hn;
  for (const auto& s : state) hn.push_back(s[0]);
  Tensor h = stack(hn, 0);
  if (!batched) h = h.squeeze(1);
  return {finish_output(y, batched), h};
}

}  // namespace dltrain::nn
