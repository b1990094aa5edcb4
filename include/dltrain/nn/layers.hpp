// The standard layers: thin Modules over the functional ops, with PyTorch's
// constructor arguments, state-dict names, default initialisation and
// printing. Each layer keeps handles to its registered tensors in public
// fields (weight, bias, running_mean, ...) for direct access.
#pragma once

#include <functional>
#include <optional>

#include "dltrain/nn/module.hpp"
#include "dltrain/ops/conv.hpp"
#include "dltrain/ops/loss.hpp"
#include "dltrain/ops/resample.hpp"

namespace dltrain::nn {

/// y = x W^T + b. weight [out, in]; default init kaiming_uniform(a = sqrt(5)), bias
/// U(+-1/sqrt(in)).
/// Linear's options by name, as the convolutions take theirs (Conv2dOptions).
struct LinearOptions {
  bool bias = true;
};

class Linear : public Module {
 public:
  /// PyTorch's positional form: Linear(3, 2) or Linear(3, 2, /*bias=*/false).
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         TensorOptions opts = TensorOptions());
  /// The named form: Linear(3, 2, {.bias = false}).
  Linear(int64_t in_features, int64_t out_features, const LinearOptions& options,
         TensorOptions opts = TensorOptions())
      : Linear(in_features, out_features, options.bias, opts) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  void reset_parameters();
  int64_t in_features, out_features;
  Tensor weight, bias;
};

struct Conv2dOptions {
  Int2 stride = 1;
  Int2 padding = 0;
  Int2 dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

/// 2-d convolution. weight [out, in/groups, kH, kW]; PyTorch's default init (as Linear).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Int2 kernel_size,
         const Conv2dOptions& options = {}, TensorOptions opts = TensorOptions());
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  void reset_parameters();
  int64_t in_channels, out_channels;
  Int2 kernel_size;
  Conv2dOptions options;
  Tensor weight, bias;
};

struct Conv1dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

/// 1-d convolution over [N, C, L]. weight [out, in/groups, k]; PyTorch's default init.
class Conv1d : public Module {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size,
         const Conv1dOptions& options = {}, TensorOptions opts = TensorOptions());
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  void reset_parameters();
  int64_t in_channels, out_channels, kernel_size;
  Conv1dOptions options;
  Tensor weight, bias;
};

struct ConvTranspose2dOptions {
  Int2 stride = 1;
  Int2 padding = 0;
  /// Extra rows/columns at the bottom/right of the output (< stride or < dilation).
  Int2 output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  Int2 dilation = 1;
};

/// 2-d transposed convolution ("deconvolution", the decoder's upsampling layer).
/// weight [in, out/groups, kH, kW] (PyTorch's layout and state-dict keys); PyTorch's default
/// init (kaiming_uniform(a = sqrt(5)), fan_in = out/groups * kH * kW, as PyTorch computes it).
class ConvTranspose2d : public Module {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Int2 kernel_size,
                  const ConvTranspose2dOptions& options = {}, TensorOptions opts = TensorOptions());
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  void reset_parameters();
  int64_t in_channels, out_channels;
  Int2 kernel_size;
  ConvTranspose2dOptions options;
  Tensor weight, bias;
};

struct BatchNormOptions {
  double eps = 1e-5;
  /// Running-statistics momentum; nullopt = cumulative moving average (1 / batches seen).
  std::optional<double> momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
};

/// Batch normalisation over channels (dim 1). Buffers running_mean, running_var and the
/// int64 num_batches_tracked, as PyTorch. `expected_dims` = {2, 3} for 1d, {4} for 2d.
class BatchNorm : public Module {
 public:
  BatchNorm(const char* type_name, std::vector<int64_t> expected_dims, int64_t num_features,
            const BatchNormOptions& options, TensorOptions opts);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  void reset_running_stats();
  int64_t num_features;
  BatchNormOptions options;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  /// Cross-replica statistics (SyncBatchNorm). When set, training forwards pass the
  /// per-channel sums [sum(x - k) (C), sum((x - k)^2) (C), count (1)], with k the running
  /// mean (equal on every rank), through this function, which must return their sum over the
  /// data-parallel ranks and be differentiable; normalisation then uses the global batch's
  /// statistics. distributed::convert_sync_batchnorm and distributed::SyncBatchNorm set it.
  std::function<Tensor(const Tensor&)> sync_stats;
  /// Set by nn::fuse_conv_bn when this layer's eval transform was folded into the convolution
  /// before it: forward then returns its input (inference only; training it is refused). Its
  /// tensors are set to the identity transform too (weight 1, bias 0, mean 0, var 1 - eps), so
  /// that a reader of the state dict that ignores the flag computes the same thing.
  bool folded = false;

