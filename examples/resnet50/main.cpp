// ResNet-50 on an ImageNet-style JPEG folder (DIR/train/<class>/*.JPEG, DIR/val/<class>/...),
// in the shape of the IDRIS "Deep Learning Optimise" course script: the same flags,
// CrossEntropy with label smoothing, SGD with momentum and a OneCycle schedule,
// RandomResizedCrop + flip for training and Resize + CenterCrop for validation (decoded
// straight into u8 NHWC batches by the loader's workers, normalised on the training device),
// validation at each epoch end, a chronometer of per-step data / forward / backward+step times
// (min, median, std; the GPU is synchronised at each mark), the peak device memory, printing
// ten times per epoch, and a checkpoint at each epoch end. Under `mpirun -np N` or `srun` it is the
// course's DDP script: one rank per GPU, each with its share of the images (DistributedSampler)
// and --batch-size images per step (global batch N x batch size), gradients averaged by
// DistributedDataParallel, rank 0 printing and writing the checkpoint (slurm/ has job files).
//
//   resnet50 --data DIR [--arch resnet50] [--batch-size 64] [--epochs 1] [--image-size 224]
//            [--lr 0.1] [--wd 5e-5] [--mom 0.9] [--label-smoothing 0.1] [--seed 0]
//            [--test] [--test-nsteps 50] [--num-workers 4] [--persistent-workers]
//            [--pin-memory] [--non-blocking] [--prefetch-factor 2] [--no-drop-last]
//            [--device cpu|cuda[:N]] [--channels-last] [--amp [--amp-dtype f16|bf16]]
//            [--threads N] [--json PATH] [--checkpoint PATH [--resume] [--checkpoint-every N]]
//            [--profile FILE.json [--profile-steps 5] [--profile-warmup 2] [--profile-shapes]]
//
// With --checkpoint, the state is saved at each epoch end (and every N steps with
// --checkpoint-every), and SIGUSR1 or SIGTERM (Slurm's wall-time warning, preemption, scancel)
// saves it at the next step boundary and exits with status 75 (train::kExitRequeue), which the
// job files in slurm/ turn into a requeue; --resume continues from the file mid-epoch.
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

#include "dltrain/dltrain.hpp"
#include "dltrain/io/checkpoint.hpp"
#include "dltrain/train/preemption.hpp"
#include "examples/common/example_util.hpp"

using namespace dltrain;
using namespace dltrain::examples;
namespace fs = std::filesystem;

namespace {

struct Args : CommonFlags {
  std::string arch = "resnet50";
  int64_t image_size = 224;
  double wd = 5e-5;
  double mom = 0.9;
  double label_smoothing = 0.1;
  bool drop_last = true;
  PrecisionFlags prec;
  ProfileFlags prof;
  int64_t checkpoint_every = 0;
};

// Parses the flags into an Args (exits with status 2 naming the flag on a bad one).
Args parse(int argc, char** argv) {
  Args a;
  a.batch_size = 64;
  a.wd = 5e-5;
  a.num_workers = 4;
  cli::Flags f("resnet50",
               "ResNet-50 on an ImageNet-style JPEG folder, the IDRIS course script's flags: "
               "SGD + OneCycle, label smoothing, validation each epoch, the chronometer; data "
               "parallel under mpirun or srun.");
  a.add_training(f);
  f.add("--arch", &a.arch, "torchvision ResNet name (resnet18, resnet34, resnet50, ...)");
  f.add("--image-size", &a.image_size, "training crop size (validation: resize 256/224, crop)")
      .positive();
  f.add("--wd", &a.wd, "weight decay").min(0);
  f.add("--mom", &a.mom, "momentum").min(0);
  f.add("--label-smoothing", &a.label_smoothing, "label smoothing of the cross-entropy").min(0);
  a.add_test(f);
  a.add_data(f, "DIR/train/<class>/*.JPEG and DIR/val/<class>/*.JPEG").required();
  a.add_loader(f);
  f.add_switch("--drop-last", &a.drop_last, "drop the last incomplete batch of an epoch", true);
  a.add_device(f);
  a.prec.add_to(f);
  a.add_checkpoint(f);
  f.add("--checkpoint-every", &a.checkpoint_every, "also save every N steps (0: epoch ends only)")
      .min(0);
  a.add_report(f, /*with_metrics=*/false);
  a.prof.add_to(f);
  f.parse(argc, argv);
  a.check(f);
  a.prec.check(f);
  a.prof.check(f);
  return a;
}

struct EpochReport {
  int64_t epoch;
  double train_time, throughput, train_loss, val_time, val_acc;
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    if (args.threads > 0) set_num_threads(args.threads);
    manual_seed(args.seed);
    Device device = args.parsed_device();
    // A world of one without a launcher; under mpirun/srun, one rank per GPU (cuda:local_rank),
    // each with its share of the images and --batch-size images per step.
    distributed::ProcessGroup& world = distributed::init({.use_gpu = device.is_cuda()});
    const int ranks = world.size();
    if (device.is_cuda() && args.device == "cuda") device = distributed::device();
    if (!distributed::is_main_process()) (void)std::freopen("/dev/null", "w", stdout);
    const bool gpu = device.is_cuda();
    if (gpu) cuda::set_device(device.index);
    auto mark = [gpu] {
      if (gpu) cuda::synchronize();
      return Clock::now();
    };
    const MemoryFormat fmt = args.prec.format();

