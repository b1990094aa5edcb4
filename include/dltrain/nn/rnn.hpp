// Recurrent layers with PyTorch's arguments, parameter names, gate order and initialisation:
// nn::LSTM and nn::GRU (num_layers, bias, batch_first, dropout between layers, bidirectional).
//
// Composite: each layer and direction projects the whole input sequence with one GEMM
// (x W_ih^T + b_ih), then steps through time with one [N, H] x [H, G*H] product and the gate
// ops per step, so autograd (backpropagation through time) comes from the ops' nodes. No fused
// cell kernel and no packed sequences (pad and mask instead); proj_size is not provided.
#pragma once

#include <utility>

#include "dltrain/nn/module.hpp"

namespace dltrain::nn {

struct RNNOptions {
  int64_t num_layers = 1;
  /// bias_ih_l* and bias_hh_l* parameters.
  bool bias = true;
  /// Input and output [N, T, *] instead of [T, N, *] (the hidden states stay [L*D, N, H]).
  bool batch_first = false;
  /// Dropout on the outputs of every layer but the last (training mode only).
  double dropout = 0.0;
  bool bidirectional = false;
};

/// Shared parameters and layer loop of LSTM and GRU. Parameters per layer k and direction
/// (suffix "" or "_reverse"), in PyTorch's order: weight_ih_l{k} [G*H, in], weight_hh_l{k}
/// [G*H, H], bias_ih_l{k} [G*H], bias_hh_l{k} [G*H], with G = 4 (LSTM: gates i, f, g, o) or
/// 3 (GRU: r, z, n); in = input_size for k = 0, else H * directions. Initialised
/// U(-1/sqrt(H), 1/sqrt(H)) as PyTorch.
class RNNBase : public Module {
 public:
  int64_t input_size, hidden_size;
  RNNOptions options;
  /// weights()[k * directions + d] = {w_ih, w_hh, b_ih, b_hh} (biases undefined without bias).
  struct LayerWeights {
    Tensor w_ih, w_hh, b_ih, b_hh;
  };
  const std::vector<LayerWeights>& weights() const { return weights_; }
  std::string extra_repr() const override;
  void reset_parameters();

 protected:
  RNNBase(const char* type_name, int64_t gates, int64_t input_size, int64_t hidden_size,
          const RNNOptions& options, TensorOptions opts);
  /// Checks input ([T, N, in], [N, T, in] with batch_first, or unbatched [T, in]) and an
  /// optional state ([L*D, N, H], or [L*D, H] unbatched); returns the input as [T, N, in].
  Tensor prepare(const Tensor& input, std::initializer_list<const Tensor*> states,
                 bool& batched) const;
  /// Zeros [L*D, N, H] when `h` is undefined, else h as [L*D, N, H].
  Tensor initial_state(const Tensor& h, const Tensor& x, bool batched) const;
  /// Output [T, N, H*D] -> the caller's layout.
  Tensor finish_output(const Tensor& y, bool batched) const;

  int64_t gates_;
  std::vector<LayerWeights> weights_;
};

/// torch.nn.LSTM. i = s(x W_ii + b_ii + h W_hi + b_hi), f, g = tanh(..), o likewise; c' = f c +
/// i g; h' = o tanh(c').
class LSTM : public RNNBase {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, const RNNOptions& options = {},
       TensorOptions opts = TensorOptions());
  using Module::forward;
  /// input [T, N, input_size] ([N, T, *] batch_first, [T, *] unbatched), hx = {h0, c0} each
  /// [num_layers * directions, N, H] (zeros when undefined) -> {output [T, N, directions * H],
  /// {h_n, c_n}}, as PyTorch's `output, (h_n, c_n) = lstm(x, (h0, c0))`.
  std::pair<Tensor, std::pair<Tensor, Tensor>> forward(const Tensor& input,
                                                       const std::pair<Tensor, Tensor>& hx);
  std::pair<Tensor, std::pair<Tensor, Tensor>> operator()(
      const Tensor& input, const std::pair<Tensor, Tensor>& hx = {}) {
    return forward(input, hx);
  }
};

/// torch.nn.GRU. r = s(x W_ir + b_ir + h W_hr + b_hr), z likewise, n = tanh(x W_in + b_in +
/// r (h W_hn + b_hn)); h' = (1 - z) n + z h.
class GRU : public RNNBase {
 public:
  GRU(int64_t input_size, int64_t hidden_size, const RNNOptions& options = {},
      TensorOptions opts = TensorOptions());
  using Module::forward;
  /// input as LSTM's; hx [num_layers * directions, N, H] (zeros when undefined) -> {output,
  /// h_n}.
  std::pair<Tensor, Tensor> forward(const Tensor& input, const Tensor& hx);
  std::pair<Tensor, Tensor> operator()(const Tensor& input, const Tensor& hx = Tensor()) {
    return forward(input, hx);
  }
};

}  // namespace dltrain::nn
