// All-reduce bandwidth of the default process group per message size, with the nccl-tests
// definitions: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n (the bandwidth each
// link must sustain in a ring, comparable across rank counts). Launch it as the training
// would be launched:
//
//   mpirun -np 2 build/benchmarks/allreduce [--device cpu|cuda] [--min-bytes 4096]
//          [--max-bytes 67108864] [--iters 20] [--warmup 5] [--dtype f32] [--json PATH]
//
// CPU tensors go through the MPI group; --device cuda uses NCCL (one GPU per rank; a world of
// one still runs the NCCL path). Rank 0 prints the table and writes the JSON.
#include <algorithm>
#include <cstdio>

#include "apps/common/example_util.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/train/chronometer.hpp"

using namespace dltrain;
using namespace dltrain::apps;

int main(int argc, char** argv) {
  std::string dev = "cpu", json, dtype = "f32";
  int64_t min_bytes = 4096, max_bytes = 64 << 20, iters = 20, warmup = 5;
  cli::Flags f("allreduce",
               "All-reduce bandwidth (nccl-tests' algbw and busbw) of the default process group "
               "per message size; run it under mpirun or srun.");
  f.group(cli::group::kBenchmark);
  f.add("--device", &dev, "cpu (MPI) or cuda (NCCL)").choices({"cpu", "cuda"});
  f.add("--min-bytes", &min_bytes, "smallest message (x4 up to --max-bytes)").positive();
  f.add("--max-bytes", &max_bytes, "largest message").positive();
  f.add("--iters", &iters, "timed iterations per size").positive();
  f.add("--warmup", &warmup, "untimed iterations first").min(0);
  f.add("--dtype", &dtype, "element type").choices({"f32", "f16", "bf16", "f64"});
  f.add("--json", &json, "write the table here").value_name("FILE.json");
  f.parse(argc, argv);
  if (dev == "cuda" && !cuda::is_available())
    f.fail("--device cuda: no CUDA device is visible; pass --device cpu");
  try {
    const DType dt = dtype == "f16"    ? DType::f16
                     : dtype == "bf16" ? DType::bf16
                     : dtype == "f64"  ? DType::f64
                                       : DType::f32;
    // On GPUs always NCCL, even in a world of one (its own path, measured on one GPU too).
    distributed::ProcessGroup& g = distributed::init(
        {.backend = dev == "cpu" ? distributed::Backend::Auto : distributed::Backend::NCCL,
         .use_gpu = dev != "cpu"});
    const Device d = dev == "cpu" ? Device::cpu() : distributed::device();
    DLTRAIN_CHECK(dev == "cpu" || d.is_cuda(), "--device cuda: no GPU visible");
    const int n = g.size();
    struct Row {
      int64_t bytes;
      double us, algbw, busbw;
    };
    std::vector<Row> rows;
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      const int64_t count = bytes / static_cast<int64_t>(dtype_size(dt));
      Tensor t = ones({count}, TensorOptions(dt).with_device(d));
      std::vector<double> times;
      for (int64_t i = 0; i < warmup + iters; ++i) {
        g.barrier().wait();
        if (d.is_cuda()) cuda::synchronize();
        auto t0 = Clock::now();
        g.all_reduce(t, distributed::ReduceOp::Sum).wait();
        if (d.is_cuda()) cuda::synchronize();
        const double s = seconds(t0, Clock::now());
        if (i >= warmup) times.push_back(s);
      }
      // The slowest rank defines the collective's time.
      const double med = distributed::all_reduce_value(train::compute_stats(times).median,
                                                       distributed::ReduceOp::Max);
      const double alg = static_cast<double>(bytes) / med / 1e9;
      rows.push_back({bytes, med * 1e6, alg, alg * 2.0 * (n - 1) / std::max(n, 1)});
    }
    if (distributed::is_main_process()) {
      std::printf("all_reduce(sum), %s %s, %d ranks, backend %s, median of %lld\n", dtype_name(dt),
                  d.str().c_str(), n, g.backend(), static_cast<long long>(iters));
      std::printf("%12s %12s %12s %12s\n", "bytes", "time (us)", "algbw GB/s", "busbw GB/s");
      for (const Row& r : rows)
        std::printf("%12lld %12.1f %12.3f %12.3f\n", static_cast<long long>(r.bytes), r.us, r.algbw,
                    r.busbw);
      if (!json.empty()) {
        nlohmann::json out = nlohmann::json::array();
        for (const Row& r : rows)
          out.push_back({{"bytes", r.bytes},
                         {"time_us", r.us},
                         {"algbw_gbs", r.algbw},
                         {"busbw_gbs", r.busbw}});
        cli::write_json_report(json, {{"benchmark", "allreduce"},
                                      {"backend", g.backend()},
                                      {"device", d.str()},
                                      {"ranks", n},
                                      {"dtype", dtype_name(dt)},
                                      {"rows", out}});
        std::printf("wrote %s\n", json.c_str());
      }
    }
  } catch (const std::exception& e) {
    distributed::abort(std::string("allreduce: ") + e.what());
  }
  return 0;
}
