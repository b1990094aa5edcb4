// Activation checkpointing: trade compute for memory by recomputing a segment in backward.
//
// checkpoint(fn, inputs) runs `fn` and returns its outputs attached to ONE autograd node;
// the intermediates of `fn` (its saved activations) are dropped as soon as it returns. When
// the backward pass reaches that node, it re-runs `fn` on the same inputs with grad enabled
// and back-propagates the output gradients through the recomputation, returning gradients for
// the inputs and for every leaf `fn` used (its parameters). So memory holds the segments'
// boundaries plus one segment's activations at a time, for the cost of a second forward of
// every checkpointed segment (PyTorch's torch.utils.checkpoint).
//
// What the recomputation replays, so that it computes exactly what the first pass did:
// - the default generator's state (dropout masks are the same; the generator is put back
//   afterwards, so checkpointing does not change the random stream of what follows);
// - the autocast settings of the forward (autocast is otherwise off during backward);
// - the grad-mode and training decisions are those of the forward: the forward itself runs
//   with grad enabled and its graph is walked once to find the leaves `fn` uses, then freed.
// BatchNorm / InstanceNorm modules do not update their running statistics (nor
// num_batches_tracked) again during the recomputation: is_recomputing() is true there, and a
// custom module with running state should test it too.
//
// The gradients are those of the same computation without checkpointing, bit for bit where
// the arithmetic is the same (each parameter used once per segment). Parameter gradients
// reach their leaves through the outer backward pass, so gradient hooks (DDP's) fire once per
// parameter; backward(create_graph=true) works through a checkpoint (the recomputation is
// differentiated with a graph). A tensor computed outside `fn` with a graph and used inside
// it without being passed as an input is refused with an error naming the op that made it
// (pass it as an input); leaves (parameters) may be captured freely.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dltrain/core/tensor.hpp"
#include "dltrain/nn/module.hpp"

namespace dltrain::nn {

/// How checkpoint() recomputes.
struct CheckpointOptions {
  /// Save the default generator's state at forward and replay it for the recomputation (off:
  /// the recomputation draws new random numbers, so dropout masks differ from the forward's).
  bool preserve_rng_state = true;
};

/// A segment: any function of tensors to tensors. Inputs that are not floating or do not
/// require grad are passed as they are and get no gradient.
using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

/// Runs `fn(inputs)` without keeping its intermediates for backward (see the file comment).
/// Outside grad mode, or when neither an input nor a leaf used by `fn` requires grad, it is
/// just `fn(inputs)`.
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options = {});
/// One tensor in, one out: `y = nn::checkpoint([&](const Tensor& x) { return block(x); }, x);`
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const CheckpointOptions& options = {});
/// A module's forward, checkpointed.
Tensor checkpoint(Module& module, const Tensor& input, const CheckpointOptions& options = {});

/// Runs `modules` in order on `input`, in `segments` segments: as PyTorch's
/// checkpoint_sequential, the first segments - 1 segments of size(modules) / segments modules
/// each are checkpointed and the last one (with the remainder) runs normally, its activations
/// kept for backward (they would be recomputed at once). Throws dltrain::Error for segments < 1
/// or more segments than modules.
Tensor checkpoint_sequential(const std::vector<std::shared_ptr<Module>>& modules, int64_t segments,
                             const Tensor& input, const CheckpointOptions& options = {});
/// The children of a Sequential.
Tensor checkpoint_sequential(const Module& sequential, int64_t segments, const Tensor& input,
                             const CheckpointOptions& options = {});

/// True on this thread while a checkpointed segment is being recomputed in backward.
bool is_recomputing();

}  // namespace dltrain::nn
