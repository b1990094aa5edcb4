// CPU inference latency of a torchvision ResNet in eval mode (no gradients), per batch size:
// the deployment side of issue 32. With --export-onnx it also writes the same model (its
// weights as initialised, BatchNorm running statistics included) as ONNX with a dynamic batch,
// so that benchmarks/peers/inference_cpu.py times ONNX Runtime on exactly that graph and
// PyTorch on torchvision's model of the same architecture.
//
//   inference_cpu [--arch resnet50] [--batches 1,8] [--size 224] [--iters 20] [--threads 2]
//                 [--channels-last] [--fuse-conv-bn] [--json PATH] [--export-onnx PATH]
//
// Times are medians of --iters forwards after 3 warm-up forwards, per batch size. With
// --fuse-conv-bn a second copy of the model (the same weights) has its BatchNorms folded into
// the convolutions (nn::fuse_conv_bn), and the two are timed alternately, forward by forward.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/nn/fuse.hpp"

using namespace dltrain;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  std::string arch = "resnet50", json, onnx_path;
  std::vector<int64_t> batches = {1, 8};
  int64_t size = 224, iters = 20;
  int threads = 2;
  bool channels_last = false, fuse = false;
  cli::Flags flags("inference_cpu",
                   "ResNet eval-mode forward latency on the CPU (median ms per batch); compare "
                   "with benchmarks/peers/inference_cpu.py (ONNX Runtime and PyTorch).");
  flags.group(cli::group::kBenchmark);
  flags.add("--arch", &arch, "torchvision ResNet name");
  flags.add("--batches", &batches, "batch sizes to time");
  flags.add("--size", &size, "image size").positive();
  flags.add("--iters", &iters, "timed forwards per batch size").positive();
  flags.group(cli::group::kDevice);
  flags.add("--threads", &threads, "CPU threads (0: DLTRAIN_NUM_THREADS or all cores)").min(0);
  flags.add_switch("--channels-last", &channels_last, "channels-last (NHWC) memory format");
  flags.add_switch("--fuse-conv-bn", &fuse,
                   "also time the model with BatchNorm folded into the convolutions "
                   "(nn::fuse_conv_bn), alternately with the unfused one");
  flags.group(cli::group::kCheckpoint);
  flags.add("--json", &json, "write the figures here").value_name("FILE.json");
  flags.add("--export-onnx", &onnx_path, "also write the model as ONNX (dynamic batch)")
      .value_name("FILE.onnx");
  flags.parse(argc, argv);
  for (int64_t b : batches)
    if (b < 1)
      flags.fail("--batches: every batch size must be >= 1 (got " + std::to_string(b) + ")");
  try {
    if (threads > 0) set_num_threads(threads);
    manual_seed(0);
    auto model = models::resnet(arch);
    model->eval();
    if (!onnx_path.empty()) {
      io::export_onnx(*model, {randn({1, 3, size, size})}, onnx_path, {.dynamic_batch = true});
      std::printf("wrote %s\n", onnx_path.c_str());
    }
    const MemoryFormat fmt = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
    model->to(fmt);
    std::shared_ptr<nn::Module> fused;
    if (fuse) {  // the same weights (same seed), BatchNorm folded
      manual_seed(0);
      fused = models::resnet(arch);
      fused->to(fmt);
      const nn::FuseReport r = nn::fuse_conv_bn(*fused, randn({1, 3, size, size}).contiguous(fmt));
      std::printf(
          "fused: %zu convolution + BatchNorm pairs folded (output moved by %.2g of its "
          "range)\n",
          r.pairs.size(), r.max_change);
    }
    std::printf("%s inference, %lldx%lld, %s, f32, %d threads, median of %lld\n", arch.c_str(),
                static_cast<long long>(size), static_cast<long long>(size),
                channels_last ? "channels-last" : "NCHW", get_num_threads(),
                static_cast<long long>(iters));
    nlohmann::json cases = nlohmann::json::object(), fused_cases = nlohmann::json::object();
    const NoGradGuard no_grad;
    auto time_forward = [](nn::Module& m, const Tensor& x) {
      const auto t0 = Clock::now();
      const Tensor y = m.forward(x);
      (void)y.data_ptr();  // the result exists (the CPU backend is synchronous)
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };
    for (int64_t b : batches) {
      const Tensor x = randn({b, 3, size, size}).contiguous(fmt);
      std::vector<double> t, tf;
      for (int64_t it = 0; it < 3 + iters; ++it) {
        const double a = time_forward(*model, x);
        const double f = fused ? time_forward(*fused, x) : 0.0;
        if (it >= 3) {
          t.push_back(a);
          tf.push_back(f);
        }
      }
      const double m = train::compute_stats(t).median;
      const std::string name = arch + " b" + std::to_string(b);
      std::printf("  %-16s %10.2f ms  %8.1f img/s", name.c_str(), m,
                  1e3 * static_cast<double>(b) / m);
      cases[name] = m;
      if (fused) {
        const double mf = train::compute_stats(tf).median;
        std::printf("   fused %10.2f ms  %8.1f img/s  (%.3fx)", mf,
                    1e3 * static_cast<double>(b) / mf, mf / m);
        fused_cases[name] = mf;
      }
      std::printf("\n");
    }
    if (!json.empty())
      cli::write_json_report(json, {{"framework", "dltrain"},
                                    {"threads", get_num_threads()},
                                    {"channels_last", channels_last},
                                    {"size", size},
                                    {"cases", cases},
                                    {"fused_cases", fused_cases}});
  } catch (const Error& e) {
    std::fprintf(stderr, "inference_cpu: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
