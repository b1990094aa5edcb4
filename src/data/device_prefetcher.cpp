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
    std::optional<cuda::Stream> alloc;  // the stream dev was allocated on (and is freed on)
  };
  std::optional<Staged> next;
  Batch current;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  // A batch still staged (the consumer stopped early, or an error) must not be freed while
  // its copy may run: its device tensors are freed on their allocation stream and its pinned
  // host block is recycled after the work enqueued on the current stream, so both streams
  // wait for the copy first.
  ~State() {
    if (!next) return;
    try {
      cuda::DeviceGuard dg(device.index);
      release_next();
    } catch (...) {  // a destructor does not throw; the CUDA error resurfaces on the next call
    }
  }

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
    s.alloc = compute;
    s.dev.data = alloc_like(s.host.data, device);  // allocated (and later freed) on compute
    s.dev.target = alloc_like(s.host.target, device);
    s.dev.num_samples = s.host.num_samples;
    for (const auto& f : s.host.fields)
      s.dev.fields.emplace_back(f.first, alloc_like(f.second, device));
    cuda::Event allocated;
    allocated.record(compute);
    allocated.wait(*copy_stream);
    {
      cuda::StreamGuard sg(*copy_stream);
      if (s.dev.data.defined()) s.dev.data.copy_(s.host.data, /*non_blocking=*/true);
      if (s.dev.target.defined()) s.dev.target.copy_(s.host.target, /*non_blocking=*/true);
      for (size_t i = 0; i < s.host.fields.size(); ++i)
        if (s.dev.fields[i].second.defined())
          s.dev.fields[i].second.copy_(s.host.fields[i].second, /*non_blocking=*/true);
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
      // The pinned host batch is released (next.reset) with this device current, so that
      // its block's reuse is ordered after the compute stream's wait for the copy.
      cuda::DeviceGuard dg(device.index);
      current = std::move(next->dev);
      release_next();
    }
    stage();
    return true;
  }

  // Makes the current stream (the consumer's) and the staged batch's allocation stream wait
  // for its copy, then drops the staged batch (its host side, and its device side unless
  // moved out). The staged device must be current.
  void release_next() {
    const cuda::Stream now = cuda::current_stream(device.index);
    next->ready->wait(now);
    if (!(*next->alloc == now)) next->ready->wait(*next->alloc);
    next.reset();
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
