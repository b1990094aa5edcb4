// The course's large-batch flags (issue 30, day 2 "Entraînement et large batches"): the
// optimizer (--optimizer sgd|lars|lamb), the learning-rate schedule (--lr-schedule
// onecycle|cosine|poly, --warmup-epochs), the weight-decay exclusion of normalisation
// parameters and biases (--no-bn-weight-decay) and the moving average of the weights (--ema
// DECAY, --ema-warmup, --ema-every K), and the library objects they build (header-only).
//
// Invariants: every schedule is stepped once per optimizer step and spans `total_steps`;
// onecycle has its own warm-up (the first 30 % of the cycle), so --warmup-epochs is refused with
// it; a warm-up is LinearLR from 1/1000 of the learning rate, then the decay starts from the
// full learning rate (SequentialLR). With --no-bn-weight-decay the no-decay group also leaves
// LARS/LAMB's trust ratio out, as MLPerf's ResNet-50 recipe does.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/distributed/zero.hpp"
#include "dltrain/nn/module.hpp"
#include "dltrain/optim/ema.hpp"
#include "dltrain/optim/lamb.hpp"
#include "dltrain/optim/lars.hpp"
#include "dltrain/optim/param_groups.hpp"
#include "dltrain/optim/scheduler.hpp"
#include "dltrain/optim/sgd.hpp"

namespace dltrain::apps {

/// A flag's number as %g prints it ("0.5", "1e-04"), for the lines that describe a run.
inline std::string flag_number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

struct OptimFlags {
  std::string optimizer = "sgd";
  std::string lr_schedule = "onecycle";
  double warmup_epochs = 0;
  bool no_bn_weight_decay = false;
  /// Where --lr-schedule poly ends (0; MLPerf's recipe ends at 1e-4).
  double poly_end_lr = 0;
  /// --zero STAGE (add_zero_to): 1 shards the optimizer state over the data-parallel ranks,
  /// 2 the gradients too.
  int64_t zero = 0;
  /// --accumulation-steps K (add_accumulation_to): batches whose gradients one optimizer step
  /// sums.
  int64_t accumulation_steps = 1;

  void add_to(cli::Flags& f) {
    f.group(cli::group::kLargeBatch);
    f.add("--optimizer", &optimizer,
          "sgd (momentum), lars (You et al. 2017, MLPerf's ResNet-50) or lamb (You et al. 2019)")
        .choices({"sgd", "lars", "lamb"});
    f.add("--lr-schedule", &lr_schedule,
          "onecycle (its own warm-up), cosine (to 0) or poly (power 2, to 0), per optimizer step")
        .choices({"onecycle", "cosine", "poly"});
    f.add("--warmup-epochs", &warmup_epochs,
          "linear warm-up from lr/1000 before cosine or poly (epochs, may be fractional)")
        .min(0);
    f.add_switch("--no-bn-weight-decay", &no_bn_weight_decay,
                 "no weight decay (and no LARS/LAMB trust ratio) on normalisation weights and "
                 "biases");
  }
  /// --accumulation-steps, for programs whose loop accumulates (train::TrainStep::
  /// set_accumulation); in the large-batch group, after add_to's flags.
  void add_accumulation_to(cli::Flags& f) {
    f.group(cli::group::kLargeBatch);
    f.add("--accumulation-steps", &accumulation_steps,
          "batches whose gradients one optimizer step sums (gradient aggregation; global batch = "
          "ranks x batch size x this)")
        .positive();
  }
  /// --zero, for programs that train data-parallel.
  void add_zero_to(cli::Flags& f) {
    f.group(cli::group::kDistributed);
    f.add("--zero", &zero,
          "ZeRO stage under data parallelism: 1 shards the optimizer state over the ranks "
          "(ZeroRedundancyOptimizer), 2 the gradients too (reduce-scattered); 0: off")
        .min(0)
        .value_name("STAGE");
  }
  /// Checks what concerns several flags (after Flags::parse).
  void check(const cli::Flags& f) const {
    if (zero > 2) f.fail("--zero must be 0, 1 or 2 (ZeRO-3 is FSDP: distributed/fsdp.hpp)");
    if (warmup_epochs > 0 && lr_schedule == "onecycle")
      f.fail(
          "--warmup-epochs applies to --lr-schedule cosine or poly (onecycle warms up by "
          "itself); drop it or choose cosine or poly");
  }
  /// "LARS, poly schedule after a 1-epoch warm-up, no decay on 107 norm/bias tensors".
  std::string describe(const optim::Optimizer& opt) const {
    std::string s = std::string(opt.name()) + ", " + lr_schedule + " schedule";
    if (zero > 0)
      s += ", ZeRO-" + std::to_string(zero) + " (optimizer state" +
           (zero == 2 ? " and gradients" : "") + " sharded over " +
           std::to_string(dynamic_cast<const distributed::ZeroRedundancyOptimizer&>(opt)
                              .process_group()
                              .size()) +
           " ranks)";
    if (warmup_epochs > 0) s += " after a " + flag_number(warmup_epochs) + "-epoch warm-up";
    if (no_bn_weight_decay && opt.param_groups().size() > 1)
      s += ", no weight decay on " + std::to_string(opt.param_groups()[1].params.size()) +
           " norm/bias tensors";
    return s;
  }

