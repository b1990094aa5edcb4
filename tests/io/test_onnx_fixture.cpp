// "[.onnx_fixture]" (hidden: run by tests/io/onnx_runtime_check.py, ctest
// io.onnxruntime_runs_exported_models) exports models with io::export_onnx (dynamic batch) into
// the folder $DLTRAIN_ONNX_FIXTURE and writes, for two batch sizes each, the inputs and
// dltrain's own eval-mode outputs (raw little-endian f32) plus expect.json describing them, for
// ONNX Runtime to be compared against. The models: ResNet-18 and ResNet-50 (the zoo, 64x64
// images, random weights and BatchNorm running statistics), an MLP (flatten, Linear, GELU, SiLU,
// dropout, log_softmax), a small CNN with a residual add, a grouped and dilated convolution,
// pooling, nearest upsampling and a concatenation (a U-Net's skip), and a model of the other
// covered layers (ConvTranspose2d, GroupNorm, LayerNorm over a permuted view, bilinear
// upsampling, matmul, softmax, scalar arithmetic, mean), a model of activations, unary math,
// comparisons, where and masked_fill, a function of token ids and an image through the
// indexing, slicing and rearranging ops (int64 inputs written as int64), and a function of two
// named inputs
// with three named outputs (one tensor returned twice), LSTM and GRU (ONNX's own operators,
// dynamic batch, and an unbatched GRU whose sequence length varies), a transformer encoder.
// ResNet-18's weights are saved as safetensors too, for the script to export them with
// `dltrain-convert export-onnx`.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dltrain/dltrain.hpp"
#include "dltrain/io/onnx.hpp"
#include "examples/gnn_tracking/model.hpp"
#include "examples/vae/model.hpp"

using namespace dltrain;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Random weights and BatchNorm statistics, so that no layer is the identity by its init.
void randomise(nn::Module& m) {
  NoGradGuard ng;
  for (auto& [name, t] : m.named_buffers()) {
    if (name.ends_with("running_mean")) t.copy_(mul(randn(t.shape()), 0.1));
    if (name.ends_with("running_var")) t.copy_(add(mul(rand(t.shape()), 0.5), 0.75));
  }
  for (auto& [name, t] : m.named_parameters())
    if (t.dim() == 1)
      t.copy_(add(mul(randn(t.shape()), 0.1), name.ends_with("weight") ? 1.0 : 0.0));
}

// Raw little-endian values: int64 tensors as int64 (token ids), bool as one byte each (masks),
// everything else as f32 (exact for f16 and bf16 values, whose graph type "feed" names).
json write_array(const fs::path& dir, const std::string& file, const std::string& name,
                 const Tensor& t0) {
  const bool ints = t0.dtype() == DType::i64, bools = t0.dtype() == DType::b8;
  const Tensor t = t0.detach().to(ints ? DType::i64 : bools ? DType::b8 : DType::f32).contiguous();
  std::ofstream f(dir / file, std::ios::binary);
  f.write(static_cast<const char*>(t.data_ptr()),
          static_cast<std::streamsize>(t.numel() * static_cast<int64_t>(dtype_size(t.dtype()))));
  REQUIRE(f.good());
  json j = {{"name", name},
            {"shape", std::vector<int64_t>(t.shape().begin(), t.shape().end())},
            {"file", file},
            {"dtype", ints    ? "int64"
                      : bools ? "bool"
                              : "float32"}};
  if (t0.dtype() == DType::f16) j["feed"] = "float16";
  if (t0.dtype() == DType::bf16) j["feed"] = "bfloat16";
  return j;
}

// Writes one case of a function of several named inputs and outputs: exported at the first
// batch size, run at each.
json export_function(const fs::path& dir, const std::string& name, nn::Module& owner,
                     const io::OnnxForward& forward, const io::OnnxExportOptions& o,
                     const std::function<std::vector<Tensor>(int64_t)>& inputs,
                     const std::vector<int64_t>& batches,
                     const std::vector<std::string>& expect_initializers) {
  const std::string file = name + ".onnx";
  io::export_onnx(owner, forward, inputs(batches[0]), (dir / file).string(), o);
  REQUIRE(owner.is_training());  // export_onnx restores the flags it changed
  owner.eval();                  // the exported graph is the eval-mode forward
  json runs = json::array();
  for (int64_t b : batches) {
    NoGradGuard ng;
    const std::vector<Tensor> in = inputs(b);
    const std::vector<Tensor> out = forward(in);
    const std::string tag = name + "_b" + std::to_string(b);
    json ins = json::array(), outs = json::array();
    for (size_t i = 0; i < in.size(); ++i)
      ins.push_back(
          write_array(dir, tag + "_in" + std::to_string(i) + ".bin", o.input_names[i], in[i]));
    for (size_t i = 0; i < out.size(); ++i)
      outs.push_back(
          write_array(dir, tag + "_out" + std::to_string(i) + ".bin", o.output_names[i], out[i]));
    runs.push_back({{"inputs", ins}, {"outputs", outs}});
  }
  owner.train();
  return {{"name", name},
          {"file", file},
          {"runs", runs},
          {"initializers_include", expect_initializers}};
}

