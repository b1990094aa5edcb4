// Pipeline: the stage split, the two schedules and the gathered state dict (see the header for
// the protocol). Invariants: between steps no micro-batch is stored (stored_ == 0) and no send
// is in flight; within a step, stage s receives micro-batch j's activation only from s - 1 and
// its gradient only from s + 1, each pair of stages exchanging in micro-batch order, so the
// (source, tag) matching of the group never has two candidates.
#include "dltrain/distributed/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <sstream>

#include "dltrain/amp/autocast.hpp"
#include "dltrain/autograd/node.hpp"
#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/nn/checkpoint.hpp"
#include "dltrain/ops/elementwise.hpp"
#include "dltrain/optim/optimizer.hpp"
#include "src/optim/state_keys.hpp"

namespace dltrain::distributed {

namespace {

using Clock = std::chrono::steady_clock;

// Adds the time from construction to destruction to `acc` (seconds).
struct Timed {
  explicit Timed(double& acc) : acc_(acc), t0_(Clock::now()) {}
  ~Timed() { acc_ += std::chrono::duration<double>(Clock::now() - t0_).count(); }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;
  double& acc_;
  Clock::time_point t0_;
};

constexpr int kMaxDims = 8;
// Tags above the schedules' range: the state-dict gather.
constexpr int kStateTag = 30000;

// [dtype, ndim, dims...]: what the receiver of an activation needs to allocate it.
Tensor header_of(const Tensor& t) {
  DLTRAIN_CHECK(t.dim() <= kMaxDims, "Pipeline: an activation of ", t.dim(),
                " dimensions crosses a stage boundary; at most ", kMaxDims,
                " are supported (reshape it inside the stage)");
  std::vector<int64_t> h(2 + kMaxDims, 0);
  h[0] = static_cast<int64_t>(t.dtype());
  h[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d)
    h[static_cast<size_t>(2 + d)] = t.shape()[static_cast<size_t>(d)];
  return from_vector(h, {2 + kMaxDims});
}

// Sends the header then the values (contiguous) of `t`; the Works keep both alive.
void send_with_header(ProcessGroup& g, const Tensor& t, int dst, int tag, std::vector<Work>& out) {
  out.push_back(g.send(header_of(t), dst, tag));
  out.push_back(g.send(t.contiguous(), dst, tag));
}

Tensor recv_with_header(ProcessGroup& g, int src, int tag, Device device) {
  Tensor h = zeros({2 + kMaxDims}, DType::i64);
  g.recv(h, src, tag).wait();
  const auto v = h.to_vector<int64_t>();
  Shape shape(v.begin() + 2, v.begin() + 2 + v[1]);
  Tensor t = empty(shape, TensorOptions(static_cast<DType>(v[0])).with_device(device));
  g.recv(t, src, tag).wait();
  return t;
}

void send_string(ProcessGroup& g, const std::string& s, int dst, int tag, std::vector<Work>& out) {
  std::vector<uint8_t> bytes(s.begin(), s.end());
  send_with_header(g, from_vector(bytes, {static_cast<int64_t>(bytes.size())}), dst, tag, out);
}

std::string recv_string(ProcessGroup& g, int src, int tag) {
  const auto v = recv_with_header(g, src, tag, Device::cpu()).to_vector<uint8_t>();
  return std::string(v.begin(), v.end());
}

}  // namespace

const char* schedule_name(PipelineSchedule s) {
  return s == PipelineSchedule::GPipe ? "gpipe" : "1f1b";
}

PipelineSchedule parse_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::GPipe;
  if (name == "1f1b") return PipelineSchedule::OneFOneB;
  DLTRAIN_FAIL("pipeline schedule '", name, "' is unknown; choose gpipe or 1f1b");
}

// One micro-batch in flight on this stage: its input (a leaf requiring grad on stages > 0, so
// its gradient can be sent back) and its output (the weighted loss on the last stage).
struct Pipeline::MicroBatch {
  Tensor input, output;
};

