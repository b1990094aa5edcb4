// Memory over long training runs (issue 28): trains the Fashion-MNIST CNN of
// examples/fashion_mnist (real data) and the GNN tracking model of examples/gnn_tracking
// (synthetic detector events) for --steps steps each, with what a long job has on: a DataLoader
// with persistent workers, a checkpoint every --checkpoint-every steps (io::save_checkpoint with
// keep_last), per-step metrics to CSV and TensorBoard (train::MetricsWriter through the
// examples' MetricsLog and TrainStep, chronometer included). Every --sample-every steps it records
// the resident set (/proc/self/statm), the CPU block cache (cpu_cached_bytes()), the bytes malloc
// has handed out and not taken back (mallinfo2: dltrain has no live-bytes counter for CPU
// storage; its blocks under 256 KiB and everything else come from malloc, larger ones from
// malloc through the block cache) and the wall time.
//
//   soak [--models fashion_mnist,gnn] [--steps 20000] [--sample-every 1000]
//        [--checkpoint-every 1000] [--warmup-samples 2] [--max-growth-pct 1.0] [--json PATH]
//        [--out DIR] [--batch-size 64] [--gnn-batch-size 4] [--particles 20] [--hidden 32]
//        [--num-workers 2] ...
//
// After the first --warmup-samples samples, the growth is the least-squares slope of the RSS over
// the remaining samples, in % of their mean per 10,000 steps. Exit status 1 when a model's growth
// exceeds --max-growth-pct (naming the model and the figure), 2 on a bad flag, 0 otherwise.
// --leak-kib-per-step keeps that much memory per step alive on purpose, to show the check fails.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "apps/common/example_util.hpp"
#include "apps/common/training.hpp"
#include "dltrain/data/dataloader.hpp"
#include "dltrain/data/graph.hpp"
#include "dltrain/data/vision.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/io/checkpoint.hpp"
#include "dltrain/optim/adam.hpp"
#include "dltrain/optim/scheduler.hpp"
#include "dltrain/optim/sgd.hpp"
#include "dltrain/train/chronometer.hpp"
#include "examples/fashion_mnist/model.hpp"
#include "examples/gnn_tracking/detector.hpp"
#include "examples/gnn_tracking/model.hpp"

using namespace dltrain;
using namespace dltrain::apps;
namespace fs = std::filesystem;

