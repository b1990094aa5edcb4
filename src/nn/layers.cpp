// The layers and loss modules of dltrain/nn/layers.hpp: each registers its parameters and
// buffers and forwards to the functional op of the same name.
#include "dltrain/nn/layers.hpp"

#include <cmath>
#include <sstream>

#include "dltrain/autograd/node.hpp"
#include "dltrain/nn/checkpoint.hpp"
#include "dltrain/nn/init.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/indexing.hpp"
#include "dltrain/ops/linalg.hpp"
#include "dltrain/ops/norm.hpp"
#include "dltrain/ops/pool.hpp"
#include "dltrain/ops/reduction.hpp"
#include "dltrain/ops/shape.hpp"

namespace dltrain::nn {

namespace {

std::string pair_str(Int2 v) {
  std::ostringstream os;
  os << '(' << v.h << ", " << v.w << ')';
  return os.str();
}
const char* py_bool(bool b) { return b ? "True" : "False"; }
std::string num_str(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
// A Python float's repr for round values ("2.0", not "2"), as PyTorch prints float options.
std::string py_float(double v) {
  const std::string t = num_str(v);
  return t.find_first_of(".eEin") == std::string::npos ? t + ".0" : t;
}

// PyTorch's default for Linear and Conv: kaiming_uniform(a = sqrt(5)) on the weight, which is
// U(+-1/sqrt(fan_in)), and the same bound for the bias.
void default_init(Tensor& weight, Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    auto fan_in = init::calculate_fan_in_and_fan_out(weight).first;
    double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}

void check_positive(int64_t v, const char* layer, const char* what) {
  DLTRAIN_CHECK(v > 0, layer, ": ", what, " must be positive, got ", v);
}

}  // namespace

// --- Linear -------------------------------------------------------------------------
Linear::Linear(int64_t in, int64_t out, bool with_bias, TensorOptions opts)
    : Module("Linear"), in_features(in), out_features(out) {
  check_positive(in, "Linear", "in_features");
  check_positive(out, "Linear", "out_features");
  opts.requires_grad = false;
  weight = register_parameter("weight", empty({out, in}, opts));
  if (with_bias) bias = register_parameter("bias", empty({out}, opts));
  reset_parameters();
}

void Linear::reset_parameters() { default_init(weight, bias); }

Tensor Linear::forward(const Tensor& x) {
  DLTRAIN_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "Linear(in_features=", in_features,
                "): input of shape ", shape_str(x.shape()), " must end in ", in_features,
                " features; flatten or reshape it first");
  return linear(x, weight, bias);
}

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(in_features) +
         ", out_features=" + std::to_string(out_features) + ", bias=" + py_bool(bias.defined());
}

// --- Conv2d -------------------------------------------------------------------------
Conv2d::Conv2d(int64_t in, int64_t out, Int2 k, const Conv2dOptions& o, TensorOptions opts)
    : Module("Conv2d"), in_channels(in), out_channels(out), kernel_size(k), options(o) {
  check_positive(in, "Conv2d", "in_channels");
  check_positive(out, "Conv2d", "out_channels");
  check_positive(o.groups, "Conv2d", "groups");
  DLTRAIN_CHECK(in % o.groups == 0 && out % o.groups == 0, "Conv2d: in_channels (", in,
                ") and out_channels (", out, ") must both be divisible by groups (", o.groups, ")");
  DLTRAIN_CHECK(k.h > 0 && k.w > 0, "Conv2d: kernel_size must be positive, got ", pair_str(k));
  opts.requires_grad = false;
  weight = register_parameter("weight", empty({out, in / o.groups, k.h, k.w}, opts));
  if (o.bias) bias = register_parameter("bias", empty({out}, opts));
  reset_parameters();
}

void Conv2d::reset_parameters() { default_init(weight, bias); }