// Exports `model` (batch b1), then runs it in eval mode on inputs of batch b1 and b2.
json export_case(const fs::path& dir, const std::string& name, nn::Module& model,
                 const Shape& item_shape, int64_t b1, int64_t b2,
                 const std::vector<std::string>& expect_initializers) {
  auto input = [&](int64_t b) {
    Shape s{b};
    s.insert(s.end(), item_shape.begin(), item_shape.end());
    return randn(s);
  };
  const std::string file = name + ".onnx";
  io::export_onnx(model, {input(b1)}, (dir / file).string(), {.dynamic_batch = true});
  REQUIRE(fs::file_size(dir / file) > 0);
  REQUIRE(model.is_training());  // export_onnx restores the flags it changed
  model.eval();
  json runs = json::array();
  for (int64_t b : {b1, b2}) {
    NoGradGuard ng;
    const Tensor x = input(b);
    const Tensor y = model(x);
    const std::string tag = name + "_b" + std::to_string(b);
    runs.push_back({{"inputs", {write_array(dir, tag + "_in.bin", "input", x)}},
                    {"outputs", {write_array(dir, tag + "_out.bin", "output", y)}}});
  }
  model.train();
  return {{"name", name},
          {"file", file},
          {"runs", runs},
          {"initializers_include", expect_initializers}};
}

struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2, fc3;
  std::shared_ptr<nn::Dropout> drop;
  Mlp() : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(3 * 8 * 8, 32));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(32, 24));
    fc3 = register_module("fc3", std::make_shared<nn::Linear>(24, 10));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.3));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = gelu((*fc1)(x.flatten(1)));
    h = (*drop)(silu((*fc2)(h)));
    h = leaky_relu(h, 0.1);
    return log_softmax((*fc3)(h), 1);
  }
};

// A small U-Net-like CNN: stem, a residual block with a grouped dilated conv, a pooled branch
// upsampled back and concatenated with the skip, a head.
struct SmallCnn : nn::Module {
  std::shared_ptr<nn::Conv2d> stem, mid, down, fuse;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<nn::Linear> head;
  SmallCnn() : Module("SmallCnn") {
    stem = register_module("stem",
                           std::make_shared<nn::Conv2d>(3, 8, 3, nn::Conv2dOptions{.padding = 1}));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(8));
    mid = register_module(
        "mid", std::make_shared<nn::Conv2d>(
                   8, 8, 3, nn::Conv2dOptions{.padding = 2, .dilation = 2, .groups = 2}));
    down = register_module("down", std::make_shared<nn::Conv2d>(
                                       8, 16, 3, nn::Conv2dOptions{.stride = 2, .padding = 1}));
    fuse = register_module("fuse", std::make_shared<nn::Conv2d>(24, 8, 1));
    head = register_module("head", std::make_shared<nn::Linear>(8, 5));
  }
  Tensor forward(const Tensor& x) override {
    Tensor s = relu((*bn)((*stem)(x)));
    s = add(s, sigmoid((*mid)(s)));                            // residual add
    Tensor d = max_pool2d(tanh((*down)(s)), 2);                // 16 x H/4
    d = avg_pool2d(d, 3, 1, 1);                                // padded average
    d = interpolate(d, {.scale_factor = 4.0});                 // nearest, back to H
    Tensor u = relu((*fuse)(cat({s, d}, 1)));                  // the skip
    Tensor g = adaptive_avg_pool2d(mul(sub(u, 0.5), 2.0), 1);  // GlobalAveragePool
    return softmax((*head)(div(g.flatten(1), 3.0)), -1);
  }
};