namespace {

struct Args : CommonFlags {
  std::vector<std::string> models{"fashion_mnist", "gnn"};
  int64_t steps = 20000;
  int64_t sample_every = 1000;
  int64_t checkpoint_every = 1000;
  int64_t keep_last = 2;
  int64_t warmup_samples = 2;
  double max_growth_pct = 1.0;
  std::string out = "soak-out";
  // GNN events and model: examples/gnn_tracking's batch and iterations, smaller events (20
  // particles, not 200) and hidden size (32, not 64), so that 20,000 steps take minutes, not hours
  // (about 1 s per step at the example's sizes on 2 cores)
  int64_t gnn_batch_size = 4;
  int64_t events = 200;
  int particles = 20;
  int64_t hidden = 32;
  int64_t iterations = 4;
  int64_t leak_kib = 0;
  bool peak_warmup = true;
};

Args parse(int argc, char** argv) {
  Args a;
  a.data = fashion_mnist::kDefaultData;
  a.batch_size = 64;  // half the example's: 20,000 steps in about 15 min on 2 cores
  a.num_workers = 2;
  a.persistent_workers = true;
  cli::Flags f("soak",
               "Memory over long runs: trains the Fashion-MNIST CNN and the GNN tracking model "
               "with persistent workers, checkpoints, metrics and TensorBoard on, samples the "
               "resident memory and the allocator's bytes, fits their growth after warm-up and "
               "exits with 1 when the RSS grows faster than --max-growth-pct.");
  f.group(cli::group::kBenchmark);
  f.add("--models", &a.models, "the models to train, in order").choices({"fashion_mnist", "gnn"});
  f.add("--steps", &a.steps, "training steps per model").positive();
  f.add("--sample-every", &a.sample_every, "steps between memory samples").positive();
  f.add("--warmup-samples", &a.warmup_samples, "first samples left out of the fit").min(0);
  f.add("--max-growth-pct", &a.max_growth_pct,
        "fail when the RSS grows by more than this, in % per 10,000 steps")
      .min(0);
  f.add_switch("--peak-warmup", &a.peak_warmup,
               "GNN: one forward and backward on the largest batch before the run", true);
  f.add("--leak-kib-per-step", &a.leak_kib,
        "keep this many KiB per step alive on purpose (to check that growth is caught)")
      .min(0);
  // Not the examples' "Training (hyper-parameters)" group: soak has no test mode or profiler.
  f.group("Models");
  f.add("--batch-size", &a.batch_size, "Fashion-MNIST images per step").positive();
  f.add("--lr", &a.lr, "Fashion-MNIST peak learning rate (OneCycle)").min(0);
  f.add("--seed", &a.seed, "seed of the weights, the shuffling and the events");
  f.add("--gnn-batch-size", &a.gnn_batch_size, "GNN events (graphs) per step").positive();
  f.add("--hidden", &a.hidden, "GNN hidden size").positive();
  f.add("--iterations", &a.iterations, "GNN interaction-network iterations").min(0);
  f.group("Synthetic events");
  f.add("--events", &a.events, "GNN training events").positive();
  f.add("--particles", &a.particles, "particles per event").positive();
  a.add_data(f, "the Fashion-MNIST IDX files");
  a.add_loader(f);
  f.group(cli::group::kDevice);
  f.add("--threads", &a.threads, "CPU threads (0: DLTRAIN_NUM_THREADS or all cores)").min(0);
  f.group(cli::group::kCheckpoint);
  f.add("--checkpoint-every", &a.checkpoint_every, "steps between checkpoints").positive();
  f.add("--keep-last", &a.keep_last, "checkpoints kept (io::SaveOptions::keep_last)").positive();
  f.add("--out", &a.out, "folder for the checkpoints, metrics and TensorBoard files")
      .value_name("DIR");
  f.add("--json", &a.json, "write the samples and the fitted growth here").value_name("FILE.json");
  a.parse(f, argc, argv);
  if (a.steps / a.sample_every < a.warmup_samples + 2)
    f.fail("--steps / --sample-every gives " + std::to_string(a.steps / a.sample_every) +
           " samples: the fit needs --warmup-samples + 2 = " +
           std::to_string(a.warmup_samples + 2) + "; raise --steps or lower --sample-every");
  if (!train::tensorboard_available())
    f.fail("soak needs the TensorBoard sink (a build with protobuf)");
  if (!io::hdf5_supported()) f.fail("soak needs checkpoints (a build with HDF5)");
  return a;
}

struct Sample {
  int64_t step = 0;
  double rss_mib = 0, cache_mib = 0, heap_mib = 0, wall_s = 0;
  double max_batch_kib = 0;  // the largest batch so far (its tensors' bytes)
};

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

// Resident set size in bytes (second field of /proc/self/statm, in pages).
double rss_bytes() {
  std::ifstream f("/proc/self/statm");
  long long size = 0, resident = 0;
  f >> size >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// Bytes malloc has handed out and not taken back, over all arenas and mmapped chunks.
double heap_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks + m.hblkhd);
}

// Growth of y over the samples after the first `warmup`: least-squares slope per 10,000 steps,
// in % of the mean. NaN with fewer than two samples to fit.
double growth_pct(const std::vector<Sample>& s, int64_t warmup, double Sample::*y) {
  const size_t first = static_cast<size_t>(warmup);
  if (s.size() < first + 2) return std::nan("");
  double n = 0, mx = 0, my = 0;
  for (size_t i = first; i < s.size(); ++i, ++n) {
    mx += static_cast<double>(s[i].step);
    my += s[i].*y;
  }
  mx /= n;
  my /= n;
  double sxy = 0, sxx = 0;
  for (size_t i = first; i < s.size(); ++i) {
    const double dx = static_cast<double>(s[i].step) - mx;
    sxy += dx * (s[i].*y - my);
    sxx += dx * dx;
  }
  return my > 0 ? 100.0 * (sxy / sxx) * 1e4 / my : 0.0;
}

// One model's soak: `loader` and `loss` give the batches and the step's loss.
struct Soak {
  std::string name;
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<optim::LRScheduler> sched;
  std::unique_ptr<data::DataLoader> loader;
  std::function<Tensor(const data::Batch&)> loss;
  int64_t batch_size = 0;
  // With batches of varying size (graphs), the batch of the largest samples: one forward and
  // backward on it before the run (no optimizer step), so that the working set's peak is reached
  // before the samples start, not whenever shuffling first draws such a batch (the RSS then
  // steps up: a new high-water mark, not a leak). Empty when every batch has one size.
  std::optional<data::Batch> peak_batch;
};

// Bytes of a batch's tensors.
double batch_bytes(const data::Batch& b) {
  auto n = [](const Tensor& t) {
    return t.defined() ? static_cast<double>(t.numel()) * static_cast<double>(t.element_size()) : 0;
  };
  double sum = n(b.data) + n(b.target);
  for (const auto& [name, t] : b.fields) sum += n(t);
  return sum;
}