namespace {

// The p - 1 cut points that minimise the largest stage's total cost, each stage one module at
// least. best[k][i]: the smallest largest stage when modules [0, i) fill k stages; from[k][i]
// the start of the last of them. O(p n^2): models have tens or hundreds of top-level modules.
template <typename T>
std::vector<int64_t> partition(const std::vector<T>& cost, int stages) {
  const int64_t n = static_cast<int64_t>(cost.size());
  DLTRAIN_CHECK(stages >= 1 && n >= stages, "Pipeline: ", n, " modules cannot fill ", stages,
                " stages (each stage needs one at least); use fewer stages or split the model "
                "into more modules");
  std::vector<T> prefix(static_cast<size_t>(n + 1), T(0));
  for (int64_t i = 0; i < n; ++i)
    prefix[static_cast<size_t>(i + 1)] =
        prefix[static_cast<size_t>(i)] + cost[static_cast<size_t>(i)];
  const T inf = std::numeric_limits<T>::max();
  std::vector<std::vector<T>> best(static_cast<size_t>(stages + 1),
                                   std::vector<T>(static_cast<size_t>(n + 1), inf));
  std::vector<std::vector<int64_t>> from(static_cast<size_t>(stages + 1),
                                         std::vector<int64_t>(static_cast<size_t>(n + 1), 0));
  best[0][0] = T(0);
  for (int k = 1; k <= stages; ++k)
    for (int64_t i = k; i <= n; ++i)
      for (int64_t j = k - 1; j < i; ++j) {
        const T prev = best[static_cast<size_t>(k - 1)][static_cast<size_t>(j)];
        if (prev == inf) continue;
        const T c = std::max(prev, prefix[static_cast<size_t>(i)] - prefix[static_cast<size_t>(j)]);
        if (c < best[static_cast<size_t>(k)][static_cast<size_t>(i)]) {
          best[static_cast<size_t>(k)][static_cast<size_t>(i)] = c;
          from[static_cast<size_t>(k)][static_cast<size_t>(i)] = j;
        }
      }
  std::vector<int64_t> cuts(static_cast<size_t>(stages - 1));
  int64_t i = n;
  for (int k = stages; k > 1; --k) {
    i = from[static_cast<size_t>(k)][static_cast<size_t>(i)];
    cuts[static_cast<size_t>(k - 2)] = i;
  }
  return cuts;
}

thread_local std::vector<double> last_times;

}  // namespace

std::vector<int64_t> Pipeline::balanced_cuts(const nn::Sequential& model, int stages) {
  std::vector<int64_t> params;
  for (int64_t i = 0; i < model.size(); ++i) params.push_back(model[i]->num_parameters());
  return partition(params, stages);
}

std::vector<int64_t> Pipeline::timed_cuts(nn::Sequential& model, const Tensor& example,
                                          ProcessGroup* group, int stages, int repeats) {
  ProcessGroup& g = group ? *group : default_group();
  if (stages == 0) stages = g.size();
  DLTRAIN_CHECK(repeats >= 1, "Pipeline::timed_cuts: repeats = ", repeats, "; pass 1 or more");
  DLTRAIN_CHECK(example.defined(), "Pipeline::timed_cuts: the example input is undefined");
  const int64_t n = model.size();
  // (Too few modules for the stages is refused by partition(), with the same message as
  // balanced_cuts, after the timing.)
  const NoGradGuard no_grad;
  std::vector<std::vector<double>> runs(static_cast<size_t>(n));
  for (int r = 0; r <= repeats; ++r) {  // run 0 warms up (allocator, oneDNN primitives)
    Tensor x = example;
    for (int64_t i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      x = (*model[i])(x);
      if (x.device().is_cuda()) cuda::synchronize(x.device().index);
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      if (r > 0) runs[static_cast<size_t>(i)].push_back(dt);
    }
  }
  Tensor times = zeros({n}, DType::f64);
  for (int64_t i = 0; i < n; ++i) {
    auto& v = runs[static_cast<size_t>(i)];
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    times.data<double>()[i] = v[v.size() / 2];
  }
  if (g.size() > 1) g.all_reduce(times, ReduceOp::Avg).wait();
  last_times = times.to_vector<double>();
  return partition(last_times, stages);
}

const std::vector<double>& Pipeline::last_module_times() { return last_times; }

