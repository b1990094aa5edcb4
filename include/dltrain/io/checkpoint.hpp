// HDF5 training checkpoints: everything a resumed run needs, in one file that a crash
// cannot destroy.
//
// A checkpoint holds the model's parameters and buffers under their state-dict names,
// the optimizer's, the LR scheduler's and the GradScaler's StateDicts, the training position
// (epoch, global step, batches already done in the epoch), the default random generator's (seed,
// offset), a free-form string map, the dltrain version and the file-format version. Layout: root
// attributes for the scalars (samples_in_epoch and global_batch are optional: files written
// before them load with -1 and 0), groups /model, /optimizer, /scheduler and /scaler holding one
// dataset per tensor (named by its key, in insertion order, with a "dtype" attribute; f16/bf16 as
// their 16-bit patterns) and /metadata holding string attributes. /scaler is absent when no scaler
// was saved (and in files written before it existed, which load unchanged). Further named states
// (io::ExtraState: an EMA of the weights, a user's counters) go to /extra/<name>, one group each
// laid out like /model; files without /extra load unchanged. The HDF5 part starts at
// byte 512 (an HDF5 user block: h5py and the HDF5 tools read the file as is) and uses HDF5 1.8
// to 1.10 format versions, whose metadata HDF5 checksums; bytes 0-511 are dltrain's integrity
// header: magic, format version, file size and a CRC-32 of the whole file.
//
// Invariants: a save writes a temporary file in the target's directory, flushes it to
// disk and renames it over the target, so a process killed at any moment leaves the
// previous checkpoint intact; a load reads and checks the whole file before changing
// anything, and restores the previous state of model, optimizer, scheduler and scaler if any
// of them rejects its part, so nothing is ever partly loaded. Tensors are saved from
// any device and memory format as row-major CPU data and load into whatever device
// and format the receiving model uses. A load checks the CRC of every byte before the HDF5
// library parses any, so a corrupt or truncated file raises dltrain::Error and never
// crashes or loads altered values. A file without the header (written by dltrain 0.1.0,
// which starts with the HDF5 signature, or by another program) is refused with an error
// naming the fix: `dltrain-convert restamp FILE` reads it once in a separate process (where
// a crash of HDF5 on damaged metadata becomes an error) and writes it back with the header.
// Without HDF5 at build time every function raises dltrain::Error saying so.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dltrain/core/state_dict.hpp"

namespace dltrain {
namespace amp {
class GradScaler;
}
namespace nn {
class Module;
}
namespace optim {
class Optimizer;
class LRScheduler;
}  // namespace optim
}  // namespace dltrain

namespace dltrain::io {

/// Version of the checkpoint layout this build writes; files with a larger one are refused.
inline constexpr int64_t kCheckpointFormat = 1;

/// Where training stands.
struct TrainingProgress {
  /// The epoch to resume in.
  int64_t epoch = 0;
  /// Optimizer steps done since the start of training.
  int64_t step = 0;
  /// Batches of `epoch` already trained (pass to DataLoader::set_start_batch on resume when
  /// the global batch is unchanged).
  int64_t batch_in_epoch = 0;
  /// Samples of `epoch` already trained, counted over all ranks (global batch x batches when
  /// every step had the full global batch); -1 when not recorded (files written before it
  /// existed). This, not batch_in_epoch, is the data position when the resumed run has
  /// another world size or per-rank batch: DataLoader::set_start_sample; see
  /// train::resume_data_position.
  int64_t samples_in_epoch = -1;
  /// The global batch (per-rank batch x world size) of the run that saved it; 0 when not
  /// recorded.
  int64_t global_batch = 0;
};

/// The whole content of a checkpoint file, as plain data.
struct Checkpoint {
  StateDict model, optimizer, scheduler;
  /// GradScaler state (empty when none was saved, or the scaler was disabled).
  StateDict scaler;
  /// Further named states (ExtraState), by name.
  std::map<std::string, StateDict> extra;
  TrainingProgress progress;
  /// The default generator's state (Generator::seed / offset).
  uint64_t rng_seed = 0, rng_offset = 0;
  std::map<std::string, std::string> metadata;
  /// Filled in by read_checkpoint.
  std::string dltrain_version;
  int64_t format_version = kCheckpointFormat;
};

/// A further object saved with a checkpoint and restored with it, under a name: anything with
/// the pair state_dict() / load_state_dict() (optim::ModelEMA, a sampler, a user's counters).
/// `load` must change nothing when it throws (so that a failed load restores everything).
struct ExtraState {
  /// Its group in the file, /extra/<name>: not empty, no '/'.
  std::string name;
  std::function<StateDict()> save;
  std::function<void(const StateDict&)> load;

