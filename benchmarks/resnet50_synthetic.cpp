// ResNet-50 on one GPU with synthetic data, the classic convnet-benchmarks protocol: random
// images [B, 3, 224, 224] (f32) and int64 labels made once and kept on the device, so only the
// model is timed. For each batch size and mode ("forward": train-mode forward under
// NoGradGuard; "train": forward + cross-entropy + backward + SGD step, zero_grad every step)
// a fresh model (seed 0) runs --warmup untimed then --iters timed iterations; each iteration
// sits between two CUDA events on the current stream, read after one synchronize. The table
// gives the mean (first start to last end, over iters) and the median of the per-iteration
// times, img/s from the mean, and the peak of live device memory (reset before the warm-up).
// Writes JSON with --json; benchmarks/peers/pytorch_resnet50.py runs the same protocol in
// PyTorch and compares (--compare).
//
//   resnet50_synthetic [--batch-sizes 64,128,256] [--modes forward,train] [--warmup 10]
//                      [--iters 50] [--depth 50] [--size 224] [--device 0] [--no-tf32]
//                      [--cudnn-benchmark | --no-cudnn-benchmark] [--channels-last]
//                      [--json PATH]
//
// Without a visible CUDA device it prints "skipped: no CUDA device" and exits 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"

using namespace dltrain;

