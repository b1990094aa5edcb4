// nn::fuse_conv_bn and nn::fold_conv_bn (dltrain/nn/fuse.hpp): BatchNorm folded into the
// convolution before it, the pairs found by running the model once with forward hooks.
#include "dltrain/nn/fuse.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/nn/hooks.hpp"
#include "dltrain/nn/layers.hpp"
#include "dltrain/nn/module.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/ops/norm.hpp"
#include "dltrain/ops/reduction.hpp"

namespace dltrain::nn {

void fold_conv_bn(Conv2d& conv, BatchNorm& bn) {
  DLTRAIN_CHECK(!bn.folded, "fold_conv_bn: ", bn.type_name(), "(", bn.num_features,
                ") is already folded into a convolution");
  DLTRAIN_CHECK(bn.options.track_running_stats && bn.running_mean.defined(),
                "fold_conv_bn: ", bn.type_name(), "(", bn.num_features,
                ") has no running statistics (track_running_stats = false): it normalises with "
                "each batch's statistics even in eval mode, which no convolution can fold");
  DLTRAIN_CHECK(conv.out_channels == bn.num_features, "fold_conv_bn: Conv2d has ",
                conv.out_channels, " output channels but ", bn.type_name(), " normalises ",
                bn.num_features);
  autograd::NoGradGuard ng;
  const int64_t c = bn.num_features;
  const Tensor var = bn.running_var.to(DType::f64), mean = bn.running_mean.to(DType::f64);
  const Tensor gamma =
      bn.weight.defined() ? bn.weight.detach().to(DType::f64) : ones({c}, DType::f64);
  const Tensor beta = bn.bias.defined() ? bn.bias.detach().to(DType::f64) : zeros({c}, DType::f64);
  const Tensor scale = div(gamma, sqrt(add(var, bn.options.eps)));
  const Tensor b0 =
      conv.bias.defined() ? conv.bias.detach().to(DType::f64) : zeros({c}, DType::f64);
  const Tensor bias = add(mul(sub(b0, mean), scale), beta);
  const Tensor w = conv.weight.detach();
  const Tensor folded =
      mul(w.to(DType::f64), scale.view({c, 1, 1, 1})).to(w.dtype()).to(w.device());
  conv.weight.copy_(folded);  // in place: layout, device and handle kept
  const Tensor new_bias = bias.to(w.dtype()).to(w.device());
  if (conv.bias.defined()) {
    conv.bias.copy_(new_bias);
  } else {
    conv.bias = conv.register_parameter("bias", new_bias.clone(), conv.weight.requires_grad());
    conv.options.bias = true;
  }
  // The BatchNorm becomes the identity, flagged and in its tensors.
  if (bn.weight.defined()) bn.weight.fill_(1.0);
  if (bn.bias.defined()) bn.bias.fill_(0.0);
  bn.running_mean.fill_(0.0);
  bn.running_var.fill_(1.0 - bn.options.eps);
  bn.folded = true;
}

namespace {

// |a - b| / max|b| over two tensors of one shape.
double relative_change(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(DType::f64), y = b.to(DType::f64);
  const double scale = max(abs(y)).item<double>();
  const double diff = max(abs(sub(x, y))).item<double>();
  return scale > 0 ? diff / scale : diff;
}

}  // namespace

FuseReport fuse_conv_bn(Module& model, const Tensor& example_input) {
  model.eval();
  autograd::NoGradGuard ng;
  // Names of the modules, for the report.
  std::map<const Module*, std::string> names;
  for (const auto& [name, m] : model.named_modules()) names[m.get()] = name.empty() ? "." : name;

  // 1. Run once with hooks: each Conv2d's output, and each BatchNorm whose output equals the
  //    BatchNorm recomputed on the last convolution's output (so its input was that output).
  struct Pair {
    Conv2d* conv;
    BatchNorm* bn;
  };
  std::vector<Pair> pairs;
  Tensor last_conv_out;
  Conv2d* last_conv = nullptr;
  std::vector<uint64_t> handles;
  struct Unhook {
    std::vector<uint64_t>& h;
    ~Unhook() {
      for (uint64_t k : h) remove_forward_hooks(k);
    }
  } unhook{handles};
  for (const auto& [name, m] : model.named_modules()) {
    if (auto* conv = dynamic_cast<Conv2d*>(m.get())) {
      handles.push_back(register_forward_hooks(
          *conv, {.post = [&last_conv_out, &last_conv](Module& self, const Tensor& out) {
            last_conv_out = out;
            last_conv = static_cast<Conv2d*>(&self);
            return out;
          }}));
    } else if (auto* bn = dynamic_cast<BatchNorm*>(m.get())) {
      if (bn->folded || !bn->options.track_running_stats) continue;
      handles.push_back(register_forward_hooks(
          *bn, {.post = [&last_conv_out, &last_conv, &pairs](Module& self, const Tensor& out) {
            auto& b = static_cast<BatchNorm&>(self);
            if (last_conv && last_conv_out.defined() && last_conv_out.shape() == out.shape() &&
                last_conv->out_channels == b.num_features) {
              const Tensor again =
                  batch_norm(last_conv_out, b.weight, b.bias, b.running_mean, b.running_var,
                             /*training=*/false, 0.0, b.options.eps);
              if (again.dtype() == out.dtype() && allclose(again, out, 0.0, 0.0)) {
                bool seen = false;
                for (const Pair& p : pairs) seen = seen || p.bn == &b || p.conv == last_conv;
                if (!seen) pairs.push_back({last_conv, &b});
              }
            }
            last_conv = nullptr;  // a BatchNorm consumes the convolution's output once
            return out;
          }}));
    }
  }
  const Tensor before = model(example_input).clone();
  for (uint64_t k : handles) remove_forward_hooks(k);
  handles.clear();

  // 2. Fold, keeping copies to undo.
  FuseReport report;
  struct Saved {
    Pair pair;
    StateDict conv_state, bn_state;
    bool had_bias;
  };
  std::vector<Saved> saved;
  for (const Pair& p : pairs) {
    StateDict cs, bs;
    for (const auto& [k, t] : p.conv->state_dict()) cs.insert(k, t.clone());
    for (const auto& [k, t] : p.bn->state_dict()) bs.insert(k, t.clone());
    saved.push_back({p, std::move(cs), std::move(bs), p.conv->bias.defined()});
    fold_conv_bn(*p.conv, *p.bn);
    report.pairs.push_back(names[p.conv] + " + " + names[p.bn]);
  }
  if (pairs.empty()) return report;

  // 3. The example again: a fold changes each output element by rounding only (the weight's
  //    rounding, and the per-channel affine map now applied before the sum instead of after);
  //    a change of 1e-3 of the output's range is far above that and far below what folding a
  //    pair whose convolution output had another use does (the BatchNorm's whole effect).
  const Tensor after = model(example_input);
  report.max_change = relative_change(after, before);
  const double bound = example_input.dtype() == DType::f64 ? 1e-9 : 1e-3;
  if (!(report.max_change <= bound)) {
    std::string list;
    for (const std::string& s : report.pairs) list += (list.empty() ? "" : ", ") + s;
    for (Saved& s : saved) {
      if (!s.had_bias) {
        // The bias parameter stays registered (a module cannot unregister one); zero it.
        s.pair.conv->bias.fill_(0.0);
        s.conv_state.insert("bias", s.pair.conv->bias.clone());
      }
      s.pair.conv->load_state_dict(s.conv_state);
      s.pair.bn->load_state_dict(s.bn_state);
      s.pair.bn->folded = false;
    }
    DLTRAIN_FAIL("fuse_conv_bn: folding ", list, " changed the model's output by ",
                 report.max_change, " of its range (rounding explains at most ", bound,
                 "): a convolution's output is also used elsewhere than by its BatchNorm. "
                 "Nothing was folded; fold the pairs that are safe with nn::fold_conv_bn");
  }
  return report;
}

}  // namespace dltrain::nn