Pipeline::Pipeline(std::shared_ptr<nn::Sequential> model, PipelineOptions options)
    : options_(std::move(options)) {
  DLTRAIN_CHECK(model != nullptr, "Pipeline: the model is null");
  group_ = options_.group ? options_.group : &default_group();
  DLTRAIN_CHECK(
      std::string(group_->backend()) != "nccl" || group_->size() == 1,
      "Pipeline: the nccl group's send/recv share one CUDA stream, where 1F1B's "
      "crossing sends deadlock; pipelines over NCCL are not built yet. Use an MPI group "
      "(distributed::init({.backend = Backend::MPI}) or new_mpi_group), which stages CUDA "
      "tensors through host memory");
  DLTRAIN_CHECK(options_.micro_batches >= 1, "Pipeline: micro_batches = ", options_.micro_batches,
                "; pass 1 or more");
  num_stages_ = group_->size();
  stage_index_ = group_->rank();
  const int64_t n = model->size();
  std::vector<int64_t> cuts = options_.cuts;
  if (cuts.empty() && num_stages_ > 1) cuts = balanced_cuts(*model, num_stages_);
  DLTRAIN_CHECK(static_cast<int>(cuts.size()) == num_stages_ - 1, "Pipeline: ", cuts.size(),
                " cut points for ", num_stages_, " stages; pass ", num_stages_ - 1,
                " (where stages 1.. start), or none to balance by parameter count");
  bounds_.push_back(0);
  for (int64_t c : cuts) {
    DLTRAIN_CHECK(c > bounds_.back() && c < n, "Pipeline: cut points ",
                  shape_str(Shape(cuts.begin(), cuts.end())), " must increase strictly inside (0, ",
                  n, ") for a model of ", n, " modules, so that every stage holds one at least");
    bounds_.push_back(c);
  }
  bounds_.push_back(n);
  stage_ = std::make_shared<nn::Sequential>();
  const auto children = model->named_children();
  for (int64_t i = bounds_[static_cast<size_t>(stage_index_)];
       i < bounds_[static_cast<size_t>(stage_index_ + 1)]; ++i) {
    const auto& c = children[static_cast<size_t>(i)];
    stage_->push_back(c.first, c.second);
  }
  stage_->train(model->is_training());
  const auto params = stage_->parameters();
  if (!params.empty()) device_ = params.front().device();
}

Pipeline::~Pipeline() {
  // A step interrupted by an exception leaves sends in flight: their tensors are kept by the
  // group until they complete, so nothing is freed under MPI.
  for (Work& w : sends_) {
    try {
      w.wait();
    } catch (...) {
    }
  }
}

void Pipeline::forward_one(int j, const PipelineLoss& loss) {
  const bool first = stage_index_ == 0, last = stage_index_ == num_stages_ - 1;
  const int tag = (2 * j) % (group_->max_tag() + 1);
  auto mb = std::make_unique<MicroBatch>();
  if (first) {
    mb->input = inputs_[static_cast<size_t>(j)];
  } else {
    mb->input = recv_with_header(*group_, stage_index_ - 1, tag, device_);
    if (is_floating(mb->input.dtype())) mb->input.requires_grad_(true);
  }
  Timed timed(times_.compute_s);
  const amp::autocast ac(device_.type, options_.autocast_dtype, options_.autocast);
  Tensor y =
      options_.checkpoint_activations ? nn::checkpoint(*stage_, mb->input) : (*stage_)(mb->input);
  if (last) {
    Tensor l = loss(y, targets_[static_cast<size_t>(j)]);
    DLTRAIN_CHECK(l.defined() && l.numel() == 1, "Pipeline: the loss returned ",
                  l.defined() ? shape_str(l.shape()) : std::string("an undefined tensor"),
                  " for micro-batch ", j, "; it must return a one-element tensor");
    const double w = weights_[static_cast<size_t>(j)];
    mb->output = w == 1.0 ? l : mul(l, w);
    loss_sum_ += mb->output.detach().to(Device::cpu()).to(DType::f64).item<double>();
  } else {
    send_with_header(*group_, y.detach(), stage_index_ + 1, tag, sends_);
    mb->output = y;
  }
  micro_[static_cast<size_t>(j)] = std::move(mb);
  ++stored_;
  peak_stored_ = std::max(peak_stored_, stored_);
}