namespace {

struct Args {
  std::vector<int64_t> batch_sizes{64, 128, 256};
  std::vector<std::string> modes{"forward", "train"};
  int64_t warmup = 10, iters = 50, depth = 50, size = 224;
  int device = 0;
  bool tf32 = true, cudnn_benchmark = true, channels_last = false;
  std::string json;
};

struct Result {
  int64_t batch = 0;
  std::string mode;
  double ms_per_iter = 0, median_ms = 0, wall_ms_per_iter = 0, img_per_s = 0, peak_mib = 0;
  double last_loss = NAN;  // after the last timed step (train mode)
  std::string error;       // non-empty when the configuration failed
};

constexpr const char* kUsage =
    "usage: resnet50_synthetic [--batch-sizes 64,128,256] [--modes forward,train] [--warmup N]\n"
    "                          [--iters N] [--depth 18|34|50|101|152] [--size 224] [--device N]\n"
    "                          [--no-tf32] [--cudnn-benchmark | --no-cudnn-benchmark]\n"
    "                          [--channels-last] [--json PATH]\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "resnet50_synthetic: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

int64_t parse_int(const std::string& flag, const std::string& s, int64_t min) {
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < min)
    usage_error(flag + " wants an integer >= " + std::to_string(min) + ", got '" + s + "'");
  return v;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage_error("missing value after " + k);
      return argv[++i];
    };
    if (k == "--batch-sizes") {
      a.batch_sizes.clear();
      for (const auto& b : split(next())) a.batch_sizes.push_back(parse_int(k, b, 1));
      if (a.batch_sizes.empty()) usage_error("--batch-sizes is empty");
    } else if (k == "--modes") {
      a.modes = split(next());
      for (const auto& m : a.modes)
        if (m != "forward" && m != "train") usage_error("unknown mode '" + m + "'");
      if (a.modes.empty()) usage_error("--modes is empty");
    } else if (k == "--warmup") {
      a.warmup = parse_int(k, next(), 0);
    } else if (k == "--iters") {
      a.iters = parse_int(k, next(), 1);
    } else if (k == "--depth") {
      a.depth = parse_int(k, next(), 1);
      if (a.depth != 18 && a.depth != 34 && a.depth != 50 && a.depth != 101 && a.depth != 152)
        usage_error("--depth wants 18, 34, 50, 101 or 152");
    } else if (k == "--size") {
      a.size = parse_int(k, next(), 32);
    } else if (k == "--device") {
      a.device = static_cast<int>(parse_int(k, next(), 0));
    } else if (k == "--no-tf32") {
      a.tf32 = false;
    } else if (k == "--cudnn-benchmark") {
      a.cudnn_benchmark = true;
    } else if (k == "--no-cudnn-benchmark") {
      a.cudnn_benchmark = false;
    } else if (k == "--channels-last") {
      a.channels_last = true;
    } else if (k == "--json") {
      a.json = next();
    } else if (k == "--help" || k == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      usage_error("unknown argument '" + k + "'");
    }
  }
  return a;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
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
  const MemoryFormat fmt = a.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  const bool train = mode == "train";

  cuda::synchronize(a.device);
  cuda::reset_peak_memory_stats(a.device);
  manual_seed(0);
  auto model = models::resnet("resnet" + std::to_string(a.depth));
  model->to(dev);
  model->to(fmt);
  model->train();
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  Tensor x = images.narrow(0, 0, batch);
  Tensor y = labels.narrow(0, 0, batch);
  Tensor loss;

  auto step = [&] {
    if (train) {
      opt.zero_grad();
      loss = cross_entropy(model->forward(x), y);
      loss.backward();
      opt.step();
    } else {
      NoGradGuard no_grad;
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

void write_json(const Args& a, const std::string& device, const std::string& skipped,
                const std::vector<Result>& results) {
  std::ofstream js(a.json);
  DLTRAIN_CHECK(js.good(), "resnet50_synthetic: cannot write --json file '", a.json, "'");
  js << "{\n  \"benchmark\": \"resnet50_synthetic\",\n  \"framework\": "
     << json_string(std::string("dltrain ") + kVersion) << ",\n  \"arch\": \"resnet" << a.depth
     << "\",\n  \"device\": " << json_string(device) << ",\n  \"image_size\": " << a.size
     << ",\n  \"warmup\": " << a.warmup << ",\n  \"iters\": " << a.iters
     << ",\n  \"tf32\": " << (a.tf32 ? "true" : "false")
     << ",\n  \"cudnn_benchmark\": " << (a.cudnn_benchmark ? "true" : "false")
     << ",\n  \"channels_last\": " << (a.channels_last ? "true" : "false");
  if (!skipped.empty()) js << ",\n  \"skipped\": " << json_string(skipped);
  js << ",\n  \"results\": [";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    js << (i ? ",\n" : "\n") << "    {\"batch\": " << r.batch << ", \"mode\": \"" << r.mode << "\"";
    if (!r.error.empty()) {
      js << ", \"error\": " << json_string(r.error) << "}";
      continue;
    }
    js << ", \"ms_per_iter\": " << r.ms_per_iter << ", \"median_ms\": " << r.median_ms
       << ", \"wall_ms_per_iter\": " << r.wall_ms_per_iter << ", \"img_per_s\": " << r.img_per_s
       << ", \"peak_mib\": " << r.peak_mib;
    if (r.mode == "train") {
      js << ", \"last_loss\": ";
      if (std::isfinite(r.last_loss))
        js << r.last_loss;
      else
        js << "null";  // JSON has no NaN; a diverged loss shows as null
    }
    js << "}";
  }
  js << (results.empty() ? "]\n}\n" : "\n  ]\n}\n");
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
        static_cast<long long>(a.size), a.channels_last ? "channels-last" : "NCHW",
        a.tf32 ? "on" : "off", a.cudnn_benchmark ? "on" : "off", static_cast<long long>(a.warmup),
        static_cast<long long>(a.iters));

    // The data, made once on the host (seed 0) and copied to the device; smaller batches are
    // leading slices of it.
    const int64_t max_batch = *std::max_element(a.batch_sizes.begin(), a.batch_sizes.end());
    const MemoryFormat fmt =
        a.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
    manual_seed(0);
    Tensor images = randn({max_batch, 3, a.size, a.size}).to(Device::cuda(a.device));
    images = images.contiguous(fmt);
    Tensor labels = randint(0, 1000, {max_batch}).to(Device::cuda(a.device));

    std::vector<Result> results;
    bool failed = false;
    for (int64_t batch : a.batch_sizes) {
      for (const auto& mode : a.modes) {
        Result r;
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
    if (!a.json.empty()) write_json(a, name, "", results);
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet50_synthetic: error: %s\n", e.what());
    return 1;
  }
}
