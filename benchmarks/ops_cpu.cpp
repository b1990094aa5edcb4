// CPU op benchmark: conv2d forward + backward (grad input and grad weight) on
// the distinct ResNet-50 conv layer shapes (batch 8, 224x224 input, f32 NCHW)
// and one large square f32 GEMM. Prints a table (layer, shape, ms, GFLOP/s)
// and optionally writes JSON with the schema shared with
// benchmarks/peers/pytorch_ops_cpu.py, which compares the two.
//
// Usage: ops_cpu [--threads N] [--iters N] [--shapes full|quick] [--batch N] [--json PATH]
// Times are medians over --iters runs after one warm-up run. FLOPs count
// 2*MACs; backward is counted as twice the forward (grad input + grad weight).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;

namespace {

struct ConvCase {
  std::string name;
  int64_t cin, cout, k, stride, pad, hw;  // hw: input height = width
};

// Distinct conv shapes of torchvision's ResNet-50 (stride on the 3x3 of each stage's first block).
std::vector<ConvCase> resnet50_convs(bool quick) {
  std::vector<ConvCase> all = {
      {"stem 7x7/2", 3, 64, 7, 2, 3, 224},
      {"l1 1x1 64-64", 64, 64, 1, 1, 0, 56},
      {"l1 3x3 64-64", 64, 64, 3, 1, 1, 56},
      {"l1 1x1 64-256", 64, 256, 1, 1, 0, 56},
      {"l1 1x1 256-64", 256, 64, 1, 1, 0, 56},
      {"l2 1x1 256-128", 256, 128, 1, 1, 0, 56},
      {"l2 3x3/2 128-128", 128, 128, 3, 2, 1, 56},
      {"l2 1x1 128-512", 128, 512, 1, 1, 0, 28},
      {"l2 ds 1x1/2 256-512", 256, 512, 1, 2, 0, 56},
      {"l2 1x1 512-128", 512, 128, 1, 1, 0, 28},
      {"l2 3x3 128-128", 128, 128, 3, 1, 1, 28},
      {"l3 1x1 512-256", 512, 256, 1, 1, 0, 28},
      {"l3 3x3/2 256-256", 256, 256, 3, 2, 1, 28},
      {"l3 1x1 256-1024", 256, 1024, 1, 1, 0, 14},
      {"l3 ds 1x1/2 512-1024", 512, 1024, 1, 2, 0, 28},
      {"l3 1x1 1024-256", 1024, 256, 1, 1, 0, 14},
      {"l3 3x3 256-256", 256, 256, 3, 1, 1, 14},
      {"l4 1x1 1024-512", 1024, 512, 1, 1, 0, 14},
      {"l4 3x3/2 512-512", 512, 512, 3, 2, 1, 14},
      {"l4 1x1 512-2048", 512, 2048, 1, 1, 0, 7},
      {"l4 ds 1x1/2 1024-2048", 1024, 2048, 1, 2, 0, 14},
      {"l4 1x1 2048-512", 2048, 512, 1, 1, 0, 7},
      {"l4 3x3 512-512", 512, 512, 3, 1, 1, 7},
  };
  if (!quick) return all;
  std::vector<ConvCase> q;
  for (const auto& c : all)
    if (c.name == "stem 7x7/2" || c.name == "l1 3x3 64-64" || c.name == "l2 ds 1x1/2 256-512" ||
        c.name == "l3 1x1 1024-256" || c.name == "l4 3x3 512-512")
      q.push_back(c);
  return q;
}

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Row {
  std::string name, shape;
  double fwd_ms, bwd_ms, ms, gflops;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = get_num_threads(), iters = 5;
  int64_t batch = 8, gemm_n = 2048;
  bool quick = false;
  std::string json;
  std::string shapes = "full";
  cli::Flags flags("ops_cpu",
                   "conv2d (ResNet-50 shapes) and GEMM timings on the CPU, forward and backward; "
                   "compare with benchmarks/peers/pytorch_ops_cpu.py.");
  flags.group(cli::group::kBenchmark);
  flags.add("--threads", &threads, "CPU threads").positive();
  flags.add("--iters", &iters, "timed iterations per case (the median is reported)").positive();
  flags.add("--shapes", &shapes, "all ResNet-50 convolutions or a few").choices({"full", "quick"});
  flags.add("--batch", &batch, "images per convolution").positive();
  flags.add("--gemm", &gemm_n, "size N of the N x N GEMM").positive();
  flags.add("--json", &json, "write the figures here").value_name("FILE.json");
  flags.parse(argc, argv);
  quick = shapes == "quick";
  set_num_threads(threads);

  std::vector<Row> rows;
  Generator gen(0);
  for (const ConvCase& c : resnet50_convs(quick)) {
    Tensor x = randn({batch, c.cin, c.hw, c.hw}, DType::f32, &gen);
    Tensor w = mul(randn({c.cout, c.cin, c.k, c.k}, DType::f32, &gen), 0.05);
    x.requires_grad_();
    w.requires_grad_();
    const int64_t ho = conv_output_size(c.hw, c.k, c.stride, c.pad, 1);
    Tensor gy = randn({batch, c.cout, ho, ho}, DType::f32, &gen);
    std::vector<double> tf, tb;
    for (int it = 0; it <= iters; ++it) {
      x.set_grad(Tensor());
      w.set_grad(Tensor());
      const double t0 = now_ms();
      Tensor y = conv2d(x, w, Tensor(), c.stride, c.pad);
      const double t1 = now_ms();
      y.backward(gy);
      const double t2 = now_ms();
      if (it > 0) {
        tf.push_back(t1 - t0);
        tb.push_back(t2 - t1);
      }
    }
    const double flops = 3.0 * 2.0 * batch * c.cout * ho * ho * c.cin * c.k * c.k;
    const double f = median(tf), b = median(tb);
    char shape[128];
    std::snprintf(shape, sizeof shape, "%ldx%ldx%ldx%ld k%ld s%ld -> %ld", static_cast<long>(batch),
                  static_cast<long>(c.cin), static_cast<long>(c.hw), static_cast<long>(c.hw),
                  static_cast<long>(c.k), static_cast<long>(c.stride), static_cast<long>(c.cout));
    rows.push_back({c.name, shape, f, b, f + b, flops / ((f + b) * 1e6)});
  }
  {
    Tensor a = randn({gemm_n, gemm_n}, DType::f32, &gen),
           b = randn({gemm_n, gemm_n}, DType::f32, &gen);
    std::vector<double> t;
    for (int it = 0; it <= iters; ++it) {
      const double t0 = now_ms();
      Tensor c = mm(a, b);
      const double t1 = now_ms();
      if (it > 0) t.push_back(t1 - t0);
    }
    const double ms = median(t);
    const std::string n = std::to_string(gemm_n);
    rows.push_back({"gemm " + n, n + "x" + n + "x" + n, ms, 0.0, ms,
                    2.0 * gemm_n * gemm_n * gemm_n / (ms * 1e6)});
  }

  std::printf("dltrain ops_cpu: %d threads, %d iters (median), batch %ld\n", threads, iters,
              static_cast<long>(batch));
  std::printf("%-22s %-26s %9s %9s %9s %9s\n", "layer", "shape", "fwd ms", "bwd ms", "ms",
              "GFLOP/s");
  double total = 0;
  for (const Row& r : rows) {
    std::printf("%-22s %-26s %9.2f %9.2f %9.2f %9.1f\n", r.name.c_str(), r.shape.c_str(), r.fwd_ms,
                r.bwd_ms, r.ms, r.gflops);
    if (r.name.rfind("gemm", 0) != 0) total += r.ms;
  }
  std::printf("%-22s %-26s %9s %9s %9.2f\n", "conv total", "", "", "", total);

  if (!json.empty()) {
    nlohmann::json out = nlohmann::json::array();
    for (const Row& r : rows)
      out.push_back({{"name", r.name},
                     {"shape", r.shape},
                     {"fwd_ms", r.fwd_ms},
                     {"bwd_ms", r.bwd_ms},
                     {"ms", r.ms},
                     {"gflops", r.gflops}});
    cli::write_json_report(json, {{"impl", "dltrain"},
                                  {"threads", threads},
                                  {"iters", iters},
                                  {"batch", batch},
                                  {"rows", out}});
  }
  return 0;
}