    // Data: workers decode + augment into u8 NHWC; normalisation happens on `device`.
    const fs::path root(args.data);
    data::ImageFolderOptions train_opts;
    train_opts.transform = data::ImagePipeline::train(args.image_size);
    train_opts.seed = args.seed;
    auto train_set = std::make_shared<data::ImageFolder>((root / "train").string(), train_opts);
    std::shared_ptr<data::ImageFolder> val_set;
    if (fs::is_directory(root / "val")) {
      data::ImageFolderOptions val_opts;
      val_opts.transform = data::ImagePipeline::eval(args.image_size * 256 / 224, args.image_size);
      val_set = std::make_shared<data::ImageFolder>((root / "val").string(), val_opts);
    }
    data::DataLoaderOptions lo;
    lo.batch_size = args.batch_size;
    lo.shuffle = true;
    lo.drop_last = args.drop_last;
    lo.seed = args.seed;
    lo.num_workers = args.num_workers;
    lo.prefetch_factor = args.prefetch_factor;
    lo.pin_memory = args.pin_memory;
    lo.persistent_workers = args.persistent_workers;
    // One epoch order over all ranks (the seed's), also for one process: a checkpoint then
    // resumes on any number of ranks where it stopped.
    lo.shuffle = false;  // the DistributedSampler shuffles
    auto train_sampler = std::make_shared<data::DistributedSampler>(
        train_set->size(), world.rank(), ranks, true, args.seed, args.drop_last);
    data::DataLoader train_loader(train_set, train_sampler, lo);
    std::shared_ptr<data::DataLoader> val_loader;
    if (val_set) {
      data::DataLoaderOptions vo = lo;
      vo.shuffle = false;
      vo.drop_last = false;
      val_loader = ranks > 1 ? std::make_shared<data::DataLoader>(
                                   val_set,
                                   std::make_shared<data::DistributedSampler>(
                                       val_set->size(), world.rank(), ranks, false),
                                   vo)
                             : std::make_shared<data::DataLoader>(val_set, vo);
    }
    if (ranks > 1)
      std::printf(
          "data parallel: %d ranks (%s), %lld images per rank and step, global batch %lld\n", ranks,
          world.backend(), static_cast<long long>(args.batch_size),
          static_cast<long long>(args.batch_size * ranks));
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
    std::printf("model: %s, %lld parameters\n", args.arch.c_str(),
                static_cast<long long>(model->num_parameters()));
    optim::SGD opt(model->parameters(),
                   {.lr = args.lr, .momentum = args.mom, .weight_decay = args.wd});
    const int64_t steps_per_epoch = train_loader.size();
    // --test runs the first --test-nsteps steps of the full run, its schedule included.
    const int64_t total_steps = steps_per_epoch * args.epochs;
    optim::OneCycleLR sched(opt, args.lr, total_steps);
    nn::CrossEntropyLoss criterion({.label_smoothing = args.label_smoothing});
    amp::GradScaler scaler(args.prec.scaler_options(device));
    distributed::DistributedDataParallel ddp(model);
    ScaleLog scale_log;