// The other covered layers.
struct Extras : nn::Module {
  std::shared_ptr<nn::ConvTranspose2d> up;
  std::shared_ptr<nn::GroupNorm> gn;
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::Conv2d> conv;
  Extras() : Module("Extras") {
    up = register_module(
        "up",
        std::make_shared<nn::ConvTranspose2d>(
            4, 6, 3, nn::ConvTranspose2dOptions{.stride = 2, .padding = 1, .output_padding = 1}));
    gn = register_module("gn", std::make_shared<nn::GroupNorm>(3, 6));
    ln = register_module("ln", std::make_shared<nn::LayerNorm>(Shape{6}));
    conv = register_module("conv", std::make_shared<nn::Conv2d>(6, 6, 1));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*gn)((*up)(x));                                // [N, 6, 2H, 2W]
    h = (*ln)(h.permute({0, 2, 3, 1})).permute({0, 3, 1, 2});  // LayerNorm over channels
    h = interpolate((*conv)(h), {.scale_factor = 0.5, .mode = InterpolateMode::Bilinear});
    Tensor t = h.flatten(2);                                         // [N, 6, HW]
    Tensor a = softmax(div(matmul(t, t.transpose(1, 2)), 4.0), -1);  // [N, 6, 6]
    Tensor y = matmul(a, t).view({t.size(0), 6, x.size(2), x.size(3)});
    return add(mean(y, {2, 3}), exp(neg(abs(mean(h, {2, 3})))));
  }
};

// The activations, unary math, comparisons and selections of research models. Every branch of
// a where/masked_fill/sign is continuous at its switching point, so that ONNX Runtime's
// rounding of the input cannot flip a branch into a different value.
struct Activations : nn::Module {
  std::shared_ptr<nn::Linear> fc, head;
  Activations() : Module("Activations") {
    fc = register_module("fc", std::make_shared<nn::Linear>(6, 8));
    head = register_module("head", std::make_shared<nn::Linear>(8, 4));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = (*fc)(x);
    Tensor a = add(sin(h), cos(h));
    a = add(a, add(softplus(h), softplus(h, 2.0)));
    a = add(a, add(elu(h, 0.7), add(hardswish(h), mish(h))));
    a = add(a, pow(add(abs(h), 0.5), 1.5));
    a = add(a, pow(add(abs(h), 1.0), sigmoid(h)));
    a = add(a, add(clamp(h, -0.5, 0.8), clamp(h, std::nullopt, 0.3)));
    const Tensor bound = abs(mean(h, {1}, /*keepdim=*/true));
    a = add(a, clamp(h, neg(bound), bound));
    a = add(a, rsqrt(add(mul(h, h), 1.0)));
    a = add(a, mul(sign(h), h));  // |h|
    a = add(a, sub(maximum(h, mul(h, 0.3)), minimum(h, mul(h, -0.2))));
    a = add(a, where(gt(h, 0.0), h, mul(h, 0.01)));       // leaky
    a = add(a, where(lt(h, 0.3), h, full({}, 0.3)));      // min(h, 0.3)
    a = add(a, where(ge(h, -0.3), h, full({}, -0.3)));    // max(h, -0.3)
    a = add(a, where(le(h, 0.0), mul(h, 2.0), h));        // 2h below 0
    a = add(a, where(eq(sign(h), 1.0), h, zeros({})));    // relu
    a = add(a, where(ne(sign(h), 1.0), mul(h, 0.5), h));  // h/2 below 0
    a = add(a, masked_fill(h, lt(h, -0.2), -0.2));        // max(h, -0.2)
    return (*head)(a);
  }
};

// A fully convolutional encoder-decoder of any even height and width: conv, pool, conv,
// nearest upsampling by 2, a skip concatenation and a 1x1 head.
struct FullyConv : nn::Module {
  std::shared_ptr<nn::Conv2d> stem, down, head;
  std::shared_ptr<nn::BatchNorm2d> bn;
  FullyConv() : Module("FullyConv") {
    stem = register_module("stem",
                           std::make_shared<nn::Conv2d>(3, 6, 3, nn::Conv2dOptions{.padding = 1}));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(6));
    down = register_module("down",
                           std::make_shared<nn::Conv2d>(6, 6, 3, nn::Conv2dOptions{.padding = 1}));
    head = register_module("head", std::make_shared<nn::Conv2d>(12, 2, 1));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor s = relu((*bn)((*stem)(x)));
    const Tensor d = relu((*down)(max_pool2d(s, 2)));
    const Tensor u = interpolate(d, {.scale_factor = 2.0});  // nearest
    return (*head)(cat({s, u}, 1));
  }
};

}  // namespace