 private:
  Tensor forward_synced(const Tensor& x);
  std::vector<int64_t> expected_dims_;
};

/// BatchNorm over [N, C] or [N, C, L].
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, const BatchNormOptions& options = {},
                       TensorOptions opts = TensorOptions())
      : BatchNorm("BatchNorm1d", {2, 3}, num_features, options, opts) {}
};

/// BatchNorm over [N, C, H, W] (either memory format).
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, const BatchNormOptions& options = {},
                       TensorOptions opts = TensorOptions())
      : BatchNorm("BatchNorm2d", {4}, num_features, options, opts) {}
};

/// Layer normalisation over the trailing `normalized_shape` dims. bias = false (with
/// elementwise_affine) keeps the weight only, as PyTorch's LayerNorm(..., bias=False).
class LayerNorm : public Module {
 public:
  LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
            TensorOptions opts = TensorOptions(), bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Shape normalized_shape;
  double eps;
  Tensor weight, bias;
};

/// Group normalisation over [N, C, *]; weight ones, bias zeros (PyTorch's init and keys).
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true,
            TensorOptions opts = TensorOptions());
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t num_groups, num_channels;
  double eps;
  Tensor weight, bias;
};

struct InstanceNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;
  /// PyTorch's defaults: no affine parameters, no running statistics.
  bool affine = false;
  bool track_running_stats = false;
};

/// Instance normalisation of [N, C, H, W] (each sample's channel normalised on its own).
/// With track_running_stats, training updates running_mean / running_var (buffers, with
/// num_batches_tracked) and eval normalises with them, as PyTorch.
class InstanceNorm2d : public Module {
 public:
  explicit InstanceNorm2d(int64_t num_features, const InstanceNormOptions& options = {},
                          TensorOptions opts = TensorOptions());
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t num_features;
  InstanceNormOptions options;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};

/// Lookup table: indices (any shape, int64) -> rows of weight [num, dim]; init N(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            std::optional<int64_t> padding_idx = std::nullopt,
            TensorOptions opts = TensorOptions());
  Tensor forward(const Tensor& indices) override;
  std::string extra_repr() const override;
  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;
  Tensor weight;
};

// --- activations and parameter-free layers ------------------------------------------
struct ReLUOptions {
  /// Overwrite the input with the output (relu_): saves one activation's memory. Safe with
  /// autograd: refused where the input's memory is shared or was saved by an op (see relu_).
  bool inplace = false;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  explicit ReLU(ReLUOptions options) : Module("ReLU"), inplace(options.inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  bool inplace = false;
};

class GELU : public Module {
 public:
  /// approximate = true uses the tanh form.
  explicit GELU(bool approximate = false) : Module("GELU"), approximate(approximate) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  bool approximate;
};

class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01)
      : Module("LeakyReLU"), negative_slope(negative_slope) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double negative_slope;
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& x) override;
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

class Softplus : public Module {
 public:
  explicit Softplus(double beta = 1.0, double threshold = 20.0)
      : Module("Softplus"), beta(beta), threshold(threshold) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double beta, threshold;
};

class ELU : public Module {
 public:
  explicit ELU(double alpha = 1.0) : Module("ELU"), alpha(alpha) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double alpha;
};

class Mish : public Module {
 public:
  Mish() : Module("Mish") {}
  Tensor forward(const Tensor& x) override;
};

class Hardswish : public Module {
 public:
  Hardswish() : Module("Hardswish") {}
  Tensor forward(const Tensor& x) override;
};

/// Resizes [N, C, H, W] feature maps (interpolate with fixed options), e.g.
/// Upsample({.scale_factor = 2.0, .mode = InterpolateMode::Bilinear}).
class Upsample : public Module {
 public:
  explicit Upsample(const InterpolateOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  InterpolateOptions options;
};

/// [N, C*r*r, H, W] -> [N, C, H*r, W*r].
class PixelShuffle : public Module {
 public:
  explicit PixelShuffle(int64_t upscale_factor)
      : Module("PixelShuffle"), upscale_factor(upscale_factor) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t upscale_factor;
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& x) override { return x; }
};

/// Flattens dims start_dim..end_dim (default: all but the batch dim).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Module("Flatten"), start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t start_dim, end_dim;
};

/// Zeroes elements with probability p in training mode (scaling the rest by 1/(1-p)).
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double p;
};

