// Pipeline parallelism: an nn::Sequential cut into consecutive stages, one per rank of a
// pipeline group, trained on micro-batches (GPipe and 1F1B schedules).
//
// Every rank builds the same model (same seed) and hands it to Pipeline, which keeps the
// modules of its stage (stage = rank in the pipeline group) in stage_module(), a Sequential
// whose children keep their names in the full model ("3", "4", ...), so the stage's
// state_dict keys are the full model's. forward_backward(input, target, loss) cuts the batch
// into micro-batches along dim 0; stage 0 runs its modules on each, sends the activation to
// stage 1 (a small header with dtype and shape, then the values), and so on to the last stage,
// which applies `loss` to its output and the micro-batch's targets. Backward runs the other
// way: the last stage back-propagates its loss, and every stage sends the gradient of its input
// to the stage before it, which back-propagates it through its own modules. Parameter
// gradients accumulate in grad() over the micro-batches; each micro-batch's loss is weighted by
// its share of the batch (b_j / B) so that the accumulated gradient is the gradient of the full
// batch's mean loss (when `loss` returns a mean; mean_loss = false leaves sums unweighted).
// The optimizer then steps parameters() on each rank, as for one process.
//
// Schedules (per stage s of p, m micro-batches): GPipe runs all m forwards, then all m
// backwards, storing m micro-batches' activations. 1F1B runs min(p - s - 1, m) forwards (the
// warm-up), then alternates one forward and one backward, then drains the backwards, so that
// stage s stores at most min(p - s, m) <= p micro-batches' activations. The number of micro-
// batches whose forward has run and whose backward has not is counted
// (stored_activations(), peak_stored_activations()): the tests assert both bounds with it.
//
// Communication: sends are asynchronous (ProcessGroup::send) and waited for at the end of the
// step; the only waits inside the schedule are receives, and the schedules are the standard
// deadlock-free orders given non-blocking sends. Tags are the micro-batch index (x 2, + 1 for
// gradients) modulo the group's tag range. The group must be an MPI group (CPU tensors, or
// CUDA tensors staged by it) or a group of one; NCCL's send/recv share one stream, where
// 1F1B's crossing sends deadlock, so an NCCL pipeline group is refused.
//
// Checkpoints: full_state_dict and full_optimizer_state_dict gather the stages' model and
// optimizer states on one rank, under the names and flat indices a single process training the
// whole model would save (optimizer parameter groups concatenated over the stages, in stage
// order: the same groups as that process's when every stage's optimizer was built by the same
// rule, e.g. optim::param_groups_no_decay(stage_module())), so io::write_checkpoint writes an
// ordinary checkpoint that a single process loads; load_full_state_dict and
// load_full_optimizer_state_dict take such a state (or a single process's) back onto the
// stages, so training resumes on the pipeline (also with another cut).
//
// Errors: an exception on one rank (a loss that throws, a shape mismatch) ends the job as any
// uncaught exception after distributed::init() does (MPI_Abort), so the ranks waiting in a recv
// for it do not hang; the collective timeout catches a rank that is stuck.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dltrain/core/state_dict.hpp"
#include "dltrain/distributed/process_group.hpp"
#include "dltrain/nn/containers.hpp"

namespace dltrain::optim {
class Optimizer;
}