Tensor Conv2d::forward(const Tensor& x) {
  // The layer knows in_channels: its hints can say which fix fits (issue 28).
  if (x.defined() && x.dim() == 3) {
    const bool images = in_channels == 1, one = x.size(0) == in_channels;
    DLTRAIN_FAIL("Conv2d(in_channels=", in_channels, "): expected a 4-d input [N, ", in_channels,
                 ", H, W] but got shape ", shape_str(x.shape()), "; ",
                 images ? "for N one-channel images [N, H, W] add the channel dim with "
                          "x.unsqueeze(1)"
                 : one  ? "for one image [C, H, W] add the batch dim with x.unsqueeze(0)"
                        : "add the missing batch dim (unsqueeze(0)) or channel dim "
                          "(unsqueeze(1))");
  }
  if (x.defined() && x.dim() == 4 && x.size(1) != in_channels) {
    DLTRAIN_FAIL("Conv2d: the input has ", x.size(1), " channels (shape ", shape_str(x.shape()),
                 ") but the layer's in_channels is ", in_channels, "; ",
                 x.size(3) == in_channels
                     ? "the input looks like [N, H, W, C] data: permute it with "
                       "x.permute({0, 3, 1, 2}) (channels-last layout is a memory format, not "
                       "a shape: x.contiguous(MemoryFormat::ChannelsLast))"
                     : "check the previous layer's out_channels, or this layer's in_channels");
  }
  return conv2d(x, weight, bias, options.stride, options.padding, options.dilation, options.groups);
}

std::string Conv2d::extra_repr() const {
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + pair_str(kernel_size) + ", stride=" + pair_str(options.stride);
  if (!(options.padding == Int2(0))) s += ", padding=" + pair_str(options.padding);
  if (!(options.dilation == Int2(1))) s += ", dilation=" + pair_str(options.dilation);
  if (options.groups != 1) s += ", groups=" + std::to_string(options.groups);
  if (!options.bias) s += ", bias=False";
  return s;
}

// --- Conv1d -------------------------------------------------------------------------
Conv1d::Conv1d(int64_t in, int64_t out, int64_t k, const Conv1dOptions& o, TensorOptions opts)
    : Module("Conv1d"), in_channels(in), out_channels(out), kernel_size(k), options(o) {
  check_positive(in, "Conv1d", "in_channels");
  check_positive(out, "Conv1d", "out_channels");
  check_positive(k, "Conv1d", "kernel_size");
  check_positive(o.groups, "Conv1d", "groups");
  DLTRAIN_CHECK(in % o.groups == 0 && out % o.groups == 0, "Conv1d: in_channels (", in,
                ") and out_channels (", out, ") must both be divisible by groups (", o.groups, ")");
  opts.requires_grad = false;
  weight = register_parameter("weight", empty({out, in / o.groups, k}, opts));
  if (o.bias) bias = register_parameter("bias", empty({out}, opts));
  reset_parameters();
}

void Conv1d::reset_parameters() { default_init(weight, bias); }

Tensor Conv1d::forward(const Tensor& x) {
  return conv1d(x, weight, bias, options.stride, options.padding, options.dilation, options.groups);
}

std::string Conv1d::extra_repr() const {
  auto one = [](int64_t v) { return "(" + std::to_string(v) + ",)"; };
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + one(kernel_size) + ", stride=" + one(options.stride);
  if (options.padding != 0) s += ", padding=" + one(options.padding);
  if (options.dilation != 1) s += ", dilation=" + one(options.dilation);
  if (options.groups != 1) s += ", groups=" + std::to_string(options.groups);
  if (!options.bias) s += ", bias=False";
  return s;
}

// --- ConvTranspose2d ----------------------------------------------------------------
ConvTranspose2d::ConvTranspose2d(int64_t in, int64_t out, Int2 k, const ConvTranspose2dOptions& o,
                                 TensorOptions opts)
    : Module("ConvTranspose2d"), in_channels(in), out_channels(out), kernel_size(k), options(o) {
  check_positive(in, "ConvTranspose2d", "in_channels");
  check_positive(out, "ConvTranspose2d", "out_channels");
  check_positive(o.groups, "ConvTranspose2d", "groups");
  DLTRAIN_CHECK(in % o.groups == 0 && out % o.groups == 0, "ConvTranspose2d: in_channels (", in,
                ") and out_channels (", out, ") must both be divisible by groups (", o.groups, ")");
  DLTRAIN_CHECK(k.h > 0 && k.w > 0, "ConvTranspose2d: kernel_size must be positive, got ",
                pair_str(k));
  DLTRAIN_CHECK((o.output_padding.h < o.stride.h || o.output_padding.h < o.dilation.h) &&
                    (o.output_padding.w < o.stride.w || o.output_padding.w < o.dilation.w),
                "ConvTranspose2d: output_padding ", pair_str(o.output_padding),
                " must be smaller than either stride ", pair_str(o.stride), " or dilation ",
                pair_str(o.dilation));
  opts.requires_grad = false;
  weight = register_parameter("weight", empty({in, out / o.groups, k.h, k.w}, opts));
  if (o.bias) bias = register_parameter("bias", empty({out}, opts));
  reset_parameters();
}

