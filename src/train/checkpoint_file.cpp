// train::CheckpointFile (dltrain/train/checkpoint_file.hpp): the resume, save and requeue steps
// of a training run over io::save/load_checkpoint and train::resume_data_position.
#include "dltrain/train/checkpoint_file.hpp"

#include <csignal>
#include <cstdio>
#include <fstream>

#include "dltrain/amp/grad_scaler.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/data/dataloader.hpp"
#include "dltrain/distributed/process_group.hpp"
#include "dltrain/distributed/zero.hpp"
#include "dltrain/io/checkpoint.hpp"
#include "dltrain/nn/module.hpp"
#include "dltrain/optim/optimizer.hpp"
#include "dltrain/optim/scheduler.hpp"

namespace dltrain::train {

CheckpointFile::CheckpointFile(std::string path, nn::Module& model, optim::Optimizer& opt,
                               optim::LRScheduler& sched, amp::GradScaler& scaler,
                               CheckpointFileOptions options)
    : path_(std::move(path)),
      model_(model),
      opt_(opt),
      sched_(sched),
      scaler_(scaler),
      options_(std::move(options)) {
  DLTRAIN_CHECK(options_.global_batch >= 1, "train::CheckpointFile('", path_,
                "'): options.global_batch is ", options_.global_batch,
                "; pass the run's global batch (per-rank batch x ranks), so that a resumed run "
                "finds its place in the epoch");
  if (!path_.empty()) preempt_.emplace();
}

ResumePosition CheckpointFile::resume(bool asked) {
  ResumePosition& r = start_;
  r.saved_global_batch = r.global_batch = options_.global_batch;
  if (!asked || path_.empty() || !std::ifstream(path_).good()) return r;
  const io::TrainingProgress p =
      io::load_checkpoint(path_, model_, &opt_, &sched_, &scaler_, {.extra = options_.extra});
  r = resume_data_position(
      p, options_.global_batch, &opt_, &sched_,
      {.lr_scaling = options_.lr_scaling, .scheduler_unit = options_.scheduler_unit});
  if (options_.verbose)
    std::printf("resumed from %s: epoch %lld, sample %lld, step %lld\n", path_.c_str(),
                static_cast<long long>(r.epoch + 1), static_cast<long long>(r.samples_in_epoch),
                static_cast<long long>(r.step));
  return r;
}

int64_t CheckpointFile::begin_epoch(data::DataLoader& loader, int64_t epoch) const {
  loader.set_epoch(epoch);
  const int64_t first = epoch == start_.epoch ? start_.samples_in_epoch : 0;
  loader.set_start_sample(first);
  return first / options_.global_batch;
}

void CheckpointFile::save(int64_t epoch, int64_t step, const data::DataLoader& loader,
                          int64_t batches) {
  const int64_t samples = loader.samples_after(batches);
  save_at(epoch, step, samples / options_.global_batch, samples);
}

void CheckpointFile::save(int64_t epoch, int64_t step) { save_at(epoch, step, 0, 0); }

bool CheckpointFile::stop_for_requeue(int64_t epoch, int64_t step, const data::DataLoader& loader,
                                      int64_t batches) {
  if (!preempt_ || !preempt_->requested()) return false;
  save(epoch, step, loader, batches);
  const int sig = preempt_->signal() ? preempt_->signal() : SIGTERM;  // another rank's
  if (options_.verbose) {
    std::printf(
        "preempted by %s at epoch %lld, step %lld: state saved, exiting with %d so "
        "that the job is requeued (resume with --resume)\n",
        signal_name(sig), static_cast<long long>(epoch + 1), static_cast<long long>(step),
        kExitRequeue);
    std::fflush(stdout);
  }
  return true;
}

void CheckpointFile::save_at(int64_t epoch, int64_t step, int64_t batch, int64_t samples) {
  if (path_.empty()) return;
  // Every rank gathers the state (a state_dict() may be collective: ZeRO's optimizer state is
  // broadcast from its owners, to rank 0 only here); rank 0 writes, and a failure there (disk
  // full) is raised on every rank.
  const auto* zero = dynamic_cast<const distributed::ZeroRedundancyOptimizer*>(&opt_);
  io::Checkpoint c = io::make_checkpoint(model_, zero ? nullptr : &opt_, &sched_, &scaler_,
                                         {.epoch = epoch,
                                          .step = step,
                                          .batch_in_epoch = batch,
                                          .samples_in_epoch = samples,
                                          .global_batch = options_.global_batch},
                                         options_.metadata, options_.extra);
  if (zero) c.optimizer = zero->consolidated_state_dict(0);
  distributed::on_main_process([&] { io::write_checkpoint(path_, c); });
  if (options_.verbose)
    std::printf("checkpoint: %s (epoch %lld, sample %lld, step %lld)\n", path_.c_str(),
                static_cast<long long>(epoch + 1), static_cast<long long>(samples),
                static_cast<long long>(step));
}

}  // namespace dltrain::train