  /// The optimizer over `model`'s parameters: `momentum` is SGD's and LARS's (LAMB's beta1).
  std::unique_ptr<optim::Optimizer> make_optimizer(const nn::Module& model, double lr,
                                                   double momentum, double weight_decay,
                                                   bool nesterov = false) const {
    std::vector<optim::ParamGroup> groups;
    if (no_bn_weight_decay)
      groups = optim::param_groups_no_decay(model, weight_decay,
                                            {.exclude_from_trust_ratio = optimizer != "sgd"});
    else
      groups.push_back({.params = model.parameters()});
    const std::string kind = optimizer;
    auto make = [kind, lr, momentum, weight_decay,
                 nesterov](std::vector<optim::ParamGroup> g) -> std::unique_ptr<optim::Optimizer> {
      if (kind == "lars")
        return std::make_unique<optim::LARS>(
            std::move(g),
            optim::LARSOptions{.lr = lr, .momentum = momentum, .weight_decay = weight_decay});
      if (kind == "lamb")
        return std::make_unique<optim::LAMB>(
            std::move(g),
            optim::LAMBOptions{.lr = lr, .betas = {momentum, 0.999}, .weight_decay = weight_decay});
      return std::make_unique<optim::SGD>(
          std::move(g),
          optim::SGDOptions{
              .lr = lr, .momentum = momentum, .weight_decay = weight_decay, .nesterov = nesterov});
    };
    if (zero > 0)  // the state sharded over the default group's ranks
      return std::make_unique<distributed::ZeroRedundancyOptimizer>(std::move(groups), make);
    return make(std::move(groups));
  }
  /// With --zero 2: the ZeRO optimizer whose partition DDP scatters the gradients by
  /// (DDPOptions::shard_gradients); null otherwise.
  const distributed::ZeroRedundancyOptimizer* shard_gradients(const optim::Optimizer& opt) const {
    return zero == 2 ? dynamic_cast<const distributed::ZeroRedundancyOptimizer*>(&opt) : nullptr;
  }

  /// The schedule over `total_steps` optimizer steps (`steps_per_epoch` of them an epoch).
  std::unique_ptr<optim::LRScheduler> make_schedule(optim::Optimizer& opt, double lr,
                                                    int64_t total_steps,
                                                    int64_t steps_per_epoch) const {
    if (lr_schedule == "onecycle")
      return std::make_unique<optim::OneCycleLR>(opt, lr, std::max<int64_t>(total_steps, 1));
    const int64_t warm = std::max<int64_t>(
        std::min<int64_t>(std::llround(warmup_epochs * static_cast<double>(steps_per_epoch)),
                          total_steps - 1),
        0);
    auto decay = [&](int64_t steps) -> std::unique_ptr<optim::LRScheduler> {
      steps = std::max<int64_t>(steps, 1);
      if (lr_schedule == "cosine") return std::make_unique<optim::CosineAnnealingLR>(opt, steps);
      return std::make_unique<optim::PolynomialLR>(opt, steps, 2.0, poly_end_lr);
    };
    if (warm == 0) return decay(total_steps);
    // As PyTorch's recipes build it: the ramp first, then the decay, then the sequence.
    std::shared_ptr<optim::LRScheduler> ramp =
        std::make_shared<optim::LinearLR>(opt, 1e-3, 1.0, warm);
    std::shared_ptr<optim::LRScheduler> after = decay(total_steps - warm);
    return std::make_unique<optim::SequentialLR>(
        opt, std::vector<std::shared_ptr<optim::LRScheduler>>{ramp, after},
        std::vector<int64_t>{warm});
  }
};

/// --ema DECAY [--ema-warmup] [--ema-every K]: an optim::ModelEMA of the weights, updated after
/// every optimizer step, evaluated beside the model at each epoch end and saved in the
/// checkpoint (so that a resumed run continues the same average).
struct EmaFlags {
  double decay = 0;  // 0: off
  bool warmup = false;
  int64_t every = 1;

  void add_to(cli::Flags& f) {
    f.group(cli::group::kLargeBatch);
    f.add("--ema", &decay,
          "keep an exponential moving average of the weights with this decay (e.g. 0.9999), "
          "evaluated beside the model each epoch and checkpointed (0: off)")
        .min(0)
        .value_name("DECAY");
    f.add_switch("--ema-warmup", &warmup,
                 "with --ema: decay min(DECAY, (1 + t) / (10 + t)) at the t-th update, so the "
                 "average forgets the initial weights early");
    f.add("--ema-every", &every, "with --ema: update the average every K optimizer steps")
        .positive()
        .value_name("K");
  }
  void check(const cli::Flags& f) const {
    if (decay > 1)
      f.fail("--ema must be a decay in [0, 1] (e.g. 0.9999), got " + flag_number(decay));
    if (decay == 0 && (f.given("--ema-warmup") || f.given("--ema-every")))
      f.fail("--ema-warmup and --ema-every need --ema DECAY");
  }
  bool enabled() const { return decay > 0; }
  /// The average of `model`'s current weights (null without --ema).
  std::unique_ptr<optim::ModelEMA> make(const nn::Module& model) const {
    if (!enabled()) return nullptr;
    return std::make_unique<optim::ModelEMA>(
        model, optim::ModelEMAOptions{.decay = decay, .warmup = warmup, .update_every = every});
  }
  std::string describe() const {
    return "weights' moving average: decay " + flag_number(decay) +
           (warmup ? " with warm-up" : "") +
           (every > 1 ? ", every " + std::to_string(every) + " steps" : "");
  }
};

}  // namespace dltrain::apps
