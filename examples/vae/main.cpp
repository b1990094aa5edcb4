// A convolutional variational autoencoder on Fashion-MNIST: the showcase of modules with several
// outputs (the encoder is an nn::Chain whose last stage returns (mu, logvar), and the VAE returns
// (reconstruction, mu, logvar)), of the transposed convolution (the decoder's upsampling), of
// randn_like (the reparameterisation) and of binary_cross_entropy on probabilities.
//
//   vae [--data DIR] [--epochs 10] [--batch-size 128] [--lr 1e-3] [--latent 16] [--seed 0]
//       [--threads N] [--device cpu|cuda[:N]] [--num-workers N] [--out DIR] [--json PATH]
//       [--checkpoint PATH [--resume]] [--metrics FILE.csv|FILE.jsonl] [--tensorboard DIR]
//       [--test] [--test-nsteps 30] [--bench] [--bench-steps 50]
//       [--amp [--amp-dtype f16|bf16]] [--channels-last]
//       [--profile FILE.json [--profile-steps 5] [--profile-warmup 2] [--profile-shapes]]
//
// The loss is the negative ELBO per image in nats: the reconstruction's binary cross-entropy
// summed over the 784 pixels plus the closed-form KL divergence of N(mu, exp(logvar)) from
// N(0, I), averaged over the batch (as the PyTorch VAE example). Test figures draw the
// reparameterisation noise from a generator seeded afresh for each evaluation, so one set of
// weights always gives the same test loss: the example saves its weights (safetensors), loads
// them into a new model and checks that the test loss is the same, bit for bit. It writes a grid
// of samples (random z decoded) and a grid of test images over their reconstructions as PNG.
// --bench times training steps on one fixed batch (the peer: benchmarks/peers/pytorch_vae.py).
// --amp runs forward, loss and evaluation under autocast (bf16 on the CPU; f16 with a GradScaler
// on a GPU, or with --amp-dtype f16); the loss terms (BCE, exp, sum) stay in f32 by autocast's
// policy. --channels-last puts the weights and the batches in NHWC; the decoder moves its
// reshaped features to its weights' layout. --profile profiles a few training steps (or --bench
// steps) and writes the Chrome trace.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "apps/common/example_util.hpp"
#include "apps/common/training.hpp"
#include "dltrain/data/dataloader.hpp"
#include "dltrain/data/vision.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/io/safetensors.hpp"
#include "dltrain/optim/adam.hpp"
#include "dltrain/optim/scheduler.hpp"
#include "dltrain/train/chronometer.hpp"
#include "dltrain/train/metrics.hpp"
#include "dltrain/train/progress.hpp"
#include "examples/vae/model.hpp"

using namespace dltrain;
using namespace dltrain::apps;
using namespace vae_example;

