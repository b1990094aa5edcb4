// Autograd graph nodes and how ops record them.
//
// An op that has inputs requiring gradients records one Node holding a
// backward closure. The closure captures the tensors it needs ("saved
// tensors"); releasing the node destroys the closure and frees them, which is
// what the engine does as soon as a node has run (unless retain_graph). The
// closure receives one gradient per output (undefined where the output got
// none) and returns one gradient per input (undefined for inputs that need
// none), each with its input's shape. Backward closures are written with
// ops, so they run on whatever device the tensors are on.
//
// Higher-order gradients (backward(create_graph=true), autograd::grad): the
// engine then runs the closures with grad mode on, so the ops they call record
// a graph of their own. A closure recorded with HigherOrder::Supported is
// written so that this graph is right: it keeps its inputs as they are (with
// their graph), its outputs as SavedOutput, and when grad mode is on it takes
// composite formulas of differentiable ops instead of fused gradient kernels.
// Any other node's gradients get a node that raises a clear error if a second
// backward ever reaches it (PyTorch's "not implemented" double backward).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dltrain/core/tensor.hpp"

namespace dltrain::autograd {

class Node;

/// An edge to the node that consumes a gradient, and which of its inputs it is.
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
};

/// Backward function of a node: output gradients in, input gradients out.
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

/// Whether a node's backward function can itself be differentiated (see the file comment).
enum class HigherOrder { Unsupported, Supported };

/// One recorded op in the autograd graph.
class Node : public std::enable_shared_from_this<Node> {
 public:
  Node(std::string name, std::vector<Edge> next, uint32_t num_outputs);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& name() const { return name_; }
  const std::vector<Edge>& next_edges() const { return next_; }
  uint32_t num_outputs() const { return num_outputs_; }
  /// Creation order; the engine runs later nodes first among those ready.
  uint64_t sequence_nr() const { return seq_; }
  /// Shapes/dtypes of the outputs, so a missing output gradient can be zero-filled.
  std::vector<Shape> output_shapes;
  std::vector<TensorOptions> output_options;
  /// Outputs recorded undefined (no gradient flows there; the engine does not zero-fill them).
  std::vector<bool> output_missing;

  /// Computes input gradients. Throws if the node was released.
  virtual std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) = 0;
  /// Frees saved tensors; a later apply() raises a clear error.
  virtual void release() {}
  /// True when apply() run with grad mode on records a correct graph of its gradients.
  virtual bool supports_higher_order() const { return false; }

 private:
  std::string name_;
  std::vector<Edge> next_;
  uint32_t num_outputs_;
  uint64_t seq_;
};

/// An input or output of an op that its backward closure keeps, with the version of its
/// memory (Storage::version) when the op ran. record() finds them by copying the closure once
/// with detail::t_copy_probe set; apply() refuses to run the closure when one moved.
struct SavedVersion {
  const VersionCounter* counter = nullptr;
  uint64_t version = 0;
  bool is_output = false;
  uint32_t index = 0;
};

/// A node whose backward is a closure (every op uses this).
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, std::vector<Edge> next, uint32_t num_outputs, BackwardFn fn,
               HigherOrder higher = HigherOrder::Unsupported);
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override;
  void release() override;
  bool supports_higher_order() const override {
    return higher_ == HigherOrder::Supported || adjoint_ != nullptr;
  }
  /// See set_adjoint.
  void set_adjoint(BackwardFn adjoint) { adjoint_ = std::move(adjoint); }
  const BackwardFn& adjoint() const { return adjoint_; }
  /// The saved inputs and outputs whose versions apply() checks (set by record()).
  void set_saved_versions(std::vector<SavedVersion> v) { saved_versions_ = std::move(v); }

 private:
  /// Throws dltrain::Error naming this op and the in-place op when a saved tensor changed.
  void check_saved_versions() const;

  BackwardFn fn_;
  std::vector<SavedVersion> saved_versions_;
  BackwardFn adjoint_;
  HigherOrder higher_;
  bool released_ = false;
};

/// The node that accumulates into a leaf's .grad() and fires its hooks. It holds the leaf
/// weakly: a gradient kept with its graph (create_graph) may lead back to this node, and a
/// strong reference would make leaf -> grad -> graph -> node -> leaf a cycle that never frees.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf);
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override;
  bool supports_higher_order() const override { return true; }
  /// The leaf, or null when it no longer exists (nobody can read its gradient then).
  std::shared_ptr<TensorImpl> leaf() const { return leaf_.lock(); }

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

/// An output of an op kept for its backward function. It is stored detached (keeping it
/// with its grad_fn would be a reference cycle: output -> node -> closure -> output); get()
/// returns that plain tensor, except while a create_graph backward runs the node that
/// saved it: then the tensor comes back attached to that node as output `output_nr`, so
/// formulas that use it are differentiated through the op again.
class SavedOutput {
 public:
  SavedOutput() = default;
  explicit SavedOutput(const Tensor& output, uint32_t output_nr = 0)
      : data_(output.detach()), output_nr_(output_nr) {}
  Tensor get() const;
  /// The plain (detached) tensor, for kernels.
  const Tensor& data() const { return data_; }

