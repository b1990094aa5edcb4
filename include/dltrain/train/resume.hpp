// Resuming a checkpoint with another global batch: other ranks, or another per-rank batch.
//
// A checkpoint keeps the data position of its epoch in samples (io::TrainingProgress::
// samples_in_epoch, counted over all ranks), not in steps, so a run resumed with any world size
// and per-rank batch continues the same epoch order where the interrupted run stopped: no
// sample of the epoch is seen twice or skipped (DataLoader::set_start_sample). What the global
// batch change does to the optimisation is the user's choice, made explicit here: the learning
// rate follows a scaling rule (linear, as Goyal et al.; square root, as often for Adam; or the
// user's own), or stays, and a message says what changed:
//
//   io::TrainingProgress p = io::load_checkpoint(path, *model, &opt, &sched);
//   auto r = train::resume_data_position(p, per_rank_batch * world_size, &opt, &sched,
//                                        {.lr_scaling = train::LRScaling::Linear});
//   for (int64_t epoch = r.epoch; ...; ++epoch) {
//     loader.set_epoch(epoch);
//     if (epoch == r.epoch) loader.set_start_sample(r.samples_in_epoch);
//     ...; samples_in_epoch += global_batch per step; save {epoch, step, batch, samples, G}
//   }
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "dltrain/io/checkpoint.hpp"

namespace dltrain::optim {
class Optimizer;
class LRScheduler;
}  // namespace dltrain::optim

namespace dltrain::train {

/// What the learning rate does when the global batch changed between the checkpoint and now.
enum class LRScaling {
  /// Unchanged (the message says so, and names the rules).
  Keep,
  /// lr x new / old (Goyal et al., SGD).
  Linear,
  /// lr x sqrt(new / old).
  Sqrt,
};

/// How often the scheduler steps, which decides whether its step counts (milestones,
/// step_size, T_max, total_iters, OneCycleLR's total_steps) change with the global batch.
enum class SchedulerUnit {
  /// OneCycleLR is taken as stepped per batch (it always is); any other scheduler's counts are
  /// left as they are, and the message says so and how to convert them.
  Auto,
  /// Stepped once per batch: the counts still ahead are converted by saved / new global batch
  /// (LRScheduler::rescale_remaining), so each milestone comes after the same samples.
  Batch,
  /// Stepped once per epoch: an epoch holds the same samples whatever the batch, so nothing
  /// changes (OneCycleLR's total_steps included).
  Epoch,
};

struct ResumeOptions {
  LRScaling lr_scaling = LRScaling::Keep;
  /// The user's own rule: the factor the learning rates are multiplied by, given the saved and
  /// the new global batch. Overrides lr_scaling when set.
  std::function<double(int64_t saved_global_batch, int64_t global_batch)> lr_rule = nullptr;
  /// Print the message (on rank 0 only) when the global batch changed.
  bool print = true;
  /// A OneCycleLR scheduler's remaining steps are scaled by saved / new global batch (its
  /// cycle then ends with the same samples as planned: OneCycleLR::rescale_remaining), unless
  /// scheduler_unit is Epoch.
  bool rescale_one_cycle = true;
  /// How often the scheduler steps (see SchedulerUnit): with Batch, every scheduler's step
  /// counts still ahead are converted to the new global batch.
  SchedulerUnit scheduler_unit = SchedulerUnit::Auto;
};

struct ResumePosition {
  /// The epoch to resume in and the samples of it already trained (over all ranks): pass them
  /// to DataLoader::set_epoch and then DataLoader::set_start_sample.
  int64_t epoch = 0;
  int64_t samples_in_epoch = 0;
  /// The saved optimizer step count.
  int64_t step = 0;
  /// The checkpoint's global batch (the new one when it was not recorded) and the new one.
  int64_t saved_global_batch = 0;
  int64_t global_batch = 0;
  /// What the learning rates were multiplied by (1 when unchanged).
  double lr_factor = 1.0;
  /// "global batch 16 -> 12: ..." when the global batch changed, else empty.
  std::string message;
  bool global_batch_changed() const { return saved_global_batch != global_batch; }
};

/// The data position to resume `progress` at with this run's `global_batch` (per-rank batch x
/// world size), and the learning-rate change it implies. The position is samples_in_epoch
/// when the checkpoint recorded it, else batch_in_epoch x the saved global batch (x the new
/// one for files that did not record it, which is exact only when it did not change). When the
/// global batch changed, multiplies every group's lr and initial_lr in `optimizer` and the
/// learning rates `scheduler` keeps (base, last, OneCycleLR's peak and floor, cosine's eta_min;
/// either may be null) by the rule's factor, so the schedule continues from the scaled rate.
/// A OneCycleLR's rest of the cycle is stretched to the new number of steps (see
/// ResumeOptions::rescale_one_cycle); with scheduler_unit = Batch, so are the counts of every
/// other scheduler that has them (MultiStepLR's milestones, StepLR's step_size, cosine's T_max,
/// LinearLR's and ConstantLR's total_iters: LRScheduler::rescale_remaining), and the message
/// says what changed; with Auto they stay, and the message says so.
/// Throws dltrain::Error for a global_batch < 1 or a factor that is not positive and finite.
ResumePosition resume_data_position(const io::TrainingProgress& progress, int64_t global_batch,
                                    optim::Optimizer* optimizer, optim::LRScheduler* scheduler,
                                    const ResumeOptions& options = {});

}  // namespace dltrain::train
