// Fashion-MNIST with a small CNN (conv-BN-ReLU-pool x2, linear), trained on the CPU or a
// CUDA GPU (--device cuda) with SGD + momentum and a OneCycle learning-rate schedule, in the
// style of the IDRIS "Deep Learning Optimise" training script: the same flags, per-epoch
// validation, a chronometer of per-step data / forward / backward+step times, and a JSON report.
//
//   fashion_mnist [--data DIR] [--batch-size 128] [--epochs 3] [--lr 0.1] [--wd 5e-4]
//                 [--mom 0.9] [--seed 0] [--threads N] [--test] [--test-nsteps 50]
//                 [--json PATH] [--checkpoint PATH [--resume]] [--device cpu|cuda[:N]]
//                 [--num-workers N] [--prefetch-factor N] [--pin-memory] [--non-blocking]
//                 [--persistent-workers] [--amp [--amp-dtype f16|bf16]] [--channels-last]
//                 [--metrics FILE.csv|FILE.jsonl] [--tensorboard DIR]
//                 [--profile FILE.json [--profile-steps 5] [--profile-warmup 2] [--profile-shapes]]
// Data parallel: run it under `mpirun -np N` or `srun` and each rank trains on its share of
// the data (DistributedSampler) with --batch-size per rank (global batch = N x batch size),
// gradients averaged by DistributedDataParallel; rank 0 prints and writes checkpoints and the
// JSON; metrics are summed over the ranks. --sync-bn synchronises the BatchNorm statistics.
// On a GPU the chronometer synchronises the device at its marks (as the course's does) so
// each phase is charged its own GPU time, and the peak device memory is reported. --amp runs
// the forward pass under autocast (f16 with a GradScaler on a GPU, bf16 on the CPU).
// With --checkpoint, SIGUSR1 or SIGTERM (Slurm's wall-time warning, preemption, scancel) saves
// the state at the next step boundary and exits with status 75 (train::kExitRequeue) for the job
// script to requeue; the requeued run resumes bit for bit with --resume.
// --metrics and --tensorboard log the loss and learning rate of every step and the test figures
// of every epoch (train::MetricsWriter; a resumed run appends to the CSV / JSON lines file);
// progress lines come from train::Progress and the timing table from train::Chronometer.
// --profile runs train::Profiler over a few steps after warm-up, writes the Chrome trace and
// prints the ops table; tools/dltrain-plot draws the --metrics file.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "dltrain/data/dataloader.hpp"
#include "dltrain/data/vision.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/io/checkpoint.hpp"
#include "dltrain/optim/scheduler.hpp"
#include "dltrain/optim/sgd.hpp"
#include "dltrain/train/chronometer.hpp"
#include "dltrain/train/metrics.hpp"
#include "dltrain/train/preemption.hpp"
#include "dltrain/train/progress.hpp"
#include "examples/common/example_util.hpp"

using namespace dltrain;
using namespace dltrain::examples;

namespace {

struct Args : CommonFlags {
  double wd = 5e-4;
  double mom = 0.9;
  bool sync_bn = false;
  PrecisionFlags prec;
  ProfileFlags prof;
};

// Parses the flags into an Args (exits with status 2 naming the flag on a bad one).
Args parse(int argc, char** argv) {
  Args a;
  a.data = "/usr/share/datasets/fashion-mnist";
  a.epochs = 3;
  cli::Flags f("fashion_mnist",
               "Fashion-MNIST with a small CNN, SGD + momentum and a OneCycle schedule, with the "
               "flags of the IDRIS course script; prints per-epoch figures and the chronometer.");
  a.add_training(f);
  f.add("--wd", &a.wd, "weight decay").min(0);
  f.add("--mom", &a.mom, "momentum (nesterov)").min(0);
  a.add_test(f);
  a.add_data(f, "the Fashion-MNIST IDX files (gzipped or not)");
  a.add_loader(f);
  a.add_device(f);
  a.prec.add_to(f);
  f.group(cli::group::kDistributed);
  f.add_switch("--sync-bn", &a.sync_bn, "synchronise BatchNorm statistics over the ranks");
  a.add_checkpoint(f);
  a.add_report(f);
  a.prof.add_to(f);
  f.parse(argc, argv);
  a.check(f);
  a.prec.check(f);
  a.prof.check(f);
  return a;
}

// conv(1->32)-BN-ReLU-pool, conv(32->64)-BN-ReLU-pool, linear(64*7*7 -> 10).
std::shared_ptr<nn::Sequential> make_model() {
  nn::Conv2dOptions c;
  c.padding = 1;
  c.bias = false;  // BN follows
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Conv2d>(1, 32, 3, c))
      .push_back(std::make_shared<nn::BatchNorm2d>(32))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::MaxPool2d>(2))
      .push_back(std::make_shared<nn::Conv2d>(32, 64, 3, c))
      .push_back(std::make_shared<nn::BatchNorm2d>(64))
      .push_back(std::make_shared<nn::ReLU>())
      .push_back(std::make_shared<nn::MaxPool2d>(2))
      .push_back(std::make_shared<nn::Flatten>())
      .push_back(std::make_shared<nn::Linear>(64 * 7 * 7, 10));
  return m;
}

