// io::export_onnx's error paths and side effects: an op with no ONNX mapping stops the export
// with an error naming the op and the module path where it ran (and so does an op whose
// output would otherwise be taken for a constant), a path that cannot be written,
// eval-only semantics (BatchNorm without running statistics), the training flags restored after the
// trace, and a build without protobuf. That the files are right is checked by ONNX Runtime
// (tests/io/onnx_runtime_check.py).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "dltrain/dltrain.hpp"
#include "dltrain/io/onnx.hpp"
#include "tests/skip.hpp"

using namespace dltrain;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A layer whose forward uses an op export_onnx does not map (tril).
struct TrilLayer : nn::Module {
  TrilLayer() : Module("TrilLayer") {}
  Tensor forward(const Tensor& x) override { return tril(x); }
};

// A layer whose forward uses tril (no ONNX mapping yet) as a value: its output must not be
// taken for a constant.
struct MaskLayer : nn::Module {
  MaskLayer() : Module("MaskLayer") {}
  Tensor forward(const Tensor& x) override { return mul(x, tril(x)); }
};

// A forward that branches on the input's values.
struct BranchLayer : nn::Module {
  BranchLayer() : Module("BranchLayer") {}
  Tensor forward(const Tensor& x) override {
    return sum(x).item<double>() > 0 ? relu(x) : sigmoid(x);
  }
};

fs::path scratch(const std::string& name) {
  return fs::temp_directory_path() / ("dltrain_onnx_" + std::to_string(::getpid()) + "_" + name);
}

}  // namespace

TEST_CASE("export_onnx names an op without ONNX mapping and the module path", "[io][onnx]") {
  if (!io::onnx_supported()) {
    REQUIRE_THROWS_WITH(
        io::export_onnx(*std::make_shared<nn::Linear>(2, 2), {randn({1, 2})}, "x.onnx"),
        Contains("libonnx-dev"));
    return;
  }
  auto model = nn::sequential(
      {std::make_shared<nn::Linear>(4, 6),
       nn::sequential({std::make_shared<nn::ReLU>(), std::make_shared<TrilLayer>()})});
  const fs::path path = scratch("tril.onnx");
  REQUIRE_THROWS_WITH(io::export_onnx(*model, {randn({2, 4})}, path.string()),
                      Contains("'tril' has no ONNX mapping") && Contains("in 1.1 (TrilLayer)"));
  CHECK_FALSE(fs::exists(path));
  // The tracer is gone: the same model runs (and records autograd) as usual afterwards.
  Tensor y = (*model)(randn({2, 4}));
  CHECK(y.requires_grad());
  CHECK(model->is_training());
}

TEST_CASE("export_onnx refuses an unmapped op instead of baking it in as a constant",
          "[io][onnx]") {
  if (!io::onnx_supported()) {
    testing::skip("this build has no ONNX writer (protobuf + onnx.proto)");
    return;
  }
  auto model = nn::sequential({std::make_shared<nn::Linear>(3, 3), std::make_shared<MaskLayer>()});
  REQUIRE_THROWS_WITH(io::export_onnx(*model, {randn({2, 3})}, scratch("tril.onnx").string()),
                      Contains("'tril' has no ONNX mapping") && Contains("in 1 (MaskLayer)"));
  // A plain function (no module): the op's name alone.
  io::OnnxForward f = [](const std::vector<Tensor>& x) {
    return std::vector<Tensor>{triu(relu(x[0]).reshape({3, 1}))};
  };
  REQUIRE_THROWS_WITH(io::export_onnx(f, {randn({3})}, scratch("f.onnx").string()),
                      Contains("'triu' has no ONNX mapping"));
}

TEST_CASE("export_onnx raises a clear error for a path it cannot write", "[io][onnx]") {
  if (!io::onnx_supported()) {
    testing::skip("this build has no ONNX writer (protobuf + onnx.proto)");
    return;
  }
  nn::Linear fc(3, 2);
  const fs::path missing = scratch("no_such_folder") / "model.onnx";
  REQUIRE_THROWS_WITH(io::export_onnx(fc, {randn({1, 3})}, missing.string()),
                      Contains("does not exist") && Contains(missing.parent_path().string()));
  // A folder where the file should go: the write itself fails.
  const fs::path dir = scratch("a_folder");
  fs::create_directories(dir / "model.onnx.tmp");
  REQUIRE_THROWS_WITH(io::export_onnx(fc, {randn({1, 3})}, (dir / "model.onnx").string()),
                      Contains("cannot write"));
  fs::remove_all(dir);
}

