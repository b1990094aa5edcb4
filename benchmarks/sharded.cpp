// Sharded data parallelism on the CPU: DDP vs ZeRO-1 vs ZeRO-2 vs FSDP (vs FSDP with activation
// checkpointing), per rank: peak bytes over a training step, bytes held between steps, and the
// step time. Run under mpirun (2 ranks, issue 29):
//
//   mpirun -np 2 sharded [--arch resnet50] [--batch 4] [--size 224] [--rounds 3]
//                        [--modes ddp,zero1,zero2,fsdp,fsdp_ckpt] [--json PATH]
//
// Each mode builds the model afresh (same seed), runs one untimed step, then --rounds timed
// steps (forward, cross-entropy, backward, SGD-momentum step), modes one after the other. The
// peak is max_memory_allocated over a timed step plus, for FSDP, the peak of its gathered unit
// buffers (mapped outside the tensor allocator); "held" is what stays between steps (weights or
// shards, gradients, momentum: memory_allocated after the step, the batch excluded, plus FSDP's
// resident buffers, 0 between steps). FSDP's units are the four ResNet stages (fsdp) or the 16
// residual blocks with ResNet::checkpoint_segments = 4 (fsdp_ckpt); the stem and the classifier
// stay in the root unit. Rank 0 prints the table (the maximum over ranks) and writes the JSON.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/dltrain.hpp"

using namespace dltrain;
using Clock = std::chrono::steady_clock;

