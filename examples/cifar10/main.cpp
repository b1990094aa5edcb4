// CIFAR-10 with ResNet-18 (CIFAR variant: 3x3 stem, no max-pool): the classic
// random-crop (4-pixel zero padding) + horizontal-flip augmentation, SGD with nesterov
// momentum and a OneCycle schedule, label smoothing, optional channels-last layout and
// mixed precision (--amp: bf16 autocast on the CPU; --amp-dtype f16 adds a GradScaler),
// per-epoch validation and a JSON report. Reads the binary version of CIFAR-10
// (data_batch_1..5.bin, test_batch.bin) from --data.
//
//   cifar10 --data DIR [--arch resnet18] [--batch-size 128] [--epochs 30] [--lr 0.1]
//           [--wd 5e-4] [--mom 0.9] [--label-smoothing 0.1] [--channels-last] [--seed 0]
//           [--threads N] [--test] [--test-nsteps 50] [--json PATH]
//           [--auto-augment trivial|rand|imagenet] [--random-erasing P [--random-erasing-value
//           mean|random]] [--mixup A] [--cutmix A]
//           [--optimizer sgd|lars|lamb] [--lr-schedule onecycle|cosine|poly] [--warmup-epochs E]
//           [--no-bn-weight-decay] [--ema DECAY [--ema-warmup] [--ema-every K]]
//           [--amp [--amp-dtype f16|bf16]] [--metrics FILE.csv|FILE.jsonl] [--tensorboard DIR]
//           [--profile FILE.json [--profile-steps 5] [--profile-warmup 2] [--profile-shapes]]
//
// The loop is the examples' common one (apps/common/training.hpp): train::Chronometer's
// table, train::Progress lines, --metrics / --tensorboard through train::MetricsWriter (every
// step's loss and learning rate, each epoch's test figures, the hyper-parameters at the end).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "apps/common/augment_flags.hpp"
#include "apps/common/example_util.hpp"
#include "apps/common/optim_flags.hpp"
#include "apps/common/training.hpp"
#include "dltrain/data/dataloader.hpp"
#include "dltrain/data/vision.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/optim/scheduler.hpp"
#include "dltrain/optim/sgd.hpp"
#include "dltrain/train/progress.hpp"

using namespace dltrain;
using namespace dltrain::apps;

namespace {

struct Args : CommonFlags {
  std::string arch = "resnet18";
  double wd = 5e-4, mom = 0.9, label_smoothing = 0.1;
  AugmentFlags aug;
  OptimFlags optim;
  EmaFlags ema;
};

// Parses the flags into an Args (exits with status 2 naming the flag on a bad one).
Args parse(int argc, char** argv) {
  Args a;
  a.epochs = 30;
  cli::Flags f("cifar10",
               "CIFAR-10 with a CIFAR ResNet (random crop + flip, SGD nesterov, OneCycle, label "
               "smoothing) on the CPU: test accuracy per epoch.");
  a.add_training(f);
  f.add("--arch", &a.arch, "torchvision ResNet name with the CIFAR stem (resnet18, ...)");
  f.add("--wd", &a.wd, "weight decay").min(0);
  f.add("--mom", &a.mom, "momentum (nesterov)").min(0);
  f.add("--label-smoothing", &a.label_smoothing, "label smoothing of the cross-entropy").min(0);
  a.optim.add_to(f);
  a.ema.add_to(f);
  a.aug.add_to(f, "the CIFAR mean");
  a.add_test(f);
  a.add_data(f, "the CIFAR-10 binary version (data_batch_1..5.bin, test_batch.bin)").required();
  f.group(cli::group::kDevice);
  f.add("--threads", &a.threads, "CPU threads (0: DLTRAIN_NUM_THREADS or all cores)").min(0);
  a.prec.add_to(f);
  a.add_report(f);
  a.prof.add_to(f);
  a.parse(f, argc, argv);
  a.optim.check(f);
  a.ema.check(f);
  a.aug.check(f);
  return a;
}

// Random 32x32 crop of the 4-pixel zero-padded image and a horizontal flip with
// probability 1/2, per sample, from a counter-based generator (reproducible per seed).
Tensor augment(const Tensor& x, Generator& gen) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), pad = 4;
  Tensor r = randint(0, 2 * (2 * pad + 1), {n, 3}, DType::i64, &gen);
  const int64_t* rp = r.data<int64_t>();
  Tensor src = x.contiguous();
  Tensor out = zeros(x.shape());
  const float* s = src.data<float>();
  float* d = out.data<float>();
  parallel_for(0, n, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t dy = rp[3 * b] % (2 * pad + 1) - pad, dx = rp[3 * b + 1] % (2 * pad + 1) - pad;
      bool flip = rp[3 * b + 2] % 2 == 1;
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* sp = s + (b * c + ch) * h * w;
        float* dp = d + (b * c + ch) * h * w;
        for (int64_t i = 0; i < h; ++i) {
          int64_t si = i + dy;
          if (si < 0 || si >= h) continue;
          for (int64_t j = 0; j < w; ++j) {
            int64_t sj = (flip ? w - 1 - j : j) + dx;
            if (sj >= 0 && sj < w) dp[i * w + j] = sp[si * w + sj];
          }
        }
      }
    }
  });
  return out;
}

