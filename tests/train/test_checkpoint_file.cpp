// train::CheckpointFile: a run saved in the middle of an epoch resumes at the same sample, with
// the same weights, optimizer, scheduler and step; a preemption signal saves and asks for a
// requeue; misuse is refused by name.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

#include "dltrain/dltrain.hpp"
#include "dltrain/train/checkpoint_file.hpp"
#include "tests/skip.hpp"

using namespace dltrain;

namespace {

struct Run {
  // Every run starts from the same weights (seeded before the model draws them).
  int seeded = (default_generator().manual_seed(7), 0);
  std::shared_ptr<nn::Linear> model = std::make_shared<nn::Linear>(3, 2);
  optim::SGD opt{model->parameters(), {.lr = 0.1, .momentum = 0.9}};
  optim::StepLR sched{opt, 2, 0.5};
  amp::GradScaler scaler{{.enabled = false}};
};

// 12 samples of 3 features, in order: batches of 2 give 6 batches per epoch.
data::DataLoader make_loader() {
  Tensor x = arange(36, DType::f32).reshape({12, 3});
  Tensor y = zeros({12}, DType::i64);
  for (int64_t i = 0; i < 12; ++i) y.data<int64_t>()[i] = i % 2;
  return data::DataLoader(std::make_shared<data::TensorDataset>(x, y), {.batch_size = 2});
}

// One SGD step on a batch, then the scheduler's step (per batch, as CheckpointFile assumes).
void train_step(Run& r, const data::Batch& b) {
  r.opt.zero_grad();
  cross_entropy(r.model->forward(b.data), b.target).backward();
  r.opt.step();
  r.sched.step();
}

std::string scratch(const char* name) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("dltrain_ckptfile_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

}  // namespace

TEST_CASE("CheckpointFile: a run saved mid-epoch resumes at the same sample and state",
          "[train][checkpoint_file]") {
  if (!io::hdf5_supported()) {
    testing::skip("this build has no HDF5, which checkpoint files need");
    return;
  }
  const std::string path = scratch("mid_epoch.h5");
  std::filesystem::remove(path);
  data::DataLoader loader = make_loader();

  // The uninterrupted run: 5 batches of epoch 0.
  Run full;
  {
    int n = 0;
    for (const data::Batch& b : loader) {
      if (n++ == 5) break;
      train_step(full, b);
    }
  }
  // The interrupted run: 3 batches, saved, then a fresh process resumes and trains 2 more.
  {
    Run a;
    train::CheckpointFile ckpt(
        path, *a.model, a.opt, a.sched, a.scaler,
        {.global_batch = 2, .metadata = {{"test", "mid"}}, .verbose = false});
    const train::ResumePosition start = ckpt.resume(/*asked=*/true);  // no file yet: fresh
    CHECK(start.epoch == 0);
    CHECK(start.step == 0);
    CHECK(start.samples_in_epoch == 0);
    CHECK(ckpt.begin_epoch(loader, 0) == 0);
    int64_t batches = 0;
    for (const data::Batch& b : loader) {
      train_step(a, b);
      if (++batches == 3) break;
    }
    ckpt.save(0, /*step=*/3, loader, batches);
    REQUIRE(std::filesystem::exists(path));
  }
  Run b;
  train::CheckpointFile ckpt(path, *b.model, b.opt, b.sched, b.scaler,
                             {.global_batch = 2, .verbose = false});
  const train::ResumePosition start = ckpt.resume(/*asked=*/true);
  CHECK(start.epoch == 0);
  CHECK(start.step == 3);
  CHECK(start.samples_in_epoch == 6);
  CHECK(ckpt.begin_epoch(loader, 0) == 3);  // the epoch's first batch after the resume
  int64_t batches = 0;
  float first_feature = -1;
  for (const data::Batch& batch : loader) {
    if (batches == 0) first_feature = batch.data.contiguous().data<float>()[0];
    if (batches++ == 2) break;
    train_step(b, batch);
  }
  CHECK(batches == 3);  // 3 batches left of 6: the loop broke at the third
  // Sample 6 (features 18, 19, 20) comes first, as in the uninterrupted run's fourth batch.
  CHECK(first_feature == 18.0f);
  // Bit-identical weights and learning rate: the same arithmetic in the same order.
  CHECK(allclose(b.model->weight, full.model->weight, 0, 0));
  CHECK(allclose(b.model->bias, full.model->bias, 0, 0));
  CHECK(b.sched.get_last_lr()[0] == full.sched.get_last_lr()[0]);
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

TEST_CASE("CheckpointFile: without a file, or not asked, training starts fresh",
          "[train][checkpoint_file]") {
  Run a;
  train::CheckpointFile none("", *a.model, a.opt, a.sched, a.scaler,
                             {.global_batch = 4, .verbose = false});
  const train::ResumePosition r = none.resume(/*asked=*/true);
  CHECK(r.epoch == 0);
  CHECK(r.step == 0);
  CHECK(r.global_batch == 4);
  data::DataLoader loader = make_loader();
  none.save(1, 6);  // an empty path: a no-op
  CHECK_FALSE(none.stop_for_requeue(0, 1, loader, 1));
  train::CheckpointFile not_asked(scratch("never_written.h5"), *a.model, a.opt, a.sched, a.scaler,
                                  {.global_batch = 4, .verbose = false});
  CHECK(not_asked.resume(/*asked=*/false).step == 0);
}

TEST_CASE("CheckpointFile: a preemption signal saves the state and asks for a requeue",
          "[train][checkpoint_file]") {
  if (!io::hdf5_supported()) {
    testing::skip("this build has no HDF5, which checkpoint files need");
    return;
  }
  const std::string path = scratch("preempted.h5");
  std::filesystem::remove(path);
  Run a;
  data::DataLoader loader = make_loader();
  train::CheckpointFile ckpt(path, *a.model, a.opt, a.sched, a.scaler,
                             {.global_batch = 2, .verbose = false});
  CHECK_FALSE(ckpt.stop_for_requeue(0, 1, loader, 1));
  REQUIRE(::kill(::getpid(), SIGUSR1) == 0);
  // The handler's watcher thread takes the signal asynchronously: ask for up to 10 s.
  bool stopped = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!stopped && std::chrono::steady_clock::now() < deadline) {
    stopped = ckpt.stop_for_requeue(0, 2, loader, 2);
    if (!stopped) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(stopped);
  const io::Checkpoint c = io::read_checkpoint(path);
  CHECK(c.progress.step == 2);
  CHECK(c.progress.samples_in_epoch == 4);
  CHECK(c.progress.global_batch == 2);
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

TEST_CASE("CheckpointFile: a missing global batch is refused by name", "[train][checkpoint_file]") {
  Run a;
  CHECK_THROWS_WITH(train::CheckpointFile("x.h5", *a.model, a.opt, a.sched, a.scaler, {}),
                    Catch::Contains("global_batch") && Catch::Contains("per-rank batch x ranks"));
}
