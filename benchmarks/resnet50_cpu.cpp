// ResNet-50 training-step throughput on the CPU (synthetic data): forward, backward and
// an SGD-momentum step on a batch of [N, 3, H, W] images, timed per phase. Prints a table
// and writes JSON; benchmarks/peers/pytorch_resnet50_cpu.py runs the same step in PyTorch
// and compares (--compare).
//
//   resnet50_cpu [--batch 8] [--size 224] [--iters 5] [--warmup 1] [--threads N]
//                [--arch resnet50] [--channels-last] [--amp] [--json PATH]
//
// --amp runs forward and loss under bf16 autocast (the CPU's mixed precision; f32 master
// weights, no loss scaling needed for bf16). benchmarks/resnet50_cpu_compare.sh runs the three
// course configurations (f32 NCHW, f32 channels-last, bf16 autocast channels-last) on both
// sides and prints the ratios.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/optim/sgd.hpp"

using namespace dltrain;
using Clock = std::chrono::steady_clock;

namespace {
double ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 8, size = 224, iters = 5, warmup = 1;
  int threads = 0;
  bool channels_last = false, amp_on = false;
  std::string json, arch = "resnet50";
  cli::Flags flags("resnet50_cpu",
                   "ResNet training-step time on the CPU (forward+loss, backward, optimizer step, "
                   "median ms, img/s) on synthetic data; compare with "
                   "benchmarks/peers/pytorch_resnet50_cpu.py.");
  flags.group(cli::group::kBenchmark);
  flags.add("--arch", &arch, "torchvision ResNet name");
  flags.add("--batch", &batch, "images per step").positive();
  flags.add("--size", &size, "image size").positive();
  flags.add("--iters", &iters, "timed steps").positive();
  flags.add("--warmup", &warmup, "untimed steps first").min(0);
  flags.group(cli::group::kDevice);
  flags.add("--threads", &threads, "CPU threads (0: DLTRAIN_NUM_THREADS or all cores)").min(0);
  flags.add_switch("--channels-last", &channels_last, "channels-last (NHWC) memory format");
  flags.add_switch("--amp", &amp_on, "bf16 autocast");
  flags.group(cli::group::kCheckpoint);
  flags.add("--json", &json, "write the figures here").value_name("FILE.json");
  flags.parse(argc, argv);
  try {
    if (threads > 0) set_num_threads(threads);
    manual_seed(0);
    auto model = models::resnet(arch);
    MemoryFormat fmt = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
    model->to(fmt);
    optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4});
    Tensor x = randn({batch, 3, size, size}).contiguous(fmt);
    Tensor y = randint(0, 1000, {batch});
    std::vector<double> fwd, bwd, stp, tot;
    for (int64_t it = 0; it < warmup + iters; ++it) {
      auto t0 = Clock::now();
      Tensor loss;
      {
        amp::autocast ac(DeviceType::CPU, DType::bf16, amp_on);
        loss = cross_entropy(model->forward(x), y);
      }
      auto t1 = Clock::now();
      opt.zero_grad();
      loss.backward();
      auto t2 = Clock::now();
      opt.step();
      auto t3 = Clock::now();
      if (it >= warmup) {
        fwd.push_back(ms(t0, t1));
        bwd.push_back(ms(t1, t2));
        stp.push_back(ms(t2, t3));
        tot.push_back(ms(t0, t3));
      }
    }
    double img_s = 1e3 * static_cast<double>(batch) / median(tot);
    std::printf("%s training step, batch %lld, %lldx%lld, %s, %s, %d threads, median of %lld\n",
                arch.c_str(), static_cast<long long>(batch), static_cast<long long>(size),
                static_cast<long long>(size), channels_last ? "channels-last" : "NCHW",
                amp_on ? "bf16 autocast" : "f32", get_num_threads(), static_cast<long long>(iters));
    std::printf(
        "  %-16s %10.1f ms\n  %-16s %10.1f ms\n  %-16s %10.1f ms\n  %-16s %10.1f ms\n"
        "  %-16s %10.2f img/s\n",
        "forward+loss", median(fwd), "backward", median(bwd), "optimizer step", median(stp),
        "total", median(tot), "throughput", img_s);
    if (!json.empty()) {
      cli::write_json_report(json, {{"framework", "dltrain"},
                                    {"arch", arch},
                                    {"batch", batch},
                                    {"size", size},
                                    {"threads", get_num_threads()},
                                    {"channels_last", channels_last},
                                    {"amp", amp_on ? nlohmann::json("bf16") : nlohmann::json()},
                                    {"forward_ms", median(fwd)},
                                    {"backward_ms", median(bwd)},
                                    {"step_ms", median(stp)},
                                    {"total_ms", median(tot)},
                                    {"img_per_s", img_s}});
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "resnet50_cpu: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
