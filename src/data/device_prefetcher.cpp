// DevicePrefetcher (see the header for the stream and lifetime rules it keeps).
#include "dltrain/data/device_prefetcher.hpp"

#include <optional>

#include "dltrain/autograd/node.hpp"
#include "dltrain/backend/cuda.hpp"
#include "dltrain/core/error.hpp"

namespace dltrain::data {

struct DevicePrefetcher::State {
  Device device;
  DataLoader::Iterator it, end;
  // CUDA only: the copy stream, and the batch staged ahead of the consumer.
  std::optional<cuda::Stream> copy_stream;
  struct Staged {
    Batch host, dev;
    std::optional<cuda::Event> ready;
  };
  std::optional<Staged> next;
  Batch current;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  // A batch still staged when the consumer stops early (or on an error) is simply dropped:
  // its device tensors carry the copy stream (record_stream) and its pinned host block the
  // copy's stream (copy_ records it), so neither is reused before the copy has run.

  static Tensor alloc_like(const Tensor& t, Device d) {
    if (!t.defined()) return t;
    return empty(t.shape(), t.suggest_memory_format(), TensorOptions(t.dtype()).with_device(d));
  }

  // Starts the copy of the loader's next batch, if any.
  void stage() {
    next.reset();
    if (it == end) return;
    Staged s;
    s.host = *it;
    ++it;
    autograd::NoGradGuard no_grad;
    cuda::DeviceGuard dg(device.index);
    const cuda::Stream compute = cuda::current_stream(device.index);
    s.dev.data = alloc_like(s.host.data, device);  // allocated (and later freed) on compute
    s.dev.target = alloc_like(s.host.target, device);
    s.dev.num_samples = s.host.num_samples;
    for (const auto& f : s.host.fields)
      s.dev.fields.emplace_back(f.first, alloc_like(f.second, device));
    cuda::Event allocated;
    allocated.record(compute);
    allocated.wait(*copy_stream);
    {
      // Allocated on the consumer's stream, written on the copy stream: record_stream keeps
      // the memory from being reused before the copy has run, whenever the batch is dropped.
      cuda::StreamGuard sg(*copy_stream);
      auto copy = [&](Tensor& dst, const Tensor& src) {
        if (!dst.defined()) return;
        dst.copy_(src, /*non_blocking=*/true);
        cuda::record_stream(dst, *copy_stream);
      };
      copy(s.dev.data, s.host.data);
      copy(s.dev.target, s.host.target);
      for (size_t i = 0; i < s.host.fields.size(); ++i)
        copy(s.dev.fields[i].second, s.host.fields[i].second);
    }
    s.ready.emplace();
    s.ready->record(*copy_stream);
    next = std::move(s);
  }

  // Makes the staged batch current and stages the one after; false at the end.
  bool advance() {
    if (device.is_cpu()) {
      if (it == end) return false;
      current = *it;
      ++it;
      return true;
    }
    if (!next) return false;
    {
      cuda::DeviceGuard dg(device.index);
      next->ready->wait(cuda::current_stream(device.index));  // the consumer reads after the copy
    }
    current = std::move(next->dev);
    next.reset();
    stage();
    return true;
  }
};

DevicePrefetcher::DevicePrefetcher(const DataLoader& loader, Device device)
    : loader_(&loader), device_(device) {
  if (device.is_cuda()) {
    const int n = cuda::device_count();
    DLTRAIN_CHECK(device.index >= 0 && device.index < n, "DevicePrefetcher: ", device,
                  " does not exist: ", n, " CUDA device(s) are visible",
                  n == 0 ? " (no GPU or driver on this machine); use Device::cpu()" : "");
  }
}

DevicePrefetcher::Iterator DevicePrefetcher::begin() const {
  auto s = std::make_shared<State>();
  s->device = device_;
  s->it = loader_->begin();
  s->end = loader_->end();
  if (device_.is_cuda()) {
    s->copy_stream = cuda::Stream::create(device_.index);
    s->stage();
  }
  if (!s->advance()) return Iterator();
  return Iterator(s);
}

const Batch& DevicePrefetcher::Iterator::operator*() const {
  DLTRAIN_CHECK(state_ != nullptr, "DevicePrefetcher: dereferencing the end iterator");
  return state_->current;
}

DevicePrefetcher::Iterator& DevicePrefetcher::Iterator::operator++() {
  if (state_ && !state_->advance()) state_.reset();
  return *this;
}

}  // namespace dltrain::data
