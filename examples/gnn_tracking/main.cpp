// Particle-track edge classification with an interaction network, as in the L2IT / HEP.TrkX
// tracking studies, on a synthetic barrel detector (detector.hpp: helices in a solenoid field,
// smeared hits, noise, candidate edges between adjacent layers). Each event is a graph; the
// network says which candidate edges join two hits of the same particle.
//
//   gnn_tracking [--train-events 400] [--test-events 50] [--particles 200] [--layers 8]
//                [--noise 0.2] [--batch-size 4] [--epochs 8] [--lr 2e-3] [--hidden 64]
//                [--iterations 4] [--seed 0] [--threads N] [--test] [--json PATH]
//                [--checkpoint PATH [--resume]] [--metrics FILE.csv|FILE.jsonl]
//                [--tensorboard DIR] [--dump-events FILE.safetensors] [--amp [--amp-dtype
//                f16|bf16]]
//                [--profile FILE.json [--profile-steps 5] [--profile-warmup 2] [--profile-shapes]]
//
// Model: node encoder MLP (r, phi, z -> H), edge encoder MLP (dr, dphi, dz, z0 -> H), K
// interaction layers (edge update MLP on [x_src, x_dst, e]; the messages summed into their
// destination and source nodes with index_add; node update MLP on [x, in, out]; residual
// connections), edge classifier MLP on [x_src, x_dst, e] -> one logit, BCE-with-logits loss.
// The three stages are an nn::Chain of modules taking and returning (x, edge_index, e); the
// interaction layers sit in an nn::ModuleListOf<Interaction>. Graph batches come from
// data::GraphDataset through a DataLoader (data::GraphBatch::from). Per epoch: training loss,
// test loss, edge efficiency (true edges found / true edges) and purity (true edges found /
// edges found) at a 0.5 threshold, graphs/s. --dump-events writes the training events as
// safetensors for benchmarks/peers/pytorch_gnn_tracking.py (the same model in PyTorch).
// --amp runs forward, loss and evaluation under autocast on the CPU (bf16; --amp-dtype f16 adds
// a GradScaler): the linear layers in 16 bits, index_add accumulating in f32, the loss in f32.
// There is no --channels-last: the tensors are node and edge lists, not images. --profile
// profiles a few training steps and writes the Chrome trace.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "apps/common/example_util.hpp"
#include "apps/common/training.hpp"
#include "dltrain/data/dataloader.hpp"
#include "dltrain/data/graph.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/optim/adam.hpp"
#include "dltrain/optim/scheduler.hpp"
#include "dltrain/train/chronometer.hpp"
#include "dltrain/train/metrics.hpp"
#include "dltrain/train/progress.hpp"
#include "examples/gnn_tracking/detector.hpp"
#include "examples/gnn_tracking/model.hpp"

using namespace dltrain;
using namespace dltrain::apps;