void ConvTranspose2d::reset_parameters() { default_init(weight, bias); }

Tensor ConvTranspose2d::forward(const Tensor& x) {
  return conv_transpose2d(x, weight, bias, options.stride, options.padding, options.output_padding,
                          options.groups, options.dilation);
}

std::string ConvTranspose2d::extra_repr() const {
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + pair_str(kernel_size) + ", stride=" + pair_str(options.stride);
  if (!(options.padding == Int2(0))) s += ", padding=" + pair_str(options.padding);
  if (!(options.dilation == Int2(1))) s += ", dilation=" + pair_str(options.dilation);
  if (!(options.output_padding == Int2(0)))
    s += ", output_padding=" + pair_str(options.output_padding);
  if (options.groups != 1) s += ", groups=" + std::to_string(options.groups);
  if (!options.bias) s += ", bias=False";
  return s;
}

// --- GroupNorm, InstanceNorm2d ------------------------------------------------------
GroupNorm::GroupNorm(int64_t g, int64_t c, double eps, bool affine, TensorOptions opts)
    : Module("GroupNorm"), num_groups(g), num_channels(c), eps(eps) {
  check_positive(g, "GroupNorm", "num_groups");
  check_positive(c, "GroupNorm", "num_channels");
  DLTRAIN_CHECK(c % g == 0, "GroupNorm: num_channels (", c, ") must be divisible by num_groups (",
                g, ")");
  opts.requires_grad = false;
  if (affine) {
    weight = register_parameter("weight", ones({c}, opts));
    bias = register_parameter("bias", zeros({c}, opts));
  }
}
Tensor GroupNorm::forward(const Tensor& x) {
  DLTRAIN_CHECK(x.dim() >= 2 && x.size(1) == num_channels, "GroupNorm(", num_groups, ", ",
                num_channels, "): input of shape ", shape_str(x.shape()), " must be [N, ",
                num_channels, ", ...]");
  return group_norm(x, num_groups, weight, bias, eps);
}
std::string GroupNorm::extra_repr() const {
  return std::to_string(num_groups) + ", " + std::to_string(num_channels) +
         ", eps=" + num_str(eps) + ", affine=" + py_bool(weight.defined());
}

InstanceNorm2d::InstanceNorm2d(int64_t n, const InstanceNormOptions& o, TensorOptions opts)
    : Module("InstanceNorm2d"), num_features(n), options(o) {
  check_positive(n, "InstanceNorm2d", "num_features");
  opts.requires_grad = false;
  if (o.affine) {
    weight = register_parameter("weight", ones({n}, opts));
    bias = register_parameter("bias", zeros({n}, opts));
  }
  if (o.track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({n}, opts));
    running_var = register_buffer("running_var", ones({n}, opts));
    num_batches_tracked = register_buffer(
        "num_batches_tracked", zeros({}, TensorOptions(DType::i64).with_device(opts.device)));
  }
}
Tensor InstanceNorm2d::forward(const Tensor& x) {
  DLTRAIN_CHECK(x.dim() == 4 && x.size(1) == num_features, "InstanceNorm2d(", num_features,
                "): expected an input [N, ", num_features, ", H, W] but got shape ",
                shape_str(x.shape()));
  const bool use_input_stats = is_training() || !options.track_running_stats;
  // A checkpointed segment's recomputation updates copies: the statistics move once per step.
  const bool update = options.track_running_stats && is_training();
  const bool again = update && is_recomputing();
  if (update && !again) {
    NoGradGuard ng;
    add_(num_batches_tracked, 1.0);
  }
  return instance_norm(x, again ? running_mean.clone() : running_mean,
                       again ? running_var.clone() : running_var, weight, bias, use_input_stats,
                       options.momentum, options.eps);
}
std::string InstanceNorm2d::extra_repr() const {
  return std::to_string(num_features) + ", eps=" + num_str(options.eps) +
         ", momentum=" + num_str(options.momentum) + ", affine=" + py_bool(options.affine) +
         ", track_running_stats=" + py_bool(options.track_running_stats);
}

