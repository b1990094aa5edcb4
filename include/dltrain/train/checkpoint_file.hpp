// One training run's checkpoint file: resume from it, save to it, stop for a requeue when the
// job is preempted. What every training program needs around io::save_checkpoint /
// io::load_checkpoint, train::resume_data_position and train::PreemptionHandler, as one object:
//
//   train::CheckpointFile ckpt("run.h5", *model, opt, sched, scaler,
//                              {.global_batch = batch * distributed::world_size()});
//   const train::ResumePosition start = ckpt.resume(/*asked=*/args.resume);
//   int64_t step = start.step;
//   for (int64_t epoch = start.epoch; epoch < epochs; ++epoch) {
//     const int64_t first_batch = ckpt.begin_epoch(loader, epoch);  // the resumed epoch's rest
//     int64_t batches = 0;
//     for (auto& batch : loader) {
//       ...train one step...; ++step; ++batches;
//       if (ckpt.stop_for_requeue(epoch, step, loader, batches)) return train::kExitRequeue;
//     }
//     ckpt.save(epoch + 1, step);
//   }
//
// The data position is saved in samples of the epoch over all ranks, with the run's global
// batch (per-rank batch x ranks), so a job resumes on any number of ranks or with another
// per-rank batch: the rest of the same epoch order, each sample once, and the learning rate
// scaled as `lr_scaling` says (train::resume_data_position). Rank 0 writes; every rank waits
// until the file is complete, and a failure there (disk full) is raised on every rank.
//
// Preemption: with a path, a train::PreemptionHandler is installed (Slurm's
// `--signal=USR1@T` before the wall time, SIGTERM on preemption or scancel); without one the
// signals keep their default action. An empty path makes every call a no-op.
//
// Every rank gathers the state before rank 0 writes it (io::make_checkpoint), so state dicts
// that are collective work: a distributed::ZeroRedundancyOptimizer's state is consolidated on
// rank 0 (the single-process optimizer's keys; a resume on any rank count re-shards it). FSDP's
// sharded model is not supported here (its state is FullyShardedDataParallel's, not the
// module's): save it as docs/memory.md shows.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dltrain/io/checkpoint.hpp"
#include "dltrain/train/preemption.hpp"
#include "dltrain/train/resume.hpp"

namespace dltrain {
namespace nn {
class Module;
}
namespace optim {
class Optimizer;
class LRScheduler;
}  // namespace optim
namespace amp {
class GradScaler;
}
namespace data {
class DataLoader;
}
}  // namespace dltrain

namespace dltrain::train {

struct CheckpointFileOptions {
  /// The global batch of this run: per-rank batch x ranks (required, >= 1).
  int64_t global_batch = 0;
  /// Saved with every checkpoint (e.g. {"example", "resnet50"}).
  std::map<std::string, std::string> metadata{};
  /// What the learning rate does when the run resumes with another global batch.
  LRScaling lr_scaling = LRScaling::Keep;
  /// How often the scheduler steps (its step counts follow the global batch when per batch).
  SchedulerUnit scheduler_unit = SchedulerUnit::Batch;
  /// Print a line when resuming, saving and stopping for a requeue.
  bool verbose = true;
  /// Further states saved and resumed with the rest (io::ExtraState::of("ema", ema)); a resume
  /// from a file without one of them is refused.
  std::vector<io::ExtraState> extra{};
};

class CheckpointFile {
 public:
  /// The model, optimizer, scheduler and scaler must outlive this object.
  CheckpointFile(std::string path, nn::Module& model, optim::Optimizer& opt,
                 optim::LRScheduler& sched, amp::GradScaler& scaler, CheckpointFileOptions options);
  CheckpointFile(const CheckpointFile&) = delete;
  CheckpointFile& operator=(const CheckpointFile&) = delete;

  /// With `asked` and an existing file: loads everything (model, optimizer, scheduler, scaler,
  /// random state), prints where training resumes and what changed with the global batch;
  /// otherwise the position of a fresh start. The position goes to the loader through
  /// begin_epoch().
  ResumePosition resume(bool asked);
  /// At the top of each epoch: selects `epoch` in `loader` and, in the epoch the run resumed
  /// in, starts it after the samples already trained. Returns the number of the epoch's first
  /// batch (for progress lines).
  int64_t begin_epoch(data::DataLoader& loader, int64_t epoch) const;
  /// Saves the state at `step`, `batches` batches into this iteration of `loader` in `epoch`
  /// (0-based).
  void save(int64_t epoch, int64_t step, const data::DataLoader& loader, int64_t batches);
  /// Saves the state at `step`, at the start of `epoch` (after the last one's end).
  void save(int64_t epoch, int64_t step);
  /// At a step boundary, on every rank (collective with several ranks): when a preemption
  /// signal reached any rank, saves the state and returns true; the program then exits with
  /// train::kExitRequeue, which a requeueing job script turns into a requeue.
  bool stop_for_requeue(int64_t epoch, int64_t step, const data::DataLoader& loader,
                        int64_t batches);

  const std::string& path() const { return path_; }
  int64_t global_batch() const { return options_.global_batch; }

 private:
  void save_at(int64_t epoch, int64_t step, int64_t batch, int64_t samples);

  std::string path_;
  nn::Module& model_;
  optim::Optimizer& opt_;
  optim::LRScheduler& sched_;
  amp::GradScaler& scaler_;
  CheckpointFileOptions options_;
  ResumePosition start_;
  std::optional<PreemptionHandler> preempt_;
};

}  // namespace dltrain::train