namespace {

struct Args : CommonFlags {
  int64_t train_events = 400;
  int64_t test_events = 50;
  int particles = 200;
  int layers = 8;
  double noise = 0.2;
  double pt_min = 0.5;
  int64_t hidden = 64;
  int64_t iterations = 4;
  std::string dump_events;
};

Args parse(int argc, char** argv) {
  Args a;
  a.batch_size = 4;
  a.epochs = 8;
  a.lr = 2e-3;
  cli::Flags f("gnn_tracking",
               "Particle-track edge classification with an interaction network on synthetic "
               "detector events (graphs): edge efficiency and purity per epoch. It runs on the "
               "CPU; --channels-last does not apply (node and edge lists, not images).");
  a.add_training(f);
  f.add("--hidden", &a.hidden, "hidden size of every MLP").positive();
  f.add("--iterations", &a.iterations, "interaction-network iterations").min(0);
  f.group(cli::group::kTest);
  f.add_switch("--test", &a.test, "a quick run: at most 48 + 8 events and 2 epochs");
  f.group("Synthetic events");
  f.add("--train-events", &a.train_events, "training events (graphs)").positive();
  f.add("--test-events", &a.test_events, "test events").positive();
  f.add("--particles", &a.particles, "particles per event").positive();
  f.add("--layers", &a.layers, "detector layers").min(2);
  f.add("--noise", &a.noise, "noise hits per true hit").min(0);
  f.add("--pt-min", &a.pt_min, "minimum transverse momentum of a particle (GeV)").positive();
  f.add("--dump-events", &a.dump_events,
        "write the training events here for benchmarks/peers/pytorch_gnn_tracking.py")
      .value_name("FILE.safetensors");
  f.group(cli::group::kDevice);
  f.add("--threads", &a.threads, "CPU threads (0: DLTRAIN_NUM_THREADS or all cores)").min(0);
  a.prec.add_to(f, /*with_layout=*/false);
  a.add_checkpoint(f, /*with_lr_scaling=*/false);
  a.add_report(f);
  a.prof.add_to(f);
  a.parse(f, argc, argv);
  if (a.test) {  // the ctest smoke run: a few small events, two epochs
    a.train_events = std::min<int64_t>(a.train_events, 48);
    a.test_events = std::min<int64_t>(a.test_events, 8);
    a.epochs = std::min<int64_t>(a.epochs, 2);
  }
  return a;
}

// Edge counts at the 0.5 threshold (logit > 0).
struct Confusion {
  int64_t tp = 0, fp = 0, fn = 0, tn = 0;
  void add(const Tensor& logits, const Tensor& y) {
    // Logits are bf16/f16 under --amp; 16-bit values compare with 0 exactly as in f32.
    const Tensor l = logits.to(DType::f32).contiguous(), t = y.to(DType::f32).contiguous();
    const float* pl = l.data<float>();
    const float* pt = t.data<float>();
    for (int64_t i = 0; i < l.numel(); ++i) {
      const bool p = pl[i] > 0, tr = pt[i] > 0.5f;
      tp += p && tr;
      fp += p && !tr;
      fn += !p && tr;
      tn += !p && !tr;
    }
  }
  double efficiency() const { return tp + fn ? 100.0 * double(tp) / double(tp + fn) : 0; }
  double purity() const { return tp + fp ? 100.0 * double(tp) / double(tp + fp) : 0; }
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return run_guarded("gnn_tracking", [&]() -> int {
    const Device cpu = start_run(args, /*data_parallel=*/false).device;
    gnn_tracking::DetectorConfig det;
    det.layers = args.layers;
    det.particles = args.particles;
    det.noise_fraction = args.noise;
    det.pt_min = args.pt_min;

    // Training events are 0..n-1 of the seed, test events the next ones: disjoint.
    auto t_gen = Clock::now();
    gnn_tracking::EventStats st;
    std::vector<data::Graph> train_graphs =
        gnn_tracking::generate_events(det, args.seed, 0, args.train_events, &st);
    std::vector<data::Graph> test_graphs =
        gnn_tracking::generate_events(det, args.seed, args.train_events, args.test_events);
    const double n = static_cast<double>(args.train_events);
    std::printf("detector: %s\n", det.describe().c_str());
    std::printf(
        "events: %lld train, %lld test (generated in %.2f s, seed %llu); per event %.0f hits "
        "(%.0f noise), %.0f candidate edges, %.1f%% true; graph construction efficiency %.2f%%\n",
        static_cast<long long>(args.train_events), static_cast<long long>(args.test_events),
        seconds(t_gen, Clock::now()), static_cast<unsigned long long>(args.seed),
        static_cast<double>(st.hits) / n, static_cast<double>(st.noise_hits) / n,
        static_cast<double>(st.edges) / n,
        100.0 * static_cast<double>(st.true_edges) / static_cast<double>(st.edges),
        100.0 * static_cast<double>(st.true_edges) / static_cast<double>(st.true_segments));
    if (!args.dump_events.empty()) {
      gnn_tracking::dump_events(args.dump_events, train_graphs, det);
      std::printf("dumped %zu training events to %s\n", train_graphs.size(),
                  args.dump_events.c_str());
    }
    auto train_set = std::make_shared<data::GraphDataset>(std::move(train_graphs));
    auto test_set = std::make_shared<data::GraphDataset>(std::move(test_graphs));
    data::DataLoader train_loader(
        train_set, {.batch_size = args.batch_size, .shuffle = true, .seed = args.seed});
    data::DataLoader test_loader(test_set, {.batch_size = args.batch_size});

    auto model = gnn_tracking::make_model(args.hidden, args.iterations);
    std::printf("model: %lld parameters, %d threads\n%s\n",
                static_cast<long long>(model->num_parameters()), get_num_threads(),
                model->str().c_str());
    optim::Adam opt(model->parameters(), {.lr = args.lr});
    const int64_t steps_per_epoch = train_loader.size();
    optim::CosineAnnealingLR sched(opt, steps_per_epoch * args.epochs, args.lr * 0.05);
    std::printf("precision %s, loss scaling %s\n", args.prec.precision(cpu).c_str(),
                args.prec.scaler_options(cpu).enabled ? "on" : "off");
    amp::GradScaler scaler(args.prec.scaler_options(cpu));  // on for f16 only
    train::CheckpointFile ckpt(
        args.checkpoint, *model, opt, sched, scaler,
        {.global_batch = args.batch_size, .metadata = {{"example", "gnn_tracking"}}});
    const train::ResumePosition start = ckpt.resume(args.resume);
    MetricsLog metrics(args);
    train::Progress progress({.total_steps = steps_per_epoch, .label = "  train"});
    train::Chronometer chrono;
    std::vector<nlohmann::json> epochs;
    std::map<std::string, double> final_figures;  // the last epoch's, for the hparams
    bool preempted = false;
    train::ProfileWindow profiler(args.prof.window(/*main_process=*/true));
    train::TrainStep train_step(
        opt, scaler,
        step_options(args.prec, cpu, &sched, start.step, &chrono, &profiler, &progress, &metrics));

    for (int64_t epoch = start.epoch; epoch < args.epochs && !preempted; ++epoch) {
      train_step.begin_epoch(*model, epoch, ckpt.begin_epoch(train_loader, epoch));
      for (const data::Batch& b : train_loader) {
        const data::GraphBatch g = data::GraphBatch::from(b);
        train_step.data_ready();
        train_step.run(g.num_graphs, [&] {
          return binary_cross_entropy_with_logits((*model)(g.x, g.edge_index, g.edge_attr), g.y);
        });
        if (ckpt.stop_for_requeue(epoch, train_step.step(), train_loader, train_step.batches())) {
          preempted = true;
          break;
        }
        train_step.begin();
      }
      const train::EpochTally train = train_step.end_epoch();
      if (preempted) break;
      const int64_t step = train_step.step();
      const double train_time = train.seconds;

      model->eval();
      Confusion c;
      double test_loss = 0;
      int64_t test_edges = 0;
      {
        NoGradGuard ng;
        const amp::autocast ac = args.prec.region(cpu);
        for (const data::Batch& b : test_loader) {
          const data::GraphBatch g = data::GraphBatch::from(b);
          const Tensor logits = (*model)(g.x, g.edge_index, g.edge_attr);
          test_loss += binary_cross_entropy_with_logits(logits, g.y, {.reduction = Reduction::Sum})
                           .item<double>();
          test_edges += g.y.numel();
          c.add(logits, g.y);
        }
      }
      const double train_loss = train.mean_loss();
      const double mean_test_loss = test_loss / static_cast<double>(test_edges);
      const double graphs_per_s = train.throughput();
      epochs.push_back({{"epoch", epoch + 1},
                        {"time_s", train_time},
                        {"train_loss", train_loss},
                        {"test_loss", mean_test_loss},
                        {"efficiency", c.efficiency()},
                        {"purity", c.purity()},
                        {"graphs_per_s", graphs_per_s}});
      final_figures = {{"test/efficiency", c.efficiency()}, {"test/purity", c.purity()}};
      metrics.epoch({{"test/loss", mean_test_loss},
                     {"test/efficiency", c.efficiency()},
                     {"test/purity", c.purity()},
                     {"train/epoch_loss", train_loss},
                     {"train/graphs_per_s", graphs_per_s}},
                    step);
      ckpt.save(epoch + 1, step);
      std::printf(
          "epoch %lld/%lld  time %.1f s  train loss %.4f  test loss %.4f  "
          "efficiency %.2f%%  purity %.2f%%  throughput %.1f graphs/s\n",
          static_cast<long long>(epoch + 1), static_cast<long long>(args.epochs), train_time,
          train_loss, mean_test_loss, c.efficiency(), c.purity(), graphs_per_s);
      std::fflush(stdout);
    }
    if (preempted) return train::kExitRequeue;

    std::printf("%s", chrono
                          .table(args.prec.precision(cpu) + ", batch " +
                                 std::to_string(args.batch_size) + " graphs")
                          .c_str());
    const train::ChronometerSummary cs = chrono.summary();
    auto median = [&](train::Phase p) { return 1e3 * cs.phases[static_cast<int>(p)].median; };
    metrics.finish({{"lr", args.lr},
                    {"batch_size", static_cast<double>(args.batch_size)},
                    {"hidden", static_cast<double>(args.hidden)},
                    {"iterations", static_cast<double>(args.iterations)},
                    {"particles", static_cast<double>(args.particles)},
                    {"precision", args.prec.precision(cpu)}},
                   final_figures);

    nlohmann::json report = report_header(args, cpu, scaler);
    report.update({{"example", "gnn_tracking"},
                   {"hidden", args.hidden},
                   {"iterations", args.iterations},
                   {"train_events", args.train_events},
                   {"edges_per_event", static_cast<double>(st.edges) / n},
                   {"steps", cs.measured_steps},
                   {"step_ms",
                    {{"data", median(train::Phase::Data)},
                     {"forward", median(train::Phase::Forward)},
                     {"backward", median(train::Phase::Backward)},
                     {"optimizer", median(train::Phase::Optimizer)}}},
                   {"epochs", epochs}});
    write_report(args, report);
    return 0;
  });
}