void Pipeline::backward_one(int j) {
  const bool first = stage_index_ == 0, last = stage_index_ == num_stages_ - 1;
  const int tag = (2 * j + 1) % (group_->max_tag() + 1);
  std::unique_ptr<MicroBatch> mb = std::move(micro_[static_cast<size_t>(j)]);
  DLTRAIN_CHECK(mb != nullptr, "Pipeline: backward of micro-batch ", j,
                " before its forward (a schedule bug)");
  Tensor g;
  if (!last) {
    g = empty(mb->output.shape(),
              TensorOptions(mb->output.dtype()).with_device(mb->output.device()));
    group_->recv(g, stage_index_ + 1, tag).wait();
  }
  Timed timed(times_.compute_s);
  if (mb->output.requires_grad()) mb->output.backward(g);
  if (!first) {
    Tensor gi = mb->input.requires_grad() ? mb->input.grad() : Tensor();
    // An input the stage's output does not depend on gets a zero gradient.
    if (!gi.defined()) gi = zeros_like(mb->input);
    sends_.push_back(group_->send(gi.contiguous(), stage_index_ - 1, tag));
  }
  --stored_;
}

double Pipeline::forward_backward(const Tensor& input, const Tensor& target,
                                  const PipelineLoss& loss) {
  const bool first = stage_index_ == 0, last = stage_index_ == num_stages_ - 1;
  const int m = options_.micro_batches;
  DLTRAIN_CHECK(stored_ == 0, "Pipeline::forward_backward: ", stored_,
                " micro-batches of an interrupted step are still stored; build a new Pipeline "
                "after an error");
  inputs_.clear();
  targets_.clear();
  weights_.assign(static_cast<size_t>(m), 1.0);
  // Micro-batch j holds rows [j B / m, (j + 1) B / m): sizes differ by one at most.
  auto cut = [m, this](const Tensor& t, const char* what) {
    DLTRAIN_CHECK(t.defined() && t.dim() >= 1, "Pipeline::forward_backward: the ", what,
                  " is undefined or 0-d on stage ", stage_index_,
                  "; this stage needs it (dim 0 = batch)");
    const int64_t b = t.shape()[0];
    DLTRAIN_CHECK(b >= m, "Pipeline::forward_backward: a batch of ", b, " cannot make ", m,
                  " micro-batches; use a batch of ", m, " or more, or fewer micro-batches");
    std::vector<Tensor> out;
    for (int j = 0; j < m; ++j) {
      const int64_t s = j * b / m, e = (j + 1) * b / m;
      out.push_back(t.narrow(0, s, e - s));
    }
    return out;
  };
  if (first) inputs_ = cut(input, "input");
  if (last) {
    targets_ = cut(target, "target");
    const double b = static_cast<double>(target.shape()[0]);
    if (options_.mean_loss)
      for (int j = 0; j < m; ++j)
        weights_[static_cast<size_t>(j)] =
            static_cast<double>(targets_[static_cast<size_t>(j)].shape()[0]) / b;
  }
  micro_.clear();
  micro_.resize(static_cast<size_t>(m));
  loss_sum_ = 0.0;
  times_ = StepTimes{};
  const auto start = Clock::now();
  if (options_.schedule == PipelineSchedule::GPipe) {
    for (int j = 0; j < m; ++j) forward_one(j, loss);
    for (int j = 0; j < m; ++j) backward_one(j);
  } else {
    const int warmup = std::min(num_stages_ - stage_index_ - 1, m);
    for (int j = 0; j < warmup; ++j) forward_one(j, loss);
    for (int j = 0; j < m - warmup; ++j) {
      forward_one(warmup + j, loss);
      backward_one(j);
    }
    for (int j = m - warmup; j < m; ++j) backward_one(j);
  }
  for (Work& w : sends_) w.wait();
  sends_.clear();
  inputs_.clear();
  targets_.clear();
  // The loss, from the last stage to every stage.
  double result = loss_sum_;
  if (num_stages_ > 1) {
    Tensor l = full({1}, last ? loss_sum_ : 0.0, DType::f64);
    group_->broadcast(l, num_stages_ - 1).wait();
    result = l.item<double>();
  }
  // Data parallelism: the replicas' gradients of this stage averaged, and their losses.
  ProcessGroup* dp = options_.data_group;
  if (dp != nullptr && dp->size() > 1) {
    std::vector<Work> reduces;
    for (const Tensor& p : stage_->parameters())
      if (p.grad().defined()) reduces.push_back(dp->all_reduce(p.grad(), ReduceOp::Avg));
    Tensor l = full({1}, result, DType::f64);
    reduces.push_back(dp->all_reduce(l, ReduceOp::Avg));
    for (Work& w : reduces) w.wait();
    result = l.item<double>();
  }
  times_.step_s = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

namespace {

// Every stage's `mine` on pipeline rank `root`, in stage order, on the CPU (an empty vector on
// the other ranks, which send theirs).
std::vector<StateDict> gather_dicts(ProcessGroup& g, const StateDict& mine, int stage, int stages,
                                    int root) {
  std::vector<StateDict> all;
  if (stage != root) {
    std::vector<Work> sends;
    sends.push_back(
        g.send(full({1}, static_cast<double>(mine.size()), DType::i64), root, kStateTag));
    for (const auto& [name, t] : mine) {
      send_string(g, name, root, kStateTag, sends);
      send_with_header(g, t.detach().to(Device::cpu()), root, kStateTag, sends);
    }
    for (Work& w : sends) w.wait();
    return all;
  }
  all.resize(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    StateDict& out = all[static_cast<size_t>(s)];
    if (s == root) {
      for (const auto& [name, t] : mine) out.insert(name, t.detach().to(Device::cpu()).clone());
      continue;
    }
    Tensor count = zeros({1}, DType::i64);
    g.recv(count, s, kStateTag).wait();
    for (int64_t i = 0; i < count.item<int64_t>(); ++i) {
      const std::string name = recv_string(g, s, kStateTag);
      out.insert(name, recv_with_header(g, s, kStateTag, Device::cpu()));
    }
  }
  return all;
}

using optim::detail::count_groups;
using optim::detail::group_key;
using optim::detail::is_group_params;
using optim::detail::parse_state_key;
const std::string& kState = optim::detail::kStatePrefix;
const std::string& kGroups = optim::detail::kGroupPrefix;

bool same_values(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(),
                     static_cast<size_t>(x.numel()) * x.element_size()) == 0;
}

// [first, first + n) as the i64 index list of a parameter group.
Tensor index_range(int64_t first, int64_t n) {
  return arange(static_cast<double>(first), static_cast<double>(first + n), 1.0,
                TensorOptions(DType::i64));
}

}  // namespace

