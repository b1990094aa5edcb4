// The trace collector behind detail::OpScope (see trace.hpp).
//
// Each thread that opens a scope during a session gets a buffer, owned jointly by the thread
// (thread_local) and the global list, so the events of a loader worker that has exited are
// still collected. A thread's open scopes live on its own stack (no lock); a closed scope is
// appended to its buffer under the buffer's mutex, which only trace_stop() contends for.
// Session changes are ordered by that mutex: trace_stop() advances the session number and then
// locks each buffer in turn, and a scope's end checks its session under the same lock, so an
// event is either collected by the stop that ends its session or dropped, never left behind for
// the next session.
#include "src/core/trace.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <sstream>

#include "dltrain/core/error.hpp"
#include "src/backend/cuda/trace.hpp"

namespace dltrain::detail {

namespace cutrace = backend::cuda::trace;

namespace {

using Clock = std::chrono::steady_clock;

struct Frame {
  std::string name;
  TraceKind kind;
  uint64_t session;
  Clock::time_point start;
  int64_t child_ns = 0;
  std::string shapes;
  cutrace::Mark cuda_start = nullptr;
  bool nvtx = false;  // an NVTX range was pushed (popped at the end even if no event was recorded)
};

struct ClosedEvent {
  TraceEvent event;
  cutrace::Mark cuda_start = nullptr, cuda_end = nullptr;
};

struct ThreadBuffer {
  uint64_t thread = static_cast<uint64_t>(::syscall(SYS_gettid));
  std::vector<Frame> stack;  // this thread only
  std::mutex mu;             // guards events
  std::vector<ClosedEvent> events;
};

struct Global {
  std::mutex mu;  // guards buffers, options, start times, cuda_base
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  TraceOptions options;
  bool cuda = false;
  Clock::time_point start;
  int64_t start_unix_us = 0;
  cutrace::Mark cuda_base = nullptr;
};

Global& global() {
  static Global* g = new Global;  // never destroyed: threads may close scopes during exit
  return *g;
}

std::atomic<uint64_t> g_session{0};
// The running session's options, for the scopes' slow path.
std::atomic<bool> g_shapes{false};
std::atomic<bool> g_cuda{false};

thread_local std::shared_ptr<ThreadBuffer> t_buffer;

ThreadBuffer& buffer() {
  if (!t_buffer) {
    t_buffer = std::make_shared<ThreadBuffer>();
    std::lock_guard<std::mutex> lock(global().mu);
    global().buffers.push_back(t_buffer);
  }
  return *t_buffer;
}

std::string shape_list(std::initializer_list<const Tensor*> inputs) {
  std::ostringstream os;
  os << '[';
  bool first = true;
  for (const Tensor* t : inputs) {
    if (!first) os << ", ";
    first = false;
    if (!t || !t->defined()) {
      os << "[]";
      continue;
    }
    os << '[';
    const Shape& s = t->shape();
    for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
    os << ']';
  }
  os << ']';
  return os.str();
}

}  // namespace

bool trace_begin(TraceKind kind, std::string_view name, std::string_view suffix) {
  if (!g_trace_active.load(std::memory_order_acquire)) return false;
  const uint64_t session = g_session.load(std::memory_order_acquire);
  ThreadBuffer& b = buffer();
  if (!b.stack.empty()) {
    const Frame& top = b.stack.back();
    if (top.session == session && top.kind == kind &&
        top.name.size() == name.size() + suffix.size() &&
        std::string_view(top.name).starts_with(name) &&
        std::string_view(top.name).ends_with(suffix))
      return false;
  }
  Frame f;
  f.name.reserve(name.size() + suffix.size());
  f.name.append(name).append(suffix);
  f.kind = kind;
  f.session = session;
  if (g_cuda.load(std::memory_order_relaxed)) {
    cutrace::range_push(f.name.c_str());
    f.nvtx = true;
    f.cuda_start = cutrace::mark();
  }
  f.start = Clock::now();
  b.stack.push_back(std::move(f));
  return true;
}

void trace_shapes(std::initializer_list<const Tensor*> inputs) {
  if (!g_shapes.load(std::memory_order_relaxed) || !t_buffer || t_buffer->stack.empty()) return;
  t_buffer->stack.back().shapes = shape_list(inputs);
}

void trace_end() {
  const auto end = Clock::now();
  ThreadBuffer& b = *t_buffer;  // trace_begin made it
  Frame f = std::move(b.stack.back());
  b.stack.pop_back();
  const int64_t dur = std::chrono::duration_cast<std::chrono::nanoseconds>(end - f.start).count();
  if (!b.stack.empty()) b.stack.back().child_ns += dur;
  cutrace::Mark cuda_end = nullptr;
  if (f.cuda_start) cuda_end = cutrace::mark();
  if (f.nvtx) cutrace::range_pop();
  std::lock_guard<std::mutex> lock(b.mu);
  if (f.session != g_session.load(std::memory_order_acquire) ||
      !g_trace_active.load(std::memory_order_relaxed)) {
    cutrace::recycle(f.cuda_start);
    cutrace::recycle(cuda_end);
    return;
  }
  ClosedEvent c;
  TraceEvent& e = c.event;
  e.name = std::move(f.name);
  e.kind = f.kind;
  e.thread = b.thread;
  // Relative to the session start, which was written before this session's number was.
  e.start_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(f.start - global().start).count();
  e.dur_ns = dur;
  e.self_ns = std::max<int64_t>(0, dur - f.child_ns);
  e.depth = static_cast<uint32_t>(b.stack.size());
  e.shapes = std::move(f.shapes);
  c.cuda_start = f.cuda_start;
  c.cuda_end = cuda_end;
  b.events.push_back(std::move(c));
}

void trace_start(const TraceOptions& options) {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  DLTRAIN_CHECK(!g_trace_active.load(std::memory_order_relaxed),
                "train::Profiler: a profiler is already running (one at a time per process); "
                "stop() the first one, or let it go out of scope, before starting another; "
                "train::ProfileRange marks a sub-range inside a running one");
  g.options = options;
  g.cuda = options.cuda && cutrace::usable();
  g_shapes.store(options.record_shapes, std::memory_order_relaxed);
  g_cuda.store(g.cuda, std::memory_order_relaxed);
  for (auto& b : g.buffers) {
    std::lock_guard<std::mutex> bl(b->mu);
    b->events.clear();
  }
  g.start_unix_us = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  g.cuda_base = g.cuda ? cutrace::mark() : nullptr;
  g.start = Clock::now();
  g_session.fetch_add(1, std::memory_order_acq_rel);
  g_trace_active.store(true, std::memory_order_release);
}

std::vector<TraceEvent> trace_stop() {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  if (!g_trace_active.load(std::memory_order_relaxed)) return {};
  g_trace_active.store(false, std::memory_order_release);
  g_session.fetch_add(1, std::memory_order_acq_rel);
  std::vector<ClosedEvent> closed;
  std::vector<std::shared_ptr<ThreadBuffer>> alive;
  for (auto& b : g.buffers) {
    {
      std::lock_guard<std::mutex> bl(b->mu);
      for (auto& c : b->events) closed.push_back(std::move(c));
      b->events.clear();
    }
    // Only the list holds the buffer of a thread that has exited.
    if (b.use_count() > 1) alive.push_back(b);
  }
  g.buffers = std::move(alive);
  std::vector<TraceEvent> out;
  out.reserve(closed.size());
  for (auto& c : closed) {
    if (c.cuda_start && c.cuda_end && g.cuda_base) {
      const double at = cutrace::elapsed_ms(g.cuda_base, c.cuda_start);
      const double dur = cutrace::elapsed_ms(c.cuda_start, c.cuda_end);
      if (at >= 0 && dur >= 0) {
        c.event.cuda_start_us = at * 1000.0;
        c.event.cuda_dur_us = dur * 1000.0;
      }
    }
    cutrace::recycle(c.cuda_start);
    cutrace::recycle(c.cuda_end);
    out.push_back(std::move(c.event));
  }
  cutrace::recycle(g.cuda_base);
  g.cuda_base = nullptr;
  std::stable_sort(out.begin(), out.end(), [](const TraceEvent& a, const TraceEvent& b) {
    if (a.thread != b.thread) return a.thread < b.thread;
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return a.depth < b.depth;
  });
  return out;
}

int64_t trace_start_unix_us() {
  std::lock_guard<std::mutex> lock(global().mu);
  return global().start_unix_us;
}

bool trace_cuda_enabled() {
  std::lock_guard<std::mutex> lock(global().mu);
  return global().cuda;
}

}  // namespace dltrain::detail
