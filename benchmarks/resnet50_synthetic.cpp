// ResNet-50 on one GPU with synthetic data, the classic convnet-benchmarks protocol: random
// images [B, 3, 224, 224] (f32) and int64 labels made once and kept on the device, so only the
// model is timed. For each batch size and mode ("forward": train-mode forward under
// NoGradGuard; "train": forward + cross-entropy + backward + SGD step, zero_grad every step)
// a fresh model (seed 0) runs --warmup untimed then --iters timed iterations; each iteration
// sits between two CUDA events on the current stream, read after one synchronize. The table
// gives the mean (first start to last end, over iters) and the median of the per-iteration
// times, img/s from the mean, and the peak of live device memory (reset before the warm-up).
// --amp runs forward and loss under autocast (f16 by default, --amp-dtype bf16 for bf16), and
// f16 trains with a GradScaler (scale, step, update every step), as the examples' --amp does.
// Writes JSON with --json, rewritten after every configuration (a crash or a time-out leaves
// the ones done); benchmarks/peers/pytorch_resnet50.py runs the same protocol in PyTorch and
// compares (--compare).
//
//   resnet50_synthetic [--batch-sizes 64,128,256] [--modes forward,train] [--warmup 10]
//                      [--iters 50] [--depth 50] [--size 224] [--device 0] [--no-tf32]
//                      [--cudnn-benchmark | --no-cudnn-benchmark] [--channels-last]
//                      [--amp [--amp-dtype f16|bf16]] [--json PATH]
//
// Without a visible CUDA device it prints "skipped: no CUDA device" and exits 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "apps/common/cli.hpp"
#include "apps/common/example_util.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;

