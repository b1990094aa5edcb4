// train::Profiler over the trace collector of src/core/trace.hpp: the session's lifetime, the
// per-name aggregates and their table, and the Chrome trace JSON (written with nlohmann/json).
#include "dltrain/train/profiler.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "src/core/trace.hpp"
#include "src/train/file_util.hpp"
#include "src/train/json_util.hpp"

namespace dltrain::train {

namespace {

using Clock = std::chrono::steady_clock;

const char* category(detail::TraceKind k) {
  switch (k) {
    case detail::TraceKind::Op:
      return "cpu_op";
    case detail::TraceKind::Backward:
      return "backward";
    case detail::TraceKind::Optimizer:
      return "optimizer";
    case detail::TraceKind::User:
      return "user_range";
  }
  return "cpu_op";
}

// The session's steady-clock start, for the profiled wall time (one session at a time).
Clock::time_point g_started;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

Profiler::Profiler(ProfilerOptions options) : options_(options) {
  detail::trace_start({options.record_shapes, options.cuda});
  running_ = true;
  g_started = Clock::now();
  start_unix_us_ = detail::trace_start_unix_us();
}

Profiler::~Profiler() {
  if (running_) detail::trace_stop();
}

void Profiler::stop() {
  if (!running_) return;
  running_ = false;
  wall_us_ = std::chrono::duration<double, std::micro>(Clock::now() - g_started).count();
  std::vector<detail::TraceEvent> raw = detail::trace_stop();
  events_.clear();
  events_.reserve(raw.size());
  for (auto& r : raw) {
    ProfileEvent e;
    e.name = std::move(r.name);
    e.category = category(r.kind);
    e.thread = r.thread;
    e.start_us = r.start_ns / 1000.0;
    e.dur_us = r.dur_ns / 1000.0;
    e.self_us = r.self_ns / 1000.0;
    e.depth = r.depth;
    e.shapes = std::move(r.shapes);
    e.cuda_start_us = r.cuda_start_us;
    e.cuda_dur_us = r.cuda_dur_us;
    events_.push_back(std::move(e));
  }
}

const std::vector<ProfileEvent>& Profiler::events() {
  stop();
  return events_;
}

std::vector<ProfileStat> Profiler::key_averages(bool group_by_shapes) {
  stop();
  std::map<std::pair<std::string, std::string>, ProfileStat> by_key;
  for (const auto& e : events_) {
    auto key = std::make_pair(e.name, group_by_shapes ? e.shapes : std::string());
    ProfileStat& s = by_key[key];
    if (s.calls == 0) {
      s.name = key.first;
      s.shapes = key.second;
    }
    s.calls++;
    s.total_us += e.dur_us;
    s.self_us += e.self_us;
    if (e.cuda_dur_us > 0) s.cuda_us += e.cuda_dur_us;
  }
  std::vector<ProfileStat> out;
  out.reserve(by_key.size());
  for (auto& [k, s] : by_key) out.push_back(std::move(s));
  std::stable_sort(out.begin(), out.end(), [](const ProfileStat& a, const ProfileStat& b) {
    return a.self_us > b.self_us;
  });
  return out;
}

std::string Profiler::table(size_t top_k, bool group_by_shapes) {
  std::vector<ProfileStat> stats = key_averages(group_by_shapes);
  double self_total = 0, cuda_total = 0;
  for (const auto& s : stats) {
    self_total += s.self_us;
    cuda_total += s.cuda_us;
  }
  const bool cuda = cuda_total > 0;
  size_t name_w = 4;
  const size_t rows = std::min(top_k, stats.size());
  for (size_t i = 0; i < rows; ++i) name_w = std::max(name_w, stats[i].name.size());
  name_w = std::min<size_t>(name_w, 40);

  auto cell = [](std::string& line, const std::string& text, size_t w, bool left = false) {
    std::string t = text.size() > w ? text.substr(0, w - 3) + "..." : text;
    const std::string pad(w - t.size(), ' ');
    line += left ? t + pad : pad + t;
    line += "  ";
  };
  auto trimmed = [](std::string line) {
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return line + '\n';
  };
  std::string head;
  cell(head, "Name", name_w, true);
  cell(head, "Calls", 7);
  cell(head, "Self CPU ms", 12);
  cell(head, "Self CPU %", 10);
  cell(head, "CPU total ms", 12);
  cell(head, "CPU avg ms", 11);
  if (cuda) {
    cell(head, "CUDA total ms", 13);
    cell(head, "CUDA %", 7);
  }
  if (group_by_shapes) cell(head, "Input shapes", 30, true);
  head = trimmed(head);
  const std::string rule(head.size() - 1, '-');
  std::ostringstream os;
  os << rule << '\n' << head << rule << '\n';
  for (size_t i = 0; i < rows; ++i) {
    const ProfileStat& s = stats[i];
    std::string line;
    cell(line, s.name, name_w, true);
    cell(line, std::to_string(s.calls), 7);
    cell(line, fixed(s.self_us / 1000.0, 3), 12);
    cell(line, fixed(self_total > 0 ? 100.0 * s.self_us / self_total : 0.0, 2) + "%", 10);
    cell(line, fixed(s.total_us / 1000.0, 3), 12);
    cell(line, fixed(s.total_us / 1000.0 / double(s.calls), 4), 11);
    if (cuda) {
      cell(line, fixed(s.cuda_us / 1000.0, 3), 13);
      cell(line, fixed(100.0 * s.cuda_us / cuda_total, 1) + "%", 7);
    }
    if (group_by_shapes) cell(line, s.shapes, 30, true);
    os << trimmed(line);
  }
  os << rule << '\n';
  os << "Self CPU time total: " << fixed(self_total / 1000.0, 3) << " ms over " << events_.size()
     << " events (" << stats.size() << " names; profiled wall time " << fixed(wall_us_ / 1000.0, 3)
     << " ms)";
  if (cuda) os << "\nCUDA time total: " << fixed(cuda_total / 1000.0, 3) << " ms";
  os << '\n';
  return os.str();
}

std::string Profiler::chrome_trace_json() {
  stop();
  using nlohmann::json;
  const int pid = static_cast<int>(::getpid());
  json evs = json::array();
  std::set<uint64_t> threads;
  bool any_cuda = false;
  for (const auto& e : events_) {
    threads.insert(e.thread);
    json args = {{"self_us", json_number(e.self_us)}, {"depth", e.depth}};
    if (!e.shapes.empty()) args["Input Shapes"] = e.shapes;
    evs.push_back({{"name", e.name},
                   {"cat", e.category},
                   {"ph", "X"},
                   {"pid", pid},
                   {"tid", e.thread},
                   {"ts", json_number(e.start_us)},
                   {"dur", json_number(e.dur_us)},
                   {"args", std::move(args)}});
    if (e.cuda_dur_us >= 0) {
      any_cuda = true;
      evs.push_back({{"name", e.name},
                     {"cat", "cuda"},
                     {"ph", "X"},
                     {"pid", pid},
                     {"tid", 0},
                     {"ts", json_number(e.cuda_start_us)},
                     {"dur", json_number(e.cuda_dur_us)},
                     {"args", {{"cpu_thread", e.thread}}}});
    }
  }
  evs.push_back({{"name", "process_name"},
                 {"ph", "M"},
                 {"pid", pid},
                 {"tid", 0},
                 {"args", {{"name", "dltrain"}}}});
  for (uint64_t t : threads)
    evs.push_back({{"name", "thread_name"},
                   {"ph", "M"},
                   {"pid", pid},
                   {"tid", t},
                   {"args",
                    {{"name", (t == static_cast<uint64_t>(pid) ? "main thread " : "thread ") +
                                  std::to_string(t)}}}});
  if (any_cuda)
    evs.push_back({{"name", "thread_name"},
                   {"ph", "M"},
                   {"pid", pid},
                   {"tid", 0},
                   {"args", {{"name", "CUDA (event times)"}}}});
  json doc = {{"traceEvents", std::move(evs)},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"producer", "dltrain train::Profiler"},
                {"start_unix_us", start_unix_us_},
                {"wall_us", json_number(wall_us_)},
                {"record_shapes", options_.record_shapes}}}};
  return dump_json(doc);
}

void Profiler::write_chrome_trace(const std::string& path) {
  const std::string text = chrome_trace_json();
  OutputFile f(path, false, "profiler trace");
  f.write(text);
  f.write("\n", 1);
  f.flush();
}

ProfileRange::ProfileRange(std::string_view name) {
  if (detail::g_trace_active.load(std::memory_order_relaxed)) [[unlikely]]
    on_ = detail::trace_begin(detail::TraceKind::User, name);
}

ProfileRange::~ProfileRange() {
  if (on_) detail::trace_end();
}

}  // namespace dltrain::train