TEST_CASE("export_onnx refuses batch statistics and restores training flags", "[io][onnx]") {
  if (!io::onnx_supported()) {
    testing::skip("this build has no ONNX writer (protobuf + onnx.proto)");
    return;
  }
  auto bn =
      std::make_shared<nn::BatchNorm1d>(4, nn::BatchNormOptions{.track_running_stats = false});
  auto model = nn::sequential({std::make_shared<nn::Linear>(4, 4), bn});
  REQUIRE_THROWS_WITH(io::export_onnx(*model, {randn({3, 4})}, scratch("bn.onnx").string()),
                      Contains("batch statistics") && Contains("in 1 (BatchNorm1d)"));
  CHECK(model->is_training());
  CHECK(bn->is_training());

  // Mixed flags come back as they were (a frozen, eval-mode BatchNorm inside a training model).
  auto frozen = std::make_shared<nn::BatchNorm1d>(4);
  auto ok = nn::sequential({std::make_shared<nn::Linear>(4, 4), frozen});
  frozen->eval();
  const fs::path path = scratch("ok.onnx");
  io::export_onnx(*ok, {randn({3, 4})}, path.string());
  CHECK(fs::file_size(path) > 0);
  CHECK(ok->is_training());
  CHECK_FALSE(frozen->is_training());
  fs::remove(path);
}

TEST_CASE("export_onnx checks its options", "[io][onnx]") {
  if (!io::onnx_supported()) {
    testing::skip("this build has no ONNX writer (protobuf + onnx.proto)");
    return;
  }
  nn::Linear fc(3, 2);
  REQUIRE_THROWS_WITH(
      io::export_onnx(fc, {randn({1, 3})}, scratch("o.onnx").string(), {.opset = 13}),
      Contains("opset 13"));
  REQUIRE_THROWS_WITH(
      io::export_onnx(fc, {randn({1, 3}), randn({1, 3})}, scratch("o.onnx").string()),
      Contains("takes one input"));
  REQUIRE_THROWS_WITH(io::export_onnx(fc, {randn({1, 3})}, scratch("o.onnx").string(),
                                      {.output_names = {"a", "b"}}),
                      Contains("2 output names given for 1 output"));
}

TEST_CASE("export_onnx refuses a forward whose graph depends on the input", "[io][onnx]") {
  if (!io::onnx_supported()) {
    testing::skip("this build has no ONNX writer (protobuf + onnx.proto)");
    return;
  }
  BranchLayer branch;
  // The second trace runs on -0.5 x + N(0, 1): a sum of 16 fives turns negative.
  const Tensor x = full({2, 8}, 5.0);
  REQUIRE_THROWS_WITH(io::export_onnx(branch, {x}, scratch("branch.onnx").string()),
                      Contains("different ops for two inputs with other values") &&
                          Contains("'relu' then 'sigmoid'"));
  // Without the check the branch the example took is exported (documented, on request).
  const fs::path path = scratch("branch_unchecked.onnx");
  io::export_onnx(branch, {x}, path.string(), {.check_graph = false});
  CHECK(fs::file_size(path) > 0);
  fs::remove(path);

  // A tensor built from the batch size in the forward: a constant of the traced size.
  io::OnnxForward sized = [](const std::vector<Tensor>& in) {
    const Tensor w = arange(0.0, static_cast<double>(in[0].size(0))).unsqueeze(1);
    return std::vector<Tensor>{mul(relu(in[0]), w)};
  };
  REQUIRE_THROWS_WITH(
      io::export_onnx(sized, {randn({2, 3})}, scratch("sized.onnx").string(),
                      {.dynamic_batch = true}),
      Contains("dynamic sizes batch 2 and 4") && Contains("is a constant built in the forward"));
  const fs::path fixed = scratch("sized_fixed.onnx");
  io::export_onnx(sized, {randn({2, 3})}, fixed.string());  // a fixed batch is fine
  CHECK(fs::file_size(fixed) > 0);
  fs::remove(fixed);
}

