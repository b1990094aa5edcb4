// ResNet-50 on an ImageNet-style JPEG folder (DIR/train/<class>/*.JPEG, DIR/val/<class>/...),
// in the shape of the IDRIS "Deep Learning Optimise" course script: the same flags,
// CrossEntropy with label smoothing, SGD with momentum and a OneCycle schedule (or, for the
// large-batch lesson, LARS or LAMB, a cosine or polynomial schedule after a linear warm-up, and
// no weight decay on normalisation weights and biases),
// RandomResizedCrop + flip for training and Resize + CenterCrop for validation (decoded
// straight into u8 NHWC batches by the loader's workers, normalised on the training device),
// validation at each epoch end, a chronometer of per-step data / forward / backward+step times
// (min, median, std; with --test the GPU is synchronised at each mark), the peak device memory,
// printing ten times per epoch, and a checkpoint at each epoch end. Under `mpirun -np N` or `srun`
// it is the course's DDP script: one rank per GPU, each with its share of the images
// (DistributedSampler) and --batch-size images per step (global batch N x batch size), gradients
// averaged by DistributedDataParallel, rank 0 printing and writing the checkpoint (slurm/ has job
// files).
//
//   resnet50 --data DIR [--arch resnet50] [--batch-size 64] [--epochs 1] [--image-size 224]
//            [--lr 0.1] [--wd 5e-5] [--mom 0.9] [--label-smoothing 0.1] [--seed 0]
//            [--test] [--test-nsteps 50] [--num-workers 4] [--persistent-workers]
//            [--pin-memory] [--non-blocking] [--prefetch-factor 2] [--no-drop-last]
//            [--device cpu|cuda[:N]] [--channels-last] [--amp [--amp-dtype f16|bf16]]
//            [--threads N] [--json PATH] [--checkpoint PATH [--resume] [--checkpoint-every N]]
//            [--accumulation-steps K] [--checkpoint-activations N]
//            [--auto-augment trivial|rand|imagenet] [--random-erasing P [--random-erasing-value
//            mean|random]] [--mixup A] [--cutmix A]
//            [--optimizer sgd|lars|lamb] [--lr-schedule onecycle|cosine|poly]
//            [--warmup-epochs E] [--no-bn-weight-decay] [--recipe mlperf]
//            [--ema DECAY [--ema-warmup] [--ema-every K]] [--zero 1|2]
//            [--metrics FILE.csv|FILE.jsonl] [--tensorboard DIR]
//            [--profile FILE.json [--profile-steps 5] [--profile-warmup 2] [--profile-shapes]]
//
// The loop is the examples' common one (apps/common/training.hpp): train::Chronometer
// (device-synchronised marks on a GPU with --test only), train::Progress lines, --metrics /
// --tensorboard through train::MetricsWriter (every step's loss and learning rate, each epoch's
// validation figures, the hyper-parameters at the end; rank 0 writes, a resumed run appends).
//
// With --checkpoint, the state is saved at each epoch end (and every N steps with
// --checkpoint-every), and SIGUSR1 or SIGTERM (Slurm's wall-time warning, preemption, scancel)
// saves it at the next step boundary and exits with status 75 (train::kExitRequeue), which the
// job files in slurm/ turn into a requeue; --resume continues from the file mid-epoch.
//
// --accumulation-steps K sums the gradients of K batches per optimizer step (DDP all-reduces
// only the last: no_sync), so the global batch is ranks x batch size x K; the schedule, --test's
// step count and the checkpoints count optimizer steps. --checkpoint-activations N recomputes the
// stem and the residual blocks (in N segments, nn::checkpoint_sequential) during backward instead
// of keeping their activations: memory for time (benchmarks/memory measures both).
//
// --auto-augment and --random-erasing add data::augment.hpp's transforms to the training
// pipeline after the crop and flip (ImagePipeline::augment); --mixup / --cutmix mix each
// normalised training batch (data::MixUp, data::CutMix) into soft labels for the loss.
//
// --ema DECAY keeps an exponential moving average of the weights (optim::ModelEMA), updated after
// each optimizer step, validated beside the model at each epoch end ("val acc (EMA)") and saved
// in the checkpoint's /extra/ema, so a resumed run continues the same average.
//
// --zero 1 shards the optimizer state over the ranks (distributed::ZeroRedundancyOptimizer
// around the chosen optimizer), --zero 2 the gradients too (DDP reduce-scatters them); the
// checkpoint holds the consolidated state, which resumes on any number of ranks.
//
// --amp runs forward and loss under autocast: f16 with a GradScaler on a GPU, bf16 on the CPU
// (--amp-dtype chooses; f16 always comes with loss scaling).
//
// On a GPU, --non-blocking copies each batch on a side stream while the previous step
// computes (data::DevicePrefetcher); without it the copy is synchronous. Make an
// ImageNet-shaped folder on any machine with tools/dltrain-make-images (train and --val).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "apps/common/augment_flags.hpp"
#include "apps/common/example_util.hpp"
#include "apps/common/optim_flags.hpp"
#include "apps/common/training.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/io/checkpoint.hpp"
#include "dltrain/train/chronometer.hpp"
#include "dltrain/train/preemption.hpp"
#include "dltrain/train/progress.hpp"