// --- BatchNorm ----------------------------------------------------------------------
BatchNorm::BatchNorm(const char* type_name, std::vector<int64_t> expected_dims, int64_t n,
                     const BatchNormOptions& o, TensorOptions opts)
    : Module(type_name), num_features(n), options(o), expected_dims_(std::move(expected_dims)) {
  check_positive(n, type_name, "num_features");
  DLTRAIN_CHECK(!o.momentum || (*o.momentum >= 0 && *o.momentum <= 1), type_name,
                ": momentum must be in [0, 1], got ", *o.momentum);
  opts.requires_grad = false;
  if (o.affine) {
    weight = register_parameter("weight", ones({n}, opts));
    bias = register_parameter("bias", zeros({n}, opts));
  }
  if (o.track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({n}, opts));
    running_var = register_buffer("running_var", ones({n}, opts));
    num_batches_tracked = register_buffer(
        "num_batches_tracked", zeros({}, TensorOptions(DType::i64).with_device(opts.device)));
  }
}

void BatchNorm::reset_running_stats() {
  if (!options.track_running_stats) return;
  running_mean.zero_();
  running_var.fill_(1.0);
  num_batches_tracked.zero_();
}

Tensor BatchNorm::forward(const Tensor& x) {
  bool dims_ok = false;
  for (auto d : expected_dims_) dims_ok = dims_ok || x.dim() == d;
  std::string want;
  for (auto d : expected_dims_) want += (want.empty() ? "" : " or ") + std::to_string(d);
  DLTRAIN_CHECK(dims_ok, type_name(), ": expected a ", want, "-d input, got shape ",
                shape_str(x.shape()));
  DLTRAIN_CHECK(x.size(1) == num_features, type_name(), "(", num_features, "): input has ",
                x.size(1), " channels (shape ", shape_str(x.shape()), ")");
  if (folded) {
    DLTRAIN_CHECK(!is_training(), type_name(), "(", num_features,
                  "): this layer was folded into the convolution before it (nn::fuse_conv_bn), "
                  "which is for inference only; call eval(), or train a model loaded from the "
                  "unfused weights");
    return x;
  }
  if (is_training() && sync_stats) return forward_synced(x);
  bool use_batch_stats = is_training() || !options.track_running_stats;
  double factor = options.momentum.value_or(0.0);
  // A checkpointed segment's recomputation (nn::checkpoint) runs the same kernels on copies
  // of the statistics, so that they move once per step and the output is the forward's.
  const bool again = is_training() && options.track_running_stats && is_recomputing();
  if (is_training() && options.track_running_stats && !again) {
    autograd::NoGradGuard ng;
    add_(num_batches_tracked, 1.0);
    if (!options.momentum) factor = 1.0 / num_batches_tracked.item<double>();
  }
  // Without running statistics there is nothing to update or to normalise with in eval.
  Tensor rm =
      options.track_running_stats ? (again ? running_mean.clone() : running_mean) : Tensor();
  Tensor rv = options.track_running_stats ? (again ? running_var.clone() : running_var) : Tensor();
  return batch_norm(x, weight, bias, rm, rv, use_batch_stats, factor, options.eps);
}

