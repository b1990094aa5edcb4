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
//                 [--optimizer sgd|lars|lamb] [--lr-schedule onecycle|cosine|poly]
//                 [--warmup-epochs E] [--no-bn-weight-decay] [--accumulation-steps K]
// The large-batch lesson (docs/performance.md, "Large batches"): --accumulation-steps K sums
// the gradients of K batches per optimizer step (DDP all-reduces once per step), so the global
// batch is ranks x batch size x K; LARS or LAMB and a warm-up keep such batches trainable.
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
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/common/example_util.hpp"
#include "apps/common/optim_flags.hpp"
#include "apps/common/training.hpp"
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
#include "examples/fashion_mnist/model.hpp"

using namespace dltrain;
using namespace dltrain::apps;

namespace {

struct Args : CommonFlags {
  double wd = 5e-4;
  double mom = 0.9;
  bool sync_bn = false;
  OptimFlags optim;
};

// Parses the flags into an Args (exits with status 2 naming the flag on a bad one).
Args parse(int argc, char** argv) {
  Args a;
  a.data = fashion_mnist::kDefaultData;
  a.epochs = 3;
  cli::Flags f("fashion_mnist",
               "Fashion-MNIST with a small CNN, SGD + momentum and a OneCycle schedule, with the "
               "flags of the IDRIS course script; prints per-epoch figures and the chronometer.");
  a.add_training(f);
  f.add("--wd", &a.wd, "weight decay").min(0);
  f.add("--mom", &a.mom, "momentum (nesterov for SGD; LARS's; LAMB's beta1)").min(0);
  a.optim.add_to(f);
  a.optim.add_accumulation_to(f);
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
  a.parse(f, argc, argv);
  a.optim.check(f);
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  return run_guarded("fashion_mnist", [&]() -> int {
    // A world of one without a launcher; under mpirun/srun, one rank per GPU (cuda:local_rank).
    // Rank 0 reports; the other ranks' stdout is discarded (errors still reach stderr).
    const char* backend = "";
    const Run run = start_run(args, /*data_parallel=*/true, &backend);
    const Device device = run.device;
    const int ranks = run.ranks;
    const data::ImageOptions norm = fashion_mnist::normalization();
    auto t_load = Clock::now();
    auto train_set = std::make_shared<data::MNIST>(args.data, true, norm);
    auto test_set = std::make_shared<data::MNIST>(args.data, false, norm);
    std::printf(
        "Fashion-MNIST from %s: %lld train, %lld test images (loaded in %.2f s), %d threads\n",
        args.data.c_str(), static_cast<long long>(train_set->size()),
        static_cast<long long>(test_set->size()), seconds(t_load, Clock::now()), get_num_threads());

    // Each rank its share of the data, one epoch order over all ranks (the seed's).
    const data::DataLoaderOptions lo = args.loader_options(/*drop_last=*/true);
    data::DataLoaderOptions to;
    to.batch_size = 1000;
    auto train_sampler = std::make_shared<data::DistributedSampler>(train_set->size(), run.rank,
                                                                    ranks, true, args.seed, true);
    std::shared_ptr<data::Sampler> test_sampler;
    if (ranks > 1)
      test_sampler =
          std::make_shared<data::DistributedSampler>(test_set->size(), run.rank, ranks, false);
    data::DataLoader train_loader(train_set, train_sampler, lo);
    data::DataLoader test_loader = test_sampler ? data::DataLoader(test_set, test_sampler, to)
                                                : data::DataLoader(test_set, to);
    const int64_t accum = args.optim.accumulation_steps;
    if (ranks > 1)
      std::printf(
          "data parallel: %d ranks (%s), %lld images per rank and step, global batch %lld\n", ranks,
          backend, static_cast<long long>(args.batch_size * accum),
          static_cast<long long>(args.batch_size * ranks * accum));
    if (accum > 1)
      std::printf(
          "gradient accumulation: %lld batches of %lld per optimizer step and rank, global batch "
          "%lld\n",
          static_cast<long long>(accum), static_cast<long long>(args.batch_size),
          static_cast<long long>(args.batch_size * ranks * accum));

    auto model = fashion_mnist::make_model();
    model->to(device);
    const MemoryFormat fmt = args.prec.format();
    model->to(fmt);
    std::printf("model: %lld parameters\n%s\n", static_cast<long long>(model->num_parameters()),
                model->str().c_str());
    std::printf("%s\n", args.prec.describe(device).c_str());
    if (args.sync_bn) distributed::convert_sync_batchnorm(model);
    // Broadcasts rank 0's weights; in a world of one the reduction is the identity.
    distributed::DistributedDataParallel ddp(model);
    // SGD with Nesterov momentum and OneCycle by default; --optimizer, --lr-schedule,
    // --warmup-epochs, --no-bn-weight-decay and --accumulation-steps for the large-batch lesson.
    const std::unique_ptr<optim::Optimizer> optimizer =
        args.optim.make_optimizer(*model, args.lr, args.mom, args.wd, /*nesterov=*/true);
    optim::Optimizer& opt = *optimizer;
    // Optimizer steps (the epoch's last accumulation cycle may be short).
    const int64_t steps_per_epoch = (train_loader.size() + accum - 1) / accum;
    // --test runs the first --test-nsteps steps of the full run, its schedule included.
    const int64_t total_steps = steps_per_epoch * args.epochs;
    const std::unique_ptr<optim::LRScheduler> schedule =
        args.optim.make_schedule(opt, args.lr, total_steps, steps_per_epoch);
    optim::LRScheduler& sched = *schedule;
    std::printf("optimizer: %s\n", args.optim.describe(opt).c_str());
    nn::CrossEntropyLoss criterion;
    amp::GradScaler scaler(args.prec.scaler_options(device));

    // The course's chronometer: on a GPU its marks wait for the device, so each phase is charged
    // the GPU work it queued.
    train::Chronometer chrono({.device = device});
    std::vector<nlohmann::json> epochs;
    std::map<std::string, double> final_figures;  // the last epoch's, for the hparams
    train::CheckpointFile ckpt(
        args.checkpoint, *model, opt, sched, scaler,
        {.global_batch = args.batch_size * ranks * accum,
         .metadata = {{"example", "fashion_mnist"}, {"ranks", std::to_string(ranks)}},
         .lr_scaling = args.lr_scaling()});
    const train::ResumePosition start = ckpt.resume(args.resume);
    bool preempted = false;
    MetricsLog metrics(args);
    train::Progress progress(progress_options(args, train_loader.size(), /*test_every=*/10));
    // --profile: a few training steps after warm-up, rank 0 only.
    train::ProfileWindow profiler(args.prof.window(distributed::is_main_process()));
    train::TrainStep train_step(opt, scaler,
                                step_options(args.prec, device, &sched, start.step, &chrono,
                                             &profiler, &progress, &metrics));
    train_step.set_accumulation(accum, train_loader.size(), [&](const std::function<void()>& f) {
      auto guard = ddp.no_sync();
      f();
    });
    bool done = args.test && start.step >= args.test_nsteps;
    for (int64_t epoch = start.epoch; epoch < args.epochs && !done; ++epoch) {
      train_step.begin_epoch(*model, epoch, ckpt.begin_epoch(train_loader, epoch));
      for (const data::Batch& hb : train_loader) {
        const data::Batch b{hb.data.to(device, args.non_blocking).contiguous(fmt),
                            hb.target.to(device, args.non_blocking)};
        train_step.data_ready();
        train_step.run(b.size(), [&] { return criterion(ddp(b.data), b.target); });
        if (!train_step.at_boundary()) {  // inside an accumulation cycle: nothing to save yet
          train_step.begin();
          continue;
        }
        const int64_t step = train_step.step(), nb = train_step.batches();
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
        train_step.begin();
      }
      train::EpochTally train = train_step.end_epoch();
      if (preempted) break;
      train.all_reduce();  // global figures: over the ranks
      const int64_t step = train_step.step();

      train::ClassifierFigures test =
          train::evaluate_classifier(*model, test_loader, args.prec.evaluate_options(device));
      test.all_reduce();  // over the ranks' shares
      const double train_loss = train.mean_loss(), throughput = train.throughput();
      epochs.push_back({{"epoch", epoch + 1},
                        {"time_s", train.seconds},
                        {"train_loss", train_loss},
                        {"test_loss", test.loss()},
                        {"test_acc", test.accuracy()},
                        {"img_per_s", throughput}});
      final_figures = {{"test/acc", test.accuracy()}, {"test/loss", test.loss()}};
      metrics.epoch({{"test/loss", test.loss()},
                     {"test/acc", test.accuracy()},
                     {"train/epoch_loss", train_loss},
                     {"train/img_per_s", throughput}},
                    step);
      if (!done) ckpt.save(epoch + 1, step);
      std::printf(
          "epoch %lld/%lld  time %.1f s  train loss %.4f  test loss %.4f  "
          "test acc %.2f%%  throughput %.0f img/s\n",
          static_cast<long long>(epoch + 1), static_cast<long long>(args.epochs), train.seconds,
          train_loss, test.loss(), test.accuracy(), throughput);
      std::fflush(stdout);
    }

    if (preempted) return train::kExitRequeue;
    std::printf("%s", chrono.table(args.prec.describe(device)).c_str());
    metrics.finish({{"lr", args.lr},
                    {"batch_size", static_cast<double>(args.batch_size)},
                    {"epochs", static_cast<double>(args.epochs)},
                    {"weight_decay", args.wd},
                    {"momentum", args.mom},
                    {"optimizer", args.optim.optimizer},
                    {"lr_schedule", args.optim.lr_schedule},
                    {"warmup_epochs", args.optim.warmup_epochs},
                    {"accumulation_steps", static_cast<double>(accum)},
                    {"ranks", static_cast<double>(ranks)},
                    {"precision", args.prec.precision(device)},
                    {"layout", std::string(args.prec.layout())}},
                   final_figures);
    // "backward" in step_ms is backward + optimizer step, per step (what the PyTorch peer
    // measures as one phase).
    nlohmann::json report = report_header(args, device, scaler);
    report.update({{"ranks", ranks},
                   {"lr", args.lr},
                   {"seed", args.seed},
                   {"optimizer", args.optim.optimizer},
                   {"lr_schedule", args.optim.lr_schedule},
                   {"warmup_epochs", args.optim.warmup_epochs},
                   {"accumulation_steps", accum},
                   {"global_batch", args.batch_size * ranks * accum},
                   {"steps", chrono.summary().measured_steps},
                   {"step_ms", step_ms(chrono)},
                   {"epochs", epochs}});
    write_report(args, report);
    return 0;
  });
}