// --auto-augment / --random-erasing: data::augment.hpp's transforms on each sample as u8
// (the dataset's normalised floats map back to their exact bytes), sample `first + b` of
// `epoch` drawing augmentation k from SampleRandom stream 2 + k, then normalised again.
Tensor augment_u8(const Tensor& x,
                  const std::vector<std::shared_ptr<const data::Augmentation>>& augs,
                  const data::ImageOptions& norm, uint64_t seed, int64_t epoch, int64_t first) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const Tensor src = x.contiguous();
  Tensor out = zeros(x.shape());
  const float* s = src.data<float>();
  float* d = out.data<float>();
  parallel_for(0, n, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      data::Image img(w, h, c);
      for (int64_t ch = 0; ch < c; ++ch) {
        const float m = norm.mean[static_cast<size_t>(ch)], sd = norm.std[static_cast<size_t>(ch)];
        for (int64_t i = 0; i < h * w; ++i) {
          const float v = std::nearbyint((s[(b * c + ch) * h * w + i] * sd + m) * 255.f);
          img.pixels[static_cast<size_t>(i * c + ch)] =
              static_cast<uint8_t>(std::clamp(v, 0.f, 255.f));
        }
      }
      for (size_t k = 0; k < augs.size(); ++k) {
        data::SampleRandom rng(seed, epoch, first + b, static_cast<uint32_t>(2 + k));
        img = (*augs[k])(img, rng);
      }
      for (int64_t ch = 0; ch < c; ++ch) {
        const float m = norm.mean[static_cast<size_t>(ch)], sd = norm.std[static_cast<size_t>(ch)];
        for (int64_t i = 0; i < h * w; ++i)
          d[(b * c + ch) * h * w + i] =
              (static_cast<float>(img.pixels[static_cast<size_t>(i * c + ch)]) / 255.f - m) / sd;
      }
    }
  });
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  return run_guarded("cifar10", [&]() -> int {
    const Run run = start_run(a, /*data_parallel=*/false);
    const Device device = run.device;
    data::ImageOptions norm{{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
    auto train_set = std::make_shared<data::CIFAR10>(a.data, true, norm);
    auto test_set = std::make_shared<data::CIFAR10>(a.data, false, norm);
    std::printf("CIFAR-10 from %s: %lld train, %lld test images, %d threads\n", a.data.c_str(),
                static_cast<long long>(train_set->size()), static_cast<long long>(test_set->size()),
                get_num_threads());
    data::DataLoaderOptions lo;
    lo.batch_size = a.batch_size;
    lo.shuffle = true;
    lo.drop_last = train_set->size() >= a.batch_size;
    lo.seed = a.seed;
    data::DataLoader train_loader(train_set, lo);
    data::DataLoaderOptions to;
    to.batch_size = 500;
    data::DataLoader test_loader(test_set, to);

    models::ResNetOptions ro;
    ro.cifar_stem = true;
    ro.num_classes = 10;
    auto model = models::resnet(a.arch, ro);
    const MemoryFormat fmt = a.prec.format();
    model->to(fmt);
    std::printf("model: CIFAR %s, %lld parameters, %s\n", a.arch.c_str(),
                static_cast<long long>(model->num_parameters()), a.prec.describe(device).c_str());
    // SGD with Nesterov momentum and OneCycle by default; --optimizer, --lr-schedule,
    // --warmup-epochs and --no-bn-weight-decay for the large-batch lesson.
    const std::unique_ptr<optim::Optimizer> optimizer =
        a.optim.make_optimizer(*model, a.lr, a.mom, a.wd, /*nesterov=*/true);
    optim::Optimizer& opt = *optimizer;
    const int64_t steps_per_epoch = train_loader.size();
    int64_t total = a.test ? a.test_nsteps : steps_per_epoch * a.epochs;
    const std::unique_ptr<optim::LRScheduler> schedule =
        a.optim.make_schedule(opt, a.lr, total, steps_per_epoch);
    optim::LRScheduler& sched = *schedule;
    std::printf("optimizer: %s\n", a.optim.describe(opt).c_str());
    // --ema: the weights' moving average, updated after each optimizer step.
    const std::unique_ptr<optim::ModelEMA> ema = a.ema.make(*model);
    if (ema) std::printf("%s\n", a.ema.describe().c_str());
    CrossEntropyOptions ce;
    ce.label_smoothing = a.label_smoothing;
    nn::CrossEntropyLoss criterion(ce);
    amp::GradScaler scaler(a.prec.scaler_options(device));
    Generator aug_gen(a.seed + 1);
    std::vector<std::shared_ptr<const data::Augmentation>> augs;
    if (a.aug.auto_augment != "none") augs.push_back(data::make_auto_augment(a.aug.auto_augment));
    // The mean (0 after normalisation, as torchvision's recipe) or --random-erasing-value random.
    if (auto erase = a.aug.make_random_erasing(norm.mean, norm.std)) augs.push_back(erase);
    for (const auto& aug : augs) std::printf("augment: %s\n", aug->repr().c_str());
    // --mixup / --cutmix: soft labels from the batch rolled by one (torchvision v2).
    Generator mix_gen(a.seed + 2);
    const AugmentFlags::Mix mix = a.aug.make_mix(10, mix_gen);

    // The report is rewritten at each epoch end, so an interrupted run leaves valid JSON.
    nlohmann::json report = report_header(a, device, scaler);
    report["arch"] = a.arch;
    report["epochs"] = nlohmann::json::array();
    train::Chronometer chrono({.device = device});
    train::ProfileWindow profiler(a.prof.window(true));  // --profile: a few steps after warm-up
    MetricsLog metrics(a);
    train::Progress progress(progress_options(a, steps_per_epoch, /*test_every=*/0));
    train::TrainStep train_step(
        opt, scaler,
        step_options(a.prec, device, &sched, 0, &chrono, &profiler, &progress, &metrics));
    std::map<std::string, double> final_figures;  // the last epoch's, for the hparams
    for (int64_t epoch = 0; epoch < a.epochs; ++epoch) {
      train_loader.set_epoch(epoch);
      train_step.begin_epoch(*model, epoch);
      int64_t first = 0;  // the batch's first position in the epoch
      for (const data::Batch& b : train_loader) {
        Tensor x = augment(b.data, aug_gen);
        if (!augs.empty()) x = augment_u8(x, augs, norm, a.seed, epoch, first);
        first += b.size();
        Tensor y = b.target;
        if (mix) {
          data::MixedBatch m = mix(x, y);
          x = m.images;
          y = m.labels;
        }
        x = x.contiguous(fmt);
        train_step.data_ready();
        train_step.run(b.size(), [&] { return criterion(model->forward(x), y); });
        if (ema) ema->update(*model);
        if (train_step.step() >= total) break;
        train_step.begin();
      }
      const train::EpochTally train = train_step.end_epoch();
      const double train_time = train.seconds, train_loss = train.mean_loss(),
                   ips = train.throughput();
      const train::ClassifierFigures test =
          train::evaluate_classifier(*model, test_loader, a.prec.evaluate_options(device));
      std::printf(
          "epoch %lld/%lld  time %.1f s  train loss %.4f  test loss %.4f  test acc %.2f%%  "
          "throughput %.1f img/s\n",
          static_cast<long long>(epoch + 1), static_cast<long long>(a.epochs), train_time,
          train_loss, test.loss(), test.accuracy(), ips);
      std::map<std::string, double> figures = {{"test/loss", test.loss()},
                                               {"test/acc", test.accuracy()},
                                               {"train/epoch_loss", train_loss},
                                               {"train/img_per_s", ips}};
      final_figures = {{"test/acc", test.accuracy()}, {"test/loss", test.loss()}};
      nlohmann::json epoch_report = {{"epoch", epoch + 1},          {"time_s", train_time},
                                     {"train_loss", train_loss},    {"test_loss", test.loss()},
                                     {"test_acc", test.accuracy()}, {"img_per_s", ips}};
      if (ema) {  // the averaged weights on the same test set (the model's own kept aside)
        optim::EMAScope scope(*ema, *model);
        const train::ClassifierFigures t =
            train::evaluate_classifier(*model, test_loader, a.prec.evaluate_options(device));
        std::printf("  EMA weights: test loss %.4f  test acc %.2f%%\n", t.loss(), t.accuracy());
        figures["test/ema_loss"] = final_figures["test/ema_loss"] = t.loss();
        figures["test/ema_acc"] = final_figures["test/ema_acc"] = t.accuracy();
        epoch_report["test_loss_ema"] = t.loss();
        epoch_report["test_acc_ema"] = t.accuracy();
      }
      std::fflush(stdout);
      metrics.epoch(figures, train_step.step());
      report["epochs"].push_back(epoch_report);
      report["steps"] = chrono.summary().measured_steps;
      report["step_ms"] = step_ms(chrono);
      if (!a.json.empty()) cli::write_json_report(a.json, report);
      if (train_step.step() >= total) break;
    }
    std::printf("%s", chrono.table(a.prec.describe(device)).c_str());
    metrics.finish({{"lr", a.lr},
                    {"batch_size", static_cast<double>(a.batch_size)},
                    {"epochs", static_cast<double>(a.epochs)},
                    {"weight_decay", a.wd},
                    {"momentum", a.mom},
                    {"label_smoothing", a.label_smoothing},
                    {"arch", a.arch},
                    {"optimizer", a.optim.optimizer},
                    {"lr_schedule", a.optim.lr_schedule},
                    {"warmup_epochs", a.optim.warmup_epochs},
                    {"ema", a.ema.decay},
                    {"precision", a.prec.precision(device)},
                    {"layout", std::string(a.prec.layout())}},
                   final_figures);
    if (!a.json.empty()) std::printf("wrote %s\n", a.json.c_str());
    return 0;
  });
}