using namespace dltrain;
using namespace dltrain::apps;
namespace fs = std::filesystem;

namespace {

struct Args : CommonFlags {
  std::string arch = "resnet50";
  int64_t image_size = 224;
  double wd = 5e-5;
  double mom = 0.9;
  double label_smoothing = 0.1;
  bool drop_last = true;
  int64_t checkpoint_every = 0;
  int64_t checkpoint_activations = 0;
  AugmentFlags aug;
  OptimFlags optim;
  EmaFlags ema;
  std::string recipe = "none";
};

// --recipe mlperf: MLPerf's ResNet-50 reference recipe on ImageNet (LARS at a global batch of
// about 3,200: learning rate 11, 2 warm-up epochs, then a polynomial decay of power 2 to 1e-4,
// momentum 0.9, weight decay 5e-5 outside BatchNorm and biases, which LARS does not adapt
// either, label smoothing 0.1, 35 epochs). A flag given on the command line wins over the
// recipe's value (scale --lr with the global batch when it differs from 3,200).
void apply_recipe(Args& a, const cli::Flags& f) {
  if (a.recipe != "mlperf") return;
  auto set = [&f](const char* flag, auto& field, auto value) {
    if (!f.given(flag)) field = value;
  };
  set("--optimizer", a.optim.optimizer, std::string("lars"));
  set("--lr-schedule", a.optim.lr_schedule, std::string("poly"));
  set("--warmup-epochs", a.optim.warmup_epochs, 2.0);
  set("--no-bn-weight-decay", a.optim.no_bn_weight_decay, true);
  set("--lr", a.lr, 11.0);
  set("--mom", a.mom, 0.9);
  set("--wd", a.wd, 5e-5);
  set("--label-smoothing", a.label_smoothing, 0.1);
  set("--epochs", a.epochs, int64_t{35});
  a.optim.poly_end_lr = 1e-4;
}

// Parses the flags into an Args (exits with status 2 naming the flag on a bad one).
Args parse(int argc, char** argv) {
  Args a;
  a.batch_size = 64;
  a.wd = 5e-5;
  a.num_workers = 4;
  cli::Flags f("resnet50",
               "ResNet-50 on an ImageNet-style JPEG folder, the IDRIS course script's flags: "
               "SGD + OneCycle (or LARS/LAMB, cosine/poly after a warm-up), label smoothing, "
               "validation each epoch, the chronometer; data "
               "parallel under mpirun or srun. On a GPU the chronometer waits for the device at "
               "each phase mark only with --test (per-phase GPU times, at the cost of the "
               "overlap of host, GPU and the prefetcher's copies); otherwise it reads the host "
               "clock alone and the epoch times are the figures to quote.");
  a.add_training(f);
  f.add("--arch", &a.arch, "torchvision ResNet name (resnet18, resnet34, resnet50, ...)");
  f.add("--image-size", &a.image_size, "training crop size (validation: resize 256/224, crop)")
      .positive();
  f.add("--wd", &a.wd, "weight decay").min(0);
  f.add("--mom", &a.mom, "momentum").min(0);
  f.add("--label-smoothing", &a.label_smoothing, "label smoothing of the cross-entropy").min(0);
  a.optim.add_to(f);
  a.ema.add_to(f);
  f.add("--recipe", &a.recipe,
        "mlperf: MLPerf's ResNet-50 recipe (LARS, lr 11, 2 warm-up epochs, poly power 2 to "
        "1e-4, no decay on BN/bias, label smoothing 0.1, 35 epochs); flags given win")
      .choices({"none", "mlperf"});
  a.optim.add_accumulation_to(f);
  a.aug.add_to(f, "the mean, as after torchvision's Normalize");
  a.add_test(f);
  a.add_data(f, "DIR/train/<class>/*.JPEG and DIR/val/<class>/*.JPEG").required();
  a.add_loader(f);
  f.add_switch("--drop-last", &a.drop_last, "drop the last incomplete batch of an epoch", true);
  a.add_device(f);
  a.prec.add_to(f);
  f.add("--checkpoint-activations", &a.checkpoint_activations,
        "activation checkpointing: recompute the stem and the residual blocks in backward, "
        "in N segments (0: off; the number of blocks saves the most memory)")
      .min(0);
  a.optim.add_zero_to(f);
  a.add_checkpoint(f);
  f.add("--checkpoint-every", &a.checkpoint_every, "also save every N steps (0: epoch ends only)")
      .min(0);
  a.add_report(f);
  a.prof.add_to(f);
  a.parse(f, argc, argv);
  apply_recipe(a, f);
  a.optim.check(f);
  a.ema.check(f);
  a.aug.check(f);
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return run_guarded("resnet50", [&]() -> int {
    // A world of one without a launcher; under mpirun/srun, one rank per GPU (cuda:local_rank),
    // each with its share of the images and --batch-size images per step.
    const char* backend = "";
    const Run run = start_run(args, /*data_parallel=*/true, &backend);
    const Device device = run.device;
    const int ranks = run.ranks;
    const bool gpu = run.gpu();
    auto mark = [gpu] {
      if (gpu) cuda::synchronize();
      return Clock::now();
    };
    const MemoryFormat fmt = args.prec.format();

    // Data: workers decode + augment into u8 NHWC; normalisation happens on `device`.
    const fs::path root(args.data);
    data::ImageFolderOptions train_opts;
    train_opts.transform = data::ImagePipeline::train(args.image_size);
    if (args.aug.auto_augment != "none")
      train_opts.transform.augment.push_back(data::make_auto_augment(args.aug.auto_augment));
    if (auto erase = args.aug.make_random_erasing(data::kImageNetMean, data::kImageNetStd))
      train_opts.transform.augment.push_back(erase);
    for (const auto& a : train_opts.transform.augment)
      std::printf("augment: %s\n", a->repr().c_str());
    train_opts.seed = args.seed;
    auto train_set = std::make_shared<data::ImageFolder>((root / "train").string(), train_opts);
    std::shared_ptr<data::ImageFolder> val_set;
    if (fs::is_directory(root / "val")) {
      data::ImageFolderOptions val_opts;
      val_opts.transform = data::ImagePipeline::eval(args.image_size * 256 / 224, args.image_size);
      val_set = std::make_shared<data::ImageFolder>((root / "val").string(), val_opts);
    }
    // Each rank its share of the images, one epoch order over all ranks (the seed's).
    const data::DataLoaderOptions lo = args.loader_options(args.drop_last);
    auto train_sampler = std::make_shared<data::DistributedSampler>(
        train_set->size(), run.rank, ranks, true, args.seed, args.drop_last);
    data::DataLoader train_loader(train_set, train_sampler, lo);
    std::shared_ptr<data::DataLoader> val_loader;
    if (val_set) {
      data::DataLoaderOptions vo = lo;
      vo.shuffle = false;
      vo.drop_last = false;
      val_loader = ranks > 1 ? std::make_shared<data::DataLoader>(
                                   val_set,
                                   std::make_shared<data::DistributedSampler>(
                                       val_set->size(), run.rank, ranks, false),
                                   vo)
                             : std::make_shared<data::DataLoader>(val_set, vo);
    }
    const int64_t accum = args.optim.accumulation_steps;
    if (ranks > 1)
      std::printf(
          "data parallel: %d ranks (%s), %lld images per rank and step, global batch %lld\n", ranks,
          backend, static_cast<long long>(args.batch_size * accum),
          static_cast<long long>(args.batch_size * ranks * accum));
    if (accum > 1)
      std::printf("gradient accumulation: %lld batches of %lld per optimizer step and rank\n",
                  static_cast<long long>(accum), static_cast<long long>(args.batch_size));
    std::printf(
        "%s: %lld training images in %zu classes, %s validation images; batch %lld, "
        "%lld workers, device %s, %s\n",
        args.data.c_str(), static_cast<long long>(train_set->size()), train_set->classes().size(),
        val_set ? std::to_string(val_set->size()).c_str() : "no",
        static_cast<long long>(args.batch_size), static_cast<long long>(args.num_workers),
        device.str().c_str(), args.prec.describe(device).c_str());

    // Runs fn(images, labels) on each batch of `loader` moved to the device and normalised;
    // fn returns false to stop. With --non-blocking on a GPU the copy overlaps the previous
    // step (DevicePrefetcher); otherwise it is synchronous.
    auto for_each_batch = [&](const data::DataLoader& loader,
                              const std::function<bool(const Tensor&, const Tensor&)>& fn) {
      auto run = [&](const data::Batch& b) {
        const Tensor x = data::to_float_batch(b.data, data::kImageNetMean, data::kImageNetStd, fmt);
        return fn(x, b.target);
      };
      if (gpu && args.non_blocking) {
        for (const data::Batch& b : data::DevicePrefetcher(loader, device))
          if (!run(b)) return;
      } else {
        for (const data::Batch& hb : loader)
          if (!run({hb.data.to(device), hb.target.to(device)})) return;
      }
    };

    models::ResNetOptions mo;
    mo.num_classes = static_cast<int64_t>(train_set->classes().size());
    auto model = models::resnet(args.arch, mo);
    model->to(device);
    model->to(fmt);
    model->checkpoint_segments = args.checkpoint_activations;
    if (args.checkpoint_activations > 0)
      std::printf("activation checkpointing: stem and %zu residual blocks in %lld segments\n",
                  model->blocks().size(), static_cast<long long>(args.checkpoint_activations));
    std::printf("model: %s, %lld parameters\n", args.arch.c_str(),
                static_cast<long long>(model->num_parameters()));
    // --optimizer, --no-bn-weight-decay, --lr-schedule, --warmup-epochs (the large-batch lesson).
    const std::unique_ptr<optim::Optimizer> optimizer =
        args.optim.make_optimizer(*model, args.lr, args.mom, args.wd);
    optim::Optimizer& opt = *optimizer;
    // Optimizer steps (batches with --accumulation-steps 1; the epoch's last cycle may be short).
    const int64_t steps_per_epoch = (train_loader.size() + accum - 1) / accum;
    // --test runs the first --test-nsteps steps of the full run, its schedule included.
    const int64_t total_steps = steps_per_epoch * args.epochs;
    const std::unique_ptr<optim::LRScheduler> schedule =
        args.optim.make_schedule(opt, args.lr, total_steps, steps_per_epoch);
    optim::LRScheduler& sched = *schedule;
    std::printf("optimizer: %s\n", args.optim.describe(opt).c_str());
    // --ema: the weights' moving average, updated after each optimizer step, checkpointed.
    const std::unique_ptr<optim::ModelEMA> ema = args.ema.make(*model);
    if (ema) std::printf("%s\n", args.ema.describe().c_str());
    nn::CrossEntropyLoss criterion({.label_smoothing = args.label_smoothing});
    // --mixup / --cutmix: soft labels [N, classes] from the batch rolled by one (torchvision v2;
    // with both, one of the two per batch, as its recipe's RandomChoice), drawn per rank.
    Generator mix_gen(args.seed * 1000003 + static_cast<uint64_t>(run.rank) + 1);
    const AugmentFlags::Mix mix = args.aug.make_mix(mo.num_classes, mix_gen);
    amp::GradScaler scaler(args.prec.scaler_options(device));
    // --zero 2: gradients reduce-scattered to the ranks that own them in the optimizer's
    // partition (ZeRO-2); --zero 1 shards the optimizer state only (the optimizer's business).
    distributed::DistributedDataParallel ddp(model,
                                             {.shard_gradients = args.optim.shard_gradients(opt)});

    std::vector<nlohmann::json> epochs;
    std::map<std::string, double> final_figures;  // the last epoch's, for the hparams
    train::CheckpointFile ckpt(
        args.checkpoint, *model, opt, sched, scaler,
        {.global_batch = args.batch_size * ranks * accum,
         .metadata = {{"example", "resnet50"},
                      {"arch", args.arch},
                      {"optimizer", args.optim.optimizer},
                      {"lr_schedule", args.optim.lr_schedule},
                      {"ranks", std::to_string(ranks)}},
         .lr_scaling = args.lr_scaling(),
         .extra = ema ? std::vector<io::ExtraState>{io::ExtraState::of("ema", *ema)}
                      : std::vector<io::ExtraState>{}});
    const train::ResumePosition start = ckpt.resume(args.resume);
    bool preempted = false;
    // The course's chronometer: on a GPU with --test its marks wait for the device, so each phase
    // is charged the GPU work it queued; a full run does not synchronise (six device-wide waits
    // per step would serialise host and device and stall the prefetcher's copies), so its phase
    // times are the host's. --profile: a few training steps after warm-up, rank 0 only.
    train::Chronometer chrono({.device = device, .synchronize = args.test});
    train::ProfileWindow profiler(args.prof.window(distributed::is_main_process()));
    MetricsLog metrics(args);
    train::Progress progress(progress_options(args, train_loader.size(), /*test_every=*/1));
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
      for_each_batch(train_loader, [&](const Tensor& x, const Tensor& y) {
        train_step.data_ready();
        if (mix) {
          const data::MixedBatch m = mix(x, y);
          const Tensor xm = m.images.contiguous(fmt);
          train_step.run(x.size(0), [&] { return criterion(ddp(xm), m.labels); });
        } else {
          train_step.run(x.size(0), [&] { return criterion(ddp(x), y); });
        }
        if (!train_step.at_boundary()) {  // inside an accumulation cycle: nothing to save yet
          train_step.begin();
          return true;
        }
        if (ema) ema->update(*model);
        const int64_t step = train_step.step(), nb = train_step.batches();
        // Slurm's wall-time signal or a preemption: saved, stop (every rank at this step).
        if (ckpt.stop_for_requeue(epoch, step, train_loader, nb)) {
          preempted = done = true;
          return false;
        }
        if (args.test && step >= args.test_nsteps) {
          done = true;
          ckpt.save(epoch, step, train_loader, nb);
          return false;
        }
        if (args.checkpoint_every > 0 && step % args.checkpoint_every == 0)
          ckpt.save(epoch, step, train_loader, nb);
        train_step.begin();
        return true;
      });
      train::EpochTally train = train_step.end_epoch();
      if (preempted) break;
      train.all_reduce();  // global figures: over the ranks
      const int64_t step = train_step.step();
      const double train_time = train.seconds, train_loss = train.mean_loss(),
                   throughput = train.throughput();

      // Top-1 accuracy (%) of the model as it stands on the validation set, over all ranks.
      auto validate = [&] {
        model->eval();
        NoGradGuard ng;
        const amp::autocast ac = args.prec.region(device);
        int64_t correct = 0, total = 0;
        Tensor hits = zeros({}, TensorOptions(DType::i64).with_device(device));
        for_each_batch(*val_loader, [&](const Tensor& x, const Tensor& y) {
          hits = add(hits, sum(eq(argmax(model->forward(x), 1), y).to(DType::i64)));
          total += x.size(0);
          return true;
        });
        correct = hits.item<int64_t>();
        if (ranks > 1) {
          correct =
              static_cast<int64_t>(distributed::all_reduce_value(static_cast<double>(correct)));
          total = static_cast<int64_t>(distributed::all_reduce_value(static_cast<double>(total)));
        }
        return 100.0 * static_cast<double>(correct) / static_cast<double>(total);
      };
      double val_acc = -1, val_time = 0, val_acc_ema = -1;
      if (val_loader) {
        const auto v0 = mark();
        val_acc = validate();
        val_time = seconds(v0, mark());
        if (ema) {  // the averaged weights, the model's own kept aside
          optim::EMAScope scope(*ema, *model);
          val_acc_ema = validate();
        }
      }
      epochs.push_back({{"epoch", epoch + 1},
                        {"train_s", train_time},
                        {"img_per_s", throughput},
                        {"train_loss", train_loss},
                        {"val_s", val_time},
                        {"val_acc", val_acc}});
      if (ema) epochs.back()["val_acc_ema"] = val_acc_ema;
      std::map<std::string, double> figures = {{"train/epoch_loss", train_loss},
                                               {"train/img_per_s", throughput}};
      if (val_loader) {
        figures["val/acc"] = val_acc;
        final_figures = {{"val/acc", val_acc}};
        if (ema) figures["val/acc_ema"] = final_figures["val/acc_ema"] = val_acc_ema;
      }
      metrics.epoch(figures, step);
      if (!done) ckpt.save(epoch + 1, step);
      std::printf("epoch %lld/%lld  train %.1f s (%.1f img/s)  train loss %.4f",
                  static_cast<long long>(epoch + 1), static_cast<long long>(args.epochs),
                  train_time, throughput, train_loss);
      if (val_loader && ema)
        std::printf("  val %.1f s  val acc %.2f%%  val acc (EMA) %.2f%%\n", val_time, val_acc,
                    val_acc_ema);
      else if (val_loader)
        std::printf("  val %.1f s  val acc %.2f%%\n", val_time, val_acc);
      else
        std::printf("  (no val/ folder)\n");
      std::fflush(stdout);
    }

    if (preempted) return train::kExitRequeue;
    const std::string title =
        gpu && !args.test
            ? args.prec.describe(device) +
                  " (host-side phase times, the GPU not waited for; --test for the GPU's)"
            : args.prec.describe(device);
    std::printf("%s", chrono.table(title).c_str());
    if (gpu)
      std::printf("max memory allocated on %s: %.1f MiB\n", device.str().c_str(),
                  static_cast<double>(cuda::max_memory_allocated(device.index)) / (1 << 20));
    metrics.finish({{"lr", args.lr},
                    {"batch_size", static_cast<double>(args.batch_size)},
                    {"epochs", static_cast<double>(args.epochs)},
                    {"weight_decay", args.wd},
                    {"momentum", args.mom},
                    {"label_smoothing", args.label_smoothing},
                    {"image_size", static_cast<double>(args.image_size)},
                    {"ranks", static_cast<double>(ranks)},
                    {"arch", args.arch},
                    {"optimizer", args.optim.optimizer},
                    {"lr_schedule", args.optim.lr_schedule},
                    {"warmup_epochs", args.optim.warmup_epochs},
                    {"no_bn_weight_decay", args.optim.no_bn_weight_decay ? 1.0 : 0.0},
                    {"ema", args.ema.decay},
                    {"precision", args.prec.precision(device)},
                    {"layout", std::string(args.prec.layout())}},
                   final_figures);

    nlohmann::json report = report_header(args, device, scaler);
    report.update({{"arch", args.arch},
                   {"ranks", ranks},
                   {"image_size", args.image_size},
                   {"steps", chrono.summary().measured_steps},
                   {"step_ms", step_ms(chrono)},
                   {"max_memory_allocated", gpu ? cuda::max_memory_allocated(device.index) : 0},
                   {"epochs", epochs}});
    write_report(args, report);
    return 0;
  });
}