class MaxPool2d : public Module {
 public:
  /// stride defaults to the kernel size.
  explicit MaxPool2d(Int2 kernel_size, std::optional<Int2> stride = std::nullopt, Int2 padding = 0,
                     Int2 dilation = 1, bool ceil_mode = false);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Int2 kernel_size, stride, padding, dilation;
  bool ceil_mode;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Int2 kernel_size, std::optional<Int2> stride = std::nullopt, Int2 padding = 0,
                     bool ceil_mode = false, bool count_include_pad = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Int2 kernel_size, stride, padding;
  bool ceil_mode, count_include_pad;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Int2 output_size)
      : Module("AdaptiveAvgPool2d"), output_size(output_size) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Int2 output_size;
};

// --- losses ---------------------------------------------------------------------------
/// Cross-entropy of logits against class indices (label smoothing, ignore_index, weights).
class CrossEntropyLoss : public Module {
 public:
  using Module::forward;
  explicit CrossEntropyLoss(CrossEntropyOptions options = {});
  Tensor forward(const Tensor& logits, const Tensor& target);
  Tensor operator()(const Tensor& logits, const Tensor& target) { return forward(logits, target); }
  std::string extra_repr() const override;
  CrossEntropyOptions options;
};

class NLLLoss : public Module {
 public:
  using Module::forward;
  explicit NLLLoss(NLLLossOptions options = {});
  Tensor forward(const Tensor& log_probs, const Tensor& target);
  Tensor operator()(const Tensor& a, const Tensor& b) { return forward(a, b); }
  NLLLossOptions options;
};

class MSELoss : public Module {
 public:
  using Module::forward;
  explicit MSELoss(Reduction reduction = Reduction::Mean)
      : Module("MSELoss"), reduction(reduction) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& a, const Tensor& b) { return forward(a, b); }
  Reduction reduction;
};

class BCEWithLogitsLoss : public Module {
 public:
  using Module::forward;
  explicit BCEWithLogitsLoss(Reduction reduction = Reduction::Mean, Tensor pos_weight = Tensor());
  Tensor forward(const Tensor& logits, const Tensor& target);
  Tensor operator()(const Tensor& a, const Tensor& b) { return forward(a, b); }
  Reduction reduction;
  Tensor pos_weight;
};

class L1Loss : public Module {
 public:
  using Module::forward;
  explicit L1Loss(Reduction reduction = Reduction::Mean) : Module("L1Loss"), reduction(reduction) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& a, const Tensor& b) { return forward(a, b); }
  Reduction reduction;
};

class SmoothL1Loss : public Module {
 public:
  using Module::forward;
  explicit SmoothL1Loss(Reduction reduction = Reduction::Mean, double beta = 1.0)
      : Module("SmoothL1Loss"), reduction(reduction), beta(beta) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& a, const Tensor& b) { return forward(a, b); }
  Reduction reduction;
  double beta;
};

class HuberLoss : public Module {
 public:
  using Module::forward;
  explicit HuberLoss(Reduction reduction = Reduction::Mean, double delta = 1.0)
      : Module("HuberLoss"), reduction(reduction), delta(delta) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& a, const Tensor& b) { return forward(a, b); }
  Reduction reduction;
  double delta;
};

class KLDivLoss : public Module {
 public:
  using Module::forward;
  explicit KLDivLoss(KLDivReduction reduction = KLDivReduction::Mean, bool log_target = false)
      : Module("KLDivLoss"), reduction(reduction), log_target(log_target) {}
  /// input: log-probabilities; target: probabilities (log-probabilities with log_target).
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& a, const Tensor& b) { return forward(a, b); }
  KLDivReduction reduction;
  bool log_target;
};

/// Binary cross-entropy on probabilities; weight (a buffer when given) rescales each element.
class BCELoss : public Module {
 public:
  using Module::forward;
  explicit BCELoss(Tensor weight = Tensor(), Reduction reduction = Reduction::Mean);
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& a, const Tensor& b) { return forward(a, b); }
  Tensor weight;
  Reduction reduction;
};

class GaussianNLLLoss : public Module {
 public:
  using Module::forward;
  explicit GaussianNLLLoss(bool full = false, double eps = 1e-6,
                           Reduction reduction = Reduction::Mean)
      : Module("GaussianNLLLoss"), full(full), eps(eps), reduction(reduction) {}
  Tensor forward(const Tensor& input, const Tensor& target, const Tensor& var);
  Tensor operator()(const Tensor& a, const Tensor& b, const Tensor& v) { return forward(a, b, v); }
  bool full;
  double eps;
  Reduction reduction;
};

}  // namespace dltrain::nn