    std::vector<double> t_data, t_fwd, t_bwd;
    std::vector<EpochReport> reports;
    CheckpointFile ckpt(
        args.checkpoint, *model, opt, sched, scaler,
        {{"example", "resnet50"}, {"arch", args.arch}, {"ranks", std::to_string(ranks)}},
        args.batch_size * ranks, args.lr_scaling());
    const train::ResumePosition start = ckpt.resume(args.resume);
    int64_t step = start.step;
    bool preempted = false;
    // --profile: a few training steps after warm-up, rank 0 only.
    StepProfiler profiler(args.prof, distributed::is_main_process());
    bool done = args.test && step >= args.test_nsteps;
    for (int64_t epoch = start.epoch; epoch < args.epochs && !done; ++epoch) {
      model->train();
      ckpt.begin_epoch(train_loader, epoch);
      // Summed on the device: reading a loss synchronises, so only printed steps read theirs.
      Tensor loss_sum = zeros({}, TensorOptions(DType::f32).with_device(device));
      int64_t seen = 0, nb = 0;
      const auto t_epoch = mark();
      auto t0 = t_epoch;
      for_each_batch(train_loader, [&](const Tensor& x, const Tensor& y) {
        profiler.begin_step();
        const auto t1 = mark();
        Tensor loss;
        {
          const amp::autocast ac = args.prec.region(device);
          loss = criterion(ddp(x), y);
        }
        const auto t2 = mark();
        opt.zero_grad();
        scaler.scale(loss).backward();
        scaler.step(opt);
        scaler.update();
        sched.step();
        scale_log(scaler, step);
        const auto t3 = mark();
        t_data.push_back(seconds(t0, t1));
        t_fwd.push_back(seconds(t1, t2));
        t_bwd.push_back(seconds(t2, t3));
        profiler.end_step();
        seen += x.size(0);
        ++nb;
        ++step;
        const bool report = nb % std::max<int64_t>(1, steps_per_epoch / 10) == 0 || args.test;
        loss_sum = add(loss_sum, loss.detach());
        if (report) {
          const double l = loss.item<double>();
          std::printf("  epoch %lld step %lld/%lld loss %.4f lr %.4f\n",
                      static_cast<long long>(epoch + 1), static_cast<long long>(nb),
                      static_cast<long long>(steps_per_epoch), l, sched.get_last_lr()[0]);
          std::fflush(stdout);
        }
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
        t0 = mark();
        return true;
      });
      profiler.finish();  // a window cut short by the end of the epoch or the run
      if (preempted) break;
      double train_time = seconds(t_epoch, mark());
      double train_loss = nb ? loss_sum.item<double>() / static_cast<double>(nb) : 0.0;
      if (ranks > 1) {  // global figures: summed images, mean loss, the slowest rank's time
        train_time = distributed::all_reduce_value(train_time, distributed::ReduceOp::Max);
        train_loss = distributed::all_reduce_value(train_loss) / ranks;
        seen = static_cast<int64_t>(distributed::all_reduce_value(static_cast<double>(seen)));
      }

      double val_acc = -1, val_time = 0;
      if (val_loader) {
        model->eval();
        NoGradGuard ng;
        const amp::autocast ac = args.prec.region(device);
        const auto v0 = mark();
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
        val_time = seconds(v0, mark());
        val_acc = 100.0 * static_cast<double>(correct) / static_cast<double>(total);
      }
      const EpochReport r{epoch + 1,  train_time, static_cast<double>(seen) / train_time,
                          train_loss, val_time,   val_acc};
      reports.push_back(r);
      if (!done) ckpt.save(epoch + 1, step);
      std::printf("epoch %lld/%lld  train %.1f s (%.1f img/s)  train loss %.4f",
                  static_cast<long long>(r.epoch), static_cast<long long>(args.epochs),
                  r.train_time, r.throughput, r.train_loss);
      if (val_loader)
        std::printf("  val %.1f s  val acc %.2f%%\n", r.val_time, r.val_acc);
      else
        std::printf("  (no val/ folder)\n");
      std::fflush(stdout);
    }

    if (preempted) return train::kExitRequeue;
    const Stats sd = stats(t_data), sf = stats(t_fwd), sb = stats(t_bwd);
    print_chronometer("data loading (+ copy and normalise)", t_data, t_fwd, t_bwd,
                      args.prec.describe(device));
    if (gpu)
      std::printf("max memory allocated on %s: %.1f MiB\n", device.str().c_str(),
                  static_cast<double>(cuda::max_memory_allocated(device.index)) / (1 << 20));

    if (!args.json.empty() && distributed::is_main_process()) {
      nlohmann::json epochs = nlohmann::json::array();
      for (const EpochReport& r : reports)
        epochs.push_back({{"epoch", r.epoch},
                          {"train_s", r.train_time},
                          {"img_per_s", r.throughput},
                          {"train_loss", r.train_loss},
                          {"val_s", r.val_time},
                          {"val_acc", r.val_acc}});
      cli::write_json_report(
          args.json, {{"framework", "dltrain"},
                      {"arch", args.arch},
                      {"device", device.str()},
                      {"precision", args.prec.precision(device)},
                      {"layout", args.prec.layout()},
                      {"loss_scaling", scaler.is_enabled()},
                      {"batch_size", args.batch_size},
                      {"image_size", args.image_size},
                      {"steps", t_fwd.size()},
                      {"step_ms",
                       {{"data", 1e3 * sd.median},
                        {"forward", 1e3 * sf.median},
                        {"backward", 1e3 * sb.median}}},
                      {"max_memory_allocated", gpu ? cuda::max_memory_allocated(device.index) : 0},
                      {"epochs", epochs}});
      std::printf("wrote %s\n", args.json.c_str());
    }
  } catch (const Error& e) {
    if (distributed::world_size() > 1) distributed::abort(std::string("resnet50: ") + e.what());
    std::fprintf(stderr, "resnet50: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