// The global batch's statistics from sums that sync_stats adds up over the ranks, written
// with differentiable ops (the backward of the sum over ranks is a sum over ranks). The sums
// are shifted by the running mean, the same on every rank, so that E[(x-k)^2] - E[x-k]^2 does
// not cancel catastrophically once the mean has been learnt; 16-bit inputs compute in f32.
Tensor BatchNorm::forward_synced(const Tensor& x) {
  const int64_t c = num_features;
  Shape dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  Shape bshape(static_cast<size_t>(x.dim()), 1);
  bshape[1] = c;
  const bool low = x.dtype() == DType::f16 || x.dtype() == DType::bf16;
  Tensor xf = low ? x.to(DType::f32) : x;
  Tensor shift =
      options.track_running_stats ? running_mean.detach().to(xf.dtype()) : zeros({c}, xf.options());
  Tensor xc = sub(xf, shift.view(bshape));
  const double local_n = static_cast<double>(x.numel() / c);
  Tensor global =
      sync_stats(cat({sum(xc, dims), sum(mul(xc, xc), dims), full({1}, local_n, xf.options())}));
  DLTRAIN_CHECK(global.defined() && global.dim() == 1 && global.size(0) == 2 * c + 1, type_name(),
                ": sync_stats must return the summed [", 2 * c + 1, "] statistics");
  // The global count stays on the device (no host sync per layer); a per-rank batch of one
  // is fine when the other ranks bring more (small per-GPU batches are why SyncBN exists).
  Tensor n = global.narrow(0, 2 * c, 1);
  Tensor mean_c = div(global.narrow(0, 0, c), n);
  Tensor var = sub(div(global.narrow(0, c, c), n), mul(mean_c, mean_c));
  Tensor mean = add(mean_c, shift);
  Tensor y = mul(sub(xf, mean.view(bshape)), rsqrt(add(var, options.eps)).view(bshape));
  if (options.affine) y = add(mul(y, weight.view(bshape)), bias.view(bshape));
  // Not again in a checkpointed segment's recomputation (whose shift is then the updated
  // running mean: the same statistics up to rounding, not bit for bit).
  if (options.track_running_stats && !is_recomputing()) {
    autograd::NoGradGuard ng;
    add_(num_batches_tracked, 1.0);
    const double m =
        options.momentum ? *options.momentum : 1.0 / num_batches_tracked.item<double>();
    Tensor unbiased = div(mul(var.detach(), n), sub(n, 1.0));  // n / (n - 1), on the device
    running_mean.copy_(add(mul(running_mean, 1.0 - m), mul(mean.detach(), m)));
    running_var.copy_(add(mul(running_var, 1.0 - m), mul(unbiased, m)));
  }
  if (low) y = y.to(x.dtype());
  return x.dim() == 4 ? y.contiguous(x.suggest_memory_format()) : y;
}

std::string BatchNorm::extra_repr() const {
  return std::to_string(num_features) + ", eps=" + num_str(options.eps) +
         ", momentum=" + (options.momentum ? num_str(*options.momentum) : std::string("None")) +
         ", affine=" + py_bool(options.affine) +
         ", track_running_stats=" + py_bool(options.track_running_stats);
}

// --- LayerNorm ----------------------------------------------------------------------
LayerNorm::LayerNorm(Shape shape, double eps_, bool affine, TensorOptions opts, bool with_bias)
    : Module("LayerNorm"), normalized_shape(std::move(shape)), eps(eps_) {
  DLTRAIN_CHECK(!normalized_shape.empty(), "LayerNorm: normalized_shape must not be empty");
  opts.requires_grad = false;
  if (affine) {
    weight = register_parameter("weight", ones(normalized_shape, opts));
    if (with_bias) bias = register_parameter("bias", zeros(normalized_shape, opts));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, normalized_shape, weight, bias, eps);
}

std::string LayerNorm::extra_repr() const {
  std::string s = "(";
  for (size_t i = 0; i < normalized_shape.size(); ++i) {
    s += std::to_string(normalized_shape[i]) + (normalized_shape.size() == 1 ? "," : "");
    if (i + 1 < normalized_shape.size()) s += ", ";
  }
  return s + "), eps=" + num_str(eps) + ", elementwise_affine=" + py_bool(weight.defined());
}

