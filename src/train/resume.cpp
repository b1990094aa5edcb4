// Resuming with another global batch (see dltrain/train/resume.hpp).
#include "dltrain/train/resume.hpp"

#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>

#include "dltrain/core/error.hpp"
#include "dltrain/distributed/process_group.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/optim/optimizer.hpp"
#include "dltrain/optim/scheduler.hpp"

namespace dltrain::train {

ResumePosition resume_data_position(const io::TrainingProgress& progress, int64_t global_batch,
                                    optim::Optimizer* optimizer, optim::LRScheduler* scheduler,
                                    const ResumeOptions& options) {
  DLTRAIN_CHECK(global_batch >= 1, "resume_data_position: global_batch must be >= 1 (per-rank ",
                "batch x world size), got ", global_batch);
  ResumePosition r;
  r.epoch = progress.epoch;
  r.step = progress.step;
  r.global_batch = global_batch;
  r.saved_global_batch = progress.global_batch > 0 ? progress.global_batch : global_batch;
  r.samples_in_epoch = progress.samples_in_epoch >= 0
                           ? progress.samples_in_epoch
                           : progress.batch_in_epoch * r.saved_global_batch;
  if (!r.global_batch_changed()) return r;

  const double ratio =
      static_cast<double>(global_batch) / static_cast<double>(r.saved_global_batch);
  std::string rule;
  if (options.lr_rule) {
    r.lr_factor = options.lr_rule(r.saved_global_batch, global_batch);
    rule = "the user's rule";
  } else if (options.lr_scaling == LRScaling::Linear) {
    r.lr_factor = ratio;
    rule = "linear scaling";
  } else if (options.lr_scaling == LRScaling::Sqrt) {
    r.lr_factor = std::sqrt(ratio);
    rule = "square-root scaling";
  }
  DLTRAIN_CHECK(std::isfinite(r.lr_factor) && r.lr_factor > 0,
                "resume_data_position: the learning-rate rule gave factor ", r.lr_factor,
                " for global batch ", r.saved_global_batch, " -> ", global_batch,
                "; it must be positive and finite");
  if (r.lr_factor != 1.0) {
    if (optimizer)
      for (auto& g : optimizer->param_groups()) {
        if (g.lr) *g.lr *= r.lr_factor;
        if (g.initial_lr) *g.initial_lr *= r.lr_factor;
      }
    if (scheduler) {
      StateDict sd = scheduler->state_dict();
      // Every learning rate the scheduler keeps (OneCycleLR's peak and floor,
      // CosineAnnealingLR's eta_min), so the next step continues the scaled schedule.
      for (const char* key : {"base_lrs", "last_lr", "max_lrs", "min_lrs", "eta_min"})
        if (sd.contains(key)) {
          Tensor t = sd.at(key);
          mul_(t, r.lr_factor);
        }
      scheduler->load_state_dict(sd);
    }
  }
  std::ostringstream m;
  m << "global batch " << r.saved_global_batch << " -> " << global_batch << ": resuming epoch "
    << r.epoch << " after " << r.samples_in_epoch
    << " of its samples (the rest of the same order, each sample once); ";
  if (r.lr_factor != 1.0) {
    m << "learning rate x" << r.lr_factor << " (" << rule << ")";
    if (optimizer && !optimizer->param_groups().empty() && optimizer->param_groups()[0].lr)
      m << ", now " << *optimizer->param_groups()[0].lr;
  } else {
    m << "learning rate unchanged (pass lr_scaling = Linear or Sqrt, or an lr_rule, to scale "
         "it)";
  }
  m << "; an epoch now takes " << global_batch << "-sample steps instead of "
    << r.saved_global_batch << "-sample ones";
  // Schedules counted in steps: converted when stepped per batch (OneCycleLR always is).
  const bool one_cycle = dynamic_cast<optim::OneCycleLR*>(scheduler) != nullptr;
  const bool per_batch = options.scheduler_unit == SchedulerUnit::Batch ||
                         (options.scheduler_unit == SchedulerUnit::Auto && one_cycle);
  if (scheduler && per_batch && (!one_cycle || options.rescale_one_cycle)) {
    const std::optional<std::string> what = scheduler->rescale_remaining(
        static_cast<double>(r.saved_global_batch) / static_cast<double>(global_batch));
    if (!what)
      m << "; " << scheduler->name()
        << "'s steps cannot be converted (a function of the step or a composite schedule): "
           "it continues counting steps of the new global batch";
    else if (!what->empty())
      m << "; " << scheduler->name() << "'s " << *what
        << (one_cycle ? " (the same samples, the cycle continued from where it was)"
                      : " (the same samples)");
  } else if (one_cycle && options.scheduler_unit != SchedulerUnit::Epoch) {
    m << " (OneCycleLR's remaining steps are left as they are: rescale_one_cycle is off)";
  } else if (scheduler && options.scheduler_unit == SchedulerUnit::Auto) {
    m << " (" << scheduler->name()
      << "'s step counts, such as milestones, are left as they are: right when it steps once "
         "per epoch; pass scheduler_unit = Batch if it steps once per batch)";
  }
  r.message = m.str();
  if (options.print && distributed::is_main_process())
    std::printf("dltrain: %s\n", r.message.c_str());
  return r;
}

}  // namespace dltrain::train
