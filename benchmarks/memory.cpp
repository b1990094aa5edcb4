// Memory against time: the peak bytes of live tensors and the step time of ResNet training
// with activation checkpointing off and on (ResNet::checkpoint_segments), on the CPU.
//
//   memory [--arch resnet50] [--batch 8] [--size 224] [--segments 0,2,4,8] [--rounds 4]
//          [--threads N] [--channels-last] [--json PATH]
//
// Each round runs one training step (forward, cross-entropy, backward, SGD-momentum step) per
// configuration, configurations interleaved, after one untimed round; the peak is
// max_memory_allocated over the step (weights, gradients, momentum and activations: what the
// model costs, not the allocator's cache) and the time is the median over the rounds. The
// table gives both as ratios to segments = 0 (no checkpointing), the first configuration.
// Issue 29's targets for ResNet-50, batch 8, 224x224, 4 segments: peak <= 0.5x, time <= 1.5x.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/optim/sgd.hpp"

using namespace dltrain;
using Clock = std::chrono::steady_clock;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      out.push_back(std::stoll(item));
    } catch (const std::exception&) {
      throw Error("--segments: '" + item + "' is not a number; give e.g. 0,2,4,8");
    }
    if (out.back() < 0) throw Error("--segments: " + item + " is negative; 0 means off");
  }
  if (out.empty()) throw Error("--segments: give at least one value, e.g. 0,4");
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 8, size = 224, rounds = 4;
  int threads = 0;
  bool channels_last = false;
  std::string json, arch = "resnet50", segments_list = "0,2,4,8";
  cli::Flags flags("memory",
                   "Peak tensor memory and step time of ResNet training with activation "
                   "checkpointing off and on (CPU), as a table and JSON.");
  flags.group(cli::group::kBenchmark);
  flags.add("--arch", &arch, "torchvision ResNet name");
  flags.add("--batch", &batch, "images per step").positive();
  flags.add("--size", &size, "image size").positive();
  flags.add("--segments", &segments_list,
            "checkpoint_sequential segments over the residual blocks, per configuration (0: off)");
  flags.add("--rounds", &rounds, "timed rounds (one step per configuration each)").positive();
  flags.group(cli::group::kDevice);
  flags.add("--threads", &threads, "CPU threads (0: DLTRAIN_NUM_THREADS or all cores)").min(0);
  flags.add_switch("--channels-last", &channels_last, "channels-last (NHWC) memory format");
  flags.group(cli::group::kCheckpoint);
  flags.add("--json", &json, "write the figures here").value_name("FILE.json");
  flags.parse(argc, argv);
  try {
    if (threads > 0) set_num_threads(threads);
    const std::vector<int64_t> configs = parse_list(segments_list);
    manual_seed(0);
    auto model = models::resnet(arch);
    const MemoryFormat fmt = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
    model->to(fmt);
    const auto blocks = static_cast<int64_t>(model->blocks().size());
    for (int64_t s : configs)
      if (s > blocks)
        throw Error("--segments: " + std::to_string(s) + " is more than the " +
                    std::to_string(blocks) + " residual blocks of " + arch);
    optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4});
    Tensor x = randn({batch, 3, size, size}).contiguous(fmt);
    Tensor y = randint(0, 1000, {batch});
    std::vector<std::vector<double>> times(configs.size());
    std::vector<size_t> peaks(configs.size(), 0);
    for (int64_t r = 0; r <= rounds; ++r) {
      for (size_t c = 0; c < configs.size(); ++c) {
        model->checkpoint_segments = configs[c];
        opt.zero_grad();
        reset_peak_memory_stats();
        const auto t0 = Clock::now();
        Tensor loss = cross_entropy(model->forward(x), y);
        loss.backward();
        opt.step();
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        peaks[c] = std::max(peaks[c], max_memory_allocated());
        if (r > 0) times[c].push_back(ms);  // round 0 warms up every configuration
      }
    }
    const double base_peak = static_cast<double>(peaks[0]);
    const double base_ms = median(times[0]);
    std::printf("%s training step, batch %lld, %lldx%lld, %s, %d threads, median of %lld rounds\n",
                arch.c_str(), static_cast<long long>(batch), static_cast<long long>(size),
                static_cast<long long>(size), channels_last ? "channels-last" : "NCHW",
                get_num_threads(), static_cast<long long>(rounds));
    std::printf("  %-10s %14s %8s %12s %8s\n", "segments", "peak MiB", "x base", "step ms",
                "x base");
    nlohmann::json rows = nlohmann::json::array();
    for (size_t c = 0; c < configs.size(); ++c) {
      const double peak_mib = static_cast<double>(peaks[c]) / 1048576.0;
      const double ms = median(times[c]);
      std::printf("  %-10lld %14.1f %8.3f %12.1f %8.3f\n", static_cast<long long>(configs[c]),
                  peak_mib, static_cast<double>(peaks[c]) / base_peak, ms, ms / base_ms);
      rows.push_back({{"segments", configs[c]},
                      {"peak_tensor_bytes", peaks[c]},
                      {"peak_ratio", static_cast<double>(peaks[c]) / base_peak},
                      {"step_ms", ms},
                      {"time_ratio", ms / base_ms}});
    }
    if (!json.empty())
      cli::write_json_report(json, {{"framework", "dltrain"},
                                    {"arch", arch},
                                    {"batch", batch},
                                    {"size", size},
                                    {"threads", get_num_threads()},
                                    {"channels_last", channels_last},
                                    {"rounds", rounds},
                                    {"configs", rows}});
  } catch (const Error& e) {
    std::fprintf(stderr, "memory: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