std::vector<Sample> run_soak(const Args& a, Soak& s) {
  const fs::path dir = fs::path(a.out) / s.name;
  fs::create_directories(dir);
  const std::string ckpt = (dir / "checkpoint.h5").string();
  CommonFlags log_flags;
  log_flags.metrics = (dir / "metrics.csv").string();
  log_flags.tensorboard = (dir / "tensorboard").string();
  MetricsLog metrics(log_flags);
  train::Chronometer chrono;
  amp::GradScaler scaler({.enabled = false});
  PrecisionFlags prec;
  train::TrainStep step(
      *s.opt, scaler,
      step_options(prec, Device::cpu(), s.sched.get(), 0, &chrono, nullptr, nullptr, &metrics));
  std::vector<Sample> samples;
  std::vector<Tensor> leaked;
  double max_batch = 0;
  if (s.peak_batch && a.peak_warmup) {
    s.model->train();
    s.opt->zero_grad();
    s.loss(*s.peak_batch).backward();
    s.opt->zero_grad();
    max_batch = batch_bytes(*s.peak_batch);
    std::printf("%s: one forward and backward on the largest batch first (%.1f KiB)\n",
                s.name.c_str(), max_batch / 1024);
  }
  const auto t0 = Clock::now();
  std::printf("%s: %lld steps, batch %lld, %lld batches per epoch, %lld workers%s\n",
              s.name.c_str(), static_cast<long long>(a.steps), static_cast<long long>(s.batch_size),
              static_cast<long long>(s.loader->size()), static_cast<long long>(a.num_workers),
              a.persistent_workers ? " (persistent)" : "");
  std::printf("  %8s %10s %10s %10s %14s %9s\n", "step", "RSS MiB", "cache MiB", "heap MiB",
              "max batch KiB", "wall s");
  for (int64_t epoch = 0; step.step() < a.steps; ++epoch) {
    s.loader->set_epoch(epoch);
    step.begin_epoch(*s.model, epoch);
    for (const data::Batch& b : *s.loader) {
      step.data_ready();
      max_batch = std::max(max_batch, batch_bytes(b));
      step.run(b.size(), [&] { return s.loss(b); });
      const int64_t n = step.step();
      if (a.leak_kib > 0) leaked.push_back(full({a.leak_kib * 256}, 1.0f));
      if (n % a.checkpoint_every == 0)
        io::save_checkpoint(ckpt, *s.model, s.opt.get(), s.sched.get(),
                            {.epoch = epoch, .step = n, .batch_in_epoch = step.batches()},
                            {{"benchmark", "soak"}, {"model", s.name}}, {.keep_last = a.keep_last});
      if (n % a.sample_every == 0) {
        samples.push_back({n, mib(rss_bytes()), mib(static_cast<double>(cpu_cached_bytes())),
                           mib(heap_bytes()), seconds(t0, Clock::now()), max_batch / 1024});
        const Sample& x = samples.back();
        std::printf("  %8lld %10.1f %10.1f %10.1f %14.1f %9.1f\n", static_cast<long long>(x.step),
                    x.rss_mib, x.cache_mib, x.heap_mib, x.max_batch_kib, x.wall_s);
        std::fflush(stdout);
      }
      if (n >= a.steps) break;
      step.begin();
    }
    step.end_epoch();
  }
  metrics.finish({}, {});
  return samples;
}