StateDict Pipeline::full_state_dict(int root) {
  return full_state_dict(stage_->state_dict(), root);
}

StateDict Pipeline::stage_state(const StateDict& full) const {
  StateDict mine;
  for (const std::string& k : stage_->state_dict().keys()) {
    DLTRAIN_CHECK(full.contains(k), "Pipeline: stage ", stage_index_, " needs '", k,
                  "', which the state dict lacks; pass the full model's state dict");
    mine.insert(k, full.at(k));
  }
  return mine;
}

StateDict Pipeline::full_state_dict(const StateDict& stage_state, int root) {
  DLTRAIN_CHECK(root >= 0 && root < num_stages_, "Pipeline::full_state_dict: root ", root,
                " is not a rank of the pipeline group of ", num_stages_);
  const std::vector<StateDict> all =
      gather_dicts(*group_, stage_state, stage_index_, num_stages_, root);
  // Stages in model order whatever the root: the keys come out as the full model's.
  StateDict out;
  for (const StateDict& d : all) out.merge(d);
  return out;
}

StateDict Pipeline::full_optimizer_state_dict(const optim::Optimizer& optimizer, int root) {
  const char* ctx = "Pipeline::full_optimizer_state_dict";
  {  // the optimizer must step exactly this stage's parameters
    std::vector<const void*> mine;
    for (const Tensor& t : stage_->parameters()) mine.push_back(t.impl().get());
    std::sort(mine.begin(), mine.end());
    std::vector<const void*> its;
    for (const auto& group : optimizer.param_groups())
      for (const Tensor& t : group.params) its.push_back(t.impl().get());
    std::sort(its.begin(), its.end());
    DLTRAIN_CHECK(its == mine, ctx, ": stage ", stage_index_, "'s optimizer holds ", its.size(),
                  " parameters that are not exactly the stage's ", mine.size(),
                  "; build it over stage_module()'s parameters (Pipeline::parameters())");
  }
  return full_optimizer_state_dict(optimizer.state_dict(), root);
}

