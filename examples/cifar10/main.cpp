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
//           [--amp [--amp-dtype f16|bf16]]
//           [--profile FILE.json [--profile-steps 5] [--profile-warmup 2] [--profile-shapes]]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "dltrain/data/dataloader.hpp"
#include "dltrain/data/vision.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/optim/scheduler.hpp"
#include "dltrain/optim/sgd.hpp"
#include "examples/common/example_util.hpp"

using namespace dltrain;
using namespace dltrain::examples;

namespace {

struct Args : CommonFlags {
  std::string arch = "resnet18";
  double wd = 5e-4, mom = 0.9, label_smoothing = 0.1;
  PrecisionFlags prec;
  ProfileFlags prof;
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
  a.add_test(f);
  a.add_data(f, "the CIFAR-10 binary version (data_batch_1..5.bin, test_batch.bin)").required();
  f.group(cli::group::kDevice);
  f.add("--threads", &a.threads, "CPU threads (0: DLTRAIN_NUM_THREADS or all cores)").min(0);
  a.prec.add_to(f);
  a.add_report(f, /*with_metrics=*/false);
  a.prof.add_to(f);
  f.parse(argc, argv);
  a.check(f);
  a.prec.check(f);
  a.prof.check(f);
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

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  try {
    if (a.threads > 0) set_num_threads(a.threads);
    manual_seed(a.seed);
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
    const Device device = Device::cpu();
    const MemoryFormat fmt = a.prec.format();
    model->to(fmt);
    std::printf("model: CIFAR %s, %lld parameters, %s\n", a.arch.c_str(),
                static_cast<long long>(model->num_parameters()), a.prec.describe(device).c_str());
    optim::SGD opt(model->parameters(),
                   {.lr = a.lr, .momentum = a.mom, .weight_decay = a.wd, .nesterov = true});
    int64_t total = a.test ? a.test_nsteps : train_loader.size() * a.epochs;
    optim::OneCycleLR sched(opt, a.lr, total);
    CrossEntropyOptions ce;
    ce.label_smoothing = a.label_smoothing;
    nn::CrossEntropyLoss criterion(ce);
    amp::GradScaler scaler(a.prec.scaler_options(device));
    ScaleLog scale_log;
    Generator aug_gen(a.seed + 1);

    // The report is rewritten at each epoch end, so an interrupted run leaves valid JSON.
    nlohmann::json report = {{"framework", "dltrain"},
                             {"arch", a.arch},
                             {"precision", a.prec.precision(device)},
                             {"layout", a.prec.layout()},
                             {"loss_scaling", scaler.is_enabled()},
                             {"epochs", nlohmann::json::array()}};
    int64_t step = 0;
    StepProfiler profiler(a.prof, true);  // --profile: a few steps after warm-up
    for (int64_t epoch = 0; epoch < a.epochs; ++epoch) {
      model->train();
      train_loader.set_epoch(epoch);
      double loss_sum = 0;
      int64_t seen = 0, nb = 0;
      auto t0 = Clock::now();
      for (const data::Batch& b : train_loader) {
        profiler.begin_step();
        Tensor x = augment(b.data, aug_gen).contiguous(fmt);
        Tensor loss;
        {
          const amp::autocast ac = a.prec.region(device);
          loss = criterion(model->forward(x), b.target);
        }
        opt.zero_grad();
        scaler.scale(loss).backward();
        scaler.step(opt);
        scaler.update();
        sched.step();
        scale_log(scaler, step);
        loss_sum += loss.item<double>();
        profiler.end_step();
        seen += b.size();
        ++nb;
        if (++step >= total) break;
        if (nb % std::max<int64_t>(1, train_loader.size() / 10) == 0) {
          std::printf("  epoch %lld step %lld/%lld loss %.4f\n", static_cast<long long>(epoch + 1),
                      static_cast<long long>(nb), static_cast<long long>(train_loader.size()),
                      loss_sum / static_cast<double>(nb));
          std::fflush(stdout);
        }
      }
      double train_time = seconds(t0, Clock::now());
      profiler.finish();  // a window cut short by the end of the epoch or the run
      model->eval();
      int64_t correct = 0, count = 0;
      double test_loss = 0;
      {
        NoGradGuard ng;
        const amp::autocast ac = a.prec.region(device);
        for (const data::Batch& b : test_loader) {
          Tensor logits = model->forward(b.data.contiguous(fmt));
          CrossEntropyOptions s;
          s.reduction = Reduction::Sum;
          test_loss += cross_entropy(logits, b.target, s).item<double>();
          correct += static_cast<int64_t>(
              sum(eq(argmax(logits, 1), b.target).to(DType::i64)).item<double>());
          count += b.size();
        }
      }
      double acc = 100.0 * static_cast<double>(correct) / static_cast<double>(count);
      double ips = static_cast<double>(seen) / train_time;
      std::printf(
          "epoch %lld/%lld  time %.1f s  train loss %.4f  test loss %.4f  test acc %.2f%%  "
          "throughput %.1f img/s\n",
          static_cast<long long>(epoch + 1), static_cast<long long>(a.epochs), train_time,
          loss_sum / static_cast<double>(nb), test_loss / static_cast<double>(count), acc, ips);
      std::fflush(stdout);
      report["epochs"].push_back({{"epoch", epoch + 1},
                                  {"time_s", train_time},
                                  {"train_loss", loss_sum / static_cast<double>(nb)},
                                  {"test_acc", acc},
                                  {"img_per_s", ips}});
      if (!a.json.empty()) cli::write_json_report(a.json, report);
      if (step >= total) break;
    }
    if (!a.json.empty()) std::printf("wrote %s\n", a.json.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "cifar10: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