namespace dltrain::distributed {

enum class PipelineSchedule {
  /// All forwards, then all backwards: m micro-batches of activations stored per stage.
  GPipe,
  /// One forward one backward after a warm-up: at most p micro-batches stored per stage.
  OneFOneB,
};
/// "gpipe" or "1f1b".
const char* schedule_name(PipelineSchedule s);
/// Parses "gpipe" / "1f1b" (what --schedule takes); throws naming the choices otherwise.
PipelineSchedule parse_schedule(const std::string& name);

/// The loss on the last stage: the model's output for one micro-batch and that micro-batch's
/// targets, to a one-element tensor.
using PipelineLoss = std::function<Tensor(const Tensor& output, const Tensor& target)>;

struct PipelineOptions {
  /// The pipeline group, one stage per rank (stage = rank in it); null = default_group().
  ProcessGroup* group = nullptr;
  /// Where stages 1..p-1 start: p - 1 increasing module indices in (0, n). Empty: balanced by
  /// parameter count (balanced_cuts).
  std::vector<int64_t> cuts{};
  /// Micro-batches per batch (1 <= m <= batch size).
  int micro_batches = 1;
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  /// `loss` returns the micro-batch's mean: weight it by the micro-batch's share of the batch.
  /// False: it returns a sum, added unweighted.
  bool mean_loss = true;
  /// Data parallelism over replicas of the pipeline (RankLayout::data_group()): after each
  /// step, this stage's parameter gradients are averaged over this group (the same stage of
  /// every replica), and forward_backward returns the replicas' mean loss. Null: none.
  ProcessGroup* data_group = nullptr;
  /// Activation checkpointing per stage: each micro-batch's stage forward keeps only its
  /// input and is recomputed in backward (nn::checkpoint), so a stage stores one input per
  /// micro-batch in flight instead of all its intermediates. Same gradients.
  bool checkpoint_activations = false;
  /// Mixed precision: the stages' forwards and the loss run under amp::autocast of
  /// `autocast_dtype` on the stage's device (backward outside it, as train::TrainStep does);
  /// activations cross stages in the dtype they have (bf16/f16 halve the traffic).
  bool autocast = false;
  DType autocast_dtype = DType::bf16;
};

class Pipeline {
 public:
  /// Cuts `model` into the group's number of stages and keeps this rank's. Every rank must
  /// pass the same model structure and options. Throws dltrain::Error for cuts that are not p-1
  /// increasing indices inside the model, fewer modules than stages, micro_batches < 1, or an
  /// NCCL group.
  Pipeline(std::shared_ptr<nn::Sequential> model, PipelineOptions options = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  /// Forward and backward of one batch, accumulating into the stage's parameters' grad().
  /// `input` is read on the first stage, `target` on the last (other ranks may pass undefined
  /// tensors); their dim 0 is the batch. Returns the batch's loss (the weighted sum of the
  /// micro-batches' losses) on every rank of the pipeline. Collective over the pipeline group.
  double forward_backward(const Tensor& input, const Tensor& target, const PipelineLoss& loss);

  /// This stage's modules, under the full model's names.
  nn::Sequential& stage_module() { return *stage_; }
  /// This stage's parameters (what its optimizer steps).
  std::vector<Tensor> parameters() const { return stage_->parameters(); }
  int stage() const { return stage_index_; }
  int num_stages() const { return num_stages_; }
  /// Module indices where each stage starts, and the model's size at the end (p + 1 entries).
  const std::vector<int64_t>& boundaries() const { return bounds_; }
  ProcessGroup& group() const { return *group_; }

  /// Micro-batches whose activations this stage holds now (forward done, backward not), and
  /// the most it held since construction or reset_peak_stored_activations().
  int64_t stored_activations() const { return stored_; }
  int64_t peak_stored_activations() const { return peak_stored_; }
  void reset_peak_stored_activations() { peak_stored_ = stored_; }

  /// Wall time of the last forward_backward on this rank, and the part of it spent computing
  /// (the stage's forward, loss and backward; the rest is waiting for receives, sends and the
  /// loss broadcast). 1 - compute / step is this stage's measured bubble fraction.
  struct StepTimes {
    double step_s = 0, compute_s = 0;
  };
  const StepTimes& last_step_times() const { return times_; }

  /// The full model's state dict, every stage's entries gathered on pipeline rank `root`
  /// (under the full model's names: a single process's load_state_dict takes it); an empty
  /// one on the other ranks. Collective over the pipeline group.
  StateDict full_state_dict(int root = 0);
  /// full_state_dict of a given state of this stage (its entries under the full model's
  /// names): distributed::gather_state_dict(stage_module()) when the stages hold
  /// tensor-parallel layers. Collective over the pipeline group.
  StateDict full_state_dict(const StateDict& stage_state, int root);
  /// This stage's entries of a full model state dict (strict: a missing one throws naming it).
  StateDict stage_state(const StateDict& full) const;
  /// Loads this stage's entries of a full state dict (from full_state_dict or a single
  /// process's model); entries of other stages are skipped. Strict for this stage: a missing
  /// entry or another shape throws naming it. No communication.
  void load_full_state_dict(const StateDict& state);
  /// The state of the whole model's optimizer, on pipeline rank `root` (empty on the others):
  /// each stage's `optimizer` (over exactly this stage's parameters) gathered, its flat
  /// indices renumbered to the full model's and its parameter group k joined with the other
  /// stages' group k, as a single-process optimizer of the same type over the full model's
  /// groups saves it (that optimizer's load_state_dict takes it). Every stage's optimizer must
  /// have the same type, number of groups and group hyper-parameters (a group may be empty on
  /// a stage); dltrain::Error names what differs. Collective over the pipeline group.
  StateDict full_optimizer_state_dict(const optim::Optimizer& optimizer, int root = 0);
  /// full_optimizer_state_dict of a given state of this stage's optimizer (numbered as that
  /// optimizer numbers it): distributed::gather_optimizer_state_dict(stage_module(), opt) when
  /// the stages hold tensor-parallel layers. Collective over the pipeline group.
  StateDict full_optimizer_state_dict(const StateDict& stage_optimizer_state, int root);
  /// Loads this stage's part of a whole-model optimizer state (from full_optimizer_state_dict
  /// or a single process's optimizer) into `optimizer`, built as for
  /// full_optimizer_state_dict; the cut may differ from the one it was saved with. Throws
  /// dltrain::Error (on every rank) when the state's groups do not hold the stages' parameters.
  /// Collective over the pipeline group (the stages exchange their group sizes).
  void load_full_optimizer_state_dict(optim::Optimizer& optimizer, const StateDict& state);
  /// This stage's part of a whole-model optimizer state, numbered as `optimizer` numbers its
  /// parameters (what load_full_optimizer_state_dict loads into it); for tensor-parallel
  /// stages, distributed::load_full_optimizer_state_dict slices it. Collective as that.
  StateDict stage_optimizer_state(const optim::Optimizer& optimizer, const StateDict& state);

  /// Cuts that balance the stages' parameter counts: the p - 1 start indices minimising the
  /// largest stage's number of parameter elements (each stage at least one module).
  static std::vector<int64_t> balanced_cuts(const nn::Sequential& model, int stages);
  /// Cuts that balance the stages' measured forward time: every rank of `group` times each
  /// module's forward on `example` (a micro-batch's input to the whole model; the median of
  /// `repeats` runs after one warm-up, without autograd), the times are averaged over the group
  /// (so every rank gets the same cuts) and partitioned as balanced_cuts does. Collective over
  /// `group` (null: default_group()); `stages` defaults to its size.
  static std::vector<int64_t> timed_cuts(nn::Sequential& model, const Tensor& example,
                                         ProcessGroup* group = nullptr, int stages = 0,
                                         int repeats = 3);
  /// The module times timed_cuts measured last on this thread (seconds per module, averaged
  /// over the group), for reports.
  static const std::vector<double>& last_module_times();

 private:
  struct MicroBatch;
  void forward_one(int j, const PipelineLoss& loss);
  void backward_one(int j);

  ProcessGroup* group_ = nullptr;
  PipelineOptions options_;
  std::shared_ptr<nn::Sequential> stage_;
  std::vector<int64_t> bounds_;
  int stage_index_ = 0, num_stages_ = 1;
  Device device_ = Device::cpu();
  int64_t stored_ = 0, peak_stored_ = 0;
  // The step in progress.
  std::vector<Tensor> inputs_, targets_;
  std::vector<double> weights_;
  std::vector<std::unique_ptr<MicroBatch>> micro_;
  std::vector<Work> sends_;
  double loss_sum_ = 0.0;
  StepTimes times_;
};

}  // namespace dltrain::distributed