StateDict Pipeline::full_optimizer_state_dict(const StateDict& stage_optimizer_state, int root) {
  const char* ctx = "Pipeline::full_optimizer_state_dict";
  DLTRAIN_CHECK(root >= 0 && root < num_stages_, ctx, ": root ", root,
                " is not a rank of the pipeline group of ", num_stages_);
  const std::vector<StateDict> all =
      gather_dicts(*group_, stage_optimizer_state, stage_index_, num_stages_, root);
  if (stage_index_ != root) return {};
  const StateDict& first = all[static_cast<size_t>(root)];
  const size_t groups = count_groups(first);
  // n[s][k]: parameters of stage s in group k; offsets in the full optimizer's flat order.
  std::vector<std::vector<int64_t>> n(all.size(), std::vector<int64_t>(groups));
  for (size_t s = 0; s < all.size(); ++s) {
    DLTRAIN_CHECK(count_groups(all[s]) == groups, ctx, ": stage ", s, "'s optimizer has ",
                  count_groups(all[s]), " parameter groups and stage ", root, "'s has ", groups,
                  "; build every stage's optimizer by the same rule (e.g. "
                  "optim::param_groups_no_decay(pipeline.stage_module(), ...))");
    for (size_t k = 0; k < groups; ++k) n[s][k] = all[s].at(group_key(k, "params")).numel();
    // Everything but the states and the index lists is one value for the whole model: the
    // same keys (as many, each in the root's) with the same values.
    int64_t shared = 0;
    for (const auto& [key, t] : all[s]) {
      int64_t i = 0;
      std::string rest;
      if (parse_state_key(key, i, rest) || is_group_params(key)) continue;
      ++shared;
      DLTRAIN_CHECK(first.contains(key) && same_values(first.at(key), t), ctx, ": '", key,
                    "' differs between stage ", s, " and stage ", root,
                    "; the whole model's optimizer has one value per group: give every "
                    "stage's optimizer the same type and hyper-parameters");
    }
    int64_t shared_root = 0;
    for (const auto& [key, t] : first) {
      int64_t i = 0;
      std::string rest;
      shared_root += !parse_state_key(key, i, rest) && !is_group_params(key);
    }
    DLTRAIN_CHECK(shared == shared_root, ctx, ": stage ", s, "'s optimizer has ", shared,
                  " hyper-parameter entries and stage ", root, "'s ", shared_root,
                  "; give every stage's optimizer the same type and hyper-parameters");
  }
  std::vector<int64_t> group_start(groups + 1, 0);  // full flat index where group k starts
  for (size_t k = 0; k < groups; ++k) {
    int64_t total = 0;
    for (size_t s = 0; s < all.size(); ++s) total += n[s][k];
    group_start[k + 1] = group_start[k] + total;
  }
  // The full flat index of each stage's local index i (both orders are group-major; group k of
  // stage s follows group k of the stages before it).
  std::vector<std::vector<int64_t>> to_full(all.size());
  for (size_t s = 0; s < all.size(); ++s) {
    std::vector<int64_t> local;
    for (size_t k = 0; k < groups; ++k) {
      int64_t at = group_start[k];
      for (size_t q = 0; q < s; ++q) at += n[q][k];
      for (int64_t j = 0; j < n[s][k]; ++j) local.push_back(at + j);
    }
    to_full[s] = std::move(local);
  }
  // States in full flat order, then the groups, as Optimizer::state_dict() writes them.
  std::vector<std::vector<std::pair<std::string, Tensor>>> states(
      static_cast<size_t>(group_start[groups]));
  for (size_t s = 0; s < all.size(); ++s)
    for (const auto& [key, t] : all[s]) {
      int64_t i = 0;
      std::string rest;
      if (!parse_state_key(key, i, rest)) continue;
      DLTRAIN_CHECK(i >= 0 && i < static_cast<int64_t>(to_full[s].size()), ctx, ": stage ", s,
                    "'s state names parameter ", i, " of ", to_full[s].size());
      states[static_cast<size_t>(to_full[s][static_cast<size_t>(i)])].emplace_back(rest, t);
    }
  StateDict out;
  for (const auto& [key, t] : first)
    if (key.rfind(kGroups, 0) != 0 && key.rfind(kState, 0) != 0)  // "type" and the like
      out.insert(key, t);
  for (size_t i = 0; i < states.size(); ++i)
    for (const auto& [rest, t] : states[i]) out.insert(kState + std::to_string(i) + "." + rest, t);
  for (size_t k = 0; k < groups; ++k) {
    const std::string pre = kGroups + std::to_string(k) + ".";
    out.insert(pre + "params", index_range(group_start[k], group_start[k + 1] - group_start[k]));
    for (const auto& [key, t] : first)
      if (key.rfind(pre, 0) == 0 && !is_group_params(key)) out.insert(key, t);
  }
  return out;
}