namespace {

struct Args {
  std::vector<int64_t> batch_sizes{64, 128, 256};
  std::vector<std::string> modes{"forward", "train"};
  int64_t warmup = 10, iters = 50, depth = 50, size = 224;
  int device = 0;
  bool tf32 = true, cudnn_benchmark = true;
  apps::PrecisionFlags prec;  // --amp, --amp-dtype, --channels-last
  std::string json;
};

struct Result {
  int64_t batch = 0;
  std::string mode;
  double ms_per_iter = 0, median_ms = 0, wall_ms_per_iter = 0, img_per_s = 0, peak_mib = 0;
  double last_loss = NAN;  // after the last timed step (train mode)
  std::string error;       // non-empty when the configuration failed
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr,
               "resnet50_synthetic: error: %s\nRun 'resnet50_synthetic --help' for the flags "
               "and their defaults.\n",
               msg.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  cli::Flags f("resnet50_synthetic",
               "The convnet-benchmark protocol on one GPU: synthetic data already on the device, "
               "forward and training-step ms/iter, img/s and peak memory per batch size; compare "
               "with benchmarks/peers/pytorch_resnet50.py.");
  f.group(cli::group::kBenchmark);
  f.add("--batch-sizes", &a.batch_sizes, "batch sizes to time").positive();
  f.add("--modes", &a.modes, "what to time").choices({"forward", "train"});
  f.add("--warmup", &a.warmup, "untimed iterations first").min(0);
  f.add("--iters", &a.iters, "timed iterations").positive();
  f.add("--depth", &a.depth, "ResNet depth: 18, 34, 50, 101 or 152");
  f.add("--size", &a.size, "image size").min(32);
  f.group(cli::group::kDevice);
  f.add("--device", &a.device, "CUDA device index").min(0);
  f.add_switch("--tf32", &a.tf32, "TF32 tensor-core math for f32", /*negatable=*/true);
  f.add_switch("--cudnn-benchmark", &a.cudnn_benchmark, "cuDNN picks the fastest algorithms",
               /*negatable=*/true);
  a.prec.add_to(f);
  f.group(cli::group::kCheckpoint);
  f.add("--json", &a.json, "write the figures here (after every configuration)")
      .value_name("FILE.json");
  f.parse(argc, argv);
  a.prec.check(f);
  if (a.depth != 18 && a.depth != 34 && a.depth != 50 && a.depth != 101 && a.depth != 152)
    f.fail("--depth: '" + std::to_string(a.depth) + "' is not 18, 34, 50, 101 or 152");
  return a;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) return std::string("unknown (") + cudaGetErrorString(err) + ")";
  return prop.name;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One configuration: a fresh model and optimizer, warm-up, timed iterations.
Result run_config(const Args& a, int64_t batch, const std::string& mode, const Tensor& images,
                  const Tensor& labels) {
  using Clock = std::chrono::steady_clock;
  Result r;
  r.batch = batch;
  r.mode = mode;
  const Device dev = Device::cuda(a.device);
  const MemoryFormat fmt = a.prec.format();
  const bool train = mode == "train";

  cuda::synchronize(a.device);
  cuda::reset_peak_memory_stats(a.device);
  manual_seed(0);
  auto model = models::resnet("resnet" + std::to_string(a.depth));
  model->to(dev);
  model->to(fmt);
  model->train();
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  // f16 autocast scales the loss; otherwise the scaler is a pass-through.
  amp::GradScaler scaler(a.prec.scaler_options(dev));
  Tensor x = images.narrow(0, 0, batch);
  Tensor y = labels.narrow(0, 0, batch);
  Tensor loss;

  auto step = [&] {
    if (train) {
      opt.zero_grad();
      {
        const amp::autocast ac = a.prec.region(dev);
        loss = cross_entropy(model->forward(x), y);
      }
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
    } else {
      NoGradGuard no_grad;
      const amp::autocast ac = a.prec.region(dev);
      model->forward(x);
    }
  };

  for (int64_t i = 0; i < a.warmup; ++i) step();
  std::vector<cuda::Event> start, stop;
  start.reserve(static_cast<size_t>(a.iters));
  stop.reserve(static_cast<size_t>(a.iters));
  for (int64_t i = 0; i < a.iters; ++i) {
    start.emplace_back(true);
    stop.emplace_back(true);
  }
  cuda::synchronize(a.device);

  auto t0 = Clock::now();
  for (size_t i = 0; i < start.size(); ++i) {
    start[i].record();
    step();
    stop[i].record();
  }
  cuda::synchronize(a.device);
  auto t1 = Clock::now();

  std::vector<double> per_iter;
  for (size_t i = 0; i < start.size(); ++i) per_iter.push_back(start[i].elapsed_ms(stop[i]));
  const double n = static_cast<double>(a.iters);
  r.ms_per_iter = start.front().elapsed_ms(stop.back()) / n;
  r.median_ms = median(per_iter);
  r.wall_ms_per_iter = std::chrono::duration<double, std::milli>(t1 - t0).count() / n;
  r.img_per_s = 1e3 * static_cast<double>(batch) / r.ms_per_iter;
  r.peak_mib = static_cast<double>(cuda::max_memory_allocated(a.device)) / (1024.0 * 1024.0);
  if (train) r.last_loss = loss.item<double>();
  return r;
}

// `running`: the configuration about to start ("batch 256 train"), written before it starts, so
// that a report left by a crash or a time-out names the configuration that never finished.
void write_json(const Args& a, const std::string& device, const std::string& skipped,
                const std::vector<Result>& results, const std::string& running = "") {
  nlohmann::json rows = nlohmann::json::array();
  for (const Result& r : results) {
    nlohmann::json row = {{"batch", r.batch}, {"mode", r.mode}};
    if (!r.error.empty()) {
      row["error"] = r.error;
    } else {
      row.update({{"ms_per_iter", r.ms_per_iter},
                  {"median_ms", r.median_ms},
                  {"wall_ms_per_iter", r.wall_ms_per_iter},
                  {"img_per_s", r.img_per_s},
                  {"peak_mib", r.peak_mib}});
      if (r.mode == "train") row["last_loss"] = r.last_loss;  // a diverged loss: null + warning
    }
    rows.push_back(row);
  }
  nlohmann::json report = {{"benchmark", "resnet50_synthetic"},
                           {"framework", std::string("dltrain ") + kVersion},
                           {"arch", "resnet" + std::to_string(a.depth)},
                           {"device", device},
                           {"image_size", a.size},
                           {"warmup", a.warmup},
                           {"iters", a.iters},
                           {"tf32", a.tf32},
                           {"cudnn_benchmark", a.cudnn_benchmark},
                           {"channels_last", a.prec.channels_last},
                           {"precision", a.prec.precision(Device::cuda(a.device))}};
  if (!skipped.empty()) report["skipped"] = skipped;
  if (!running.empty()) report["running"] = running;
  report["results"] = rows;
  // Written beside and renamed over the old file, so a reader (or a kill mid-write) never sees
  // half a report.
  const std::string tmp = a.json + ".tmp";
  cli::write_json_report(tmp, report);
  if (std::rename(tmp.c_str(), a.json.c_str()) != 0) cli::write_json_report(a.json, report);
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    int count = cuda::device_count();
    if (count == 0) {
      std::printf("resnet50_synthetic: skipped: no CUDA device\n");
      if (!a.json.empty()) write_json(a, "", "no CUDA device", {});
      return 0;
    }
    if (a.device >= count)
      usage_error("--device " + std::to_string(a.device) + " but only " + std::to_string(count) +
                  " CUDA device(s) are visible");
    cuda::set_device(a.device);
    cuda::set_allow_tf32(a.tf32);
    cuda::set_cudnn_benchmark(a.cudnn_benchmark);
    const std::string name = device_name(a.device);
    std::printf(
        "resnet%lld synthetic, %s (cuda:%d), %lldx%lld, %s, tf32 %s, cudnn benchmark %s, "
        "%lld warm-up + %lld timed iterations\n",
        static_cast<long long>(a.depth), name.c_str(), a.device, static_cast<long long>(a.size),
        static_cast<long long>(a.size), a.prec.describe(Device::cuda(a.device)).c_str(),
        a.tf32 ? "on" : "off", a.cudnn_benchmark ? "on" : "off", static_cast<long long>(a.warmup),
        static_cast<long long>(a.iters));

    // The data, made once on the host (seed 0) and copied to the device; smaller batches are
    // leading slices of it.
    const int64_t max_batch = *std::max_element(a.batch_sizes.begin(), a.batch_sizes.end());
    const MemoryFormat fmt = a.prec.format();
    manual_seed(0);
    Tensor images = randn({max_batch, 3, a.size, a.size}).to(Device::cuda(a.device));
    images = images.contiguous(fmt);
    Tensor labels = randint(0, 1000, {max_batch}).to(Device::cuda(a.device));

    std::vector<Result> results;
    bool failed = false;
    for (int64_t batch : a.batch_sizes) {
      for (const auto& mode : a.modes) {
        Result r;
        if (!a.json.empty())
          write_json(a, name, "", results, "batch " + std::to_string(batch) + " " + mode);
        try {
          r = run_config(a, batch, mode, images, labels);
          std::printf(
              "  batch %4lld %-8s %9.2f ms/iter (median %.2f, wall %.2f) %9.1f img/s "
              "%9.0f MiB peak",
              static_cast<long long>(batch), mode.c_str(), r.ms_per_iter, r.median_ms,
              r.wall_ms_per_iter, r.img_per_s, r.peak_mib);
          if (mode == "train") std::printf("  loss %.4f", r.last_loss);
          std::printf("\n");
        } catch (const std::exception& e) {
          r.batch = batch;
          r.mode = mode;
          r.error = e.what();
          failed = true;
          std::printf("  batch %4lld %-8s FAILED: %s\n", static_cast<long long>(batch),
                      mode.c_str(), e.what());
        }
        results.push_back(r);
        if (!a.json.empty()) write_json(a, name, "", results);
      }
    }

    std::printf("\n%6s  %-8s %10s %10s %10s %10s\n", "batch", "mode", "ms/iter", "median", "img/s",
                "peak MiB");
    for (const Result& r : results) {
      if (!r.error.empty()) {
        std::printf("%6lld  %-8s %10s\n", static_cast<long long>(r.batch), r.mode.c_str(),
                    "failed");
        continue;
      }
      std::printf("%6lld  %-8s %10.2f %10.2f %10.1f %10.0f\n", static_cast<long long>(r.batch),
                  r.mode.c_str(), r.ms_per_iter, r.median_ms, r.img_per_s, r.peak_mib);
    }
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet50_synthetic: error: %s\n", e.what());
    return 1;
  }
}
