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
#include <fstream>
#include <string>
#include <vector>

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
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "resnet50_cpu: missing value after %s\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--batch")
      batch = std::stoll(next());
    else if (k == "--size")
      size = std::stoll(next());
    else if (k == "--iters")
      iters = std::stoll(next());
    else if (k == "--warmup")
      warmup = std::stoll(next());
    else if (k == "--threads")
      threads = std::stoi(next());
    else if (k == "--arch")
      arch = next();
    else if (k == "--channels-last")
      channels_last = true;
    else if (k == "--amp")
      amp_on = true;
    else if (k == "--json")
      json = next();
    else {
      std::fprintf(stderr,
                   "usage: resnet50_cpu [--batch N] [--size N] [--iters N] [--warmup N] "
                   "[--threads N] [--arch resnet50] [--channels-last] [--amp] [--json PATH]\n");
      return 2;
    }
  }
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
      std::ofstream js(json);
      DLTRAIN_CHECK(js.good(), "cannot write --json file '", json, "'");
      js << "{\"framework\": \"dltrain\", \"arch\": \"" << arch << "\", \"batch\": " << batch
         << ", \"size\": " << size << ", \"threads\": " << get_num_threads()
         << ", \"channels_last\": " << (channels_last ? "true" : "false")
         << ", \"amp\": " << (amp_on ? "\"bf16\"" : "null") << ", \"forward_ms\": " << median(fwd)
         << ", \"backward_ms\": " << median(bwd) << ", \"step_ms\": " << median(stp)
         << ", \"total_ms\": " << median(tot) << ", \"img_per_s\": " << img_s << "}\n";
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "resnet50_cpu: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