void Pipeline::load_full_optimizer_state_dict(optim::Optimizer& optimizer, const StateDict& state) {
  optimizer.load_state_dict(stage_optimizer_state(optimizer, state));
}

StateDict Pipeline::stage_optimizer_state(const optim::Optimizer& optimizer,
                                          const StateDict& state) {
  const char* ctx = "Pipeline::load_full_optimizer_state_dict";
  const StateDict mine = optimizer.state_dict();
  const size_t groups = count_groups(mine);
  // Every stage's group sizes, so that each finds its range of the full flat order.
  const int64_t p = num_stages_, s = stage_index_;
  Tensor counts = zeros({p}, DType::f64);
  counts.data<double>()[s] = static_cast<double>(groups);
  group_->all_reduce(counts).wait();
  for (int64_t q = 0; q < p; ++q)
    DLTRAIN_CHECK(counts.data<double>()[q] == static_cast<double>(groups), ctx, ": stage ", q,
                  "'s optimizer has ", counts.data<double>()[q], " parameter groups and stage ", s,
                  "'s has ", groups, "; build every stage's optimizer by the same rule");
  Tensor sizes = zeros({p, static_cast<int64_t>(groups)}, DType::f64);
  for (size_t k = 0; k < groups; ++k)
    sizes.data<double>()[static_cast<size_t>(s) * groups + k] =
        static_cast<double>(mine.at(group_key(k, "params")).numel());
  if (groups > 0) group_->all_reduce(sizes).wait();
  auto n = [&](int64_t q, size_t k) {
    return static_cast<int64_t>(sizes.data<double>()[static_cast<size_t>(q) * groups + k]);
  };
  DLTRAIN_CHECK(count_groups(state) == groups, ctx, ": the state has ", count_groups(state),
                " parameter groups and the stages' optimizers ", groups,
                "; build them by the rule the saved optimizer's groups were built with");
  // This stage's full flat indices, in its local (group-major) order.
  std::vector<int64_t> full_index;
  int64_t start = 0;
  for (size_t k = 0; k < groups; ++k) {
    int64_t total = 0, before = 0;
    for (int64_t q = 0; q < p; ++q) {
      total += n(q, k);
      if (q < s) before += n(q, k);
    }
    const int64_t saved = state.at(group_key(k, "params"), ctx).numel();
    DLTRAIN_CHECK(saved == total, ctx, ": the state's parameter group ", k, " has ", saved,
                  " parameters and the stages hold ", total,
                  " in theirs; was it saved for another model or another grouping?");
    for (int64_t j = 0; j < n(s, k); ++j) full_index.push_back(start + before + j);
    start += total;
  }
  std::vector<int64_t> to_local(static_cast<size_t>(start), -1);
  for (size_t i = 0; i < full_index.size(); ++i)
    to_local[static_cast<size_t>(full_index[i])] = static_cast<int64_t>(i);
  StateDict local;
  for (const auto& [key, t] : state) {
    int64_t i = 0;
    std::string rest;
    if (parse_state_key(key, i, rest)) {
      DLTRAIN_CHECK(i >= 0 && i < start, ctx, ": '", key, "' names parameter ", i, " of ", start);
      const int64_t l = to_local[static_cast<size_t>(i)];
      if (l >= 0) local.insert(kState + std::to_string(l) + "." + rest, t);
    } else if (!is_group_params(key)) {
      local.insert(key, t);
    }
  }
  int64_t first = 0;
  for (size_t k = 0; k < groups; ++k) {
    local.insert(group_key(k, "params"), index_range(first, n(s, k)));
    first += n(s, k);
  }
  return local;
}

void Pipeline::load_full_state_dict(const StateDict& state) {
  stage_->load_state_dict(stage_state(state), /*strict=*/true);
}

}  // namespace dltrain::distributed