namespace {

struct Args : CommonFlags {
  int64_t latent = 16;
  std::string out = "vae_out";
  bool bench = false;
  int64_t bench_steps = 50;
};

Args parse(int argc, char** argv) {
  Args a;
  a.data = "/usr/share/datasets/fashion-mnist";
  a.epochs = 10;
  a.lr = 1e-3;
  a.test_nsteps = 30;
  cli::Flags f("vae",
               "A convolutional variational autoencoder on Fashion-MNIST (Adam, negative ELBO): "
               "test figures per epoch, PNG grids of samples and reconstructions, weights "
               "reloaded and checked.");
  a.add_training(f);
  f.add("--latent", &a.latent, "size of the latent space").positive();
  a.add_test(f);
  a.add_data(f, "the Fashion-MNIST IDX files (gzipped or not)");
  a.add_loader(f, /*all=*/false);
  a.add_device(f);
  a.prec.add_to(f);
  a.add_checkpoint(f, /*with_lr_scaling=*/false);
  a.add_report(f);
  f.add("--out", &a.out, "folder of the PNG grids and the weights").value_name("DIR");
  f.group(cli::group::kBenchmark);
  f.add_switch("--bench", &a.bench, "only time training steps on one fixed batch");
  f.add("--bench-steps", &a.bench_steps, "steps timed by --bench").positive();
  a.prof.add_to(f);
  a.parse(f, argc, argv);
  return a;
}

struct LossTerms {
  Tensor recon, kl;  // summed over the batch (scalars)
};
// BCE of the reconstruction (summed over pixels and images) and KL(N(mu, sigma^2) || N(0, I)) =
// -1/2 sum(1 + logvar - mu^2 - exp(logvar)). kl_div is PyTorch's KLDivLoss between two given
// distributions, not this closed form, so the closed form is written with ops.
LossTerms vae_loss(const Tensor& recon, const Tensor& x, const Tensor& mu, const Tensor& logvar) {
  const Tensor bce = binary_cross_entropy(recon, x, {.reduction = Reduction::Sum});
  const Tensor kl = mul(sum(sub(add(logvar, 1.0), add(square(mu), exp(logvar)))), -0.5);
  return {bce, kl};
}

struct TestResult {
  double loss = 0, recon = 0, kl = 0;  // per image
};

// The test set's negative ELBO per image, the noise from Generator(seed): deterministic. Under
// autocast with --amp, in the run's layout.
TestResult evaluate(VAE& model, data::DataLoader& loader, Device device, uint64_t seed,
                    const PrecisionFlags& prec) {
  model.eval();
  NoGradGuard ng;
  const amp::autocast ac = prec.region(device);
  Generator gen(seed);
  double recon = 0, kl = 0;
  int64_t n = 0;
  for (const data::Batch& hb : loader) {
    const Tensor x = hb.data.to(device).contiguous(prec.format());
    auto [r, mu, logvar] = model(x, &gen);
    const LossTerms l = vae_loss(r, x, mu, logvar);
    recon += l.recon.item<double>();
    kl += l.kl.item<double>();
    n += hb.size();
  }
  const double dn = static_cast<double>(n);
  return {(recon + kl) / dn, recon / dn, kl / dn};
}

// [N, 1, H, W] in [0, 1] -> one [1, rows * (H + 2), cols * (W + 2)] image, a grey 1-pixel frame
// around each tile.
Tensor grid(const Tensor& images, int64_t cols) {
  const Tensor p =
      pad(images.to(Device::cpu()).to(DType::f32), {1, 1, 1, 1}, PadMode::Constant, 0.5);
  const int64_t n = p.size(0), h = p.size(2), w = p.size(3), rows = n / cols;
  return p.narrow(0, 0, rows * cols)
      .reshape({rows, cols, h, w})
      .permute({0, 2, 1, 3})
      .reshape({1, rows * h, cols * w});
}

// Writes `chw` as a PNG; false (with a note) in a build without libpng.
bool write_png(const std::string& path, const Tensor& chw) {
  std::string bytes;
  try {
    bytes = train::encode_png(train::image_from_tensor(chw));
  } catch (const Error& e) {
    std::printf("PNG not written (%s)\n", e.what());
    return false;
  }
  std::ofstream f(path, std::ios::binary);
  DLTRAIN_CHECK(f.good(), "vae: cannot write '", path, "'");
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  DLTRAIN_CHECK(f.good(), "vae: write to '", path, "' failed");
  std::printf("wrote %s\n", path.c_str());
  return true;
}

// One training step's loss: the mean negative ELBO (TrainStep runs it under autocast).
Tensor train_loss(VAE& model, const Tensor& x) {
  auto [r, mu, logvar] = model(x);
  const LossTerms l = vae_loss(r, x, mu, logvar);
  return mul(add(l.recon, l.kl), 1.0 / static_cast<double>(x.size(0)));
}

// --bench: `steps` training steps on one fixed batch after 5 warm-up steps; returns the
// chronometer's summary (the peer script times the same loop). --profile covers its steps too.
train::ChronometerSummary bench(VAE& model, optim::Optimizer& opt, amp::GradScaler& scaler,
                                const Tensor& x, int64_t steps, const PrecisionFlags& prec,
                                train::ProfileWindow& profiler) {
  model.train();
  train::Chronometer chrono({.device = x.device(), .warmup_steps = 5});
  train::TrainStep train_step(opt, scaler,
                              step_options(prec, x.device(), nullptr, 0, &chrono, &profiler));
  for (int64_t i = 0; i < steps + 5; ++i) {
    train_step.begin();
    train_step.run(x.size(0), [&] { return train_loss(model, x); });
  }
  profiler.finish();
  std::printf("%s", chrono
                        .table("vae --bench, batch " + std::to_string(x.size(0)) + ", " +
                               prec.describe(x.device()))
                        .c_str());
  return chrono.summary();
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  return run_guarded("vae", [&]() -> int {
    if (args.threads > 0) set_num_threads(args.threads);
    manual_seed(args.seed);
    const Device device = args.parsed_device();
    if (device.is_cuda()) cuda::set_device(device.index);
    auto t_load = Clock::now();
    // No normalisation: pixels in [0, 1] are the BCE targets.
    auto train_set = std::make_shared<data::MNIST>(args.data, true);
    auto test_set = std::make_shared<data::MNIST>(args.data, false);
    std::printf(
        "Fashion-MNIST from %s: %lld train, %lld test images (loaded in %.2f s), %d threads\n",
        args.data.c_str(), static_cast<long long>(train_set->size()),
        static_cast<long long>(test_set->size()), seconds(t_load, Clock::now()), get_num_threads());

    const MemoryFormat fmt = args.prec.format();
    auto model = std::make_shared<VAE>(args.latent);
    model->to(device);
    model->to(fmt);
    std::printf("model: %lld parameters\n%s\n", static_cast<long long>(model->num_parameters()),
                model->str().c_str());
    std::printf("%s\n", args.prec.describe(device).c_str());
    optim::Adam opt(model->parameters(), {.lr = args.lr});
    // f16 (--amp on a GPU, or --amp-dtype f16) scales the loss; bf16 and f32 need no scaling.
    amp::GradScaler scaler(args.prec.scaler_options(device));
    train::ProfileWindow profiler(args.prof.window(/*main_process=*/true));
    nlohmann::json report = report_header(args, device, scaler);
    report["example"] = "vae";
    report["latent"] = args.latent;

    if (args.bench) {
      const Tensor x = train_set->data().narrow(0, 0, args.batch_size).to(device).contiguous(fmt);
      const train::ChronometerSummary s =
          bench(*model, opt, scaler, x, args.bench_steps, args.prec, profiler);
      std::printf("bench: median step %.2f ms, %.0f img/s (batch %lld, %d threads)\n",
                  1e3 * s.step.median, static_cast<double>(args.batch_size) / s.step.median,
                  static_cast<long long>(args.batch_size), get_num_threads());
      report.update({{"mode", "bench"},
                     {"steps", s.measured_steps},
                     {"step_ms_median", 1e3 * s.step.median},
                     {"img_per_s", static_cast<double>(args.batch_size) / s.step.median}});
      write_report(args, report);
      return 0;
    }

    data::DataLoaderOptions lo;
    lo.batch_size = args.batch_size;
    lo.shuffle = true;
    lo.drop_last = true;
    lo.seed = args.seed;
    lo.num_workers = args.num_workers;
    data::DataLoaderOptions to;
    to.batch_size = 1000;
    data::DataLoader train_loader(train_set, lo), test_loader(test_set, to);

    // A constant learning rate; the scheduler and the scaler are what a checkpoint holds beside
    // the model and Adam's moments.
    optim::LambdaLR sched(opt, [](int64_t) { return 1.0; });
    train::CheckpointFile ckpt(args.checkpoint, *model, opt, sched, scaler,
                               {.global_batch = args.batch_size, .metadata = {{"example", "vae"}}});
    const train::ResumePosition start = ckpt.resume(args.resume);
    MetricsLog metrics(args);
    const int64_t steps_per_epoch = train_loader.size();
    train::Progress progress(progress_options(args, steps_per_epoch, /*test_every=*/10));
    train::Chronometer chrono({.device = device});
    train::TrainStep train_step(opt, scaler,
                                step_options(args.prec, device, &sched, start.step, &chrono,
                                             &profiler, &progress, &metrics));
    std::vector<nlohmann::json> epochs;
    std::map<std::string, double> final_figures;  // the last epoch's, for the hparams
    const uint64_t eval_seed = args.seed + 1;
    bool done = args.test && start.step >= args.test_nsteps;
    for (int64_t epoch = start.epoch; epoch < args.epochs && !done; ++epoch) {
      train_step.begin_epoch(*model, epoch, ckpt.begin_epoch(train_loader, epoch));
      for (const data::Batch& hb : train_loader) {
        const Tensor x = hb.data.to(device).contiguous(fmt);
        train_step.data_ready();
        train_step.run(hb.size(), [&] { return train_loss(*model, x); });
        const int64_t step = train_step.step(), nb = train_step.batches();
        if (ckpt.stop_for_requeue(epoch, step, train_loader, nb)) return train::kExitRequeue;
        if (args.test && step >= args.test_nsteps) {
          done = true;
          ckpt.save(epoch, step, train_loader, nb);
          break;
        }
        train_step.begin();
      }
      const train::EpochTally train = train_step.end_epoch();
      const int64_t step = train_step.step();
      const double time_s = train.seconds;
      const TestResult t = evaluate(*model, test_loader, device, eval_seed, args.prec);
      const double train_loss_mean = train.mean_loss(), img_per_s = train.throughput();
      epochs.push_back({{"epoch", epoch + 1},
                        {"time_s", time_s},
                        {"train_loss", train_loss_mean},
                        {"test_loss", t.loss},
                        {"test_recon", t.recon},
                        {"test_kl", t.kl},
                        {"img_per_s", img_per_s}});
      final_figures = {{"test/loss", t.loss}, {"test/recon", t.recon}, {"test/kl", t.kl}};
      metrics.epoch({{"test/loss", t.loss},
                     {"test/recon", t.recon},
                     {"test/kl", t.kl},
                     {"train/epoch_loss", train_loss_mean},
                     {"train/img_per_s", img_per_s}},
                    step);
      if (!done) ckpt.save(epoch + 1, step);
      std::printf(
          "epoch %lld/%lld  time %.1f s  train loss %.2f  test loss %.2f (recon %.2f + KL %.2f) "
          " throughput %.0f img/s\n",
          static_cast<long long>(epoch + 1), static_cast<long long>(args.epochs), time_s,
          train_loss_mean, t.loss, t.recon, t.kl, img_per_s);
      std::fflush(stdout);
    }
    std::printf("%s", chrono.table("vae, " + args.prec.describe(device)).c_str());

    // Images: 64 samples from the prior, and 32 test images (odd rows) over their
    // reconstructions from the posterior mean (even rows).
    std::filesystem::create_directories(args.out);
    {
      model->eval();
      NoGradGuard ng;
      Generator gen(args.seed + 2);
      const Tensor z = randn({64, args.latent}, {}, &gen).to(device);
      write_png(args.out + "/samples.png", grid(model->decoder->forward(z), 8));
      const Tensor x = test_set->data().narrow(0, 0, 32).to(device).contiguous(fmt);
      auto [mu, logvar] = (*model->encoder)(x);
      (void)logvar;
      const Tensor r = model->decoder->forward(mu);
      const Tensor pairs = stack({x.reshape({4, 8, 1, 28, 28}), r.reshape({4, 8, 1, 28, 28})}, 1);
      write_png(args.out + "/reconstructions.png", grid(pairs.reshape({64, 1, 28, 28}), 8));
    }

    // Weights out and back in: a new model with the loaded weights has the same test loss.
    const std::string weights = args.out + "/vae.safetensors";
    io::save_safetensors(weights, model->state_dict(),
                         {{"example", "vae"}, {"latent", std::to_string(args.latent)}});
    const double before = evaluate(*model, test_loader, device, eval_seed, args.prec).loss;
    auto reloaded = std::make_shared<VAE>(args.latent);
    reloaded->load_state_dict(io::load_safetensors(weights));
    reloaded->to(device);
    reloaded->to(fmt);
    const double after = evaluate(*reloaded, test_loader, device, eval_seed, args.prec).loss;
    std::printf("weights: %s; reloaded into a new model: test loss %.6f, before %.6f (%s)\n",
                weights.c_str(), after, before, after == before ? "equal" : "DIFFERENT");
    DLTRAIN_CHECK(after == before, "vae: the reloaded weights give test loss ", after,
                  " but the trained model ", before);

    metrics.finish({{"lr", args.lr},
                    {"batch_size", static_cast<double>(args.batch_size)},
                    {"epochs", static_cast<double>(args.epochs)},
                    {"latent", static_cast<double>(args.latent)},
                    {"precision", args.prec.precision(device)},
                    {"layout", std::string(args.prec.layout())}},
                   final_figures);

    const train::ChronometerSummary cs = chrono.summary();
    report.update({{"config",
                    {{"batch_size", args.batch_size},
                     {"lr", args.lr},
                     {"latent", args.latent},
                     {"epochs", args.epochs},
                     {"seed", args.seed}}},
                   {"steps", cs.measured_steps},
                   {"step_ms_median", 1e3 * cs.step.median},
                   {"img_per_s", cs.samples_per_second},
                   {"reload_test_loss", after},
                   {"epochs", epochs}});
    write_report(args, report);
    return 0;
  });
}
