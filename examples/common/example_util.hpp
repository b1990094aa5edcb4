// Helpers shared by the examples: the chronometer's statistics, wall-clock seconds, the
// --device flag's parsing and a small command-line parser (header-only).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "dltrain/core/device.hpp"

namespace dltrain::examples {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// min / median / mean / std of a list of step times (seconds), the chronometer's summary.
struct Stats {
  double min = 0, median = 0, mean = 0, std = 0;
};
inline Stats stats(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.median = v[v.size() / 2];
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.std += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(s.std / static_cast<double>(v.size()));
  return s;
}

/// Prints the chronometer table: min / median / std in ms of the data, forward (with the
/// loss) and backward + optimizer-step times, one row each.
inline void print_chronometer(const char* data_label, const std::vector<double>& data,
                              const std::vector<double>& forward,
                              const std::vector<double>& backward) {
  std::printf("chronometer over %zu steps (ms): %-18s %8s %8s %8s\n", forward.size(), "", "min",
              "median", "std");
  auto row = [](const char* name, const Stats& s) {
    std::printf("  %-44s %8.2f %8.2f %8.2f\n", name, 1e3 * s.min, 1e3 * s.median, 1e3 * s.std);
  };
  row(data_label, stats(data));
  row("forward (incl. loss)", stats(forward));
  row("backward + optimizer step", stats(backward));
}

/// "cpu", "cuda" (device 0) or "cuda:N"; throws std::invalid_argument otherwise.
inline Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) return Device::cuda(std::stoi(s.substr(5)));
  throw std::invalid_argument(s);
}

/// Command-line flags bound to variables: `--name VALUE` for strings and numbers, `--name`
/// alone for switches. Unknown flags, missing or malformed values print the message and the
/// usage line to stderr and exit with code 2; -h/--help prints the usage.
class Flags {
 public:
  Flags(std::string program, std::string usage)
      : program_(std::move(program)), usage_(std::move(usage)) {}
  template <class T>
  Flags& add(const std::string& name, T* value) {
    bound_[name] = value;
    return *this;
  }
  /// A switch: its presence stores `set` into *value.
  Flags& add_switch(const std::string& name, bool* value, bool set = true) {
    switches_[name] = {value, set};
    return *this;
  }
  void parse(int argc, char** argv) const {
    for (int i = 1; i < argc; ++i) {
      const std::string k = argv[i];
      if (k == "-h" || k == "--help") fail("help");
      if (auto s = switches_.find(k); s != switches_.end()) {
        *s->second.first = s->second.second;
        continue;
      }
      auto b = bound_.find(k);
      if (b == bound_.end()) fail("unknown flag " + k);
      if (i + 1 >= argc) fail("missing value after " + k);
      const std::string v = argv[++i];
      try {
        std::visit(
            [&](auto* p) {
              using T = std::remove_pointer_t<decltype(p)>;
              size_t used = v.size();
              if constexpr (std::is_same_v<T, std::string>)
                *p = v;
              else if constexpr (std::is_same_v<T, double>)
                *p = std::stod(v, &used);
              else if constexpr (std::is_same_v<T, uint64_t>)
                *p = std::stoull(v, &used);
              else
                *p = static_cast<T>(std::stoll(v, &used));
              if (used != v.size()) throw std::invalid_argument(v);
            },
            b->second);
      } catch (const std::logic_error&) {
        fail("bad value for " + k + ": '" + v + "'");
      }
    }
  }
  [[noreturn]] void fail(const std::string& msg) const {
    std::fprintf(stderr, "%s: %s\nusage: %s %s\n", program_.c_str(), msg.c_str(), program_.c_str(),
                 usage_.c_str());
    std::exit(2);
  }

 private:
  std::string program_, usage_;
  std::map<std::string, std::variant<std::string*, double*, int64_t*, int*, uint64_t*>> bound_;
  std::map<std::string, std::pair<bool*, bool>> switches_;
};

}  // namespace dltrain::examples
