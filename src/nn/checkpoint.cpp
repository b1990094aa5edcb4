// Activation checkpointing (include/dltrain/nn/checkpoint.hpp): one autograd node per
// segment, whose backward re-runs the segment and differentiates the recomputation.
#include "dltrain/nn/checkpoint.hpp"

#include <optional>
#include <string>
#include <unordered_set>
#include <utility>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/core/generator.hpp"
#include "src/amp/replay.hpp"
#include "src/autograd/internal.hpp"

namespace dltrain::nn {

namespace {

thread_local int t_recomputing = 0;

struct RecomputeScope {
  RecomputeScope() { ++t_recomputing; }
  ~RecomputeScope() { --t_recomputing; }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
};

// The default generator's position, and a scope that puts it at a saved position and back.
struct RngState {
  uint64_t seed = 0, offset = 0;
  static RngState now() {
    Generator& g = default_generator();
    return {g.seed(), g.offset()};
  }
  void restore() const {
    Generator& g = default_generator();
    g.manual_seed(seed);
    g.set_offset(offset);
  }
};

struct RngReplay {
  RngState outer = RngState::now();
  explicit RngReplay(const RngState& s) { s.restore(); }
  ~RngReplay() { outer.restore(); }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;
};

bool differentiable(const Tensor& t) {
  return t.defined() && t.requires_grad() && is_floating(t.dtype());
}

// The segment's inputs as the recomputation sees them: a differentiable input becomes a fresh
// leaf over the same memory (first-order backward) or an alias node attached to the input's
// own graph (create_graph, so that the gradients can be differentiated with respect to the
// input too). `wrt` receives those, in input order.
std::vector<Tensor> segment_inputs(const std::vector<Tensor>& inputs, bool attach,
                                   std::vector<Tensor>& wrt) {
  std::vector<Tensor> xs(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!differentiable(x)) {
      xs[i] = x;
      continue;
    }
    Tensor a = x.detach();
    if (attach) {
      autograd::record(
          "checkpoint_input", {x}, {a},
          [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; },
          autograd::HigherOrder::Supported);
    } else {
      a.requires_grad_(true);
    }
    xs[i] = a;
    wrt.push_back(a);
  }
  return xs;
}

// The leaves the segment's graph (recorded from `outputs`, nodes numbered from `first_seq`)
// reaches, other than the segment's own input leaves. A node older than the segment is a
// tensor computed outside it and captured: refused, since its gradient could not be returned.
std::vector<Tensor> used_leaves(const std::vector<Tensor>& outputs, uint64_t first_seq,
                                const std::vector<Tensor>& own_inputs) {
  std::unordered_set<const TensorImpl*> own;
  for (const Tensor& x : own_inputs) own.insert(x.impl().get());
  std::unordered_set<const autograd::Node*> seen;
  std::unordered_set<const TensorImpl*> found;
  std::vector<Tensor> leaves;
  std::vector<autograd::Node*> stack;
  for (const Tensor& y : outputs)
    if (y.defined() && y.grad_fn() && seen.insert(y.grad_fn().get()).second)
      stack.push_back(y.grad_fn().get());
  while (!stack.empty()) {
    autograd::Node* n = stack.back();
    stack.pop_back();
    if (auto* acc = dynamic_cast<autograd::AccumulateGrad*>(n)) {
      std::shared_ptr<TensorImpl> leaf = acc->leaf();
      if (leaf && !own.count(leaf.get()) && found.insert(leaf.get()).second)
        leaves.emplace_back(std::move(leaf));
      continue;
    }
    DLTRAIN_CHECK(n->sequence_nr() >= first_seq,
                  "nn::checkpoint: the checkpointed function uses a ",
                  "tensor computed before it with a graph (made by '", n->name(),
                  "') without taking it as an input, so its gradient could not flow back; pass ",
                  "that tensor in the inputs of checkpoint (or detach() it if it needs no "
                  "gradient)");
    for (const autograd::Edge& e : n->next_edges())
      if (e.node && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  }
  return leaves;
}

// A handle on `t`'s place in the graph (grad_fn and output number, shape and dtype) without its
// memory: the roots of the recomputation's backward need no values, and holding the outputs
// themselves would keep a segment output alive through the whole of its backward.
Tensor graph_handle(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = t.shape();
  impl->strides = t.strides();
  impl->dtype = t.dtype();
  impl->requires_grad = true;
  impl->grad_fn = t.grad_fn();
  impl->output_nr = t.impl()->output_nr;
  return Tensor(std::move(impl));
}

}  // namespace

bool is_recomputing() { return t_recomputing > 0; }

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options) {
  DLTRAIN_CHECK(static_cast<bool>(fn), "nn::checkpoint: the function is empty");
  if (!autograd::grad_mode_enabled()) return fn(inputs);
  const RngState rng = RngState::now();
  const amp::detail::AutocastSnapshot cast = amp::detail::autocast_snapshot();

  // The forward, with grad enabled so that it computes exactly what the recomputation will
  // (kernels may choose differently for training), and so that its graph shows which leaves
  // the segment uses. The graph, and with it every intermediate, goes when this scope ends.
  std::vector<Tensor> outputs, leaves;
  {
    std::vector<Tensor> own;
    const std::vector<Tensor> xs = segment_inputs(inputs, false, own);
    const uint64_t first_seq = autograd::next_sequence_nr();
    outputs = fn(xs);
    leaves = used_leaves(outputs, first_seq, own);
    for (Tensor& y : outputs)
      if (y.defined()) y = y.detach();
  }

  std::vector<Tensor> recorded_inputs;  // the node's edges: differentiable inputs, then leaves
  for (const Tensor& x : inputs)
    if (differentiable(x)) recorded_inputs.push_back(x);
  const size_t num_inputs = recorded_inputs.size();
  for (const Tensor& l : leaves) recorded_inputs.push_back(l);
  if (recorded_inputs.empty()) return outputs;

  const bool preserve = options.preserve_rng_state;
  autograd::record(
      "checkpoint", recorded_inputs, outputs,
      [fn, inputs, leaves, rng, cast, preserve, num_inputs](const std::vector<Tensor>& grads) {
        // The engine runs backward functions with grad mode on only for create_graph.
        const bool create_graph = autograd::grad_mode_enabled();
        std::vector<Tensor> result(num_inputs + leaves.size());
        std::vector<Tensor> wrt, outs;
        {
          autograd::EnableGradGuard enable;
          RecomputeScope recompute;
          std::optional<RngReplay> rng_replay;
          if (preserve) rng_replay.emplace(rng);
          amp::detail::AutocastReplay cast_replay(cast);
          const std::vector<Tensor> xs = segment_inputs(inputs, create_graph, wrt);
          outs = fn(xs);
        }
        DLTRAIN_CHECK(outs.size() == grads.size(), "nn::checkpoint: the recomputation returned ",
                      outs.size(), " outputs where the forward returned ", grads.size(),
                      "; the checkpointed function must be deterministic in its structure");
        std::vector<Tensor> roots, seeds;
        for (size_t k = 0; k < outs.size(); ++k) {
          if (!outs[k].defined() || !outs[k].requires_grad() || !grads[k].defined()) continue;
          roots.push_back(graph_handle(outs[k]));
          seeds.push_back(grads[k]);
        }
        outs.clear();  // the recomputed outputs' memory goes as soon as their nodes ran
        for (const Tensor& l : leaves) wrt.push_back(l);
        if (roots.empty() || wrt.empty()) return result;
        std::vector<Tensor> gs =
            autograd::grad(roots, wrt, seeds, create_graph, create_graph, /*allow_unused=*/true);
        for (size_t j = 0; j < gs.size(); ++j) result[j] = std::move(gs[j]);
        return result;
      },
      autograd::HigherOrder::Supported);
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const CheckpointOptions& options) {
  DLTRAIN_CHECK(static_cast<bool>(fn), "nn::checkpoint: the function is empty");
  return checkpoint([fn](const std::vector<Tensor>& xs) { return std::vector<Tensor>{fn(xs[0])}; },
                    {input}, options)[0];
}