struct EpochReport {
  int64_t epoch;
  double train_time, train_loss, test_loss, test_acc, throughput;
};

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
    if (args.threads > 0) set_num_threads(args.threads);
    manual_seed(args.seed);
    Device device = args.parsed_device();
    // A world of one without a launcher; under mpirun/srun, one rank per GPU (cuda:local_rank).
    distributed::ProcessGroup& world = distributed::init({.use_gpu = device.is_cuda()});
    const int ranks = world.size();
    if (device.is_cuda() && args.device == "cuda") device = distributed::device();
    // Rank 0 reports; the other ranks' stdout is discarded (errors still reach stderr).
    if (!distributed::is_main_process()) (void)std::freopen("/dev/null", "w", stdout);
    const bool gpu = device.is_cuda();
    if (gpu) cuda::set_device(device.index);
    data::ImageOptions norm{{0.2860f}, {0.3530f}};
    auto t_load = Clock::now();
    auto train_set = std::make_shared<data::MNIST>(args.data, true, norm);
    auto test_set = std::make_shared<data::MNIST>(args.data, false, norm);
    std::printf(
        "Fashion-MNIST from %s: %lld train, %lld test images (loaded in %.2f s), %d threads\n",
        args.data.c_str(), static_cast<long long>(train_set->size()),
        static_cast<long long>(test_set->size()), seconds(t_load, Clock::now()), get_num_threads());

    data::DataLoaderOptions lo;
    lo.batch_size = args.batch_size;
    lo.shuffle = true;
    lo.drop_last = true;
    lo.seed = args.seed;
    lo.num_workers = args.num_workers;
    lo.prefetch_factor = args.prefetch_factor;
    lo.pin_memory = args.pin_memory;
    lo.persistent_workers = args.persistent_workers;
    data::DataLoaderOptions to;
    to.batch_size = 1000;
    // Each rank its share of the data. One epoch order over all ranks (the seed's), also for
    // one process: a checkpoint then resumes on any number of ranks where it stopped.
    lo.shuffle = false;  // the sampler shuffles
    auto train_sampler = std::make_shared<data::DistributedSampler>(train_set->size(), world.rank(),
                                                                    ranks, true, args.seed, true);
    std::shared_ptr<data::Sampler> test_sampler;
    if (ranks > 1)
      test_sampler =
          std::make_shared<data::DistributedSampler>(test_set->size(), world.rank(), ranks, false);
    data::DataLoader train_loader(train_set, train_sampler, lo);
    data::DataLoader test_loader = test_sampler ? data::DataLoader(test_set, test_sampler, to)
                                                : data::DataLoader(test_set, to);
    if (ranks > 1)
      std::printf(
          "data parallel: %d ranks (%s), %lld images per rank and step, global batch %lld\n", ranks,
          world.backend(), static_cast<long long>(args.batch_size),
          static_cast<long long>(args.batch_size * ranks));

    auto model = make_model();
    model->to(device);
    const MemoryFormat fmt = args.prec.format();
    model->to(fmt);
    std::printf("model: %lld parameters\n%s\n", static_cast<long long>(model->num_parameters()),
                model->str().c_str());
    std::printf("%s\n", args.prec.describe(device).c_str());
    if (args.sync_bn) distributed::convert_sync_batchnorm(model);
    // Broadcasts rank 0's weights; in a world of one the reduction is the identity.
    distributed::DistributedDataParallel ddp(model);
    optim::SGD opt(
        model->parameters(),
        {.lr = args.lr, .momentum = args.mom, .weight_decay = args.wd, .nesterov = true});
    int64_t steps_per_epoch = train_loader.size();
    // --test runs the first --test-nsteps steps of the full run, its schedule included.
    const int64_t total_steps = steps_per_epoch * args.epochs;
    optim::OneCycleLR sched(opt, args.lr, total_steps);
    nn::CrossEntropyLoss criterion;
    amp::GradScaler scaler(args.prec.scaler_options(device));
    ScaleLog scale_log;

    // The course's chronometer: on a GPU its marks wait for the device, so each phase is charged
    // the GPU work it queued.
    train::Chronometer chrono({.device = device});
    std::vector<EpochReport> reports;
    CheckpointFile ckpt(args.checkpoint, *model, opt, sched, scaler,
                        {{"example", "fashion_mnist"}, {"ranks", std::to_string(ranks)}},
                        args.batch_size * ranks, args.lr_scaling());
    const train::ResumePosition start = ckpt.resume(args.resume);
    int64_t step = start.step;
    bool preempted = false;
    train::MetricsWriter metrics(metrics_options(args.metrics, args.tensorboard, args.resume));
    // Ten lines per epoch (every tenth step with --test), a live bar on a terminal.
    const int64_t progress_total =
        args.test ? std::min(args.test_nsteps, steps_per_epoch) : steps_per_epoch;
    train::Progress progress(
        {.total_steps = progress_total, .every = args.test ? 10 : 0, .label = "  train"});
    // --profile: a few training steps after warm-up, rank 0 only.
    StepProfiler profiler(args.prof, distributed::is_main_process());
    bool done = args.test && step >= args.test_nsteps;
    for (int64_t epoch = start.epoch; epoch < args.epochs && !done; ++epoch) {
      model->train();
      const int64_t first_batch = ckpt.begin_epoch(train_loader, epoch);
      double loss_sum = 0;
      int64_t seen = 0, nb = 0;
      auto t_epoch = Clock::now();
      progress.begin(epoch + 1);
      chrono.begin_step();
      profiler.begin_step();
      for (const data::Batch& hb : train_loader) {
        const data::Batch b{hb.data.to(device, args.non_blocking).contiguous(fmt),
                            hb.target.to(device, args.non_blocking)};
        chrono.lap(train::Phase::Data);
        Tensor loss;
        {
          const train::ProfileRange range("forward");
          const amp::autocast ac = args.prec.region(device);
          loss = criterion(ddp(b.data), b.target);
        }
        chrono.lap(train::Phase::Forward);
        {
          const train::ProfileRange range("backward");
          opt.zero_grad();
          scaler.scale(loss).backward();
        }
        chrono.lap(train::Phase::Backward);
        double l = 0;
        {
          const train::ProfileRange range("optimizer");
          scaler.step(opt);
          scaler.update();
          sched.step();
          scale_log(scaler, step);
          l = loss.item<double>();
        }
        chrono.lap(train::Phase::Optimizer);
        chrono.end_step(b.size());
        profiler.end_step();
        loss_sum += l;
        seen += b.size();
        ++nb;
        ++step;
        const double lr = sched.get_last_lr()[0];
        progress.update(first_batch + nb, l, lr, b.size());
        metrics.add_scalars({{"train/loss", l}, {"train/lr", lr}}, step);
        // Slurm's wall-time signal or a preemption: saved, stop (every rank at this step).
        if (ckpt.stop_for_requeue(epoch, step, train_loader, nb)) {
          preempted = done = true;
          break;
        }
        if (args.test && step >= args.test_nsteps) {
          done = true;
          ckpt.save(epoch, step, train_loader, nb);
          break;
        }
        chrono.begin_step();
        profiler.begin_step();
      }
      progress.end();
      profiler.finish();  // a window cut short by the end of the run or a preemption
      if (preempted) break;
      double train_time = seconds(t_epoch, Clock::now());
      // Global figures: images and losses summed over the ranks, the slowest rank's time.
      if (ranks > 1) {
        using distributed::ReduceOp;
        train_time = distributed::all_reduce_value(train_time, ReduceOp::Max);
        loss_sum = distributed::all_reduce_value(loss_sum) / ranks;
        seen = static_cast<int64_t>(distributed::all_reduce_value(static_cast<double>(seen)));
      }

      model->eval();
      double test_loss = 0;
      int64_t correct = 0, total = 0;
      {
        NoGradGuard ng;
        const amp::autocast ac = args.prec.region(device);
        for (const data::Batch& hb : test_loader) {
          const data::Batch b{hb.data.to(device).contiguous(fmt), hb.target.to(device)};
          Tensor logits = model->forward(b.data);
          CrossEntropyOptions sum_opts;
          sum_opts.reduction = Reduction::Sum;
          test_loss += cross_entropy(logits, b.target, sum_opts).item<double>();
          correct += static_cast<int64_t>(
              sum(eq(argmax(logits, 1), b.target).to(DType::i64)).item<double>());
          total += b.size();
        }
      }
      if (ranks > 1) {
        test_loss = distributed::all_reduce_value(test_loss);
        correct = static_cast<int64_t>(distributed::all_reduce_value(static_cast<double>(correct)));
        total = static_cast<int64_t>(distributed::all_reduce_value(static_cast<double>(total)));
      }
      EpochReport r{epoch + 1,
                    train_time,
                    loss_sum / static_cast<double>(nb),
                    test_loss / static_cast<double>(total),
                    100.0 * static_cast<double>(correct) / static_cast<double>(total),
                    static_cast<double>(seen) / train_time};
      reports.push_back(r);
      metrics.add_scalars({{"test/loss", r.test_loss},
                           {"test/acc", r.test_acc},
                           {"train/epoch_loss", r.train_loss},
                           {"train/img_per_s", r.throughput}},
                          step);
      if (!done) ckpt.save(epoch + 1, step);
      std::printf(
          "epoch %lld/%lld  time %.1f s  train loss %.4f  test loss %.4f  "
          "test acc %.2f%%  throughput %.0f img/s\n",
          static_cast<long long>(r.epoch), static_cast<long long>(args.epochs), r.train_time,
          r.train_loss, r.test_loss, r.test_acc, r.throughput);
      std::fflush(stdout);
    }

    if (preempted) return train::kExitRequeue;
    std::printf("%s", chrono.table(args.prec.describe(device)).c_str());
    const train::ChronometerSummary cs = chrono.summary();
    // "backward" in the report is backward + optimizer step, per step (what the PyTorch peer
    // measures as one phase).
    std::vector<double> bwd_step = chrono.phase_times(train::Phase::Backward);
    const std::vector<double>& opt_step = chrono.phase_times(train::Phase::Optimizer);
    for (size_t i = 0; i < bwd_step.size() && i < opt_step.size(); ++i) bwd_step[i] += opt_step[i];
    const train::Stats sd = cs.phases[static_cast<int>(train::Phase::Data)],
                       sf = cs.phases[static_cast<int>(train::Phase::Forward)],
                       sb = train::compute_stats(bwd_step);
    if (!reports.empty())
      metrics.add_hparams(
          {{"lr", args.lr},
           {"batch_size", static_cast<double>(args.batch_size)},
           {"epochs", static_cast<double>(args.epochs)},
           {"weight_decay", args.wd},
           {"momentum", args.mom},
           {"ranks", static_cast<double>(ranks)},
           {"precision", args.prec.precision(device)},
           {"layout", std::string(args.prec.layout())}},
          {{"test/acc", reports.back().test_acc}, {"test/loss", reports.back().test_loss}});
    metrics.flush();
    for (const std::string& path : metrics.paths()) std::printf("metrics: %s\n", path.c_str());
    print_metrics_hint(metrics.paths());

    if (!args.json.empty() && distributed::is_main_process()) {
      nlohmann::json epochs = nlohmann::json::array();
      for (const EpochReport& r : reports)
        epochs.push_back({{"epoch", r.epoch},
                          {"time_s", r.train_time},
                          {"train_loss", r.train_loss},
                          {"test_loss", r.test_loss},
                          {"test_acc", r.test_acc},
                          {"img_per_s", r.throughput}});
      cli::write_json_report(args.json, {{"framework", "dltrain"},
                                         {"device", device.str()},
                                         {"precision", args.prec.precision(device)},
                                         {"layout", args.prec.layout()},
                                         {"loss_scaling", scaler.is_enabled()},
                                         {"ranks", ranks},
                                         {"threads", get_num_threads()},
                                         {"batch_size", args.batch_size},
                                         {"steps", cs.measured_steps},
                                         {"step_ms",
                                          {{"data", 1e3 * sd.median},
                                           {"forward", 1e3 * sf.median},
                                           {"backward", 1e3 * sb.median}}},
                                         {"epochs", epochs}});
      std::printf("wrote %s\n", args.json.c_str());
    }
  } catch (const Error& e) {
    // With several ranks, take the job down so that no rank waits for this one.
    if (distributed::world_size() > 1)
      distributed::abort(std::string("fashion_mnist: ") + e.what());
    std::fprintf(stderr, "fashion_mnist: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