 private:
  Tensor data_;
  uint32_t output_nr_ = 0;
};

/// True when autograd records ops on this thread (see NoGradGuard).
bool grad_mode_enabled();
void set_grad_mode(bool enabled);

/// Disables recording on this thread for its lifetime (evaluation, optimizer steps).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_mode_enabled()) { set_grad_mode(false); }
  ~NoGradGuard() { set_grad_mode(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// True when grad mode is on and any of `inputs` requires a gradient.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

/// An input of an op kept for its backward function, by the tensor the kernels read
/// (`values`: the input made contiguous, say) plus the input's place in the graph. get()
/// returns the values, attached to the input's graph while a create_graph backward runs,
/// so a higher-order formula can use them without the op holding the input's own storage
/// too. When values and input differ in dtype or shape the input itself is kept.
class SavedInput {
 public:
  SavedInput() = default;
  SavedInput(const Tensor& input, const Tensor& values);
  Tensor get() const;
  const Tensor& data() const { return data_; }

 private:
  Tensor data_;
  Tensor input_;  // the input itself, when it had to be kept (a leaf, other dtype or shape)
  std::shared_ptr<Node> grad_fn_;
  uint32_t output_nr_ = 0;
};

/// Enables recording on this thread for its lifetime, inside a NoGradGuard too (a
/// gradient penalty computed inside an evaluation loop, the gradient checker).
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(grad_mode_enabled()) { set_grad_mode(true); }
  ~EnableGradGuard() { set_grad_mode(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

/// Records a node for `outputs` computed from `inputs` (does nothing when no input
/// requires a gradient or grad mode is off). Outputs get requires_grad and grad_fn.
/// `higher` says whether `backward` is written for higher-order gradients (file comment).
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn backward, HigherOrder higher = HigherOrder::Unsupported);

/// The edge through which a gradient for `t` flows (its grad_fn, or its leaf accumulator).
Edge gradient_edge(const Tensor& t);

/// Queues `fn` to run on this thread when the backward pass now running has processed its
/// last node (before backward() returns). Only valid from inside backward (a hook or a
/// node); DDP uses it to finish gradient reduction. Throws outside backward.
void queue_callback(std::function<void()> fn);

/// For backward functions under create_graph (helpers for HigherOrder::Supported ops).
///
/// grad_by_recompute: the gradients of an op with respect to `inputs` (undefined or not
/// requiring grad ones get an undefined gradient), seeded with `grad_outputs`, found by
/// running `reference` -- the op written as a composite of differentiable ops -- on the
/// inputs and differentiating it with create_graph. Fused kernels stay the first-order
/// path; this is how an op such as batch_norm or cross_entropy gets every higher order.
std::vector<Tensor> grad_by_recompute(
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& reference,
    const std::vector<Tensor>& inputs, const std::vector<Tensor>& grad_outputs);

/// set_adjoint: declares that the backward function of the node that produced `output` is
/// linear in the output gradients and depends on nothing differentiable (pooling, slicing:
/// indices and shapes only), and gives its adjoint -- gradients of the input gradients in,
/// gradients of the output gradients out, usually the forward op itself applied to them. A
/// create_graph backward then keeps the fast kernel and records the adjoint as its derivative.
/// Does nothing when `output` has no grad_fn.
void set_adjoint(const Tensor& output, BackwardFn adjoint);

/// linear_backward: records that `value` (computed by a kernel from `grad` alone) is a
/// linear function of `grad` whose adjoint is `adjoint` (written with differentiable ops),
/// so a gradient such as max-pooling's scatter or slicing's padding can be differentiated
/// again. Returns `value`, attached to the graph when grad mode is on and grad requires it.
Tensor linear_backward(const char* name, const Tensor& grad, const Tensor& value,
                       std::function<Tensor(const Tensor&)> adjoint);

/// Runs backward from `roots` seeded with `grads` (undefined = ones for one-element roots)
/// and accumulates into the leaves' grad(). With create_graph the gradients are computed
/// with a graph of their own (so they can be differentiated again) and the graph is kept.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph = false, bool create_graph = false);

/// The gradients of `outputs` (seeded with `grad_outputs`, undefined = ones for one-element
/// outputs) with respect to `inputs`, returned instead of accumulated: no leaf's grad()
/// changes and no hook fires. An input the outputs do not depend on is an error unless
/// allow_unused (then its gradient is undefined). With create_graph the results carry a
/// graph (higher-order derivatives: gradient penalties, physics-informed losses, Hessian-
/// vector products). retain_graph defaults to create_graph, as in PyTorch.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {},
                         std::optional<bool> retain_graph = std::nullopt, bool create_graph = false,
                         bool allow_unused = false);

}  // namespace dltrain::autograd

namespace dltrain {
using autograd::EnableGradGuard;
using autograd::NoGradGuard;
}  // namespace dltrain