  /// ExtraState::of("ema", ema): `object` must outlive every save and load that uses it.
  template <class T>
  static ExtraState of(std::string name, T& object) {
    return {std::move(name), [&object] { return object.state_dict(); },
            [&object](const StateDict& s) { object.load_state_dict(s); }};
  }
};

struct SaveOptions {
  /// Keep this many checkpoints: the newest at `path`, older ones at `path.1`, `path.2`, ...
  int64_t keep_last = 1;
  /// save_checkpoint: further states saved beside the model's (write_checkpoint writes
  /// Checkpoint::extra instead and refuses these).
  std::vector<ExtraState> extra{};
};

struct LoadOptions {
  /// Restore the default generator's state.
  bool restore_rng = true;
  /// Further states to restore; each must be in the file (dltrain::Error otherwise). States in
  /// the file that are not asked for are ignored.
  std::vector<ExtraState> extra{};
};

/// True when this build can read and write checkpoints (HDF5 was found).
bool hdf5_supported();

/// Writes `ckpt` to `path` crash-safely (see the file comment). Throws dltrain::Error naming
/// the path on any failure; the previous file at `path` is then untouched.
void write_checkpoint(const std::string& path, const Checkpoint& ckpt,
                      const SaveOptions& options = {});
/// Reads a whole checkpoint into CPU tensors. Throws dltrain::Error naming the file for a
/// missing, truncated, corrupt (CRC mismatch) or non-checkpoint file (naming its kind: "this
/// is a safetensors file"), a file without dltrain's integrity header (naming
/// `dltrain-convert restamp`), a newer format version, or a malformed entry.
Checkpoint read_checkpoint(const std::string& path);

/// What save_checkpoint writes, gathered without writing (the states, the progress, the default
/// generator's state, `metadata` and the `extra` states). A data-parallel job calls it on every
/// rank and writes on one (train::CheckpointFile does): a state_dict() may be collective
/// (distributed::ZeroRedundancyOptimizer's). Throws dltrain::Error for an extra state without a
/// save function or two extra states of one name.
Checkpoint make_checkpoint(const nn::Module& model, const optim::Optimizer* optimizer,
                           const optim::LRScheduler* scheduler, const amp::GradScaler* scaler,
                           const TrainingProgress& progress,
                           const std::map<std::string, std::string>& metadata = {},
                           const std::vector<ExtraState>& extra = {});

/// Saves model, optimizer and scheduler (either may be null), the progress, the default
/// generator's state and `metadata`.
void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer* optimizer, const optim::LRScheduler* scheduler,
                     const TrainingProgress& progress,
                     const std::map<std::string, std::string>& metadata = {},
                     const SaveOptions& options = {});

/// save_checkpoint with a GradScaler's state too (`scaler` may be null; a disabled scaler saves
/// nothing, as its state_dict is empty).
void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer* optimizer, const optim::LRScheduler* scheduler,
                     const amp::GradScaler* scaler, const TrainingProgress& progress,
                     const std::map<std::string, std::string>& metadata = {},
                     const SaveOptions& options = {});

/// Loads a checkpoint into `model` (strict: every key must match in name and shape) and, when
/// given, `optimizer` and `scheduler`; restores the default generator when `restore_rng`.
/// Returns the saved progress. On any error nothing is changed (see the file comment).
/// Passing only a model loads the weights alone (inference, fine-tuning).
TrainingProgress load_checkpoint(const std::string& path, nn::Module& model,
                                 optim::Optimizer* optimizer = nullptr,
                                 optim::LRScheduler* scheduler = nullptr, bool restore_rng = true);

/// load_checkpoint that also restores `scaler` (when not null). An enabled scaler needs a file
/// that holds scaler state (else dltrain::Error: save it, or pass nullptr to resume with a
/// fresh scale); a disabled scaler ignores what the file holds.
TrainingProgress load_checkpoint(const std::string& path, nn::Module& model,
                                 optim::Optimizer* optimizer, optim::LRScheduler* scheduler,
                                 amp::GradScaler* scaler, bool restore_rng = true);

/// load_checkpoint with LoadOptions (further states: options.extra). All or nothing as above:
/// an extra state that refuses its part leaves model, optimizer, scheduler, scaler and the
/// other extra states as they were.
TrainingProgress load_checkpoint(const std::string& path, nn::Module& model,
                                 optim::Optimizer* optimizer, optim::LRScheduler* scheduler,
                                 amp::GradScaler* scaler, const LoadOptions& options);

}  // namespace dltrain::io