// --- Embedding ----------------------------------------------------------------------
Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> pad, TensorOptions opts)
    : Module("Embedding"), num_embeddings(num), embedding_dim(dim), padding_idx(pad) {
  check_positive(num, "Embedding", "num_embeddings");
  check_positive(dim, "Embedding", "embedding_dim");
  if (padding_idx && *padding_idx < 0) padding_idx = *padding_idx + num;
  DLTRAIN_CHECK(!padding_idx || (*padding_idx >= 0 && *padding_idx < num),
                "Embedding: padding_idx must be within num_embeddings (", num, ")");
  opts.requires_grad = false;
  weight = register_parameter("weight", empty({num, dim}, opts));
  init::normal_(weight);
  if (padding_idx) {
    autograd::NoGradGuard ng;
    weight.detach().select(0, *padding_idx).zero_();
  }
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices, padding_idx); }

std::string Embedding::extra_repr() const {
  std::string s = std::to_string(num_embeddings) + ", " + std::to_string(embedding_dim);
  if (padding_idx) s += ", padding_idx=" + std::to_string(*padding_idx);
  return s;
}

// --- parameter-free layers ----------------------------------------------------------
Tensor ReLU::forward(const Tensor& x) {
  if (!inplace) return relu(x);
  Tensor y = x;  // the same tensor: relu_ changes x's memory and history
  relu_(y);
  return y;
}

std::string ReLU::extra_repr() const { return inplace ? "inplace=true" : ""; }
Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate); }
std::string GELU::extra_repr() const { return approximate ? "approximate='tanh'" : ""; }
Tensor LeakyReLU::forward(const Tensor& x) { return leaky_relu(x, negative_slope); }
std::string LeakyReLU::extra_repr() const { return "negative_slope=" + num_str(negative_slope); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }
Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Tensor Softplus::forward(const Tensor& x) { return softplus(x, beta, threshold); }
std::string Softplus::extra_repr() const {
  return "beta=" + py_float(beta) + ", threshold=" + py_float(threshold);
}
Tensor ELU::forward(const Tensor& x) { return elu(x, alpha); }
std::string ELU::extra_repr() const { return "alpha=" + py_float(alpha); }
Tensor Mish::forward(const Tensor& x) { return mish(x); }
Tensor Hardswish::forward(const Tensor& x) { return hardswish(x); }

Upsample::Upsample(const InterpolateOptions& o) : Module("Upsample"), options(o) {
  DLTRAIN_CHECK(o.size.has_value() != o.scale_factor.has_value(),
                "Upsample: give exactly one of size and scale_factor");
}
Tensor Upsample::forward(const Tensor& x) { return interpolate(x, options); }
std::string Upsample::extra_repr() const {
  std::string s;
  if (options.size) {
    s = "size=" + pair_str(*options.size);
  } else {
    const Double2 f = *options.scale_factor;
    s = "scale_factor=" +
        (f.h == f.w ? py_float(f.h) : "(" + py_float(f.h) + ", " + py_float(f.w) + ")");
  }
  s += options.mode == InterpolateMode::Nearest ? ", mode='nearest'" : ", mode='bilinear'";
  if (options.mode == InterpolateMode::Bilinear && options.align_corners)
    s += ", align_corners=True";
  return s;
}

Tensor PixelShuffle::forward(const Tensor& x) { return pixel_shuffle(x, upscale_factor); }
std::string PixelShuffle::extra_repr() const {
  return "upscale_factor=" + std::to_string(upscale_factor);
}
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }

Tensor Flatten::forward(const Tensor& x) {
  if (x.dim() == 0) return x.reshape({1});
  return x.flatten(start_dim, end_dim);
}
std::string Flatten::extra_repr() const {
  return "start_dim=" + std::to_string(start_dim) + ", end_dim=" + std::to_string(end_dim);
}

Dropout::Dropout(double p_) : Module("Dropout"), p(p_) {
  DLTRAIN_CHECK(p >= 0 && p <= 1, "Dropout: p must be in [0, 1], got ", p);
}
Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training()); }
std::string Dropout::extra_repr() const { return "p=" + num_str(p) + ", inplace=False"; }

