// dltrain::cuda: the user-facing CUDA runtime API (devices, streams, events, memory
// statistics, math switches). It compiles and links in every build: without CUDA
// support, or on a machine without a GPU or driver, device_count() is 0,
// is_available() is false, the queries answer 0 and anything that needs a device
// raises dltrain::Error saying so. CUDA types never appear here (streams and events
// are opaque handles), so user code needs no CUDA headers.
//
// Streams: every device has one compute stream, created on first use; the
// current stream is per thread and per device (StreamGuard sets it for a scope),
// and every op on a CUDA tensor is enqueued on the current stream of the tensor's
// device. Device memory is stream-ordered (cudaMallocAsync): a block is freed on
// the stream it was allocated on (which it keeps alive, so a tensor may outlive a
// Stream::create stream). Work on another stream that reads or writes a tensor must
// be ordered after its producer with an Event, and the tensor marked with
// record_stream(t, s) so that its memory is not handed out again before s has run
// (PyTorch's semantics; the dataloader's copy stream and the process groups do it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "dltrain/core/device.hpp"

namespace dltrain {
class Tensor;
}

namespace dltrain::cuda {

/// True when this build has the CUDA backend and at least one device is visible.
bool is_available();
/// Number of visible CUDA devices (0 without CUDA support, GPU or driver).
int device_count();
/// The calling thread's current device (0 by default).
int current_device();
/// Makes `device` current for the calling thread; throws when it does not exist.
void set_device(int device);
/// Waits for all work on `device` (-1: the current device). For tests, benchmarks, timing.
void synchronize(int device = -1);

/// Makes a device current for a scope and restores the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
};

/// A CUDA stream (shared handle; the last owner destroys a stream it created).
class Stream {
 public:
  /// A new non-blocking stream on `device` (-1: the current device).
  static Stream create(int device = -1, bool high_priority = false);
  /// The device's compute stream (the default current stream).
  static Stream compute(int device = -1);
  /// A non-owning handle to a stream created elsewhere (a cudaStream_t of the caller's own
  /// CUDA code): the caller keeps it alive while dltrain uses it.
  static Stream external(void* cuda_stream, int device);
  /// The raw cudaStream_t, as a void*.
  void* handle() const { return handle_.get(); }
  int device() const { return device_; }
  /// Blocks the calling thread until everything enqueued so far has run.
  void synchronize() const;
  /// True when all enqueued work has completed.
  bool query() const;
  bool operator==(const Stream& o) const { return handle() == o.handle() && device_ == o.device_; }

 private:
  std::shared_ptr<void> handle_;
  int device_ = 0;
};

/// The calling thread's current stream on `device` (-1: the current device).
Stream current_stream(int device = -1);
/// Makes `s` the calling thread's current stream on its device.
void set_current_stream(const Stream& s);

/// Makes a stream current (and its device) for a scope; restores both after.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
  DeviceGuard device_;
};

/// A CUDA event: orders streams and times GPU work.
class Event {
 public:
  /// An event on the current device; `timing` enables elapsed_ms.
  explicit Event(bool timing = false);
  /// Records the event on `s` (default: the current stream).
  void record();
  void record(const Stream& s);
  /// Makes `s` wait (on the GPU, not the host) until the recorded work has run.
  void wait(const Stream& s) const;
  void synchronize() const;
  bool query() const;
  /// Milliseconds between this (earlier) event and `end`; both need timing = true.
  float elapsed_ms(const Event& end) const;
  void* handle() const { return handle_.get(); }

 private:
  std::shared_ptr<void> handle_;
  int device_ = 0;
};

/// Marks `t`'s memory as used by the work enqueued on `s` so far and later: when the last
/// tensor sharing it goes, the memory is reused only after `s` has passed that point
/// (PyTorch's Tensor.record_stream). Needed when a stream other than the one the tensor
/// was allocated on uses it and the tensor may be dropped before that stream has run.
/// `t` is a CUDA tensor (on s's device) or a pinned host tensor (copy_ records the
/// streams of its own asynchronous copies); memory wrapped from elsewhere is its owner's
/// to keep alive.
void record_stream(const Tensor& t, const Stream& s);

/// Bytes of device memory held by live tensors on `device` (-1: current).
size_t memory_allocated(int device = -1);
/// Peak of memory_allocated since start or the last reset_peak_memory_stats.
size_t max_memory_allocated(int device = -1);
void reset_peak_memory_stats(int device = -1);
/// Bytes the stream-ordered pool holds from the driver (allocated + cached).
size_t memory_reserved(int device = -1);
/// Returns the pool's unused memory to the driver (after synchronising the device).
void empty_cache(int device = -1);

/// Bytes of page-locked host memory held by live tensors (Tensor::pin_memory, the
/// dataloader's pinned batches, staging buffers).
size_t pinned_memory_allocated();
/// Bytes of freed pinned blocks kept for reuse (reused only once the copies that used
/// them have completed).
size_t pinned_memory_cached();
/// Caps pinned_memory_cached (default 2 GiB, or DLTRAIN_PINNED_CACHE_MB); past it, freed
/// blocks whose copies are done go back to the driver, largest first. 0 disables reuse.
/// empty_cache() releases them all.
void set_pinned_cache_limit(size_t bytes);

/// TF32 tensor cores for f32 matmul and convolution (on by default, as cuDNN's default).
void set_allow_tf32(bool allow);
bool allow_tf32();
/// cuDNN benchmark mode: time every algorithm once per new convolution shape and keep the
/// fastest (off: take cuDNN's heuristic first choice that fits the workspace limit).
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();
/// Deterministic convolutions (PyTorch's torch.backends.cudnn.deterministic): only algorithms
/// cuDNN reports as deterministic are chosen, in benchmark mode too, so that a run repeats bit
/// for bit (some backward-filter algorithms accumulate with atomics). Off by default: the
/// heuristic's (or the benchmark's) fastest algorithm, whatever its determinism.
void set_cudnn_deterministic(bool on);
bool cudnn_deterministic();
/// bf16 batch norm straight on cuDNN (bf16 x, y and gradients; f32 statistics, scale and
/// bias) instead of through f32 copies of x, y and the gradients (three extra passes over
/// each BN layer's activations). Off by default until a GPU run of tests/cuda's "[bf16_bn]"
/// comparison has confirmed cuDNN's bf16 path to within bf16 rounding of the f32 one
/// (docs/design.md, "bf16 batch norm"); the environment variable DLTRAIN_CUDNN_BF16_BN=1 (or
/// 0) sets the initial value.
void set_cudnn_bf16_batch_norm(bool on);
bool cudnn_bf16_batch_norm();

}  // namespace dltrain::cuda