Tensor checkpoint(Module& module, const Tensor& input, const CheckpointOptions& options) {
  std::shared_ptr<Module> keep = module.shared_from_this();
  return checkpoint(
      [keep](const std::vector<Tensor>& xs) { return std::vector<Tensor>{(*keep)(xs[0])}; },
      {input}, options)[0];
}

Tensor checkpoint_sequential(const std::vector<std::shared_ptr<Module>>& modules, int64_t segments,
                             const Tensor& input, const CheckpointOptions& options) {
  const auto n = static_cast<int64_t>(modules.size());
  DLTRAIN_CHECK(segments >= 1 && segments <= n, "nn::checkpoint_sequential: ", segments,
                " segments for ", n, " modules; give between 1 and the number of modules");
  for (int64_t i = 0; i < n; ++i)
    DLTRAIN_CHECK(modules[static_cast<size_t>(i)] != nullptr, "nn::checkpoint_sequential: module ",
                  i, " is null");
  const int64_t size = n / segments;
  auto run = [modules](int64_t begin, int64_t end) {
    return [modules, begin, end](const Tensor& x) {
      Tensor y = x;
      for (int64_t i = begin; i < end; ++i) y = (*modules[static_cast<size_t>(i)])(y);
      return y;
    };
  };
  Tensor x = input;
  int64_t begin = 0;
  for (int64_t s = 0; s + 1 < segments; ++s, begin += size)
    x = checkpoint(run(begin, begin + size), x, options);
  return run(begin, n)(x);
}

Tensor checkpoint_sequential(const Module& sequential, int64_t segments, const Tensor& input,
                             const CheckpointOptions& options) {
  std::vector<std::shared_ptr<Module>> modules;
  for (auto& [name, m] : sequential.named_children()) modules.push_back(m);
  DLTRAIN_CHECK(!modules.empty(), "nn::checkpoint_sequential: ", sequential.type_name(),
                " has no children to run");
  return checkpoint_sequential(modules, segments, input, options);
}

}  // namespace dltrain::nn
