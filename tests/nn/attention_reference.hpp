// Shared by the attention and RNN tests: runs a module case recorded by
// tests/reference/make_attention_reference.py and compares outputs, input gradients and
// parameter gradients with PyTorch's, in f64 and in f32.
//
// A case "<c>" has its weights in reference/attention/<c>.pth (torch.save of the state dict,
// loaded with io::load_pth and load_state_dict(strict)), its inputs as "<c>.<name>" (bool masks
// stored as 0/1), and per dtype (tag "<c>" for f64, "<c>.f32") outputs "<tag>.y<i>", output
// gradients "<tag>.gy<i>", input gradients "<tag>.g<name>" and parameter gradients
// "<tag>.grad.<param>".
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "reference_file.hpp"

namespace dltrain::testing {

inline const char* attention_reference_path() {
  return DLTRAIN_REFERENCE_DIR "/attention_reference.txt";
}

inline Tensor aref(const std::string& name) {
  return reference_tensor(attention_reference_path(), name);
}

/// |a - b| <= atol + rtol |b| everywhere, with the worst element named on failure.
inline void require_close(const Tensor& a, const Tensor& b, double rtol, double atol,
                          const std::string& what) {
  INFO(what);
  REQUIRE(a.defined());
  REQUIRE(a.shape() == b.shape());
  const std::vector<double> x = a.to(DType::f64).contiguous().to_vector<double>();
  const std::vector<double> y = b.to(DType::f64).contiguous().to_vector<double>();
  double worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isinf(y[i]) && x[i] == y[i]) continue;
    const double excess = std::abs(x[i] - y[i]) - (atol + rtol * std::abs(y[i]));
    if (!(excess <= worst)) {
      worst = std::isnan(excess) ? INFINITY : excess;
      at = i;
    }
  }
  INFO("element " << at << ": got " << (x.empty() ? 0.0 : x[at]) << ", PyTorch "
                  << (y.empty() ? 0.0 : y[at]));
  REQUIRE(worst <= 0.0);
}

/// Loads reference/attention/<c>.pth into `model` (strict) and checks that the model's
/// state-dict keys come in PyTorch's order.
inline void load_reference_weights(nn::Module& model, const std::string& c) {
  const StateDict sd = io::load_pth(DLTRAIN_REFERENCE_DIR "/attention/" + c + ".pth");
  model.to(DType::f64);  // the saved f64 values unrounded; check_case converts them per run
  model.load_state_dict(sd);
  std::vector<std::string> ours, theirs;
  for (const auto& [k, v] : model.state_dict()) ours.push_back(k);
  for (const auto& [k, v] : sd) theirs.push_back(k);
  REQUIRE(ours == theirs);
}

using CaseFn = std::function<std::vector<Tensor>(std::map<std::string, Tensor>&)>;

/// Runs case `c` in `dt`: floating inputs (all names in `inputs` except those in `bool_inputs`)
/// become leaves requiring grad, bool inputs are converted to bool; fn's outputs (undefined
/// ones skipped, numbered in order) are compared, then sum(y_i * gy_i) is backpropagated and
/// every input and parameter gradient compared.
/// The model must hold the reference weights in f64 (load_reference_weights); it is left in `dt`,
/// so run f64 before f32.
inline void check_case(nn::Module& model, const std::string& c, DType dt,
                       const std::vector<std::string>& inputs,
                       const std::set<std::string>& bool_inputs, const CaseFn& fn) {
  const std::string tag = dt == DType::f64 ? c : c + ".f32";
  // f32: PyTorch and dltrain each round in f32 along different summation orders.
  const double rtol = dt == DType::f64 ? 1e-9 : 1e-5, atol = dt == DType::f64 ? 1e-10 : 2e-5;
  model.to(dt);
  model.zero_grad();
  std::map<std::string, Tensor> in;
  for (const auto& n : inputs) {
    const Tensor t = aref(c + "." + n);
    // A fresh leaf each run: the reference tensors are cached, and to(f64) returns the same one.
    in[n] = bool_inputs.count(n) ? ne(t, 0.0) : t.to(dt).clone().requires_grad_();
  }
  const std::vector<Tensor> ys = fn(in);
  Tensor loss;
  for (size_t i = 0; i < ys.size(); ++i) {
    if (!ys[i].defined()) continue;
    const std::string k = std::to_string(i);
    require_close(ys[i], aref(tag + ".y" + k), rtol, atol, tag + ": output " + k);
    const Tensor l = sum(mul(ys[i], aref(tag + ".gy" + k).to(dt)));
    loss = loss.defined() ? add(loss, l) : l;
  }
  loss.backward();
  for (const auto& n : inputs)
    if (!bool_inputs.count(n))
      require_close(in[n].grad(), aref(tag + ".g" + n), rtol, atol, tag + ": gradient of " + n);
  for (const auto& [n, p] : model.named_parameters())
    require_close(p.grad(), aref(tag + ".grad." + n), rtol, atol, tag + ": gradient of " + n);
}

}  // namespace dltrain::testing
