// Forward hooks on modules (PyTorch's register_forward_pre_hook / register_forward_hook): code
// that runs around a module's forward without changing the module, which is how
// FullyShardedDataParallel gathers a unit's parameters just before the unit runs and frees
// them after.
//
// The hooks run in Module::operator()(x), the call that containers (Sequential), ResNet's
// stages and models written in the documented style use for their children; a module whose
// parent calls its forward(x) directly, or one of its multi-argument overloads, runs without
// its hooks. They are kept in a registry beside the modules (the Module class does not grow),
// looked up only while at least one hook exists, so a program without hooks pays one relaxed
// atomic load per call.
#pragma once

#include <cstdint>
#include <functional>

#include "dltrain/core/tensor.hpp"

namespace dltrain::nn {

class Module;

struct ForwardHooks {
  /// Runs before forward(x).
  std::function<void(Module&)> pre{};
  /// Runs after forward(x) returned `out`; returns what operator() returns (`out` itself, or a
  /// tensor computed from it, e.g. an identity node that acts in backward).
  std::function<Tensor(Module&, const Tensor& out)> post{};
};

/// Registers hooks on `module` (several per module run in registration order, posts too).
/// Returns the handle remove_forward_hooks takes. The registry keys on the module's address:
/// remove the hooks before the module is destroyed.
uint64_t register_forward_hooks(Module& module, ForwardHooks hooks);
/// Removes the hooks registered under `handle` (no-op for an unknown handle).
void remove_forward_hooks(uint64_t handle);

}  // namespace dltrain::nn
