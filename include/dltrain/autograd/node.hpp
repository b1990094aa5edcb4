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
#pragma once

#include <atomic>
#include <functional>
#include <memory>
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

  /// Computes input gradients. Throws if the node was released.
  virtual std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) = 0;
  /// Frees saved tensors; a later apply() raises a clear error.
  virtual void release() {}

 private:
  std::string name_;
  std::vector<Edge> next_;
  uint32_t num_outputs_;
  uint64_t seq_;
};

/// A node whose backward is a closure (every op uses this).
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, std::vector<Edge> next, uint32_t num_outputs, BackwardFn fn);
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override;
  void release() override;

 private:
  BackwardFn fn_;
  bool released_ = false;
};

/// The node that accumulates into a leaf's .grad() and fires its hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override;
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
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

/// Records a node for `outputs` computed from `inputs` (does nothing when no input
/// requires a gradient or grad mode is off). Outputs get requires_grad and grad_fn.
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn backward);

/// The edge through which a gradient for `t` flows (its grad_fn, or its leaf accumulator).
Edge gradient_edge(const Tensor& t);

/// Queues `fn` to run on this thread when the backward pass now running has processed its
/// last node (before backward() returns). Only valid from inside backward (a hook or a
/// node); DDP uses it to finish gradient reduction. Throws outside backward.
void queue_callback(std::function<void()> fn);

/// Runs backward from `roots` seeded with `grads` (undefined = ones for one-element roots).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph = false);

}  // namespace dltrain::autograd

namespace dltrain {
using autograd::NoGradGuard;
}