MaxPool2d::MaxPool2d(Int2 k, std::optional<Int2> s, Int2 pad, Int2 dil, bool ceil)
    : Module("MaxPool2d"),
      kernel_size(k),
      stride(s.value_or(k)),
      padding(pad),
      dilation(dil),
      ceil_mode(ceil) {}
Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode);
}
std::string MaxPool2d::extra_repr() const {
  auto one = [](Int2 v) { return v.h == v.w ? std::to_string(v.h) : pair_str(v); };
  return "kernel_size=" + one(kernel_size) + ", stride=" + one(stride) +
         ", padding=" + one(padding) + ", dilation=" + one(dilation) +
         ", ceil_mode=" + py_bool(ceil_mode);
}

AvgPool2d::AvgPool2d(Int2 k, std::optional<Int2> s, Int2 pad, bool ceil, bool include_pad)
    : Module("AvgPool2d"),
      kernel_size(k),
      stride(s.value_or(k)),
      padding(pad),
      ceil_mode(ceil),
      count_include_pad(include_pad) {}
Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad);
}
std::string AvgPool2d::extra_repr() const {
  return "kernel_size=" + pair_str(kernel_size) + ", stride=" + pair_str(stride) +
         ", padding=" + pair_str(padding);
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return adaptive_avg_pool2d(x, output_size); }
std::string AdaptiveAvgPool2d::extra_repr() const { return "output_size=" + pair_str(output_size); }

// --- losses -------------------------------------------------------------------------
CrossEntropyLoss::CrossEntropyLoss(CrossEntropyOptions o) : Module("CrossEntropyLoss"), options(o) {
  DLTRAIN_CHECK(o.label_smoothing >= 0 && o.label_smoothing <= 1,
                "CrossEntropyLoss: label_smoothing must be in [0, 1], got ", o.label_smoothing);
  if (options.weight.defined()) options.weight = register_buffer("weight", options.weight);
}
Tensor CrossEntropyLoss::forward(const Tensor& logits, const Tensor& target) {
  return cross_entropy(logits, target, options);
}
std::string CrossEntropyLoss::extra_repr() const {
  return options.label_smoothing > 0 ? "label_smoothing=" + num_str(options.label_smoothing) : "";
}

NLLLoss::NLLLoss(NLLLossOptions o) : Module("NLLLoss"), options(o) {
  if (options.weight.defined()) options.weight = register_buffer("weight", options.weight);
}
Tensor NLLLoss::forward(const Tensor& log_probs, const Tensor& target) {
  return nll_loss(log_probs, target, options);
}

Tensor MSELoss::forward(const Tensor& input, const Tensor& target) {
  return mse_loss(input, target, reduction);
}

BCEWithLogitsLoss::BCEWithLogitsLoss(Reduction r, Tensor pw)
    : Module("BCEWithLogitsLoss"), reduction(r), pos_weight(std::move(pw)) {
  if (pos_weight.defined()) pos_weight = register_buffer("pos_weight", pos_weight);
}
Tensor BCEWithLogitsLoss::forward(const Tensor& logits, const Tensor& target) {
  return binary_cross_entropy_with_logits(logits, target,
                                          {.reduction = reduction, .pos_weight = pos_weight});
}

Tensor L1Loss::forward(const Tensor& input, const Tensor& target) {
  return l1_loss(input, target, reduction);
}
Tensor SmoothL1Loss::forward(const Tensor& input, const Tensor& target) {
  return smooth_l1_loss(input, target, reduction, beta);
}
Tensor HuberLoss::forward(const Tensor& input, const Tensor& target) {
  return huber_loss(input, target, reduction, delta);
}
Tensor KLDivLoss::forward(const Tensor& input, const Tensor& target) {
  return kl_div(input, target, reduction, log_target);
}
BCELoss::BCELoss(Tensor w, Reduction r) : Module("BCELoss"), weight(std::move(w)), reduction(r) {
  if (weight.defined()) weight = register_buffer("weight", weight);
}
Tensor BCELoss::forward(const Tensor& input, const Tensor& target) {
  return binary_cross_entropy(input, target, {.reduction = reduction, .weight = weight});
}
Tensor GaussianNLLLoss::forward(const Tensor& input, const Tensor& target, const Tensor& var) {
  return gaussian_nll_loss(input, target, var, full, eps, reduction);
}

}  // namespace dltrain::nn