namespace {

struct Row {
  std::string mode;
  double peak_mib = 0, held_mib = 0, step_ms = 0;
};

Row run_mode(const std::string& mode, const std::string& arch, int64_t batch, int64_t size,
             int64_t rounds) {
  using namespace distributed;
  manual_seed(0);
  auto model = models::resnet(arch);
  const optim::SGDOptions sgd{.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4};
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<ZeroRedundancyOptimizer> zero;
  std::unique_ptr<FullyShardedDataParallel> fsdp;
  std::unique_ptr<optim::Optimizer> plain;
  optim::Optimizer* opt = nullptr;
  if (mode == "ddp") {
    ddp = std::make_unique<DistributedDataParallel>(model);
    plain = std::make_unique<optim::SGD>(model->parameters(), sgd);
    opt = plain.get();
  } else if (mode == "zero1" || mode == "zero2") {
    zero = std::make_unique<ZeroRedundancyOptimizer>(
        model->parameters(), [sgd](std::vector<optim::ParamGroup> groups) {
          return std::unique_ptr<optim::Optimizer>(new optim::SGD(std::move(groups), sgd));
        });
    DDPOptions o;
    if (mode == "zero2") o.shard_gradients = zero.get();
    ddp = std::make_unique<DistributedDataParallel>(model, o);
    opt = zero.get();
  } else if (mode == "fsdp" || mode == "fsdp_ckpt") {
    std::vector<std::string> units;
    if (mode == "fsdp") {
      units = {"layer1", "layer2", "layer3", "layer4"};
    } else {
      model->checkpoint_segments = 4;
      for (const char* l : {"layer1", "layer2", "layer3", "layer4"}) {
        auto layer = std::dynamic_pointer_cast<nn::Sequential>(model->child(l));
        for (int64_t i = 0; i < layer->size(); ++i)
          units.push_back(std::string(l) + "." + std::to_string(i));
      }
    }
    fsdp = std::make_unique<FullyShardedDataParallel>(model, FSDPOptions{.units = units});
    plain = std::make_unique<optim::SGD>(fsdp->parameters(), sgd);
    opt = plain.get();
  } else {
    throw Error("--modes: unknown mode '" + mode + "'; give ddp, zero1, zero2, fsdp or fsdp_ckpt");
  }
  Tensor x = randn({batch, 3, size, size});
  Tensor y = randint(0, 1000, {batch});
  const auto batch_bytes = static_cast<double>(x.numel() * 4 + y.numel() * 8);
  auto forward = [&](const Tensor& in) { return fsdp ? (*fsdp)(in) : (*ddp)(in); };
  std::vector<double> ms, peaks;
  double held = 0;
  for (int64_t r = 0; r <= rounds; ++r) {
    reset_peak_memory_stats();
    if (fsdp) fsdp->reset_max_gathered_bytes();
    distributed::barrier();
    const auto t0 = Clock::now();
    opt->zero_grad();
    cross_entropy(forward(x), y).backward();
    opt->step();
    const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (r == 0) continue;  // untimed
    ms.push_back(t);
    peaks.push_back(static_cast<double>(max_memory_allocated()) +
                    (fsdp ? static_cast<double>(fsdp->max_gathered_bytes()) : 0.0));
    held = static_cast<double>(memory_allocated()) - batch_bytes +
           (fsdp ? static_cast<double>(fsdp->gathered_bytes()) : 0.0);
  }
  const double mib = 1024.0 * 1024.0;
  Row row{mode, *std::max_element(peaks.begin(), peaks.end()) / mib, held / mib,
          train::compute_stats(ms).median};
  row.peak_mib = all_reduce_value(row.peak_mib, distributed::ReduceOp::Max);
  row.held_mib = all_reduce_value(row.held_mib, distributed::ReduceOp::Max);
  row.step_ms = all_reduce_value(row.step_ms, distributed::ReduceOp::Max);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 4, size = 224, rounds = 3;
  std::string json, arch = "resnet50", modes = "ddp,zero1,zero2,fsdp,fsdp_ckpt";
  cli::Flags flags("sharded",
                   "Per-rank peak and held memory and step time of DDP, ZeRO-1, ZeRO-2 and FSDP "
                   "(CPU ranks under mpirun), as a table and JSON.");
  flags.group(cli::group::kBenchmark);
  flags.add("--arch", &arch, "torchvision ResNet name");
  flags.add("--batch", &batch, "images per rank per step").positive();
  flags.add("--size", &size, "image size").positive();
  flags.add("--rounds", &rounds, "timed steps per mode").positive();
  flags.add("--modes", &modes, "comma-separated: ddp, zero1, zero2, fsdp, fsdp_ckpt");
  flags.group(cli::group::kCheckpoint);
  flags.add("--json", &json, "write the figures here (rank 0)").value_name("FILE.json");
  flags.parse(argc, argv);
  try {
    distributed::ProcessGroup& g = distributed::init();
    std::vector<Row> rows;
    std::stringstream ss(modes);
    std::string m;
    while (std::getline(ss, m, ',')) rows.push_back(run_mode(m, arch, batch, size, rounds));
    if (g.rank() == 0) {
      std::printf(
          "%s, batch %lld per rank, %lldx%lld, SGD-momentum, %d ranks (%s), %d threads "
          "per rank; per rank, the maximum over ranks:\n",
          arch.c_str(), static_cast<long long>(batch), static_cast<long long>(size),
          static_cast<long long>(size), g.size(), g.backend(), get_num_threads());
      std::printf("  %-10s %14s %14s %12s %9s\n", "mode", "peak MiB", "held MiB", "step ms",
                  "x ddp");
      const double base = rows.front().step_ms;
      for (const Row& r : rows)
        std::printf("  %-10s %14.1f %14.1f %12.0f %9.2f\n", r.mode.c_str(), r.peak_mib, r.held_mib,
                    r.step_ms, r.step_ms / base);
      if (!json.empty()) {
        std::ofstream f(json);
        f << "{\"benchmark\": \"sharded\", \"arch\": \"" << arch
          << "\", \"batch_per_rank\": " << batch << ", \"size\": " << size
          << ", \"ranks\": " << g.size() << ", \"threads_per_rank\": " << get_num_threads()
          << ", \"rows\": [";
        for (size_t i = 0; i < rows.size(); ++i)
          f << (i ? ", " : "") << "{\"mode\": \"" << rows[i].mode
            << "\", \"peak_mib\": " << rows[i].peak_mib << ", \"held_mib\": " << rows[i].held_mib
            << ", \"step_ms\": " << rows[i].step_ms << "}";
        f << "]}\n";
        std::printf("wrote %s\n", json.c_str());
      }
    }
  } catch (const std::exception& e) {
    distributed::abort(std::string("sharded: ") + e.what());
  }
  return 0;
}