Soak fashion_mnist_soak(const Args& a) {
  Soak s;
  s.name = "fashion_mnist";
  s.batch_size = a.batch_size;
  auto train_set =
      std::make_shared<data::MNIST>(a.data, /*train=*/true, fashion_mnist::normalization());
  s.loader = std::make_unique<data::DataLoader>(train_set, [&] {
    data::DataLoaderOptions o = a.loader_options(/*drop_last=*/true);
    o.shuffle = true;
    return o;
  }());
  s.model = fashion_mnist::make_model();
  s.opt = std::make_unique<optim::SGD>(
      s.model->parameters(),
      optim::SGDOptions{.lr = a.lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  s.sched = std::make_unique<optim::OneCycleLR>(*s.opt, a.lr, a.steps);
  auto criterion = std::make_shared<nn::CrossEntropyLoss>();
  auto model = s.model;
  s.loss = [model, criterion](const data::Batch& b) {
    return (*criterion)(model->forward(b.data), b.target);
  };
  return s;
}

Soak gnn_soak(const Args& a) {
  Soak s;
  s.name = "gnn";
  s.batch_size = a.gnn_batch_size;
  gnn_tracking::DetectorConfig det;
  det.particles = a.particles;
  auto train_set =
      std::make_shared<data::GraphDataset>(gnn_tracking::generate_events(det, a.seed, 0, a.events));
  data::DataLoaderOptions o = a.loader_options(/*drop_last=*/false);
  o.batch_size = a.gnn_batch_size;
  o.shuffle = true;
  s.loader = std::make_unique<data::DataLoader>(train_set, o);
  std::vector<int64_t> order(static_cast<size_t>(train_set->size()));
  std::iota(order.begin(), order.end(), 0);
  auto edges = [&](int64_t i) { return train_set->graph(i).edge_index.size(1); };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t i, int64_t j) { return edges(i) > edges(j); });
  order.resize(static_cast<size_t>(std::min<int64_t>(a.gnn_batch_size, train_set->size())));
  s.peak_batch = train_set->get_batch(order);
  auto model = gnn_tracking::make_model(a.hidden, a.iterations);
  s.model = model;
  s.opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = 2e-3});
  s.sched = std::make_unique<optim::CosineAnnealingLR>(*s.opt, a.steps, 2e-3 * 0.05);
  s.loss = [model](const data::Batch& b) {
    const data::GraphBatch g = data::GraphBatch::from(b);
    return binary_cross_entropy_with_logits((*model)(g.x, g.edge_index, g.edge_attr), g.y);
  };
  return s;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  return run_guarded("soak", [&]() -> int {
    start_run(a, /*data_parallel=*/false);
    std::printf(
        "soak: %s, %d threads; RSS growth fitted after %lld warm-up samples, limit %.2f%% "
        "per 10,000 steps\n",
        cpu_model().c_str(), get_num_threads(), static_cast<long long>(a.warmup_samples),
        a.max_growth_pct);
    nlohmann::json report = {{"benchmark", "soak"},
                             {"cpu", cpu_model()},
                             {"threads", get_num_threads()},
                             {"steps", a.steps},
                             {"sample_every", a.sample_every},
                             {"checkpoint_every", a.checkpoint_every},
                             {"keep_last", a.keep_last},
                             {"warmup_samples", a.warmup_samples},
                             {"max_growth_pct", a.max_growth_pct},
                             {"num_workers", a.num_workers},
                             {"persistent_workers", a.persistent_workers},
                             {"leak_kib_per_step", a.leak_kib},
                             {"peak_warmup", a.peak_warmup},
                             {"models", nlohmann::json::array()}};
    std::vector<std::pair<std::string, double>> failed;  // model, RSS growth
    for (const std::string& name : a.models) {
      // Each model starts from an empty block cache and a trimmed heap: the previous model's
      // blocks (other sizes) would otherwise sit in its baseline.
      cpu_empty_cache();
      malloc_trim(0);
      Soak s = name == "gnn" ? gnn_soak(a) : fashion_mnist_soak(a);
      const std::vector<Sample> samples = run_soak(a, s);
      const double rss = growth_pct(samples, a.warmup_samples, &Sample::rss_mib);
      const double heap = growth_pct(samples, a.warmup_samples, &Sample::heap_mib);
      const bool ok = rss <= a.max_growth_pct;
      std::printf("%s: RSS growth %+.3f%% per 10,000 steps, heap %+.3f%% (limit %.2f%%): %s\n",
                  name.c_str(), rss, heap, a.max_growth_pct, ok ? "flat" : "GROWS");
      if (!ok) failed.emplace_back(name, rss);
      nlohmann::json js = nlohmann::json::array();
      for (const Sample& x : samples)
        js.push_back({{"step", x.step},
                      {"rss_mib", x.rss_mib},
                      {"cpu_cache_mib", x.cache_mib},
                      {"heap_mib", x.heap_mib},
                      {"max_batch_kib", x.max_batch_kib},
                      {"wall_s", x.wall_s}});
      report["models"].push_back({{"model", name},
                                  {"batch_size", s.batch_size},
                                  {"samples", js},
                                  {"rss_growth_pct_per_10k_steps", cli::number(rss)},
                                  {"heap_growth_pct_per_10k_steps", cli::number(heap)},
                                  {"flat", ok}});
    }
    if (!a.json.empty()) {
      cli::write_json_report(a.json, report);
      std::printf("wrote %s\n", a.json.c_str());
    }
    for (const auto& [name, rss] : failed)
      std::fprintf(stderr,
                   "soak: %s: resident memory grows by %.3f%% per 10,000 steps after warm-up "
                   "(limit %.2f%%, --max-growth-pct)\n",
                   name.c_str(), rss, a.max_growth_pct);
    return failed.empty() ? 0 : 1;
  });
}
