// The frame of the op benchmarks (benchmarks/research_ops_cpu, benchmarks/gnn_ops_cpu): the flags
// --threads, --iters and --json, each case timed as the median of --iters runs after two
// warm-up runs and printed as one line, and the JSON {"threads": N, "cases": {name: ms}} that
// their PyTorch peers (benchmarks/peers/pytorch_*_ops_cpu.py) read and compare (header-only).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/core/generator.hpp"
#include "dltrain/core/parallel.hpp"

namespace dltrain::apps {

class OpBench {
 public:
  /// `program` and `description` as in cli::Flags.
  OpBench(const std::string& program, const std::string& description)
      : flags_(program, description) {
    flags_.group(cli::group::kBenchmark);
    flags_.add("--threads", &threads_, "CPU threads").positive();
    flags_.add("--iters", &iters_, "timed iterations per case (the median is reported)").positive();
    flags_.add("--json", &json_, "write the figures here").value_name("FILE.json");
  }
  /// Parses the command line (exits with status 2 naming a bad flag), then sets the threads and
  /// seeds the global generator with 0 (the same inputs every run).
  void parse(int argc, char** argv) {
    flags_.parse(argc, argv);
    set_num_threads(threads_);
    manual_seed(0);
  }
  /// Times `f` (the median of --iters runs after two warm-up runs), prints and records it.
  void run(const std::string& name, const std::function<void()>& f) {
    f();
    f();
    std::vector<double> t;
    for (int i = 0; i < iters_; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      t.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    const double ms = t[t.size() / 2];
    std::printf("%-44s %9.3f ms\n", name.c_str(), ms);
    std::fflush(stdout);
    results_.emplace_back(name, ms);
  }
  /// Writes the --json file (when given); returns the exit status.
  int finish() const {
    if (!json_.empty()) {
      nlohmann::json cases = nlohmann::json::object();
      for (const auto& [name, ms] : results_) cases[name] = ms;
      cli::write_json_report(json_, {{"threads", threads_}, {"cases", cases}});
    }
    return 0;
  }

 private:
  cli::Flags flags_;
  int threads_ = 2, iters_ = 20;
  std::string json_;
  std::vector<std::pair<std::string, double>> results_;
};

}  // namespace dltrain::apps
