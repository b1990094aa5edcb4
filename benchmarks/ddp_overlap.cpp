// How much of DDP's gradient communication is hidden behind backward. On each rank it times
// loss.backward() of a ResNet (median over --iters) in three configurations:
//   alone      the bare model, no communication
//   overlap    DistributedDataParallel (buckets launched from gradient hooks during backward)
//   after      DistributedDataParallel with overlap = false (every bucket after backward)
// communication = after - alone; exposed = overlap - alone; hidden = 1 - exposed / communication.
//
//   mpirun -np 2 build/benchmarks/ddp_overlap [--arch resnet18] [--size 64] [--batch 16]
//          [--iters 10] [--warmup 3] [--device cpu|cuda] [--channels-last] [--json PATH]
//
// Defaults are for CPU ranks (ResNet-18 at 64x64); on GPUs use --arch resnet50 --size 224.
// --compression bf16|f16 also times DDP with that gradient_compression (both configurations)
// and reports the bytes each rank all-reduces per step and the communication time, f32 beside
// the compressed one.
#include <cstdio>
#include <optional>

#include "apps/common/example_util.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/train/chronometer.hpp"

using namespace dltrain;
using namespace dltrain::apps;

int main(int argc, char** argv) {
  std::string arch = "resnet18", dev = "cpu", json, compression = "none";
  int64_t size = 64, batch = 16, iters = 10, warmup = 3;
  double bucket_mb = 25.0;
  bool channels_last = false, no_rebuild = false;
  cli::Flags f("ddp_overlap",
               "How much of DDP's gradient communication is hidden behind backward (a ResNet's "
               "backward alone, with overlapped DDP, with DDP after backward); run it under "
               "mpirun or srun.");
  f.group(cli::group::kBenchmark);
  f.add("--arch", &arch, "torchvision ResNet name");
  f.add("--size", &size, "image size").positive();
  f.add("--batch", &batch, "images per rank").positive();
  f.add("--iters", &iters, "timed iterations").positive();
  f.add("--warmup", &warmup, "untimed iterations first").min(0);
  f.add("--bucket-mb", &bucket_mb, "DDP bucket size in MiB").positive();
  f.add("--compression", &compression, "also time DDP with this gradient compression")
      .choices({"none", "bf16", "f16"});
  f.add_switch("--no-rebuild-buckets", &no_rebuild,
               "keep the reverse-registration bucket layout after the first backward "
               "(DDPOptions::rebuild_buckets = false)");
  f.group(cli::group::kDevice);
  f.add("--device", &dev, "cpu (MPI) or cuda (NCCL)").choices({"cpu", "cuda"});
  f.add_switch("--channels-last", &channels_last, "channels-last (NHWC) memory format");
  f.group(cli::group::kCheckpoint);
  f.add("--json", &json, "write the figures here").value_name("FILE.json");
  f.parse(argc, argv);
  if (dev == "cuda" && !cuda::is_available())
    f.fail("--device cuda: no CUDA device is visible; pass --device cpu");
  try {
    const std::optional<DType> wire = compression == "bf16"  ? std::optional<DType>(DType::bf16)
                                      : compression == "f16" ? std::optional<DType>(DType::f16)
                                                             : std::nullopt;
    distributed::ProcessGroup& g = distributed::init(
        {.backend = dev == "cpu" ? distributed::Backend::Auto : distributed::Backend::NCCL,
         .use_gpu = dev != "cpu"});
    const Device d = dev == "cpu" ? Device::cpu() : distributed::device();
    DLTRAIN_CHECK(dev == "cpu" || d.is_cuda(), "--device cuda: no GPU visible");
    manual_seed(0);
    auto model = models::resnet(arch, {.num_classes = 1000});
    model->to(d);
    if (channels_last) model->to(MemoryFormat::ChannelsLast);
    Generator gen(1 + static_cast<uint64_t>(g.rank()));
    Tensor x = randn({batch, 3, size, size}, {}, &gen).to(d);
    if (channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
    Tensor y = randint(0, 1000, {batch}, DType::i64, &gen).to(d);
    auto sync = [&] {
      if (d.is_cuda()) cuda::synchronize();
    };

    // Median backward time of `forward`'s loss; the slowest rank's median.
    // `timed` runs after each timed backward.
    auto time_backward = [&](const std::function<Tensor(const Tensor&)>& forward,
                             const std::function<void()>& timed = nullptr) {
      std::vector<double> t;
      for (int64_t i = 0; i < warmup + iters; ++i) {
        model->zero_grad();
        Tensor loss = cross_entropy(forward(x), y);
        sync();
        g.barrier().wait();
        auto t0 = Clock::now();
        loss.backward();
        sync();
        if (i >= warmup) {
          t.push_back(seconds(t0, Clock::now()));
          if (timed) timed();
        }
      }
      return distributed::all_reduce_value(train::compute_stats(t).median,
                                           distributed::ReduceOp::Max);
    };
    const double alone = time_backward([&](const Tensor& in) { return model->forward(in); });
    // DDP overlapped and with communication after backward, reducing in `w` (or the
    // gradients' own dtype).
    struct Run {
      double overlap = 0, after = 0, wait_overlap = 0, wire_bytes = 0;
      size_t buckets = 0;
      // Without overlap (no communication during backward): when backward completed each
      // bucket, ms after its first gradient hook (median over the timed steps), its MiB, and
      // the backward's end on the same clock.
      std::vector<double> ready_ms, bucket_mib;
      double backward_ms = 0;
      double comm(double base) const { return after - base; }
      double hidden(double base) const {
        const double c = after - base, exposed = overlap - base;
        return c > 0 ? 1.0 - std::max(0.0, exposed) / c : 1.0;
      }
    };
    auto measure = [&](std::optional<DType> w) {
      Run run;
      {
        distributed::DistributedDataParallel ddp(model, {.bucket_cap_mb = bucket_mb,
                                                         .gradient_compression = w,
                                                         .rebuild_buckets = !no_rebuild});
        for (const auto& b : ddp.buckets())
          run.wire_bytes += static_cast<double>(b.numel) * dtype_size(b.wire_dtype);
        run.overlap = time_backward([&](const Tensor& in) { return ddp(in); });
        run.buckets = ddp.buckets().size();  // the layout the timed steps used
        run.wait_overlap = ddp.last_wait_seconds();
      }
      {
        distributed::DistributedDataParallel ddp(model, {.bucket_cap_mb = bucket_mb,
                                                         .overlap = false,
                                                         .gradient_compression = w,
                                                         .rebuild_buckets = !no_rebuild});
        std::vector<std::vector<double>> ready;
        std::vector<double> ends;
        run.after = time_backward([&](const Tensor& in) { return ddp(in); },
                                  [&] {
                                    const auto r = ddp.last_round_timing();
                                    ready.resize(r.bucket_ready_seconds.size());
                                    for (size_t b = 0; b < ready.size(); ++b)
                                      ready[b].push_back(r.bucket_ready_seconds[b] * 1e3);
                                    ends.push_back(r.backward_seconds * 1e3);
                                  });
        for (auto& v : ready) run.ready_ms.push_back(train::compute_stats(v).median);
        run.backward_ms = train::compute_stats(ends).median;
        for (const auto& b : ddp.buckets())
          run.bucket_mib.push_back(static_cast<double>(b.numel) * dtype_size(b.dtype) / (1 << 20));
      }
      return run;
    };
    const Run full = measure(std::nullopt);
    const Run compressed = wire ? measure(wire) : Run{};
    const Run* comp = wire ? &compressed : nullptr;
    const double overlap = full.overlap, after = full.after, wait_overlap = full.wait_overlap;
    const size_t buckets = full.buckets;
    const double comm = full.comm(alone), exposed = overlap - alone;
    const double hidden = full.hidden(alone);
    const double grad_mb = static_cast<double>(model->num_parameters(true)) * 4.0 / (1 << 20);
    if (distributed::is_main_process()) {
      std::printf(
          "%s %lldx%lld, batch %lld per rank, %d ranks (%s on %s), %d threads per rank, "
          "%.1f MiB of gradients in %zu buckets\n",
          arch.c_str(), static_cast<long long>(size), static_cast<long long>(size),
          static_cast<long long>(batch), g.size(), g.backend(), d.str().c_str(), get_num_threads(),
          grad_mb, buckets);
      std::printf("%-36s %10s\n", "backward (median of ranks' worst)", "ms");
      std::printf("%-36s %10.1f\n", "alone (no communication)", alone * 1e3);
      std::printf("%-36s %10.1f\n", "DDP, overlapped", overlap * 1e3);
      std::printf("%-36s %10.1f\n", "DDP, communication after backward", after * 1e3);
      if (comp) {
        std::printf("%-36s %10.1f\n", ("DDP " + compression + ", overlapped").c_str(),
                    comp->overlap * 1e3);
        std::printf("%-36s %10.1f\n", ("DDP " + compression + ", after backward").c_str(),
                    comp->after * 1e3);
      }
      if (g.size() == 1)
        std::printf(
            "a world of one: nothing is communicated, so nothing to hide (run it under "
            "mpirun or srun for the overlap figures; the bucket times below hold)\n");
      else
        std::printf("communication %.1f ms, exposed %.1f ms (last wait %.1f ms): %.0f%% hidden\n",
                    comm * 1e3, exposed * 1e3, wait_overlap * 1e3, 100 * hidden);
      std::printf(
          "buckets completed by backward (no communication running; ms after the first "
          "gradient, backward ends at %.1f ms):\n",
          full.backward_ms);
      std::printf("%8s %10s %12s %14s\n", "bucket", "MiB", "ready ms", "% of backward");
      for (size_t b = 0; b < full.ready_ms.size() && b < full.bucket_mib.size(); ++b)
        std::printf("%8zu %10.2f %12.1f %14.1f\n", b, full.bucket_mib[b], full.ready_ms[b],
                    100 * full.ready_ms[b] / full.backward_ms);
      if (comp)
        std::printf(
            "%s all-reduce: %.1f MiB per step instead of %.1f MiB (%.1f MiB saved); "
            "communication %.1f ms instead of %.1f ms (%.1f ms saved), %.0f%% hidden\n",
            compression.c_str(), comp->wire_bytes / (1 << 20), full.wire_bytes / (1 << 20),
            (full.wire_bytes - comp->wire_bytes) / (1 << 20), comp->comm(alone) * 1e3, comm * 1e3,
            (comm - comp->comm(alone)) * 1e3, 100 * comp->hidden(alone));
      if (!json.empty()) {
        nlohmann::json report = {
            {"benchmark", "ddp_overlap"},
            {"arch", arch},
            {"size", size},
            {"batch_per_rank", batch},
            {"ranks", g.size()},
            {"backend", g.backend()},
            {"device", d.str()},
            {"threads_per_rank", get_num_threads()},
            {"gradient_mib", grad_mb},
            {"buckets", buckets},
            {"backward_ms",
             {{"alone", alone * 1e3}, {"ddp_overlap", overlap * 1e3}, {"ddp_after", after * 1e3}}},
            {"hidden_fraction", g.size() > 1 ? nlohmann::json(hidden) : nlohmann::json()},
            {"bucket_mib", full.bucket_mib},
            {"bucket_ready_ms", full.ready_ms},
            {"backward_from_first_gradient_ms", full.backward_ms},
            {"allreduce_bytes", full.wire_bytes}};
        if (comp)
          report["compression"] = {
              {"dtype", compression},
              {"allreduce_bytes", comp->wire_bytes},
              {"backward_ms",
               {{"ddp_overlap", comp->overlap * 1e3}, {"ddp_after", comp->after * 1e3}}},
              {"communication_ms", comp->comm(alone) * 1e3},
              {"hidden_fraction", comp->hidden(alone)}};
        cli::write_json_report(json, report);
        std::printf("wrote %s\n", json.c_str());
      }
    }
  } catch (const std::exception& e) {
    distributed::abort(std::string("ddp_overlap: ") + e.what());
  }
  return 0;
}