TEST_CASE("ONNX files for onnx_runtime_check.py", "[.onnx_fixture]") {
  const char* dir_env = std::getenv("DLTRAIN_ONNX_FIXTURE");
  REQUIRE(dir_env != nullptr);
  if (!io::onnx_supported()) {
    std::printf("SKIPPED: this build has no ONNX writer (protobuf, libonnx-dev)\n");
    std::exit(4);  // onnx_runtime_check.py reports the skip (ctest's SKIP_RETURN_CODE)
  }
  const fs::path dir = dir_env;
  manual_seed(32);
  json models = json::array();

  auto r18 = models::resnet18({.num_classes = 10});
  randomise(*r18);
  models.push_back(export_case(dir, "resnet18", *r18, {3, 64, 64}, 2, 3,
                               {"conv1.weight", "layer1.0.bn1.running_mean",
                                "layer4.1.conv2.weight", "fc.weight", "fc.bias"}));
  // The same weights for `dltrain-convert export-onnx` (the script exports them again).
  io::save_safetensors((dir / "resnet18.safetensors").string(), r18->state_dict());
  models.back()["weights"] = "resnet18.safetensors";
  auto r50 = models::resnet50({.num_classes = 10});
  randomise(*r50);
  models.push_back(export_case(dir, "resnet50", *r50, {3, 64, 64}, 1, 2,
                               {"layer2.0.downsample.0.weight", "layer3.5.bn3.running_var"}));
  Mlp mlp;
  models.push_back(export_case(dir, "mlp", mlp, {3, 8, 8}, 4, 7, {"fc1.weight", "fc3.bias"}));
  SmallCnn cnn;
  randomise(cnn);
  models.push_back(export_case(dir, "small_cnn", cnn, {3, 16, 16}, 2, 5,
                               {"stem.weight", "bn.running_var", "mid.bias", "head.weight"}));
  Extras extras;
  randomise(extras);
  models.push_back(
      export_case(dir, "extras", extras, {4, 8, 8}, 2, 3, {"up.weight", "gn.weight", "ln.bias"}));
  Activations act;
  models.push_back(export_case(dir, "activations", act, {6}, 3, 5, {"fc.weight", "head.bias"}));

  // A function of two named inputs with two named outputs, one of them returned twice.
  {
    auto fc = std::make_shared<nn::Linear>(5, 4);
    io::OnnxForward two = [&fc](const std::vector<Tensor>& in) {
      const Tensor h = tanh((*fc)(in[0]));
      const Tensor y = add(h, mul(in[1], 0.5));
      return std::vector<Tensor>{y, sigmoid(h), y};
    };
    const io::OnnxExportOptions o{.input_names = {"features", "offset"},
                                  .output_names = {"sum", "gate", "sum_again"},
                                  .dynamic_batch = true};
    auto inputs = [](int64_t b) { return std::vector<Tensor>{randn({b, 5}), randn({b, 4})}; };
    models.push_back(
        export_function(dir, "two_io", *fc, two, o, inputs, {3, 1}, {"weight", "bias"}));
  }

  // Token ids and an image through the indexing, slicing and rearranging ops: embedding,
  // index_select, conv1d, chunk, split, stack, flip, slice, narrow, select, the three pad
  // modes, pixel_unshuffle and pixel_shuffle.
  {
    struct Seq : nn::Module {
      std::shared_ptr<nn::Embedding> emb;
      std::shared_ptr<nn::Conv1d> conv;
      Seq() : Module("Seq") {
        emb = register_module("emb", std::make_shared<nn::Embedding>(20, 6));
        conv = register_module(
            "conv", std::make_shared<nn::Conv1d>(4, 8, 3, nn::Conv1dOptions{.padding = 1}));
      }
    };
    auto seq = std::make_shared<Seq>();
    const Tensor pick = from_vector<int64_t>({5, 0, 3, 3}, {4});
    io::OnnxForward f = [seq, pick](const std::vector<Tensor>& in) {
      Tensor e = (*seq->emb)(in[0]);                     // [b, 7, 6]
      e = index_select(e, 2, pick);                      // [b, 7, 4]
      const Tensor c = (*seq->conv)(e.transpose(1, 2));  // [b, 8, 7]
      const std::vector<Tensor> halves = chunk(c, 2, 1);
      const std::vector<Tensor> parts = split(c, std::vector<int64_t>{3, 5}, 1);
      const Tensor st = flip(stack({halves[0], halves[1]}, 1), {3});  // [b, 2, 4, 7]
      const Tensor img = in[1];                                       // [b, 4, 6, 6]
      Tensor p = pad(img, {1, 1, 2, 0}, PadMode::Reflect);            // [b, 4, 8, 8]
      p = pixel_shuffle(pixel_unshuffle(mul(p, 2.0), 2), 2);
      p = add(pad(p, {1, 1, 1, 1}, PadMode::Constant, 0.5),
              pad(p, {1, 1, 1, 1}, PadMode::Replicate));
      return std::vector<Tensor>{st.slice(3, 1, 6, 2), st.narrow(2, 1, 2), st.select(1, 1),
                                 parts[1], p};
    };
    const io::OnnxExportOptions o{
        .input_names = {"tokens", "image"},
        .output_names = {"sliced", "narrowed", "selected", "part", "image_out"},
        .dynamic_batch = true};
    auto inputs = [](int64_t b) {
      return std::vector<Tensor>{randint(0, 20, {b, 7}), randn({b, 4, 6, 6})};
    };
    models.push_back(export_function(dir, "sequence", *seq, f, o, inputs, {3, 2},
                                     {"emb.weight", "conv.weight"}));
  }

  // Reductions, cumulative and indexed ops over the non-batch dims, and instance norm (input
  // statistics, affine; running statistics), at two batch sizes. argmax/max read the input
  // itself, so that ONNX Runtime sees the very values dltrain compared.
  {
    struct Red : nn::Module {
      std::shared_ptr<nn::InstanceNorm2d> in1, in2;
      Red() : Module("Red") {
        in1 = register_module("in1", std::make_shared<nn::InstanceNorm2d>(
                                         4, nn::InstanceNormOptions{.affine = true}));
        in2 = register_module(
            "in2", std::make_shared<nn::InstanceNorm2d>(
                       4, nn::InstanceNormOptions{.affine = true, .track_running_stats = true}));
      }
    };
    auto red = std::make_shared<Red>();
    randomise(*red);
    io::OnnxForward f = [red](const std::vector<Tensor>& in) {
      const Tensor& x = in[0];                                               // [b, 4, 5, 6]
      const auto [mx, arg] = max(x, 2, /*keepdim=*/false);                   // [b, 4, 6]
      const Tensor idx = argmax(x, 3, /*keepdim=*/true);                     // [b, 4, 5, 1]
      Tensor a = add(var(x, {2, 3}), sum(logsumexp(x, {1, 3}), {1}, true));  // [b, 4]
      a = add(a, sum(add(norm(x, 2.0, {3}), norm(x, 1.0, {3})), {2}));
      a = add(a, sum(add(norm(x, INFINITY, {3}), norm(x, 3.0, {3})), {2}));
      a = add(a, sub(min(x), max(x)));                                     // 0-d, broadcast
      Tensor c = add(cumsum(x, 1), prod(add(mul(x, 0.1), 1.0), 2, true));  // [b, 4, 5, 6]
      c = add(c, gather(x, 3, idx));                                       // the row maxima
      c = scatter_add(c, 3, idx, mul(gather(x, 3, idx), 2.0));
      const Tensor n = add((*red->in1)(x), (*red->in2)(x));
      return std::vector<Tensor>{a, add(mx, arg.to(DType::f32)), c, n,
                                 add(idx.to(DType::f32), prod(x, 1, true))};
    };
    const io::OnnxExportOptions o{
        .input_names = {"x"},
        .output_names = {"reduced", "max_and_index", "scanned", "normed", "index_and_prod"},
        .dynamic_batch = true};
    auto inputs = [](int64_t b) { return std::vector<Tensor>{randn({b, 4, 5, 6})}; };
    models.push_back(export_function(dir, "reductions", *red, f, o, inputs, {3, 2},
                                     {"in1.weight", "in2.running_var"}));
  }

  // LSTM and GRU as ONNX's LSTM/GRU operators (one per layer), with a dynamic batch: a 2-layer
  // bidirectional LSTM given its initial states (as [N, L*D, H] inputs, so that the batch is
  // dim 0 of every graph input and output), a GRU with zero initial state, and an unbatched
  // GRU without biases whose dim 0 is the sequence length (two lengths run on one file).
  {
    auto lstm = std::make_shared<nn::LSTM>(
        8, 6, nn::RNNOptions{.num_layers = 2, .batch_first = true, .bidirectional = true});
    io::OnnxForward f = [lstm](const std::vector<Tensor>& in) {
      const auto [y, st] = (*lstm)(in[0], {in[1].transpose(0, 1), in[2].transpose(0, 1)});
      return std::vector<Tensor>{y, st.first.transpose(0, 1), st.second.transpose(0, 1)};
    };
    const io::OnnxExportOptions o{.input_names = {"tokens", "h0", "c0"},
                                  .output_names = {"y", "h", "c"},
                                  .dynamic_batch = true};
    auto inputs = [](int64_t b) {
      return std::vector<Tensor>{randn({b, 5, 8}), randn({b, 4, 6}), randn({b, 4, 6})};
    };
    models.push_back(export_function(dir, "lstm", *lstm, f, o, inputs, {3, 2},
                                     {"weight_ih_l0", "weight_hh_l1_reverse", "bias_hh_l1"}));
    models.back()["ops_include"] = {"LSTM"};

    auto gru = std::make_shared<nn::GRU>(8, 4, nn::RNNOptions{.batch_first = true});
    io::OnnxForward g = [gru](const std::vector<Tensor>& in) {
      const auto [y, h] = (*gru)(in[0]);
      return std::vector<Tensor>{y, h.transpose(0, 1)};
    };
    const io::OnnxExportOptions og{
        .input_names = {"tokens"}, .output_names = {"y", "h"}, .dynamic_batch = true};
    auto tokens = [](int64_t b) { return std::vector<Tensor>{randn({b, 5, 8})}; };
    models.push_back(export_function(dir, "gru", *gru, g, og, tokens, {3, 1}, {"bias_ih_l0"}));
    models.back()["ops_include"] = {"GRU"};

    auto plain = std::make_shared<nn::GRU>(
        3, 5, nn::RNNOptions{.num_layers = 2, .bias = false, .bidirectional = true});
    io::OnnxForward p = [plain](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{(*plain)(in[0]).first};
    };
    const io::OnnxExportOptions op{
        .input_names = {"sequence"}, .output_names = {"y"}, .dynamic_batch = true};
    auto steps = [](int64_t t) { return std::vector<Tensor>{randn({t, 3})}; };
    models.push_back(
        export_function(dir, "gru_unbatched", *plain, p, op, steps, {7, 4}, {"weight_hh_l1"}));
    models.back()["ops_include"] = {"GRU"};
  }

  // roll (one dim, and flattened), repeat (with an extra leading dim), sort, argsort and topk
  // (TopK, ties by lower index first as dltrain's), over a dynamic batch.
  {
    auto none = std::make_shared<nn::Identity>();
    io::OnnxForward f = [](const std::vector<Tensor>& in) {
      const Tensor& x = in[0];  // [b, 6]
      const auto [top, top_i] = topk(x, 3, 1);
      const auto [low, low_i] = topk(x, 2, 1, /*largest=*/false);
      const auto [sorted, order] = sort(x, 1, /*descending=*/true);
      const Tensor rank = argsort(x, 1).to(DType::f32);
      return std::vector<Tensor>{add(roll(x, {2}, {1}), roll(x.slice(0, 0, 1), {-5})),
                                 repeat(x, {2, 1, 2}), cat({top, low, sorted, rank}, 1),
                                 cat({top_i, low_i, order}, 1).to(DType::f32)};
    };
    models.push_back(export_function(dir, "rearrange_sort", *none, f,
                                     {.input_names = {"x"},
                                      .output_names = {"rolled", "tiled", "sorted", "indices"},
                                      .dynamic_batch = true},
                                     [](int64_t b) {
                                       return std::vector<Tensor>{randn({b, 6})};
                                     },
                                     {3, 2}, {}));
    models.back()["ops_include"] = {"TopK", "Tile"};
    models.back()["dims"] = {{"x", {"batch", nullptr}},
                             {"rolled", {"batch", nullptr}},
                             {"tiled", {nullptr, "batch", nullptr}},
                             {"sorted", {"batch", nullptr}},
                             {"indices", {"batch", nullptr}}};
  }

  // Dynamic axes beyond the batch ("dims": the symbolic name, or null for a fixed size, of every
  // dim of the named graph values, for the script to check). A batch folded into one dim by
  // view(-1) (inferred by the Reshape); an LSTM and a transformer encoder layer over a variable
  // batch and sequence length; the GNN tracking example over variable numbers of nodes and
  // edges (index_select, index_add into zeros_like, cat); the VAE's encoder and decoder. (The
  // fully convolutional model over variable batch, height and width is in the next block.)
  {
    auto none = std::make_shared<nn::Identity>();
    io::OnnxForward fold = [](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{relu(in[0]).reshape({-1})};
    };
    models.push_back(
        export_function(dir, "fold", *none, fold,
                        {.input_names = {"x"}, .output_names = {"flat"}, .dynamic_batch = true},
                        [](int64_t b) {
                          return std::vector<Tensor>{randn({b, 3, 2})};
                        },
                        {2, 5}, {}));
    models.back()["dims"] = {{"x", {"batch", nullptr, nullptr}}, {"flat", {"flat_dim0"}}};

    auto lstm = std::make_shared<nn::LSTM>(
        8, 6, nn::RNNOptions{.num_layers = 2, .batch_first = true, .bidirectional = true});
    io::OnnxForward f = [lstm](const std::vector<Tensor>& in) {
      const auto [y, st] = (*lstm)(in[0]);
      return std::vector<Tensor>{y, st.first.transpose(0, 1)};
    };
    const io::OnnxExportOptions seq{.input_names = {"tokens"},
                                    .output_names = {"y", "h"},
                                    .dynamic_batch = true,
                                    .dynamic_axes = {{"tokens", {{1, "sequence"}}}}};
    auto tokens = [](int64_t b) { return std::vector<Tensor>{randn({b, b + 3, 8})}; };
    models.push_back(
        export_function(dir, "lstm_sequence", *lstm, f, seq, tokens, {3, 2}, {"weight_ih_l1"}));
    models.back()["dims"] = {{"tokens", {"batch", "sequence", nullptr}},
                             {"y", {"batch", "sequence", nullptr}},
                             {"h", {"batch", nullptr, nullptr}}};

    auto enc = std::make_shared<nn::TransformerEncoderLayer>(
        8, 2,
        nn::TransformerEncoderLayerOptions{
            .dim_feedforward = 16, .activation = "relu", .batch_first = true});
    randomise(*enc);
    // With a key padding mask (true: padding), the last position of every sequence padded.
    io::OnnxForward e = [enc](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{(*enc)(in[0], Tensor(), in[1])};
    };
    const io::OnnxExportOptions eo{
        .input_names = {"tokens", "padding"},
        .output_names = {"encoded"},
        .dynamic_batch = true,
        .dynamic_axes = {{"tokens", {{1, "sequence"}}}, {"padding", {{1, "sequence"}}}}};
    auto padded = [](int64_t b) {
      const int64_t T = b + 3;
      const Tensor pad = ge(arange(static_cast<double>(T)), static_cast<double>(T - 1))
                             .unsqueeze(0)
                             .expand({b, T})
                             .contiguous();
      return std::vector<Tensor>{randn({b, T, 8}), pad};
    };
    models.push_back(
        export_function(dir, "encoder_sequence", *enc, e, eo, padded, {2, 3}, {"norm1.weight"}));
    models.back()["dims"] = {{"tokens", {"batch", "sequence", nullptr}},
                             {"padding", {"batch", "sequence"}},
                             {"encoded", {"batch", "sequence", nullptr}}};

    auto gnn = gnn_tracking::make_model(8, 2);
    io::OnnxForward g = [gnn](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{(*gnn)(in[0], in[1], in[2])};
    };
    const io::OnnxExportOptions go{
        .input_names = {"x", "edge_index", "edge_attr"},
        .output_names = {"scores"},
        .dynamic_axes = {
            {"x", {{0, "nodes"}}}, {"edge_index", {{1, "edges"}}}, {"edge_attr", {{0, "edges"}}}}};
    auto graph = [](int64_t n) {
      const int64_t edges = n + 5;
      return std::vector<Tensor>{randn({n, 3}), randint(0, n, {2, edges}), randn({edges, 4})};
    };
    models.push_back(export_function(dir, "gnn", *gnn, g, go, graph, {7, 5},
                                     {"0.node.0.weight", "2.net.2.bias"}));
    models.back()["dims"] = {{"x", {"nodes", nullptr}},
                             {"edge_index", {nullptr, "edges"}},
                             {"edge_attr", {"edges", nullptr}},
                             {"scores", {"edges"}}};
    models.back()["ops_include"] = {"ScatterElements"};

    // examples/vae's encoder (conv trunk, two Linear heads: two outputs) and decoder (Linear,
    // a view to [N, 64, 7, 7], two transposed convolutions), each with a dynamic batch.
    auto vae = std::make_shared<vae_example::VAE>(16);
    io::OnnxForward encode = [vae](const std::vector<Tensor>& in) {
      const auto [mu, logvar] = (*vae->encoder)(in[0]);
      return std::vector<Tensor>{mu, logvar};
    };
    models.push_back(export_function(
        dir, "vae_encoder", *vae->encoder, encode,
        {.input_names = {"image"}, .output_names = {"mu", "logvar"}, .dynamic_batch = true},
        [](int64_t b) {
          return std::vector<Tensor>{rand({b, 1, 28, 28})};
        },
        {3, 2}, {"0.0.weight", "1.logvar.bias"}));
    io::OnnxForward decode = [vae](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{vae->decoder->forward(in[0])};
    };
    models.push_back(export_function(
        dir, "vae_decoder", *vae->decoder, decode,
        {.input_names = {"z"}, .output_names = {"probabilities"}, .dynamic_batch = true},
        [](int64_t b) {
          return std::vector<Tensor>{randn({b, 16})};
        },
        {4, 1}, {"fc.weight", "up2.bias"}));
    models.back()["ops_include"] = {"ConvTranspose"};
  }

  // The fully convolutional U-Net-like model (pooling, upsampling by a scale, a skip) over
  // variable batch, height and width, in f32, then as 16-bit models (module.to(dtype)) in f16 and
  // bf16 (where ONNX's Conv, pooling and friends have no bf16 form, the exporter computes them
  // in f32 and rounds once, as dltrain does); the MLP (GELU, SiLU, log_softmax) in bf16 and the
  // bidirectional LSTM in f16.
  {
    for (const DType dt : {DType::f32, DType::f16, DType::bf16}) {
      auto fcn = std::make_shared<FullyConv>();
      randomise(*fcn);
      fcn->to(dt);
      io::OnnxForward c = [fcn](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{(*fcn)(in[0])};
      };
      const io::OnnxExportOptions co{.input_names = {"image"},
                                     .output_names = {"mask"},
                                     .dynamic_batch = true,
                                     .dynamic_axes = {{"image", {{2, "height"}, {3, "width"}}}}};
      auto image = [dt](int64_t b) {
        return std::vector<Tensor>{randn({b, 3, 2 * b + 4, 14 - 2 * b}, TensorOptions(dt))};
      };
      const std::string name = dt == DType::f32   ? "fully_conv"
                               : dt == DType::f16 ? "fully_conv_f16"
                                                  : "fully_conv_bf16";
      models.push_back(
          export_function(dir, name, *fcn, c, co, image, {2, 1}, {"stem.weight", "down.weight"}));
      models.back()["dims"] = {{"image", {"batch", nullptr, "height", "width"}},
                               {"mask", {"batch", nullptr, "height", "width"}}};
    }
    auto mlp16 = std::make_shared<Mlp>();
    mlp16->to(DType::bf16);
    io::OnnxForward f = [mlp16](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{(*mlp16)(in[0])};
    };
    models.push_back(export_function(
        dir, "mlp_bf16", *mlp16, f,
        {.input_names = {"input"}, .output_names = {"output"}, .dynamic_batch = true},
        [](int64_t b) {
          return std::vector<Tensor>{randn({b, 3, 8, 8}, DType::bf16)};
        },
        {4, 3}, {"fc2.weight"}));
    auto lstm = std::make_shared<nn::LSTM>(
        8, 6, nn::RNNOptions{.batch_first = true, .bidirectional = true});
    lstm->to(DType::f16);
    io::OnnxForward l = [lstm](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{(*lstm)(in[0]).first};
    };
    models.push_back(
        export_function(dir, "lstm_f16", *lstm, l,
                        {.input_names = {"tokens"}, .output_names = {"y"}, .dynamic_batch = true},
                        [](int64_t b) {
                          return std::vector<Tensor>{randn({b, 5, 8}, DType::f16)};
                        },
                        {3, 2}, {"weight_hh_l0_reverse"}));
    models.back()["ops_include"] = {"LSTM"};
    // dltrain rounds to f16 after each of the 9 ops of a step (gate GEMM, add, sigmoid, 2 tanh,
    // 3 mul, add) over the 5 steps of one direction; ONNX Runtime's LSTM rounds once.
    models.back()["roundings"] = 9 * 5;
  }

  // A transformer encoder layer (multi-head attention through its ops: matmul, softmax, ...)
  // and a causal attention call, at a static batch.
  {
    auto enc = std::make_shared<nn::TransformerEncoderLayer>(
        8, 2,
        nn::TransformerEncoderLayerOptions{
            .dim_feedforward = 16, .activation = "gelu", .batch_first = true});
    randomise(*enc);
    auto inputs = [](int64_t b) { return std::vector<Tensor>{randn({b, 5, 8})}; };
    auto add_static = [&](const std::string& name, nn::Module& owner, const io::OnnxForward& f,
                          std::vector<std::string> outs, std::vector<std::string> inits) {
      const io::OnnxExportOptions o{.input_names = {"tokens"}, .output_names = std::move(outs)};
      models.push_back(export_function(dir, name, owner, f, o, inputs, {3}, inits));
      models.back()["static_batch"] = true;
    };
    add_static("encoder", *enc,
               [enc](const std::vector<Tensor>& in) { return std::vector<Tensor>{(*enc)(in[0])}; },
               {"encoded"}, {"self_attn.in_proj_weight", "linear2.bias"});
    add_static("causal_attention", *enc,
               [](const std::vector<Tensor>& in) {
                 return std::vector<Tensor>{
                     scaled_dot_product_attention(in[0], in[0], in[0], Tensor(), 0.0, true)};
               },
               {"attended"}, {});
  }

  std::ofstream f(dir / "expect.json");
  f << json{{"models", models}}.dump(1);
  REQUIRE(f.good());
}
