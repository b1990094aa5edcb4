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

struct Args {
  std::string data;
  std::string arch = "resnet50";
  int64_t batch_size = 64;
  int64_t epochs = 1;
  int64_t image_size = 224;
  double lr = 0.1;
  double wd = 5e-5;
  double mom = 0.9;
  double label_smoothing = 0.1;
  uint64_t seed = 0;
  bool test = false;
  int64_t test_nsteps = 50;
  int64_t num_workers = 4;
  bool persistent_workers = false;
  bool pin_memory = false;
  bool non_blocking = false;
  int64_t prefetch_factor = 2;
  bool drop_last = true;
  std::string device = "cpu";
  PrecisionFlags prec;
  ProfileFlags prof;
  int threads = 0;
  std::string json;
  std::string checkpoint;
  bool resume = false;
  std::string resume_lr_scaling = "keep";
  int64_t checkpoint_every = 0;
};

Flags make_flags(Args& a) {
  Flags f(
      "resnet50",
      "--data DIR [--arch resnet50] [--batch-size N] [--epochs N] [--image-size N] [--lr X] "
      "[--wd X] [--mom X] [--label-smoothing X] [--seed N] [--test] [--test-nsteps N] "
      "[--num-workers N] [--persistent-workers] [--pin-memory] [--non-blocking] "
      "[--prefetch-factor N] [--no-drop-last] [--device cpu|cuda[:N]] [--channels-last] "
      "[--amp] [--amp-dtype f16|bf16] [--threads N] [--json PATH] [--checkpoint PATH [--resume] "
      "[--checkpoint-every N] [--resume-lr-scaling keep|linear|sqrt]] [--profile FILE.json "
      "[--profile-steps N] [--profile-warmup N] [--profile-shapes]]");
  f.add("--data", &a.data).add("--arch", &a.arch).add("--batch-size", &a.batch_size);
  f.add("--epochs", &a.epochs).add("--image-size", &a.image_size).add("--lr", &a.lr);
  f.add("--wd", &a.wd).add("--mom", &a.mom).add("--label-smoothing", &a.label_smoothing);
  f.add("--seed", &a.seed).add("--test-nsteps", &a.test_nsteps);
  f.add("--num-workers", &a.num_workers).add("--prefetch-factor", &a.prefetch_factor);
  f.add("--device", &a.device).add("--threads", &a.threads).add("--json", &a.json);
  f.add("--checkpoint", &a.checkpoint).add("--checkpoint-every", &a.checkpoint_every);
  f.add_switch("--resume", &a.resume).add("--resume-lr-scaling", &a.resume_lr_scaling);
  f.add_switch("--test", &a.test).add_switch("--persistent-workers", &a.persistent_workers);
  f.add_switch("--pin-memory", &a.pin_memory).add_switch("--non-blocking", &a.non_blocking);
  f.add_switch("--no-drop-last", &a.drop_last, false).add_switch("--drop-last", &a.drop_last);
  a.prec.add_to(f);
  a.prof.add_to(f);
  return f;
}

struct EpochReport {
  int64_t epoch;
  double train_time, throughput, train_loss, val_time, val_acc;
};

}  // namespace

int main(int argc, char** argv) {
  Args args;
  const Flags flags = make_flags(args);
  flags.parse(argc, argv);
  args.prec.check(flags);
  args.prof.check(flags);
  const train::LRScaling lr_scaling = parse_lr_scaling(flags, args.resume_lr_scaling);
  if (args.data.empty())
    flags.fail("--data DIR is required (DIR/train/<class>/*.JPEG, DIR/val/...)");
  if (args.batch_size <= 0 || args.epochs <= 0 || args.test_nsteps <= 0 || args.image_size <= 0)
    flags.fail("--batch-size, --epochs, --test-nsteps and --image-size must be positive");
  try {
    if (args.threads > 0) set_num_threads(args.threads);
    manual_seed(args.seed);
    Device device;
    try {
      device = parse_device(args.device);
    } catch (const std::exception&) {
      flags.fail("bad value for --device: " + args.device + " (cpu, cuda or cuda:N)");
    }
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
        args.batch_size * ranks, lr_scaling);
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
      std::ofstream js(args.json);
      DLTRAIN_CHECK(js.good(), "cannot write --json file '", args.json, "'");
      js << "{\n  \"framework\": \"dltrain\",\n  \"arch\": \"" << args.arch
         << "\",\n  \"device\": \"" << device.str() << "\",\n  \"precision\": \""
         << args.prec.precision(device) << "\",\n  \"layout\": \"" << args.prec.layout()
         << "\",\n  \"loss_scaling\": " << (scaler.is_enabled() ? "true" : "false")
         << ",\n  \"batch_size\": " << args.batch_size << ",\n  \"image_size\": " << args.image_size
         << ",\n  \"steps\": " << t_fwd.size() << ",\n  \"step_ms\": {\"data\": " << 1e3 * sd.median
         << ", \"forward\": " << 1e3 * sf.median << ", \"backward\": " << 1e3 * sb.median
         << "},\n  \"max_memory_allocated\": "
         << (gpu ? cuda::max_memory_allocated(device.index) : 0) << ",\n  \"epochs\": [";
      for (size_t i = 0; i < reports.size(); ++i) {
        const auto& r = reports[i];
        js << (i ? ",\n" : "\n") << "    {\"epoch\": " << r.epoch
           << ", \"train_s\": " << r.train_time << ", \"img_per_s\": " << r.throughput
           << ", \"train_loss\": " << r.train_loss << ", \"val_s\": " << r.val_time
           << ", \"val_acc\": " << r.val_acc << "}";
      }
      js << "\n  ]\n}\n";
      std::printf("wrote %s\n", args.json.c_str());
    }
  } catch (const Error& e) {
    if (distributed::world_size() > 1) distributed::abort(std::string("resnet50: ") + e.what());
    std::fprintf(stderr, "resnet50: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
