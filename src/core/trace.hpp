// Op tracing hooks (internal header): the one path through which forward ops, backward nodes,
// optimizer steps and user ranges reach train::Profiler.
//
// Every public op's entry point opens a detail::OpScope (DLTRAIN_OP_SCOPE), the autograd engine
// one per node it applies, Optimizer::step one per step, train::ProfileRange one per range.
// With no profiler active a scope costs one relaxed atomic load and a not-taken branch in its
// constructor and a test of its own flag in its destructor; nothing else runs and nothing is
// allocated. With a profiler active, the scope takes a steady_clock time at both ends (and, on a
// CUDA build with a GPU, records a CUDA event at both ends and pushes an NVTX range) and appends
// one complete event to its thread's buffer.
//
// Invariants: scopes on a thread nest (they are RAII objects), so each thread's events form a
// forest and a scope's self time is its duration less its direct children's; an event belongs
// to the session that was active when its scope opened and is dropped if that session ended
// first; a scope whose name equals that of the scope directly enclosing it on the same thread is
// not recorded, so an op that forwards to itself (add(a, 2.0) calling add(a, b), conv2d
// redispatching under autocast) counts once.
#pragma once

#include <atomic>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "dltrain/core/tensor.hpp"
#include "src/core/graph_trace.hpp"

namespace dltrain::detail {

/// What a traced scope is; the Chrome trace's category.
enum class TraceKind : uint8_t { Op, Backward, Optimizer, User };

/// True while a profiler session runs (read relaxed on every op).
inline std::atomic<bool> g_trace_active{false};

/// Opens a scope on this thread (the slow path); false when nothing was opened (no session,
/// or the same name as the enclosing scope). The name is `name` followed by `suffix`.
bool trace_begin(TraceKind kind, std::string_view name, std::string_view suffix = {});
/// Attaches the input shapes to the scope just opened, when the session records shapes.
void trace_shapes(std::initializer_list<const Tensor*> inputs);
/// Closes the innermost scope opened by trace_begin on this thread.
void trace_end();

/// RAII scope; see the file comment for its cost.
class OpScope {
 public:
  /// An op named `name` (a literal) with the tensors whose shapes record_shapes reports.
  template <class... Ts>
  requires(std::same_as<Ts, Tensor>&&...) explicit OpScope(TraceKind kind, std::string_view name,
                                                           const Ts&... inputs) {
    // First: graph_scope_enter may throw (an op with no ONNX mapping), and nothing is open yet.
    if (g_graph_tracers.load(std::memory_order_relaxed)) [[unlikely]]
      if (kind == TraceKind::Op) graph_ = graph_scope_enter(name, {&inputs...}, sizeof...(Ts) > 0);
    if (g_trace_active.load(std::memory_order_relaxed)) [[unlikely]] {
      on_ = trace_begin(kind, name);
      if constexpr (sizeof...(Ts) > 0)
        if (on_) trace_shapes({&inputs...});
    }
  }
  /// A scope named `name` + `suffix` ("conv2d" "_backward", "SGD" ".step").
  OpScope(TraceKind kind, std::string_view name, std::string_view suffix) {
    if (g_trace_active.load(std::memory_order_relaxed)) [[unlikely]]
      on_ = trace_begin(kind, name, suffix);
  }
  ~OpScope() {
    if (on_) [[unlikely]]
      trace_end();
    if (graph_) [[unlikely]]
      graph_scope_exit(graph_);
  }
  /// True for the outermost op scope of a graph trace (graph_trace.hpp): the op hands its
  /// inputs and attributes to graph_record() and returns what that returns.
  bool graph() const { return graph_ == 2; }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  bool on_ = false;
  uint8_t graph_ = 0;  // graph_scope_enter's answer
};

/// One recorded scope, as a session returns it.
struct TraceEvent {
  std::string name;
  TraceKind kind = TraceKind::Op;
  uint64_t thread = 0;        // the OS thread id
  int64_t start_ns = 0;       // since the session started
  int64_t dur_ns = 0;         // wall time
  int64_t self_ns = 0;        // wall time less that of directly nested scopes
  uint32_t depth = 0;         // 0 for a scope with no enclosing scope on its thread
  std::string shapes;         // "[[8, 3, 32, 32], [16, 3, 3, 3]]" when shapes were recorded
  double cuda_start_us = -1;  // on the GPU's timeline since the session started; -1: none
  double cuda_dur_us = -1;    // GPU time between the scope's two events; -1: none
  int cuda_device = -1;
};

/// Session options (train::ProfilerOptions carries them).
struct TraceOptions {
  bool record_shapes = false;
  bool cuda = true;  // CUDA events and NVTX ranges, when a GPU is visible
};

/// Starts a session. Throws dltrain::Error when one is already running.
void trace_start(const TraceOptions& options);
/// Ends the session and returns its events ordered by thread then start time (scopes still open
/// on some thread are left out). Waits for the CUDA events it recorded.
std::vector<TraceEvent> trace_stop();
/// Wall-clock time (microseconds since the Unix epoch) at which the running or last session
/// started, and whether CUDA timing was on in it.
int64_t trace_start_unix_us();
bool trace_cuda_enabled();

}  // namespace dltrain::detail

/// Opens a forward-op scope for the rest of the enclosing block: DLTRAIN_OP_SCOPE("conv2d", x, w).
/// The scope is the variable dltrain_op_scope_ (its graph() gates graph_record).
#define DLTRAIN_OP_SCOPE(name, ...)                                              \
  ::dltrain::detail::OpScope dltrain_op_scope_(::dltrain::detail::TraceKind::Op, \
                                               name __VA_OPT__(, ) __VA_ARGS__)