TEST_CASE("export_onnx refuses ops that would hold a dynamic size as a constant", "[io][onnx]") {
  if (!io::onnx_supported()) {
    testing::skip("this build has no ONNX writer (protobuf + onnx.proto)");
    return;
  }
  const io::OnnxExportOptions batch{.dynamic_batch = true};
  // var's divisor is the number of reduced elements.
  io::OnnxForward over_batch = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{var(in[0], {0})};
  };
  REQUIRE_THROWS_WITH(
      io::export_onnx(over_batch, {randn({4, 3})}, scratch("v.onnx").string(), batch),
      Contains("var would hold the size of a reduced dim") && Contains("varies"));
  // A slice of a dynamic dim to a length computed from its size: the attribute differs.
  io::OnnxForward half = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0].narrow(1, 0, in[0].size(1) / 2)};
  };
  REQUIRE_THROWS_WITH(
      io::export_onnx(half, {randn({2, 6})}, scratch("h.onnx").string(),
                      {.dynamic_axes = {{"input", {{1, "length"}}}}}),
      Contains("different ops for two inputs with other values and the dynamic sizes length 6 "
               "and 12"));
  // An adaptive pool to 3x3 from a varying height: its kernel comes from the traced size.
  io::OnnxForward pool = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{adaptive_avg_pool2d(in[0], 3)};
  };
  REQUIRE_THROWS_WITH(io::export_onnx(pool, {randn({1, 2, 6, 6})}, scratch("p.onnx").string(),
                                      {.dynamic_axes = {{"input", {{2, "height"}}}}}),
                      Contains("adaptive_avg_pool2d would hold the size of the height"));
  // Broadcasting a size-1 dim to a varying size.
  io::OnnxForward bcast = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{add(in[0], in[1].expand(in[0].shape()))};
  };
  REQUIRE_THROWS_WITH(
      io::export_onnx(bcast, {randn({3, 4}), randn({1, 4})}, scratch("e.onnx").string(),
                      {.dynamic_axes = {{"input_0", {{0, "rows"}}}}}),
      Contains("expand from shape [1, 4]") && Contains("dim 0"));
  // Folding a dynamic batch into another dim is inferred (-1); two such dims are not.
  io::OnnxForward fold = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{relu(in[0]).reshape({-1})};
  };
  const fs::path folded = scratch("fold.onnx");
  io::export_onnx(fold, {randn({2, 3})}, folded.string(), batch);
  CHECK(fs::file_size(folded) > 0);
  fs::remove(folded);
  io::OnnxForward fold2 = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0].reshape({in[0].size(0) * 2, -1})};
  };
  REQUIRE_THROWS_WITH(io::export_onnx(fold2, {randn({2, 4, 3})}, scratch("f2.onnx").string(),
                                      {.dynamic_axes = {{"input", {{0, "n"}, {2, "m"}}}}}),
                      Contains("follow no single input dim"));
}

TEST_CASE("export_onnx checks its dynamic axes", "[io][onnx]") {
  if (!io::onnx_supported()) {
    testing::skip("this build has no ONNX writer (protobuf + onnx.proto)");
    return;
  }
  nn::Linear fc(3, 2);
  const std::string path = scratch("axes.onnx").string();
  REQUIRE_THROWS_WITH(
      io::export_onnx(fc, {randn({2, 3})}, path, {.dynamic_axes = {{"input", {{2, "n"}}}}}),
      Contains("names dim 2 of input 'input'"));
  REQUIRE_THROWS_WITH(
      io::export_onnx(fc, {randn({2, 3})}, path, {.dynamic_axes = {{"x", {{0, "n"}}}}}),
      Contains("names 'x', which is neither an input nor an output name"));
  REQUIRE_THROWS_WITH(
      io::export_onnx(fc, {randn({2, 3})}, path, {.dynamic_axes = {{"input", {{0, ""}}}}}),
      Contains("an empty name"));
  io::OnnxForward two = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{add(in[0], in[1])};
  };
  REQUIRE_THROWS_WITH(
      io::export_onnx(two, {randn({2, 3}), randn({2, 3})}, path,
                      {.dynamic_axes = {{"input_0", {{0, "n"}}}, {"input_1", {{1, "n"}}}}}),
      Contains("'n' has size 2 at dim 0 of input 'input_0' but 3"));
  // An output dim named as dynamic must vary.
  REQUIRE_THROWS_WITH(
      io::export_onnx(fc, {randn({2, 3})}, path,
                      {.dynamic_batch = true, .dynamic_axes = {{"output", {{1, "classes"}}}}}),
      Contains("dim 1 of output 'output' ('classes')") && Contains("does not change"));
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("export_onnx refuses what its ONNX operators would compute differently", "[io][onnx]") {
  if (!io::onnx_supported()) {
    testing::skip("this build has no ONNX writer (protobuf + onnx.proto)");
    return;
  }
  io::OnnxForward pool3d = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{max_pool2d(relu(in[0]), 2)};
  };
  REQUIRE_THROWS_WITH(io::export_onnx(pool3d, {randn({3, 4, 4})}, scratch("p.onnx").string()),
                      Contains("max_pool2d on a 3-d input") && Contains("unsqueeze(0)"));
  io::OnnxForward drop = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{dropout(in[0], 0.5, /*training=*/true)};
  };
  REQUIRE_THROWS_WITH(io::export_onnx(drop, {randn({3, 4})}, scratch("d.onnx").string()),
                      Contains("dropout in training mode"));
  io::OnnxForward uneven = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{adaptive_avg_pool2d(in[0], 3)};
  };
  REQUIRE_THROWS_WITH(io::export_onnx(uneven, {randn({1, 2, 7, 7})}, scratch("a.onnx").string()),
                      Contains("windows of different sizes"));
}
