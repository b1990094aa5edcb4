// DevicePrefetcher: delivers a DataLoader's batches in the memory of a CUDA device, copying
// batch k+1 to the device on its own stream while the model computes on batch k.
//
// For each host batch it allocates the device tensors on the consumer's current (compute)
// stream, so they are freed in order with the compute work that reads them; the copy stream
// waits for that allocation by event, copies asynchronously (truly asynchronous when the
// loader pins its batches: DataLoaderOptions::pin_memory), and records a "ready" event that
// the compute stream waits on when the batch is delivered: the host never blocks on a copy.
// Memory crossing streams is marked, not waited for: the device tensors carry the copy
// stream (cuda::record_stream) and the pinned host block the copy's stream (copy_ records
// it), so neither is reused before the copy has run, whenever the batch is dropped (a batch
// still staged when the iteration ends early included). Layouts and dtypes are
// kept (a u8 NHWC image batch stays u8: normalise it on the device with
// data::to_float_batch). With a CPU device the loader's batches pass through unchanged.
// One epoch per iteration, like the DataLoader; errors from the loader propagate.
#pragma once

#include <memory>

#include "dltrain/core/device.hpp"
#include "dltrain/data/dataloader.hpp"

namespace dltrain::data {

class DevicePrefetcher {
  struct State;

 public:
  /// Batches of `loader` delivered on `device` (the loader must outlive the prefetcher).
  /// Throws dltrain::Error when `device` is a CUDA device that does not exist.
  DevicePrefetcher(const DataLoader& loader, Device device);

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = const Batch*;
    using reference = const Batch&;

    Iterator() = default;
    const Batch& operator*() const;
    const Batch* operator->() const { return &**this; }
    Iterator& operator++();
    bool operator==(const Iterator& o) const { return state_ == o.state_; }

   private:
    friend class DevicePrefetcher;
    explicit Iterator(std::shared_ptr<State> s) : state_(std::move(s)) {}
    std::shared_ptr<State> state_;
  };

  /// Starts an epoch of the loader and stages its first batch.
  Iterator begin() const;
  Iterator end() const { return Iterator(); }
  int64_t size() const { return loader_->size(); }
  Device device() const { return device_; }

 private:
  const DataLoader* loader_;
  Device device_;
};

}  // namespace dltrain::data
