// Forward and backward values of conv2d, batch_norm, max_pool2d and cross_entropy against
// PyTorch (tests/reference/ops_reference.txt, made by tests/reference/make_reference.py),
// in float64 (tight) and float32 (float rounding bounds), NCHW and channels-last.
#include <catch2/catch.hpp>

#include <cstdio>

#include "reference_file.hpp"

using namespace dltrain;
using Catch::Contains;

namespace {

const std::map<std::string, Tensor>& ref() {
  static const auto r =
      dltrain::testing::read_reference(DLTRAIN_REFERENCE_DIR "/ops_reference.txt");
  return r;
}
Tensor R(const std::string& name) {
  auto it = ref().find(name);
  DLTRAIN_CHECK(it != ref().end(), "no reference tensor '", name, "'");
  return it->second;
}
Tensor leaf(const std::string& name, DType dt, MemoryFormat fmt = MemoryFormat::Contiguous) {
  Tensor t = R(name).detach().to(dt);  // never mark the cached reference itself
  if (fmt == MemoryFormat::ChannelsLast) t = t.contiguous(fmt);
  t.requires_grad_();
  return t;
}
void close(const Tensor& got, const std::string& name, double tol) {
  INFO(name);
  Tensor want = R(name);
  REQUIRE(got.shape() == want.shape());
  REQUIRE(allclose(got.to(DType::f64), want, tol, tol));
}

struct Case {
  DType dt;
  MemoryFormat fmt;
  double tol;
};
const Case kCases[] = {{DType::f64, MemoryFormat::Contiguous, 1e-10},
                       {DType::f64, MemoryFormat::ChannelsLast, 1e-10},
                       {DType::f32, MemoryFormat::Contiguous, 2e-4},
                       {DType::f32, MemoryFormat::ChannelsLast, 2e-4}};

}  // namespace

TEST_CASE("conv2d matches PyTorch (groups, dilation, stride, padding, bias)",
          "[ops][reference][conv]") {
  for (const Case& c : kCases) {
    Tensor x = leaf("conv2d.x", c.dt, c.fmt), w = leaf("conv2d.w", c.dt),
           b = leaf("conv2d.b", c.dt);
    Tensor y = conv2d(x, w, b, 2, 1, 2, 2);
    REQUIRE(y.suggest_memory_format() == x.suggest_memory_format());
    close(y, "conv2d.y", c.tol);
    y.backward(R("conv2d.gy").to(c.dt));
    close(x.grad(), "conv2d.gx", c.tol);
    close(w.grad(), "conv2d.gw", c.tol);
    close(b.grad(), "conv2d.gb", c.tol);

    Tensor x2 = leaf("conv2d_nobias.x", c.dt, c.fmt), w2 = leaf("conv2d_nobias.w", c.dt);
    Tensor y2 = conv2d(x2, w2, Tensor(), 1, 1);
    close(y2, "conv2d_nobias.y", c.tol);
    y2.backward(R("conv2d_nobias.gy").to(c.dt));
    close(x2.grad(), "conv2d_nobias.gx", c.tol);
    close(w2.grad(), "conv2d_nobias.gw", c.tol);
  }
}

TEST_CASE("batch_norm matches PyTorch in training and eval", "[ops][reference][norm]") {
  for (const Case& c : kCases) {
    Tensor x = leaf("batch_norm.x", c.dt, c.fmt), w = leaf("batch_norm.weight", c.dt),
           b = leaf("batch_norm.bias", c.dt);
    Tensor rm = R("batch_norm.running_mean_in").to(c.dt).clone(),
           rv = R("batch_norm.running_var_in").to(c.dt).clone();
    Tensor y = batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5);
    REQUIRE(y.suggest_memory_format() == x.suggest_memory_format());
    close(y, "batch_norm.y", c.tol);
    close(rm, "batch_norm.running_mean_out", c.tol);
    close(rv, "batch_norm.running_var_out", c.tol);
    y.backward(R("batch_norm.gy").to(c.dt));
    close(x.grad(), "batch_norm.gx", c.tol);
    close(w.grad(), "batch_norm.gweight", c.tol);
    close(b.grad(), "batch_norm.gbias", c.tol);
    Tensor ye = batch_norm(R("batch_norm_eval.x").to(c.dt), w.detach(), b.detach(), rm, rv, false);
    close(ye, "batch_norm_eval.y", c.tol);
  }
}

TEST_CASE("max_pool2d matches PyTorch", "[ops][reference][pool]") {
  for (const Case& c : kCases) {
    Tensor x = leaf("max_pool2d.x", c.dt, c.fmt);
    Tensor y = max_pool2d(x, 3, Int2(2), 1);
    close(y, "max_pool2d.y", c.tol);
    y.backward(R("max_pool2d.gy").to(c.dt));
    close(x.grad(), "max_pool2d.gx", c.tol);
  }
}

TEST_CASE("cross_entropy with label smoothing matches PyTorch", "[ops][reference][loss]") {
  for (const Case& c : kCases) {
    if (c.fmt == MemoryFormat::ChannelsLast) continue;
    Tensor logits = leaf("cross_entropy.logits", c.dt);
    CrossEntropyOptions o;
    o.label_smoothing = 0.1;
    Tensor loss = cross_entropy(logits, R("cross_entropy.target").to(DType::i64), o);
    close(loss, "cross_entropy.loss", c.tol);
    loss.backward();
    close(logits.grad(), "cross_entropy.glogits", c.tol);

    Tensor l2 = leaf("cross_entropy_w.logits", c.dt);
    CrossEntropyOptions o2;
    o2.label_smoothing = 0.2;
    o2.reduction = Reduction::Sum;
    o2.weight = R("cross_entropy_w.weight").to(c.dt);
    Tensor loss2 = cross_entropy(l2, R("cross_entropy_w.target").to(DType::i64), o2);
    close(loss2, "cross_entropy_w.loss", c.tol);
    loss2.backward();
    close(l2.grad(), "cross_entropy_w.glogits", c.tol);
  }
}

TEST_CASE("reference reader rejects missing, truncated and corrupt files", "[reference][errors]") {
  const std::string dir = std::string(DLTRAIN_REFERENCE_DIR);
  REQUIRE_THROWS_WITH(dltrain::testing::read_reference(dir + "/does_not_exist.txt"),
                      Contains("cannot be opened"));
  const std::string tmp = "dltrain_ref_test.txt";
  {
    std::ofstream f(tmp);
    f << "a 2 2 2\n1 2 3\n";
  }
  REQUIRE_THROWS_WITH(dltrain::testing::read_reference(tmp),
                      Contains("truncated") && Contains("'a'"));
  {
    std::ofstream f(tmp);
    f << "a 1 2\n";
  }
  REQUIRE_THROWS_WITH(dltrain::testing::read_reference(tmp), Contains("no values line"));
  {
    std::ofstream f(tmp);
    f << "a 1 2\n1 x\n";
  }
  REQUIRE_THROWS_WITH(dltrain::testing::read_reference(tmp), Contains("non-numeric"));
  {
    std::ofstream f(tmp);
    f << "a 1 2\n1 2\n";
  }
  REQUIRE(dltrain::testing::read_reference(tmp).at("a").to_vector<double>() ==
          std::vector<double>{1, 2});
  std::remove(tmp.c_str());
}
