// Training checkpoints at module level (dltrain/io/checkpoint.hpp): save_checkpoint gathers the
// model's, optimizer's, scheduler's and GradScaler's state into a Checkpoint and writes it;
// load_checkpoint reads one and restores every component or, if one refuses its state, none.
// The file format is checkpoint_hdf5.cpp (no_hdf5.cpp in a build without HDF5).
#include "dltrain/io/checkpoint.hpp"

#include "dltrain/amp/grad_scaler.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/core/generator.hpp"
#include "dltrain/nn/module.hpp"
#include "dltrain/optim/optimizer.hpp"
#include "dltrain/optim/scheduler.hpp"

namespace dltrain::io {

void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer* optimizer, const optim::LRScheduler* scheduler,
                     const TrainingProgress& progress,
                     const std::map<std::string, std::string>& metadata,
                     const SaveOptions& options) {
  save_checkpoint(path, model, optimizer, scheduler, nullptr, progress, metadata, options);
}

Checkpoint make_checkpoint(const nn::Module& model, const optim::Optimizer* optimizer,
                           const optim::LRScheduler* scheduler, const amp::GradScaler* scaler,
                           const TrainingProgress& progress,
                           const std::map<std::string, std::string>& metadata,
                           const std::vector<ExtraState>& extra) {
  Checkpoint c;
  c.model = model.state_dict();
  if (optimizer) c.optimizer = optimizer->state_dict();
  if (scheduler) c.scheduler = scheduler->state_dict();
  if (scaler) c.scaler = scaler->state_dict();
  c.progress = progress;
  c.rng_seed = default_generator().seed();
  c.rng_offset = default_generator().offset();
  c.metadata = metadata;
  for (const ExtraState& e : extra) {
    DLTRAIN_CHECK(e.save, "save_checkpoint: extra state '", e.name,
                  "' has no save function; build it with io::ExtraState::of(name, object)");
    DLTRAIN_CHECK(!c.extra.count(e.name), "save_checkpoint: two extra states are named '", e.name,
                  "'; give each its own name");
    c.extra[e.name] = e.save();
  }
  return c;
}

void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer* optimizer, const optim::LRScheduler* scheduler,
                     const amp::GradScaler* scaler, const TrainingProgress& progress,
                     const std::map<std::string, std::string>& metadata,
                     const SaveOptions& options) {
  const Checkpoint c =
      make_checkpoint(model, optimizer, scheduler, scaler, progress, metadata, options.extra);
  SaveOptions write_options = options;
  write_options.extra.clear();  // now in c.extra
  write_checkpoint(path, c, write_options);
}

TrainingProgress load_checkpoint(const std::string& path, nn::Module& model,
                                 optim::Optimizer* optimizer, optim::LRScheduler* scheduler,
                                 bool restore_rng) {
  return load_checkpoint(path, model, optimizer, scheduler, nullptr, restore_rng);
}

TrainingProgress load_checkpoint(const std::string& path, nn::Module& model,
                                 optim::Optimizer* optimizer, optim::LRScheduler* scheduler,
                                 amp::GradScaler* scaler, bool restore_rng) {
  return load_checkpoint(path, model, optimizer, scheduler, scaler,
                         LoadOptions{.restore_rng = restore_rng});
}

TrainingProgress load_checkpoint(const std::string& path, nn::Module& model,
                                 optim::Optimizer* optimizer, optim::LRScheduler* scheduler,
                                 amp::GradScaler* scaler, const LoadOptions& options) {
  Checkpoint c = read_checkpoint(path);
  for (const ExtraState& e : options.extra) {
    DLTRAIN_CHECK(e.load, "load_checkpoint('", path, "'): extra state '", e.name,
                  "' has no load function; build it with io::ExtraState::of(name, object)");
    DLTRAIN_CHECK(
        c.extra.count(e.name), "load_checkpoint('", path, "'): the file holds no '", e.name,
        "' state (it was saved without it", c.extra.empty() ? "" : "; it holds: ",
        [&] {
          std::string names;
          for (const auto& [k, v] : c.extra) names += (names.empty() ? "" : ", ") + k;
          return names;
        }(),
        "); drop '", e.name, "' from the states to load, or start it afresh");
  }
  if (scaler && !scaler->is_enabled()) scaler = nullptr;  // a pass-through has no state
  DLTRAIN_CHECK(!scaler || !c.scaler.empty(), "load_checkpoint('", path,
                "'): the file holds no GradScaler state (saved without one, or from a disabled "
                "scaler); pass scaler = nullptr to resume with a fresh scale");
  DLTRAIN_CHECK(!optimizer || !c.optimizer.empty(), "load_checkpoint('", path,
                "'): the file holds no optimizer state; pass optimizer = nullptr to load the "
                "weights only");
  DLTRAIN_CHECK(!scheduler || !c.scheduler.empty(), "load_checkpoint('", path,
                "'): the file holds no scheduler state; pass scheduler = nullptr");
  // Snapshots (copies) so a component that rejects its state leaves everything as it was.
  StateDict model_before;
  for (const auto& [k, t] : model.state_dict()) model_before.insert(k, t.clone());
  StateDict opt_before = optimizer ? optimizer->state_dict() : StateDict();
  StateDict sched_before = scheduler ? scheduler->state_dict() : StateDict();
  StateDict scaler_before = scaler ? scaler->state_dict() : StateDict();
  std::vector<StateDict> extra_before;
  for (const ExtraState& e : options.extra) extra_before.push_back(e.save ? e.save() : StateDict());
  bool scaler_loaded = false;
  size_t extras_loaded = 0;
  try {
    model.load_state_dict(c.model);
    if (optimizer) optimizer->load_state_dict(c.optimizer);
    if (scheduler) scheduler->load_state_dict(c.scheduler);
    if (scaler) scaler->load_state_dict(c.scaler);
    scaler_loaded = scaler != nullptr;
    for (const ExtraState& e : options.extra) {
      e.load(c.extra.at(e.name));
      ++extras_loaded;
    }
  } catch (const Error& e) {
    model.load_state_dict(model_before);
    if (optimizer) optimizer->load_state_dict(opt_before);
    if (scheduler) scheduler->load_state_dict(sched_before);
    // A component that rejects its state changes nothing; those loaded before it go back.
    if (scaler_loaded) scaler->load_state_dict(scaler_before);
    for (size_t i = 0; i < extras_loaded; ++i) options.extra[i].load(extra_before[i]);
    DLTRAIN_FAIL("load_checkpoint('", path, "'): ", e.what(), " Nothing was loaded.");
  }
  if (options.restore_rng) {
    default_generator().manual_seed(c.rng_seed);
    default_generator().set_offset(c.rng_offset);
  }
  return c.progress;
}

}  // namespace dltrain::io
